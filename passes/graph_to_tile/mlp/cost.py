"""An analytical cost model of the fused MLP kernel: its cycles for a schedule, and
the schedule it picks.

Per m-tile the matrix engine runs the up projection (``nh * nk`` matmuls of
``TK x TM`` onto ``TM`` tokens, plus one K=1 bias matmul per hidden tile), the next
m-tile's transposes and the down projection (``nh * ceil(N / TN)`` matmuls); the
vector engine runs the next m-tile's norm, one activation per hidden tile, the
transposes' copies and one epilogue per chunk. The m-tiles pipeline, so the kernel
takes about the busier engine's time per m-tile, plus what nothing hides: the wait
for the first W1 buffer and x rows, the first m-tile's norm and transposes, and the
last chunk's epilogue. The weights' DMAs share HBM fairly among the queues
(`weight_arrivals`).
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
    # the first W1 group gates the first up projection, all of W1 the end of the first
    # m-tile's, W1 and W2 the first down projection, which follows two up projections
    # (the up projection runs one m-tile ahead)
    w1_first, w1_all, w_all = weight_arrivals(p, s, cfg)
    x_first = t.dma_time(p.TM, p.K, p.ia)
    start = max(w1_first, x_first + pro + trans + copies)
    work = p.n_mtiles * per_tile
    last = epi / chunks
    return max(start + work, w1_all + work - up, w_all + work - min(2, p.n_mtiles) * up) + last


def weight_arrivals(p: MlpProblem, s: MlpSchedule, cfg: HardwareConfig) -> tuple[float, float, float]:
    """When the first W1 group, all of W1, and W1 and W2 are in SRAM.

    The weights load once, before anything else on their queues (kernel.py): W1's DMAs
    group by group, then W2's, dealt to the weight queues in turn. Each queue runs its
    DMAs one after another, a DMA's fixed cost each (hidden behind the other queues'
    transfers, but not behind its own queue's); the DMAs in flight share HBM
    fairly, so while every queue has bytes left they move at the same rate: a DMA ends
    once its queue has moved the bytes up to its end (B) and every other queue
    ``min(B, all its bytes)``. An uneven split of W1 over the queues thus costs the
    other queues' W2 bytes moved meanwhile, and one large group moves at a share of HBM
    only.
    """
    t = TimingRules(cfg)
    nq = max(cfg.dma.queues - 1, 1)
    bw = cfg.hbm.bytes_per_cycle
    fixed = float(t.dma_fixed(p.TK))
    wide = 2 if p.gated else 1  # (W1 and Wu)
    gcols = s.g * p.TK
    ks = [min(p.TK, p.K - k * p.TK) for k in range(p.nk)]
    w1: list[list[float]] = []  # per W1 group, its DMAs' bytes
    for h0 in range(0, p.H, gcols):
        cols = min(gcols, p.H - h0)
        w1.append([float(wide * p.K * cols * p.ia)] if w1_tiled(p, s) else
                  [float(k * cols * p.ia) for _ in range(wide) for k in ks])
    g2 = p.w2_group or 1
    w2 = [float(min(g2 * p.TK, p.H - h0) * p.N * p.ia) for h0 in range(0, p.H, g2 * p.TK)]
    dmas = [b for grp in w1 for b in grp] + w2
    queues: list[list[float]] = [[] for _ in range(nq)]
    ends: list[tuple[int, int]] = []  # (queue, position) of each DMA
    for i, b in enumerate(dmas):
        q = queues[i % nq]
        q.append((q[-1] if q else 0.0) + b)  # bytes on the queue up to this DMA's end
        ends.append((i % nq, len(q) - 1))
    totals = [q[-1] if q else 0.0 for q in queues]

    def end(i: int) -> float:
        q, j = ends[i]
        upto = queues[q][j]
        # a queue's fixed costs overlap the other queues' transfers, but not its own
        return max(fixed + sum(min(upto, tot) for tot in totals) / bw, (j + 1) * fixed + upto / bw)

    n_first, n1 = len(w1[0]), sum(len(grp) for grp in w1)
    return (max(end(i) for i in range(n_first)), max(end(i) for i in range(n1)),
            max(end(i) for i in range(len(dmas))))


def w1_tiled(p: MlpProblem, s: MlpSchedule) -> bool:
    """Whether W1 is stored pre-tiled for schedule `s` (whole K tiles and hidden groups)."""
    return p.w1_tileable and p.K % p.TK == 0 and p.H % (s.g * p.TK) == 0


def w1_dmas(p: MlpProblem, s: MlpSchedule) -> int:
    """W1's (and Wu's) DMAs under schedule `s`: one per hidden group, pre-tiled, else one
    per group and K tile."""
    return (2 if p.gated else 1) * cdiv(p.nh, s.g) * (1 if w1_tiled(p, s) else p.nk)


def choose(p: MlpProblem, cfg: HardwareConfig) -> MlpSchedule | None:
    """The fitting schedule of fewest down-projection chunks (each costs a store's and a
    residual load's fixed DMA time on the queue the m-tiles share, which the model above
    underrates), then of least estimated cycles, then of fewest W1 DMAs (each a fixed
    cost on its queue, which the model hides behind the other queues' transfers: other
    kernels' DMAs on those queues expose it); None where none fits."""
    ranked = rank(p, cfg)
    return ranked[0] if ranked else None


def rank(p: MlpProblem, cfg: HardwareConfig) -> list[MlpSchedule]:
    """The fitting schedules, best first by `choose`'s order (the autotuner's candidate
    order, mlp/tuning.py); empty where none fits."""
    fit = [s for s in candidates(p) if fits(p, s, cfg)]
    return sorted(fit, key=lambda s: (cdiv(p.N, s.w * p.TN), estimate(p, s, cfg), w1_dmas(p, s), -s.g))


__all__ = ["choose", "estimate", "rank", "w1_dmas", "w1_tiled", "weight_arrivals"]
