"""The schedule of a rotary-embedding kernel, and its cost model.

Two kinds of tile. ``positions``: (TS positions per tile, hc heads per column chunk, nb
buffer sets, rep heads of cos replicated side by side); rows are positions (TS = the
partitions, or S when shorter), the columns of one load hc heads of x (``hc * D``
elements, one contiguous DMA per tile when heads are adjacent); with cos and sin shared by
the heads, two vector instructions per head (the rotation) and x * cos per rep heads and
one add per chunk (`kernel.py`), else four per head. ``heads`` (few positions: decode): one
position per tile, its heads on the rows (``[hc x D]``, cos / sin one row broadcast to
them), four vector instructions per tile, no buffering. `choose` takes the fastest
schedule that fits SRAM by `estimate` (the simulator's
timing rules, `tilecc.simulator.timing`): per (tile, chunk) step the larger of the
vector time (as above, plus per tile the negated sin half and log2(rep) copies
replicating cos) and the DMA
time (the fixed latency of each transfer spread over the queues in flight, the bytes
over the bandwidth), plus the exposed first load and last store::

    1b Llama q, S = 2048 bf16, cloud:  positions: TS 128, hc 32 (one [128 x 2048] DMA a tile), nb 2, rep 8
    1b Llama q, S = 1 (decode):          heads: [32 x 64] tiles, 5 vector instructions in all
    1b Llama q, decode at batch 32:      positions (the 32 sequences as positions): TS 32, hc 32
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
    mode: str = "positions"  # or "heads": one position per tile, heads on the rows
    rep: int = 0  # heads of cos side by side (x * cos per rep heads); 0: four instructions per head


def sram_bytes(p: RopeProblem, hc: int, nb: int, rep: int = 0) -> int:
    """Bytes per partition: x and out chunks and cos (rep heads wide) / sin per set, the
    negated sin and the rotated product (a head, or the chunk with `rep`)."""
    isz = p.isz
    return (nb * (2 * hc * p.D + (max(rep, 1) + 1) * p.D) * isz + ((hc if rep else 1) + 1) * p.D * isz
            + 8 * ALIGN)


def vector_step(cfg: HardwareConfig, p: RopeProblem, TS: int, hc: int, rep: int) -> float:
    """Vector time of one chunk of hc heads (rep: cos replicated for rep heads, else per head)."""
    tm = TimingRules(cfg)
    mul, add = cfg.vector.op_cost.binary["mul"], cfg.vector.op_cost.binary["add"]
    rot = 2 * tm.vector_time(TS, p.half, mul, 2)
    if not rep:
        return hc * (tm.vector_time(TS, p.D, mul, 2) + rot + tm.vector_time(TS, p.D, add, 2))
    full, rest = divmod(hc, rep)
    cos = full * tm.vector_time(TS, rep * p.D, mul, 2) + (tm.vector_time(TS, rest * p.D, mul, 2) if rest else 0.0)
    return cos + hc * rot + tm.vector_time(TS, hc * p.D, add, 2)


def replicate_time(cfg: HardwareConfig, p: RopeProblem, TS: int, rep: int) -> float:
    """The doubling copies that put cos for rep heads side by side."""
    tm = TimingRules(cfg)
    t, w = 0.0, p.D
    while w < rep * p.D:
        n = min(w, rep * p.D - w)
        t += tm.vector_time(TS, n, cfg.vector.op_cost.unary["copy"])
        w += n
    return t


def estimate(cfg: HardwareConfig, p: RopeProblem, TS: int, hc: int, nb: int, rep: int = 0) -> float:
    tm = TimingRules(cfg)
    tiles = p.B * -(-p.S // TS)
    chunks = -(-p.H // hc)
    isz = p.isz
    vec_tile = tm.vector_time(TS, p.half, cfg.vector.op_cost.unary["neg"]) + replicate_time(cfg, p, TS, rep)
    x_dmas = 1 if p.heads_adjacent else hc
    table_dmas = 2 if p.shared_table else 2 * hc
    fixed = tm.dma_fixed(TS)
    x_data = tm.dma_transfer(TS, hc * p.D // x_dmas, isz) * x_dmas
    step_dma = 2 * x_dmas * fixed + 2 * x_data  # load x, store out
    in_flight = max(1, min(cfg.dma.queues, x_dmas * nb))
    per_step = max(vector_step(cfg, p, TS, hc, rep), step_dma / in_flight)
    table = table_dmas * (fixed + tm.dma_transfer(TS, p.D, isz)) / max(1, min(cfg.dma.queues, table_dmas))
    per_tile = chunks * per_step + vec_tile + (table if nb == 1 else 0.0)  # nb 2: tables load ahead
    return tiles * per_tile + table + fixed + x_data + fixed + x_data / x_dmas


def estimate_heads(cfg: HardwareConfig, p: RopeProblem, hc: int) -> float:
    """Heads on the rows: per tile (one position, hc heads) load x, cos, sin, store y, one
    after another on the queues; 5 vector instructions (neg, mul, 2 half muls, add)."""
    tm = TimingRules(cfg)
    tiles = p.B * p.S * -(-p.H // hc)
    mul, add = cfg.vector.op_cost.binary["mul"], cfg.vector.op_cost.binary["add"]
    vec = (tm.vector_time(hc, p.half, cfg.vector.op_cost.unary["neg"]) + tm.vector_time(hc, p.D, mul, 2)
           + 2 * tm.vector_time(hc, p.half, mul, 2) + tm.vector_time(hc, p.D, add, 2))
    dma = tm.dma_fixed(hc) + tm.dma_transfer(hc, p.D, p.isz)  # x: one DMA, rows at the head stride
    return tiles * (3 * dma + vec)  # cos, sin, x on the queues, then the vector work, then the store


def choose(cfg: HardwareConfig, p: RopeProblem) -> RopeSchedule | None:
    """The fastest schedule that fits SRAM, or None (not even one head fits)."""
    TS = min(cfg.sram.partitions, p.S)
    budget = cfg.sram.bytes_per_partition
    best: RopeSchedule | None = None
    hc = min(p.H, cfg.sram.partitions)
    if 6 * p.D * p.isz + 8 * ALIGN <= budget and p.S < cfg.sram.partitions:
        best = RopeSchedule(hc, hc, 1, estimate_heads(cfg, p, hc), "heads")
    for nb in (2, 1):
        for hc in sorted({p.H, *[h for h in (1, 2, 4, 8, 16, 32, 64) if h < p.H]}, reverse=True):
            if sram_bytes(p, hc, nb) > budget:
                continue
            # cos replicated for rep heads (cos and sin shared by the heads): 0, or a
            # power of two up to hc, each if it fits
            reps = [0, *[r for r in (1, 2, 4, 8, 16, 32, 64) if r <= hc and p.shared_table
                         and sram_bytes(p, hc, nb, r) <= budget]]
            for rep in reps:
                est = estimate(cfg, p, TS, hc, nb, rep)
                if best is None or est < best.estimate:
                    best = RopeSchedule(TS, hc, nb, est, rep=rep)
            break  # the widest chunk that fits at this depth
    return best
