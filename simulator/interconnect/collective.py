"""One collective on a system: its time, algorithm bandwidth and bus bandwidth.

    r = run_collective("all_reduce", 1 << 20, "ring:8", LinkConfig(50.0, 500.0))
    r.time_us, r.bus_bandwidth_gbs, r.algorithm      # 43.70 us, 42.0 GB/s, "ring"

Algorithm bandwidth = S / t; bus bandwidth = algbw x 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, 1 for send/recv (nccl-tests' definitions), with
S the size per chip (all-gather: the gathered output; reduce-scatter: the input).

Without `algorithm`, every algorithm that applies is timed in ideal mode and the fastest of
those whose steps share no link (contention.shares_links is False, so that contention mode
finds the same time) is chosen; if none is free of sharing, the fastest overall (in
contention mode: of those it can simulate). Halving-doubling on a chip count that is not a
power of 2 (its fold and unfold move the whole buffer twice more: it wins on latency-bound
sizes only) is left out of that choice when another algorithm's sharing cannot be checked
(over contention.MAX_TRANSFERS without a symmetry): ranked behind it for that reason alone,
a 7x faster tree would lose (1 GiB on switch:1000). The double binary tree's chunk count is
the one minimising its alpha-beta time on the topology's worst route.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tilecc.simulator.interconnect import algorithms, contention
from tilecc.simulator.interconnect.algorithms import double_binary_tree
from tilecc.simulator.interconnect.formulas import bus_factor
from tilecc.simulator.interconnect.ideal import ideal_time_ns
from tilecc.simulator.interconnect.routing import path_stats
from tilecc.simulator.interconnect.schedule import CollectiveError, Schedule
from tilecc.simulator.interconnect.system import LinkConfig
from tilecc.simulator.interconnect.topology import Topology, parse_topology

MODES = ("ideal", "contention")


@dataclass(frozen=True)
class CollectiveResult:
    collective: str
    algorithm: str
    mode: str
    topology: str
    chips: int
    bytes: int
    time_ns: float
    steps: int
    transfers: int
    simulated_transfers: int  # contention mode: after the symmetry reduction
    symmetry: str | None  # contention mode: the group that let one chip stand for all
    chunks: int
    link_energy_uj: float  # bytes x links crossed x pJ/byte, plus static power x time

    @property
    def time_us(self) -> float:
        return self.time_ns / 1e3

    @property
    def algorithm_bandwidth_gbs(self) -> float:
        return self.bytes / self.time_ns if self.time_ns > 0 else float("inf")

    @property
    def bus_bandwidth_gbs(self) -> float:
        return self.algorithm_bandwidth_gbs * bus_factor(self.collective, self.chips)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(time_us=self.time_us, algorithm_bandwidth_gbs=self.algorithm_bandwidth_gbs,
                 bus_bandwidth_gbs=self.bus_bandwidth_gbs)
        return d


def worst_route(topo: Topology, link: LinkConfig) -> tuple[float, float]:
    """(alpha ns, bandwidth bytes/ns) of the slowest chip 0 -> chip d route."""
    dst = np.arange(1, topo.n_chips)
    hops, switches, scale = path_stats(topo, np.zeros_like(dst), dst)
    return float(link.path_latency_ns(hops, switches).max()), float(link.bandwidth_gbs * scale.min())


def make_schedule(collective: str, algorithm: str, topo: Topology, link: LinkConfig, elements: int,
                  itemsize: int = 1, peer: int | None = None) -> Schedule:
    chunks = 1
    if algorithms.check(collective, algorithm, topo, elements, peer) == "double_binary_tree":
        alpha, bw = worst_route(topo, link)
        chunks = min(double_binary_tree.best_chunks(topo.n_chips, elements * itemsize, alpha, bw),
                     max(1, elements // 2))
    return algorithms.build(collective, algorithm, topo, elements, chunks, peer)


def run_collective(collective: str, nbytes: int, topology: Topology | str, link: LinkConfig,
                   algorithm: str | None = None, mode: str = "ideal", itemsize: int = 1,
                   peer: int | None = None) -> CollectiveResult:
    topo = parse_topology(topology) if isinstance(topology, str) else topology
    if mode not in MODES:
        raise CollectiveError(f"unknown mode '{mode}' (allowed: {', '.join(MODES)})")
    if nbytes % itemsize:
        raise CollectiveError(f"{collective} of {nbytes} bytes is not a whole number of {itemsize}-byte elements")
    elements = nbytes // itemsize
    if algorithm is None:
        sched, ideal = _best(collective, topo, link, elements, itemsize, mode, peer)
    else:
        sched = make_schedule(collective, algorithm, topo, link, elements, itemsize, peer)
        ideal = ideal_time_ns(sched, topo, link, itemsize)
    time, simulated, sym = ideal, sched.transfers, None
    link_bytes = _link_bytes(sched, topo, itemsize)
    if mode == "contention":
        c = contention.simulate(sched, topo, link, itemsize)
        time, simulated, sym = c.time_ns, c.simulated_transfers, c.symmetry
    n_links = len(topo.link_src)
    energy_uj = (link_bytes * link.pj_per_byte * 1e-6) + link.static_watts * n_links * time * 1e-3
    return CollectiveResult(collective, sched.algorithm, mode, topo.spec, topo.n_chips, nbytes, time,
                            len(sched.steps), sched.transfers, simulated, sym, sched.chunks, energy_uj)


def _link_bytes(sched: Schedule, topo: Topology, itemsize: int) -> float:
    total = 0.0
    for step in sched.steps:
        hops, _, _ = path_stats(topo, step.src, step.dst)
        total += float((hops * step.count).sum()) * itemsize
    return total


def _best(collective: str, topo: Topology, link: LinkConfig, elements: int, itemsize: int, mode: str,
          peer: int | None) -> tuple[Schedule, float]:
    names = algorithms.applicable(collective, topo, elements)
    if not names:  # raises with the reason
        first = next(a for a, colls in algorithms.ALGORITHMS.items() if collective in colls)
        algorithms.check(collective, first, topo, elements, peer)
    cands = []
    for name in names:
        sched = make_schedule(collective, name, topo, link, elements, itemsize, peer)
        cands.append((name, sched, contention.shares_links(sched, topo)))
    unknown = any(shares is None for _, _, shares in cands)
    best: tuple[bool, float, Schedule] | None = None
    for name, sched, shares in cands:
        if mode == "contention" and shares is None:
            continue  # too many transfers to simulate without a symmetry
        if name == "halving_doubling" and topo.n_chips & (topo.n_chips - 1) and unknown:
            continue  # see the module docstring
        key = (shares is not False, ideal_time_ns(sched, topo, link, itemsize), sched)
        if best is None or key[:2] < best[:2]:
            best = key
    if best is None:
        raise CollectiveError(f"contention mode: no algorithm for {collective} on {topo.spec} can be simulated "
                              f"(none is symmetric and each has over {contention.MAX_TRANSFERS} transfers); "
                              f"use --mode ideal")
    return best[2], best[1]
