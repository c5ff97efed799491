"""The decode-attention kernel's cost model: a schedule's estimated cycles, and the choice.

Per group (`decode_plan.DecodeSchedule`: n problems) the kernel issues

- DMAs: the q rows, the mask rows (f strided loads of a window each, one DMA transpose
  per mask row, or one load), n / m K
  transfers and n / m V transfers of ``[m R x f D]``, the output rows;
- matmuls: the q transpose, the block pattern (m > 1: one per T score columns), the
  mask (a 0/1 selection of the group's mask rows, per window and problem of a
  transfer), per transfer and window a K transpose, a score matmul and a P V matmul
  (plus one where a window's rows cross a T-row block of P^T), one P transpose per T
  score columns;
- vector instructions: the scale copy of Q^T, the mask clamp, one K^T copy per
  transfer, row max, subtract, exp and row sum over ``m S`` columns, one P^T copy per
  T score columns, the normalising divide.

Each engine's time comes from the simulator's timing rules (`AttentionTiming`: DMA
fixed cost and transfer rate with its packet efficiency, the four queues sharing the
DMA engines and HBM; a matmul's issue interval; a vector instruction's overhead and
elements over the lanes). Groups of one loop body pipeline (the list scheduler overlaps a group's loads
with the previous group's compute) but bodies do not (each engine runs a body's
instructions in order), so the estimate is the busiest engine's time over all groups
plus one group's latency chain (its loads, then its compute) per body. The choice
(`choose`) is the schedule of least estimate; ties go to fewer windows (smaller f),
then to larger groups, then to fewer groups per body. The closed form misses how a
group's latency chain overlaps the others, which decides small problems (a batch of
one: a single group): the lowering (`decode_entry`) builds the best `REPLAYED` of the
ranking dry and takes the one whose list schedule (replayed with the timing rules, as
the flash kernel's tilings are compared) ends first.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecc.passes.graph_to_tile.attention.decode_plan import DecodeProblem, DecodeSchedule, candidates, mask_shape
from tilecc.passes.graph_to_tile.attention.scheduler import AttentionTiming
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import DmaPattern


@dataclass(frozen=True)
class DecodeCost:
    """Per-group engine times (cycles) and the whole kernel's estimate."""

    dma: float
    matrix: float
    vector: float
    chain: float
    total: float


def estimate(p: DecodeProblem, s: DecodeSchedule, cfg: HardwareConfig) -> DecodeCost:
    if s.online:
        return _estimate_online(p, s, cfg)
    tm = AttentionTiming(cfg)
    isz, L, f, m = p.isz, p.L, s.f, s.m
    R, nL, tiles = s.R(p), s.n * p.L, s.n // s.m
    loads: list[tuple[int, int, int]] = [(nL, p.D, DmaPattern.CONTIGUOUS)]
    if s.mask_span:
        loads += _mask_loads(p, s)
    loads += [(m * R, f * p.D, DmaPattern.CONTIGUOUS)] * tiles + [(m * R, f * p.Dv, DmaPattern.CONTIGUOUS)] * tiles
    loads += [(nL, p.Dv, DmaPattern.CONTIGUOUS)]  # the store
    alone = sum(tm.dma_time(r, c, isz, pat) for r, c, pat in loads)
    shared = sum(tm.dma_occupancy(r, c, isz, pat) for r, c, pat in loads)
    dma = max(alone / cfg.dma.queues, shared)

    def mm(mm_m: int, k: int, nn: int) -> float:
        return tm.matmul_interval(tm.mm(mm_m, k, nn, p.fp32))

    blocks, W, T = s.blocks(p), s.width(p), s.T
    w, packs = s.pack(p), s.packs(p)
    matrix = mm(w * p.D, nL, nL) + tiles * (packs * mm(w * p.D, m * R, m * R) + f * mm(m * L, p.D, m * R))
    matrix += (tiles * f + blocks) * mm(m * L, min(m * R, T), p.Dv) + blocks * mm(T, nL, nL)
    if m > 1:
        matrix += -(-W // T) * mm(nL, nL, T)
    if s.mask_span:
        matrix += f * m * -(-R // T) * mm(nL, mask_shape(p, s)[0], min(R, T))

    def vec(kind: str, fn: str, rows: int, cols: int) -> float:
        return tm.vec(kind, fn, rows, cols)

    vector = vec("binary", "mul", w * p.D, nL) + (w - 1) * vec("unary", "copy", nL, p.D)
    rest = vec("unary", "copy", p.D, m * R) if f % w else 0.0
    vector += tiles * (vec("unary", "copy", w * p.D, (f // w) * m * R) + rest)
    vector += vec("reduce", "max", nL, W) + vec("binary", "sub", nL, W) + vec("unary", "exp", nL, W)
    vector += vec("reduce", "sum", nL, W) + blocks * vec("unary", "copy", T, nL) + vec("binary", "div", nL, p.Dv)
    if s.mask_span:
        vector += vec("binary", "max", *mask_shape(p, s))
    chain = max(tm.dma_time(r, c, isz, pat) for r, c, pat in loads) + matrix / max(1, tiles) + vector
    busiest = max(dma, matrix, vector)
    return DecodeCost(dma, matrix, vector, chain, busiest * s.groups(p) + chain * (s.groups(p) // s.U))


def _estimate_online(p: DecodeProblem, s: DecodeSchedule, cfg: HardwareConfig) -> DecodeCost:
    """The online schedule (cache blocks of ``rc`` view rows, m = 1): per block the
    mask windows, a K and a V transfer per problem, f K transposes, scores and P V
    matmuls per problem, the softmax over ``f rc`` columns and the running max / sum /
    output rescale; the blocks of a group pipeline, the groups (one per body) do not."""
    tm = AttentionTiming(cfg)
    isz, L, f, n, T = p.isz, p.L, s.f, s.n, s.T
    nL = n * L
    loads: list[tuple[int, int, int]] = [(nL, p.D, DmaPattern.CONTIGUOUS), (nL, p.Dv, DmaPattern.CONTIGUOUS)]
    w = s.pack(p)
    matrix = tm.matmul_interval(tm.mm(w * p.D, nL, nL, p.fp32))
    vector = (tm.vec("binary", "mul", w * p.D, nL) + (w - 1) * tm.vec("unary", "copy", nL, p.D)
              + tm.vec("binary", "div", nL, p.Dv))
    for _, rc in s.chunks(p):
        W = f * rc
        blocks = -(-W // T)
        if s.mask_span:
            loads += _mask_loads(p, s, rc)
            mrows = mask_shape(p, s)[0]
            matrix += f * tm.matmul_interval(tm.mm(nL, mrows, rc, p.fp32))
            vector += tm.vec("binary", "max", mrows, rc if s.mask_t else W)
        loads += [(rc, f * p.D, DmaPattern.CONTIGUOUS), (rc, f * p.Dv, DmaPattern.CONTIGUOUS)] * n
        matrix += n * s.packs(p) * tm.matmul_interval(tm.mm(w * p.D, rc, rc, p.fp32))
        matrix += n * f * sum(tm.matmul_interval(tm.mm(a, b, c, p.fp32)) for a, b, c in ((L, p.D, rc), (L, rc, p.Dv)))
        matrix += blocks * tm.matmul_interval(tm.mm(T, nL, nL, p.fp32))
        rest = tm.vec("unary", "copy", p.D, rc) if f % w else 0.0
        vector += n * (tm.vec("unary", "copy", w * p.D, (f // w) * rc) + rest)
        vector += blocks * tm.vec("unary", "copy", T, nL)
        vector += sum(tm.vec(k, fn, nL, W) for k, fn in (("reduce", "max"), ("binary", "sub"), ("unary", "exp"),
                                                          ("reduce", "sum")))
        vector += 5 * tm.vec("binary", "max", nL, 1) + 2 * tm.vec("binary", "mul", nL, p.Dv)
    alone = sum(tm.dma_time(r, c, isz, pat) for r, c, pat in loads)
    shared = sum(tm.dma_occupancy(r, c, isz, pat) for r, c, pat in loads)
    dma = max(alone / cfg.dma.queues, shared)
    blocks_n = len(s.chunks(p))
    chain = max(tm.dma_time(r, c, isz, pat) for r, c, pat in loads) + (matrix + vector) / blocks_n
    busiest = max(dma, matrix, vector)
    return DecodeCost(dma, matrix, vector, chain, (busiest + chain) * s.groups(p))


def _mask_loads(p: DecodeProblem, s: DecodeSchedule, cols: int | None = None) -> list[tuple[int, int, int]]:
    """The mask DMAs of a group (online: of a cache block of `cols` view rows): one
    contiguous load (f = 1), one transpose per mask row (`DecodeSchedule.mask_t`), or
    one strided load per window."""
    cols = s.mask_cols(p) if cols is None else cols
    if s.f == 1:
        return [(s.mask_span, cols, DmaPattern.CONTIGUOUS)]
    if s.mask_t:
        return [(s.f, cols, DmaPattern.TRANSPOSE)] * s.mask_span
    return [(s.mask_span, cols, DmaPattern.STRIDED)] * s.f


def rank(p: DecodeProblem, cfg: HardwareConfig) -> list[tuple[DecodeSchedule, DecodeCost]]:
    """Every fitting schedule with its cost, least estimate first (ties: fewer windows,
    larger groups, fewer groups per body)."""
    scored = [(s, estimate(p, s, cfg)) for s in candidates(p, cfg)]
    return sorted(scored, key=lambda sc: (round(sc[1].total), sc[0].f, -sc[0].n, sc[0].U))


def choose(p: DecodeProblem, cfg: HardwareConfig) -> tuple[DecodeSchedule, DecodeCost, int] | None:
    """The schedule of least estimate (and its cost, and how many were weighed), or None
    where none fits the target."""
    ranked = rank(p, cfg)
    return (*ranked[0], len(ranked)) if ranked else None
