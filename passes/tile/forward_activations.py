"""Activations kept on chip between kernels: a store's buffer read in place by the next kernels.

A kernel that computes a whole activation tile in one on-chip buffer stores it to HBM,
and the kernels after it load the same tile back: two DMAs of about 3,100 cycles of
fixed latency each on `cloud` (`[dma] latency_cycles` plus HBM latency) on the path
from one kernel's last instruction to the next one's first (`tilecc run
--critical-path` charges them at every kernel boundary of a CNN). Where the load reads
exactly the elements the store wrote (the same root tensor, element offset, strides
and tile shape, at each kernel's top level with constant indices) and the loaded buffer
is only read afterwards, the consumer can read the producer's buffer where it is: both
buffers move to a program-scope slot (`resident = "fw0"`) that no kernel between them
uses, the load is dropped, and, when every load of the tensor was forwarded and it is
not a program output, so is the store (the HBM traffic drops too). The link
(`codegen/link.py`) orders the consumer's reads after the producer's writes of the
slot's bytes, as it orders any cross-kernel access to the same bytes.

Before (k1 stores `out`, k2 loads it into `x`)::

    func @k1(..., %y: memref<1x256x1x256xbf16>) {
      %out = tile.alloc {buffer = "out"} : memref<128x256xbf16, sram>
      ... (writes %out)
      tile.store %out into %y[%c0, %c0, %c0, %c0] sizes(%c128, %c256) {row_dim = 1, col_dim = 3}
    }
    func @k2(%y: memref<1x256x1x256xbf16>, ...) {
      %x = tile.alloc {buffer = "slab0"} : memref<128x256xbf16, sram>
      tile.load %y[%c0, %c0, %c0, %c0] into %x sizes(%c128, %c256) {row_dim = 1, col_dim = 3}
      tile.matmul %w, %x into %acc ...
    }

After (one slot; its offset is final, `plan-sram` leaves both buffers where they are)::

    func @k1(...) {
      %out = tile.alloc {buffer = "out", resident = "fw0", offset = 196608} : ...
      ... (writes %out; the store is gone: no kernel loads %y any more)
    }
    func @k2(...) {
      %x = tile.alloc {buffer = "slab0", resident = "fw0", offset = 196608} : ...
      tile.matmul %w, %x into %acc ...          (waits for k1's writes of the slot)
    }

A store's source may be a window of its buffer starting at row 0 (`tile.subview %out[0,
c0]`); the consumer's buffer then sits `c0` elements into the slot and must lie inside
it. The producer must not write the buffer after the store. Only kernels launched once
take part (a kernel shared by several launches has one body for all of them). A slot
lives from its producer's launch to its last consumer's; slots whose lives do not
overlap share bytes. The slots sit below the resident constants and every kernel must
still fit below them; a slot that would not fit is left out (the tile goes through HBM)
and a remark counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, NoneAttr, StringAttr, i64
from xdsl.ir import BlockArgument, Operation, SSAValue

from tilecc.ir import tile
from tilecc.ir.buffers import align_up
from tilecc.ir.dtypes import element_size
from tilecc.ir.tile import const_index
from tilecc.passes import remarks
from tilecc.passes.tile.resident_constants import READS, RESIDENT_ATTR

_PASS = "plan-sram"



@dataclass(frozen=True)
class _Where:
    """The elements of a root HBM tensor a memref value addresses: the root, element
    strides and the offset of element 0 (None: not known, e.g. a reshape of a strided view)."""

    root: tile.HbmAllocOp | None  # None: a kernel argument's own numbering (`_disjoint`)
    strides: tuple[int, ...]
    offset: int


@dataclass
class _Consumer:
    """A load whose buffer reads the slot instead: the whole buffer moves there when the
    load is its only write (`whole`); otherwise the ops after the load read a new buffer
    at the slot and the earlier ones keep theirs."""

    alloc: tile.AllocOp
    offset: int  # bytes into the slot
    load: tile.LoadOp
    whole: bool


@dataclass
class Slot:
    """One forwarded buffer: the producer's buffer and the consumers' that alias it."""

    name: str
    producer: tile.AllocOp
    size: int  # bytes per partition, aligned
    first: int  # launch index of the producer
    last: int  # launch index of the last consumer
    consumers: list[_Consumer] = field(default_factory=list)
    offset: int = -1  # bytes below the slots' top (place_slots)
    # more producer buffers side by side after the first (byte offset in the slot): the
    # column blocks of a row a consumer loads at once from several stores
    parts: list[tuple[tile.AllocOp, int]] = field(default_factory=list)

    @property
    def loads(self) -> list[tile.LoadOp]:
        return [c.load for c in self.consumers]

    @property
    def producers(self) -> list[tuple[tile.AllocOp, int]]:
        return [(self.producer, 0), *self.parts]

    def moved(self) -> set[int]:
        """Ids of the allocs that move to the slot (the producers', the consumers' own)."""
        return {id(a) for a, _ in self.producers} | {id(c.alloc) for c in self.consumers if c.whole}


@dataclass
class _Dead:
    """The stores of one kernel argument that no kernel needs once `loads` read slots: every
    load of the tensors it is bound to (at every launch), none of them an output."""

    stores: list[tile.StoreOp]
    loads: set[int]  # ids of the loads that must all be forwarded


@dataclass
class Forwarding:
    """What `find_forwarding` decided (nothing is changed: `apply_forwarding` does that)."""

    slots: list[Slot] = field(default_factory=list)
    dead: list[_Dead] = field(default_factory=list)
    left_out: int = 0  # slots that did not fit

    @property
    def dropped_loads(self) -> list[tile.LoadOp]:
        return [ld for s in self.slots for ld in s.loads]

    @property
    def dropped_stores(self) -> list[tile.StoreOp]:
        kept = {id(ld) for ld in self.dropped_loads}
        return [st for d in self.dead if d.loads <= kept for st in d.stores]

    @property
    def extent(self) -> int:
        """Bytes per partition the slots need, below the top (their lives overlapping)."""
        return max((s.offset + s.size for s in self.slots if s.offset >= 0), default=0)


def _where_map(main: func.FuncOp) -> dict[SSAValue, _Where | None]:
    out: dict[SSAValue, _Where | None] = {}
    for op in main.body.block.ops:
        if isinstance(op, tile.HbmAllocOp):
            t = op.result.type
            assert isinstance(t, MemRefType)
            out[op.result] = _Where(op, tile.row_major(t.get_shape()), 0)
        elif isinstance(op, tile.ViewOp):
            src = out.get(op.source)
            t = op.result.type
            assert isinstance(t, MemRefType)
            if src is None:
                out[op.result] = None
            elif isinstance(t.layout, NoneAttr):  # the source's bytes, row-major
                st = op.source.type
                assert isinstance(st, MemRefType)
                out[op.result] = (_Where(src.root, tile.row_major(t.get_shape()), src.offset)
                                  if _dense(st, src.strides) else None)
            else:
                strides, offset = tile.layout_of(t)
                out[op.result] = _Where(src.root, strides, offset)
    return out


def _dense(t: MemRefType, strides: tuple[int, ...]) -> bool:
    shape = t.get_shape()
    return 0 in shape or all(n == 1 or s == r for n, s, r in zip(shape, strides, tile.row_major(shape)))


_FOLD = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
         "arith.minsi": min, "arith.maxsi": max, "arith.floordivsi": lambda a, b: a // b if b else None,
         "arith.divsi": lambda a, b: int(a / b) if b else None, "arith.remsi": lambda a, b: a % b if b else None}


def _fold(v: SSAValue) -> int | None:
    """The value of an index computed from constants by integer arithmetic (the kernel
    builders leave ``0 * 128`` and the like unfolded at the top level)."""
    c = const_index(v)
    if c is not None:
        return c
    owner = v.owner
    fn = _FOLD.get(owner.name) if isinstance(owner, Operation) else None
    if fn is None or len(owner.operands) != 2:  # type: ignore[union-attr]
        return None
    a, b = (_fold(x) for x in owner.operands)  # type: ignore[union-attr]
    return None if a is None or b is None else fn(a, b)


def _pattern(op: tile.LoadOp | tile.StoreOp, hbm: SSAValue, where: _Where) -> tuple | None:
    """(offset, row stride, col stride, rows, cols) in the root's elements of a DMA with
    constant indices and sizes; None otherwise."""
    idx = [_fold(v) for v in op.indices]
    rows, cols = _fold(op.rows), _fold(op.cols)
    if rows is None or cols is None or any(i is None for i in idx):
        return None
    off = where.offset + sum(i * s for i, s in zip(idx, where.strides))  # type: ignore[operator]
    rd, cd = op.row_dim.value.data, op.col_dim.value.data
    rs = where.strides[rd] * op.step("row_step") if rd >= 0 else 0
    cs = where.strides[cd] * op.step("col_step") if cd >= 0 else 0
    return (off, rs, cs, rows, cols)


def _buffer(v: SSAValue) -> tuple[tile.AllocOp, int, int] | None:
    """(alloc, row, col) of an on-chip value: a buffer or a constant window of one."""
    r = c = 0
    while isinstance(v.owner, tile.SubviewOp):
        sv = v.owner
        dr, dc = _fold(sv.row), _fold(sv.col)
        if dr is None or dc is None:
            return None
        r, c, v = r + dr, c + dc, sv.source
    return (v.owner, r, c) if isinstance(v.owner, tile.AllocOp) else None


def _base(v: SSAValue) -> Operation | None:
    """The op a chain of subviews starts from."""
    while isinstance(v.owner, tile.SubviewOp):
        v = v.owner.source
    return v.owner if isinstance(v.owner, Operation) else None


def _writes(op: Operation, buf: tile.AllocOp) -> bool:
    """Whether `op` (not a subview) may write `buf` through any of its operands."""
    reads = READS.get(type(op), ())
    return any(_base(v) is buf and not any(getattr(op, n) is v for n in reads) for v in op.operands)


def _only_read_after(buf: tile.AllocOp, writer: Operation) -> bool:
    """Every op of the kernel other than `writer` only reads `buf`."""
    kernel = _kernel_of(writer)
    return kernel is not None and not any(op is not writer and not isinstance(op, tile.SubviewOp) and _writes(op, buf)
                   for op in kernel.walk())


def _retargetable(load: tile.LoadOp, buf: tile.AllocOp) -> bool:
    """Whether the ops after `load` (the last write of `buf`, covering all of it) can
    read another buffer instead: nothing writes `buf` after it, and no window of `buf`
    made before it is used after it."""
    if not _not_written_after(load, buf):
        return False
    after = {id(o) for op in _following(load) for o in op.walk()}
    for use in _uses(buf):
        sv = use.operation
        if isinstance(sv, tile.SubviewOp) and id(sv) not in after:
            if any(id(u.operation) in after for u in sv.result.uses):
                return False
    return True


def _following(op: Operation) -> list[Operation]:
    out = []
    nxt = op.next_op
    while nxt is not None:
        out.append(nxt)
        nxt = nxt.next_op
    return out


def _uses(buf: tile.AllocOp) -> list:
    """Uses of `buf` and of its windows (nested subviews), transitively."""
    out, todo = [], [buf.result]
    while todo:
        v = todo.pop()
        for u in v.uses:
            out.append(u)
            if isinstance(u.operation, tile.SubviewOp) and u.index == 0:
                todo.append(u.operation.result)
    return out


def _retarget(c: _Consumer, offset: int) -> None:
    """A new buffer at `offset` for the ops after `c.load`: they read it instead of `c.alloc`."""
    t = c.alloc.result.type
    assert isinstance(t, MemRefType)
    new = tile.AllocOp(t, c.alloc.buffer.data + "_fw")
    for key in ("tilecc.loc",):
        if key in c.alloc.attributes:
            new.attributes[key] = c.alloc.attributes[key]
    block = c.load.parent
    assert block is not None
    block.insert_op_before(new, c.load)
    after = {id(o) for op in _following(c.load) for o in op.walk()}
    for u in list(c.alloc.result.uses):
        if id(u.operation) in after:
            u.operation.operands[u.index] = new.result
    c.alloc = new


def _not_written_after(store: Operation, buf: tile.AllocOp) -> bool:
    op = store.next_op
    while op is not None:
        if any(_writes(o, buf) for o in op.walk() if not isinstance(o, tile.SubviewOp)):
            return False
        op = op.next_op
    return True


def _calls(module: ModuleOp) -> list[func.CallOp]:
    for f in module.ops:
        if isinstance(f, func.FuncOp) and f.sym_name.data == "main":
            return [op for op in f.body.block.ops if isinstance(op, func.CallOp)]
    return []


def find_forwarding(module: ModuleOp) -> Forwarding:
    """The forwarded activation tiles of `module` (launches in program order). A load of a
    kernel launched several times (`share-kernels`: one body for identical layers) is
    forwarded only when at every launch the tile comes from the same store of the same
    kernel, with no launch of that kernel in between to overwrite its buffer."""
    fw = Forwarding()
    main = next((f for f in module.ops if isinstance(f, func.FuncOp) and f.sym_name.data == "main"), None)
    if main is None:
        return fw
    kernels = {f.sym_name.data: f for f in module.ops
               if isinstance(f, func.FuncOp) and tile.KERNEL_ATTR in f.attributes}
    calls = _calls(module)
    names = [c.callee.root_reference.data for c in calls]
    if any(n not in kernels for n in names):
        return fw
    launches: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        launches.setdefault(n, []).append(i)
    where = _where_map(main)
    # per root tensor: the (launch, argument) pairs that write it and that read it
    writers: dict[int, list[tuple[int, int]]] = {}
    readers: dict[int, list[tuple[int, int]]] = {}
    for i, c in enumerate(calls):
        args = kernels[names[i]].body.block.args
        for j, v in enumerate(c.arguments):
            w = where.get(v)
            if w is None:
                continue
            uses = list(args[j].uses)
            if any(not (isinstance(u.operation, (tile.LoadOp, tile.GatherOp)) and u.index == 0) for u in uses):
                writers.setdefault(id(w.root), []).append((i, j))
            if any(isinstance(u.operation, (tile.LoadOp, tile.GatherOp)) and u.index == 0 for u in uses):
                readers.setdefault(id(w.root), []).append((i, j))
    outputs = {id(w.root) for op in main.body.block.ops if isinstance(op, func.ReturnOp)
               for v in op.operands if (w := where.get(v)) is not None}
    # only the program's own intermediates: an input a kernel writes is state the caller
    # sees (a mutated buffer), a weight or constant is not an activation
    outputs |= {id(op) for op in main.body.block.ops if isinstance(op, tile.HbmAllocOp)
                and any(op.properties.get(k) is not None for k in ("input", "weight", "value"))}
    stores = _LazyStores(kernels)
    slots: dict[int, Slot] = {}  # id(producer buffer) -> its slot
    consumed: dict[int, tuple[Slot, int, bool]] = {}  # id(consumer buffer) -> (slot, offset, whole)
    for cname, cl in launches.items():
        ck = kernels[cname]
        body = ck.body.block
        for load in list(body.ops):
            if isinstance(load, tile.LoadOp) and isinstance(load.src, BlockArgument) and load.src.owner is body:
                _forward(load, cl, calls, names, launches, where, writers, stores, slots, consumed)
    fw.slots = _consistent(list({id(x): x for x in slots.values()}.values()))
    # the stores whose elements nobody loads from HBM any more: every load of the tensor
    # (at every launch) that may read them is forwarded, and the tensor is no output
    forwarded = {id(c.load) for s in fw.slots for c in s.consumers}
    for pname, pl in launches.items():
        pk = kernels[pname]
        for j, arg in enumerate(pk.body.block.args):
            sts = [u.operation for u in arg.uses if isinstance(u.operation, tile.StoreOp) and u.index == 1]
            if not sts or len(sts) != sum(1 for u in arg.uses if not isinstance(u.operation, tile.LoadOp)):
                continue
            for st in sts:
                need = _dead_store(st, j, pl, calls, names, kernels, where, readers, outputs, forwarded)
                if need is not None:
                    fw.dead.append(_Dead([st], need))
    return fw


def _dead_store(st: tile.StoreOp, j: int, pl: list[int], calls: list[func.CallOp], names: list[str],
                kernels: dict[str, func.FuncOp], where: dict, readers: dict, outputs: set[int],
                forwarded: set[int]) -> set[int] | None:
    """The forwarded loads store `st` (through argument `j` of a kernel launched at `pl`)
    is dead with: every load that may read its elements, at every launch; None when a
    load that is not forwarded may read them (or the tensor is an output)."""
    need: set[int] = set()
    for p in pl:
        w = where.get(calls[p].arguments[j])
        if w is None or id(w.root) in outputs:
            return None
        spat = _pattern(st, st.dst, w)
        for c, a in readers.get(id(w.root), []):
            cw = where[calls[c].arguments[a]]
            for u in kernels[names[c]].body.block.args[a].uses:
                op = u.operation
                if id(op) in forwarded:
                    need.add(id(op))
                    continue
                lpat = _pattern(op, op.src, cw) if isinstance(op, tile.LoadOp) and cw is not None else None
                if spat is None or lpat is None or not _apart(spat, lpat):
                    return None
    return need


class _LazyStores(dict):
    """Kernel name -> `_store_candidates`, computed for the kernels a load asks about."""

    def __init__(self, kernels: dict[str, func.FuncOp]):
        super().__init__()
        self.kernels = kernels

    def __missing__(self, name: str) -> list:
        self[name] = _store_candidates(self.kernels[name])
        return self[name]


def _store_candidates(kernel: func.FuncOp) -> list[tuple[tile.StoreOp, int, tile.AllocOp, int]]:
    """(store, argument index, buffer, first column) of each top-level store of `kernel`
    that leaves its buffer as it stored it: the buffer a consumer could read in place."""
    out = []
    body = kernel.body.block
    for op in body.ops:
        if not isinstance(op, tile.StoreOp) or not isinstance(op.dst, BlockArgument) or op.dst.owner is not body:
            continue
        b = _buffer(op.src)
        if b is None:
            continue
        alloc, r0, c0 = b
        dt = op.dst.type
        assert isinstance(dt, MemRefType)
        if (r0 != 0 or RESIDENT_ATTR in alloc.attributes or tile.space_of(alloc.result.type) != tile.SRAM
                or alloc.result.type.element_type != dt.element_type):  # type: ignore[union-attr]
            continue
        if not _not_written_after(op, alloc) or _stored_again(op):
            continue
        out.append((op, op.dst.index, alloc, c0))
    return out


def _stored_again(store: tile.StoreOp) -> bool:
    """Whether anything after `store` in its kernel writes the tensor it wrote (another
    store through the same argument: it might overwrite the tile; conservatively any)."""
    arg = store.dst
    after = {id(o) for op in _following(store) for o in op.walk()}
    return any(id(u.operation) in after and not (isinstance(u.operation, tile.LoadOp) and u.index == 0)
               and not _disjoint(store, u.operation) for u in arg.uses)


def _disjoint(a: tile.StoreOp, b: Operation) -> bool:
    """Two stores through one argument whose element ranges (constant patterns) do not meet."""
    if not isinstance(b, tile.StoreOp):
        return False
    t = a.dst.type
    assert isinstance(t, MemRefType)
    strides, off = tile.layout_of(t)  # both through one argument: any consistent numbering
    w = _Where(None, strides, off)
    pa, pb = _pattern(a, a.dst, w), _pattern(b, b.dst, w)
    return pa is not None and pb is not None and _apart(pa, pb)


def _apart(pa: tuple, pb: tuple) -> bool:
    """Whether two DMA patterns (in one tensor's elements) touch no element in common:
    their bounding ranges do not meet, or both are runs of whole-row-contained columns
    with the same row stride whose columns or rows do not meet."""
    if _span(pa)[1] < _span(pb)[0] or _span(pb)[1] < _span(pa)[0]:
        return True
    (ao, ars, acs, ar, ac), (bo, brs, bcs, br, bc) = pa, pb
    if ars != brs or ars <= 0 or acs != 1 or bcs != 1:
        return False
    (ra, a0), (rb, b0) = divmod(ao, ars), divmod(bo, brs)
    if a0 + ac <= ars and b0 + bc <= ars:  # each row's run within one row of the tensor
        return a0 + ac <= b0 or b0 + bc <= a0 or ra + ar <= rb or rb + br <= ra
    return False


def _span(pat: tuple) -> tuple[int, int]:
    off, rs, cs, r, c = pat
    ends = [off + i * rs + j * cs for i in (0, max(r - 1, 0)) for j in (0, max(c - 1, 0))]
    return min(ends), max(ends)


def _forward(load: tile.LoadOp, cl: list[int], calls: list[func.CallOp], names: list[str],
             launches: dict[str, list[int]], where: dict, writers: dict, stores: dict,
             slots: dict[int, Slot], consumed: dict[int, tuple[Slot, int, bool]]) -> None:
    """Forward `load` (of a kernel launched at `cl`) when every launch reads a tile one
    store of one producer kernel left in its buffer."""
    i = load.src.index  # type: ignore[union-attr]
    b = _buffer(load.dst)
    if b is None or b[1] or b[2]:
        return
    dst = b[0]
    if RESIDENT_ATTR in dst.attributes or tile.space_of(dst.result.type) != tile.SRAM:
        return
    dt = dst.result.type
    assert isinstance(dt, MemRefType)
    dr, dc = dt.get_shape()
    choice = None
    span: list[int] = []
    for c in cl:
        w = where.get(calls[c].arguments[i])
        ws = writers.get(id(w.root), []) if w is not None else []
        if w is None or len(ws) != 1:
            return
        p, j = ws[0]
        pname = names[p]
        if p >= c or any(p < q < c for q in launches[pname]):
            return
        pw = where[calls[p].arguments[j]]
        lpat = _pattern(load, load.src, w)
        if lpat is None:
            return
        match = _match(lpat, [(st, a, c0, _pattern(st, st.dst, pw)) for st, sj, a, c0 in stores[pname] if sj == j],
                       dt)
        if match is None or (choice is not None and choice != match):
            return
        choice = match
        span += [p, c]
    if choice is None:
        return
    allocs, col = choice
    whole = _only_read_after(dst, load)
    # a buffer with other writes keeps them only where the load does not overwrite them
    # (a column of ones beside the loaded values): the load must cover it all
    rows, cols = _fold(load.rows), _fold(load.cols)
    if not whole and ((rows, cols) != (dr, dc) or not _retargetable(load, dst)):
        return
    isz = element_size(dt.element_type)
    layout, at = [], 0
    for a in allocs:
        layout.append((a, at))
        at += a.result.type.get_shape()[1] * isz  # type: ignore[union-attr]
    if id(dst) in slots or id(dst) in consumed:
        return  # the buffer already holds another slot's tile
    if len(allocs) == 1 and id(allocs[0]) in consumed:
        # the producer's buffer itself reads a slot (a copy kernel between): the load reads
        # that slot too, which then lives until this launch; its producing kernels must
        # not run again in between (they run once)
        slot, off, was_whole = consumed[id(allocs[0])]
        if not was_whole or any(len(launches[_kernel_name(a)]) != 1 for a, _ in slot.producers):
            return
        col = off // isz + col
    elif any(id(a) in consumed for a in allocs):
        return
    else:
        slot = None
    placed = [slots.get(id(a)) for a in allocs] if slot is None else []
    if slot is None and all(x is None for x in placed):
        slot = Slot(f"fw{len({id(x) for x in slots.values()})}", allocs[0], align_up(at), min(span), max(span),
                    parts=layout[1:])
        for a in allocs:
            slots[id(a)] = slot
    elif slot is None:  # the buffers must already sit in one slot, in this order
        slot = placed[0]  # type: ignore[assignment]
        where_in = dict((id(a), o) for a, o in slot.producers)  # type: ignore[union-attr]
        base = where_in.get(id(allocs[0]))
        if base is None or any(x is not slot or where_in.get(id(a)) != base + o
                               for x, (a, o) in zip(placed, layout)):
            return
        col += base // isz
    assert slot is not None
    # the consumer's buffer may be wider than the tile it loads (and reach past the
    # producers' buffers): the slot reserves its bytes too, in every partition
    slot.size = max(slot.size, align_up((col + dc) * isz))
    slot.first, slot.last = min(slot.first, *span), max(slot.last, *span)
    slot.consumers.append(_Consumer(dst, col * isz, load, whole))
    consumed[id(dst)] = (slot, col * isz, whole)


def _consistent(slots: list[Slot]) -> list[Slot]:
    """The slots without those whose buffers another slot also places: a buffer is the
    producer of at most one slot or a consumer in at most one (a chained consumer sits in
    its producer's slot). Such a pair arises when a kernel launched several times is a
    consumer at one launch and a producer at an earlier one; both slots go (their tiles
    go through HBM)."""
    while True:
        where: dict[int, set[str]] = {}
        for s in slots:
            for a, _ in s.producers:
                where.setdefault(id(a), set()).add(s.name)
            for c in s.consumers:
                where.setdefault(id(c.alloc), set()).add(s.name)
        bad = {n for names in where.values() if len(names) > 1 for n in names}
        prod = {id(a) for s in slots for a, _ in s.producers}
        bad |= {s.name for s in slots for c in s.consumers if id(c.alloc) in prod and c.alloc is not s.producer}
        if not bad:
            return slots
        slots = [s for s in slots if s.name not in bad]


def _kernel_of(op: Operation) -> func.FuncOp | None:
    f = op.parent_op()
    while f is not None and not isinstance(f, func.FuncOp):
        f = f.parent_op()
    return f


def _kernel_name(op: Operation) -> str:
    f = _kernel_of(op)
    return f.sym_name.data if f is not None else ""


def _match(lpat: tuple, cands: list, dt: MemRefType) -> tuple | None:
    """(producer buffers, first column in them) holding the elements of a load with
    pattern `lpat`, from the producer's candidate (store, buffer, window column, pattern)
    list: one store whose elements contain the load's, or stores whose column blocks of
    the same rows follow each other, each reaching its buffer's end (all but the last)
    and starting at its buffer's first column (all but the first), the buffers then laid
    side by side."""
    for _st, alloc, c0, spat in cands:
        d = _within(lpat, spat) if spat is not None else None
        pt = alloc.result.type
        if d is None or dt.element_type != pt.element_type:
            continue
        return ((alloc,), c0 + d)
    lo, rs, cs, lr, lc = lpat
    if cs != 1 or rs <= 0 or lc <= 0:
        return None
    row, b = divmod(lo, rs)
    blocks = {}
    for _st, alloc, c0, spat in cands:
        if spat is None or alloc.result.type.element_type != dt.element_type:
            continue
        so, srs, scs, sr, sc = spat
        srow, a = divmod(so, srs) if srs > 0 else (None, None)
        if (srs, scs) != (rs, 1) or srow != row or sr < lr or a + sc > rs:
            continue
        blocks.setdefault(a, (alloc, c0, sc))
    pieces, pos = [], b
    first = next(((a, v) for a, v in blocks.items() if a <= b < a + v[2]), None)
    if first is None:
        return None
    a, (alloc, c0, sc) = first
    pieces.append(alloc)
    start = c0 + b - a
    pos = a + sc
    if c0 + sc != alloc.result.type.get_shape()[1]:
        return None
    while pos < b + lc:
        nxt = blocks.get(pos)
        if nxt is None or nxt[1] != 0 or nxt[0] in pieces:
            return None
        alloc, c0, sc = nxt
        pieces.append(alloc)
        pos += sc
        if pos < b + lc and sc != alloc.result.type.get_shape()[1]:
            return None
    return (tuple(pieces), start) if len(pieces) > 1 else None


def _within(load: tuple, store: tuple) -> int | None:
    """Columns from the store's first to the load's when the load reads only elements the
    store wrote, row i of the load in row i of the store (the same partitions); else None."""
    (lo, lrs, lcs, lr, lc), (so, srs, scs, sr, sc) = load, store
    if (lrs, lcs) != (srs, scs) or lr > sr or (lr > 1 and lrs == 0):
        return None
    if lcs == 0:
        return 0 if lo == so else None
    d, rem = divmod(lo - so, lcs)
    if rem or d < 0 or d + lc > sc:
        return None
    if lr > 1 and abs(lrs) < sc * abs(lcs) and d:  # the rows overlap: an offset may be another row's
        return None
    return d


def place_slots(fw: Forwarding, budget: int) -> None:
    """Offsets (bytes below the slots' top, growing down) for the slots, first fit by
    launch order among the slots whose lives overlap; a slot that would take the extent
    past `budget` is left out (its loads and stores stay)."""
    placed: list[Slot] = []
    kept: list[Slot] = []
    for s in sorted(fw.slots, key=lambda s: s.first):
        busy = sorted((o.offset, o.offset + o.size) for o in placed if not (o.last < s.first or s.last < o.first))
        at = 0
        for lo, hi in busy:
            if at + s.size <= lo:
                break
            at = max(at, hi)
        if at + s.size > budget:
            fw.left_out += 1  # its consumers load again, and its producer's store stays
            continue
        s.offset = at
        placed.append(s)
        kept.append(s)
    fw.slots = kept


def apply_forwarding(fw: Forwarding, top: int) -> None:
    """Mark the slots' buffers at their offsets below `top` and erase the dropped DMAs."""
    stores = fw.dropped_stores
    for s in fw.slots:
        base = top - fw.extent + s.offset
        for a, off in s.producers:
            a.attributes[RESIDENT_ATTR] = StringAttr(s.name)
            a.properties["offset"] = IntegerAttr(base + off, i64)
        for c in s.consumers:
            if not c.whole:
                _retarget(c, base + c.offset)
            c.alloc.attributes[RESIDENT_ATTR] = StringAttr(s.name)
            c.alloc.properties["offset"] = IntegerAttr(base + c.offset, i64)
    for op in (*fw.dropped_loads, *stores):
        op.detach()
        op.erase()


def forwarding_remark(fw: Forwarding) -> None:
    if not fw.slots and not fw.left_out:
        return
    remarks.emit(_PASS, "passed" if fw.slots else "missed", lambda: (
        f"{len(fw.slots)} activation tiles kept on chip between kernels ({fw.extent:,} bytes per partition): "
        f"{len(fw.dropped_loads)} loads and {len(fw.dropped_stores)} stores removed"
        + (f"; {fw.left_out} left in HBM (no room)" if fw.left_out else "")))
