"""Constants that stay in SRAM for the whole program: loaded once, read by every kernel.

Many kernels fill an on-chip buffer from a compile-time constant with one DMA and never
write it again: the zero and mask rows a convolution copies into its output's padding
columns, the 1.0 its per-channel operands are turned into columns with, the identity of
a transposing matmul. Every DMA costs about 3,100 cycles of fixed latency on `cloud`
(`[dma] latency_cycles` plus HBM latency), and the kernels of a ResNet issue dozens of
these on the queue that also carries the next layer's weights, so they delay the
weights. The same constant loaded into the same shape of buffer is the same bytes in
every kernel: here each such buffer moves to a slot of its own at the top of SRAM
(`plan-sram` keeps the kernels' rings below it) and only the first kernel that needs it
loads it; the later kernels read it where it is. The link (`codegen/link.py`) sees the
later kernels' reads of the slot and orders them after that load, as it orders any
cross-kernel access to the same bytes; the slot is never written again.

Before (two kernels, each filling its own buffer from the constant %z)::

    func @k1(%x, %z, ...) {
      %b = tile.alloc {buffer = "zeros"} : memref<128x31xbf16, sram>
      tile.load %z[%c0] into %b sizes(%c128, %c31) {row_dim = -1, col_dim = 0}
      tile.scalar "mul" %b, 0.0 into %out ...
    }
    func @k2(%x, %z, ...) { (the same alloc and load) }

After (`resident = "rc0"`: the slot; its offset is final, `plan-sram` leaves it)::

    func @k1(...) {
      %b = tile.alloc {buffer = "zeros", resident = "rc0", offset = 229312} : ...
      tile.load %z[%c0] into %b sizes(%c128, %c31) {...}
      ...
    }
    func @k2(...) {
      %b = tile.alloc {buffer = "zeros", resident = "rc0", offset = 229312} : ...
      tile.scalar "mul" %b, 0.0 into %out ...        (no load: k1's is awaited)
    }

A buffer qualifies when its one write is a load at the kernel's top level (not in a
loop), with constant indices and sizes, of a kernel argument that every launch of the
kernel binds to the same constant (a `tile.hbm_alloc` with a value, through views), and
every other use of the buffer is a read (a matmul or vector operand, a store's source).
Launches are taken in program order; a kernel launched several times (`share-kernels`)
keeps its load if it is the first to need the slot. A buffer only one kernel fills keeps
its own place (a slot would save no load). The slots take at most
`MAX_FRACTION` of SRAM and every kernel must still fit below them; where that fails
nothing moves (a remark says so).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, StringAttr, i64
from xdsl.ir import Block, BlockArgument, Operation, SSAValue

from tilecc.ir import tile
from tilecc.ir.buffers import align_up, buffer_bytes
from tilecc.ir.tile import const_index
from tilecc.passes import remarks

RESIDENT_ATTR = "resident"
MAX_FRACTION = 0.125  # of SRAM per partition, at most, for the slots
_PASS = "plan-sram"

# operands that only read the buffer (or HBM tensor) they name; shared with
# forward_activations.py (a load's or gather's HBM operand is never a buffer here)
READS: dict[type[Operation], tuple[str, ...]] = {
    tile.StoreOp: ("src",),
    tile.MatmulOp: ("lhsT", "rhs"),
    tile.UnaryOp: ("input",),
    tile.ScalarOp: ("input",),
    tile.ReduceOp: ("input",),
    tile.BinaryOp: ("lhs", "rhs"),
    tile.GatherOp: ("index", "table"),
    tile.ScatterOp: ("src", "index"),
    tile.LoadOp: ("src",),
}


@dataclass
class Residency:
    """What `find_resident` decided: a slot per distinct constant buffer, the allocs that
    move to a slot, and the loads the later kernels no longer need."""

    slots: dict[tuple, tuple[str, int]] = field(default_factory=dict)  # key -> (slot name, bytes)
    allocs: list[tuple[tile.AllocOp, tuple]] = field(default_factory=list)
    dropped: list[tile.LoadOp] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(align_up(b) for _, b in self.slots.values())


def _root(v: SSAValue) -> Operation | None:
    """The `tile.hbm_alloc` a chain of views starts from (None: not one)."""
    while True:
        owner = v.owner
        if isinstance(owner, tile.ViewOp):
            v = owner.source
            continue
        return owner if isinstance(owner, tile.HbmAllocOp) else None


def _calls(module: ModuleOp) -> Iterator[func.CallOp]:
    for f in module.ops:
        if isinstance(f, func.FuncOp) and tile.KERNEL_ATTR not in f.attributes:
            for op in f.walk():
                if isinstance(op, func.CallOp):
                    yield op


def _constant_args(calls: list[func.CallOp]) -> list[tuple | None]:
    """Per argument of a kernel: (the constant root, the argument's type) when every
    launch binds it to that constant, else None."""
    keys: list[tuple | None] = []
    for i, v in enumerate(calls[0].arguments):
        root = _root(v)
        key = (id(root), str(v.type)) if root is not None and root.properties.get("value") is not None else None
        if key is not None and any(
            (r := _root(c.arguments[i])) is None or (id(r), str(c.arguments[i].type)) != key for c in calls[1:]
        ):
            key = None
        keys.append(key)
    return keys


def _only_reads(v: SSAValue, writer: Operation) -> bool:
    """Every use of buffer `v` (through subviews) reads it, except `writer`."""
    for use in list(v.uses):
        op = use.operation
        if op is writer:
            continue
        if isinstance(op, tile.SubviewOp) and use.index == 0:
            if not _only_reads(op.result, writer):
                return False
            continue
        names = READS.get(type(op))
        if names is None or not any(getattr(op, n) is v for n in names):
            return False
        if any(getattr(op, n, None) is v for n in ("output", "acc", "dst")):
            return False  # also written in place
    return True


def _candidates(
    kernel: func.FuncOp, const_args: list[tuple | None],
) -> Iterator[tuple[tile.LoadOp, tile.AllocOp, tuple]]:
    """(load, alloc, key) of each buffer of `kernel` that may live in a resident slot."""
    body: Block = kernel.body.block
    for op in body.ops:
        if not isinstance(op, tile.LoadOp):
            continue
        src, dst = op.src, op.dst
        if not isinstance(src, BlockArgument) or src.owner is not body or const_args[src.index] is None:
            continue
        alloc = dst.owner
        if not isinstance(alloc, tile.AllocOp) or tile.space_of(alloc.result.type) != tile.SRAM:
            continue
        dims = [const_index(x) for x in (*op.indices, op.rows, op.cols)]
        if any(d is None for d in dims):
            continue
        if RESIDENT_ATTR in alloc.attributes or not _only_reads(alloc.result, op):
            continue
        t = alloc.result.type
        assert isinstance(t, MemRefType)
        key = (const_args[src.index], tuple(dims), op.row_dim.value.data, op.col_dim.value.data,
               op.step("row_step"), op.step("col_step"), str(t))
        yield op, alloc, key


def find_resident(module: ModuleOp) -> Residency:
    """The resident slots of `module`'s kernels, launches in program order (nothing is
    changed: `apply_residency` does that)."""
    kernels = {f.sym_name.data: f for f in module.ops
               if isinstance(f, func.FuncOp) and tile.KERNEL_ATTR in f.attributes}
    calls = list(_calls(module))
    by_kernel: dict[str, list[func.CallOp]] = {}
    for c in calls:
        by_kernel.setdefault(c.callee.root_reference.data, []).append(c)
    found: list[tuple[tile.LoadOp, tile.AllocOp, tuple]] = []
    users: dict[tuple, set[str]] = {}
    seen: set[str] = set()
    for c in calls:
        name = c.callee.root_reference.data
        if name in seen or name not in kernels:
            continue
        seen.add(name)
        for load, alloc, key in _candidates(kernels[name], _constant_args(by_kernel[name])):
            found.append((load, alloc, key))
            users.setdefault(key, set()).add(name)
    res = Residency()
    for load, alloc, key in found:  # in launch order
        if len(users[key]) < 2:
            continue  # one kernel fills it: a slot would save no load
        t = alloc.result.type
        assert isinstance(t, MemRefType)
        if key in res.slots:
            res.dropped.append(load)
        else:
            res.slots[key] = (f"rc{len(res.slots)}", buffer_bytes(t))
        res.allocs.append((alloc, key))
    return res


def apply_residency(res: Residency, top: int) -> None:
    """Give the slots offsets below `top` (bytes per partition, aligned), mark their
    allocs and erase the loads later kernels no longer need."""
    offsets: dict[tuple, int] = {}
    at = top
    for key, (_, size) in res.slots.items():
        at -= align_up(size)
        offsets[key] = at
    for alloc, key in res.allocs:
        alloc.attributes[RESIDENT_ATTR] = StringAttr(res.slots[key][0])
        alloc.properties["offset"] = IntegerAttr(offsets[key], i64)
    for load in res.dropped:
        load.detach()
        load.erase()


def is_resident(op: tile.AllocOp) -> bool:
    return RESIDENT_ATTR in op.attributes


def residency_remark(res: Residency, cap: int, kept: bool, why: str = "") -> None:
    if not res.slots:
        return
    if kept:
        remarks.emit(_PASS, "passed", lambda: (
            f"{len(res.slots)} constant buffers resident in SRAM ({res.total:,} bytes per partition at the top): "
            f"{len(res.dropped)} loads of later kernels removed"))
    else:
        remarks.emit(_PASS, "missed", f"constant buffers not kept resident ({res.total:,} of {cap:,} bytes per "
                     f"partition): {why}")
