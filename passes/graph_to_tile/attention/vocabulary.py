"""The instruction vocabulary of an attention kernel body: windows, flags, and the four
building blocks (`_mm`, `_vec`, `_load`, `_store`) that each append one `SchedOp` with
its reads, writes and modelled cost, which the list scheduler (scheduler.py) orders
before emitting. `program.HeadProgram` writes a head's program in it (and the decode
kernel, decode_kernel.py, subclasses that). The state declared here is provided by the
kernel that uses it (`kernel.AttentionKernel`, `decode_kernel.DecodeAttentionKernel`):
the plan, the builder, the timing model, the buffer names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr, i1
from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.attention.plan import AttentionPlan
from tilecc.passes.graph_to_tile.attention.scheduler import AttentionTiming, SchedOp
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import DmaPattern

Pos = tuple[int, int]  # (row, column) of a window in a buffer
Prio = tuple[int, ...]  # (head, q-tile, phase): the program order the scheduler starts from
Ring = dict[str, int]  # the next buffer of each rotating set
KeyTile = tuple[int, int | None]  # (key tile, causal pattern or None)
# per batch dim: its index (a loop variable), or for the last one (base, head in the body,
# group base) of a body of heads; None in a dry run
BatchIndex = list[SSAValue | tuple[SSAValue, int, SSAValue | None] | None]
IndexFn = Callable[[], list[SSAValue]]
Buffers = list[SSAValue]


class HeadVocabulary:
    """Windows of buffers, constant flags and one-`SchedOp` building blocks over the
    state a kernel provides (declared below)."""

    p: AttentionPlan
    kb: KernelBuilder
    cfg: HardwareConfig
    tm: AttentionTiming
    fp32: bool  # the model dtype is fp32 (matmuls stream slower)
    isz: int  # bytes per element of the model dtype
    queues: int
    stores_any_queue = False  # stores on the first free DMA queue (else the last)
    names: dict[SSAValue, str]  # buffer -> its name (the scheduler's dependences)
    _win: dict[tuple[int, SSAValue, int, int, tuple[int, ...]], SSAValue]
    _true: SSAValue | None
    _false: SSAValue | None

    # -- windows and flags -----------------------------------------------------------
    def name(self, v: SSAValue) -> str:
        return self.names[v]

    def win(self, buf: SSAValue, row: int, col: int, shape: Sequence[int]) -> SSAValue:
        """The window ``buf[row:, col:]`` of `shape` (one subview per block and window)."""
        if row == 0 and col == 0 and list(shape) == list(shape_of(buf.type)):
            return buf
        key = (id(self.kb.block), buf, row, col, tuple(shape))
        v = self._win.get(key)
        if v is None:
            c = self.kb.const
            v = self.kb.add(tile.SubviewOp(buf, c(row), c(col), list(shape))).results[0]
            self._win[key] = v
        return v

    def flag(self, value: bool) -> SSAValue:
        if self._true is None or self._false is None:
            self._true = self.kb.add_entry(arith.ConstantOp(IntegerAttr(1, i1)))
            self._false = self.kb.add_entry(arith.ConstantOp(IntegerAttr(0, i1)))
        return self._true if value else self._false

    # -- building blocks: each appends one SchedOp ---------------------------------------------
    def _mm(self, ops: list[SchedOp], lhsT: SSAValue, lpos: Pos, rhs: SSAValue, rpos: Pos, acc: SSAValue,
            apos: Pos, m: int, k: int, n: int, accumulate: bool, prio: Prio) -> None:
        """acc[apos: m x n] (+)= lhsT[lpos: k x m]^T @ rhs[rpos: k x n]; pos = (row, col)."""
        fp32 = self.fp32 or element_size(elem_of(lhsT.type)) == 4

        def emit(_q: int | None) -> None:
            c = self.kb.const
            self.kb.add(tile.MatmulOp(self.win(lhsT, *lpos, [k, m]), self.win(rhs, *rpos, [k, n]),
                                      self.win(acc, *apos, [m, n]), c(m), c(k), c(n), self.flag(accumulate)))

        ops.append(SchedOp("mm", emit, (self.name(lhsT), self.name(rhs), self.name(acc)), (self.name(acc),), prio,
                       self.tm.mm(m, k, n, fp32)))

    def _vec(self, ops: list[SchedOp], kind: str, fn: str, src: SSAValue, spos: Pos, dst: SSAValue, dpos: Pos,
             rows: int, cols: int, prio: Prio, imm: float | None = None,
             col: tuple[SSAValue, Pos] | None = None) -> None:
        """One vector instruction: `kind` unary, scalar (immediate `imm`), reduce (into a
        column) or column (a binary op with the column operand `col`)."""

        def emit(_q: int | None) -> None:
            c = self.kb.const
            a = self.win(src, *spos, [rows, cols])
            o = self.win(dst, *dpos, [rows, 1 if kind == "reduce" else cols])
            if kind == "unary":
                self.kb.add(tile.UnaryOp(fn, a, o, c(rows), c(cols)))
            elif kind == "scalar":
                assert imm is not None
                self.kb.add(tile.ScalarOp(fn, a, imm, o, c(rows), c(cols)))
            elif kind == "reduce":
                self.kb.add(tile.ReduceOp(fn, a, o, c(rows), c(cols)))
            else:  # binary with a column operand
                assert col is not None
                cb, cpos = col
                self.kb.add(tile.BinaryOp(fn, a, self.win(cb, *cpos, [rows, 1]), o, c(rows), c(cols), "column"))

        reads = [self.name(src)] + ([self.name(col[0])] if col is not None else [])
        cost_kind = {"unary": "unary", "scalar": "binary", "reduce": "reduce", "column": "binary"}[kind]
        ops.append(SchedOp("vec", emit, tuple(reads), (self.name(dst),), prio, self.tm.vec(cost_kind, fn, rows, cols)))

    def _load(self, ops: list[SchedOp], arg: SSAValue, idx_fn: IndexFn, dst: SSAValue, dpos: Pos, rows: int,
              cols: int, row_dim: int, col_dim: int, prio: Prio, row_step: int = 1,
              pattern: DmaPattern | None = None) -> None:
        """A DMA of rows x cols of kernel argument `arg` (at `idx_fn()`) into `dst`;
        `pattern`: how it walks HBM (default: contiguous rows, strided where `col_dim`
        is -1, a broadcast column)."""

        def emit(q: int | None) -> None:
            self.kb.add(tile.LoadOp(arg, idx_fn(), self.win(dst, *dpos, [rows, cols]), self.kb.const(rows),
                                    self.kb.const(cols), row_dim, col_dim, row_step=row_step, queue=q))

        if pattern is None:
            pattern = DmaPattern.CONTIGUOUS if col_dim >= 0 else DmaPattern.STRIDED
        fixed, transfer = self.tm.dma(rows, cols, self.isz, pattern)
        share, engines = self.tm.dma_sharing(rows, cols, self.isz, pattern)
        ops.append(SchedOp("load", emit, (), (self.name(dst),), prio, fixed, transfer, share=share, engines=engines))

    def _store(self, ops: list[SchedOp], src: SSAValue, arg: SSAValue, idx_fn: IndexFn, rows: int, cols: int,
               prio: Prio) -> None:
        """A DMA of rows x cols of `src` into kernel argument `arg`: on the last queue, or
        where `stores_any_queue`, on the first free one the schedule finds."""
        rank = len(shape_of(arg.type))

        def emit(q: int | None) -> None:
            self.kb.add(tile.StoreOp(src, arg, idx_fn(), self.kb.const(rows), self.kb.const(cols), rank - 2, rank - 1,
                                     queue=q))

        fixed, transfer = self.tm.dma(rows, cols, self.isz)
        share, engines = self.tm.dma_sharing(rows, cols, self.isz)
        ops.append(SchedOp("store", emit, (self.name(src),), (), prio, fixed, transfer,
                           None if self.stores_any_queue else self.queues - 1, share=share, engines=engines))

    def _index(self, bidx: BatchIndex, arg: SSAValue, group: int = 1) -> IndexFn:
        """The leading (batch) indices of kernel argument `arg` for batch index `bidx`
        (operand dims aligned right; a size-1 dim broadcasts). `group`: heads per index
        of the argument's last batch dim (a head-grouped view)."""
        p, kb = self.p, self.kb
        shape = shape_of(arg.type)
        nb, nbo = len(p.batch), len(shape) - 2

        def idx() -> list[SSAValue]:
            out: list[SSAValue] = []
            for e in range(nbo):
                d = e + nb - nbo
                if shape[e] == 1 and p.batch[d] != 1:
                    out.append(kb.const(0))
                    continue
                x = bidx[d]
                if isinstance(x, tuple):
                    base, u, gbase = x
                    if group > 1:
                        assert gbase is not None
                        base, u = gbase, u // group
                    x = kb.addi(base, kb.const(u)) if u else base
                assert x is not None, "attention: a dry run has no batch indices"
                out.append(x)
            return out

        return idx


__all__ = ["BatchIndex", "Buffers", "HeadVocabulary", "IndexFn", "KeyTile", "Pos", "Prio", "Ring"]
