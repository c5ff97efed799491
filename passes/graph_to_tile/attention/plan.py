"""The attention kernel's plan: its tiling, its buffers, and which tilings to try.

A plan (`AttentionPlan`) fixes everything about one attention kernel except the order of
its instructions: the tile size ``T = min(partitions, array rows, array cols,
accumulator partitions)``, how q and k rows load (`Seq`: plain or *paired*), how heads
load (*head groups*), the contraction chunks of D, the fold row of the max subtraction,
the row sum (a ones column of V_aug or a matmul of its own), the causal mask patterns,
and the buffer counts, checked against SRAM and the accumulator. For example, on
``tiny`` (16 partitions)::

    graph.sdpa %q, %k, %v causal true : tensor<1x2x40x8xbf16> ...
      -> plan_attention(...) = AttentionPlan(T=16, qseq=Seq(40, 1, 16), kseq=Seq(40, 1, 16),
             chunks=[(0, 8)], fold_row=8, vchunks=[(0, 9)], rowsum_fused=True,
             pairs=[[(0, 0)], [(0, None), (1, 0)], [(0, None), (1, None), (2, 0)]], ...)

Tilings: a row of D bf16 elements is shorter than the DMA payload that saturates HBM
(`TimingRules.dma_saturating_chunk`, ~4 KiB on ``cloud``) at D <= 128, and each
transfer pays ~2,000 cycles, so rows can be *paired*: the HBM view ``[N / f, f * D]``
(f = 2 or 4) loads f tiles per DMA, tile t of a block holding rows ``f (b T + r) + t``;
the causal patterns follow. Paired tiles cost more diagonal tiles
(and mask matmuls) under a causal mask. Pairing needs dense rows; the *strided views*
of a real model's attention (GPT-2: q, k, v sliced out of one ``[s, 3 d]`` projection
and viewed as heads, strides ``[.., D, 3 d, 1]``; the output written through its
consumer permute's layout, `LoweringContext.output_buffer`) instead hold heads h..h+g-1
of a row side by side (`heads_adjacent`: head stride = row width), so rows can be
*head-grouped*: the view ``[..., H / g, N, g * D]`` loads one ``[T x g D]`` block for g
heads (long rows, g times fewer transfers), each head's tiles a column window of it (the
K / Q transposes, the PV matmuls read windows; the output block is stored once the
group's last head wrote its columns). A body holds whole groups (head-major inside a
group; a group's blocks stay until its last head, two group sets alternate where they
fit). q, k, v and the output group independently; a grouped V has no room for a ones
column per head, so its row sum is a matmul of its own. The kernel is planned for the
plain and the paired tilings (and a separate row sum, so V can load paired too), and for
head groups of a few sizes where the views allow (`group_sizes`; V grouped or per head);
`entry.search_tilings` builds the one whose schedule ends first.

Masks: `is_causal` (torch's top-left aligned ``tril(ones(L, S))``) skips key tiles
above the diagonal entirely; a tile the diagonal crosses adds a constant pattern
(``0`` / the dtype's most negative finite value) through one more matmul in each pass.
The patterns come from the tiles' row indices (`causal_pairs`), deduplicated.

A kernel body's (q-tile, key-tile) pairs are bounded by the semaphores (`body_budget`):
a long causal sequence becomes several kernels of consecutive q-blocks (`qranges`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from xdsl.dialects.builtin import Float16Type, MemRefType, NoneAttr
from xdsl.ir import Attribute, SSAValue

from tilecc.ir.dtypes import element_size
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules

ALIGN = 64
G_EXP = 4  # key tiles per pass-2 group (one exp instruction)
W_MAX = 4  # key tiles per pass-1 chunk (one max-reduce instruction)
NQ = 2  # q-tile ring: Q^T, the max, -m
NQ_DMA = 8  # the same ring where Q^T loads by DMA transposes (they are issued further ahead)
NEG_BATCH = 4  # q-tiles whose -m rows one vector copy writes (a separate -m row: D a multiple of T)
NO = 2  # O_aug accumulators
RBATCH = 4  # q-tiles whose row sums one reciprocal inverts (a separate row sum: `AttentionPlan.rbatch`)
N2 = 3  # pass-2 ring: S^T accumulators, P^T
MAX_HELD = 2  # transposed-mode chunks per q-tile
SCHEDULE_TRIES = 8  # seeded perturbations of the critical-path priorities
# (pass-1 accumulators, K-transpose accumulators, pass-2 accumulators), most first
ACC_SETS = ((3, 2, 3), (3, 1, 3), (2, 2, 3), (2, 1, 3), (2, 1, 2))
SEMAPHORES_PER_PAIR = 4  # a body of n (q-tile, key-tile) pairs needs up to ~3.5 n semaphores
DEBUG = bool(os.environ.get("TILECC_ATTN_DEBUG"))  # print the schedules' ends
Shape = Sequence[int]
Pairs = list[list[tuple[int, int | None]]]  # per q-tile: (key tile, causal pattern or None)


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN

@dataclass(frozen=True)
class Seq:
    """N rows in tiles of at most T. With f = 2 the rows are *paired*: the HBM view
    ``[N / 2, 2 * width]`` puts rows 2r and 2r + 1 in one DMA row, so a load block of T
    view rows holds two tiles, tile t being the rows ``2 (b T + r) + t``."""

    N: int
    f: int
    T: int

    @property
    def blocks(self) -> int:
        return -(-(self.N // self.f) // self.T)

    def rows(self, b: int) -> int:
        return min(self.T, self.N // self.f - b * self.T)

    def tiles(self) -> list[tuple[int, int]]:
        return [(b, t) for b in range(self.blocks) for t in range(self.f)]

    def index(self, b: int, t: int, r: np.ndarray | int) -> np.ndarray | int:
        """Sequence position of row r of tile (b, t)."""
        return self.f * (b * self.T + r) + t


@dataclass
class AttentionPlan:
    """One attention kernel's tiling and buffer counts (`plan_attention`)."""

    T: int
    L: int
    S: int
    D: int
    Dv: int
    batch: tuple[int, ...]
    qseq: Seq
    kseq: Seq
    chunks: list[tuple[int, int]]  # contraction chunks of D: (first, size)
    fold_row: int | None  # row of the -m / ones fold inside the last chunk (None: separate)
    vchunks: list[tuple[int, int]]  # N chunks of O_aug (the ones column included if fused)
    rowsum_fused: bool  # the ones column of V_aug sits in the last N chunk
    causal: bool
    has_mask: bool
    # per q-tile (in qseq.tiles() order): its key tiles (index in kseq.tiles()) and the
    # causal mask pattern each needs (an index into `masks`, or None)
    pairs: Pairs
    masks: list[np.ndarray]  # [T x T] bool: key visible
    G: int = G_EXP  # key tiles per pass-2 group
    W1: int = W_MAX  # key tiles per pass-1 chunk
    sets: int = 2  # K^T / V_aug sets (double buffering across heads)
    U: int = 1  # (unused: a kernel picks its heads per body, `AttentionKernel.U`)
    na1: int = 2  # pass-1 accumulators (a transposed-mode chunk holds one until its subtract)
    ntr: int = 2  # accumulators for the K transposes
    n2: int = N2  # pass-2 accumulators (normal-mode tiles)
    tmode: bool = False  # key tiles may run in transposed mode (see AttentionKernel._transposed_chunks)
    # heads per DMA of q, k, v and the output (1, or `heads` where that tensor's heads lie
    # side by side in its rows: the view ``[..., H / g, N, g * width]``), and the group
    # buffer sets (double buffering across head groups)
    grp: tuple[int, int, int, int] = (1, 1, 1, 1)
    gsets: int = 1
    # Q^T loads by DMA transposes (a 2-byte dtype: `DmaPattern.TRANSPOSE`), the scale
    # applied by the K^T copies; else Q loads naturally and the matrix engine transposes it
    qdma: bool = False
    # the additive mask never holds -inf (`ir/graph_finite.py`): its rows need no clamp
    mask_finite: bool = False
    # *packed K^T* (`kpack_ok`): heads 2i and 2i + 1 of a body share one K^T buffer, rows
    # 0..D-1 and D..2D-1 (their Q^T rows likewise), so one vector copy on all the lanes
    # moves both heads' transposes out of the accumulator (two copies on D lanes each else)
    kpack: bool = False
    # K blocks per K^T buffer (`kcopy_plan`): their transposes share one accumulator and
    # one copy per D chunk moves them all (a copy per block else)
    kc: int = 1
    # q-tiles whose row sums land side by side in one accumulator, inverted by one vector
    # reciprocal, each output then a column multiply (1: each q-tile's own divide or
    # reciprocal; only with a separate row sum, whose matmul writes any column)
    rbatch: int = 1
    # O_aug accumulators beyond the batch's (its outputs wait for its last row sum): one
    # lets the next q-tile's pass 2 start before the batch's multiplies
    ospare: int = NO - 1
    # the pass 2 of the q-tiles whose -m rows one copy writes share exp groups: a group
    # may hold the last key tiles of one q-tile and the first of the next (fewer exps)
    xgroup: bool = False

    @property
    def no(self) -> int:
        """O_aug accumulators: a reciprocal batch's q-tiles and `ospare` more."""
        return self.rbatch + self.ospare

    @property
    def nq(self) -> int:
        """The q-tile ring: Q^T, the max, -m."""
        return NQ_DMA if self.qdma else NQ

    @property
    def neg_batch(self) -> int:
        """q-tiles whose -m rows one copy writes: the rows of a separate -m buffer, one
        per q-tile (a copy of n rows costs what one row does: one lane per partition);
        a fold row inside Q^T (D not a multiple of T) is one q-tile's."""
        return 1 if self.fold_row is not None else min(NEG_BATCH, self.nq // 2)

    @property
    def heads(self) -> int:
        """Heads per group: a body holds whole groups, a grouped load serves them all."""
        return max(self.grp)

    @property
    def v_paired(self) -> bool:
        """V loads one block of paired rows (else one tile, every f-th row, per load:
        the ones column of a fused row sum must follow each tile's Dv columns)."""
        return self.kseq.f == 2 and not self.rowsum_fused

    def ks(self, k: int) -> int:
        return self.kseq.rows(k // self.kseq.f)

    def qs(self, q: int) -> int:
        return self.qseq.rows(q // self.qseq.f)


def causal_pairs(qseq: Seq, kseq: Seq, causal: bool) -> tuple[Pairs, list[np.ndarray]]:
    """The key tiles each q-tile sees, and the distinct causal mask patterns (torch's
    top-left aligned ``tril(ones(L, S))``: key k is visible from query q iff k <= q)."""
    T = qseq.T
    ktiles = kseq.tiles()
    out: list[list[tuple[int, int | None]]] = []
    masks: list[np.ndarray] = []
    seen: dict[bytes, int] = {}
    r = np.arange(T)[:, None]
    c = np.arange(T)[None, :]
    for bq, tq in qseq.tiles():
        qlo, qhi = qseq.index(bq, tq, 0), qseq.index(bq, tq, qseq.rows(bq) - 1)
        row: list[tuple[int, int | None]] = []
        for k, (bk, tk) in enumerate(ktiles):
            if not causal:
                row.append((k, None))
                continue
            klo, khi = kseq.index(bk, tk, 0), kseq.index(bk, tk, kseq.rows(bk) - 1)
            if klo > qhi:
                continue
            if khi <= qlo:
                row.append((k, None))
                continue
            vis = np.asarray(kseq.index(bk, tk, c) <= qseq.index(bq, tq, r))
            key = vis.tobytes()
            if key not in seen:
                seen[key] = len(masks)
                masks.append(vis)
            row.append((k, seen[key]))
        out.append(row)
    return out, masks


def sram_bytes(p: AttentionPlan, isz: int, queues: int) -> int:
    T, nd, fq, fk = p.T, len(p.chunks), p.qseq.f, p.kseq.f
    nkb, nkt = p.kseq.blocks, len(p.kseq.tiles())
    gq, gk, gv, go = p.grp
    nqb = p.qseq.blocks
    total = align(T * isz) * (2 + len(p.masks))  # identity, ones, mask patterns
    if gk > 1:  # a group's K blocks stay until its last head's transposes
        total += p.gsets * nkb * align(gk * p.D * isz)
    else:
        total += min(nkb, 2 * queues) * align(fk * p.D * isz)  # K natural ring
    total += p.sets * -(-nkb // p.kc) * align(nd * p.kc * fk * T * isz)  # K^T
    if gv > 1:
        total += p.gsets * nkb * align(gv * p.Dv * isz)
    elif p.v_paired:
        total += p.sets * nkb * align(fk * p.Dv * isz)
    else:
        total += p.sets * nkt * align((p.Dv + 1) * isz)  # V_aug
    if p.qdma:
        pass  # Q^T loads straight into its ring
    elif gq > 1:
        total += p.gsets * nqb * align(gq * p.D * isz)
    else:
        total += min(nqb, queues) * align(fq * p.D * isz)  # Q natural ring
    total += p.nq * (align(nd * T * isz) + align(T * isz) + align(-(-nkt // p.W1) * 4) + align(isz))
    if p.has_mask:
        total += NQ * align(p.S * isz)
    total += N2 * align(p.G * T * isz)  # P^T
    if go > 1:
        total += p.gsets * nqb * align(go * p.Dv * isz)  # a group's output blocks
    else:
        total += 2 * align(fq * p.Dv * isz)  # output blocks
    if p.tmode:
        total += p.na1 * align(p.W1 * T * isz)  # S - m of transposed-mode chunks
    return total


def acc_bytes(p: AttentionPlan) -> int:
    T, nd = p.T, len(p.chunks)
    accq = 0 if p.qdma else 2 * align(nd * T * 4)  # the Q transposes
    accm = (2 if p.neg_batch > 1 else 1) * align(T * 4)  # the transposes of m
    return (p.ntr * align(nd * p.kc * p.kseq.f * T * 4) + accq + p.na1 * align(p.W1 * T * 4)
            + accm + p.n2 * align(p.G * T * 4) + p.no * align((p.Dv + 1) * 4)
            + (2 * align(p.rbatch * 4) if p.rbatch > 1 else 0))


def plan_attention(cfg: HardwareConfig, q_shape: Shape, k_shape: Shape, v_shape: Shape, out_shape: Shape,
                   causal: bool, has_mask: bool, elem: Attribute, pair: int = 1, sep_rowsum: bool = False,
                   pair_ok: tuple[bool, bool] = (True, True),
                   grp: tuple[int, int, int, int] = (1, 1, 1, 1), sep_fold: bool = False) -> AttentionPlan | None:
    """The kernel's tiling and buffers, or None where it does not fit. `pair`: rows per
    DMA row (1, 2 or 4) for q and k (k only without an additive mask); `sep_rowsum`:
    the row sum as its own matmul even where a ones column would fit the PV matmul
    (so V can load paired); `pair_ok`: whether q / k and v are contiguous (pairing views
    their rows as ``[N / f, f * width]``); `grp`: heads per DMA of q, k, v and the
    output (1 or one group size that divides the head count; a grouped V needs the
    row sum as its own matmul, a grouped q or k unpaired rows); `sep_fold`: -m as a row
    of its own (one more matmul per key tile, K = 1) even where D leaves a fold row in
    Q^T, so one copy writes the -m rows of several q-tiles (`AttentionPlan.neg_batch`)."""
    L, D = q_shape[-2:]
    S, Dv = k_shape[-2], v_shape[-1]
    batch = tuple(out_shape[:-2])
    if min(L, S, D, Dv, *batch, 1) <= 0:
        return None
    hg = max(grp)
    if hg > 1:
        if not batch or batch[-1] % hg or any(x not in (1, hg) for x in grp):
            return None
        if grp[0] > 1 or grp[3] > 1:
            pair_ok = (False, pair_ok[1])
        if grp[1] > 1 or grp[2] > 1:
            pair_ok = (pair_ok[0], False)
    T = min(cfg.sram.partitions, cfg.matrix.rows, cfg.matrix.cols, cfg.accumulator.partitions)
    isz = element_size(elem)
    fq = pair if L % pair == 0 and L > T and pair_ok[0] else 1
    fk = pair if S % pair == 0 and S > T and not has_mask and pair_ok[1] else 1
    qseq, kseq = Seq(L, fq, T), Seq(S, fk, T)
    chunks = [(d0, min(T, D - d0)) for d0 in range(0, D, T)]
    fold_row = D % T if D % T and not sep_fold else None
    C = cfg.matrix.cols
    rowsum_fused = Dv % C != 0 and not sep_rowsum and grp[2] == 1
    width = Dv + 1 if rowsum_fused else Dv
    vchunks = [(c0, min(C, width - c0)) for c0 in range(0, width, C)]
    pairs, masks = causal_pairs(qseq, kseq, causal)
    nkt = len(kseq.tiles())
    # a group's buffers double-buffered (the next group's loads run ahead) where they fit
    for gsets in ((2, 1) if hg > 1 and batch[-1] > hg else (1,)):
        for sets in (2, 1):
            for G, W1 in ((min(G_EXP, nkt), min(W_MAX, nkt)), (min(2, nkt), min(2, nkt)), (1, 1)):
                for na1, ntr, n2 in ACC_SETS:
                    p = AttentionPlan(T, L, S, D, Dv, batch, qseq, kseq, chunks, fold_row, vchunks,
                                      rowsum_fused, causal, has_mask, pairs, masks, G, W1, sets, 1, na1, ntr, n2,
                                      grp=(grp[0], grp[1], grp[2], grp[3]), gsets=gsets, qdma=isz == 2)
                    if na1 > 2:
                        p.tmode = transposed_ok(elem, causal or has_mask)
                        if not p.tmode:
                            continue
                    if (sram_bytes(p, isz, cfg.dma.queues) <= cfg.sram.bytes_per_partition
                            and acc_bytes(p) <= cfg.accumulator.bytes_per_partition):
                        return p
    return None


def kpack_ok(p: AttentionPlan) -> bool:
    """Whether two heads' K^T can share one buffer (`AttentionPlan.kpack`): their rows fit
    the partitions together (2 D <= T, one D chunk), no fold row sits below them in Q^T /
    K^T, Q^T loads by DMA transposes (any row offset), and the heads come in pairs (K head
    groups of an even size: a pair's K blocks are one group block's neighbouring columns)."""
    return (2 * p.D <= p.T and len(p.chunks) == 1 and p.fold_row is None and p.qdma
            and bool(p.batch) and p.batch[-1] % 2 == 0 and (p.grp[1] == 1 or p.grp[1] % 2 == 0))


def kcopy_plan(p: AttentionPlan, cfg: HardwareConfig, isz: int) -> AttentionPlan | None:
    """`p` with the most K blocks per K^T buffer (`AttentionPlan.kc`, at least 2) that fit
    SRAM and the accumulator, or None: fewer, longer K^T copies (a vector instruction
    pays ~190 core cycles on ``cloud`` whatever its size), a q-tile's pass 1 waiting for
    all the blocks of a buffer."""
    for kc in range(p.kseq.blocks, 1, -1):
        c = replace(p, kc=kc)
        if (sram_bytes(c, isz, cfg.dma.queues) <= cfg.sram.bytes_per_partition
                and acc_bytes(c) <= cfg.accumulator.bytes_per_partition):
            return c
    return None


def rbatch_plans(p: AttentionPlan, cfg: HardwareConfig) -> list[AttentionPlan]:
    """`p` with the row sums of 2 to `RBATCH` q-tiles inverted by one reciprocal
    (`AttentionPlan.rbatch`; each batch size with a spare O_aug where the accumulator
    holds it, else without): only with a separate row sum (a fused one lands in each
    q-tile's O_aug column Dv), output blocks of several q-tiles (a batch ends at a
    block's store: paired q rows or grouped heads), and where a column multiply plus a
    share of the reciprocal costs less than the q-tile's own normalisation (a divide,
    or a reciprocal and a multiply: `_normalise`)."""
    if p.rowsum_fused or (p.qseq.f == 1 and p.grp[3] == 1):  # a batch ends at each q-tile's store
        return []
    tm, T, Dv = TimingRules(cfg), p.T, p.Dv

    def vec(kind: str, fn: str, rows: int, cols: int) -> float:
        return tm.vector_time(rows, cols, tm.vector_op_cost(kind, fn), 1)

    own = min(vec("binary", "div", T, Dv), vec("unary", "reciprocal", T, 1) + vec("binary", "mul", T, Dv))
    out: list[AttentionPlan] = []
    for n in range(RBATCH, 1, -1):
        if vec("binary", "mul", T, Dv) + vec("unary", "reciprocal", T, n) / n >= own:
            continue
        fits = [c for c in (replace(p, rbatch=n, ospare=spare) for spare in (NO - 1, 0))
                if acc_bytes(c) <= cfg.accumulator.bytes_per_partition]
        out += fits[:1]
    return out


def transposed_ok(elem: Attribute, masked: bool) -> bool:
    """Whether key tiles may run in *transposed mode*: pass 1's ``S`` stays in the
    accumulator, the vector engine subtracts ``m`` (a column operand) into SRAM in the
    model dtype and the matrix engine transposes it (one matmul instead of the pass-2
    recompute and its fold; masks are already in ``S``). Not for fp16 with masks:
    ``S - m`` of a masked score (-65504 - m) overflows fp16 to -inf, and the identity's
    zeros times -inf are NaN."""
    return not (masked and isinstance(elem, Float16Type))


def body_budget(cfg: HardwareConfig) -> int:
    """(q-tile, key-tile) pairs one scheduled body may hold: its instructions are straight
    line, each producer another queue waits on takes a semaphore, and a kernel with more
    producers than semaphores falls back to one semaphore per queue (npu-insert-sync),
    which serialises the engines."""
    return max(1, cfg.semaphores // SEMAPHORES_PER_PAIR)


def qranges(p: AttentionPlan, cfg: HardwareConfig) -> list[range]:
    """The q-blocks of each kernel: consecutive blocks while one head's pairs (one head
    group's) fit a body (a long causal sequence becomes several kernels, each preparing
    the K / V blocks its q-blocks see)."""
    budget, out, start, pairs = max(1, body_budget(cfg) // p.heads), [], 0, 0
    fq = p.qseq.f
    for bq in range(p.qseq.blocks):
        n = sum(len(p.pairs[bq * fq + tq]) for tq in range(fq))
        if pairs and pairs + n > budget:
            out.append(range(start, bq))
            start, pairs = bq, 0
        pairs += n
    out.append(range(start, p.qseq.blocks))
    return out


def heads_adjacent(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int]) -> bool:
    """Whether an operand of the heads (``[..., H, N, W]``, H the output's last batch
    dim) holds row r of heads h and h + 1 side by side in memory: contiguous rows with
    the head stride W, so heads h..h+g-1 of a row are g * W contiguous elements and the
    view ``[..., H / g, N, g * W]`` (strides ``[..., g * W, row stride, 1]``) exists."""
    if len(out_shape) < 3 or len(shape) < 3 or shape[-3] != out_shape[-3] or shape[-3] < 2:
        return False
    return strides[-1] == 1 and strides[-3] == shape[-1]


def group_sizes(cfg: HardwareConfig, out_shape: Shape, D: int, Dv: int, isz: int,
                 group_ok: tuple[bool, ...]) -> list[int]:
    """Heads per grouped DMA to try: divisors of the head count whose rows reach a DMA
    chunk that saturates HBM (`TimingRules.dma_saturating_chunk`): the smallest such, and
    the largest two (fewer transfers), or every divisor where none does."""
    if not any(group_ok) or len(out_shape) < 3:
        return []
    H = out_shape[-3]
    divs = [g for g in range(2, H + 1) if H % g == 0]
    sat = TimingRules(cfg).dma_saturating_chunk()
    long = [g for g in divs if g * min(D, Dv) * isz >= sat]
    if not long:
        return divs[-2:]
    return sorted({long[0], *long[-2:]})



def contiguous(v: SSAValue) -> bool:
    """An HBM tensor in its default (row-major, dense) layout."""
    return isinstance(v.type, MemRefType) and isinstance(v.type.layout, NoneAttr)


def hbm_types(p: AttentionPlan, elem: Attribute, q_shape: Shape, k_shape: Shape, v_shape: Shape,
              mask_shape: Shape | None, out_shape: Shape) -> list[MemRefType]:
    """The kernel's argument types: q, k, v (paired views where the plan pairs rows),
    the mask, the output, the identity and the causal mask patterns."""
    def paired(s: Shape, f: int) -> tuple[int, ...]:
        return tuple(s) if f == 1 else (*s[:-2], s[-2] // f, f * s[-1])

    def grouped(s: Shape, g: int) -> tuple[int, ...]:
        return tuple(s) if g == 1 else (*s[:-3], s[-3] // g, s[-2], g * s[-1])

    fq, fk, T = p.qseq.f, p.kseq.f, p.T
    gq, gk, gv, go = p.grp
    shapes = [grouped(paired(q_shape, fq), gq), grouped(paired(k_shape, fk), gk),
              grouped(paired(v_shape, fk) if p.v_paired else tuple(v_shape), gv)]
    if mask_shape is not None:
        shapes.append(tuple(mask_shape))
    shapes += [grouped(paired(out_shape, fq), go), (T, T)]
    if p.masks:
        shapes.append((T, T * len(p.masks)))
    return [MemRefType(elem, list(x)) for x in shapes]


