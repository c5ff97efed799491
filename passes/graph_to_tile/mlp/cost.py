"""An analytical cost model of the fused MLP kernel: its cycles for a schedule, and
the schedule it picks.

Per m-tile the matrix engine runs the up projection (``nh * nk`` matmuls of
``TK x TM`` onto ``TM`` tokens, plus one K=1 bias matmul per hidden tile), the next
m-tile's transposes and the down projection (``nh * ceil(N / TN)`` matmuls); the
vector engine runs the next m-tile's norm, one activation per hidden tile, the
transposes' copies and one epilogue per chunk. The m-tiles pipeline, so the kernel
takes about the busier engine's time per m-tile, plus what nothing hides: the wait
for the first W1 buffer and x rows, the first m-tile's norm and transposes, and the
last chunk's epilogue.
"""

from __future__ import annotations

from tilecc.passes.graph_to_tile.mlp.problem import MlpProblem, cdiv
from tilecc.passes.graph_to_tile.mlp.schedule import GROUP_T, MlpSchedule, candidates, fits
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules


def estimate(p: MlpProblem, s: MlpSchedule, cfg: HardwareConfig) -> float:
    """The kernel's cycles under schedule `s` (module docstring)."""
    t = TimingRules(cfg)

    def mm(m: int, k: int, n: int) -> float:
        return float(t.matmul_interval(t.matmul_stream(m, k, n, p.fp32)))

    nt = cdiv(p.N, p.TN)
    chunks = cdiv(nt, s.w)
    up = p.nh * ((2 if p.gated else 1) * p.nk * mm(p.TK, p.TK, p.TM) + mm(p.TK, 1, p.TM))
    down = p.nh * nt * mm(p.TM, p.TK, p.TN) + nt * mm(p.TM, 1, p.TN)
    trans = p.nk * mm(p.TK, p.TM, p.TM)
    act = p.nh * (p.act_ops * t.vector_overhead + t.vector_work(p.TK, p.TM, p.act_cost))
    epi = chunks * p.epi_ops * t.vector_overhead + t.vector_work(p.TM, p.N, p.epi_cost)
    pro = p.pro_ops * t.vector_overhead + t.vector_work(p.TM, p.K, p.pro_cost)
    copies = cdiv(p.nk, GROUP_T) * t.vector_overhead + t.vector_work(p.TK, p.nk * p.TM, 1.0)
    # per chunk a store (and a residual load on another queue): a DMA's fixed cost each
    stores = t.dma_time(p.TM, p.N, p.io) + chunks * float(t.dma_fixed(p.TM)) + t.dma_time(p.TM, p.K, p.ia)
    per_tile = max(up + down + trans, act + epi + pro + copies, stores)
    # the weights load once, before anything else on their queues. Each queue runs its
    # DMAs one after another (a DMA's fixed cost in turn), all share HBM. The first W1
    # group gates the first up projection (the queues' first DMAs move together), all
    # of W1 the end of the first m-tile's, W1 and W2 the first down projection, which
    # follows two up projections (the up projection runs one m-tile ahead)
    nq = max(cfg.dma.queues - 1, 1)
    bw = cfg.hbm.bytes_per_cycle
    fixed = float(t.dma_fixed(p.TK))
    groups = cdiv(p.nh, s.g)
    wide = 2 if p.gated else 1  # (W1 and Wu)
    g_bytes = wide * p.K * min(s.g * p.TK, p.H) * p.ia
    n1 = wide * (groups if w1_tiled(p, s) else groups * p.nk)
    n2 = p.nh // p.w2_group if p.w2_group else p.nh
    w1_first = fixed + min(nq, groups) * g_bytes / bw
    w1_all = wide * p.K * p.H * p.ia / bw + cdiv(n1, nq) * fixed
    w_all = (wide * p.K + p.N) * p.H * p.ia / bw + cdiv(n1 + n2, nq) * fixed
    x_first = t.dma_time(p.TM, p.K, p.ia)
    start = max(w1_first, x_first + pro + trans + copies)
    work = p.n_mtiles * per_tile
    last = epi / chunks
    return max(start + work, w1_all + work - up, w_all + work - min(2, p.n_mtiles) * up) + last


def w1_tiled(p: MlpProblem, s: MlpSchedule) -> bool:
    """Whether W1 is stored pre-tiled for schedule `s` (whole K tiles and hidden groups)."""
    return p.w1_tileable and p.K % p.TK == 0 and p.H % (s.g * p.TK) == 0


def choose(p: MlpProblem, cfg: HardwareConfig) -> MlpSchedule | None:
    """The fitting schedule of fewest down-projection chunks (each costs a store's and a
    residual load's fixed DMA time on the queue the m-tiles share, which the model above
    underrates), then of least estimated cycles; None where none fits."""
    fit = [s for s in candidates(p) if fits(p, s, cfg)]
    if not fit:
        return None
    return min(fit, key=lambda s: (cdiv(p.N, s.w * p.TN), estimate(p, s, cfg), -s.g))


__all__ = ["choose", "estimate", "w1_tiled"]
