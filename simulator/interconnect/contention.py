"""Contention mode: an event simulation of a schedule's transfers over the routed links.

A transfer waits for its source chip (schedule.py's rule: every transfer of an earlier step
involving the chip is done), then its route's latency alpha (routing.py), then streams its
bytes. Every link's bandwidth is shared equally among the streaming transfers that cross
it, and a transfer streams at the smallest share along its route; the rates are recomputed
whenever transfers start or end streaming (processor sharing, like the DMA transfers
sharing HBM in simulator/scheduler.py; events at the same instant are taken together).
Alone, a transfer takes alpha + bytes / B, its ideal time; two transfers sharing one link
take twice as long to stream.

Symmetry (the rule): when every step is invariant under a group of chip permutations that
the topology admits and that acts freely on its links (the translations of the chip digits
on every topology, Topology.relative; on a switch with 2**m chips and on a fat-tree of
radix 2**m also r -> r XOR v, digit by digit as the translations), and
each chip's transfers, as (destination relative to the source, elements), are chip 0's
mapped by the group (a ring on a ring, one ring per dimension on a torus or per level on a
fat-tree, halving-doubling on a switch, pairwise all-to-all on a switch), every chip runs
the same schedule at the same times, so only chip 0's transfers are simulated. A link's
load is then the number of chip 0's streaming transfers whose route crosses a link of its
orbit (Topology.link_orbit), with multiplicity; a receive into chip 0 ends when the
sender's image of chip 0's transfer of that step does, i.e. with it. Schedules without that
symmetry are simulated transfer by transfer, up to MAX_TRANSFERS.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

import numpy as np

from tilecc.simulator.interconnect.routing import path_stats, route
from tilecc.simulator.interconnect.schedule import CollectiveError, Schedule
from tilecc.simulator.interconnect.system import LinkConfig
from tilecc.simulator.interconnect.topology import Topology

MAX_TRANSFERS = 20_000


@dataclass(frozen=True)
class ContentionResult:
    time_ns: float
    simulated_transfers: int
    symmetry: str | None  # "translation", "xor" or None (every transfer simulated)


def _relative(topo: Topology, group: str, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    return topo.relative(src, dst) if group == "translation" else src ^ dst


def symmetry(schedule: Schedule, topo: Topology) -> str | None:
    """The group under which every step is chip 0's transfers mapped to every chip, if any."""
    key = ("symmetry", topo.spec)
    if key not in schedule.memo:
        schedule.memo[key] = _symmetry(schedule, topo)
    return schedule.memo[key]


def _symmetry(schedule: Schedule, topo: Topology) -> str | None:
    n = schedule.n
    radix = topo.dims[0] if topo.kind == "fattree" else n
    xor = topo.kind in ("switch", "fattree") and radix & (radix - 1) == 0
    for group in ["translation"] + (["xor"] if xor else []):
        rels: dict[tuple[int, int], np.ndarray | None] = {}  # steps share their src / dst arrays
        if all(_invariant(step, n, topo, group, rels) for step in schedule.steps):
            return group
    return None


def _invariant(step, n: int, topo: Topology, group: str, rels: dict) -> bool:
    key = (id(step.src), id(step.dst))
    if key not in rels:
        rel = _relative(topo, group, step.src, step.dst)
        one_each = len(step) == n and bool(np.all(step.src == np.arange(n)))
        rels[key] = rel if not one_each else (rel if np.all(rel == rel[0]) else None)
        rels[key, "one"] = one_each
    rel = rels[key]
    if rels[key, "one"]:  # one transfer per chip, in chip order: all alike, of one size
        return rel is not None and bool(step.count.min() == step.count.max())
    if len(step) % n or not np.all(np.bincount(step.src, minlength=n) == len(step) // n):
        return False
    order = np.lexsort((step.count, rel, step.src))
    keys = np.stack([rel[order], step.count[order]], axis=1).reshape(n, len(step) // n, 2)
    return bool(np.all(keys == keys[0]))


@dataclass
class _Transfers:
    step: np.ndarray
    src: np.ndarray
    bytes: np.ndarray
    alpha: np.ndarray
    links: np.ndarray  # [transfers, longest route] orbit (or link) ids, padded with the dummy id
    chips: list[tuple[int, ...]]  # the chips each involves (symmetric: chip 0)


def _transfers(schedule: Schedule, topo: Topology, link: LinkConfig, itemsize: int, sym: str | None,
               dummy: int) -> _Transfers:
    cols: dict[str, list] = {"step": [], "src": [], "bytes": [], "alpha": [], "routes": [], "chips": []}
    for t, step in enumerate(schedule.steps):
        keep = step.src == 0 if sym else np.ones(len(step), bool)
        src, dst, count = step.src[keep], step.dst[keep], step.count[keep]
        hops, switches, _ = path_stats(topo, src, dst)
        cols["alpha"] += link.path_latency_ns(hops, switches).tolist()
        for s, d, c in zip(src.tolist(), dst.tolist(), count.tolist()):
            links = route(topo, s, d)
            cols["routes"].append(topo.link_orbit[links].tolist() if sym else links)
            cols["step"].append(t)
            cols["src"].append(s)
            cols["bytes"].append(float(c * itemsize) if links else 0.0)
            cols["chips"].append((s,) if sym or s == d else (s, d))
    width = max((len(r) for r in cols["routes"]), default=1) or 1
    links = np.full((len(cols["routes"]), width), dummy, np.int64)
    for i, r in enumerate(cols["routes"]):
        links[i, :len(r)] = r
    return _Transfers(np.array(cols["step"], np.int64), np.array(cols["src"], np.int64),
                      np.array(cols["bytes"]), np.array(cols["alpha"]), links, cols["chips"])


def count_transfers(schedule: Schedule, sym: str | None) -> int:
    return sum(int((s.src == 0).sum()) for s in schedule.steps) if sym else schedule.transfers


def simulate(schedule: Schedule, topo: Topology, link: LinkConfig, itemsize: int = 1,
             use_symmetry: bool = True) -> ContentionResult:
    """The schedule's time with shared links (`use_symmetry=False`: every transfer simulated,
    to check the symmetry rule)."""
    sym = symmetry(schedule, topo) if use_symmetry else None
    count = count_transfers(schedule, sym)
    if count > MAX_TRANSFERS:
        raise CollectiveError(
            f"contention mode: {schedule.algorithm} {schedule.collective} on {topo.spec} has {count} "
            f"transfers without a symmetry (at most {MAX_TRANSFERS} are simulated one by one); use --mode "
            f"ideal, fewer chips, or a symmetric algorithm (ring on a ring, multiring, halving_doubling on a switch)")
    ids = topo.link_orbit if sym else np.arange(len(topo.link_src))
    dummy = int(ids.max()) + 1
    cap = np.full(dummy + 1, np.inf)
    cap[ids] = link.bandwidth_gbs * topo.link_scale
    tr = _transfers(schedule, topo, link, itemsize, sym, dummy)
    return ContentionResult(_run(tr, cap), len(tr.step), sym)


def _dependences(tr: _Transfers) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], int],
                                          list[list[tuple[int, int]]]]:
    """Send groups (chip, k: its k-th sending step), how many transfers each waits for
    (those involving the chip since its previous sending step), and who each transfer frees."""
    send_steps: dict[int, list[int]] = {}
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (s, t) in enumerate(zip(tr.src.tolist(), tr.step.tolist())):
        steps = send_steps.setdefault(s, [])
        if not steps or steps[-1] != t:
            steps.append(t)
        groups.setdefault((s, len(steps) - 1), []).append(i)
    need = {g: 0 for g in groups}
    frees: list[list[tuple[int, int]]] = [[] for _ in range(len(tr.step))]
    for i, t in enumerate(tr.step.tolist()):
        for chip in tr.chips[i]:
            steps = send_steps.get(chip, [])
            k = bisect.bisect_right(steps, t)
            if k < len(steps):
                need[(chip, k)] += 1
                frees[i].append((chip, k))
    return groups, need, frees


def _run(tr: _Transfers, cap: np.ndarray) -> float:
    """The event loop; the time (ns) the last transfer ends."""
    groups, need, frees = _dependences(tr)
    left = tr.bytes.copy()
    rate = np.zeros(len(left))
    active = np.zeros(0, np.int64)  # streaming transfers
    starts: list[tuple[float, int]] = []  # (time its latency is over, transfer)
    now = end = 0.0

    def release(g: tuple[int, int]) -> None:
        for i in groups[g]:
            heapq.heappush(starts, (now + float(tr.alpha[i]), i))

    def finish(i: int) -> None:
        for g in frees[i]:
            need[g] -= 1
            if need[g] == 0:
                release(g)

    for g, k in need.items():
        if k == 0 and g[1] == 0:
            release(g)
    while starts or len(active):
        t_start = starts[0][0] if starts else np.inf
        fin = now + left[active] / rate[active] if len(active) else np.zeros(0)
        t_next = min(t_start, float(fin.min()) if len(fin) else np.inf)
        slack = 1e-12 * max(t_next, 1.0)  # ends this close together are one event (no float stalls)
        ending = fin <= t_next + slack
        left[active] = np.where(ending, 0.0, np.maximum(left[active] - rate[active] * (t_next - now), 0.0))
        now = t_next
        done = active[ending]
        if len(done):
            end = now
            active = active[~ending]
            for i in done.tolist():
                finish(i)
        begun = []
        while starts and starts[0][0] <= now + slack:
            _, i = heapq.heappop(starts)
            if left[i] > 0:
                begun.append(i)
            else:  # a local copy: done now
                end = max(end, now)
                finish(i)
        if begun:
            active = np.concatenate([active, np.array(begun, np.int64)])
        if len(active):
            ls = tr.links[active]
            load = np.bincount(ls.ravel(), minlength=len(cap)).astype(np.float64)
            rate[active] = (cap[ls] / load[ls]).min(axis=1)
    return end


def shares_links(schedule: Schedule, topo: Topology) -> bool | None:
    """Whether two transfers of one step cross the same link (False: contention mode adds
    nothing to the ideal time, as long as chips stay in step); None when there are too many
    transfers to route (no symmetry and over MAX_TRANSFERS)."""
    sym = symmetry(schedule, topo)
    if count_transfers(schedule, sym) > MAX_TRANSFERS:
        return None
    for step in schedule.steps:
        keep = step.src == 0 if sym else np.ones(len(step), bool)
        used: set[int] = set()
        for s, d in zip(step.src[keep].tolist(), step.dst[keep].tolist()):
            links = route(topo, s, d)
            for x in topo.link_orbit[links].tolist() if sym else links:
                if x in used:
                    return True
                used.add(x)
    return False
