"""The program of one head in an attention kernel body: K / V preparation and q-tiles.

`HeadProgram` writes a head's instructions as `SchedOp`s in program order (the list
scheduler reorders them): the K blocks' transposes into K^T and the V loads
(`_prep_kv`), then per q-block (the heaviest first under a causal mask) its load and
per q-tile the two passes (`_q_tile`)::

    for each q-tile:  Q^T (DMA transpose) | [mask rows] | pass 1: mm S, max -> m
                      | [transposed mode: sub m] | -m row | pass 2: mm S^T - m, exp -> P^T,
                      mm P^T V_aug -> O_aug | O = O_aug[:, :Dv] / O_aug[:, Dv]
                      -> tile.matmul / tile.unary "exp" / tile.binary "div" ... "column"

Layout (*transposed scores*), per (batch, head):

- K load blocks in their natural layout (``[keys x D]``) and are transposed on the
  matrix engine (a matmul with an identity), the accumulator copy multiplying by
  `scale` (fp32, one rounding), into resident ``K^T`` buffers (D on
  partitions, one buffer per load block so later blocks do not hold up earlier
  q-tiles); V loads naturally into resident ``V_aug`` buffers. K^T / V_aug are
  double-buffered across heads (and loaded once per body when k and v broadcast over
  heads). *Packed K^T* (2 D <= T: `plan.kpack_ok`): heads 2i and 2i + 1 share one K^T
  buffer, rows 0..D-1 and D..2D-1 (their Q^T loads at the same rows), so one copy on all
  the lanes moves both heads' transposes (a vector op costs its columns, whatever its
  rows); the even head prepares both K blocks. Where the accumulator holds them, the
  transposes of several K blocks (`plan.AttentionPlan.kc`) share one accumulator and
  one K^T buffer: one copy per D chunk for all of them.
- Per q-tile: ``Q^T`` loads by DMA transposes (`DmaPattern.TRANSPOSE`, a 2-byte dtype:
  no matmul, no vector pass). An fp32 Q loads naturally, is transposed like K and its
  copy takes the scale instead (the K^T copy is then a plain copy).
- Pass 1 (queries on partitions): ``S = Q K^T`` for up to 4 key tiles side by side in
  the accumulator (one matmul per key tile and D chunk), one vector max-reduce per such
  chunk, the partial maxes reduced to the row max ``m`` (a column).
- Pass 2 (keys on partitions), *normal mode*: ``m`` is transposed into a row (a matmul
  with M = 1 against the identity, landing at the accumulator partition of the fold
  row) and copied, negated, into row D of ``Q^T`` (``Q^T_aug``) or, when D is a multiple
  of T (or the search prefers it), a separate ``-m`` row: then the maxes of up to 4
  q-tiles land on rows of one accumulator and one copy writes them all (a copy of n
  rows costs one row's: one lane per partition), pass 2 of those q-tiles waiting for
  it (`_defer`, `_flush`). ``S^T - m = K^T_aug^T @ Q^T_aug``: the ones row of
  ``K^T_aug`` times the ``-m`` row folds the max subtraction into the matmul (when D is a
  multiple of T the fold is one more matmul, K = 1). *Transposed mode* instead keeps
  pass 1's ``S`` in the accumulator, subtracts ``m`` on the vector engine (a column
  operand, into SRAM in the model dtype) and transposes that on the matrix engine: one
  matmul (and one mask matmul) fewer per key tile, one vector element-op per score
  more. Each q-tile picks how many of its last pass-1 chunks run in transposed mode
  from a cost model of both engines (bf16 / fp32; fp16 with masks would overflow
  ``S - m`` of masked scores to -inf).
- Either way up to 4 key tiles of ``S^T - m`` sit side by side in the accumulator and
  one vector ``exp`` writes ``P^T`` to SRAM in the model dtype: already the lhsT of
  ``O_aug[q x Dv+1] += P^T^T @ V_aug``, accumulated over the key tiles. Column Dv of
  ``O_aug`` is the softmax denominator: a ones column of ``V_aug`` where Dv + 1 fits the
  array columns, else one more matmul per key tile (N = 1).
- ``O = O_aug[:, :Dv] / O_aug[:, Dv]`` (a column divide, or reciprocal and multiply),
  and a store. Where the row sum is a matmul of its own it may instead accumulate
  into a column of a batch accumulator (`plan.AttentionPlan.rbatch` q-tiles side by
  side): one reciprocal inverts the batch's row sums, each output is a column
  multiply; the outputs wait for it (a batch ends early at a store of their block).

Per 128 x 128 key tile on ``cloud`` at D = 128 that is 5 matmuls (pass 1, pass 2,
fold, PV, row sum) and 2 vector element-ops per score (max, exp) in normal mode, 4
matmuls and 3 element-ops in transposed mode; the flash-attention-2 layout (S with
queries on partitions, P transposed on the matrix engine, online rescale) needs 3-4
matmuls but more element-ops per score (max, subtract, exp, sum, copy of the transposed
P: this ISA has no exp with a bias column or a fused row sum), and the vector engine is
the scarce one. A matmul costs about one preload (128 cycles) whatever its K and N, so
the fold (K = 1), the row sum (N = 1) and K = 64 contractions cost a full tile each,
and packing two 64-wide heads into one contraction (block-diagonal) would not save a
matmul; but a 128-column vector op over 128 key rows costs what one over 4 rows does
(~320 + ~190 cycles), against 128 per matmul: the vector engine sets the pace
(`causal attention s2048 d128`: busy from the first max to the last exp, matrix idle).

Masks: `is_causal` (torch's top-left aligned ``tril(ones(L, S))``) skips key tiles
above the diagonal entirely; a tile the diagonal crosses adds a constant pattern
(``0`` / the dtype's most negative finite value) through one more matmul in each pass
(``acc += I^T @ Mask`` in pass 1, ``acc += Mask^T @ I`` in pass 2, so both read the
pattern in its natural q-major layout; transposed mode needs only the first). The
patterns come from the tiles' row indices (`plan.causal_pairs`), deduplicated. An
additive `mask` (any broadcast over batch, heads, rows or columns; bool masks arrive
additive) loads one
``[T x S]`` row block per q-tile, clamped to the dtype's lowest finite value (a float
mask may hold -inf, and the identity's zeros times -inf are NaN; a vector max, one
element-op per score; a row masking every key then averages V where torch gives NaN;
none where the mask is known finite: `plan.mask_finite`), and is added the same way
on every key tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.ir import SSAValue

from tilecc.passes.graph_to_tile.attention.plan import MAX_HELD
from tilecc.passes.graph_to_tile.attention.scheduler import SchedOp
from tilecc.passes.graph_to_tile.attention.vocabulary import (
    BatchIndex,
    Buffers,
    HeadVocabulary,
    IndexFn,
    KeyTile,
    Pos,
    Prio,
    Ring,
)
from tilecc.passes.graph_to_tile.shapes import shape_of
from tilecc.simulator.timing import DmaPattern


@dataclass
class Pass2:
    """One q-tile's pass 2 and output (`HeadProgram._pass2`): its key tiles in normal and
    transposed mode (`held`: pass-1 accumulators, `tmode`: key tile -> S - m buffer and
    column), rows, q-tile ring slot, mask rows, O_aug and output window; `first`, `lsum`
    (where its row sum accumulates) and `left` (key tiles still to multiply by V) follow
    its PV matmuls as they are written."""

    pr: Prio
    s: int
    held: list[tuple[list[KeyTile], SSAValue]]
    normal: list[KeyTile]
    tmode: dict[int, tuple[SSAValue, int]]
    qs: int
    r: int
    mrow: SSAValue | None
    acco: SSAValue
    ob: SSAValue
    col: int
    npr: Prio
    first: bool = True
    lsum: tuple[SSAValue, Pos] | None = None
    left: int = 0


class HeadProgram(HeadVocabulary):
    """A head's program in the body's instruction vocabulary (vocabulary.py).
    `kernel.AttentionKernel` provides the state declared here (the buffers)."""

    scale: float
    lowest: float  # the dtype's most negative finite value
    qblocks: range
    kblocks: list[int]
    # the body being written: the head's place in its group, the group's buffer set,
    # its K^T set and first K^T / Q^T row (packed K^T: D for a pair's odd head), whether
    # this is the body's last q-block / q-tile
    _j: int
    _gs: int
    _kset: int
    _krow: int
    kpack: bool  # the plan's packed K^T, where the body's heads pair up
    _last_block: bool
    _last_tile: bool
    # kernel arguments
    a_q: SSAValue
    a_k: SSAValue
    a_v: SSAValue
    a_mask: SSAValue | None
    a_out: SSAValue
    # buffers (`AttentionKernel._constants`, `_alloc_buffers`)
    ident: SSAValue
    masks: SSAValue | None
    ones: SSAValue
    gsets: int
    kgrp: list[Buffers] | None
    vgrp: list[Buffers] | None
    qgrp: list[Buffers] | None
    ogrp: list[Buffers] | None
    nk_ring: int
    knat: Buffers
    kt: list[Buffers]
    vaug: list[Buffers] | None
    nq_ring: int
    qnat: Buffers
    qt: Buffers
    negm: Buffers | None
    mpart: Buffers
    mcol: Buffers
    mrow: Buffers | None
    pt: Buffers
    obuf: Buffers
    sm: Buffers
    acc_tr: Buffers
    acc_q: Buffers
    acc1: Buffers
    acc_m: Buffers
    # q-tiles whose second half waits for the batched -m rows (`_defer`): (rows, q-tile
    # ring slot or None without a -m row, prio, the rest of its program; or a store)
    # (and the pass 2 of a q-tile entry: consecutive ones share exp groups, `_pass2`)
    _pending: list[tuple[int, int | None, Prio, Callable[[], None], Pass2 | None]]
    _negm_at: dict[int, tuple[SSAValue, int]]  # q-tile ring slot -> (its -m buffer, row)
    _pending_reads: set[SSAValue]  # ring buffers (mask rows, S - m) the pending q-tiles' pass 2 reads
    acc2: Buffers
    acco: Buffers
    acc_l: Buffers  # the row sums of a reciprocal batch (`plan.AttentionPlan.rbatch`), two sets
    # outputs waiting for their batch's reciprocal (`_normalise`): (O_aug, rows, prio,
    # what to emit once the reciprocal is in)
    _norm: list[tuple[SSAValue, int, Prio, Callable[[], None]]]
    _lslot: int  # the acc_l set of the batch being filled

    # -- a head's program -------------------------------------------------------------
    def _prep_kv(self, ops: list[SchedOp], u: int, bidx: BatchIndex, s: int, ring: Ring,
                 partner: BatchIndex | None = None) -> None:
        """K blocks: load, transpose every tile and chunk, copy into K^T; V blocks / tiles.
        Packed K^T (`plan.AttentionPlan.kpack`): the even head of a pair also loads and
        transposes its `partner`'s K blocks (rows D..2D-1 of the same accumulator) and one
        copy moves both; the odd head then prepares only V."""
        p, T, kc = self.p, self.p.T, self.kb.const
        fk = p.kseq.f
        _, gk, gv, _ = p.grp
        j, gs = self._j, self._gs
        vidx = self._index(bidx, self.a_v, gv)
        vrank = len(shape_of(self.a_v.type))
        kw = p.kc * fk * T  # K^T columns per D chunk
        acc = self.acc_tr[0]
        for bk in self.kblocks:
            rk = p.kseq.rows(bk)
            pr = (u, -1, bk)
            bb = bk % p.kc  # the block's place in its K^T buffer
            if not self.kpack or partner is not None:
                if bb == 0:
                    acc = self.acc_tr[ring["tr"] % p.ntr]
                    ring["tr"] += 1
                # a pair in one K group block (side by side): one transpose of both heads'
                # columns; else the partner's own load and transposes below the head's
                both = partner is not None and gk > 1
                self._k_transposes(ops, bidx, j, gs, bk, acc, 0, ring, pr, 2 if both else 1)
                rows = 1 if partner is None else 2
                if partner is not None and not both:
                    self._k_transposes(ops, partner, 0, 0, bk, acc, p.D, ring, pr)
                last = bb == p.kc - 1 or bk == self.kblocks[-1]
                if last:  # the buffer's blocks are in: its copies
                    kt = self.kt[self._kset][bk // p.kc]
                    b0 = bk - bb
                    for ci, (_d0, dc) in enumerate(p.chunks):
                        if all(p.kseq.rows(x) == T for x in range(b0, bk + 1)):  # tiles side by side: one copy
                            self._k_copy(ops, acc, kt, ci * kw, rows * dc, (bb + 1) * fk * T, pr)
                            continue
                        for x in range(b0, bk + 1):
                            for tk in range(fk):
                                self._k_copy(ops, acc, kt, ci * kw + ((x - b0) * fk + tk) * T, rows * dc,
                                             p.kseq.rows(x), pr)
            if gv > 1:
                if j == 0:
                    assert self.vgrp is not None
                    self._load(ops, self.a_v, lambda bk=bk: [*vidx(), kc(bk * T), kc(0)], self.vgrp[gs][bk],
                               (0, 0), rk, gv * p.Dv, vrank - 2, vrank - 1, pr)
            elif p.v_paired:
                assert self.vaug is not None
                self._load(ops, self.a_v, lambda bk=bk: [*vidx(), kc(bk * T), kc(0)], self.vaug[s][bk], (0, 0),
                           rk, fk * p.Dv, vrank - 2, vrank - 1, pr)
            else:
                assert self.vaug is not None
                for tk in range(fk):
                    row0 = fk * bk * T + tk
                    self._load(ops, self.a_v, lambda row0=row0: [*vidx(), kc(row0), kc(0)],
                               self.vaug[s][bk * fk + tk], (0, 0), rk, p.Dv, vrank - 2, vrank - 1, pr,
                               row_step=fk)

    def _k_transposes(self, ops: list[SchedOp], bidx: BatchIndex, j: int, gs: int, bk: int, acc: SSAValue,
                      row: int, ring: Ring, pr: Prio, heads: int = 1) -> None:
        """Head `bidx`'s K block `bk` (its place `j` in its group, the group's set `gs`):
        its load (a group's block: by the group's first head) and the identity matmuls that
        transpose each tile and chunk into `acc`, from partition `row`; `heads` = 2: heads
        j and j + 1 of a group block at once (packed K^T, one chunk: rows 0..2D-1)."""
        p, T, kc = self.p, self.p.T, self.kb.const
        fk, gk = p.kseq.f, p.grp[1]
        kidx = self._index(bidx, self.a_k, gk)
        krank = len(shape_of(self.a_k.type))
        rk = p.kseq.rows(bk)
        if gk > 1:  # the group's block: head j's columns
            assert self.kgrp is not None
            kn, col0 = self.kgrp[gs][bk], j * p.D
            if j == 0:
                self._load(ops, self.a_k, lambda: [*kidx(), kc(bk * T), kc(0)], kn, (0, 0), rk,
                           gk * p.D, krank - 2, krank - 1, pr)
        else:
            kn, col0 = self.knat[ring["k"] % self.nk_ring], 0
            ring["k"] += 1
            self._load(ops, self.a_k, lambda: [*kidx(), kc(bk * T), kc(0)], kn, (0, 0), rk, fk * p.D,
                       krank - 2, krank - 1, pr)
        kw, bb = p.kc * fk * T, bk % p.kc
        for tk in range(fk):
            for ci, (d0, dc) in enumerate(p.chunks):
                self._mm(ops, kn, (0, col0 + tk * p.D + d0), self.ident, (0, 0), acc,
                         (row, ci * kw + (bb * fk + tk) * T), heads * dc, rk, rk, False, pr)

    def _k_copy(self, ops: list[SchedOp], acc: SSAValue, kt: SSAValue, col: int, rows: int, cols: int,
                pr: Prio) -> None:
        """The K transposes' copy into K^T (times the scale where Q^T loads by DMA: the
        copy is then the only vector pass over either operand)."""
        if self.p.qdma:
            self._vec(ops, "scalar", "mul", acc, (0, col), kt, (0, col), rows, cols, pr, imm=self.scale)
        else:
            self._vec(ops, "unary", "copy", acc, (0, col), kt, (0, col), rows, cols, pr)

    def _kt(self, k: int) -> tuple[SSAValue, int]:
        """(K^T buffer, column of chunk 0) of key tile k of the current head (its rows start
        at `_krow`); chunk ci is `_kw` further."""
        p = self.p
        fk = p.kseq.f
        return self.kt[self._kset][k // (fk * p.kc)], (k % (fk * p.kc)) * p.T

    @property
    def _kw(self) -> int:
        """K^T columns per D chunk: the tiles of `plan.AttentionPlan.kc` K blocks."""
        return self.p.kc * self.p.kseq.f * self.p.T

    def _v(self, s: int, k: int) -> tuple[SSAValue, int]:
        """(V_aug buffer, column of its first value) of key tile k (of the current head)."""
        p = self.p
        if p.grp[2] > 1:
            assert self.vgrp is not None
            return self.vgrp[self._gs][k], self._j * p.Dv
        assert self.vaug is not None
        if p.v_paired:
            return self.vaug[s][k // p.kseq.f], (k % p.kseq.f) * p.Dv
        return self.vaug[s][k], 0

    def _transposed_chunks(self, chunks1: list[list[KeyTile]], qs: int, last: bool = False) -> int:
        """How many of the q-tile's last pass-1 chunks run in transposed mode (at most
        MAX_HELD and na1 - 1: one accumulator stays free for the next q-tile's pass 1):
        the count that best balances the q-tile's matrix and vector cycles.

        Per key tile, normal mode: pass 1, pass 2 (+ the fold matmul when D is a multiple
        of T), 2 mask matmuls if masked, PV (+ row sum); max-reduce and exp on the vector
        engine. Transposed mode: pass 1, one transpose, 1 mask matmul, PV; plus the
        subtract. Normal mode also needs the -m row (one matmul, one copy)."""
        p, tm, cfg = self.p, self.tm, self.cfg
        if not p.tmode:
            return 0
        costs = cfg.vector.op_cost
        nd, pv = len(p.chunks), len(p.vchunks) + (0 if p.rowsum_fused else 1)
        mmc = max(tm.preload, tm.matmul_streaming(tm.mm(p.T, p.T, p.T, self.fp32)))
        over = tm.vector_overhead
        fold = 0 if p.fold_row is not None else 1

        def cost(n_t: int) -> tuple[float, float]:
            mm = vec = 0.0
            tiles = [km for ch in chunks1 for km in ch]
            t_set = {km[0] for ch in chunks1[len(chunks1) - n_t:] for km in ch} if n_t else set()
            for k, mid in tiles:
                ks = p.ks(k)
                masked = (mid is not None) + p.has_mask
                # max over S [qs x ks], exp over S^T [ks x qs] (the lane rule: partitions first)
                vec += (tm.vector_work(qs, ks, costs.reduce["max"]) + tm.vector_work(ks, qs, costs.unary["exp"])
                        + over / p.G + over / p.W1)
                if k in t_set:
                    mm += mmc * (nd + 1 + pv + masked)
                    vec += tm.vector_work(qs, ks, costs.binary["sub"]) + over / p.W1
                else:
                    mm += mmc * (2 * nd + fold + pv + 2 * masked)
            if len(t_set) < len(tiles):
                mm += mmc
                vec += over
            return mm, vec

        best = (math.inf, 0)
        # the body's last q-tile has no successor to keep an accumulator free for
        limit = p.na1 if last else min(MAX_HELD, p.na1 - 1)
        for n_t in range(min(len(chunks1), limit) + 1):
            mm, vec = cost(n_t)
            best = min(best, (max(mm, vec) + 1e-3 * n_t, n_t))
        return best[1]

    def _groups(self, keys: list[KeyTile]) -> list[list[KeyTile]]:
        """Consecutive key tiles of equal size, at most G per group (one exp each)."""
        groups: list[list[KeyTile]] = []
        for km in keys:
            if groups and len(groups[-1]) < self.p.G and self.p.ks(groups[-1][-1][0]) == self.p.ks(km[0]):
                groups[-1].append(km)
            else:
                groups.append([km])
        return groups

    def _q_block(self, ops: list[SchedOp], u: int, bidx: BatchIndex, s: int, bq: int, qidx: IndexFn,
                 ring: Ring) -> None:
        """A q-block's load, its q-tiles, and the store of its output block."""
        p, T, kc = self.p, self.p.T, self.kb.const
        fq = p.qseq.f
        rq = p.qseq.rows(bq)
        gq, _, _, go = p.grp
        j, gs, bi = self._j, self._gs, bq - self.qblocks.start
        qrank = len(shape_of(self.a_q.type))
        if p.qdma:  # each q-tile's Q^T loads by DMA transposes (`_q_load_transposed`)
            qn, qcol = self.a_q, j * p.D if gq > 1 else 0
        elif gq > 1:  # the group's block: head j's columns
            assert self.qgrp is not None
            qn, qcol = self.qgrp[gs][bi], j * p.D
            if j == 0:
                self._load(ops, self.a_q, lambda: [*qidx(), kc(bq * T), kc(0)], qn, (0, 0), rq, gq * p.D,
                           qrank - 2, qrank - 1, (u, bq * fq, 0))
        else:
            qn, qcol = self.qnat[ring["q"] % self.nq_ring], 0
            self._load(ops, self.a_q, lambda: [*qidx(), kc(bq * T), kc(0)], qn, (0, 0), rq, fq * p.D,
                       qrank - 2, qrank - 1, (u, bq * fq, 0))
        ring["q"] += 1
        if go > 1:
            assert self.ogrp is not None
            ob, ocol = self.ogrp[gs][bi], j * p.Dv
        else:
            ob, ocol = self.obuf[ring["o"] % 2], 0
            ring["o"] += 1
        for tq in range(fq):
            self._last_tile = self._last_block and tq == fq - 1
            self._q_tile(ops, u, bidx, s, bq, tq, qn, qcol, ob, ocol, ring, qidx)
        oidx = self._index(bidx, self.a_out, go)
        if go == 1 or j == go - 1:  # a grouped output block: once the group's last head wrote it
            def store() -> None:
                # the outputs still waiting for their reciprocal first: a batch ends at a
                # store rather than hold it back (the next kernel reads the output)
                self._norm_flush(ops)
                self._store(ops, ob, self.a_out, lambda: [*oidx(), kc(bq * T), kc(0)], rq, go * fq * p.Dv,
                            (u, bq * fq, 9))

            if self._pending:  # after the q-tiles still waiting for their -m rows
                self._pending.append((self._pending[-1][0], None, (u, bq * fq, 9), store, None))
            else:
                store()

    def _q_tile(self, ops: list[SchedOp], u: int, bidx: BatchIndex, s: int, bq: int, tq: int, qn: SSAValue,
                qcol: int, ob: SSAValue, ocol: int, ring: Ring, qidx: IndexFn) -> None:
        """One q-tile: Q^T, the mask rows, pass 1 (the row max), the transposed-mode
        subtracts, the -m row, pass 2 (P^T and O_aug) and the normalised output. `qn`:
        the q-block's natural buffer (or, where Q^T loads by DMA, the argument q)."""
        p = self.p
        qi = bq * p.qseq.f + tq  # q-tile index
        qs = p.qseq.rows(bq)
        r = ring["qt"] % p.nq
        ring["qt"] += 1
        acco = self.acco[(ring["qt"] - 1) % p.no]
        if p.qdma:
            self._q_load_transposed(ops, (u, qi, 0), qidx, bq, qcol + tq * p.D, self.qt[r], qs)
        else:
            self._q_transpose(ops, (u, qi, 1), qn, qcol + tq * p.D, self.qt[r], qs, ring)
        # a pending q-tile's pass 2 still reads its mask rows and S - m buffers (rings of
        # NQ and na1): flush it before this q-tile writes them
        mbuf = self.mrow[r % len(self.mrow)] if self.mrow is not None else None
        if mbuf in self._pending_reads:
            self._flush(ops, ring)
        mrow = self._mask_rows(ops, (u, qi, 1), bidx, bq, tq, qs, r) if p.has_mask else None
        keys = p.pairs[qi]
        # pass 1: row max of S = Q K^T; the last chunks stay in the accumulator when they
        # are computed in transposed mode
        chunks1 = [keys[x:x + p.W1] for x in range(0, len(keys), p.W1)]
        n_t = self._transposed_chunks(chunks1, qs, last=self._last_tile)
        held = self._pass1(ops, (u, qi, 2), chunks1, n_t, qs, r, mrow, ring)
        sms = [self.sm[(ring["sm"] + i) % len(self.sm)] for i in range(len(held))]
        if any(b in self._pending_reads for b in sms):
            self._flush(ops, ring)
        tmode = self._subtract_max(ops, (u, qi, 3), held, qs, r, ring)
        normal = [(k, mid) for k, mid in keys if k not in tmode]

        p2 = Pass2((u, qi, 4), s, held, normal, tmode, qs, r, mrow, acco, ob, ocol + tq * p.Dv, (u, qi, 5))

        def rest() -> None:
            self._pass2(ops, [p2], ring)

        if p.neg_batch > 1:
            self._defer(ops, (u, qi, 3), qs, r if normal else None, rest, ring, p2)
            if self._pending:  # still pending (the last entry)
                self._pending_reads.update(b for b in (mbuf, *sms) if b is not None)
            return
        if normal:
            self._neg_max_row(ops, (u, qi, 3), qs, r)
        rest()

    def _q_load_transposed(self, ops: list[SchedOp], pr: Prio, qidx: IndexFn, bq: int, col: int, qt: SSAValue,
                           qs: int) -> None:
        """Q^T by DMA transposes, one per D chunk: row d of chunk ci is column ``col + d0
        + d`` of the q-block's rows (the scale is in K^T, `_k_copy`)."""
        p, T, kc = self.p, self.p.T, self.kb.const
        qrank = len(shape_of(self.a_q.type))
        for ci, (d0, dc) in enumerate(p.chunks):
            self._load(ops, self.a_q, lambda d0=d0: [*qidx(), kc(bq * T), kc(col + d0)], qt, (self._krow, ci * T),
                       dc, qs, qrank - 1, qrank - 2, pr, pattern=DmaPattern.TRANSPOSE)

    def _q_transpose(self, ops: list[SchedOp], pr: Prio, qn: SSAValue, col: int, qt: SSAValue, qs: int,
                     ring: Ring) -> None:
        """Q^T: transpose (identity matmul), scale on the accumulator copy (fp32, one rounding)."""
        p, T = self.p, self.p.T
        accq = self.acc_q[ring["q"] % 2]
        for ci, (d0, dc) in enumerate(p.chunks):
            self._mm(ops, qn, (0, col + d0), self.ident, (0, 0), accq, (0, ci * T), dc, qs, qs, False, pr)
        for ci, (_d0, dc) in enumerate(p.chunks):
            self._vec(ops, "scalar", "mul", accq, (0, ci * T), qt, (0, ci * T), dc, qs, pr, imm=self.scale)

    def _mask_rows(self, ops: list[SchedOp], pr: Prio, bidx: BatchIndex, bq: int, tq: int, qs: int,
                   r: int) -> SSAValue:
        """The additive mask's row block of the q-tile, clamped to the lowest finite value."""
        p, T, kc = self.p, self.p.T, self.kb.const
        assert self.a_mask is not None and self.mrow is not None
        fq = p.qseq.f
        mrow = self.mrow[r % len(self.mrow)]
        msh = shape_of(self.a_mask.type)
        midx = self._index(bidx, self.a_mask)
        mrank = len(msh)
        row_dim = mrank - 2 if msh[-2] != 1 or p.L == 1 else -1
        col_dim = mrank - 1 if msh[-1] != 1 or p.S == 1 else -1
        row0 = fq * bq * T + tq if row_dim >= 0 else 0
        self._load(ops, self.a_mask, lambda: [*midx(), kc(row0), kc(0)], mrow, (0, 0), qs, p.S,
                   row_dim, col_dim, pr, row_step=fq if row_dim >= 0 else 1)
        # -inf (a float mask may hold it) becomes the lowest finite value: the mask is
        # added by a matmul with an identity, whose zeros times -inf would be NaN; a mask
        # known finite (`ir/graph_finite.py`: a static cache's position mask) needs no pass
        if not p.mask_finite:
            self._vec(ops, "scalar", "max", mrow, (0, 0), mrow, (0, 0), qs, p.S, pr, imm=self.lowest)
        return mrow

    def _pass1(self, ops: list[SchedOp], pr: Prio, chunks1: list[list[KeyTile]], n_t: int, qs: int,
               r: int, mrow: SSAValue | None, ring: Ring) -> list[tuple[list[KeyTile], SSAValue]]:
        """``S = Q K^T`` chunk by chunk, max-reduced into the row max ``m``; the last `n_t`
        chunks (transposed mode) are returned with the accumulators that hold them."""
        p, T = self.p, self.p.T
        qt, mcol, mpart = self.qt[r], self.mcol[r], self.mpart[r]
        held: list[tuple[list[KeyTile], SSAValue]] = []
        for w, ch in enumerate(chunks1):
            acc = self.acc1[ring["s1"] % p.na1]
            ring["s1"] += 1
            if w >= len(chunks1) - n_t:
                held.append((ch, acc))
            off = 0
            for k, mid in ch:
                ks = p.ks(k)
                ktb, kcol = self._kt(k)
                kr = self._krow
                for ci, (_d0, dc) in enumerate(p.chunks):
                    self._mm(ops, qt, (kr, ci * T), ktb, (kr, ci * self._kw + kcol), acc, (0, off), qs, dc, ks,
                             ci > 0, pr)
                if mid is not None:
                    assert self.masks is not None
                    self._mm(ops, self.ident, (0, 0), self.masks, (0, mid * T), acc, (0, off), qs, qs, ks, True, pr)
                if mrow is not None:
                    self._mm(ops, self.ident, (0, 0), mrow, (0, k * T), acc, (0, off), qs, qs, ks, True, pr)
                off += ks
            if len(chunks1) == 1:
                self._vec(ops, "reduce", "max", acc, (0, 0), mcol, (0, 0), qs, off, pr)
            else:
                self._vec(ops, "reduce", "max", acc, (0, 0), mpart, (0, w), qs, off, pr)
        if len(chunks1) > 1:
            self._vec(ops, "reduce", "max", mpart, (0, 0), mcol, (0, 0), qs, len(chunks1), pr)
        return held

    def _subtract_max(self, ops: list[SchedOp], pr: Prio, held: list[tuple[list[KeyTile], SSAValue]], qs: int,
                      r: int, ring: Ring) -> dict[int, tuple[SSAValue, int]]:
        """Transposed mode: ``S - m`` (a column operand) into SRAM, in the model dtype;
        key tile -> (its S - m buffer, column)."""
        p = self.p
        tmode: dict[int, tuple[SSAValue, int]] = {}
        for ch, acc in held:
            sm = self.sm[ring["sm"] % len(self.sm)]
            ring["sm"] += 1
            width = sum(p.ks(k) for k, _ in ch)
            self._vec(ops, "column", "sub", acc, (0, 0), sm, (0, 0), qs, width, pr, col=(self.mcol[r], (0, 0)))
            off = 0
            for k, _ in ch:
                tmode[k] = (sm, off)
                off += p.ks(k)
        return tmode

    def _defer(self, ops: list[SchedOp], pr: Prio, qs: int, r: int | None, rest: Callable[[], None],
               ring: Ring, p2: Pass2) -> None:
        """Queue a q-tile's second half (`rest`: pass 2 and the output) until the -m rows
        of `plan.neg_batch` q-tiles are written by one copy (`_flush`)."""
        if self._pending and self._pending[0][0] != qs:  # one copy: rows of one width
            self._flush(ops, ring)
        self._pending.append((qs, r, pr, rest, p2))
        if sum(1 for x in self._pending if x[1] is not None) == self.p.neg_batch:
            self._flush(ops, ring)

    def _flush(self, ops: list[SchedOp], ring: Ring) -> None:
        """The pending q-tiles' -m rows: each max transposed (M = 1) to its row of an
        accumulator, one negating copy of the rows into a -m buffer; then the rest of
        their programs (and the stores queued behind them), in order; with
        `plan.AttentionPlan.xgroup`, the pass 2 of consecutive q-tiles without
        transposed-mode tiles together (their exp groups may span them)."""
        rows = [(qs, r, pr) for qs, r, pr, _, _ in self._pending if r is not None]
        if rows:
            assert self.negm is not None
            slot = ring["negm"] % len(self.negm)
            ring["negm"] += 1
            negm, acc = self.negm[slot], self.acc_m[slot % len(self.acc_m)]
            qs, pr = rows[0][0], rows[0][2]
            for j, (_, r, _) in enumerate(rows):
                assert r is not None
                self._mm(ops, self.mcol[r], (0, 0), self.ident, (0, 0), acc, (j, 0), 1, qs, qs, False, pr)
                self._negm_at[r] = (negm, j)
            self._vec(ops, "scalar", "mul", acc, (0, 0), negm, (0, 0), len(rows), qs, pr, imm=-1.0)
        pending, self._pending = self._pending, []
        self._pending_reads.clear()
        run: list[Pass2] = []
        for _, _, _, rest, p2 in pending:
            if p2 is not None and not p2.held and self.p.xgroup:
                run.append(p2)
                continue
            if run:
                self._pass2(ops, run, ring)
                run = []
            rest()
        if run:
            self._pass2(ops, run, ring)

    def _neg_max_row(self, ops: list[SchedOp], pr: Prio, qs: int, r: int) -> None:
        """-m as a row: transpose (M = 1) at the fold row's partition, negate into Q^T / negm."""
        p, T = self.p, self.p.T
        nd = len(p.chunks)
        fr = p.fold_row if p.fold_row is not None else 0
        acc = self.acc_m[0]
        self._mm(ops, self.mcol[r], (0, 0), self.ident, (0, 0), acc, (fr, 0), 1, qs, qs, False, pr)
        if p.fold_row is not None:
            self._vec(ops, "scalar", "mul", acc, (fr, 0), self.qt[r], (fr, (nd - 1) * T), 1, qs, pr, imm=-1.0)
        else:
            assert self.negm is not None
            self._vec(ops, "scalar", "mul", acc, (0, 0), self.negm[r], (0, 0), 1, qs, pr, imm=-1.0)
            self._negm_at[r] = (self.negm[r], 0)

    def _pass2(self, ops: list[SchedOp], run: list[Pass2], ring: Ring) -> None:
        """``P^T = exp(S^T - m)``, ``O_aug += P^T^T V_aug`` and the output of each q-tile
        of `run` (consecutive q-tiles of one head and height; transposed-mode tiles only
        in a run of one): transposed-mode tiles first (their pass-1 accumulators are then
        free for the next q-tile), then groups of up to G normal-mode key tiles, one exp
        each, a group spanning the end of one q-tile and the start of the next. A
        separate row sum accumulates into the q-tile's `lsum` (O_aug's column Dv, or its
        column of a reciprocal batch); its output follows its last PV matmul."""
        p = self.p
        assert all(x.normal or x.held for x in run), "attention: a q-tile without key tiles"
        groups = [[(x, km) for km in g] for x in run for g in self._groups([km for ch, _ in x.held for km in ch])]
        cur: list[tuple[Pass2, KeyTile]] = []
        for x in run:  # consecutive tiles of equal size, at most G per group, across q-tiles
            for km in x.normal:
                if cur and (len(cur) == p.G or p.ks(cur[-1][1][0]) != p.ks(km[0])):
                    groups.append(cur)
                    cur = []
                cur.append((x, km))
        if cur:
            groups.append(cur)
        for x in run:
            x.left = sum(1 for g in groups for y, _ in g if y is x)
        for grp in groups:
            self._pass2_group(ops, grp, ring)

    def _pass2_group(self, ops: list[SchedOp], grp: list[tuple[Pass2, KeyTile]], ring: Ring) -> None:
        """One exp group: each key tile's ``S^T - m`` (its q-tile's Q^T and -m) side by side
        in an accumulator, one exp into P^T, then each tile's PV (and row-sum) matmuls; a
        q-tile's output right after its last (before the next q-tile takes its row-sum
        column of a reciprocal batch)."""
        p, T = self.p, self.p.T
        nd = len(p.chunks)
        pt = self.pt[ring["pt"] % len(self.pt)]
        ring["pt"] += 1
        acc = self.acc2[ring["s2"] % p.n2]
        ring["s2"] += 1
        ks, qs = p.ks(grp[0][1][0]), grp[0][0].qs
        for jj, (x, (k, mid)) in enumerate(grp):
            slot, pr = (0, jj * qs), x.pr
            if k in x.tmode:
                sm, col = x.tmode[k]
                self._mm(ops, sm, (0, col), self.ident, (0, 0), acc, slot, ks, qs, qs, False, pr)
                continue
            qt = self.qt[x.r]
            ktb, kcol = self._kt(k)
            kr = self._krow
            for ci, (_d0, dc) in enumerate(p.chunks):
                kk = dc + (1 if p.fold_row is not None and ci == nd - 1 else 0)
                self._mm(ops, ktb, (kr, ci * self._kw + kcol), qt, (kr, ci * T), acc, slot, ks, kk, qs, ci > 0, pr)
            if p.fold_row is None:
                negm, j = self._negm_at[x.r]
                self._mm(ops, self.ones, (j, 0), negm, (j, 0), acc, slot, ks, 1, qs, True, pr)
            if mid is not None:
                assert self.masks is not None
                self._mm(ops, self.masks, (0, mid * T), self.ident, (0, 0), acc, slot, ks, qs, qs, True, pr)
            if x.mrow is not None:
                self._mm(ops, x.mrow, (0, k * T), self.ident, (0, 0), acc, slot, ks, qs, qs, True, pr)
        self._vec(ops, "unary", "exp", acc, (0, 0), pt, (0, 0), ks, len(grp) * qs, grp[-1][0].pr)
        for jj, (x, (k, _)) in enumerate(grp):
            if x.lsum is None:
                x.lsum = self._row_sum_slot(ops, x.acco, x.qs)
            va, vcol = self._v(x.s, k)
            for e0, ne in p.vchunks:
                self._mm(ops, pt, (0, jj * qs), va, (0, vcol + e0), x.acco, (0, e0), qs, ks, ne, not x.first, x.pr)
            if not p.rowsum_fused:
                self._mm(ops, pt, (0, jj * qs), self.ones, (0, 0), x.lsum[0], x.lsum[1], qs, ks, 1, not x.first,
                         x.pr)
            x.first = False
            x.left -= 1
            if not x.left:
                self._normalise(ops, x.npr, x.acco, x.ob, x.col, x.qs, x.lsum)

    def _row_sum_slot(self, ops: list[SchedOp], acco: SSAValue, qs: int) -> tuple[SSAValue, Pos]:
        """Where the q-tile's row sum accumulates: O_aug's column Dv, or (a reciprocal
        batch, `plan.AttentionPlan.rbatch`) the next column of the batch's acc_l. The
        waiting outputs are emitted first where the q-tile would overwrite one of their
        O_aug (the ring came round) or its rows differ from theirs (one reciprocal: rows
        of one height)."""
        p = self.p
        if p.rbatch == 1:
            return acco, (0, p.Dv)
        if any(a is acco or n != qs for a, n, _, _ in self._norm):
            self._norm_flush(ops)
        return self.acc_l[self._lslot], (0, len(self._norm))

    def _norm_flush(self, ops: list[SchedOp]) -> None:
        """The waiting outputs of a reciprocal batch: one reciprocal of their row sums (in
        place), then each output's column multiply."""
        if not self._norm:
            return
        accl = self.acc_l[self._lslot]
        rows, pr = self._norm[0][1], self._norm[-1][2]
        self._vec(ops, "unary", "reciprocal", accl, (0, 0), accl, (0, 0), rows, len(self._norm), pr)
        self._lslot = 1 - self._lslot
        pending, self._norm = self._norm, []
        for _, _, _, emit in pending:
            emit()

    def _normalise(self, ops: list[SchedOp], pr: Prio, acco: SSAValue, ob: SSAValue, col: int, qs: int,
                   lsum: tuple[SSAValue, Pos]) -> None:
        """``O = O_aug[:, :Dv] / O_aug[:, Dv]`` into the q-block's output tile: a column
        divide, or a reciprocal of the column and a multiply where that is cheaper; in a
        reciprocal batch (`plan.AttentionPlan.rbatch`), a column multiply by the batch's
        reciprocal once the batch is full or a store of the output block comes
        (`_norm_flush`)."""
        p, tm = self.p, self.tm
        if p.rbatch > 1:
            def emit() -> None:
                self._vec(ops, "column", "mul", acco, (0, 0), ob, (0, col), qs, p.Dv, pr, col=lsum)

            self._norm.append((acco, qs, pr, emit))
            if len(self._norm) == p.rbatch:
                self._norm_flush(ops)
            return
        if (tm.vec("unary", "reciprocal", qs, 1) + tm.vec("binary", "mul", qs, p.Dv)
                < tm.vec("binary", "div", qs, p.Dv)):
            self._vec(ops, "unary", "reciprocal", acco, (0, p.Dv), acco, (0, p.Dv), qs, 1, pr)
            self._vec(ops, "column", "mul", acco, (0, 0), ob, (0, col), qs, p.Dv, pr, col=(acco, (0, p.Dv)))
        else:
            self._vec(ops, "column", "div", acco, (0, 0), ob, (0, col), qs, p.Dv, pr, col=(acco, (0, p.Dv)))
