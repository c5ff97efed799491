"""The objectives a sweep can optimise: one table, each with its unit, its direction
(minimised or maximised) and how it follows from a point's figures.

A point's figures (`Figures`) come from a simulated report (`tilecc/sweep/evaluate.py`)
or from the cost-model estimate (`tilecc/sweep/estimate.py`): the core cycles, time,
energy, the MACs done, the silicon area (`simulator/area.py`) and the roofline
bound's resource. One inference is one call of the workload's forward, or with the knob
`phase = "decode"` one decode step of the whole batch (tilecc/sweep/knobs.py); the
per-token objectives are defined for decode points only (NaN, never Pareto, elsewhere).
A multi-chip point's energy and area are every chip's (and link's), dp replicas' included
(tilecc/sweep/systems.py), so the per-watt and per-mm^2 objectives count them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OBJECTIVES", "Figures", "Objective", "objective_value"]


@dataclass(frozen=True)
class Figures:
    """What a point's evaluation measured (or estimated)."""

    cycles: float  # core cycles of one inference
    latency_us: float  # those cycles at the core clock, microseconds
    energy_j: float  # energy of one inference, joules (static included; every chip and link of the point)
    roofline_cycles: float  # the workload's roofline bound on this config, core cycles
    macs: float  # MACs of one inference
    area_mm2: float  # silicon area of every chip of the point (simulator/area.py x dp x tp x pp)
    bottleneck: str  # the roofline bound's resource (matrix, hbm, vector)
    tokens: float = float("nan")  # tokens one inference produces (a decode step: the batch; forward: undefined)


@dataclass(frozen=True)
class Objective:
    unit: str
    maximise: bool
    value: Callable[[Figures], float]
    what: str


def _per_second(f: Figures) -> float:
    return 1e6 / f.latency_us if f.latency_us > 0 else float("nan")


def _watts(f: Figures) -> float:
    return f.energy_j / (f.latency_us * 1e-6) if f.latency_us > 0 else float("nan")


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


OBJECTIVES: dict[str, Objective] = {
    "latency": Objective("us", False, lambda f: f.latency_us, "time of one inference"),
    "cycles": Objective("cycles", False, lambda f: f.cycles, "core cycles of one inference"),
    "energy": Objective("J", False, lambda f: f.energy_j, "energy of one inference"),
    "joules_per_inference": Objective("J", False, lambda f: f.energy_j, "energy of one inference"),
    "power": Objective("W", False, _watts, "average power over one inference"),
    "throughput": Objective("inferences/s", True, _per_second, "inferences per second, one after another"),
    "perf_per_watt": Objective("inferences/J", True, lambda f: _div(1.0, f.energy_j),
                               "inferences per second per watt (= per joule)"),
    "tops_per_watt": Objective("TOPS/W", True, lambda f: _div(2 * f.macs, f.energy_j) / 1e12,
                               "2 * MACs per joule, in 1e12"),
    "perf_per_mm2": Objective("inferences/s/mm2", True, lambda f: _div(_per_second(f), f.area_mm2),
                              "throughput per mm^2 of silicon, every chip (the [area] model)"),
    "area": Objective("mm2", False, lambda f: f.area_mm2, "silicon area of every chip of the point (the [area] model)"),
    "roofline_ratio": Objective("x", False, lambda f: _div(f.cycles, f.roofline_cycles),
                                "cycles over the workload's roofline bound (1.0 is the limit)"),
    "tokens_per_second": Objective("tokens/s", True, lambda f: _div(f.tokens * 1e6, f.latency_us),
                                   "tokens per second (phase = \"decode\": batch / time per output token)"),
    "joules_per_token": Objective("J", False, lambda f: _div(f.energy_j, f.tokens),
                                  "energy per generated token (phase = \"decode\")"),
    "tpot": Objective("us", False, lambda f: f.latency_us if f.tokens == f.tokens else float("nan"),
                      "time per output token (phase = \"decode\")"),
    "edp": Objective("J*s", False, lambda f: f.energy_j * f.latency_us * 1e-6, "energy-delay product"),
}


def objective_value(name: str, figures: Figures) -> float:
    return float(OBJECTIVES[name].value(figures))
