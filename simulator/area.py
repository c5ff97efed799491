"""Silicon area of a config, from the `[area]` section (mm^2 per component, sources in
the presets):

    matrix      = rows * cols * mm2_per_mac_bf16            (the array computes bf16;
                                                             fp32 runs as passes, no area)
    sram        = sram.partitions * bytes_per_partition / MiB * mm2_per_sram_mib
    accumulator = accumulator.partitions * bytes_per_partition / MiB * mm2_per_sram_mib
    vector      = vector.lanes * mm2_per_vector_lane
    hbm_phy     = HBM GB/s / hbm_phy_gbytes_per_s * mm2_per_hbm_phy   (a share of a PHY
                  when the core has part of one; HBM GB/s = bytes_per_cycle * clock_ghz)
    serdes      = serdes_lanes * mm2_per_serdes_lane
    fixed       = fixed_mm2
    total       = the sum of the above

`perf_per_mm2` (tilecc/sweep/objectives.py) divides throughput by `total`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tilecc.errors import ConfigError
from tilecc.simulator.config import HardwareConfig

__all__ = ["Area", "area"]

MIB = 1 << 20


@dataclass(frozen=True)
class Area:
    """mm^2 by component and their total."""

    matrix: float
    sram: float
    accumulator: float
    vector: float
    hbm_phy: float
    serdes: float
    fixed: float

    @property
    def total(self) -> float:
        return self.matrix + self.sram + self.accumulator + self.vector + self.hbm_phy + self.serdes + self.fixed

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def area(cfg: HardwareConfig) -> Area:
    """The area of `cfg`'s core (see the module docstring)."""
    a = cfg.area
    if a is None:
        raise ConfigError(f"config '{cfg.name}' has no [area] table: the area model needs one "
                          "(mm^2 per MAC, per SRAM MiB, per vector lane, ...; see the presets' [area])")
    hbm_gbytes_per_s = cfg.hbm.bytes_per_cycle * cfg.clock_ghz
    return Area(
        matrix=cfg.matrix.rows * cfg.matrix.cols * a.mm2_per_mac_bf16,
        sram=cfg.sram.partitions * cfg.sram.bytes_per_partition / MIB * a.mm2_per_sram_mib,
        accumulator=cfg.accumulator.partitions * cfg.accumulator.bytes_per_partition / MIB * a.mm2_per_sram_mib,
        vector=cfg.vector.lanes * a.mm2_per_vector_lane,
        hbm_phy=hbm_gbytes_per_s / a.hbm_phy_gbytes_per_s * a.mm2_per_hbm_phy,
        serdes=a.serdes_lanes * a.mm2_per_serdes_lane,
        fixed=a.fixed_mm2,
    )
