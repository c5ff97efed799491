"""The schedule of a rotary-embedding kernel, and its cost model.

A schedule is (TS positions per tile, hc heads per column chunk, nb buffer sets). Rows
are positions (TS = the partitions, or S when shorter); the columns of one load are hc
heads of x (``hc * D`` elements, one contiguous DMA per tile when heads are adjacent).
`choose` takes the fastest schedule that fits SRAM by `estimate` (the simulator's
timing rules, `tilecc.simulator.timing`): per (tile, chunk) step the larger of the
vector time (4 instructions per head, 1 per tile for the negated sin half) and the DMA
time (the fixed latency of each transfer spread over the queues in flight, the bytes
over the bandwidth), plus the exposed first load and last store::

    1b Llama q, S = 2048 bf16, cloud:  TS 128, hc 32 (one [128 x 2048] DMA a tile), nb 2
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecc.passes.graph_to_tile.rope.problem import RopeProblem
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules

ALIGN = 64  # bytes of SRAM alignment slack per buffer (assumption, as elementwise/dag.py)


@dataclass(frozen=True)
class RopeSchedule:
    TS: int  # positions per tile (partitions)
    hc: int  # heads per column chunk
    nb: int  # buffer sets (2: the next chunk loads while this one computes)
    estimate: float  # cycles, `estimate`


def sram_bytes(p: RopeProblem, hc: int, nb: int) -> int:
    """Bytes per partition: x and out chunks and cos / sin per set, the negated sin and
    the per-head product."""
    isz = p.isz
    return nb * (2 * hc * p.D + 2 * p.D) * isz + 2 * p.D * isz + 8 * ALIGN


def estimate(cfg: HardwareConfig, p: RopeProblem, TS: int, hc: int, nb: int) -> float:
    tm = TimingRules(cfg)
    tiles = p.B * -(-p.S // TS)
    chunks = -(-p.H // hc)
    isz = p.isz
    vec_head = (tm.vector_time(TS, p.D, cfg.vector.op_cost.binary["mul"])
                + 2 * tm.vector_time(TS, p.half, cfg.vector.op_cost.binary["mul"], 2)
                + tm.vector_time(TS, p.D, cfg.vector.op_cost.binary["add"], 2))
    vec_tile = tm.vector_time(TS, p.half, cfg.vector.op_cost.unary["neg"])
    x_dmas = 1 if p.heads_adjacent else hc
    table_dmas = 2 if p.shared_table else 2 * hc
    fixed = tm.dma_fixed(TS)
    x_data = tm.dma_transfer(TS, hc * p.D // x_dmas, isz) * x_dmas
    step_dma = 2 * x_dmas * fixed + 2 * x_data  # load x, store out
    in_flight = max(1, min(cfg.dma.queues, x_dmas * nb))
    per_step = max(hc * vec_head, step_dma / in_flight)
    table = table_dmas * (fixed + tm.dma_transfer(TS, p.D, isz)) / max(1, min(cfg.dma.queues, table_dmas))
    per_tile = chunks * per_step + vec_tile + (table if nb == 1 else 0.0)  # nb 2: tables load ahead
    return tiles * per_tile + table + fixed + x_data + fixed + x_data / x_dmas


def choose(cfg: HardwareConfig, p: RopeProblem) -> RopeSchedule | None:
    """The fastest schedule that fits SRAM, or None (not even one head fits)."""
    TS = min(cfg.sram.partitions, p.S)
    budget = cfg.sram.bytes_per_partition
    best: RopeSchedule | None = None
    for nb in (2, 1):
        for hc in sorted({p.H, *[h for h in (1, 2, 4, 8, 16, 32, 64) if h < p.H]}, reverse=True):
            if sram_bytes(p, hc, nb) > budget:
                continue
            est = estimate(cfg, p, TS, hc, nb)
            if best is None or est < best.estimate:
                best = RopeSchedule(TS, hc, nb, est)
            break  # the widest chunk that fits at this depth
    return best
