"""The decode-attention kernel's emitter: one kernel for every problem of a decode sdpa.

For a schedule (`decode_plan.DecodeSchedule`: groups of n problems, f positions per
partition row, m problems per K / V transfer, U groups per loop body) the kernel is a
loop over the groups, U per body (each its SRAM buffers, the accumulators in two sets
alternating, so one group's loads run under another's compute); each body is
list-scheduled (`scheduler.schedule`) before it is emitted. For the Llama-3.2-1B
decode shape at batch 32 (256 problems of 4 rows, 130 cached positions)::

    func.func @k0_decode_attention(%q: memref<1024x64xbf16>, %k: memref<6656x320xbf16>,
        %v: memref<6656x320xbf16>, %mask: memref<32x130xbf16>, %out: memref<1024x64xbf16>,
        %ident: memref<128x128xbf16>, %sel: memref<20x640xbf16>, %pattern: memref<128x520xbf16>) {
      scf.for %it = 0 to 2 {                        (4 groups of 32 problems per body)
        tile.load %q[g rows] into %q_s              one DMA: the group's 128 query rows
        tile.matmul %q_s, %ident into %acc_qT       Q^T; tile.scalar "mul" (scale) -> %qT
        tile.matmul %ident, %pattern into %acc_s    the scores start as the block pattern
        tile.load %mask[4 g + b, 0] into %mask[5 b ..] {row_dim = col_dim = 1, col_step = 5}
                                                    4 mask rows: one DMA transpose each, window t on partition 5 b + t
        tile.matmul %sel[.., t 128], %mask into %acc_s[.., (t m + c) R]   each row's mask row, window t
        tile.load %k[rows of 4 problems] into %k_s  one transfer of m = 4 problems (8 per group)
        tile.matmul %k_s[.., t D], %ident into %acc_kT          K^T of window t; copy -> %kT
        tile.matmul %qT[.., 4 problems], %kT[.., window t] into %acc_s[4 problems' rows, t m R]
        tile.reduce "max" / tile.binary "sub" column / tile.unary "exp" / tile.reduce "sum"
        tile.matmul %p[.., b T], %ident into %acc_pT            P^T, T score columns at a time
        tile.matmul %pT[rows (t, c, r), 4 problems], %v_s[.., t Dv] into %acc_o[4 problems' rows]
        tile.binary "div" %acc_o, %l "column" into %o_s; tile.store %o_s into %out[g rows]
      }
    }

Layout: view row r of a transfer holds f positions, window t is position ``f r + t``;
a query row's ``m S`` score columns run (window t, problem c of its transfer, row r), so
one matmul per transfer and window computes the scores of its m problems, and the
constant block pattern (0 where c is the row's own problem, half the dtype's lowest
value elsewhere, added first) makes the others' exp exactly 0. The mask rows are loaded
permuted the same way (f strided loads, or transposed: below) and added per window and
problem c by a 0/1 selection matmul; the mask is clamped to half the lowest value, so mask plus pattern
stays finite. A 2-byte mask loads transposed instead where that is faster
(`decode_plan.mask_transposed`): one DMA transpose per mask row b puts window t on
partition ``b f + t`` (f positions per descriptor, against one 2-byte element per
descriptor for the strided loads, ~13,000 cycles for 128 positions on ``cloud``), and
the selection of window t is a constant ``[rows f x n L]`` block contracted over all
of them. P^T's rows then run (t, c, r): window t's rows of a transfer are P^T rows
``t m R ..``, which meet V window t's rows in one P V matmul per transfer and window
(the pattern's zeros keep each query row to its own problem). The softmax is exact per
group (a row's scores are all in the accumulator: the row max, ``exp(S - m)``, the row
sum of the rounded P, one divide at the end), in fp32 with P rounded to the model
dtype as the flash kernel does.

With blocks (`DecodeSchedule.rc`: a long cache) a group's program is a sequence of
cache blocks instead (`_group_online`): per block the mask windows, per problem a K and a
V transfer of ``[rc, f D]``, K^T and the scores, then the block max ``m_b``, the running
max ``m' = max(m, m_b)``, ``alpha = exp(m - m')``, ``P = exp(S - m')``, ``l' = alpha l +
rowsum(P)``, P^T, P V into the accumulator and ``o' = alpha o + P V`` (fp32 in SRAM); the
last block's ``o / l`` is stored. The blocks' buffers alternate (scores, P, V, the running
state), K and K^T cycle through a ring, so the list scheduler overlaps a block's loads
with the previous block's softmax and P V.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import Float32Type, MemRefType, f32
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.attention.decode_plan import (
    KV_RING,
    DecodeProblem,
    DecodeSchedule,
    mask_shape,
    sel_shape,
)
from tilecc.passes.graph_to_tile.attention.program import HeadProgram
from tilecc.passes.graph_to_tile.attention.scheduler import AttentionTiming, SchedOp, ScheduleInit, schedule
from tilecc.passes.graph_to_tile.attention.vocabulary import IndexFn, Prio
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import dense_attr
from tilecc.simulator.timing import DmaPattern

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

SCHEDULE_TRIES = 4
DecodeTensors = tuple[SSAValue, SSAValue, SSAValue, SSAValue | None, SSAValue]  # q, k, v, mask, out (row views)


class DecodeAttentionKernel(HeadProgram):
    """One decode-attention kernel: `build` emits it and returns the scheduled estimate."""

    def __init__(self, lw: LoweringContext, p: DecodeProblem, s: DecodeSchedule, elem: Attribute, scale: float,
                 lowest: float, loc: str, tensors: DecodeTensors | None) -> None:
        """With `tensors` (q, k, v, mask or None, out: the row views) `build` emits and
        launches the kernel; without, a dry run: `build` only schedules its bodies."""
        self.lw, self.prob, self.s, self.elem, self.scale, self.lowest = lw, p, s, elem, scale, lowest
        self.cfg = lw.cfg
        self.isz = element_size(elem)
        self.fp32 = isinstance(elem, Float32Type)
        self.tm = AttentionTiming(self.cfg)
        self.queues = self.cfg.dma.queues
        self.names: dict[SSAValue, str] = {}
        self._win = {}
        self._true = self._false = None
        self.qmap: dict[str, int] = {}
        nL, T, W, R = s.n * p.L, s.T, s.width(p), s.R(p)
        has_mask = s.mask_span > 0
        # score column (t, c, r) of query row (j, l) belongs to problem j only if c = j mod m
        slot = (np.arange(W) // R) % s.m
        own = (np.arange(nL) // p.L) % s.m
        sel = np.zeros((max(1, s.mask_span), nL), dtype=np.float32)
        for j in range(s.n):
            if p.mask_rows is not None:
                sel[p.mask_rows[j], j * p.L:(j + 1) * p.L] = 1.0
        if s.mask_t:  # window t's selection: rows b f + t (mask row b's window t), columns t n L
            selt = np.zeros(sel_shape(p, s), dtype=np.float32)
            for t in range(s.f):
                selt[t::s.f, t * nL:(t + 1) * nL] = sel
            sel = selt
        consts = [("ident", np.eye(T, dtype=np.float32))]
        if has_mask:
            consts.append(("sel", sel))
        if s.m > 1:
            consts.append(("pattern", np.where(slot[None, :] == own[:, None], 0.0, lowest / 2).astype(np.float32)))
        self.dry = tensors is None
        if tensors is None:  # a dry run: the arguments' types only
            shapes = [(p.P * p.L, p.D), (p.P * R, s.f * p.D), (p.P * R, s.f * p.Dv)]
            shapes += [(p.mask_count, p.S)] if has_mask else []
            shapes += [(p.P * p.L, p.Dv)] + [c.shape for _, c in consts]
            types = [MemRefType(elem, list(x)) for x in shapes]
            args: list[SSAValue] = []
        else:
            q, k, v, mask, out = tensors
            args = [q, k, v] + ([mask] if mask is not None else []) + [out]
            args += [lw.hbm(list(c.shape), elem, value=dense_attr(c, elem, c.shape)) for _, c in consts]
            types = [a.type for a in args]
        self.hbm_args = args
        self.kb = KernelBuilder(lw.kernel_name("decode_attention"), types, loc)
        a = list(self.kb.args)
        self.a_q, self.a_k, self.a_v = a[:3]
        rest = a[3:]
        self.a_mask = rest.pop(0) if has_mask else None
        self.a_out, self.a_ident = rest[0], rest[1]
        self.a_sel = rest[2] if has_mask else None
        self.a_pat = rest[-1] if s.m > 1 else None

    # -- buffers -----------------------------------------------------------------------
    def alloc(self, shape: Sequence[int], space: str, name: str, elem: Attribute | None = None) -> SSAValue:
        v = self.kb.alloc(list(shape), self.elem if elem is None else elem, space, name)
        owner = v.owner
        if not isinstance(owner, tile.AllocOp):
            raise CompileError(f"decode attention kernel: buffer {name} is not a tile.alloc")
        self.names[v] = owner.buffer.data
        return v

    def _buffers(self) -> None:
        if self.s.online:
            self._buffers_online()
            return
        p, s, SRAM, ACC = self.prob, self.s, tile.SRAM, tile.ACC
        nL, tiles, R, blocks = s.n * p.L, s.n // s.m, s.R(p), s.blocks(p)
        wD = s.pack(p) * p.D
        self.sets = []
        for _ in range(s.U):
            b = {
                "q": self.alloc([nL, wD], SRAM, "q"),
                "qT": self.alloc([wD, nL], SRAM, "qT"),
                "k": [self.alloc([s.m * R, s.f * p.D], SRAM, "k") for _ in range(tiles)],
                "kT": self.alloc([wD, tiles * s.packs(p) * s.m * R], SRAM, "kT"),
                "v": [self.alloc([s.m * R, s.f * p.Dv], SRAM, "v") for _ in range(tiles)],
                "m": self.alloc([nL, 1], SRAM, "m", f32),
                "sm": self.alloc([nL, s.width(p)], SRAM, "s_m", f32),
                "p": self.alloc([nL, s.width(p)], SRAM, "p"),
                "l": self.alloc([nL, 1], SRAM, "l", f32),
                "pT": self.alloc([s.T, blocks * nL], SRAM, "pT"),
                "o": self.alloc([nL, p.Dv], SRAM, "out"),
            }
            if s.mask_span:
                b["mrow"] = self.alloc(list(mask_shape(p, s)), SRAM, "mask")
            self.sets.append(b)
        # accumulators: two sets, alternating by group (a group's are free once it stored)
        for u in range(min(2, s.U)):
            acc = {
                "acc_q": self.alloc([wD, nL], ACC, "acc_qT", f32),
                "acc_s": self.alloc([nL, s.width(p)], ACC, "acc_s", f32),
                "acc_pT": self.alloc([s.T, blocks * nL], ACC, "acc_pT", f32),
                "acc_o": self.alloc([nL, p.Dv], ACC, "acc_o", f32),
            }
            for x in range(u, s.U, 2):
                self.sets[x].update(acc)
        self.acc_kt = [self.alloc([wD, s.packs(p) * s.m * R], ACC, "acc_kT", f32) for _ in range(2)]

    # -- the kernel ----------------------------------------------------------------------
    def build(self) -> float:
        """Emit the kernel and launch it (unless a dry run); the estimated cycles of its
        schedule (each body's replay times the loop trips)."""
        p, s, kb, c = self.prob, self.s, self.kb, self.kb.const
        T = s.T
        self.ident = self.alloc([T, T], tile.SRAM, "ident")
        kb.add(tile.LoadOp(self.a_ident, [c(0), c(0)], self.ident, c(T), c(T), 0, 1, queue=0))
        fixed, transfer = self.tm.dma(T, T, self.isz)
        qfree = [0.0] * self.queues
        init = ScheduleInit(qfree=qfree, ready={"ident": fixed + transfer}, qmap=self.qmap, pre=[])
        self.qmap["ident"] = 0
        qfree[0] = fixed + transfer
        self.sel: SSAValue | None = None
        if self.a_sel is not None:
            sr, sc = sel_shape(p, s)
            self.sel = self.alloc([sr, sc], tile.SRAM, "sel")
            kb.add(tile.LoadOp(self.a_sel, [c(0), c(0)], self.sel, c(sr), c(sc), 0, 1, queue=1))
            fixed, transfer = self.tm.dma(sr, sc, self.isz)
            init.ready["sel"] = fixed + transfer
            qfree[1] = fixed + transfer
            self.qmap["sel"] = 1
        self.pat: SSAValue | None = None
        if self.a_pat is not None:
            nL, W = s.n * p.L, s.width(p)
            self.pat = self.alloc([nL, W], tile.SRAM, "pattern")
            kb.add(tile.LoadOp(self.a_pat, [c(0), c(0)], self.pat, c(nL), c(W), 0, 1, queue=2))
            fixed, transfer = self.tm.dma(nL, W, self.isz)
            init.ready["pattern"] = fixed + transfer
            qfree[2 % self.queues] += fixed + transfer
            self.qmap["pattern"] = 2 % self.queues
        self._buffers()
        trips = s.groups(p) // s.U
        with kb.loop(trips) as it:
            span = self._body(it, trips, init)
        if not self.dry:
            self.lw.launch(kb, self.hbm_args)
        return span * trips

    def _body(self, it: SSAValue, trips: int, init: ScheduleInit) -> float:
        ops: list[SchedOp] = []
        kb = self.kb
        for u in range(self.s.U):
            if trips > 1:
                g = kb.addi(kb.muli(it, kb.const(self.s.U)), kb.const(u)) if u else kb.muli(it, kb.const(self.s.U))
            else:
                g = kb.const(u)
            if self.s.online:
                self._group_online(ops, g)
            else:
                self._group(ops, u, g)
        order, span = schedule(ops, self.tm, self.queues, init, 0 if self.dry else SCHEDULE_TRIES)
        if self.dry:
            return span
        for o, q in order:
            if o.kind == "load" and q is not None:
                self.qmap.setdefault(o.writes[0], q)
        for o, q in order:
            o.emit(q)
        return span

    def _q_transposed(self, ops: list[SchedOp], b: dict, g: SSAValue, pr: Prio) -> None:
        """The group's q rows, copied to w column blocks, transposed and scaled: Q^T
        repeated on the w D partitions the packed K^T windows occupy."""
        p, s = self.prob, self.s
        nL, w = s.n * p.L, s.pack(p)
        self._load(ops, self.a_q, self._rows(g, nL), b["q"], (0, 0), nL, p.D, 0, 1, pr)
        for j in range(1, w):
            self._vec(ops, "unary", "copy", b["q"], (0, 0), b["q"], (0, j * p.D), nL, p.D, pr)
        self._mm(ops, b["q"], (0, 0), self.ident, (0, 0), b["acc_q"], (0, 0), w * p.D, nL, nL, False, pr)
        self._vec(ops, "scalar", "mul", b["acc_q"], (0, 0), b["qT"], (0, 0), w * p.D, nL, pr, imm=self.scale)

    def _k_transposed(self, ops: list[SchedOp], k: SSAValue, acc: SSAValue, kT: SSAValue, kcol: int, rows: int,
                      pr: Prio) -> None:
        """K^T of a transfer (`rows` view rows of f windows): window t = pk w + j at
        partitions j D, columns kcol + pk rows of `kT` (one transpose and copy per pack)."""
        p, s = self.prob, self.s
        w, packs, f = s.pack(p), s.packs(p), s.f
        for pk in range(packs):
            ww = min(w, f - pk * w)
            self._mm(ops, k, (0, pk * w * p.D), self.ident, (0, 0), acc, (0, pk * rows), ww * p.D, rows, rows, False,
                     pr)
        full = f // w  # packs of w windows, then one of the f mod w left
        if full:
            self._vec(ops, "unary", "copy", acc, (0, 0), kT, (0, kcol), w * p.D, full * rows, pr)
        if f % w:
            self._vec(ops, "unary", "copy", acc, (0, full * rows), kT, (0, kcol + full * rows), (f % w) * p.D, rows,
                      pr)

    def _rows(self, g: SSAValue, per_group: int, extra: int = 0, col: int = 0) -> IndexFn:
        """[g * per_group + extra, col] (built when the op is emitted, inside the loop)."""
        kb = self.kb

        def idx() -> list[SSAValue]:
            r = kb.muli(g, kb.const(per_group)) if per_group else kb.const(0)
            return [kb.addi(r, kb.const(extra)) if extra else r, kb.const(col)]

        return idx

    def _load_cols(self, ops: list[SchedOp], arg: SSAValue, idx_fn: IndexFn, dst: SSAValue, dcol: int, rows: int,
                   cols: int, col_step: int, prio: Prio) -> None:
        """A DMA of rows x cols of 2-D `arg`, every `col_step`-th column, into `dst` at column `dcol`."""

        def emit(q: int | None) -> None:
            self.kb.add(tile.LoadOp(arg, idx_fn(), self.win(dst, 0, dcol, [rows, cols]), self.kb.const(rows),
                                    self.kb.const(cols), 0, 1, col_step=col_step, queue=q))

        pattern = DmaPattern.CONTIGUOUS if col_step == 1 else DmaPattern.STRIDED
        fixed, transfer = self.tm.dma(rows, cols, self.isz, pattern)
        share, engines = self.tm.dma_sharing(rows, cols, self.isz, pattern)
        ops.append(SchedOp("load", emit, (), (self.name(dst),), prio, fixed, transfer, share=share, engines=engines))

    def _mask_windows(self, ops: list[SchedOp], g: SSAValue, mrow: SSAValue, pos: int, cols: int,
                      pr: Prio) -> None:
        """The group's mask rows for the f windows of `cols` view rows from position `pos`
        (a cache block's, or the whole cache's), clamped to half the lowest value so that with the
        block pattern's half they stay finite. Transposed (`DecodeSchedule.mask_t`): one
        DMA transpose per mask row b puts window t (positions ``pos + t + f r``) on
        partition ``b f + t``; else one strided load per window t, every mask row's
        positions ``pos + t + f r`` at columns ``t cols``."""
        s, f = self.s, self.s.f
        assert self.a_mask is not None and self.sel is not None
        if s.mask_t:
            for r in range(s.mask_span):
                self._load_mask_t(ops, self._rows(g, s.mask_step, r, col=pos), mrow, r * f, cols, pr)
        else:
            for t in range(f if f > 1 else 1):
                self._load_cols(ops, self.a_mask, self._rows(g, s.mask_step, col=pos + t), mrow, t * cols,
                                s.mask_span, cols if f > 1 else f * cols, f, pr)
        rows, width = (s.mask_span * f, cols) if s.mask_t else (s.mask_span, f * cols)
        self._vec(ops, "scalar", "max", mrow, (0, 0), mrow, (0, 0), rows, width, pr, imm=self.lowest / 2)

    def _mask_mm(self, ops: list[SchedOp], mrow: SSAValue, t: int, r0: int, acc: SSAValue, col: int, w: int,
                 accumulate: bool, pr: Prio, cols: int) -> None:
        """``acc[:, col .. col + w] (+)= `` each query row's mask row, window t, view rows
        r0 .. r0 + w (of `cols` loaded): a 0/1 selection matmul over the group's mask rows
        (transposed: over their f windows, the selection of window t)."""
        p, s = self.prob, self.s
        nL = s.n * p.L
        assert self.sel is not None
        if s.mask_t:
            self._mm(ops, self.sel, (0, t * nL), mrow, (0, r0), acc, (0, col), nL, s.mask_span * s.f, w,
                     accumulate, pr)
        else:
            self._mm(ops, self.sel, (0, 0), mrow, (0, t * cols + r0), acc, (0, col), nL, s.mask_span, w,
                     accumulate, pr)

    def _load_mask_t(self, ops: list[SchedOp], idx_fn: IndexFn, dst: SSAValue, row: int, cols: int,
                     prio: Prio) -> None:
        """A DMA transpose of one mask row's positions ``[pos, pos + f cols)`` into `dst`
        rows ``row .. row + f``: element (t, r) is position ``pos + t + f r`` (row stride
        1, column stride f: f contiguous positions per descriptor)."""
        f, mask = self.s.f, self.a_mask
        assert mask is not None

        def emit(q: int | None) -> None:
            self.kb.add(tile.LoadOp(mask, idx_fn(), self.win(dst, row, 0, [f, cols]), self.kb.const(f),
                                    self.kb.const(cols), 1, 1, row_step=1, col_step=f, queue=q))

        fixed, transfer = self.tm.dma(f, cols, self.isz, DmaPattern.TRANSPOSE)
        share, engines = self.tm.dma_sharing(f, cols, self.isz, DmaPattern.TRANSPOSE)
        ops.append(SchedOp("load", emit, (), (self.name(dst),), prio, fixed, transfer, share=share, engines=engines))

    def _group(self, ops: list[SchedOp], u: int, g: SSAValue) -> None:
        """One group's program: loads, Q^T, scores (block pattern, mask, Q K^T), softmax,
        P^T, P V, store."""
        p, s, b = self.prob, self.s, self.sets[u]
        L, n, f, m, R, T = p.L, s.n, s.f, s.m, s.R(p), s.T
        nL, tiles, W = n * L, n // m, s.width(p)
        pr = (u,)
        # q rows and Q^T (scaled, in the model dtype)
        self._q_transposed(ops, b, g, pr)
        # the scores start as the block pattern (the other problems of a transfer masked)
        written = False
        if self.pat is not None:
            for c0 in range(0, W, T):
                w = min(T, W - c0)
                self._mm(ops, self.ident, (0, 0), self.pat, (0, c0), b["acc_s"], (0, c0), nL, nL, w, False, pr)
            written = True
        # plus the mask rows (permuted as the windows, clamped to half the lowest value so that
        # with the pattern's half they stay finite), selected per query row
        if s.mask_span:
            self._mask_windows(ops, g, b["mrow"], 0, R, pr)
            # column (t, c, r) of every row: mask column t R + r (problem c's own rows keep it)
            for t in range(f):
                for c in range(m):
                    for r0 in range(0, R, T):
                        w = min(T, R - r0)
                        self._mask_mm(ops, b["mrow"], t, r0, b["acc_s"], (t * m + c) * R + r0, w, written, pr, R)
            written = True
        # K and V: m problems per transfer; K^T per window; Q K^T per transfer and window
        for i in range(tiles):
            rows = self._rows(g, n * R, i * m * R)
            self._load(ops, self.a_k, rows, b["k"][i], (0, 0), m * R, f * p.D, 0, 1, pr)
            kcol = i * s.packs(p) * m * R
            self._k_transposed(ops, b["k"][i], self.acc_kt[i % 2], b["kT"], kcol, m * R, pr)
            self._load(ops, self.a_v, rows, b["v"][i], (0, 0), m * R, f * p.Dv, 0, 1, pr)
            w = s.pack(p)
            for t in range(f):
                pk, j = divmod(t, w)
                self._mm(ops, b["qT"], (j * p.D, i * m * L), b["kT"], (j * p.D, kcol + pk * m * R), b["acc_s"],
                         (i * m * L, t * m * R), m * L, p.D, m * R, written, pr)
        # softmax over the whole row (exact max), P in the model dtype, its row sum
        self._vec(ops, "reduce", "max", b["acc_s"], (0, 0), b["m"], (0, 0), nL, W, pr)
        self._vec(ops, "column", "sub", b["acc_s"], (0, 0), b["sm"], (0, 0), nL, W, pr, col=(b["m"], (0, 0)))
        self._vec(ops, "unary", "exp", b["sm"], (0, 0), b["p"], (0, 0), nL, W, pr)
        self._vec(ops, "reduce", "sum", b["p"], (0, 0), b["l"], (0, 0), nL, W, pr)
        # P^T: T score columns per transpose (on partitions), the group's rows as columns
        for blk in range(s.blocks(p)):
            w = min(T, W - blk * T)
            self._mm(ops, b["p"], (0, blk * T), self.ident, (0, 0), b["acc_pT"], (0, blk * nL), w, nL, nL, False, pr)
            self._vec(ops, "unary", "copy", b["acc_pT"], (0, blk * nL), b["pT"], (0, blk * nL), w, nL, pr)
        # O = P V per transfer and window: P^T rows (t, c, r) meet V window t's rows (c, r);
        # the block pattern made P zero where c is not the row's problem
        for i in range(tiles):
            first = True
            for t in range(f):
                r0 = 0
                while r0 < m * R:
                    blk, row = divmod(t * m * R + r0, T)
                    run = min(m * R - r0, T - row)
                    self._mm(ops, b["pT"], (row, blk * nL + i * m * L), b["v"][i], (r0, t * p.Dv), b["acc_o"],
                             (i * m * L, 0), m * L, run, p.Dv, not first, pr)
                    first = False
                    r0 += run
        self._vec(ops, "column", "div", b["acc_o"], (0, 0), b["o"], (0, 0), nL, p.Dv, pr, col=(b["l"], (0, 0)))
        self._store(ops, b["o"], self.a_out, self._rows(g, nL), nL, p.Dv, pr)

    # -- the online softmax: the cache in blocks -------------------------------------------
    def _buffers_online(self) -> None:
        """One group set (U = 1); per block parity the scores, P, P^T, the running max,
        sum and output and the group's V blocks; a ring of `KV_RING` K and K^T buffers;
        two K^T accumulators."""
        p, s, SRAM, ACC = self.prob, self.s, tile.SRAM, tile.ACC
        nL, W = s.n * p.L, s.width(p)
        blocks = s.blocks(p)
        wD, Wk = s.pack(p) * p.D, s.packs(p) * s.rc
        b: dict = {
            "q": self.alloc([nL, wD], SRAM, "q"),
            "qT": self.alloc([wD, nL], SRAM, "qT"),
            "o": self.alloc([nL, p.Dv], SRAM, "out"),
            "acc_q": self.alloc([wD, nL], ACC, "acc_qT", f32),
            "k": [self.alloc([s.rc, s.f * p.D], SRAM, "k") for _ in range(KV_RING)],
            "kT": [self.alloc([wD, Wk], SRAM, "kT") for _ in range(KV_RING)],
        }
        for x in range(2):
            names = {"sm": ([nL, W], SRAM, f32), "p": ([nL, W], SRAM, None), "pT": ([s.T, blocks * nL], SRAM, None),
                     "mc": ([nL, 1], SRAM, f32), "lc": ([nL, 1], SRAM, f32), "m": ([nL, 1], SRAM, f32),
                     "l": ([nL, 1], SRAM, f32), "d": ([nL, 1], SRAM, f32), "al": ([nL, 1], SRAM, f32),
                     "orun": ([nL, p.Dv], SRAM, f32), "acc_s": ([nL, W], ACC, f32),
                     "acc_pT": ([s.T, blocks * nL], ACC, f32), "acc_o": ([nL, p.Dv], ACC, f32)}
            if s.mask_span:
                names["mrow"] = (list(mask_shape(p, s)), SRAM, None)
            for key, (shape, space, el) in names.items():
                b[f"{key}{x}"] = self.alloc(shape, space, key, el)
            b[f"v{x}"] = [self.alloc([s.rc, s.f * p.Dv], SRAM, "v") for _ in range(s.n)]  # held until P V
        self.sets = [b]
        self.acc_kt = [self.alloc([wD, Wk], ACC, "acc_kT", f32) for _ in range(s.kt_acc)]

    def _bin(self, ops: list[SchedOp], fn: str, a: SSAValue, b: SSAValue, dst: SSAValue, rows: int, cols: int,
             prio: Prio) -> None:
        """dst = a fn b elementwise (tiles of the same shape, at their origins)."""

        def emit(_q: int | None) -> None:
            c = self.kb.const
            self.kb.add(tile.BinaryOp(fn, self.win(a, 0, 0, [rows, cols]), self.win(b, 0, 0, [rows, cols]),
                                      self.win(dst, 0, 0, [rows, cols]), c(rows), c(cols), "tile"))

        ops.append(SchedOp("vec", emit, (self.name(a), self.name(b)), (self.name(dst),), prio,
                           self.tm.vec("binary", fn, rows, cols, 2)))

    def _group_online(self, ops: list[SchedOp], g: SSAValue) -> None:
        """One group's program over the cache blocks: per block the mask, per problem a K
        and a V transfer, K^T and the scores; the block's max, the running max
        ``m' = max(m, m_b)``, ``alpha = exp(m - m')``, ``P = exp(S - m')``, the running sum
        ``l' = alpha l + rowsum(P)``, P^T, P V and the running output ``o' = alpha o + P V``;
        at the end ``o / l`` is stored."""
        p, s, b = self.prob, self.s, self.sets[0]
        L, n, f, R, T = p.L, s.n, s.f, s.R(p), s.T
        nL = n * L
        pr: Prio = (0,)
        self._q_transposed(ops, b, g, pr)
        m_cur = l_cur = o_cur = None
        ring = 0
        for ci, (r0, rc) in enumerate(s.chunks(p)):
            x = ci % 2
            W = f * rc
            acc_s = b[f"acc_s{x}"]
            written = False
            if s.mask_span:
                mrow = b[f"mrow{x}"]
                self._mask_windows(ops, g, mrow, f * r0, rc, pr)
                for t in range(f):
                    self._mask_mm(ops, mrow, t, 0, acc_s, t * rc, rc, False, pr, rc)
                written = True
            for i in range(n):
                k, v, kT = b["k"][ring], b[f"v{x}"][i], b["kT"][ring]
                ring = (ring + 1) % KV_RING
                rows = self._rows(g, n * R, i * R + r0)
                self._load(ops, self.a_k, rows, k, (0, 0), rc, f * p.D, 0, 1, pr)
                self._k_transposed(ops, k, self.acc_kt[i % len(self.acc_kt)], kT, 0, rc, pr)
                self._load(ops, self.a_v, rows, v, (0, 0), rc, f * p.Dv, 0, 1, pr)
                w = s.pack(p)
                for t in range(f):
                    pk, j = divmod(t, w)
                    self._mm(ops, b["qT"], (j * p.D, i * L), kT, (j * p.D, pk * rc), acc_s, (i * L, t * rc), L, p.D,
                             rc, written, pr)
            # the running max and the rescale factor alpha = exp(m - m')
            mc, m_new = b[f"mc{x}"], b[f"m{x}"]
            self._vec(ops, "reduce", "max", acc_s, (0, 0), mc, (0, 0), nL, W, pr)
            if m_cur is None:
                m_new = mc
            else:
                self._bin(ops, "max", m_cur, mc, m_new, nL, 1, pr)
                self._bin(ops, "sub", m_cur, m_new, b[f"d{x}"], nL, 1, pr)
                self._vec(ops, "unary", "exp", b[f"d{x}"], (0, 0), b[f"al{x}"], (0, 0), nL, 1, pr)
            sm, pp, lc = b[f"sm{x}"], b[f"p{x}"], b[f"lc{x}"]
            self._vec(ops, "column", "sub", acc_s, (0, 0), sm, (0, 0), nL, W, pr, col=(m_new, (0, 0)))
            self._vec(ops, "unary", "exp", sm, (0, 0), pp, (0, 0), nL, W, pr)
            self._vec(ops, "reduce", "sum", pp, (0, 0), lc, (0, 0), nL, W, pr)
            if l_cur is None:
                l_new = lc
            else:
                l_new = b[f"l{x}"]
                self._bin(ops, "mul", l_cur, b[f"al{x}"], l_new, nL, 1, pr)
                self._bin(ops, "add", l_new, lc, l_new, nL, 1, pr)
            # P^T (T score columns per transpose), then P V per problem and window
            pT, acc_pT, acc_o = b[f"pT{x}"], b[f"acc_pT{x}"], b[f"acc_o{x}"]
            for blk in range(-(-W // T)):
                w = min(T, W - blk * T)
                self._mm(ops, pp, (0, blk * T), self.ident, (0, 0), acc_pT, (0, blk * nL), w, nL, nL, False, pr)
                self._vec(ops, "unary", "copy", acc_pT, (0, blk * nL), pT, (0, blk * nL), w, nL, pr)
            for i in range(n):
                v = b[f"v{x}"][i]
                first = True
                for t in range(f):
                    rr = 0
                    while rr < rc:
                        blk, row = divmod(t * rc + rr, T)
                        run = min(rc - rr, T - row)
                        self._mm(ops, pT, (row, blk * nL + i * L), v, (rr, t * p.Dv), acc_o, (i * L, 0), L, run,
                                 p.Dv, not first, pr)
                        first = False
                        rr += run
            if o_cur is None:
                o_new = acc_o
            else:
                o_new = b[f"orun{x}"]
                self._vec(ops, "column", "mul", o_cur, (0, 0), o_new, (0, 0), nL, p.Dv, pr, col=(b[f"al{x}"], (0, 0)))
                self._bin(ops, "add", o_new, acc_o, o_new, nL, p.Dv, pr)
            m_cur, l_cur, o_cur = m_new, l_new, o_new
        assert o_cur is not None and l_cur is not None
        self._vec(ops, "column", "div", o_cur, (0, 0), b["o"], (0, 0), nL, p.Dv, pr, col=(l_cur, (0, 0)))
        self._store(ops, b["o"], self.a_out, self._rows(g, nL), nL, p.Dv, pr)
