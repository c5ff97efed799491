"""The performance report of one program run: cycles against the roofline bound.

The roofline bound of a program on a config is the largest of
- matrix:  bf16 MACs / (R*C) + fp32 MACs * fp32_slowdown / (R*C)   (cycles)
- hbm:     compulsory HBM bytes (inputs, weights, outputs, once) / bytes per cycle
- vector:  element-op cycles the program's vector work needs at full lane rate
and `roofline_ratio = cycles / roofline_cycles >= 1` (1.0 is the physical limit).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tilecc.simulator.config import HardwareConfig


def roofline(work: dict[str, float], cfg: HardwareConfig) -> dict[str, float]:
    array = cfg.matrix.rows * cfg.matrix.cols
    return {
        "matrix": (work["macs_bf16"] + work["macs_fp32"] * cfg.matrix.fp32_slowdown) / array,
        "hbm": work["compulsory_hbm_bytes"] / cfg.hbm.bytes_per_cycle,
        "vector": work["vector_element_cycles"] / cfg.vector.lanes,
    }


@dataclass
class Report:
    target: str
    cycles: float
    time_us: float
    roofline_cycles: float
    roofline_ratio: float
    bottleneck: str
    roofline_components: dict[str, float]
    utilization: dict[str, float]
    engine_busy: dict[str, float]
    hbm_bytes: int
    compulsory_hbm_bytes: int
    instructions: int
    instructions_by_engine: dict[str, int]
    macs: int
    kernels: int
    simulate_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = [
            f"target            {self.target}",
            f"cycles            {self.cycles:,.0f}  ({self.time_us:,.2f} us)",
            f"roofline bound    {self.roofline_cycles:,.0f} cycles, set by {self.bottleneck}",
            f"roofline ratio    {self.roofline_ratio:.2f}x  (1.00 is the physical limit)",
            "bound by resource " + ", ".join(f"{k} {v:,.0f}" for k, v in self.roofline_components.items()),
            "utilisation       " + ", ".join(f"{k} {v:.1%}" for k, v in self.utilization.items()),
            f"HBM traffic       {self.hbm_bytes:,} bytes (compulsory {self.compulsory_hbm_bytes:,})",
            f"instructions      {self.instructions:,} ("
            + ", ".join(f"{k} {v:,}" for k, v in self.instructions_by_engine.items())
            + f") in {self.kernels} kernels",
            f"MACs              {self.macs:,}",
        ]
        return "\n".join(lines)


def make_report(sim, work: dict[str, float], cfg: HardwareConfig, simulate_seconds: float) -> Report:
    comps = roofline(work, cfg)
    bottleneck = max(comps, key=lambda k: comps[k])
    bound = max(max(comps.values()), 1.0)
    cycles = float(sim.cycles)
    return Report(
        target=cfg.name,
        cycles=cycles,
        time_us=cycles / (cfg.clock_ghz * 1e3),
        roofline_cycles=bound,
        roofline_ratio=cycles / bound if bound else float("inf"),
        bottleneck=bottleneck,
        roofline_components=comps,
        utilization={k: sim.utilization[k] for k in ("dma", "matrix", "vector") if k in sim.utilization},
        engine_busy=dict(sim.engine_busy),
        hbm_bytes=int(sim.hbm_bytes_read + sim.hbm_bytes_written),
        compulsory_hbm_bytes=int(work["compulsory_hbm_bytes"]),
        instructions=int(sim.instructions),
        instructions_by_engine=dict(sim.instructions_by_engine),
        macs=int(sim.macs),
        kernels=int(sim.kernels),
        simulate_seconds=simulate_seconds,
    )
