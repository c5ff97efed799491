"""Energy and power of a simulated run, from the `[energy]` section of the config.

    dynamic = MACs_bf16 * pj_per_mac_bf16 + MACs_fp32 * pj_per_mac_fp32
            + SRAM bytes * pj_per_sram_byte + accumulator bytes * pj_per_acc_byte
            + HBM bytes (read + written) * pj_per_hbm_byte                      [pJ]
    static  = static_watts * seconds * 1e12                                     [pJ]
    seconds = cycles / (clock_ghz * 1e9)       (core cycles at the core clock)
    power   = (dynamic + static) * 1e-12 / seconds                              [W]
    TOPS/W  = 2 * MACs / ((dynamic + static) * 1e-12) / 1e12    (a MAC is 2 ops)

MACs with an fp32 operand are charged `pj_per_mac_fp32`, MACs with both operands int8 or
both fp8 e4m3 `pj_per_mac_int8` / `pj_per_mac_fp8` (the bf16 figure when unset), the rest
(16-bit, or one 8-bit operand with a 16-bit one) `pj_per_mac_bf16`.
Traffic counts every byte read or written at each memory level: SRAM is
`SimResult.sram_bytes - acc_bytes` (`sram_bytes` counts all on-chip traffic), the
accumulator `acc_bytes`, HBM `hbm_bytes_read + hbm_bytes_written`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tilecc.simulator.config import HardwareConfig

__all__ = ["Energy", "estimate", "from_result"]


@dataclass(frozen=True)
class Energy:
    """Energy in pJ by component, totals, average power and efficiency."""

    mac_pj: float
    sram_pj: float
    acc_pj: float
    hbm_pj: float
    static_pj: float
    total_pj: float
    joules: float
    seconds: float
    watts: float  # average power over the run
    tops_per_watt: float  # 2 * MACs per second per watt, in 1e12

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(
    cfg: HardwareConfig,
    *,
    cycles: float,
    macs: int,
    macs_fp32: int = 0,
    macs_int8: int = 0,
    macs_fp8: int = 0,
    sram_bytes: int = 0,
    acc_bytes: int = 0,
    hbm_bytes: int = 0,
) -> Energy:
    """The energy of a run of `cycles` cycles doing that work and traffic on `cfg`."""
    e = cfg.energy
    seconds = cycles / (cfg.clock_ghz * 1e9)
    pj_int8 = e.pj_per_mac_bf16 if e.pj_per_mac_int8 is None else e.pj_per_mac_int8
    pj_fp8 = e.pj_per_mac_bf16 if e.pj_per_mac_fp8 is None else e.pj_per_mac_fp8
    mac_pj = ((macs - macs_fp32 - macs_int8 - macs_fp8) * e.pj_per_mac_bf16 + macs_fp32 * e.pj_per_mac_fp32
              + macs_int8 * pj_int8 + macs_fp8 * pj_fp8)
    sram_pj = sram_bytes * e.pj_per_sram_byte
    acc_pj = acc_bytes * e.pj_per_acc_byte
    hbm_pj = hbm_bytes * e.pj_per_hbm_byte
    static_pj = e.static_watts * seconds * 1e12
    total_pj = mac_pj + sram_pj + acc_pj + hbm_pj + static_pj
    joules = total_pj * 1e-12
    return Energy(
        mac_pj=mac_pj,
        sram_pj=sram_pj,
        acc_pj=acc_pj,
        hbm_pj=hbm_pj,
        static_pj=static_pj,
        total_pj=total_pj,
        joules=joules,
        seconds=seconds,
        watts=joules / seconds if seconds > 0 else 0.0,
        tops_per_watt=2 * macs / joules / 1e12 if joules > 0 else 0.0,
    )


def from_result(sim: Any, cfg: HardwareConfig) -> Energy:
    """The energy of a `machine.SimResult` on `cfg`."""
    return estimate(
        cfg,
        cycles=float(sim.cycles),
        macs=int(sim.macs),
        macs_fp32=int(sim.macs_fp32),
        macs_int8=int(getattr(sim, "macs_int8", 0)),
        macs_fp8=int(getattr(sim, "macs_fp8", 0)),
        sram_bytes=int(sim.sram_bytes) - int(getattr(sim, "acc_bytes", 0)),
        acc_bytes=int(getattr(sim, "acc_bytes", 0)),
        hbm_bytes=int(sim.hbm_bytes_read + sim.hbm_bytes_written),
    )
