"""The -O2 attention kernel: ``graph.sdpa`` as one flash-attention kernel.

At ``-O0`` (and wherever this kernel does not apply, see the end) sdpa is the
decomposition of `lower_index.lower_sdpa`: one kernel per graph op, every score matrix
round-tripping HBM. Here the whole attention is one kernel; scores never leave the chip.

Layout (the *transposed-scores* formulation). The matrix engine computes
``acc[M x N] (+)= lhsT[K x M]^T @ rhs[K x N]`` (K on partitions for both operands); the
vector engine works lane-aligned and reduces along the free dimension only. Tiles are
``T = min(partitions, array rows, array cols, accumulator partitions)`` queries or keys.

Per (batch, head):

- K tiles load in their natural layout (``[keys x D]``, long rows) and are transposed on
  the matrix engine (a matmul with an identity) into resident ``K^T`` buffers (D on
  partitions, one buffer per group of key tiles so later tiles do not hold up earlier
  q-blocks); V tiles load naturally into resident ``V_aug`` buffers ``[keys x Dv (+1)]``
  whose extra column is all ones. K^T/V sets are double-buffered across heads.
- Per q-block of T queries: Q loads naturally, is transposed (identity matmul) and the
  accumulator copy multiplies by `scale` (fp32, one rounding) into ``Q^T``.
- Pass 1 (queries on partitions): ``S = Q K^T`` for up to W1 key tiles side by side in
  the accumulator (one matmul per key tile and D chunk), one vector max-reduce per
  chunk, partial maxes reduced to the row max ``m`` (a column).
- ``m`` is transposed into a row (matmul with M = 1 against an identity, landing at the
  accumulator partition of the fold row) and copied, negated, into the fold row of
  ``Q^T`` (row D, when D is not a multiple of T) or into a separate ``-m`` row.
- Pass 2 (keys on partitions): ``S^T - m = K^T_aug^T @ Q^T_aug`` (the ones row of K^T
  times the ``-m`` row folds the max subtraction into the matmul; when D is a multiple
  of T the fold is one extra matmul with K = 1), G key tiles side by side, then one
  vector ``exp`` straight from the accumulator into SRAM: ``P^T`` (model dtype), which
  is already the lhsT layout of ``O_aug[q x Dv+1] += P^T^T @ V_aug`` (accumulated over
  key tiles; column Dv is the softmax denominator; when Dv is a multiple of the array
  columns the row sum is one extra matmul with N = 1).
- ``O = O_aug[:, :Dv] / O_aug[:, Dv]`` (a column divide) and a store.

Masks: `is_causal` (torch's top-left aligned ``tril(ones(L, S))``) skips key tiles above
the diagonal entirely; the diagonal tile adds a constant ``[T x T]`` tile of 0 / the
dtype's most negative finite value through one more matmul in each pass
(``acc += I^T @ Mask`` in pass 1, ``acc += Mask^T @ I`` in pass 2, so both passes read
the mask in its natural q-major layout). An additive `mask` (any broadcast over batch,
heads, rows or columns) loads one ``[T x S]`` row block per q-block and is added the
same way on every key tile.

Vector work per key tile: one exp (cost 2 per score) and one max reduce (1 per score),
each instruction 4 (exp) or up to 8 (max) key tiles wide so the per-instruction
overhead is amortised. Matrix work per key tile: pass 1, pass 2 and PV, one matmul each
per D / Dv chunk, plus the fold and the row-sum matmuls when D / Dv are multiples of
the array size (``cloud``, D = 128: 5 matmuls of ~128 cycles per 128 x 128 key tile).

Scheduling: the kernel body (one or more heads) is first written as a plain sequential
program whose buffers rotate (double-buffered accumulators, ``P^T``, ``Q^T`` ...); a list
scheduler then reorders it into the order each engine's queue runs: an instruction may
move ahead of any other it shares no buffer with (the same rule `npu-insert-sync`
derives semaphores from), and instructions are issued in the order of their estimated
start on a model of the engines (the simulator's timing formulas), the earliest first,
ties by position (head, q-block, phase). So the pass-1 matmuls of q-block i+1 fill the
matrix engine while the vector engine runs the exps of q-block i, loads run ahead into
free buffers, and the DMA queue of each load is the one free first.

Falls back to the decomposition (returns False) when a dimension is zero, or when the
resident K^T / V_aug of one head, the mask row block and the working buffers do not fit
SRAM or the accumulator (very long sequences or very large head dims on a small
target); every float dtype, any L, S, D, Dv, any batch / head broadcasting of q, k, v
and any additive mask broadcast are handled by the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float32Type,
    IntegerAttr,
    TensorType,
    f32,
    i1,
)
from xdsl.ir import Attribute, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.passes.kernel_builder import KernelBuilder
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.machine import matmul_mapping

ALIGN = 64
G_EXP = 4  # key tiles per pass-2 group (one exp instruction)
W_MAX = 8  # key tiles per pass-1 chunk (one max-reduce instruction)
NQ = 2  # q-block ring: Q^T, max, O_aug, output
N2 = 3  # pass-2 ring: S^T accumulators, P^T
MAX_BODY_TILES = 192  # key tiles of one scheduled body (heads per loop iteration)
_DEBUG = bool(__import__('os').environ.get('TILECC_ATTN_DEBUG'))
_PLAN: list = []  # debug: (kind, planned start, planned end) of the issued ops


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
    from tilecc.passes.lower_index import lower_sdpa

    if not (lw.opt_level >= 2 and lower_attention_kernel(lw, op, loc)):
        lower_sdpa(lw, op, loc)


# ---------------------------------------------------------------------------------------
# shapes and the plan
# ---------------------------------------------------------------------------------------


@dataclass
class _Plan:
    T: int
    L: int
    S: int
    D: int
    Dv: int
    batch: tuple[int, ...]
    nq: int
    nkt: int
    chunks: list[tuple[int, int]]  # contraction chunks of D: (first, size)
    fold_row: int | None  # row of the -m / ones fold inside the last chunk (None: separate)
    vchunks: list[tuple[int, int]]  # N chunks of O_aug (the ones column included if fused)
    rowsum_fused: bool  # the ones column of V_aug sits in the last N chunk
    Wv: int  # V_aug columns per key tile
    G: int  # key tiles per pass-2 group
    W1: int  # key tiles per pass-1 chunk
    Gt: int  # key tiles per K^T buffer (one transpose copy)
    sets: int  # K^T / V_aug sets (double buffering across heads)
    U: int  # heads per scheduled body
    causal: bool
    has_mask: bool
    na1: int = 2  # pass-1 accumulators (a transposed-mode chunk holds one until its subtract)
    tfrac: float = 0.0  # share of key tiles in transposed mode (see _transposed_share)

    def ks(self, j: int) -> int:
        return min(self.T, self.S - j * self.T)

    def qs(self, i: int) -> int:
        return min(self.T, self.L - i * self.T)

    def key_tiles(self, i: int) -> list[int]:
        if not self.causal:
            return list(range(self.nkt))
        # top-left aligned: query q sees keys k <= q; the block's last query is
        # i*T + qs - 1, in key tile i (tiles are T wide on both sides)
        return list(range(min(i, self.nkt - 1) + 1))

    def diagonal(self, i: int, j: int) -> bool:
        return self.causal and i == j and self.ks(j) > 1


def _sram_bytes(p: _Plan, isz: int) -> int:
    T, nd = p.T, len(p.chunks)
    ntg = -(-p.nkt // p.Gt)
    total = 3 * _align(T * isz) + _align(max(p.Gt * T, T) * isz)  # I, tri, ones (+slack)
    total += 8 * _align(p.D * isz)  # K natural ring (up to 2 per load queue)
    total += p.sets * ntg * _align(nd * p.Gt * T * isz)  # K^T
    total += p.sets * p.nkt * _align(p.Wv * isz)  # V_aug
    total += 4 * _align(p.D * isz)  # Q natural ring (up to 1 per load queue)
    total += NQ * (_align(nd * T * isz) + _align(T * isz) + _align(-(-p.nkt // p.W1) * 4) + _align(isz))
    if p.has_mask:
        total += NQ * _align(p.nkt * T * isz)
    total += N2 * _align(p.G * T * isz)  # P^T
    total += NQ * _align(p.Dv * isz)  # output tiles
    if p.tfrac:
        total += p.na1 * _align(p.W1 * T * isz)  # S - m of transposed-mode chunks
    return total


def _acc_bytes(p: _Plan) -> int:
    T, nd = p.T, len(p.chunks)
    return (2 * _align(nd * p.Gt * T * 4) + 2 * _align(nd * T * 4) + p.na1 * _align(p.W1 * T * 4)
            + _align(T * 4) + N2 * _align(p.G * T * 4) + NQ * _align((p.Dv + 1) * 4))


def _plan(cfg: HardwareConfig, q_shape, k_shape, v_shape, out_shape, causal: bool, has_mask: bool,
          elem: Attribute) -> _Plan | None:
    L, D = q_shape[-2:]
    S, Dv = k_shape[-2], v_shape[-1]
    batch = tuple(out_shape[:-2])
    if min(L, S, D, Dv, *batch, 1) <= 0:
        return None
    T = min(cfg.sram.partitions, cfg.matrix.rows, cfg.matrix.cols, cfg.accumulator.partitions)
    chunks = [(d0, min(T, D - d0)) for d0 in range(0, D, T)]
    fold_row = D % T if D % T else None
    C = cfg.matrix.cols
    rowsum_fused = Dv % C != 0
    width = Dv + 1 if rowsum_fused else Dv
    vchunks = [(c0, min(C, width - c0)) for c0 in range(0, width, C)]
    nkt, nq = -(-S // T), -(-L // T)
    heads = batch[-1] if batch else 1
    per_head = sum(min(i, nkt - 1) + 1 if causal else nkt for i in range(nq))
    U = max(1, min(heads, MAX_BODY_TILES // max(per_head, 1)))
    if 1 < U < heads and U % 2:
        U -= 1  # an even body keeps the K^T / V_aug set parity across loop iterations
    isz = _isz(elem)
    for G, W1, Gt, sets, na1 in _candidates(nkt):
        p = _Plan(T, L, S, D, Dv, batch, nq, nkt, chunks, fold_row, vchunks, rowsum_fused,
                  width, G, W1, Gt, sets, U, causal, has_mask, na1)
        if na1 > 2:
            p.tfrac = _transposed_share(cfg, p, elem)
            if not p.tfrac:
                continue
        if (_sram_bytes(p, isz) <= cfg.sram.bytes_per_partition
                and _acc_bytes(p) <= cfg.accumulator.bytes_per_partition):
            return p
    return None


def _transposed_share(cfg: HardwareConfig, p: _Plan, elem: Attribute) -> float:
    """The share of key tiles to compute in *transposed mode*, balancing the engines.

    Normal mode recomputes ``S^T - m`` in pass 2 (the fold costs one more matmul per key
    tile when D is a multiple of T). Transposed mode keeps pass 1's ``S`` in the
    accumulator, subtracts ``m`` on the vector engine (a column operand, into SRAM in
    the model dtype) and transposes it on the matrix engine: one matmul fewer, one
    vector element-op per score more. Only for bf16 (fp16's range would overflow the
    masked scores of ``S - m`` to -inf, an fp32 transpose is 4 passes) and a separate
    fold (otherwise the fold is free)."""
    if not isinstance(elem, BFloat16Type) or p.fold_row is not None:
        return 0.0
    tm = _Timing(cfg)
    T, nd = p.T, len(p.chunks)
    mm = max(tm.preload, tm.mm(T, T, T, False), cfg.matrix.min_interval_cycles)
    pv = len(p.vchunks) + (0 if p.rowsum_fused else 1)
    mm_n, mm_t = (2 * nd + 1 + pv) * mm, (nd + 1 + pv) * mm
    v = cfg.vector
    over = v.latency_cycles + v.access_cycles
    elems = T * T / v.lanes
    vec_n = elems * (v.op_cost.reduce["max"] + v.op_cost.unary["exp"]) + over / p.W1 + over / p.G
    vec_t = vec_n + elems * v.op_cost.binary["sub"] + over / p.W1
    if mm_n <= vec_n:
        return 0.0
    return min(1.0, (mm_n - vec_n) / ((mm_n - mm_t) + (vec_t - vec_n)))


def _candidates(nkt: int):
    """(G, W1, Gt, sets, na1) from the widest / most buffered down."""
    G = min(G_EXP, nkt)
    W1 = min(W_MAX, nkt)
    for sets in (2, 1):
        for g_, w1, gt in ((G, min(W1, 4), 1), (min(G, 2), min(W1, 2), 1), (1, 1, 1)):
            yield g_, w1, gt, sets, 3
            yield g_, w1, gt, sets, 2


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


class _Timing:
    """The simulator's timing formulas (machine._durations), for the schedule only."""

    def __init__(self, cfg: HardwareConfig):
        self.cfg = cfg
        mx = cfg.matrix
        self.preload = float(mx.rows) if mx.dataflow in ("ws", "is") else 0.0
        self.drain = float(mx.rows + mx.cols - 2)
        self.pipelined = mx.mode == "pipelined"

    def mm(self, m: int, k: int, n: int, fp32: bool) -> float:
        _, _, t = matmul_mapping(self.cfg, m, k, n)
        return float(t * (self.cfg.matrix.fp32_slowdown if fp32 else 1))

    def vec(self, kind: str, fn: str, rows: int, cols: int, inputs: int = 1) -> float:
        v = self.cfg.vector
        cost = getattr(v.op_cost, kind)[fn]
        return v.latency_cycles + v.access_cycles + math.ceil(rows * cols / v.lanes) * cost * inputs

    def latency(self, o: _Op) -> float:
        """Cycles from an instruction's start to its result."""
        if o.kind == "mm":
            return self.preload + o.a + self.drain
        return o.a + o.b

    def dma(self, rows: int, cols: int, isz: int, contiguous: bool = True) -> tuple[float, float]:
        d, h = self.cfg.dma, self.cfg.hbm
        chunk = cols * isz if contiguous else isz
        desc = rows if contiguous else rows * cols
        eff = min(1.0, chunk / d.efficient_chunk_bytes)
        return d.latency_cycles + h.latency_cycles + desc * d.per_descriptor_cycles, rows * cols * isz / (h.bytes_per_cycle * eff)


def _schedule(ops: list[_Op], tm: _Timing, queues: int, init: dict | None = None) -> list[tuple[_Op, int | None]]:
    """A topological order of `ops` (dependences: shared buffers, in the given order) that
    issues each instruction at its earliest estimated start; each load's DMA queue.
    `init`: the engines' state after the kernel's prologue (``qfree``, ``vec``, and
    ``ready``: buffer -> when the prologue's last access to it ends)."""
    init = init or {}
    last_w: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    for i, o in enumerate(ops):
        o.idx = i
        deps: set[int] = set()
        for b in o.reads:
            if b in last_w:
                deps.add(last_w[b])
        for b in o.writes:
            if b in last_w:
                deps.add(last_w[b])
            deps.update(readers.get(b, ()))
        for b in o.reads:
            readers.setdefault(b, []).append(i)
        for b in o.writes:
            last_w[b] = i
            readers[b] = []
        deps.discard(i)
        o.deps = deps
    n = len(ops)
    succ: list[list[int]] = [[] for _ in range(n)]
    left = [0] * n
    for o in ops:
        left[o.idx] = len(o.deps)
        for d in o.deps:
            succ[d].append(o.idx)
    # priority: the longest latency path from an instruction to the end of the body
    # (critical path first; ties: earlier in the sequential order)
    lat = [tm.latency(o) for o in ops]
    level = [0.0] * n
    for i in range(n - 1, -1, -1):
        level[i] = lat[i] + max((level[x] for x in succ[i]), default=0.0)
    pro = init.get("ready", {})
    dep_ready = [max([pro.get(b, 0.0) for b in o.reads + o.writes], default=0.0) for o in ops]
    end = [0.0] * n
    # ready instructions per engine: DMA queues 0.., then matrix, vector
    MAT, VEC = queues, queues + 1
    ready: list[list[int]] = [[] for _ in range(queues + 2)]

    def engine(o: _Op) -> int:
        return o.queue if o.kind in ("load", "store") else MAT if o.kind == "mm" else VEC

    for i in range(n):
        if left[i] == 0:
            ready[engine(ops[i])].append(i)
    free = list(init.get("qfree", [0.0] * queues)) + [0.0, init.get("vec", 0.0)]
    stream_free = 0.0
    out: list[tuple[_Op, int | None]] = []
    while True:
        best = None  # (start, -level, index, engine)
        for e_, cands in enumerate(ready):
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
            # HBM is shared by the transfers in flight (processor sharing): this one's
            # transfer slows by the number of queues transferring when it starts
            busy = sum(1 for q in range(queues) if q != e_ and free[q] > t + o.a)
            e = free[e_] = t + o.a + o.b * (1 + busy)
        elif o.kind == "mm":
            if tm.pipelined:
                f = max(t + tm.preload, stream_free)
                free[MAT] = f
                stream_free = f + max(o.a, tm.cfg.matrix.min_interval_cycles)
                e = f + o.a + tm.drain
            else:
                e = free[MAT] = t + tm.preload + o.a + tm.drain
        else:
            e = free[VEC] = t + o.a
        end[i] = e
        if _DEBUG:
            _PLAN.append((o.kind, t, e, o.prio, o.reads, o.writes))
        ready[e_].remove(i)
        out.append((o, o.queue if o.kind == "load" else None))
        for x in succ[i]:
            left[x] -= 1
            if dep_ready[x] < e:
                dep_ready[x] = e
            if left[x] == 0:
                ready[engine(ops[x])].append(x)
    assert len(out) == n, "attention schedule: dependence cycle"
    if _DEBUG:
        print(f"attention schedule: {n} ops, planned end {max(end):,.0f}, engines free at "
              f"{[round(x) for x in free]}")
    return out


# ---------------------------------------------------------------------------------------
# the kernel
# ---------------------------------------------------------------------------------------


def lower_attention_kernel(lw, op, loc: str) -> bool:
    res = op.results[0]
    q_v, k_v, v_v = op.q, op.k, op.v
    elem = res.type.element_type
    q_shape, k_shape, v_shape = _shape(q_v.type), _shape(k_v.type), _shape(v_v.type)
    out_shape = _shape(res.type)
    has_mask = op.mask is not None
    plan = _plan(lw.cfg, q_shape, k_shape, v_shape, out_shape, op.is_causal, has_mask, elem)
    if plan is None:
        return False
    args = [lw.materialise(v) for v in (q_v, k_v, v_v)]
    if has_mask:
        m = lw.materialise(op.mask)
        ms = _shape(m.type)
        args.append(lw.view(m, (1,) * (2 - len(ms)) + ms) if len(ms) < 2 else m)
    out = lw.hbm(out_shape, elem)
    dt = g.element_dtype(res.type)
    _Kernel(lw, plan, elem, float(op.scale.value.data), dt, args, out, loc).build()
    lw.values[res] = out
    return True


class _Kernel:
    def __init__(self, lw, p: _Plan, elem, scale: float, dt, args, out, loc):
        self.lw, self.p, self.elem, self.scale, self.loc = lw, p, elem, scale, loc
        self.cfg: HardwareConfig = lw.cfg
        self.isz = _isz(elem)
        self.fp32 = isinstance(elem, Float32Type)
        self.tm = _Timing(self.cfg)
        T = p.T
        from tilecc.passes.lower_index import masked_value

        ident = np.eye(T, dtype=np.float32)
        consts = [lw.hbm([T, T], elem, value=_dense(ident, elem))]
        if p.causal:
            tri = np.where(np.tril(np.ones((T, T), dtype=bool)), 0.0, masked_value(dt)).astype(np.float32)
            consts.append(lw.hbm([T, T], elem, value=_dense(tri, elem)))
        self.ones_w = max(p.Gt * T, T)
        self.hbm_args = list(args) + [out] + consts
        self.kb = KernelBuilder(lw.kernel_name("attention"), [a.type for a in self.hbm_args], loc)
        kb_args = self.kb.args
        self.a_q, self.a_k, self.a_v = kb_args[0], kb_args[1], kb_args[2]
        self.a_mask = kb_args[3] if p.has_mask else None
        base = 4 if p.has_mask else 3
        self.a_out = kb_args[base]
        self.a_ident = kb_args[base + 1]
        self.a_tri = kb_args[base + 2] if p.causal else None
        self.names: dict[SSAValue, str] = {}
        # every buffer DMA loads write has one queue (round robin over the load queues):
        # a buffer loaded from several queues would need a wait per queue
        Q = self.cfg.dma.queues
        self.load_queues = Q  # stores share the last queue: the schedule models them
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
        self.qmap[self.name(v)] = len(self.qmap) % self.load_queues
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
    def _mm(self, ops, lhsT, lr, lc, rhs, rr, rc, acc, ar, ac, m, k, n, accumulate, prio, ln, rn):
        """matmul of windows: lhsT[lr:lr+k, lc:lc+m], rhs[rr:.., rc:rc+n] into acc[ar.., ac..]."""
        tm, fp32 = self.tm, self.fp32 or _isz(lhsT.type.element_type) == 4

        def emit(_q):
            c = self.kb.const
            self.kb.add(tile.MatmulOp(self.win(lhsT, lr, lc, [ln[0], ln[1]]), self.win(rhs, rr, rc, [rn[0], rn[1]]),
                                      self.win(acc, ar, ac, [max(m, 1), n]) if (ar or ac) else acc,
                                      c(m), c(k), c(n), self.flag(accumulate)))

        ops.append(_Op("mm", emit, (self.name(lhsT), self.name(rhs), self.name(acc)), (self.name(acc),), prio,
                       tm.mm(m, k, n, fp32)))

    def _vec(self, ops, kind, fn, src, sr, sc, dst, dr, dc, rows, cols, prio, imm=None, col=None):
        def emit(_q):
            c = self.kb.const
            a = self.win(src, sr, sc, [rows, cols])
            o = self.win(dst, dr, dc, [rows, 1 if kind == "reduce" else cols])
            if kind == "unary":
                self.kb.add(tile.UnaryOp(fn, a, o, c(rows), c(cols)))
            elif kind == "scalar":
                self.kb.add(tile.ScalarOp(fn, a, imm, o, c(rows), c(cols)))
            elif kind == "reduce":
                self.kb.add(tile.ReduceOp(fn, a, o, c(rows), c(cols)))
            else:  # column binary
                cb, cr, cc = col
                self.kb.add(tile.BinaryOp(fn, a, self.win(cb, cr, cc, [rows, 1]), o, c(rows), c(cols), "column"))

        reads = [self.name(src)] + ([self.name(col[0])] if col is not None else [])
        cost_kind = {"unary": "unary", "scalar": "binary", "reduce": "reduce", "column": "binary"}[kind]
        ops.append(_Op("vec", emit, tuple(reads), (self.name(dst),), prio,
                       self.tm.vec(cost_kind, fn, rows, cols)))

    def _load(self, ops, arg, idx_fn, dst, dr, dc, rows, cols, row_dim, col_dim, prio):
        def emit(q):
            self.kb.add(tile.LoadOp(arg, idx_fn(), self.win(dst, dr, dc, [rows, cols]), self.kb.const(rows),
                                    self.kb.const(cols), row_dim, col_dim, queue=q))

        fixed, transfer = self.tm.dma(rows, cols, self.isz, col_dim >= 0)
        ops.append(_Op("load", emit, (), (self.name(dst),), prio, fixed, transfer, self.qmap[self.name(dst)]))

    def _store(self, ops, src, arg, idx_fn, rows, cols, row_dim, col_dim, prio):
        def emit(_q):
            self.kb.add(tile.StoreOp(src, arg, idx_fn(), self.kb.const(rows), self.kb.const(cols), row_dim, col_dim))

        fixed, transfer = self.tm.dma(rows, cols, self.isz)
        ops.append(_Op("store", emit, (self.name(src),), (), prio, fixed, transfer, self.cfg.dma.queues - 1))

    # -- the kernel ----------------------------------------------------------------------
    def build(self) -> None:
        p, kb, T = self.p, self.kb, self.p.T
        nd = len(p.chunks)
        ntg = -(-p.nkt // p.Gt)
        ACC, SRAM = tile.ACC, tile.SRAM
        c = kb.const
        # constants, loaded once, one per DMA queue; `init` models the prologue for the
        # schedule of the first body
        Q = self.cfg.dma.queues
        qfree = [0.0] * Q
        ready: dict[str, float] = {}
        self.init = {"qfree": qfree, "ready": ready}

        def const_load(arg, buf, rows, cols, row_dim):
            q = self.qmap[self.name(self.dma_target(buf))]
            kb.add(tile.LoadOp(arg, [c(0), c(0)], buf, c(rows), c(cols), row_dim, 1, queue=q))
            fixed, transfer = self.tm.dma(rows, cols, self.isz)
            qfree[q] += fixed + transfer
            ready[self.name(buf)] = qfree[q]

        self.ident = self.alloc([T, T], SRAM, "ident")
        const_load(self.a_ident, self.ident, T, T, 0)
        if p.causal:
            self.tri = self.alloc([T, T], SRAM, "causal")
            const_load(self.a_tri, self.tri, T, T, 0)
        # a ones tile: max(I, 1) on the vector engine, no DMA
        self.ones = self.alloc([T, self.ones_w], SRAM, "ones")
        for c0 in range(0, self.ones_w, T):
            w = min(T, self.ones_w - c0)
            kb.add(tile.ScalarOp("max", self.win(self.ident, 0, 0, [T, w]), 1.0, self.win(self.ones, 0, c0, [T, w]),
                                 c(T), c(w)))
        ready["ones"] = ready["ident"] + -(-self.ones_w // T) * self.tm.vec("binary", "max", T, T)
        self.nk_ring = min(p.nkt, 2 * self.load_queues)
        self.knat = [self.dma_target(self.alloc([T, p.D], SRAM, "k")) for _ in range(self.nk_ring)]
        self.kt = [[self.alloc([T, nd * p.Gt * T], SRAM, "kT") for _ in range(ntg)] for _ in range(p.sets)]
        self.vaug = [[self.dma_target(self.alloc([T, p.Wv], SRAM, "v")) for _ in range(p.nkt)] for _ in range(p.sets)]
        self.nq_ring = min(p.nq, self.load_queues)
        self.qnat = [self.dma_target(self.alloc([T, p.D], SRAM, "q")) for _ in range(self.nq_ring)]
        self.qt = [self.alloc([T, nd * T], SRAM, "qT") for _ in range(NQ)]
        self.negm = [self.alloc([1, T], SRAM, "negm") for _ in range(NQ)] if p.fold_row is None else None
        nch = -(-p.nkt // p.W1)
        self.mpart = [self.alloc([T, nch], SRAM, "mpart", f32) for _ in range(NQ)]
        self.mcol = [self.alloc([T, 1], SRAM, "m") for _ in range(NQ)]
        self.mrow = [self.dma_target(self.alloc([T, p.nkt * T], SRAM, "mask")) for _ in range(NQ)] if p.has_mask else None
        self.pt = [self.alloc([T, p.G * T], SRAM, "pT") for _ in range(N2)]
        self.obuf = [self.alloc([T, p.Dv], SRAM, "out") for _ in range(NQ)]
        self.acc_tr = [self.alloc([T, nd * p.Gt * T], ACC, "acc_kT", f32) for _ in range(2)]
        self.acc_q = [self.alloc([T, nd * T], ACC, "acc_qT", f32) for _ in range(2)]
        self.acc1 = [self.alloc([T, p.W1 * T], ACC, "acc_s", f32) for _ in range(p.na1)]
        self.sm = [self.alloc([T, p.W1 * T], SRAM, "s_m") for _ in range(p.na1)] if p.tfrac else []
        self.acc_m = self.alloc([T, T], ACC, "acc_m", f32)
        self.acc2 = [self.alloc([T, p.G * T], ACC, "acc_sT", f32) for _ in range(N2)]
        self.acco = [self.alloc([T, p.Dv + 1], ACC, "acc_o", f32) for _ in range(NQ)]
        # ones: the fold row of every K^T buffer, the ones column of every V_aug tile
        # (vector copies from the ones tile, once; the loads never touch them)
        vec = ready["ones"]
        if p.fold_row is not None:
            r, w = p.fold_row, p.Gt * T
            for s in range(p.sets):
                for buf in self.kt[s]:
                    vec += self.tm.vec("unary", "copy", 1, w)
                    ready[self.name(buf)] = vec
                    kb.add(tile.UnaryOp("copy", self.win(self.ones, r, 0, [1, w]), self.win(buf, r, (nd - 1) * w, [1, w]),
                                        c(1), c(w)))
        if p.rowsum_fused:
            for s in range(p.sets):
                for buf in self.vaug[s]:
                    vec += self.tm.vec("unary", "copy", T, 1)
                    ready[self.name(buf)] = vec
                    kb.add(tile.UnaryOp("copy", self.win(self.ones, 0, 0, [T, 1]), self.win(buf, 0, p.Dv, [T, 1]),
                                        c(T), c(1)))
        self.init["vec"] = vec
        self._win.clear()
        # loops: outer batch dims, then the last batch dim in bodies of U heads
        batch = list(p.batch)
        if not batch:
            self.body([[]])
        else:
            ivs: list[SSAValue] = []
            self._outer(batch[:-1], ivs)
        self.lw.launch(kb, self.hbm_args)

    def _outer(self, extents, ivs) -> None:
        kb, p = self.kb, self.p
        if extents:
            with kb.loop(extents[0]) as i:
                self._outer(extents[1:], [*ivs, i])
            return
        H, U = p.batch[-1], p.U
        trips, rest = divmod(H, U)
        if trips:
            with kb.loop(trips) as it:
                base = kb.muli(it, kb.const(U)) if trips > 1 else kb.const(0)
                self.body([[*ivs, (base, u)] for u in range(U)])
        if rest:
            self.body([[*ivs, (kb.const(trips * U), u)] for u in range(rest)])

    # -- one scheduled body: the heads `heads` (batch index values) --------------------------
    def _index(self, bidx, operand_shape) -> Callable[[], list[SSAValue]]:
        """Leading indices of an operand of shape `operand_shape` for batch index `bidx`
        (operand dims aligned right; a size-1 dim broadcasts)."""
        p = self.p
        nb = len(p.batch)
        nbo = len(operand_shape) - 2
        kb = self.kb

        def idx() -> list[SSAValue]:
            out = []
            for e in range(nbo):
                d = e + nb - nbo
                if operand_shape[e] == 1 and p.batch[d] != 1:
                    out.append(kb.const(0))
                else:
                    v = bidx[d]
                    if isinstance(v, tuple):
                        base, u = v
                        v = kb.addi(base, kb.const(u)) if u else base
                    out.append(v)
            return out

        return idx

    def _kv_shared(self) -> bool:
        """K and V do not depend on the last batch index (broadcast over heads)."""
        p = self.p
        for a in (self.a_k, self.a_v):
            sh = _shape(a.type)
            nbo = len(sh) - 2
            if p.batch and nbo >= 1 and sh[nbo - 1] != 1:  # the dim aligned with the last batch dim
                return False
        return True

    def body(self, heads: list[list]) -> None:
        p, T = self.p, self.p.T
        nd = len(p.chunks)
        ops: list[_Op] = []
        ring = {"k": 0, "q": 0, "blk": 0, "s1": 0, "s2": 0, "pt": 0, "tr": 0, "sm": 0}
        shared = self._kv_shared() and len(heads) > 1
        for u, bidx in enumerate(heads):
            s = (u if not shared else 0) % p.sets
            if not shared or u == 0:
                self._prep_kv(ops, u, bidx, s, ring)
            for i in range(p.nq):
                self._q_block(ops, u, bidx, s, i, ring)
        order = _schedule(ops, self.tm, self.cfg.dma.queues, self.init)
        self.init = None  # later bodies follow a loop or another body
        for o, q in order:
            o.emit(q)
        self._win.clear()

    def _first_use(self, j: int) -> int:
        return j if self.p.causal else 0

    def _prep_kv(self, ops, u, bidx, s, ring) -> None:
        p, T = self.p, self.p.T
        nd = len(p.chunks)
        kidx = self._index(bidx, _shape(self.a_k.type))
        vidx = self._index(bidx, _shape(self.a_v.type))
        for tg in range(-(-p.nkt // p.Gt)):
            tiles = list(range(tg * p.Gt, min(p.nkt, (tg + 1) * p.Gt)))
            prio = (u, self._first_use(tiles[0]), 0)
            acc = self.acc_tr[ring["tr"] % 2]
            ring["tr"] += 1
            for jj, j in enumerate(tiles):
                ks = p.ks(j)
                kn = self.knat[ring["k"] % self.nk_ring]
                ring["k"] += 1
                self._load(ops, self.a_k, (lambda j=j: [*kidx(), self.kb.const(j * T), self.kb.const(0)]),
                           kn, 0, 0, ks, p.D, len(_shape(self.a_k.type)) - 2, len(_shape(self.a_k.type)) - 1, prio)
                for ci, (d0, dc) in enumerate(p.chunks):
                    self._mm(ops, kn, 0, d0, self.ident, 0, 0, acc, 0, (ci * p.Gt + jj) * T, dc, ks, ks, False,
                             prio, [ks, dc], [ks, ks])
            width = sum(p.ks(j) for j in tiles)
            for ci, (d0, dc) in enumerate(p.chunks):
                self._vec(ops, "unary", "copy", acc, 0, ci * p.Gt * T, self.kt[s][tg], 0, ci * p.Gt * T, dc, width, prio)
            for j in tiles:
                ks = p.ks(j)
                self._load(ops, self.a_v, (lambda j=j: [*vidx(), self.kb.const(j * T), self.kb.const(0)]),
                           self.vaug[s][j], 0, 0, ks, p.Dv, len(_shape(self.a_v.type)) - 2,
                           len(_shape(self.a_v.type)) - 1, (u, self._first_use(j), 2))

    def _transposed_chunks(self, chunks1: list[list[int]]) -> int:
        """How many of the q-block's last pass-1 chunks run in transposed mode: the share
        `tfrac` of its key tiles, at most na1 - 1 chunks (one accumulator stays free for
        the next q-block's pass 1)."""
        p = self.p
        if not p.tfrac:
            return 0
        want = p.tfrac * sum(len(ch) for ch in chunks1)
        n, got = 0, 0
        for ch in reversed(chunks1[-(p.na1 - 1):]):
            if got + len(ch) / 2 > want:
                break
            n, got = n + 1, got + len(ch)
        return n

    def _kt_win(self, s, j):
        """(buffer, column of chunk 0) of key tile j's K^T."""
        p = self.p
        return self.kt[s][j // p.Gt], (j % p.Gt) * p.T

    def _q_block(self, ops, u, bidx, s, i, ring) -> None:
        p, T = self.p, self.p.T
        nd = len(p.chunks)
        qs = p.qs(i)
        r = ring["blk"] % NQ
        ring["blk"] += 1
        qt, mcol, mpart, acco, obuf = self.qt[r], self.mcol[r], self.mpart[r], self.acco[r], self.obuf[r]
        qidx = self._index(bidx, _shape(self.a_q.type))
        oidx = self._index(bidx, _shape(self.a_out.type))
        qrank = len(_shape(self.a_q.type))
        kc = self.kb.const
        # Q: load, transpose, scale
        pr = (u, i, 1)
        qn = self.qnat[ring["q"] % self.nq_ring]
        accq = self.acc_q[ring["q"] % 2]
        ring["q"] += 1
        self._load(ops, self.a_q, lambda: [*qidx(), kc(i * T), kc(0)], qn, 0, 0, qs, p.D, qrank - 2, qrank - 1, pr)
        for ci, (d0, dc) in enumerate(p.chunks):
            self._mm(ops, qn, 0, d0, self.ident, 0, 0, accq, 0, ci * T, dc, qs, qs, False, pr, [qs, dc], [qs, qs])
        for ci, (d0, dc) in enumerate(p.chunks):
            self._vec(ops, "scalar", "mul", accq, 0, ci * T, qt, 0, ci * T, dc, qs, pr, imm=self.scale)
        mrow = None
        if p.has_mask:
            mrow = self.mrow[r]
            msh = _shape(self.a_mask.type)
            midx = self._index(bidx, msh)
            mrank = len(msh)
            row_dim = mrank - 2 if msh[-2] != 1 or p.L == 1 else -1
            col_dim = mrank - 1 if msh[-1] != 1 or p.S == 1 else -1

            def mask_idx(i=i, row_dim=row_dim, col_dim=col_dim):
                return [*midx(), kc(i * T) if row_dim >= 0 else kc(0), kc(0)]

            self._load(ops, self.a_mask, mask_idx, mrow, 0, 0, qs, p.S, row_dim, col_dim, pr)
        tiles = p.key_tiles(i)
        # pass 1: row max of S = Q K^T; the last chunks stay in the accumulator when they
        # are computed in transposed mode
        pr = (u, i, 2)
        chunks1 = [tiles[x:x + p.W1] for x in range(0, len(tiles), p.W1)]
        n_t = self._transposed_chunks(chunks1)
        held: list[tuple[list[int], SSAValue]] = []
        for w, ch in enumerate(chunks1):
            acc = self.acc1[ring["s1"] % p.na1]
            ring["s1"] += 1
            if w >= len(chunks1) - n_t:
                held.append((ch, acc))
            for jj, j in enumerate(ch):
                ks = p.ks(j)
                ktb, kcol = self._kt_win(s, j)
                for ci, (d0, dc) in enumerate(p.chunks):
                    self._mm(ops, qt, 0, ci * T, ktb, 0, ci * p.Gt * T + kcol, acc, 0, jj * T, qs, dc, ks, ci > 0,
                             pr, [dc, qs], [dc, ks])
                if p.diagonal(i, j):
                    self._mm(ops, self.ident, 0, 0, self.tri, 0, 0, acc, 0, jj * T, qs, qs, ks, True, pr,
                             [qs, qs], [qs, ks])
                if mrow is not None:
                    self._mm(ops, self.ident, 0, 0, mrow, 0, j * T, acc, 0, jj * T, qs, qs, ks, True, pr,
                             [qs, qs], [qs, ks])
            width = sum(p.ks(j) for j in ch)
            if len(chunks1) == 1:
                self._vec(ops, "reduce", "max", acc, 0, 0, mcol, 0, 0, qs, width, pr)
            else:
                self._vec(ops, "reduce", "max", acc, 0, 0, mpart, 0, w, qs, width, pr)
        if len(chunks1) > 1:
            self._vec(ops, "reduce", "max", mpart, 0, 0, mcol, 0, 0, qs, len(chunks1), pr)
        pr = (u, i, 3)
        # transposed mode: S - m (column operand) into SRAM, in the model dtype
        tmode: dict[int, tuple[SSAValue, int]] = {}  # key tile -> (S - m buffer, column)
        for ch, acc in held:
            sm = self.sm[ring["sm"] % len(self.sm)]
            ring["sm"] += 1
            width = sum(p.ks(j) for j in ch)
            self._vec(ops, "column", "sub", acc, 0, 0, sm, 0, 0, qs, width, pr, col=(mcol, 0, 0))
            for jj, j in enumerate(ch):
                tmode[j] = (sm, jj * T)
        normal = [j for j in tiles if j not in tmode]
        if normal:
            # -m as a row: transpose (M = 1) at the fold row's partition, negate into Q^T / negm
            fr = p.fold_row if p.fold_row is not None else 0
            self._mm(ops, mcol, 0, 0, self.ident, 0, 0, self.acc_m, fr, 0, 1, qs, qs, False, pr, [qs, 1], [qs, qs])
            if p.fold_row is not None:
                self._vec(ops, "scalar", "mul", self.acc_m, fr, 0, qt, fr, (nd - 1) * T, 1, qs, pr, imm=-1.0)
            else:
                self._vec(ops, "scalar", "mul", self.acc_m, 0, 0, self.negm[r], 0, 0, 1, qs, pr, imm=-1.0)
        # pass 2: P^T = exp(S^T - m), O_aug += P^T^T V_aug (transposed-mode tiles first: they
        # free their pass-1 accumulators for the next q-block)
        pr = (u, i, 4)
        groups: list[list[int]] = []
        for j in [j for j in tiles if j in tmode] + normal:
            if groups and len(groups[-1]) < p.G and p.ks(groups[-1][-1]) == p.ks(j):
                groups[-1].append(j)
            else:
                groups.append([j])
        first = True
        for grp in groups:
            acc = self.acc2[ring["s2"] % N2]
            ring["s2"] += 1
            pt = self.pt[ring["pt"] % N2]
            ring["pt"] += 1
            ks = p.ks(grp[0])
            for jj, j in enumerate(grp):
                if j in tmode:
                    sm, col = tmode[j]
                    self._mm(ops, sm, 0, col, self.ident, 0, 0, acc, 0, jj * qs, ks, qs, qs, False, pr,
                             [qs, ks], [qs, qs])
                    continue
                ktb, kcol = self._kt_win(s, j)
                for ci, (d0, dc) in enumerate(p.chunks):
                    kk = dc + (1 if p.fold_row is not None and ci == nd - 1 else 0)
                    self._mm(ops, ktb, 0, ci * p.Gt * T + kcol, qt, 0, ci * T, acc, 0, jj * qs, ks, kk, qs, ci > 0,
                             pr, [kk, ks], [kk, qs])
                if p.fold_row is None:
                    self._mm(ops, self.ones, 0, 0, self.negm[r], 0, 0, acc, 0, jj * qs, ks, 1, qs, True, pr,
                             [1, ks], [1, qs])
                if p.diagonal(i, j):
                    self._mm(ops, self.tri, 0, 0, self.ident, 0, 0, acc, 0, jj * qs, ks, qs, qs, True, pr,
                             [qs, ks], [qs, qs])
                if mrow is not None:
                    self._mm(ops, mrow, 0, j * T, self.ident, 0, 0, acc, 0, jj * qs, ks, qs, qs, True, pr,
                             [qs, ks], [qs, qs])
            width = len(grp) * qs
            self._vec(ops, "unary", "exp", acc, 0, 0, pt, 0, 0, ks, width, pr)
            for jj, j in enumerate(grp):
                va = self.vaug[s][j]
                for e0, ne in p.vchunks:
                    self._mm(ops, pt, 0, jj * qs, va, 0, e0, acco, 0, e0, qs, ks, ne, not first, pr,
                             [ks, qs], [ks, ne])
                if not p.rowsum_fused:
                    self._mm(ops, pt, 0, jj * qs, self.ones, 0, 0, acco, 0, p.Dv, qs, ks, 1, not first, pr,
                             [ks, qs], [ks, 1])
                first = False
        # O = O_aug[:, :Dv] / O_aug[:, Dv]
        pr = (u, i, 5)
        self._vec(ops, "column", "div", acco, 0, 0, obuf, 0, 0, qs, p.Dv, pr, col=(acco, 0, p.Dv))
        orank = len(_shape(self.a_out.type))
        self._store(ops, obuf, self.a_out, lambda: [*oidx(), kc(i * T), kc(0)], qs, p.Dv, orank - 2, orank - 1, pr)


__all__ = ["lower_attention", "lower_attention_kernel"]
