"""`MlpSchedule`: the free parameters of the fused MLP kernel, and the footprints
that decide whether one fits.

- `g`: hidden tiles per W1 buffer. W1 is resident, in buffers of ``g`` hidden tiles
  by K tile; the first up projection waits only for the first ``g`` hidden tiles, and
  each load moves ``g*TK`` contiguous elements per row (larger is a faster DMA).
- `w`: TN-column blocks per down-projection chunk (one accumulator tile of ``TM x w*TN``
  per chunk, two alternating; the epilogue evacuates a chunk at a time).

Footprints (bytes per partition): SRAM holds W1 and W2 whole, two sets of the
transposed hidden (``nh*TM`` columns each), two of x^T, the prologue's and epilogue's
buffers; the accumulator holds two hidden tiles, two transpose groups and two chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecc.passes.graph_to_tile.mlp.problem import MlpProblem, aligned, cdiv
from tilecc.simulator.config import HardwareConfig

GROUP_T = 4  # x tiles transposed side by side into one accumulator tile (one copy)


@dataclass(frozen=True)
class MlpSchedule:
    g: int
    w: int

    def __str__(self) -> str:
        return f"g={self.g} w={self.w}"


def sram_bytes(p: MlpProblem, s: MlpSchedule) -> int:
    """SRAM bytes per partition of the kernel's buffers."""
    ia = p.ia
    w1 = cdiv(p.nh, s.g) * p.nk * aligned(s.g * p.TK * ia) * (2 if p.gated else 1)  # (and Wu)
    w2 = p.nh * aligned(p.N * ia)
    hidden = 2 * aligned(p.nh * p.TM * ia)
    xt = 2 * aligned(p.nk * p.TM * ia)
    x_nat = 2 * aligned(p.K * ia)  # the rows transposed (the norm's output, or the loaded x)
    small = aligned(p.H * ia) + aligned(p.N * ia) + aligned(p.TM * ia) + aligned(p.TM * ia)  # biases, ones, identity
    epi = p.epi_sram + p.epi_sram_per_col * s.w * p.TN
    return w1 + w2 + hidden + xt + x_nat + small + epi + p.pro_sram + p.act_sram


def acc_bytes(p: MlpProblem, s: MlpSchedule) -> int:
    """Accumulator bytes per partition: two hidden tiles, two transpose groups, two chunks."""
    return 4 * ((4 if p.gated else 2) * p.TM + 2 * min(GROUP_T, p.nk) * p.TM + 2 * s.w * p.TN)


def fits(p: MlpProblem, s: MlpSchedule, cfg: HardwareConfig) -> bool:
    # a tenth of SRAM stays free for the planner's alignment and other kernels' live data
    return (sram_bytes(p, s) <= cfg.sram.bytes_per_partition * 9 // 10
            and acc_bytes(p, s) <= cfg.accumulator.bytes_per_partition)


def candidates(p: MlpProblem) -> list[MlpSchedule]:
    gs = sorted({min(g, p.nh) for g in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)})
    ws = sorted({min(w, cdiv(p.N, p.TN)) for w in (1, 2, 4, 6, 8)})
    return [MlpSchedule(g, w) for g in gs for w in ws]


__all__ = ["GROUP_T", "MlpSchedule", "acc_bytes", "candidates", "fits", "sram_bytes"]
