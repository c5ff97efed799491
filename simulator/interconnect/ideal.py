"""Ideal mode: the alpha-beta time of a schedule, with no link shared.

Each transfer takes alpha(route) + bytes / (B x scale(route)) (routing.py; 0 for a local
copy) and starts when its source chip is ready: once every transfer of an earlier step
that involves that chip is done (schedule.py). The result is the critical path, computed
step by step over numpy arrays (a 1,024-chip ring all-reduce: 2,046 steps x 1,024
transfers in ~0.1 s). For the uniform steps of ring, halving-doubling, tree and pairwise
schedules it equals the closed forms of formulas.py exactly.
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.interconnect.routing import path_stats
from tilecc.simulator.interconnect.schedule import Schedule, Step
from tilecc.simulator.interconnect.system import LinkConfig
from tilecc.simulator.interconnect.topology import Topology


def durations(step: Step, topo: Topology, link: LinkConfig, itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """(alpha ns, streaming ns) of each transfer of `step`."""
    hops, switches, scale = path_stats(topo, step.src, step.dst)
    alpha = link.path_latency_ns(hops, switches)
    stream = np.where(hops > 0, step.count * itemsize / (link.bandwidth_gbs * scale), 0.0)
    return alpha, stream


def ideal_time_ns(schedule: Schedule, topo: Topology, link: LinkConfig, itemsize: int = 1) -> float:
    ready = np.zeros(schedule.n)
    routes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # steps share arrays
    for step in schedule.steps:
        key = (id(step.src), id(step.dst))
        if key not in routes:
            hops, switches, scale = path_stats(topo, step.src, step.dst)
            routes[key] = (link.path_latency_ns(hops, switches), hops > 0, link.bandwidth_gbs * scale)
        alpha, moves, bandwidth = routes[key]
        stream = np.where(moves, step.count * itemsize / bandwidth, 0.0)
        end = ready[step.src] + alpha + stream
        new = ready.copy()
        np.maximum.at(new, step.src, end)
        np.maximum.at(new, step.dst, end)
        ready = new
    return float(ready.max())
