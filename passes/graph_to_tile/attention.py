"""The -O2 attention kernel: ``graph.sdpa`` as one flash-attention kernel.

At ``-O0`` (and where this kernel does not apply, see the end) sdpa is the decomposition
of `lower_index.lower_sdpa`: one kernel per graph op, every score matrix round-tripping
HBM. Here the whole attention is one kernel and no score leaves the chip.

The machine: the matrix engine computes ``acc[M x N] (+)= lhsT[K x M]^T @ rhs[K x N]``
(K on partitions for both operands) and costs about one preload (array rows, 128 cycles
on ``cloud``) per matmul whatever K and N are; the vector engine works lane-aligned,
reduces along the free dimension only, and pays ~76 cycles per instruction on
``cloud``. Tiles are ``T = min(partitions, array rows, array cols, accumulator
partitions)`` queries or keys.

Layout (*transposed scores*), per (batch, head):

- K load blocks in their natural layout (``[keys x D]``) and are transposed on the
  matrix engine (a matmul with an identity) into resident ``K^T`` buffers (D on
  partitions, one buffer per load block so later blocks do not hold up earlier
  q-tiles); V loads naturally into resident ``V_aug`` buffers. K^T / V_aug are
  double-buffered across heads (and loaded once per body when k and v broadcast over
  heads).
- Per q-tile: Q is transposed the same way; the accumulator copy multiplies by `scale`
  (fp32, one rounding) into ``Q^T``.
- Pass 1 (queries on partitions): ``S = Q K^T`` for up to 4 key tiles side by side in
  the accumulator (one matmul per key tile and D chunk), one vector max-reduce per such
  chunk, the partial maxes reduced to the row max ``m`` (a column).
- Pass 2 (keys on partitions), *normal mode*: ``m`` is transposed into a row (a matmul
  with M = 1 against the identity, landing at the accumulator partition of the fold
  row) and copied, negated, into row D of ``Q^T`` (``Q^T_aug``) or, when D is a multiple
  of T, a separate ``-m`` row. ``S^T - m = K^T_aug^T @ Q^T_aug``: the ones row of
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
  and a store.

Per 128 x 128 key tile on ``cloud`` at D = 128 that is 5 matmuls (pass 1, pass 2,
fold, PV, row sum) and 3 vector element-ops per score (exp costs 2, max 1) in normal
mode, 4 matmuls and 4 element-ops in transposed mode; the flash-attention-2 layout
(S with queries on partitions, P transposed on the matrix engine, online rescale) needs
3-4 matmuls but 6 element-ops per score (max, subtract, exp, sum, copy of the
transposed P), and the vector engine is the scarce one.

Masks: `is_causal` (torch's top-left aligned ``tril(ones(L, S))``) skips key tiles
above the diagonal entirely; a tile the diagonal crosses adds a constant pattern
(``0`` / the dtype's most negative finite value) through one more matmul in each pass
(``acc += I^T @ Mask`` in pass 1, ``acc += Mask^T @ I`` in pass 2, so both read the
pattern in its natural q-major layout; transposed mode needs only the first). The
patterns come from the tiles' row indices (`_pairs`), deduplicated. An additive `mask`
(any broadcast over batch, heads, rows or columns; bool masks arrive additive) loads one
``[T x S]`` row block per q-tile, clamped to the dtype's lowest finite value (a float
mask may hold -inf, and the identity's zeros times -inf are NaN; a vector max, one
element-op per score; a row masking every key then averages V where torch gives NaN),
and is added the same way on every key tile.

Tilings: a row of D bf16 elements is shorter than an efficient DMA chunk at D <= 128 on
``cloud``, and each transfer pays ~2,000 cycles, so rows can be *paired*: the HBM view
``[N / f, f * D]`` (f = 2 or 4) loads f tiles per DMA, tile t of a block holding rows
``f (b T + r) + t``; the causal patterns follow. Paired tiles cost more diagonal tiles
(and mask matmuls) under a causal mask. Pairing needs dense rows; the *strided views*
of a real model's attention (GPT-2: q, k, v sliced out of one ``[s, 3 d]`` projection
and viewed as heads, strides ``[.., D, 3 d, 1]``; the output written through its
consumer permute's layout, `GraphToTile.output_buffer`) instead hold heads h..h+g-1 of
a row side by side (`_heads_adjacent`: head stride = row width), so rows can be
*head-grouped*: the view ``[..., H / g, N, g * D]`` loads one ``[T x g D]`` block for g
heads (long rows, g times fewer transfers), each head's tiles a column window of it (the
K / Q transposes, the PV matmuls read windows; the output block is stored once the
group's last head wrote its columns). A body holds whole groups (head-major inside a
group; a group's blocks stay until its last head, two group sets alternate where they
fit). q, k, v and the output group independently; a grouped V has no room for a ones
column per head, so its row sum is a matmul of its own. The kernel is planned for the
plain and the paired tilings (and a separate row sum, so V can load paired too), and for
head groups of a few sizes where the views allow (`_group_sizes`; V grouped or per
head), and the one whose schedule ends first is built.

Scheduling: a kernel body (one or more heads; a loop runs bodies over the remaining
heads) is first written as a plain sequential program over rotating buffers
(accumulators, ``P^T``, ``Q^T``, DMA rings); a list scheduler then reorders it into the
order each engine queue runs: an instruction may move ahead of any other it shares no
buffer with (the rule `npu-insert-sync` derives semaphores from, so the emitted order
keeps every dependence), priorities are critical-path lengths (an edge to another
engine costs the producer's latency, one on its own in-order queue its occupancy), and
each buffer's loads keep one DMA queue (picked when its first load issues; several
queues would need one semaphore wait each). Several priority variants are scheduled
and each order is *replayed* with the simulator's timing rules (in-order queues,
pipelined matmuls, processor-shared HBM; exact for a kernel of one body): the fastest
is emitted, and the replay's cycles are kept in `ESTIMATES`. So the pass-1 matmuls of
the next q-tile fill the matrix engine while the vector engine runs this q-tile's exps,
and loads run ahead into free buffers.

Falls back to the decomposition (returns False) when a dimension is zero, or when the
resident K^T / V_aug of a head, the mask row block and the working buffers do not fit
SRAM or the accumulator (very long sequences or head dims far above the partition count
on a small target). Every float dtype, any L, S, D, Dv, batch / head broadcasting of q,
k, v, and every additive mask broadcast are handled by the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    IntegerAttr,
    MemRefType,
    NoneAttr,
    TensorType,
    f32,
    i1,
)
from xdsl.ir import Attribute, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.schedule.cost_model import Timing
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.machine import matmul_mapping

ALIGN = 64
G_EXP = 4  # key tiles per pass-2 group (one exp instruction)
W_MAX = 4  # key tiles per pass-1 chunk (one max-reduce instruction)
NQ = 2  # q-tile ring: Q^T, the max, -m
NO = 2  # O_aug accumulators
N2 = 3  # pass-2 ring: S^T accumulators, P^T
MAX_HELD = 2  # transposed-mode chunks per q-tile
SCHEDULE_TRIES = 8  # seeded perturbations of the critical-path priorities
# (pass-1 accumulators, K-transpose accumulators, pass-2 accumulators), most first
ACC_SETS = ((3, 2, 3), (3, 1, 3), (2, 2, 3), (2, 1, 3), (2, 1, 2))
SEMAPHORES_PER_PAIR = 4  # a body of n (q-tile, key-tile) pairs needs up to ~3.5 n semaphores
_DEBUG = bool(__import__("os").environ.get("TILECC_ATTN_DEBUG"))  # print the schedules' ends
ESTIMATES: dict[str, float] = {}  # diagnostics: kernel name -> cycles its schedule replays to


def _shape(t: Attribute) -> tuple[int, ...]:
    return tuple(t.get_shape())  # type: ignore[attr-defined]


def _isz(elem: Attribute) -> int:
    return 4 if isinstance(elem, Float32Type) else 2


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dense(data: np.ndarray, elem: Attribute) -> DenseIntOrFPElementsAttr:
    return DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(data.shape)), data.reshape(-1).tolist())


def lower_attention(lw, op, loc: str) -> None:
    """The `graph.sdpa` lowering: this kernel at -O2 where it applies, else the
    decomposition of `lower_index.lower_sdpa`."""
    from tilecc.passes.graph_to_tile.index import lower_sdpa

    if not (lw.opt_level >= 2 and lower_attention_kernel(lw, op, loc)):
        lower_sdpa(lw, op, loc)


# ---------------------------------------------------------------------------------------
# tiling and the plan
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Seq:
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
class _Plan:
    T: int
    L: int
    S: int
    D: int
    Dv: int
    batch: tuple[int, ...]
    qseq: _Seq
    kseq: _Seq
    chunks: list[tuple[int, int]]  # contraction chunks of D: (first, size)
    fold_row: int | None  # row of the -m / ones fold inside the last chunk (None: separate)
    vchunks: list[tuple[int, int]]  # N chunks of O_aug (the ones column included if fused)
    rowsum_fused: bool  # the ones column of V_aug sits in the last N chunk
    causal: bool
    has_mask: bool
    # per q-tile (in qseq.tiles() order): its key tiles (index in kseq.tiles()) and the
    # causal mask pattern each needs (an index into `masks`, or None)
    pairs: list[list[tuple[int, int | None]]]
    masks: list[np.ndarray]  # [T x T] bool: key visible
    G: int = G_EXP  # key tiles per pass-2 group
    W1: int = W_MAX  # key tiles per pass-1 chunk
    sets: int = 2  # K^T / V_aug sets (double buffering across heads)
    U: int = 1  # (unused: a kernel picks its heads per body, `_Kernel.U`)
    na1: int = 2  # pass-1 accumulators (a transposed-mode chunk holds one until its subtract)
    ntr: int = 2  # accumulators for the K transposes
    n2: int = N2  # pass-2 accumulators (normal-mode tiles)
    tmode: bool = False  # key tiles may run in transposed mode (see _Kernel._transposed_chunks)
    # heads per DMA of q, k, v and the output (1, or `heads` where that tensor's heads lie
    # side by side in its rows: the view ``[..., H / g, N, g * width]``), and the group
    # buffer sets (double buffering across head groups)
    grp: tuple[int, int, int, int] = (1, 1, 1, 1)
    gsets: int = 1

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


def _pairs(qseq: _Seq, kseq: _Seq, causal: bool) -> tuple[list[list[tuple[int, int | None]]], list[np.ndarray]]:
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
            vis = kseq.index(bk, tk, c) <= qseq.index(bq, tq, r)
            key = vis.tobytes()
            if key not in seen:
                seen[key] = len(masks)
                masks.append(vis)
            row.append((k, seen[key]))
        out.append(row)
    return out, masks


def _sram_bytes(p: _Plan, isz: int, queues: int) -> int:
    T, nd, fq, fk = p.T, len(p.chunks), p.qseq.f, p.kseq.f
    nkb, nkt = p.kseq.blocks, len(p.kseq.tiles())
    gq, gk, gv, go = p.grp
    nqb = p.qseq.blocks
    total = _align(T * isz) * (2 + len(p.masks))  # identity, ones, mask patterns
    if gk > 1:  # a group's K blocks stay until its last head's transposes
        total += p.gsets * nkb * _align(gk * p.D * isz)
    else:
        total += min(nkb, 2 * queues) * _align(fk * p.D * isz)  # K natural ring
    total += p.sets * nkb * _align(nd * fk * T * isz)  # K^T
    if gv > 1:
        total += p.gsets * nkb * _align(gv * p.Dv * isz)
    elif p.v_paired:
        total += p.sets * nkb * _align(fk * p.Dv * isz)
    else:
        total += p.sets * nkt * _align((p.Dv + 1) * isz)  # V_aug
    if gq > 1:
        total += p.gsets * nqb * _align(gq * p.D * isz)
    else:
        total += min(nqb, queues) * _align(fq * p.D * isz)  # Q natural ring
    total += NQ * (_align(nd * T * isz) + _align(T * isz) + _align(-(-nkt // p.W1) * 4) + _align(isz))
    if p.has_mask:
        total += NQ * _align(p.S * isz)
    total += N2 * _align(p.G * T * isz)  # P^T
    if go > 1:
        total += p.gsets * nqb * _align(go * p.Dv * isz)  # a group's output blocks
    else:
        total += 2 * _align(fq * p.Dv * isz)  # output blocks
    if p.tmode:
        total += p.na1 * _align(p.W1 * T * isz)  # S - m of transposed-mode chunks
    return total


def _acc_bytes(p: _Plan) -> int:
    T, nd = p.T, len(p.chunks)
    return (p.ntr * _align(nd * p.kseq.f * T * 4) + 2 * _align(nd * T * 4) + p.na1 * _align(p.W1 * T * 4)
            + _align(T * 4) + p.n2 * _align(p.G * T * 4) + NO * _align((p.Dv + 1) * 4))


def _plan(cfg: HardwareConfig, q_shape, k_shape, v_shape, out_shape, causal: bool, has_mask: bool,
          elem: Attribute, pair: int = 1, sep_rowsum: bool = False,
          pair_ok: tuple[bool, bool] = (True, True),
          grp: tuple[int, int, int, int] = (1, 1, 1, 1)) -> _Plan | None:
    """The kernel's tiling and buffers, or None where it does not fit. `pair`: rows per
    DMA row (1, 2 or 4) for q and k (k only without an additive mask); `sep_rowsum`:
    the row sum as its own matmul even where a ones column would fit the PV matmul
    (so V can load paired); `pair_ok`: whether q / k and v are contiguous (pairing views
    their rows as ``[N / f, f * width]``); `grp`: heads per DMA of q, k, v and the
    output (1 or one group size that divides the head count; a grouped V needs the
    row sum as its own matmul, a grouped q or k unpaired rows)."""
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
    isz = _isz(elem)
    fq = pair if L % pair == 0 and L > T and pair_ok[0] else 1
    fk = pair if S % pair == 0 and S > T and not has_mask and pair_ok[1] else 1
    qseq, kseq = _Seq(L, fq, T), _Seq(S, fk, T)
    chunks = [(d0, min(T, D - d0)) for d0 in range(0, D, T)]
    fold_row = D % T if D % T else None
    C = cfg.matrix.cols
    rowsum_fused = Dv % C != 0 and not sep_rowsum and grp[2] == 1
    width = Dv + 1 if rowsum_fused else Dv
    vchunks = [(c0, min(C, width - c0)) for c0 in range(0, width, C)]
    pairs, masks = _pairs(qseq, kseq, causal)
    nkt = len(kseq.tiles())
    # a group's buffers double-buffered (the next group's loads run ahead) where they fit
    for gsets in ((2, 1) if hg > 1 and batch[-1] > hg else (1,)):
        for sets in (2, 1):
            for G, W1 in ((min(G_EXP, nkt), min(W_MAX, nkt)), (min(2, nkt), min(2, nkt)), (1, 1)):
                for na1, ntr, n2 in ACC_SETS:
                    p = _Plan(T, L, S, D, Dv, batch, qseq, kseq, chunks, fold_row, vchunks, rowsum_fused,
                              causal, has_mask, pairs, masks, G, W1, sets, 1, na1, ntr, n2, grp=tuple(grp),
                              gsets=gsets)
                    if na1 > 2:
                        p.tmode = _transposed_ok(elem, causal or has_mask)
                        if not p.tmode:
                            continue
                    if (_sram_bytes(p, isz, cfg.dma.queues) <= cfg.sram.bytes_per_partition
                            and _acc_bytes(p) <= cfg.accumulator.bytes_per_partition):
                        return p
    return None


def _transposed_ok(elem: Attribute, masked: bool) -> bool:
    """Whether key tiles may run in *transposed mode*: pass 1's ``S`` stays in the
    accumulator, the vector engine subtracts ``m`` (a column operand) into SRAM in the
    model dtype and the matrix engine transposes it (one matmul instead of the pass-2
    recompute and its fold; masks are already in ``S``). Not for fp16 with masks:
    ``S - m`` of a masked score (-65504 - m) overflows fp16 to -inf, and the identity's
    zeros times -inf are NaN."""
    return not (masked and isinstance(elem, Float16Type))


# ---------------------------------------------------------------------------------------
# the list scheduler
# ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Op:
    kind: str  # "load", "store", "mm", "vec"
    emit: Callable[[int | None], None]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    prio: tuple[int, ...]
    a: float  # mm: streaming cycles; vec: duration; dma: fixed cycles
    b: float = 0.0  # dma: transfer cycles
    queue: int | None = None  # dma: its queue
    idx: int = 0
    deps: set[int] = field(default_factory=set)


class _Timing(Timing):
    """The simulator's timing formulas (machine._durations), for the schedule only: the
    cost model's closed forms plus the per-instruction view the list scheduler needs."""

    def __init__(self, cfg: HardwareConfig):
        super().__init__(cfg)
        self.pipelined = cfg.matrix.mode == "pipelined"

    def mm(self, m: int, k: int, n: int, fp32: bool) -> float:
        _, _, t = matmul_mapping(self.cfg, m, k, n)
        return float(t * (self.cfg.matrix.fp32_slowdown if fp32 else 1))

    def vec(self, kind: str, fn: str, rows: int, cols: int, inputs: int = 1) -> float:
        v = self.cfg.vector
        cost = getattr(v.op_cost, kind)[fn]
        return v.latency_cycles + v.access_cycles + math.ceil(rows * cols / v.lanes) * cost * inputs

    def occupancy(self, o: _Op) -> float:
        """Cycles an instruction holds its engine."""
        if o.kind == "mm":
            return max(self.preload, o.a, self.cfg.matrix.min_interval_cycles)
        return o.a + o.b

    def latency(self, o: _Op) -> float:
        """Cycles from an instruction's start to its result."""
        if o.kind == "mm":
            return self.preload + o.a + self.drain
        return o.a + o.b

    def dma(self, rows: int, cols: int, isz: int, contiguous: bool = True) -> tuple[float, float]:
        """(fixed cycles, transfer cycles): one descriptor per row, or per element when
        the rows are not contiguous."""
        if contiguous:
            return self.fixed(rows), self.xfer(rows, cols, isz)
        return self.fixed(rows * cols), self.xfer(rows * cols, 1, isz)


def _buffer_deps(ops) -> list[set[int]]:
    """Per op, the earlier ops it depends on through a buffer: the last writer of what it
    reads or writes (RAW, WAW) and the readers since then of what it writes (WAR)."""
    last_w: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    out: list[set[int]] = []
    for i, o in enumerate(ops):
        d: set[int] = {last_w[b] for b in (*o.reads, *o.writes) if b in last_w}
        for b in o.writes:
            d.update(readers.get(b, ()))
        for b in o.reads:
            readers.setdefault(b, []).append(i)
        for b in o.writes:
            last_w[b] = i
            readers[b] = []
        d.discard(i)
        out.append(d)
    return out


def _schedule(ops: list[_Op], tm: _Timing, queues: int, init: dict | None = None,
              tries: int = SCHEDULE_TRIES) -> tuple[list, float]:
    """A topological order of `ops` (dependences: shared buffers, in the given order) for
    the engines' queues, and each load's DMA queue: list schedules under a few
    priority functions (critical paths by latency or by engine occupancy, and seeded
    perturbations of them), the one with the earliest estimated end.
    `init`: the engines' state after the kernel's prologue (``qfree``, ``vec``, and
    ``ready``: buffer -> when the prologue's last access to it ends)."""
    init = init or {}
    for i, (o, deps) in enumerate(zip(ops, _buffer_deps(ops))):
        o.idx = i
        o.deps = deps
    n = len(ops)
    succ: list[list[int]] = [[] for _ in range(n)]
    for o in ops:
        for d in sorted(o.deps):
            succ[d].append(o.idx)

    eng = [_engine(o, queues) for o in ops]
    lat_w = [tm.latency(o) for o in ops]
    occ_w = [tm.occupancy(o) for o in ops]

    def levels(scale: Sequence[float] | None = None) -> list[float]:
        """Longest path from each instruction to the end of the body: an edge to another
        engine costs the producer's latency, one on its own (in-order) queue only its
        occupancy of the engine."""
        level = [0.0] * n
        for i in range(n - 1, -1, -1):
            f = scale[i] if scale is not None else 1.0
            best = lat_w[i]
            for x in succ[i]:
                w = lat_w[i] if eng[x] != eng[i] else occ_w[i]
                if w + level[x] > best:
                    best = w + level[x]
            level[i] = best * f
        return level

    lat = levels()
    variants = [lat]
    rng = np.random.default_rng(0)
    for _ in range(tries):
        variants.append(levels(rng.uniform(0.97, 1.03, n)))
    best = None
    spans = []
    for v, level in enumerate(variants):
        order, _, start, end = _list_schedule(ops, succ, level, tm, queues, init)
        span = _replay(order, tm, queues, init)
        spans.append(round(span))
        if best is None or span < best[1]:
            best = (order, span, level, start, end)
    # loads in the order their data is needed: the planned start of their first
    # consumer in the best schedule so far (repeated while it helps)
    for _ in range(3):
        level = list(best[2])
        end = best[4]
        for i, o in enumerate(ops):
            if o.kind == "load" and succ[i]:
                # when its consumers could start but for the loads they wait on
                level[i] = -min(max([end[d] for d in ops[x].deps if ops[d].kind != "load"], default=0.0)
                                for x in succ[i])
        order, _, start, end = _list_schedule(ops, succ, level, tm, queues, init)
        span = _replay(order, tm, queues, init)
        spans.append(round(span))
        if span >= best[1]:
            break
        best = (order, span, level, start, end)
    if _DEBUG:
        occ_by: dict[str, float] = {}
        for o in ops:
            occ_by[o.kind] = occ_by.get(o.kind, 0.0) + tm.occupancy(o)
        print(f"attention schedule: {n} ops, planned ends {spans}, critical path {max(lat):,.0f}, "
              f"occupancy {({k: round(x) for k, x in occ_by.items()})}")
    return best[0], best[1]


def _replay(order: list[tuple[_Op, int | None]], tm: _Timing, queues: int, init: dict) -> float:
    """The end of a schedule, timed the way the simulator times it: each engine runs
    its instructions in program order (`init["pre"]`, the kernel prologue, then
    `order`), an instruction waits for the earlier ones of other engines it shares a
    buffer with, pipelined matmuls overlap, DMA transfers share HBM (processor sharing)."""
    import heapq

    seq_all = [(o, o.queue if o.kind in ("load", "store") and q is None else q) for o, q in init.get("pre", [])]
    seq_all += list(order)
    n = len(seq_all)
    eng_of = [0] * n
    seqs: list[list[int]] = [[] for _ in range(queues + 2)]
    deps: list[list[int]] = []
    for k, ((o, q), d) in enumerate(zip(seq_all, _buffer_deps([o for o, _ in seq_all]))):
        e = q if o.kind == "load" else _engine(o, queues)
        eng_of[k] = e
        seqs[e].append(k)
        deps.append(sorted(x for x in d if eng_of[x] != e))
    order = seq_all
    end: list[float | None] = [None] * n
    head = [0] * (queues + 2)
    free = [0.0] * (queues + 2)
    busy = [False] * queues
    MAT = queues
    stream_free = 0.0
    pending: list[tuple[float, int]] = []  # DMAs to join HBM: (time, k)
    flying: dict[int, float] = {}  # DMA k -> transfer work left (cycles alone)
    t_now = 0.0
    while True:
        progress = True
        while progress:
            progress = False
            for e in range(queues + 2):
                seq = seqs[e]
                while head[e] < len(seq):
                    k = seq[head[e]]
                    if e < queues and busy[e]:
                        break
                    t = free[e]
                    known = True
                    for d in deps[k]:
                        x = end[d]
                        if x is None:
                            known = False
                            break
                        t = max(t, x)
                    if not known:
                        break
                    o = order[k][0]
                    head[e] += 1
                    progress = True
                    if e < queues:
                        busy[e] = True
                        heapq.heappush(pending, (t + o.a, k))
                        break
                    if e == MAT and tm.pipelined:
                        f = max(t + tm.preload, stream_free)
                        free[e] = f
                        stream_free = f + max(o.a, tm.cfg.matrix.min_interval_cycles)
                        end[k] = f + o.a + tm.drain
                    elif e == MAT:
                        end[k] = free[e] = t + tm.preload + o.a + tm.drain
                    else:
                        end[k] = free[e] = t + o.a
        # the next HBM event: a transfer joins or the first one in flight finishes
        t_fin, k_fin = math.inf, -1
        if flying:
            k_fin = min(flying, key=lambda x: (flying[x], x))
            t_fin = t_now + flying[k_fin] * len(flying)
        if pending and pending[0][0] <= t_fin:
            t_join, k = heapq.heappop(pending)
            t_join = max(t_join, t_now)
            for x in flying:
                flying[x] -= (t_join - t_now) / len(flying)
            t_now = t_join
            flying[k] = order[k][0].b
            continue
        if k_fin < 0:
            break
        for x in flying:
            flying[x] -= (t_fin - t_now) / len(flying)
        t_now = t_fin
        del flying[k_fin]
        end[k_fin] = free[eng_of[k_fin]] = t_fin
        busy[eng_of[k_fin]] = False
    assert all(x is not None for x in end), "attention schedule: replay deadlock"
    return max(end, default=0.0)  # type: ignore[type-var]


def _engine(o: _Op, queues: int) -> int:
    """The engine queue of an instruction: DMA queues 0.. (a load: its buffer's queue
    once known, else -1), then matrix, vector."""
    if o.kind == "store":
        return queues - 1
    if o.kind == "load":
        return -1
    return queues if o.kind == "mm" else queues + 1


def _list_schedule(ops, succ, level, tm: _Timing, queues: int, init: dict) -> tuple[list, float, list, list]:
    """One list schedule: whenever an engine is free, the ready instruction with the
    highest `level` (else the one ready first); issued in estimated start order. A
    buffer's loads all use one DMA queue: the first free when its first load issues."""
    n = len(ops)
    left = [len(o.deps) for o in ops]
    pro = init.get("ready", {})
    dep_ready = [max([pro.get(b, 0.0) for b in o.reads + o.writes], default=0.0) for o in ops]
    MAT, VEC = queues, queues + 1
    qmap: dict[str, int] = dict(init.get("qmap", {}))
    eng = [_engine(o, queues) for o in ops]
    ready: list[list[int]] = [[] for _ in range(queues + 2)]
    anyq: list[int] = []  # ready loads of buffers without a queue yet

    def enqueue(i: int) -> None:
        o = ops[i]
        if o.kind == "load":
            q = qmap.get(o.writes[0])
            if q is None:
                anyq.append(i)
                return
            eng[i] = q
        ready[eng[i]].append(i)

    for i in range(n):
        if left[i] == 0:
            enqueue(i)
    free = list(init.get("qfree", [0.0] * queues)) + [0.0, init.get("vec", 0.0)]
    stream_free = span = 0.0
    start = [0.0] * n
    end = [0.0] * n
    out: list[tuple[_Op, int | None]] = []
    while True:
        best = None  # (start, -level, index, engine)
        for e_ in range(queues + 2):
            cands = ready[e_] + anyq if e_ < queues else ready[e_]
            if not cands:
                continue
            t_e = free[e_]
            now = [i for i in cands if dep_ready[i] <= t_e]
            if now:
                i = max(now, key=lambda x: (level[x], -x))
                key = (t_e, -level[i], i, e_)
            else:
                i = min(cands, key=lambda x: (dep_ready[x], -level[x], x))
                key = (dep_ready[i], -level[i], i, e_)
            if best is None or key < best:
                best = key
        if best is None:
            break
        t, _, i, e_ = best
        o = ops[i]
        if o.kind in ("load", "store"):
            if o.kind == "load" and o.writes[0] not in qmap:
                qmap[o.writes[0]] = e_
                anyq.remove(i)
                eng[i] = e_
            else:
                ready[e_].remove(i)
            # HBM is shared by the transfers in flight (processor sharing): this one's
            # transfer slows by the number of queues transferring when it starts
            busy = sum(1 for q in range(queues) if q != e_ and free[q] > t + o.a)
            e = free[e_] = t + o.a + o.b * (1 + busy)
        elif o.kind == "mm":
            ready[e_].remove(i)
            if tm.pipelined:
                f = max(t + tm.preload, stream_free)
                free[MAT] = f
                stream_free = f + max(o.a, tm.cfg.matrix.min_interval_cycles)
                e = f + o.a + tm.drain
            else:
                e = free[MAT] = t + tm.preload + o.a + tm.drain
        else:
            ready[e_].remove(i)
            e = free[VEC] = t + o.a
        span = max(span, e)
        start[i], end[i] = t, e
        out.append((o, e_ if o.kind == "load" else None))
        for x in succ[i]:
            left[x] -= 1
            if eng[x] != e_ and dep_ready[x] < e:  # its own queue runs in order: no wait
                dep_ready[x] = e
            if left[x] == 0:
                enqueue(x)
    assert len(out) == n, "attention schedule: dependence cycle"
    return out, span, start, end


# ---------------------------------------------------------------------------------------
# the kernel
# ---------------------------------------------------------------------------------------


def lower_attention_kernel(lw, op, loc: str) -> bool:
    res = op.results[0]
    elem = res.type.element_type
    q_shape, k_shape, v_shape = (_shape(x.type) for x in (op.q, op.k, op.v))
    out_shape = _shape(res.type)
    has_mask = op.mask is not None
    mask_shape = None
    if has_mask:
        ms = _shape(op.mask.type)
        mask_shape = (1,) * (2 - len(ms)) + ms if len(ms) < 2 else ms
    scale, dt = float(op.scale.value.data), g.element_dtype(res.type)
    q, k, v = (lw.materialise(x) for x in (op.q, op.k, op.v))
    # pairing reshapes rows: only of tensors laid out contiguously (a strided view's rows
    # 2r and 2r + 1 need not be neighbours)
    # the output goes straight into a consumer permute's layout when one asks for it
    # (GraphToTile.output_buffer): a strided view, so q rows (and output rows) unpaired
    absorbs = res in lw.layout_requests
    pair_ok = (_contiguous(q) and not absorbs, _contiguous(k) and _contiguous(v))
    # head grouping: which tensors hold the heads of a row side by side (the strided views
    # of one projected qkv tensor, an output written through the consumer permute)
    out_strides = lw.layout_requests[res][1] if absorbs else tile.row_major(out_shape)
    group_ok = (_heads_adjacent(q_shape, lw.layout(q)[0], out_shape),
                _heads_adjacent(k_shape, lw.layout(k)[0], out_shape),
                _heads_adjacent(v_shape, lw.layout(v)[0], out_shape),
                _heads_adjacent(out_shape, out_strides, out_shape))
    # plain, paired and head-grouped tilings: the one whose schedule (a dry run) ends first;
    # the choice depends only on shapes, layouts and the config (not on addresses), so
    # identical attention ops (every layer of a transformer) search once
    sig = (lw.cfg, q_shape, k_shape, v_shape, out_shape, mask_shape, bool(op.is_causal), str(elem), scale, str(dt),
           pair_ok, group_ok, tuple(lw.layout(q)[0]), tuple(lw.layout(k)[0]), tuple(lw.layout(v)[0]),
           tuple(out_strides))
    if sig in _CHOICES:
        best = _CHOICES[sig]
    else:
        best = _search(lw, op, q_shape, k_shape, v_shape, out_shape, mask_shape, has_mask, elem, scale, dt, loc,
                       pair_ok, group_ok)
        _CHOICES[sig] = best
    if best is None:
        remarks.emit("lower-graph-to-tile", "missed", "attention: no fused tiling fits the target", loc)
        return False
    plan = best[1]
    remarks.emit("lower-graph-to-tile", "passed", lambda: (
        f"attention {list(q_shape)} x {list(k_shape)}: chose tiling q x{plan.qseq.f} k x{plan.kseq.f}, "
        f"tile {plan.T}, row sum {'fused' if plan.rowsum_fused else 'separate'}, heads per DMA "
        f"{plan.grp}, estimated {best[0]:,.0f} cycles (best of {best[2]} tilings)"), loc)
    mask = None
    if has_mask:
        mask = lw.materialise(op.mask)
        if _shape(mask.type) != mask_shape:
            mask = lw.view(mask, mask_shape)
    out = lw.output_buffer(res, elem)
    for r in _qranges(plan, lw.cfg):
        kernel = _Kernel(lw, plan, elem, scale, dt, loc, tensors=(q, k, v, mask, out), qblocks=r)
        ESTIMATES[kernel.kb.func.sym_name.data] = kernel.build()
    lw.values[res] = out
    return True


# attention signature -> (estimate, plan) of the chosen tiling (None: nothing fits)
_CHOICES: dict = {}


def _search(lw, op, q_shape, k_shape, v_shape, out_shape, mask_shape, has_mask, elem, scale, dt, loc,
            pair_ok, group_ok):
    """The fastest tiling by dry-run schedules: (estimate, plan), or None."""
    best = None
    tried = set()
    cands: list[tuple[int, bool, tuple[int, int, int, int]]] = [
        (1, False, (1, 1, 1, 1)), (2, False, (1, 1, 1, 1)), (2, True, (1, 1, 1, 1)),
        (4, False, (1, 1, 1, 1)), (4, True, (1, 1, 1, 1))]
    for hg in _group_sizes(lw.cfg, out_shape, q_shape[-1], v_shape[-1], _isz(elem), group_ok):
        qg, kg, vg, og = (hg if ok else 1 for ok in group_ok)
        cands.append((1, False, (qg, kg, 1, og)))  # V per head: its ones column fuses the row sum
        if vg > 1:
            cands.append((1, True, (qg, kg, vg, og)))
    budget = _budget(lw.cfg)
    for pair, sep, grp in cands:
        plan = _plan(lw.cfg, q_shape, k_shape, v_shape, out_shape, op.is_causal, has_mask, elem, pair, sep,
                     pair_ok, grp)
        key = plan and (plan.qseq.f, plan.kseq.f, plan.rowsum_fused, plan.grp)
        if plan is None or key in tried or (sep and plan.kseq.f == 1 and plan.grp[2] == 1):
            continue
        tried.add(key)
        # a body holds whole head groups: one q-block's pairs of a whole group must fit it
        if plan.heads > 1 and max(len(x) for x in plan.pairs) * plan.heads > budget:
            continue
        types = _hbm_types(plan, elem, q_shape, k_shape, v_shape, mask_shape, out_shape)
        est = sum(_Kernel(lw, plan, elem, scale, dt, loc, types=types, qblocks=r).build()
                  for r in _qranges(plan, lw.cfg))
        if _DEBUG:
            print(f"attention tiling q x{plan.qseq.f} k x{plan.kseq.f} fused row sum {plan.rowsum_fused} "
                  f"heads per DMA {plan.grp} (group sets {plan.gsets}): {est:,.0f} cycles")
        if best is None or est < best[0]:
            best = (est, plan)
    return None if best is None else (*best, len(tried))


def _budget(cfg: HardwareConfig) -> int:
    """(q-tile, key-tile) pairs one scheduled body may hold: its instructions are straight
    line, each producer another queue waits on takes a semaphore, and a kernel with more
    producers than semaphores falls back to one semaphore per queue (npu-insert-sync),
    which serialises the engines."""
    return max(1, cfg.semaphores // SEMAPHORES_PER_PAIR)


def _qranges(p: _Plan, cfg: HardwareConfig) -> list[range]:
    """The q-blocks of each kernel: consecutive blocks while one head's pairs (one head
    group's) fit a body (a long causal sequence becomes several kernels, each preparing
    the K / V blocks its q-blocks see)."""
    budget, out, start, pairs = max(1, _budget(cfg) // p.heads), [], 0, 0
    fq = p.qseq.f
    for bq in range(p.qseq.blocks):
        n = sum(len(p.pairs[bq * fq + tq]) for tq in range(fq))
        if pairs and pairs + n > budget:
            out.append(range(start, bq))
            start, pairs = bq, 0
        pairs += n
    out.append(range(start, p.qseq.blocks))
    return out


def _heads_adjacent(shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int]) -> bool:
    """Whether an operand of the heads (``[..., H, N, W]``, H the output's last batch
    dim) holds row r of heads h and h + 1 side by side in memory: contiguous rows with
    the head stride W, so heads h..h+g-1 of a row are g * W contiguous elements and the
    view ``[..., H / g, N, g * W]`` (strides ``[..., g * W, row stride, 1]``) exists."""
    if len(out_shape) < 3 or len(shape) < 3 or shape[-3] != out_shape[-3] or shape[-3] < 2:
        return False
    return strides[-1] == 1 and strides[-3] == shape[-1]


def _group_sizes(cfg: HardwareConfig, out_shape, D: int, Dv: int, isz: int,
                 group_ok: tuple[bool, ...]) -> list[int]:
    """Heads per grouped DMA to try: divisors of the head count whose rows reach an
    efficient DMA chunk (the smallest such, and the largest two: fewer transfers), or
    every divisor where none does."""
    if not any(group_ok) or len(out_shape) < 3:
        return []
    H = out_shape[-3]
    divs = [g for g in range(2, H + 1) if H % g == 0]
    long = [g for g in divs if g * min(D, Dv) * isz >= cfg.dma.efficient_chunk_bytes]
    if not long:
        return divs[-2:]
    return sorted({long[0], *long[-2:]})


def _grouped(lw, v: SSAValue, g: int) -> SSAValue:
    """The view ``[..., H / g, N, g * W]`` of ``[..., H, N, W]`` whose heads lie side by
    side (`_heads_adjacent`): element (.., i, r, j W + c) is head g i + j's (r, c)."""
    if g == 1:
        return v
    s = _shape(v.type)
    strides, offset = lw.layout(v)
    return lw.strided(v, (*s[:-3], s[-3] // g, s[-2], g * s[-1]),
                      (*strides[:-3], g * strides[-3], strides[-2], 1), offset)


def _contiguous(v: SSAValue) -> bool:
    """An HBM tensor in its default (row-major, dense) layout."""
    return isinstance(v.type, MemRefType) and isinstance(v.type.layout, NoneAttr)


def _hbm_types(p: _Plan, elem, q_shape, k_shape, v_shape, mask_shape, out_shape) -> list[MemRefType]:
    """The kernel's argument types: q, k, v (paired views where the plan pairs rows),
    the mask, the output, the identity and the causal mask patterns."""
    def paired(s, f):
        return tuple(s) if f == 1 else (*s[:-2], s[-2] // f, f * s[-1])

    def grouped(s, g):
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


def _paired(lw, v: SSAValue, f: int) -> SSAValue:
    """The view ``[..., N / f, f * width]`` of ``[..., N, width]``."""
    if f == 1:
        return v
    s = _shape(v.type)
    return lw.view(v, (*s[:-2], s[-2] // f, f * s[-1]))


class _Kernel:
    def __init__(self, lw, p: _Plan, elem, scale: float, dt, loc, tensors=None, types=None, qblocks=None):
        """With `tensors` (q, k, v, mask or None, out in HBM) build and launch the kernel;
        with only the argument `types`, a dry run: `build` returns the estimated cycles
        of its schedule and nothing is emitted."""
        self.lw, self.p, self.elem, self.scale, self.loc = lw, p, elem, scale, loc
        self.cfg: HardwareConfig = lw.cfg
        self.isz = _isz(elem)
        self.fp32 = isinstance(elem, Float32Type)
        self.tm = _Timing(self.cfg)
        self.dry = tensors is None
        T, fq, fk = p.T, p.qseq.f, p.kseq.f
        from tilecc.passes.graph_to_tile.index import masked_value

        self.lowest = masked_value(dt)  # the dtype's most negative finite value
        self.qblocks = range(p.qseq.blocks) if qblocks is None else qblocks
        qtiles = [bq * fq + tq for bq in self.qblocks for tq in range(fq)]
        self.kblocks = sorted({k // fk for qi in qtiles for k, _ in p.pairs[qi]})
        # heads per body: the largest divisor of the head count whose pairs fit a body
        # (an even one when it is not much smaller: the K^T / V sets alternate by head)
        heads = p.batch[-1] if p.batch else 1
        per_head = max(1, sum(len(p.pairs[qi]) for qi in qtiles))
        # (whole head groups: a multiple of the group size)
        hg = p.heads
        fits = [d for d in range(hg, heads + 1, hg) if heads % d == 0 and d * per_head <= _budget(self.cfg)] or [hg]
        even = [d for d in fits if d % 2 == 0]
        self.U = max(even) if even and max(even) * 2 >= max(fits) else max(fits)

        if self.dry:
            self.hbm_args = None
        else:
            q, k, v, mask, out = tensors
            gq, gk, gv, go = p.grp
            hbm = [_grouped(lw, _paired(lw, q, fq), gq), _grouped(lw, _paired(lw, k, fk), gk),
                   _grouped(lw, _paired(lw, v, fk) if p.v_paired else v, gv)]
            if mask is not None:
                hbm.append(mask)
            hbm.append(_grouped(lw, _paired(lw, out, fq), go))
            hbm.append(lw.hbm([T, T], elem, value=_dense(np.eye(T, dtype=np.float32), elem)))
            if p.masks:
                # finite: the constant's printed form reads back
                pats = np.concatenate([np.where(m, 0.0, self.lowest) for m in p.masks], axis=1).astype(np.float32)
                hbm.append(lw.hbm([T, T * len(p.masks)], elem, value=_dense(pats, elem)))
            self.hbm_args = hbm
            types = [a.type for a in hbm]
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
        self._win: dict[tuple, SSAValue] = {}
        self._true = self._false = None

    # -- helpers -----------------------------------------------------------------------
    def alloc(self, shape: Sequence[int], space: str, name: str, elem: Attribute | None = None) -> SSAValue:
        v = self.kb.alloc(list(shape), self.elem if elem is None else elem, space, name)
        self.names[v] = v.owner.buffer.data  # type: ignore[union-attr]
        return v

    def name(self, v: SSAValue) -> str:
        return self.names[v]

    def dma_target(self, v: SSAValue) -> SSAValue:
        self.qmap[self.name(v)] = len(self.qmap) % self.queues
        return v

    def win(self, buf: SSAValue, row: int, col: int, shape: Sequence[int]) -> SSAValue:
        if row == 0 and col == 0 and list(shape) == list(_shape(buf.type)):
            return buf
        key = (id(self.kb.block), buf, row, col, tuple(shape))
        v = self._win.get(key)
        if v is None:
            c = self.kb.const
            v = self.kb.add(tile.SubviewOp(buf, c(row), c(col), list(shape))).results[0]
            self._win[key] = v
        return v

    def flag(self, value: bool) -> SSAValue:
        if self._true is None:
            self._true = self.kb._add_entry(arith.ConstantOp(IntegerAttr(1, i1)))
            self._false = self.kb._add_entry(arith.ConstantOp(IntegerAttr(0, i1)))
        return self._true if value else self._false

    # -- building blocks: each appends one _Op ---------------------------------------------
    def _mm(self, ops, lhsT, lpos, rhs, rpos, acc, apos, m, k, n, accumulate, prio):
        """acc[apos: m x n] (+)= lhsT[lpos: k x m]^T @ rhs[rpos: k x n]; pos = (row, col)."""
        fp32 = self.fp32 or _isz(lhsT.type.element_type) == 4

        def emit(_q):
            c = self.kb.const
            self.kb.add(tile.MatmulOp(self.win(lhsT, *lpos, [k, m]), self.win(rhs, *rpos, [k, n]),
                                      self.win(acc, *apos, [m, n]), c(m), c(k), c(n), self.flag(accumulate)))

        ops.append(_Op("mm", emit, (self.name(lhsT), self.name(rhs), self.name(acc)), (self.name(acc),), prio,
                       self.tm.mm(m, k, n, fp32)))

    def _vec(self, ops, kind, fn, src, spos, dst, dpos, rows, cols, prio, imm=None, col=None):
        def emit(_q):
            c = self.kb.const
            a = self.win(src, *spos, [rows, cols])
            o = self.win(dst, *dpos, [rows, 1 if kind == "reduce" else cols])
            if kind == "unary":
                self.kb.add(tile.UnaryOp(fn, a, o, c(rows), c(cols)))
            elif kind == "scalar":
                self.kb.add(tile.ScalarOp(fn, a, imm, o, c(rows), c(cols)))
            elif kind == "reduce":
                self.kb.add(tile.ReduceOp(fn, a, o, c(rows), c(cols)))
            else:  # binary with a column operand
                cb, cpos = col
                self.kb.add(tile.BinaryOp(fn, a, self.win(cb, *cpos, [rows, 1]), o, c(rows), c(cols), "column"))

        reads = [self.name(src)] + ([self.name(col[0])] if col is not None else [])
        cost_kind = {"unary": "unary", "scalar": "binary", "reduce": "reduce", "column": "binary"}[kind]
        ops.append(_Op("vec", emit, tuple(reads), (self.name(dst),), prio, self.tm.vec(cost_kind, fn, rows, cols)))

    def _load(self, ops, arg, idx_fn, dst, dpos, rows, cols, row_dim, col_dim, prio, row_step=1):
        def emit(q):
            self.kb.add(tile.LoadOp(arg, idx_fn(), self.win(dst, *dpos, [rows, cols]), self.kb.const(rows),
                                    self.kb.const(cols), row_dim, col_dim, row_step=row_step, queue=q))

        fixed, transfer = self.tm.dma(rows, cols, self.isz, col_dim >= 0)
        ops.append(_Op("load", emit, (), (self.name(dst),), prio, fixed, transfer))

    def _store(self, ops, src, arg, idx_fn, rows, cols, prio):
        rank = len(_shape(arg.type))

        def emit(_q):
            self.kb.add(tile.StoreOp(src, arg, idx_fn(), self.kb.const(rows), self.kb.const(cols), rank - 2, rank - 1))

        fixed, transfer = self.tm.dma(rows, cols, self.isz)
        ops.append(_Op("store", emit, (self.name(src),), (), prio, fixed, transfer, self.queues - 1))

    # -- the kernel ----------------------------------------------------------------------
    def build(self) -> float:
        p, kb, T = self.p, self.kb, self.p.T
        fq, fk, nd = p.qseq.f, p.kseq.f, len(p.chunks)
        nkb, nkt = p.kseq.blocks, len(p.kseq.tiles())
        ACC, SRAM = tile.ACC, tile.SRAM
        c = kb.const
        # constants (one DMA each, on their own queues) and the ones tile; `init` models
        # this prologue for the schedule of the first body
        qfree = [0.0] * self.queues
        ready: dict[str, float] = {}
        pre: list[tuple[_Op, int | None]] = []  # the prologue, for the replay of the first body
        self.init = {"qfree": qfree, "ready": ready, "qmap": self.qmap, "pre": pre}

        def const_load(arg, buf, cols):
            q = self.qmap[self.name(self.dma_target(buf))]
            kb.add(tile.LoadOp(arg, [c(0), c(0)], buf, c(T), c(cols), 0, 1, queue=q))
            fixed, transfer = self.tm.dma(T, cols, self.isz)
            qfree[q] += fixed + transfer
            ready[self.name(buf)] = qfree[q]
            pre.append((_Op("load", lambda _q: None, (), (self.name(buf),), (), fixed, transfer, q), q))

        def pre_copy(src, dst, rows, cols):
            pre.append((_Op("vec", lambda _q: None, (self.name(src),), (self.name(dst),), (),
                            self.tm.vec("unary", "copy", rows, cols)), None))

        self.ident = self.alloc([T, T], SRAM, "ident")
        const_load(self.a_ident, self.ident, T)
        self.masks = None
        if p.masks:
            self.masks = self.alloc([T, T * len(p.masks)], SRAM, "causal")
            const_load(self.a_masks, self.masks, T * len(p.masks))
        self.ones = self.alloc([T, T], SRAM, "ones")  # max(I, 1) on the vector engine
        kb.add(tile.ScalarOp("max", self.ident, 1.0, self.ones, c(T), c(T)))
        vec = ready["ident"] + self.tm.vec("binary", "max", T, T)
        ready["ones"] = vec
        pre_copy(self.ident, self.ones, T, T)
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
                     if gq > 1 else None)
        self.ogrp = ([[self.alloc([T, go * p.Dv], SRAM, "out") for _ in range(nqb)] for _ in range(gsets)]
                     if go > 1 else None)
        self.nk_ring = 0 if gk > 1 else min(nkb, 2 * self.queues)
        self.knat = [self.alloc([T, fk * p.D], SRAM, "k") for _ in range(self.nk_ring)]
        self.kt = [[self.alloc([T, nd * fk * T], SRAM, "kT") for _ in range(nkb)] for _ in range(p.sets)]
        if gv > 1:
            self.vaug = None
        elif p.v_paired:
            self.vaug = [[self.alloc([T, fk * p.Dv], SRAM, "v") for _ in range(nkb)]
                         for _ in range(p.sets)]
        else:
            width = p.Dv + (1 if p.rowsum_fused else 0)
            self.vaug = [[self.alloc([T, width], SRAM, "v") for _ in range(nkt)]
                         for _ in range(p.sets)]
        self.nq_ring = 0 if gq > 1 else min(p.qseq.blocks, self.queues)
        self.qnat = [self.alloc([T, fq * p.D], SRAM, "q") for _ in range(self.nq_ring)]
        self.qt = [self.alloc([T, nd * T], SRAM, "qT") for _ in range(NQ)]
        self.negm = [self.alloc([1, T], SRAM, "negm") for _ in range(NQ)] if p.fold_row is None else None
        nch = -(-nkt // p.W1)
        self.mpart = [self.alloc([T, nch], SRAM, "mpart", f32) for _ in range(NQ)]
        self.mcol = [self.alloc([T, 1], SRAM, "m") for _ in range(NQ)]
        self.mrow = ([self.alloc([T, p.S], SRAM, "mask") for _ in range(NQ)]
                     if p.has_mask else None)
        self.pt = [self.alloc([T, p.G * T], SRAM, "pT") for _ in range(N2)]
        self.obuf = [] if go > 1 else [self.alloc([T, fq * p.Dv], SRAM, "out") for _ in range(2)]
        self.sm = [self.alloc([T, p.W1 * T], SRAM, "s_m") for _ in range(p.na1)] if p.tmode else []
        self.acc_tr = [self.alloc([T, nd * fk * T], ACC, "acc_kT", f32) for _ in range(p.ntr)]
        self.acc_q = [self.alloc([T, nd * T], ACC, "acc_qT", f32) for _ in range(2)]
        self.acc1 = [self.alloc([T, p.W1 * T], ACC, "acc_s", f32) for _ in range(p.na1)]
        self.acc_m = self.alloc([T, T], ACC, "acc_m", f32)
        self.acc2 = [self.alloc([T, p.G * T], ACC, "acc_sT", f32) for _ in range(p.n2)]
        self.acco = [self.alloc([T, p.Dv + 1], ACC, "acc_o", f32) for _ in range(NO)]
        # ones: the fold row of every K^T buffer, the ones column of every V_aug tile
        # (vector copies from the ones tile, once; the loads never touch them)
        if p.fold_row is not None:
            r, w = p.fold_row, fk * T
            for s in range(p.sets):
                for buf in self.kt[s]:
                    for c0 in range(0, w, T):
                        kb.add(tile.UnaryOp("copy", self.win(self.ones, r, 0, [1, T]),
                                            self.win(buf, r, (nd - 1) * w + c0, [1, T]), c(1), c(T)))
                        vec += self.tm.vec("unary", "copy", 1, T)
                        pre_copy(self.ones, buf, 1, T)
                    ready[self.name(buf)] = vec
        if p.rowsum_fused:  # (V per head: never grouped)
            for s in range(p.sets):
                for buf in self.vaug[s]:
                    kb.add(tile.UnaryOp("copy", self.win(self.ones, 0, 0, [T, 1]), self.win(buf, 0, p.Dv, [T, 1]),
                                        c(T), c(1)))
                    vec += self.tm.vec("unary", "copy", T, 1)
                    pre_copy(self.ones, buf, T, 1)
                    ready[self.name(buf)] = vec
        self.init["vec"] = vec
        self._win.clear()
        # loops: outer batch dims, then the last batch dim in bodies of U heads
        self.estimate = 0.0
        if not p.batch:
            self.body([[]])
        else:
            self._outer(list(p.batch[:-1]), [])
        if self.dry:
            return self.estimate
        self.lw.launch(kb, self.hbm_args)
        return self.estimate

    def _outer(self, extents, ivs) -> None:
        kb, p = self.kb, self.p
        H, U = p.batch[-1], self.U
        trips = H // U  # U divides H
        if self.dry:  # the schedule of the body, times its repetitions
            outer = int(np.prod(extents)) if extents else 1
            self.estimate = self.body([[None] * len(p.batch)] * U) * trips * outer
            return
        if extents:
            with kb.loop(extents[0]) as i:
                self._outer(extents[1:], [*ivs, i])
            return
        with kb.loop(trips) as it:
            base = kb.muli(it, kb.const(U)) if trips > 1 else kb.const(0)
            hg = p.heads  # grouped tensors: head group it * U / hg + u // hg
            gbase = (kb.muli(it, kb.const(U // hg)) if trips > 1 else kb.const(0)) if hg > 1 else None
            span = self.body([[*ivs, (base, u, gbase)] for u in range(U)])
        self.estimate = span * trips * int(np.prod(p.batch[:-1], dtype=np.int64))

    def _index(self, bidx, arg: SSAValue, group: int = 1) -> Callable[[], list[SSAValue]]:
        """The leading (batch) indices of kernel argument `arg` for batch index `bidx`
        (operand dims aligned right; a size-1 dim broadcasts). `group`: heads per index
        of the argument's last batch dim (a head-grouped view)."""
        p, kb = self.p, self.kb
        shape = _shape(arg.type)
        nb, nbo = len(p.batch), len(shape) - 2

        def idx() -> list[SSAValue]:
            out = []
            for e in range(nbo):
                d = e + nb - nbo
                if shape[e] == 1 and p.batch[d] != 1:
                    out.append(kb.const(0))
                    continue
                x = bidx[d]
                if isinstance(x, tuple):
                    base, u, gbase = x
                    if group > 1:
                        base, u = gbase, u // group
                    x = kb.addi(base, kb.const(u)) if u else base
                out.append(x)
            return out

        return idx

    def _kv_shared(self) -> bool:
        """K and V do not depend on the last batch index (broadcast over heads; a
        head-grouped view's unit head dim is a group of heads)."""
        if self.p.grp[1] > 1 or self.p.grp[2] > 1:
            return False
        for a in (self.a_k, self.a_v):
            sh = _shape(a.type)
            nbo = len(sh) - 2
            if self.p.batch and nbo >= 1 and sh[nbo - 1] != 1:  # aligned with the last batch dim
                return False
        return True

    # -- one scheduled body: the heads `heads` (batch index values) --------------------------
    def body(self, heads: list[list]) -> float:
        p = self.p
        ops: list[_Op] = []
        ring = {"k": 0, "q": 0, "qt": 0, "s1": 0, "s2": 0, "pt": 0, "tr": 0, "sm": 0, "o": 0}
        shared = self._kv_shared() and len(heads) > 1
        for u, bidx in enumerate(heads):
            s = 0 if shared else u % p.sets
            # the head's place in its group (grouped loads: the group's first head loads
            # for all, the last stores the group's output) and the group's buffer set
            self._j, self._gs = u % p.heads, (u // p.heads) % self.gsets
            if not shared or u == 0:
                self._prep_kv(ops, u, bidx, s, ring)
            qidx = self._index(bidx, self.a_q, p.grp[0])
            for bq in self.qblocks:
                self._last_block = u == len(heads) - 1 and bq == self.qblocks[-1]
                self._q_block(ops, u, bidx, s, bq, qidx, ring)
        # a dry run compares tilings: the unperturbed priorities suffice for that
        order, span = _schedule(ops, self.tm, self.queues, self.init, 0 if self.dry else SCHEDULE_TRIES)
        for o, q in order:
            if o.kind == "load":
                self.qmap.setdefault(o.writes[0], q)
        self.init = {"qmap": self.qmap}  # later bodies follow a loop or another body
        if not p.batch:
            self.estimate = span
        if self.dry:
            return span
        for o, q in order:
            o.emit(q)
        self._win.clear()
        return span

    def _prep_kv(self, ops, u, bidx, s, ring) -> None:
        """K blocks: load, transpose every tile and chunk, copy into K^T; V blocks / tiles."""
        p, T, kc = self.p, self.p.T, self.kb.const
        fk = p.kseq.f
        _, gk, gv, _ = p.grp
        j, gs = self._j, self._gs
        kidx, vidx = self._index(bidx, self.a_k, gk), self._index(bidx, self.a_v, gv)
        krank, vrank = len(_shape(self.a_k.type)), len(_shape(self.a_v.type))
        for bk in self.kblocks:
            rk = p.kseq.rows(bk)
            pr = (u, -1, bk)
            acc = self.acc_tr[ring["tr"] % p.ntr]
            ring["tr"] += 1
            if gk > 1:  # the group's block: head j's columns
                kn, col0 = self.kgrp[gs][bk], j * p.D
                if j == 0:
                    self._load(ops, self.a_k, lambda bk=bk: [*kidx(), kc(bk * T), kc(0)], kn, (0, 0), rk,
                               gk * p.D, krank - 2, krank - 1, pr)
            else:
                kn, col0 = self.knat[ring["k"] % self.nk_ring], 0
                ring["k"] += 1
                self._load(ops, self.a_k, lambda bk=bk: [*kidx(), kc(bk * T), kc(0)], kn, (0, 0), rk, fk * p.D,
                           krank - 2, krank - 1, pr)
            for tk in range(fk):
                for ci, (d0, dc) in enumerate(p.chunks):
                    self._mm(ops, kn, (0, col0 + tk * p.D + d0), self.ident, (0, 0), acc,
                             (0, (ci * fk + tk) * T), dc, rk, rk, False, pr)
            for ci, (d0, dc) in enumerate(p.chunks):
                if rk == T:  # the block's tiles side by side: one copy per chunk
                    self._vec(ops, "unary", "copy", acc, (0, ci * fk * T), self.kt[s][bk], (0, ci * fk * T),
                              dc, fk * T, pr)
                else:
                    for tk in range(fk):
                        col = (ci * fk + tk) * T
                        self._vec(ops, "unary", "copy", acc, (0, col), self.kt[s][bk], (0, col), dc, rk, pr)
            if gv > 1:
                if j == 0:
                    self._load(ops, self.a_v, lambda bk=bk: [*vidx(), kc(bk * T), kc(0)], self.vgrp[gs][bk],
                               (0, 0), rk, gv * p.Dv, vrank - 2, vrank - 1, pr)
            elif p.v_paired:
                self._load(ops, self.a_v, lambda bk=bk: [*vidx(), kc(bk * T), kc(0)], self.vaug[s][bk], (0, 0),
                           rk, fk * p.Dv, vrank - 2, vrank - 1, pr)
            else:
                for tk in range(fk):
                    row0 = fk * bk * T + tk
                    self._load(ops, self.a_v, lambda row0=row0: [*vidx(), kc(row0), kc(0)],
                               self.vaug[s][bk * fk + tk], (0, 0), rk, p.Dv, vrank - 2, vrank - 1, pr,
                               row_step=fk)

    def _kt(self, s, k):
        """(K^T buffer, column of chunk 0) of key tile k; chunk ci is ci * f * T further."""
        fk = self.p.kseq.f
        return self.kt[s][k // fk], (k % fk) * self.p.T

    def _v(self, s, k):
        """(V_aug buffer, column of its first value) of key tile k (of the current head)."""
        p = self.p
        if p.grp[2] > 1:
            return self.vgrp[self._gs][k], self._j * p.Dv
        if p.v_paired:
            return self.vaug[s][k // p.kseq.f], (k % p.kseq.f) * p.Dv
        return self.vaug[s][k], 0

    def _transposed_chunks(self, chunks1: list[list], qs: int, last: bool = False) -> int:
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
        v = cfg.vector
        nd, pv = len(p.chunks), len(p.vchunks) + (0 if p.rowsum_fused else 1)
        mmc = max(tm.preload, tm.mm(p.T, p.T, p.T, self.fp32), cfg.matrix.min_interval_cycles)
        over = v.latency_cycles + v.access_cycles
        fold = 0 if p.fold_row is not None else 1

        def cost(n_t: int) -> tuple[float, float]:
            mm = vec = 0.0
            tiles = [km for ch in chunks1 for km in ch]
            t_set = {km[0] for ch in chunks1[len(chunks1) - n_t:] for km in ch} if n_t else set()
            for k, mid in tiles:
                el = math.ceil(p.ks(k) * qs / v.lanes)
                masked = (mid is not None) + p.has_mask
                vec += el * (v.op_cost.reduce["max"] + v.op_cost.unary["exp"]) + over / p.G + over / p.W1
                if k in t_set:
                    mm += mmc * (nd + 1 + pv + masked)
                    vec += el * v.op_cost.binary["sub"] + over / p.W1
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

    def _groups(self, keys: list) -> list[list]:
        """Consecutive key tiles of equal size, at most G per group (one exp each)."""
        groups: list[list] = []
        for km in keys:
            if groups and len(groups[-1]) < self.p.G and self.p.ks(groups[-1][-1][0]) == self.p.ks(km[0]):
                groups[-1].append(km)
            else:
                groups.append([km])
        return groups

    def _q_block(self, ops, u, bidx, s, bq, qidx, ring) -> None:
        p, T, kc = self.p, self.p.T, self.kb.const
        fq = p.qseq.f
        rq = p.qseq.rows(bq)
        gq, _, _, go = p.grp
        j, gs, bi = self._j, self._gs, bq - self.qblocks.start
        qrank = len(_shape(self.a_q.type))
        if gq > 1:  # the group's block: head j's columns
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
            ob, ocol = self.ogrp[gs][bi], j * p.Dv
        else:
            ob, ocol = self.obuf[ring["o"] % 2], 0
            ring["o"] += 1
        for tq in range(fq):
            self._last_tile = self._last_block and tq == fq - 1
            self._q_tile(ops, u, bidx, s, bq, tq, qn, qcol, ob, ocol, ring)
        oidx = self._index(bidx, self.a_out, go)
        if go == 1 or j == go - 1:  # a grouped output block: once the group's last head wrote it
            self._store(ops, ob, self.a_out, lambda: [*oidx(), kc(bq * T), kc(0)], rq, go * fq * p.Dv,
                        (u, bq * fq, 9))

    def _q_tile(self, ops, u, bidx, s, bq, tq, qn, qcol, ob, ocol, ring) -> None:
        p, T, kc = self.p, self.p.T, self.kb.const
        fq, fk, nd = p.qseq.f, p.kseq.f, len(p.chunks)
        qi = bq * fq + tq  # q-tile index
        qs = p.qseq.rows(bq)
        r = ring["qt"] % NQ
        ring["qt"] += 1
        qt, mcol, mpart = self.qt[r], self.mcol[r], self.mpart[r]
        acco = self.acco[(ring["qt"] - 1) % NO]
        pr = (u, qi, 1)
        # Q^T: transpose (identity matmul), scale on the accumulator copy (fp32, one rounding)
        accq = self.acc_q[ring["q"] % 2]
        for ci, (d0, dc) in enumerate(p.chunks):
            self._mm(ops, qn, (0, qcol + tq * p.D + d0), self.ident, (0, 0), accq, (0, ci * T), dc, qs, qs, False,
                     pr)
        for ci, (d0, dc) in enumerate(p.chunks):
            self._vec(ops, "scalar", "mul", accq, (0, ci * T), qt, (0, ci * T), dc, qs, pr, imm=self.scale)
        mrow = None
        if p.has_mask:
            mrow = self.mrow[r]
            msh = _shape(self.a_mask.type)
            midx = self._index(bidx, self.a_mask)
            mrank = len(msh)
            row_dim = mrank - 2 if msh[-2] != 1 or p.L == 1 else -1
            col_dim = mrank - 1 if msh[-1] != 1 or p.S == 1 else -1
            row0 = fq * bq * T + tq if row_dim >= 0 else 0
            self._load(ops, self.a_mask, lambda: [*midx(), kc(row0), kc(0)], mrow, (0, 0), qs, p.S,
                       row_dim, col_dim, pr, row_step=fq if row_dim >= 0 else 1)
            # -inf (a float mask may hold it) becomes the lowest finite value: the mask is
            # added by a matmul with an identity, whose zeros times -inf would be NaN
            self._vec(ops, "scalar", "max", mrow, (0, 0), mrow, (0, 0), qs, p.S, pr, imm=self.lowest)
        keys = p.pairs[qi]
        # pass 1: row max of S = Q K^T; the last chunks stay in the accumulator when they
        # are computed in transposed mode
        pr = (u, qi, 2)
        chunks1 = [keys[x:x + p.W1] for x in range(0, len(keys), p.W1)]
        n_t = self._transposed_chunks(chunks1, qs, last=self._last_tile)
        held: list[tuple[list, SSAValue]] = []
        for w, ch in enumerate(chunks1):
            acc = self.acc1[ring["s1"] % p.na1]
            ring["s1"] += 1
            if w >= len(chunks1) - n_t:
                held.append((ch, acc))
            off = 0
            for k, mid in ch:
                ks = p.ks(k)
                ktb, kcol = self._kt(s, k)
                for ci, (d0, dc) in enumerate(p.chunks):
                    self._mm(ops, qt, (0, ci * T), ktb, (0, ci * fk * T + kcol), acc, (0, off), qs, dc, ks, ci > 0,
                             pr)
                if mid is not None:
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
        pr = (u, qi, 3)
        # transposed mode: S - m (column operand) into SRAM, in the model dtype
        tmode: dict[int, tuple[SSAValue, int]] = {}  # key tile -> (S - m buffer, column)
        for ch, acc in held:
            sm = self.sm[ring["sm"] % len(self.sm)]
            ring["sm"] += 1
            width = sum(p.ks(k) for k, _ in ch)
            self._vec(ops, "column", "sub", acc, (0, 0), sm, (0, 0), qs, width, pr, col=(mcol, (0, 0)))
            off = 0
            for k, _ in ch:
                tmode[k] = (sm, off)
                off += p.ks(k)
        normal = [(k, mid) for k, mid in keys if k not in tmode]
        if normal:
            # -m as a row: transpose (M = 1) at the fold row's partition, negate into Q^T / negm
            fr = p.fold_row if p.fold_row is not None else 0
            self._mm(ops, mcol, (0, 0), self.ident, (0, 0), self.acc_m, (fr, 0), 1, qs, qs, False, pr)
            if p.fold_row is not None:
                self._vec(ops, "scalar", "mul", self.acc_m, (fr, 0), qt, (fr, (nd - 1) * T), 1, qs, pr, imm=-1.0)
            else:
                self._vec(ops, "scalar", "mul", self.acc_m, (0, 0), self.negm[r], (0, 0), 1, qs, pr, imm=-1.0)
        # pass 2: P^T = exp(S^T - m), O_aug += P^T^T V_aug; transposed-mode tiles first (their
        # pass-1 accumulators are then free for the next q-tile)
        pr = (u, qi, 4)
        first = True
        for grp in self._groups([km for ch, _ in held for km in ch]) + self._groups(normal):
            pt = self.pt[ring["pt"] % len(self.pt)]
            ring["pt"] += 1
            acc = self.acc2[ring["s2"] % p.n2]
            ring["s2"] += 1
            ks = p.ks(grp[0][0])
            for jj, (k, mid) in enumerate(grp):
                slot = (0, jj * qs)
                if k in tmode:
                    sm, col = tmode[k]
                    self._mm(ops, sm, (0, col), self.ident, (0, 0), acc, slot, ks, qs, qs, False, pr)
                    continue
                ktb, kcol = self._kt(s, k)
                for ci, (d0, dc) in enumerate(p.chunks):
                    kk = dc + (1 if p.fold_row is not None and ci == nd - 1 else 0)
                    self._mm(ops, ktb, (0, ci * fk * T + kcol), qt, (0, ci * T), acc, slot, ks, kk, qs, ci > 0, pr)
                if p.fold_row is None:
                    self._mm(ops, self.ones, (0, 0), self.negm[r], (0, 0), acc, slot, ks, 1, qs, True, pr)
                if mid is not None:
                    self._mm(ops, self.masks, (0, mid * T), self.ident, (0, 0), acc, slot, ks, qs, qs, True, pr)
                if mrow is not None:
                    self._mm(ops, mrow, (0, k * T), self.ident, (0, 0), acc, slot, ks, qs, qs, True, pr)
            width = len(grp) * qs
            self._vec(ops, "unary", "exp", acc, (0, 0), pt, (0, 0), ks, width, pr)
            for jj, (k, _) in enumerate(grp):
                va, vcol = self._v(s, k)
                for e0, ne in p.vchunks:
                    self._mm(ops, pt, (0, jj * qs), va, (0, vcol + e0), acco, (0, e0), qs, ks, ne, not first, pr)
                if not p.rowsum_fused:
                    self._mm(ops, pt, (0, jj * qs), self.ones, (0, 0), acco, (0, p.Dv), qs, ks, 1, not first, pr)
                first = False
        # O = O_aug[:, :Dv] / O_aug[:, Dv] into the q-block's output tile: a column divide,
        # or a reciprocal of the column and a multiply where that is cheaper
        pr = (u, qi, 5)
        tm = self.tm
        if (tm.vec("unary", "reciprocal", qs, 1) + tm.vec("binary", "mul", qs, p.Dv)
                < tm.vec("binary", "div", qs, p.Dv)):
            self._vec(ops, "unary", "reciprocal", acco, (0, p.Dv), acco, (0, p.Dv), qs, 1, pr)
            self._vec(ops, "column", "mul", acco, (0, 0), ob, (0, ocol + tq * p.Dv), qs, p.Dv, pr,
                      col=(acco, (0, p.Dv)))
        else:
            self._vec(ops, "column", "div", acco, (0, 0), ob, (0, ocol + tq * p.Dv), qs, p.Dv, pr,
                      col=(acco, (0, p.Dv)))


__all__ = ["lower_attention", "lower_attention_kernel"]
