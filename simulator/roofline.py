"""The roofline bound: a workload's intrinsic work over the peak rates of a config.

The work is a property of the workload (the model or kernel as written, its input
shapes and dtypes), never of the compiled program: `ir/graph_work.py` counts it on the
imported graph before any pass, `frontend/dsl/work.py` on a tile-DSL kernel's source.
This module turns it into cycles of the core clock (the report's time base), one figure
per resource:

- matrix: (MACs with 16-bit operands + fp32 MACs * matrix.fp32_slowdown + MACs with both
  operands int8 / fp8 divided by matrix.int8_speedup / matrix.fp8_speedup) / (R*C), in
  matrix-engine cycles, converted to core cycles;
- hbm: compulsory HBM bytes (inputs, the user's weights and buffers, outputs, each
  once) / hbm.bytes_per_cycle;
- vector: irreducible element work (sum of elements * op cost * inputs, vector-engine
  cycles of one lane) / lanes, converted to core cycles.

The bound is the largest; `roofline_ratio = cycles / bound >= 1` (1.0 is the physical
limit). The same formulas divide the program's own work (`program_work`), which the
report shows beside the bound so that the compiler's overhead is visible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import core_cycles_per

__all__ = ["IntrinsicWork", "roofline", "WORK_KEYS"]

WORK_KEYS = ("macs_16", "macs_fp32", "vector_element_cycles", "compulsory_hbm_bytes")
# both-8-bit MACs: written beside WORK_KEYS, read as 0 where absent (programs saved before them)
LOWP_WORK_KEYS = ("macs_int8", "macs_fp8")


@dataclass(frozen=True)
class IntrinsicWork:
    """The work a workload needs on any program for it (see the module docstring)."""

    macs_16: float = 0.0  # MACs whose operands are both 16-bit (bf16, fp16)
    macs_fp32: float = 0.0  # MACs with an fp32 operand
    vector_element_cycles: float = 0.0  # sum of elements * op cost * inputs (one lane)
    compulsory_hbm_bytes: float = 0.0  # inputs + weights and buffers + outputs, once
    # what each kind of op contributed: kind -> {"macs": .., "vector": .., "count": ..}
    by_op: dict[str, dict[str, float]] = field(default_factory=dict)
    macs_int8: float = 0.0  # MACs with both operands int8 (at matrix.int8_speedup)
    macs_fp8: float = 0.0  # MACs with both operands fp8 e4m3 (at matrix.fp8_speedup)

    def figures(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in WORK_KEYS + LOWP_WORK_KEYS}

    def to_dict(self) -> dict:
        return asdict(self)


def roofline(work: Mapping[str, float], cfg: HardwareConfig) -> dict[str, float]:
    """Core cycles each resource needs for `work` at its peak rate (keys: matrix, hbm, vector)."""
    array = cfg.matrix.rows * cfg.matrix.cols
    macs = (work["macs_16"] + work["macs_fp32"] * cfg.matrix.fp32_slowdown
            + work.get("macs_int8", 0.0) / cfg.matrix.int8_speedup + work.get("macs_fp8", 0.0) / cfg.matrix.fp8_speedup)
    return {
        "matrix": macs / array * core_cycles_per(cfg, "matrix"),
        "hbm": work["compulsory_hbm_bytes"] / cfg.hbm.bytes_per_cycle,
        "vector": work["vector_element_cycles"] / cfg.vector.lanes * core_cycles_per(cfg, "vector"),
    }
