"""The attention kernel's emitter: buffers, prologue, bodies of heads, and their programs.

`AttentionKernel` writes one kernel of a plan (`plan.AttentionPlan`): the constants and
buffers, a loop of bodies over the heads, and in each body every head's program as
`SchedOp`s (`_prep_kv`, `_q_block`, `_q_tile`), which `scheduler.schedule` orders before
they are emitted. A dry run (only the argument types) emits nothing and returns the
schedule's estimate, which is how `entry.search_tilings` compares plans::

    %o = graph.sdpa %q, %k, %v ... : tensor<1x2x16x8xbf16> ...
      -> func.func @k0_attention(%q, %k, %v, %out, %ident: memref<16x16xbf16>, ...) {
           tile.load %ident ... into %ident_s         tile.scalar "max" %ident_s, 1.0 into %ones
           tile.load %k[..] into %k_s                 tile.matmul %k_s, %ident_s into %acc_kT
           tile.scalar "mul" %acc_kT, 0.35 into %kT   tile.load %q[..] into %qT (a DMA transpose)
           tile.matmul %qT, %kT into %acc_s           tile.reduce "max" %acc_s into %m
           tile.matmul %kT_aug, %qT_aug into %acc_sT  tile.unary "exp" %acc_sT into %pT
           tile.matmul %pT, %v_aug into %acc_o        tile.binary "mul" %acc_o, %rsum into %out_s
           tile.store %out_s into %out[..] ...
         }

The machine: the matrix engine computes ``acc[M x N] (+)= lhsT[K x M]^T @ rhs[K x N]``
(K on partitions for both operands) and costs about one preload (array rows, 128 cycles
on ``cloud``) per matmul whatever K and N are; the vector engine works lane-aligned,
reduces along the free dimension only, and pays ~76 cycles per instruction on
``cloud``. Tiles are ``T = min(partitions, array rows, array cols, accumulator
partitions)`` queries or keys.

The instructions of each head are `program.HeadProgram`'s; this file holds the kernel
around them: its arguments, constants and buffers, the prologue, the loops over the batch
and the bodies of heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import Float32Type, f32
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size, masked_value
from tilecc.passes.graph_to_tile.attention.plan import N2, NQ, SCHEDULE_TRIES, AttentionPlan, body_budget
from tilecc.passes.graph_to_tile.attention.program import HeadProgram
from tilecc.passes.graph_to_tile.attention.scheduler import AttentionTiming, SchedOp, ScheduleInit, schedule
from tilecc.passes.graph_to_tile.attention.vocabulary import BatchIndex, Ring
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import dense_attr, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext
    from tilecc.simulator.isa import DType

AttentionTensors = tuple[SSAValue, SSAValue, SSAValue, SSAValue | None, SSAValue]  # q, k, v, mask, out


def grouped_view(lw: LoweringContext, v: SSAValue, g: int) -> SSAValue:
    """The view ``[..., H / g, N, g * W]`` of ``[..., H, N, W]`` whose heads lie side by
    side (`heads_adjacent`): element (.., i, r, j W + c) is head g i + j's (r, c)."""
    if g == 1:
        return v
    s = shape_of(v.type)
    strides, offset = lw.layout(v)
    return lw.strided(v, (*s[:-3], s[-3] // g, s[-2], g * s[-1]),
                      (*strides[:-3], g * strides[-3], strides[-2], 1), offset)


def paired_view(lw: LoweringContext, v: SSAValue, f: int) -> SSAValue:
    """The view ``[..., N / f, f * width]`` of ``[..., N, width]``."""
    if f == 1:
        return v
    s = shape_of(v.type)
    return lw.view(v, (*s[:-2], s[-2] // f, f * s[-1]))


class AttentionKernel(HeadProgram):
    """One attention kernel of a plan (its q-blocks `qblocks`): buffers, prologue, the
    loop of bodies over the heads, and each body's program, list-scheduled."""

    stores_any_queue = True

    def __init__(self, lw: LoweringContext, p: AttentionPlan, elem: Attribute, scale: float, dt: DType, loc: str,
                 tensors: AttentionTensors | None = None, types: Sequence[Attribute] | None = None,
                 qblocks: range | None = None) -> None:
        """With `tensors` (q, k, v, mask or None, out in HBM) build and launch the kernel;
        with only the argument `types`, a dry run: `build` returns the estimated cycles
        of its schedule and nothing is emitted."""
        self.lw, self.p, self.elem, self.scale, self.loc = lw, p, elem, scale, loc
        self.cfg = lw.cfg
        self.isz = element_size(elem)
        self.fp32 = isinstance(elem, Float32Type)
        self.tm = AttentionTiming(self.cfg)
        self.dry = tensors is None
        fq, fk = p.qseq.f, p.kseq.f
        self.lowest = masked_value(dt)  # the dtype's most negative finite value
        self.qblocks = range(p.qseq.blocks) if qblocks is None else qblocks
        qtiles = [bq * fq + tq for bq in self.qblocks for tq in range(fq)]
        self.kblocks = sorted({k // fk for qi in qtiles for k, _ in p.pairs[qi]})
        self.U = self._heads_per_body(qtiles)
        self.hbm_args: list[SSAValue] | None = None
        if tensors is not None:
            self.hbm_args = self._arguments(tensors)
            types = [a.type for a in self.hbm_args]
        assert types is not None, "AttentionKernel: give the tensors or their types"
        self.kb = KernelBuilder(lw.kernel_name("attention"), types, loc)
        args = list(self.kb.args)
        self.a_q, self.a_k, self.a_v = args[:3]
        self.a_mask = args[3] if p.has_mask else None
        rest = args[4:] if p.has_mask else args[3:]
        self.a_out, self.a_ident = rest[0], rest[1]
        self.a_masks = rest[2] if p.masks else None
        self.names: dict[SSAValue, str] = {}
        # every buffer DMA loads write has one queue (a buffer loaded from several queues
        # would need a semaphore wait per queue): the constants round robin, the others
        # the queue the schedule of their first load picks
        self.queues = self.cfg.dma.queues
        self.qmap: dict[str, int] = {}
        self._win: dict[tuple[int, SSAValue, int, int, tuple[int, ...]], SSAValue] = {}
        self._true: SSAValue | None = None
        self._false: SSAValue | None = None
        # the body being written: the head's place in its group, the group's buffer set,
        # whether this is the body's last q-block / q-tile (see `body`)
        self._j = self._gs = 0
        self._last_block = self._last_tile = False
        self.estimate = 0.0
        self.init: ScheduleInit = ScheduleInit()
        self._pending = []
        self._negm_at = {}
        self._pending_reads = set()
        self._norm = []
        self._lslot = 0
        self._kset = self._krow = 0
        # packed K^T needs the body's heads in pairs with K / V of their own
        self.kpack = p.kpack and self.U % 2 == 0 and not self._kv_shared()


    def _heads_per_body(self, qtiles: list[int]) -> int:
        """The largest divisor of the head count whose pairs fit a body (an even one when
        it is not much smaller: the K^T / V sets alternate by head), in whole head groups."""
        p = self.p
        heads = p.batch[-1] if p.batch else 1
        per_head = max(1, sum(len(p.pairs[qi]) for qi in qtiles))
        hg = p.heads
        budget = body_budget(self.cfg)
        fits = [d for d in range(hg, heads + 1, hg) if heads % d == 0 and d * per_head <= budget] or [hg]
        even = [d for d in fits if d % 2 == 0]
        return max(even) if even and max(even) * 2 >= max(fits) else max(fits)

    def _arguments(self, tensors: AttentionTensors) -> list[SSAValue]:
        """The kernel's HBM arguments: q, k, v (paired / head-grouped views), the mask,
        the output, the identity and the causal mask patterns (constants)."""
        lw, p, elem, T = self.lw, self.p, self.elem, self.p.T
        fq, fk = p.qseq.f, p.kseq.f
        q, k, v, mask, out = tensors
        gq, gk, gv, go = p.grp
        hbm = [grouped_view(lw, paired_view(lw, q, fq), gq), grouped_view(lw, paired_view(lw, k, fk), gk),
               grouped_view(lw, paired_view(lw, v, fk) if p.v_paired else v, gv)]
        if mask is not None:
            hbm.append(mask)
        hbm.append(grouped_view(lw, paired_view(lw, out, fq), go))
        hbm.append(lw.hbm([T, T], elem, value=dense_attr(np.eye(T, dtype=np.float32), elem, (T, T))))
        if p.masks:
            # finite: the constant's printed form reads back
            pats = np.concatenate([np.where(m, 0.0, self.lowest) for m in p.masks], axis=1).astype(np.float32)
            hbm.append(lw.hbm([T, T * len(p.masks)], elem, value=dense_attr(pats, elem, pats.shape)))
        return hbm

    # -- buffers -----------------------------------------------------------------------
    def alloc(self, shape: Sequence[int], space: str, name: str, elem: Attribute | None = None) -> SSAValue:
        """An on-chip buffer (of the model dtype unless `elem`), known to the scheduler by name."""
        v = self.kb.alloc(list(shape), self.elem if elem is None else elem, space, name)
        owner = v.owner
        if not isinstance(owner, tile.AllocOp):
            raise CompileError(f"attention kernel: buffer {name} is not a tile.alloc")
        self.names[v] = owner.buffer.data
        return v


    def dma_target(self, v: SSAValue) -> SSAValue:
        """`v`, whose loads (a constant's) take the next DMA queue, round robin."""
        self.qmap[self.name(v)] = len(self.qmap) % self.queues
        return v

    # -- the kernel ----------------------------------------------------------------------
    def build(self) -> float:
        """Emit the kernel (unless a dry run); the estimated cycles of its schedule."""
        p, kb = self.p, self.kb
        vec = self._constants()
        self._alloc_buffers()
        vec = self._ones_folds(vec)
        self.init.vec = vec
        self._win.clear()
        # loops: outer batch dims, then the last batch dim in bodies of U heads
        self.estimate = 0.0
        if not p.batch:
            self.body([[]])
        else:
            self._outer(list(p.batch[:-1]), [])
        if self.hbm_args is None:
            return self.estimate
        self.lw.launch(kb, self.hbm_args)
        return self.estimate

    def _constants(self) -> float:
        """The constants (one DMA each, on their own queues) and the ones tile; `init`
        models this prologue for the schedule of the first body. When the vector engine
        is free after it."""
        p, kb, T, SRAM = self.p, self.kb, self.p.T, tile.SRAM
        c = kb.const
        self.init = ScheduleInit(qfree=[0.0] * self.queues, ready={}, qmap=self.qmap, pre=[])
        self.ident = self.alloc([T, T], SRAM, "ident")
        self._const_load(self.a_ident, self.ident, T)
        self.masks: SSAValue | None = None
        if p.masks:
            assert self.a_masks is not None
            self.masks = self.alloc([T, T * len(p.masks)], SRAM, "causal")
            self._const_load(self.a_masks, self.masks, T * len(p.masks))
        self.ones = self.alloc([T, T], SRAM, "ones")  # max(I, 1) on the vector engine
        kb.add(tile.ScalarOp("max", self.ident, 1.0, self.ones, c(T), c(T)))
        ready = self.init.ready
        vec = ready["ident"] + self.tm.vec("binary", "max", T, T)
        ready["ones"] = vec
        self._pre_copy(self.ident, self.ones, T, T)
        return vec

    def _const_load(self, arg: SSAValue, buf: SSAValue, cols: int) -> None:
        """A constant's load in the prologue, on the next queue round robin."""
        c, T = self.kb.const, self.p.T
        qfree, ready = self.init.qfree, self.init.ready
        assert qfree is not None
        q = self.qmap[self.name(self.dma_target(buf))]
        self.kb.add(tile.LoadOp(arg, [c(0), c(0)], buf, c(T), c(cols), 0, 1, queue=q))
        fixed, transfer = self.tm.dma(T, cols, self.isz)
        qfree[q] += fixed + transfer
        ready[self.name(buf)] = qfree[q]
        share, engines = self.tm.dma_sharing(T, cols, self.isz)
        self.init.pre.append((SchedOp("load", lambda _q: None, (), (self.name(buf),), (), fixed, transfer, q,
                                      share=share, engines=engines), q))

    def _pre_copy(self, src: SSAValue, dst: SSAValue, rows: int, cols: int) -> None:
        """A vector copy of the prologue, for the replay of the first body."""
        self.init.pre.append((SchedOp("vec", lambda _q: None, (self.name(src),), (self.name(dst),), (),
                                         self.tm.vec("unary", "copy", rows, cols)), None))

    def _alloc_buffers(self) -> None:
        """The kernel's SRAM and accumulator buffers (their order fixes their names)."""
        p, T = self.p, self.p.T
        fq, fk, nd = p.qseq.f, p.kseq.f, len(p.chunks)
        nkb, nkt = p.kseq.blocks, len(p.kseq.tiles())
        ACC, SRAM = tile.ACC, tile.SRAM
        gq, gk, gv, go = p.grp
        nqb = len(self.qblocks)
        # a head group's loads (q, k, v) and output blocks: one buffer per block and group
        # set (the sets alternate by group within a body)
        self.gsets = gsets = max(1, min(p.gsets, self.U // p.heads))
        self.kgrp = ([[self.alloc([T, gk * p.D], SRAM, "k") for _ in range(nkb)] for _ in range(gsets)]
                     if gk > 1 else None)
        self.vgrp = ([[self.alloc([T, gv * p.Dv], SRAM, "v") for _ in range(nkb)] for _ in range(gsets)]
                     if gv > 1 else None)
        self.qgrp = ([[self.alloc([T, gq * p.D], SRAM, "q") for _ in range(nqb)] for _ in range(gsets)]
                     if gq > 1 and not p.qdma else None)
        self.ogrp = ([[self.alloc([T, go * p.Dv], SRAM, "out") for _ in range(nqb)] for _ in range(gsets)]
                     if go > 1 else None)
        self.nk_ring = 0 if gk > 1 else min(nkb, 2 * self.queues)
        self.knat = [self.alloc([T, fk * p.D], SRAM, "k") for _ in range(self.nk_ring)]
        self.kt = [[self.alloc([T, nd * p.kc * fk * T], SRAM, "kT") for _ in range(-(-nkb // p.kc))]
                   for _ in range(p.sets)]
        if gv > 1:
            self.vaug = None
        elif p.v_paired:
            self.vaug = [[self.alloc([T, fk * p.Dv], SRAM, "v") for _ in range(nkb)]
                         for _ in range(p.sets)]
        else:
            width = p.Dv + (1 if p.rowsum_fused else 0)
            self.vaug = [[self.alloc([T, width], SRAM, "v") for _ in range(nkt)]
                         for _ in range(p.sets)]
        self.nq_ring = 0 if gq > 1 or p.qdma else min(p.qseq.blocks, self.queues)
        self.qnat = [self.alloc([T, fq * p.D], SRAM, "q") for _ in range(self.nq_ring)]
        self.qt = [self.alloc([T, nd * T], SRAM, "qT") for _ in range(p.nq)]
        self.negm = ([self.alloc([p.neg_batch, T], SRAM, "negm") for _ in range(2 if p.neg_batch > 1 else p.nq)]
                     if p.fold_row is None else None)
        nch = -(-nkt // p.W1)
        self.mpart = [self.alloc([T, nch], SRAM, "mpart", f32) for _ in range(p.nq)]
        self.mcol = [self.alloc([T, 1], SRAM, "m") for _ in range(p.nq)]
        self.mrow = ([self.alloc([T, p.S], SRAM, "mask") for _ in range(NQ)]
                     if p.has_mask else None)
        self.pt = [self.alloc([T, p.G * T], SRAM, "pT") for _ in range(N2)]
        self.obuf = [] if go > 1 else [self.alloc([T, fq * p.Dv], SRAM, "out") for _ in range(2)]
        self.sm = [self.alloc([T, p.W1 * T], SRAM, "s_m") for _ in range(p.na1)] if p.tmode else []
        self.acc_tr = [self.alloc([T, nd * p.kc * fk * T], ACC, "acc_kT", f32) for _ in range(p.ntr)]
        self.acc_q = [] if p.qdma else [self.alloc([T, nd * T], ACC, "acc_qT", f32) for _ in range(2)]
        self.acc1 = [self.alloc([T, p.W1 * T], ACC, "acc_s", f32) for _ in range(p.na1)]
        self.acc_m = [self.alloc([T, T], ACC, "acc_m", f32) for _ in range(2 if p.neg_batch > 1 else 1)]
        self.acc2 = [self.alloc([T, p.G * T], ACC, "acc_sT", f32) for _ in range(p.n2)]
        self.acco = [self.alloc([T, p.Dv + 1], ACC, "acc_o", f32) for _ in range(p.no)]
        self.acc_l = [self.alloc([T, p.rbatch], ACC, "acc_l", f32) for _ in range(2)] if p.rbatch > 1 else []

    def _ones_folds(self, vec: float) -> float:
        """Ones: the fold row of every K^T buffer, the ones column of every V_aug tile
        (vector copies from the ones tile, once; the loads never touch them). When the
        vector engine is free after them (`vec`: before)."""
        p, kb, T = self.p, self.kb, self.p.T
        fk, nd = p.kseq.f, len(p.chunks)
        c = kb.const
        ready = self.init.ready
        if p.fold_row is not None:
            r, w = p.fold_row, p.kc * fk * T
            for s in range(p.sets):
                for buf in self.kt[s]:
                    for c0 in range(0, w, T):
                        kb.add(tile.UnaryOp("copy", self.win(self.ones, r, 0, [1, T]),
                                            self.win(buf, r, (nd - 1) * w + c0, [1, T]), c(1), c(T)))
                        vec += self.tm.vec("unary", "copy", 1, T)
                        self._pre_copy(self.ones, buf, 1, T)
                    ready[self.name(buf)] = vec
        if p.rowsum_fused:  # (V per head: never grouped)
            assert self.vaug is not None
            for s in range(p.sets):
                for buf in self.vaug[s]:
                    kb.add(tile.UnaryOp("copy", self.win(self.ones, 0, 0, [T, 1]), self.win(buf, 0, p.Dv, [T, 1]),
                                        c(T), c(1)))
                    vec += self.tm.vec("unary", "copy", T, 1)
                    self._pre_copy(self.ones, buf, T, 1)
                    ready[self.name(buf)] = vec
        return vec

    def _outer(self, extents: list[int], ivs: list[SSAValue]) -> None:
        """Loops over the outer batch dims, then bodies of U heads over the last one.
        Where K and V broadcast over those heads (grouped-query attention: the query
        heads of one KV head) and a body holds only some of them, the first body prepares
        K^T / V_aug for all and a loop of the others reads them (`body`'s `prep`)."""
        kb, p = self.kb, self.p
        H, U = p.batch[-1], self.U
        trips = H // U  # U divides H
        peel = self._kv_shared() and trips > 1
        if self.dry:  # the schedule of the body, times its repetitions
            outer = int(np.prod(extents)) if extents else 1
            heads: list[BatchIndex] = [[None] * len(p.batch) for _ in range(U)]
            first = self.body(heads)
            rest = self.body(heads, prep=False) if peel else first
            self.estimate = (first + rest * (trips - 1)) * outer
            return
        if extents:
            with kb.loop(extents[0]) as i:
                self._outer(extents[1:], [*ivs, i])
            return
        hg = p.heads  # grouped tensors: head group it * U / hg + u // hg
        total = 0.0
        if peel:
            zero = kb.const(0)
            total = self.body([[*ivs, (zero, u, zero if hg > 1 else None)] for u in range(U)])
        with kb.loop(trips - 1 if peel else trips) as it:
            body = kb.addi(it, kb.const(1)) if peel else it  # the index of the body
            base = kb.muli(body, kb.const(U)) if trips > 1 else kb.const(0)
            gbase = (kb.muli(body, kb.const(U // hg)) if trips > 1 else kb.const(0)) if hg > 1 else None
            span = self.body([[*ivs, (base, u, gbase)] for u in range(U)], prep=not peel)
        total += span * (trips - 1 if peel else trips)
        self.estimate = total * int(np.prod(p.batch[:-1], dtype=np.int64))

    def _kv_shared(self) -> bool:
        """K and V do not depend on the last batch index (broadcast over heads; a
        head-grouped view's unit head dim is a group of heads)."""
        if self.p.grp[1] > 1 or self.p.grp[2] > 1:
            return False
        for a in (self.a_k, self.a_v):
            sh = shape_of(a.type)
            nbo = len(sh) - 2
            if self.p.batch and nbo >= 1 and sh[nbo - 1] != 1:  # aligned with the last batch dim
                return False
        return True

    # -- one scheduled body: the heads `heads` (batch index values) --------------------------
    def body(self, heads: list[BatchIndex], prep: bool = True) -> float:
        """One body: the program of each head, list-scheduled and (unless a dry run)
        emitted in the scheduled order; its estimated cycles. `prep` False: K^T / V_aug
        (shared by all heads: `_kv_shared`) are already in their first set, written by
        an earlier body."""
        p = self.p
        ops: list[SchedOp] = []
        ring: Ring = {"k": 0, "q": 0, "qt": 0, "s1": 0, "s2": 0, "pt": 0, "tr": 0, "sm": 0, "o": 0, "negm": 0}
        shared = self._kv_shared() and len(heads) > 1
        for u, bidx in enumerate(heads):
            s = 0 if shared else u % p.sets
            # the head's place in its group (grouped loads: the group's first head loads
            # for all, the last stores the group's output) and the group's buffer set
            self._j, self._gs = u % p.heads, (u // p.heads) % self.gsets
            # its K^T buffer set and rows: a pair's shared buffer where K^T is packed
            self._kset, self._krow = ((u // 2) % p.sets, (u % 2) * p.D) if self.kpack else (s, 0)
            if prep and (not shared or u == 0):
                self._prep_kv(ops, u, bidx, s, ring, heads[u + 1] if self.kpack and u % 2 == 0 else None)
            qidx = self._index(bidx, self.a_q, p.grp[0])
            # the q-blocks with the most key tiles first: a body's last q-tiles, whose pass
            # 2 nothing overlaps (the matrix engine's share of a q-tile grows with its key
            # tiles), are then its lightest
            order = list(self.qblocks)[::-1] if p.causal else list(self.qblocks)
            for bq in order:
                self._last_block = u == len(heads) - 1 and bq == order[-1]
                self._q_block(ops, u, bidx, s, bq, qidx, ring)
            self._flush(ops, ring)
        self._norm_flush(ops)
        # a dry run compares tilings: the unperturbed priorities suffice for that
        order, span = schedule(ops, self.tm, self.queues, self.init, 0 if self.dry else SCHEDULE_TRIES)
        for o, q in order:
            if o.kind == "load" and q is not None:
                self.qmap.setdefault(o.writes[0], q)
        self.init = ScheduleInit(qmap=self.qmap)  # later bodies follow a loop or another body
        if not p.batch:
            self.estimate = span
        if self.dry:
            return span
        for o, q in order:
            o.emit(q)
        self._win.clear()
        return span
