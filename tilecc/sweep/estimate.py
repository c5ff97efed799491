"""The fast tier (`--fidelity estimate`): a point's figures from the cost model alone,
without compiling or simulating.

    est = Estimator(workload)               # exports and imports the graph once
    est.figures(cfg)                        # the roofline bound x the calibration factors
    est.calibrate([(cfg, full_figures), ...])   # fits the factors on simulated points

The intrinsic work (`ir/graph_work.py`: MACs, vector element-cycles, compulsory HBM
bytes) is counted once per workload (again only for another vector op-cost table); a
point then costs one `simulator.roofline.roofline` call:

    cycles  = k_cycles * max(matrix, hbm, vector bound)         (core cycles)
    dynamic = k_energy * (MACs * pJ/MAC + compulsory HBM bytes * pJ/byte)
    energy  = dynamic + static_watts * cycles / clock

`k_cycles` and `k_energy` are the geometric means of simulated / estimated over the
calibration points (both 1.0 without any: the bare bound). The sweep measures the error
leave-one-out (each sample point estimated with the factors of the others) and prints
it. A point whose compulsory bytes exceed the HBM capacity fails ("does not fit").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tilecc.errors import TileccError
from tilecc.simulator.area import area
from tilecc.simulator.config import HardwareConfig, VectorOpCost
from tilecc.simulator.roofline import IntrinsicWork, roofline
from tilecc.sweep.objectives import Figures

__all__ = ["DoesNotFit", "Estimator", "EstimateError", "relative_error"]


class DoesNotFit(TileccError):
    """The workload cannot fit this point's memory (a failed point, with this reason)."""


@dataclass(frozen=True)
class EstimateError:
    """Relative errors of the estimate against simulation on the sample points."""

    points: int
    latency: list[float]
    energy: list[float]

    def summary(self) -> str:
        if not self.points:
            return "estimate error: not measured (no calibration point simulated)"
        return (f"estimate error against full simulation on {self.points} sample point(s), leave-one-out: "
                f"latency mean {_pct(self.latency)} max {_pct(self.latency, max)}, "
                f"energy mean {_pct(self.energy)} max {_pct(self.energy, max)}")


def _pct(xs: list[float], agg: Any = None) -> str:
    if not xs:
        return "n/a"
    v = agg(xs) if agg else sum(xs) / len(xs)
    return f"{100 * v:.1f} %"


def relative_error(est: float, full: float) -> float:
    return abs(est - full) / abs(full) if full else float("inf")


class Estimator:
    def __init__(self, workload: str):
        from tilecc.sweep.evaluate import _workload

        self.workload = workload
        self._ep = _workload(workload)[0]
        self._gp: Any = None
        self._work: dict[VectorOpCost, IntrinsicWork] = {}
        self.k_cycles = 1.0
        self.k_energy = 1.0

    def work(self, cfg: HardwareConfig) -> IntrinsicWork:
        cost = cfg.vector.op_cost
        if cost not in self._work:
            from tilecc.frontend.dsl.work import dsl_call_work
            from tilecc.frontend.torch_export import import_exported_program
            from tilecc.ir.graph_work import graph_work

            if self._gp is None:
                self._gp = import_exported_program(self._ep)
            self._work[cost] = graph_work(self._gp, cfg, dsl_call_work)
        return self._work[cost]

    def raw(self, cfg: HardwareConfig) -> tuple[float, float, str]:
        """(bound cycles, dynamic joules before calibration, the bound's resource)."""
        w = self.work(cfg)
        comps = roofline(w.figures(), cfg)
        bottleneck = max(comps, key=lambda k: comps[k])
        e = cfg.energy
        pj_int8 = e.pj_per_mac_bf16 if e.pj_per_mac_int8 is None else e.pj_per_mac_int8
        pj_fp8 = e.pj_per_mac_bf16 if e.pj_per_mac_fp8 is None else e.pj_per_mac_fp8
        pj = (w.macs_16 * e.pj_per_mac_bf16 + w.macs_fp32 * e.pj_per_mac_fp32 + w.macs_int8 * pj_int8
              + w.macs_fp8 * pj_fp8 + w.compulsory_hbm_bytes * e.pj_per_hbm_byte)
        return max(max(comps.values()), 1.0), pj * 1e-12, bottleneck

    def figures(self, cfg: HardwareConfig, k_cycles: float | None = None, k_energy: float | None = None) -> Figures:
        w = self.work(cfg)
        if w.compulsory_hbm_bytes > cfg.hbm.capacity_bytes:
            raise DoesNotFit(f"does not fit: the workload's {w.compulsory_hbm_bytes:,.0f} compulsory bytes exceed "
                              f"'hbm.capacity_bytes' = {cfg.hbm.capacity_bytes:,}")
        bound, dynamic, bottleneck = self.raw(cfg)
        cycles = bound * (self.k_cycles if k_cycles is None else k_cycles)
        seconds = cycles / (cfg.clock_ghz * 1e9)
        energy = dynamic * (self.k_energy if k_energy is None else k_energy) + cfg.energy.static_watts * seconds
        mm2 = area(cfg).total if cfg.area is not None else float("nan")
        return Figures(cycles=cycles, latency_us=seconds * 1e6, energy_j=energy, roofline_cycles=bound,
                       macs=w.macs_16 + w.macs_fp32 + w.macs_int8 + w.macs_fp8, area_mm2=mm2, bottleneck=bottleneck)

    def _ratios(self, sample: list[tuple[HardwareConfig, Figures]]) -> list[tuple[float, float]]:
        out = []
        for cfg, full in sample:
            bound, dynamic, _ = self.raw(cfg)
            full_dynamic = full.energy_j - cfg.energy.static_watts * full.latency_us * 1e-6
            out.append((math.log(full.cycles / bound), math.log(max(full_dynamic, 1e-30) / max(dynamic, 1e-30))))
        return out

    def calibrate(self, sample: list[tuple[HardwareConfig, Figures]]) -> EstimateError:
        """Fit the factors on `sample` (config, simulated figures); the leave-one-out error."""
        logs = self._ratios(sample)
        if logs:
            self.k_cycles = math.exp(sum(c for c, _ in logs) / len(logs))
            self.k_energy = math.exp(sum(e for _, e in logs) / len(logs))
        lat: list[float] = []
        en: list[float] = []
        for i, (cfg, full) in enumerate(sample):
            others = logs[:i] + logs[i + 1:]
            if not others:
                continue
            kc = math.exp(sum(c for c, _ in others) / len(others))
            ke = math.exp(sum(e for _, e in others) / len(others))
            est = self.figures(cfg, kc, ke)
            lat.append(relative_error(est.latency_us, full.latency_us))
            en.append(relative_error(est.energy_j, full.energy_j))
        return EstimateError(len(lat), lat, en)
