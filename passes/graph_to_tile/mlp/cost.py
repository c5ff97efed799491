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
    up = p.nh * (p.nk * mm(p.TK, p.TK, p.TM) + mm(p.TK, 1, p.TM))
    down = p.nh * nt * mm(p.TM, p.TK, p.TN) + nt * mm(p.TM, 1, p.TN)
    trans = p.nk * mm(p.TK, p.TM, p.TM)
    act = p.nh * (p.act_ops * t.vector_overhead + t.vector_work(p.TK, p.TM, p.act_cost))
    epi = chunks * p.epi_ops * t.vector_overhead + t.vector_work(p.TM, p.N, p.epi_cost)
    pro = p.pro_ops * t.vector_overhead + t.vector_work(p.TM, p.K, p.pro_cost)
    copies = cdiv(p.nk, GROUP_T) * t.vector_overhead + t.vector_work(p.TK, p.nk * p.TM, 1.0)
    # per chunk a store (and a residual load on another queue): a DMA's fixed cost each
    stores = t.dma_time(p.TM, p.N, p.io) + chunks * float(t.dma_fixed(p.TM)) + t.dma_time(p.TM, p.K, p.ia)
    per_tile = max(up + down + trans, act + epi + pro + copies, stores)
    # the weights load once, their DMAs one after another on each weight queue (a DMA's
    # fixed cost is paid in turn), all sharing HBM: the first W1 buffer gates the first
    # up projection, all of them (and W2) the end of the first m-tile
    nq = max(cfg.dma.queues - 1, 1)
    bw = cfg.hbm.bytes_per_cycle
    g_cols = min(s.g * p.TK, p.H)
    w1_load = t.dma_time(min(p.K, p.TK), g_cols, p.ia)
    w1_first = max(cdiv(p.nk, nq) * w1_load, p.K * g_cols * p.ia / bw)
    n_loads = p.nk * cdiv(p.nh, s.g) + p.nh
    w2_load = t.dma_time(p.TK, p.N, p.ia)
    w_all = max(cdiv(p.nk * cdiv(p.nh, s.g), nq) * w1_load + cdiv(p.nh, nq) * w2_load,
                (p.K + p.N) * p.H * p.ia / bw, n_loads * float(t.dma_fixed(p.TK)) / nq)
    x_first = t.dma_time(p.TM, p.K, p.ia)
    start = max(w1_first, x_first + pro + trans + copies)
    last = epi / chunks
    return max(start + p.n_mtiles * per_tile, w_all + (p.n_mtiles - 1) * per_tile + down / 2) + last


def choose(p: MlpProblem, cfg: HardwareConfig) -> MlpSchedule | None:
    """The fitting schedule of least estimated cycles; None where none fits."""
    fit = [s for s in candidates(p) if fits(p, s, cfg)]
    if not fit:
        return None
    return min(fit, key=lambda s: (cdiv(p.N, s.w * p.TN), estimate(p, s, cfg), -s.g))


__all__ = ["choose", "estimate"]
