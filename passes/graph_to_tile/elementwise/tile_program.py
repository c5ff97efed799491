"""The per-tile program of an elementwise DAG: its buffers, and a tile's loads, vector ops, stores.

`TileProgram` allocates the on-chip buffers of an `ElementwiseKernel`'s DAG (a buffer
per set for loaded leaves and stored values, temporaries by liveness, scratch) and
emits, per tile, `load` (a leaf's DMA), `compute` (every node) and `store` (the
outputs). The elementwise kernel drives it over its loop nest; other kernels (a
matmul's epilogue, passes/graph_to_tile/fused_matmul.py) drive it on their own tiles.
For ``y = gelu(x + b)`` on a ``[TR x TC]`` tile of set s::

    load(x) ; load(b)          tile.load %x[..] into %in0 ... ; tile.load %b[..] into %in1
    compute(r, c, s)      ->   tile.binary "add" %in0, %in1 into %t ; tile.unary "gelu" %t into %out0
    store(idx, r, c, s)        tile.store %out0 into %y[..]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.elementwise.dag import (
    ALIGN,
    CLASS_RANK,
    ROWWISE,
    Imm,
    Leaf,
    Node,
    Value,
    assign_temps,
    leaf_elem,
    row_scratch,
    temp_demand,
    topo_order,
    value_class,
    where_scratch,
)
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import IndexMap, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.elementwise.kernel import ElementwiseKernel

# an operand of a vector op: (class, its buffer or immediate; None: a class only, `emit_node`'s `top`)
Arg = tuple[str, "SSAValue | float | None"]


def _tile(a: Arg) -> SSAValue:
    """The buffer of a tile or column operand."""
    v = a[1]
    if not isinstance(v, SSAValue):
        raise CompileError(f"a {a[0]} operand without a buffer reached the kernel")
    return v


def _imm(a: Arg) -> float:
    """The value of an immediate operand."""
    v = a[1]
    if v is None or isinstance(v, SSAValue):
        raise CompileError(f"a {a[0]} operand is not an immediate")
    return float(v)


@dataclass
class _Slot:
    """Where a value lives in a tile body: a buffer per set (leaves and stored nodes at
    the buffered level), one buffer, or an immediate."""

    bufs: list[SSAValue] = field(default_factory=list)

    def at(self, s: int) -> SSAValue:
        """The buffer of set `s`."""
        return self.bufs[s % len(self.bufs)]


class TileProgram:
    """The per-tile work of an `ElementwiseKernel`'s DAG inside some kernel: buffers
    (allocated at construction: a buffer per set for loaded leaves and stored values,
    temps by liveness, scratch), then per tile `load` (a leaf's DMA), `compute` (every
    node), `store` (the outputs). Other kernels (a matmul's epilogue) drive it on their
    own tiles; a leaf marked `acc` is not loaded but given to `compute` (an accumulator
    tile)."""

    def __init__(self, ek: ElementwiseKernel, kb: KernelBuilder, TR: int, TC: int, D: int,
                 leaf_sets: dict[int, int], row_len: int, roots: Sequence[int] = (),
                 external: frozenset[int] = frozenset()) -> None:
        """`roots`: values computed besides the outputs; `external`: values whose
        buffers `compute` is given (an accumulator tile, a buffer another kernel reads)."""
        self.ek, self.kb, self.TR, self.TC, self.D, self.row_len = ek, kb, TR, TC, D, row_len
        values = ek.values
        self.stored = {ref: k for k, (ref, _) in enumerate(ek.outputs)}
        slots: dict[int, _Slot] = {}
        for i, n in leaf_sets.items():
            leaf = values[i]
            assert isinstance(leaf, Leaf)
            cols = 1 if leaf.cls == "column" else TC
            slots[i] = _Slot([kb.alloc([TR, cols], leaf_elem(leaf), tile.SRAM, f"in{i}") for _ in range(n)])
        temp_bufs: dict[tuple[str, str, int], SSAValue] = {}
        for ref, key in sorted(assign_temps(values, set(self.stored), roots, external).items()):
            if key not in temp_bufs:
                cols = 1 if key[1] == "column" else TC
                temp_bufs[key] = kb.alloc([TR, cols], values[ref].elem, tile.SRAM, "t")  # type: ignore[union-attr]
            slots[ref] = _Slot([temp_bufs[key]])
        for ref, k in self.stored.items():
            if (isinstance(values[ref], Leaf) and ref in slots) or ref in external:
                continue  # stored from its load buffer, or from the given buffer
            slots[ref] = _Slot([kb.alloc([TR, TC], ek.outputs[k][1], tile.SRAM, f"out{k}") for _ in range(D)])
        self.slots = slots
        self.scratch = [kb.alloc([TR, TC], f32, tile.SRAM, "w") for _ in range(where_scratch(values))]
        row_tiles, row_cols = row_scratch(values)
        self.row_scratch = (
            [kb.alloc([TR, TC], f32, tile.SRAM, "row") for _ in range(row_tiles)],
            [kb.alloc([TR, 1], f32, tile.SRAM, "stat") for _ in range(row_cols)],
        )
        self.order = topo_order(values, [ref for ref, _ in ek.outputs] + list(roots))
        self.queues = ek.lw.cfg.dma.queues
        self._q = 0
        # the kernel arguments of the loaded leaves and the outputs (`bind`)
        self.leaf_args: dict[int, SSAValue] = {}
        self.out_args: list[SSAValue] = []
        self.out_imaps: list[IndexMap] = []
        # full-width buffers of leaves a driving kernel loads once (`FusedMatmulKernel`)
        self.hoist_bufs: dict[int, SSAValue] = {}

    @staticmethod
    def sram_bytes(ek: ElementwiseKernel, TC: int, D: int, leaf_sets: dict[int, int],
                   roots: Sequence[int] = (), external: frozenset[int] = frozenset()) -> int:
        """Bytes per partition the buffers of a TileProgram of these arguments take."""
        values = ek.values
        stored = {ref for ref, _ in ek.outputs}

        def buf(cols: int, elem: Attribute) -> int:
            return -(-max(cols * element_size(elem), 1) // ALIGN) * ALIGN

        total = 0
        for i, n in leaf_sets.items():
            leaf = values[i]
            assert isinstance(leaf, Leaf)
            total += n * buf(1 if leaf.cls == "column" else TC, leaf_elem(leaf))
        for (_, cls), (elem, n) in temp_demand(values, stored, roots, external).items():
            total += n * buf(1 if cls == "column" else TC, elem)
        for ref, k in ((r, k) for k, (r, _) in enumerate(ek.outputs)):
            if (isinstance(values[ref], Leaf) and ref in leaf_sets) or ref in external:
                continue
            total += D * buf(TC, ek.outputs[k][1])
        total += where_scratch(values) * buf(TC, f32)
        row_tiles, row_cols = row_scratch(values)
        return total + row_tiles * buf(TC, f32) + row_cols * ALIGN

    def bind(self, leaf_args: dict[int, SSAValue], out_args: list[SSAValue], out_imaps: list[IndexMap]) -> None:
        """The kernel arguments holding each loaded leaf and each output."""
        self.leaf_args, self.out_args, self.out_imaps = leaf_args, out_args, out_imaps

    def next_queue(self) -> int:
        """DMA transfers rotate over the queues in program order."""
        self._q += 1
        return (self._q - 1) % self.queues

    def load(self, i: int, idx: list[SSAValue], r: SSAValue, c: SSAValue, s: int, queue: int | None = None) -> None:
        """Leaf `i`'s r x c tile at index `idx` of the iteration space into set `s`."""
        kb = self.kb
        leaf = self.ek.values[i]
        assert isinstance(leaf, Leaf)
        arg = self.leaf_args[i]
        ind = [kb.const(0)] * len(shape_of(arg.type))
        for d, od in enumerate(leaf.imap):
            if od is not None:
                ind[od] = idx[d]
        row_dim = leaf.imap[-2] if leaf.imap[-2] is not None else -1
        col_dim = leaf.imap[-1] if leaf.imap[-1] is not None else -1
        cols = kb.const(1) if leaf.cls == "column" else c
        q = self.next_queue() if queue is None else queue
        kb.add(tile.LoadOp(arg, ind, self.slots[i].at(s), r, cols, row_dim, col_dim, queue=q))

    def compute(self, r: SSAValue, c: SSAValue, s: int, acc: dict[int, SSAValue] | None = None) -> None:
        """Every node on the leading r x c corner of set `s`; `acc` gives the buffers of
        leaves that are not loaded."""
        kb = self.kb
        values = self.ek.values
        one = kb.const(1)

        def buf(a: int) -> SSAValue:
            return acc[a] if acc is not None and a in acc else self.slots[a].at(s)

        for ref in self.order:
            v = values[ref]
            if not isinstance(v, Node):
                continue
            cols = one if v.cls == "column" else c
            ops: list[Arg] = [(value_class(values[a]), _imm_or(values[a], buf, a)) for a in v.args]
            if v.kind in ROWWISE:
                emit_rowwise(kb, v, ops, buf(ref), r, c, self.row_scratch, self.row_len)
            else:
                emit_node(kb, v, ops, buf(ref), r, cols, self.scratch)

    def store(self, idx: list[SSAValue], r: SSAValue, c: SSAValue, s: int, queue: int | None = None,
              given: dict[int, SSAValue] | None = None) -> None:
        """The outputs of set `s` (`given`: buffers of external values)."""
        kb = self.kb
        rank = len(idx)
        for ref, k in self.stored.items():
            # outputs are aligned (a None is the unit dim at its position) or permuted
            imap = [d if m is None else m for d, m in enumerate(self.out_imaps[k])]
            ind = [kb.const(0)] * rank
            for d, od in enumerate(imap):
                ind[od] = idx[d]
            src = given[ref] if given is not None and ref in given else self.slots[ref].at(s)
            kb.add(tile.StoreOp(src, self.out_args[k], ind, r, c, imap[-2], imap[-1],
                                queue=self.next_queue() if queue is None else queue))


def _imm_or(v: Value, buf: Callable[[int], SSAValue], a: int) -> SSAValue | float:
    """An immediate's value, else the buffer of value `a`."""
    return v.value if isinstance(v, Imm) else buf(a)


def emit_rowwise(kb: KernelBuilder, v: Node, ops: list[Arg], out: SSAValue, r: SSAValue, c: SSAValue,
                 scratch: tuple[list[SSAValue], list[SSAValue]], C: int) -> None:
    """A layer norm, RMS norm, softmax or log_softmax of whole rows (`c` = C columns): the row
    statistics are [rows x 1] fp32 columns, the arithmetic fp32, `out` rounded."""
    tiles, cols = scratch
    one = kb.const(1)
    x = _tile(ops[0])
    if v.kind == "layer_norm":
        xc, sq = tiles[0], tiles[1]
        mean, rstd = cols[0], cols[1]
        kb.add(tile.ReduceOp("sum", x, mean, r, c))
        kb.add(tile.ScalarOp("mul", mean, 1.0 / C, mean, r, one))
        kb.add(tile.BinaryOp("sub", x, mean, xc, r, c, "column"))
        kb.add(tile.UnaryOp("square", xc, sq, r, c))
        kb.add(tile.ReduceOp("sum", sq, rstd, r, c))
        kb.add(tile.ScalarOp("mul", rstd, 1.0 / C, rstd, r, one))
        kb.add(tile.ScalarOp("add", rstd, v.eps, rstd, r, one))
        kb.add(tile.UnaryOp("rsqrt", rstd, rstd, r, one))
        scale = ops[1] != ("imm", 1.0)  # an affine of ones and zeros (folded into the
        shift = ops[2] != ("imm", 0.0)  # next matmul, passes/graph/fold_norm_affine.py) is skipped
        kb.add(tile.BinaryOp("mul", xc, rstd, xc if scale or shift else out, r, c, "column"))
        if scale:
            emit_binary(kb, "mul", ("tile", xc), ops[1], xc if shift else out, r, c)
        if shift:
            emit_binary(kb, "add", ("tile", xc), ops[2], out, r, c)
        return
    if v.kind == "rms_norm":  # the layer norm without the mean subtraction
        sq, ms = tiles[0], cols[0]
        kb.add(tile.UnaryOp("square", x, sq, r, c))
        kb.add(tile.ReduceOp("sum", sq, ms, r, c))
        kb.add(tile.ScalarOp("mul", ms, 1.0 / C, ms, r, one))
        kb.add(tile.ScalarOp("add", ms, v.eps, ms, r, one))
        kb.add(tile.UnaryOp("rsqrt", ms, ms, r, one))
        scale = ops[1] != ("imm", 1.0)
        kb.add(tile.BinaryOp("mul", x, ms, sq if scale else out, r, c, "column"))
        if scale:
            emit_binary(kb, "mul", ("tile", sq), ops[1], out, r, c)
        return
    mx, sm = cols[0], cols[1]
    kb.add(tile.ReduceOp("max", x, mx, r, c))
    if v.kind == "softmax":
        e = tiles[0]
        kb.add(tile.BinaryOp("sub", x, mx, e, r, c, "column"))
        kb.add(tile.UnaryOp("exp", e, e, r, c))
        kb.add(tile.ReduceOp("sum", e, sm, r, c))
        kb.add(tile.UnaryOp("reciprocal", sm, sm, r, one))
        kb.add(tile.BinaryOp("mul", e, sm, out, r, c, "column"))
        return
    shifted, e = tiles[0], tiles[1]
    kb.add(tile.BinaryOp("sub", x, mx, shifted, r, c, "column"))
    kb.add(tile.UnaryOp("exp", shifted, e, r, c))
    kb.add(tile.ReduceOp("sum", e, sm, r, c))
    kb.add(tile.UnaryOp("log", sm, sm, r, one))
    kb.add(tile.BinaryOp("sub", shifted, sm, out, r, c, "column"))


def emit_node(kb: KernelBuilder, v: Node, ops: list[Arg], out: SSAValue, r: SSAValue, c: SSAValue,
              scratch: list[SSAValue]) -> None:
    """A unary, binary or where node on r x c (a where through three scratch tiles)."""
    if v.kind == "unary":
        (a,) = ops
        kb.add(tile.UnaryOp(v.fn, _tile(a), out, r, c))
        return
    if v.kind == "binary":
        emit_binary(kb, v.fn, ops[0], ops[1], out, r, c)
        return
    cond, x, y = ops  # where(c, x, y) = mask(x, c) + mask(y, c == 0)

    def scratch_of(k: int, cls: str) -> tuple[str, SSAValue]:
        buf = scratch[k]
        return (cls, _sub(kb, buf, 1) if cls == "column" else buf)

    def top(*ops_: Arg) -> str:
        return max((o[0] for o in ops_), key=CLASS_RANK.__getitem__)

    t = scratch_of(0, top(x, cond, ("column", None)))
    nc = scratch_of(1, top(cond, ("column", None)))
    u = scratch_of(2, top(y, nc))
    emit_binary(kb, "mask", x, cond, t[1], r, c if t[0] == "tile" else kb.const(1))
    emit_binary(kb, "eq", cond, ("imm", 0.0), nc[1], r, c if nc[0] == "tile" else kb.const(1))
    emit_binary(kb, "mask", y, nc, u[1], r, c if u[0] == "tile" else kb.const(1))
    emit_binary(kb, "add", t, u, out, r, c)


def _sub(kb: KernelBuilder, buf: SSAValue, cols: int) -> SSAValue:
    """The first `cols` columns of `buf`."""
    rows = shape_of(buf.type)[0]
    return kb.add(tile.SubviewOp(buf, kb.const(0), kb.const(0), [rows, cols])).results[0]


def emit_binary(kb: KernelBuilder, fn: str, a: Arg, b: Arg, out: SSAValue, r: SSAValue, c: SSAValue) -> None:
    """``out = fn(a, b)``: a scalar op with an immediate, a column op with a column."""
    ca, cb = a[0], b[0]
    if ca == "imm" and cb == "imm":
        raise CompileError(f"binary {fn} of two immediates reached the kernel")
    if cb == "imm":
        kb.add(tile.ScalarOp(fn, _tile(a), _imm(b), out, r, c))
    elif ca == "imm":
        kb.add(tile.ScalarOp(fn, _tile(b), _imm(a), out, r, c, swap=True))
    elif ca == "tile" and cb == "column":
        kb.add(tile.BinaryOp(fn, _tile(a), _tile(b), out, r, c, "column"))
    elif ca == "column" and cb == "tile":
        kb.add(tile.BinaryOp(fn, _tile(b), _tile(a), out, r, c, "column", swap=True))
    else:
        kb.add(tile.BinaryOp(fn, _tile(a), _tile(b), out, r, c))
