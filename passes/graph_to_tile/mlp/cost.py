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
    per_tile = max(up + down + trans, act + epi + pro + copies)
    w1_first = t.dma_time(min(p.K, p.TK), s.g * p.TK, p.ia) * p.nk
    x_first = t.dma_time(p.TM, p.K, p.ia)
    start = max(w1_first, x_first + pro + trans + copies)
    last = epi / chunks
    return start + p.n_mtiles * per_tile + last


def choose(p: MlpProblem, cfg: HardwareConfig) -> MlpSchedule | None:
    """The fitting schedule of least estimated cycles; None where none fits."""
    fit = [s for s in candidates(p) if fits(p, s, cfg)]
    if not fit:
        return None
    return min(fit, key=lambda s: (estimate(p, s, cfg), -s.w, -s.g))


__all__ = ["choose", "estimate"]
