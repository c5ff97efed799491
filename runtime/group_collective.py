"""Collectives over groups of chips inside a system, every group at once: the tensor-,
pipeline- and data-parallel groups of a chip grid sharing one interconnect.

    r = group_collective("all_reduce", 64 << 20, system, groups=[[0, 64, 128, ...], [1, 65, ...], ...])
    r.time_ns, r.algorithm          # every group runs it at the same time, on shared links
    t = concurrent_sends([(0, 8), (1, 9), ...], nbytes, system)   # point-to-point, all at once
    outs, r = all_reduce_blocks([[a0, a1], [b0, b1]], system, [[0, 1], [2, 3]])   # with real data

Each group runs the algorithm's schedule for its size (simulator/interconnect/algorithms: a
ring, or halving-doubling), its rank r mapped to chip
groups[g][r]; the groups' transfers of a step form one step of a schedule over the whole
system, timed by the interconnect's ideal or contention model (contention.py: bandwidth
shared among the transfers crossing a link, so groups meeting on a fat-tree's upper links
slow each other). Contention mode simulates chip 0's transfers only when the combined
schedule has the symmetry contention.py states (a ring over data-parallel replicas at a
fixed stride on a fat-tree: translation; halving-doubling inside aligned tensor-parallel
groups: XOR), else every transfer (up to contention.MAX_TRANSFERS). Without `algorithm`
the faster of the two is taken (in the mode asked); halving-doubling is a candidate there
only for a power-of-2 size: its form for other sizes (the extra ranks folded into a 2^k
core, algorithms/halving_doubling.py) has no symmetry, so contention mode would simulate
every transfer of every group. `algorithm="halving_doubling"` runs it at any size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tilecc.errors import TileccError
from tilecc.simulator.interconnect import algorithms, contention
from tilecc.simulator.interconnect.functional import run as run_schedule
from tilecc.simulator.interconnect.ideal import ideal_time_ns
from tilecc.simulator.interconnect.schedule import Schedule, Step
from tilecc.simulator.interconnect.system import SystemConfig
from tilecc.simulator.interconnect.topology import parse_topology

GROUP_ALGORITHMS = ("ring", "halving_doubling")


@dataclass(frozen=True)
class GroupResult:
    collective: str
    algorithm: str
    mode: str
    groups: int
    group_size: int
    bytes: int  # per chip
    time_ns: float
    simulated_transfers: int
    symmetry: str | None


def group_schedule(collective: str, algorithm: str, groups: np.ndarray, n_chips: int, elements: int) -> Schedule:
    """The groups' schedules as one schedule over `n_chips` chips."""
    size = groups.shape[1]
    local = algorithms.build(collective, algorithm, parse_topology(f"ring:{size}"), elements)
    steps = []
    g = groups.shape[0]
    for st in local.steps:
        steps.append(Step.make(groups[:, st.src].ravel(), groups[:, st.dst].ravel(), np.tile(st.src_off, g),
                               np.tile(st.dst_off, g), np.tile(st.count, g), np.tile(st.reduce, g)))
    return Schedule(collective, local.algorithm, n_chips, elements, steps, local.chunks)


def group_collective(collective: str, nbytes: int, system: SystemConfig, groups: list[list[int]] | np.ndarray, *,
                     mode: str = "contention", itemsize: int = 2, algorithm: str | None = None) -> GroupResult:
    arr = np.asarray(groups, np.int64)
    topo, link = system.topology, system.link
    if arr.ndim != 2 or arr.size == 0:
        raise TileccError(f"group collective: groups must be a list of equal-size chip lists, got shape {arr.shape}")
    if arr.min() < 0 or arr.max() >= topo.n_chips or len(np.unique(arr)) != arr.size:
        raise TileccError(f"group collective: groups must name distinct chips of {topo.spec} (0..{topo.n_chips - 1})")
    size = arr.shape[1]
    if size == 1 or nbytes == 0:
        return GroupResult(collective, "none", mode, arr.shape[0], size, nbytes, 0.0, 0, None)
    elements = max(1, nbytes // itemsize)
    names = [algorithm] if algorithm else [a for a in GROUP_ALGORITHMS
                                           if a != "halving_doubling" or size & (size - 1) == 0]
    best: GroupResult | None = None
    for name in names:
        sched = group_schedule(collective, name, arr, topo.n_chips, elements)
        if mode == "contention":
            c = contention.simulate(sched, topo, link, itemsize)
            res = GroupResult(collective, name, mode, arr.shape[0], size, nbytes, c.time_ns, c.simulated_transfers,
                              c.symmetry)
        else:
            res = GroupResult(collective, name, mode, arr.shape[0], size, nbytes,
                              ideal_time_ns(sched, topo, link, itemsize), sched.transfers, None)
        if best is None or res.time_ns < best.time_ns:
            best = res
    assert best is not None
    return best


def concurrent_sends(pairs: list[tuple[int, int]], nbytes: int, system: SystemConfig, *,
                     mode: str = "contention") -> float:
    """The time (ns) of point-to-point transfers of `nbytes` each, all started together."""
    if not pairs or nbytes == 0:
        return 0.0
    src = np.array([p[0] for p in pairs], np.int64)
    dst = np.array([p[1] for p in pairs], np.int64)
    step = Step.make(src, dst, 0, 0, nbytes, False)
    sched = Schedule("send_recv", "direct", system.topology.n_chips, nbytes, [step])
    if mode == "contention":
        return contention.simulate(sched, system.topology, system.link, 1).time_ns
    return ideal_time_ns(sched, system.topology, system.link, 1)


def all_reduce_blocks(blocks: list[list[torch.Tensor]], system: SystemConfig, groups: list[list[int]] | np.ndarray,
                      *, mode: str = "contention") -> tuple[list[list[torch.Tensor]], GroupResult]:
    """The all-reduce of real data: blocks[g][r] is chip groups[g][r]'s tensor; each group's
    sum (every rank's copy) comes from running the ring schedule on its blocks (functional,
    fp32), and the time from `group_collective` over all the groups at once."""
    arr = np.asarray(groups, np.int64)
    first = blocks[0][0]
    size = arr.shape[1]
    outs = []
    for grp in blocks:
        flat = [b.contiguous().reshape(-1).float().numpy() for b in grp]
        if size > 1:
            flat = run_schedule(group_schedule("all_reduce", "ring", np.arange(size)[None, :], size, len(flat[0])),
                                flat)
        outs.append([torch.from_numpy(o).to(first.dtype).reshape(first.shape) for o in flat])
    res = group_collective("all_reduce", first.numel() * first.element_size(), system, arr, mode=mode,
                           itemsize=first.element_size())
    return outs, res
