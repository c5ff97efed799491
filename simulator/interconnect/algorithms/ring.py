"""Ring and multi-dimensional ring collectives (reduce-scatter, all-gather, all-reduce).

A 1-D ring over n chips: n blocks; in step t of the reduce-scatter chip i adds block
(i - t - 1) mod n into chip i+1, so that after n-1 steps chip i holds block i summed; the
all-gather then forwards block (i - t) mod n for n-1 steps. Time 2(n-1)(alpha + S/(nB)).

The multi-dimensional ring (`multiring`) does the same along each digit of the chip id
(Topology.dims): on a torus one ring per dimension, on a fat-tree one per level (the
hierarchical algorithm), on a ring or switch the 1-D ring. A reduce-scatter along
dimension d cuts each chip's current region into dims[d] blocks, so the message shrinks by
each dimension's size; the all-gather retraces the dimensions in reverse order.

    schedule("all_reduce", n=4, elements=8, dims=(4,))   # 6 steps of 4 transfers of 2 elements

All-reduce reduces along dimension 0 first (a fat-tree's leaf level: the largest message on
the fastest links). A standalone reduce-scatter goes from the last dimension to the first
and an all-gather from the first to the last, so that chip r ends with (or starts from)
shard r of the buffer.
"""

from __future__ import annotations

import math

import numpy as np

from tilecc.simulator.interconnect.schedule import Schedule, Step, bounds

Region = tuple[np.ndarray, np.ndarray]  # per chip: (first shard, shards): the buffer cut in n shards


def schedule(collective: str, n: int, elements: int, dims: tuple[int, ...], name: str = "ring") -> Schedule:
    assert math.prod(dims) == n, "the ring's dims must multiply to the chip count"
    sched = Schedule(collective, name, n, elements)
    chips = np.arange(n, dtype=np.int64)
    digits = np.stack([(chips // math.prod(dims[:d])) % dims[d] for d in range(len(dims))], axis=1)
    region: Region = (np.zeros(n, np.int64), np.full(n, n, np.int64))
    order = list(range(len(dims)))
    if collective == "all_reduce":
        stack = [region]
        for d in order:
            region = _reduce_scatter(sched, chips, digits, dims, d, region)
            stack.append(region)
        for d in reversed(order):
            stack.pop()
            _all_gather(sched, chips, digits, dims, d, stack[-1])
    elif collective == "reduce_scatter":
        for d in reversed(order):
            region = _reduce_scatter(sched, chips, digits, dims, d, region)
    else:  # all_gather: the regions a reduce-scatter would leave, retraced
        stack = [region]
        for d in reversed(order):
            stack.append(_shrink(region := stack[-1], digits[:, d], dims[d]))
        for d in order:
            stack.pop()
            _all_gather(sched, chips, digits, dims, d, stack[-1])
    return sched


def _next(chips: np.ndarray, digits: np.ndarray, dims: tuple[int, ...], d: int) -> np.ndarray:
    pos = digits[:, d]
    return chips + ((pos + 1) % dims[d] - pos) * math.prod(dims[:d])


def _shrink(region: Region, pos: np.ndarray, m: int) -> Region:
    """Block `pos` of the region cut into m (the shard counts divide: dims multiply to n)."""
    return region[0] + pos * (region[1] // m), region[1] // m


def _span(sched: Schedule, region: Region, m: int, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Element offsets [lo, hi) of block `block` of the region cut into m."""
    first, width = _shrink(region, block, m)
    return bounds(0, sched.elements, sched.n, first)[0], bounds(0, sched.elements, sched.n, first + width - 1)[1]


def _reduce_scatter(sched: Schedule, chips, digits, dims, d: int, region: Region) -> Region:
    m, pos, nxt = dims[d], digits[:, d], _next(chips, digits, dims, d)
    for t in range(m - 1):
        lo, hi = _span(sched, region, m, (pos - t - 1) % m)
        sched.steps.append(Step.make(chips, nxt, lo, lo, hi - lo, True))
    return _shrink(region, pos, m)


def _all_gather(sched: Schedule, chips, digits, dims, d: int, parent: Region) -> None:
    """Chip at position p of each dimension-d ring holds block p of `parent`; after m-1
    steps every chip of the ring holds all m blocks."""
    m, pos, nxt = dims[d], digits[:, d], _next(chips, digits, dims, d)
    for t in range(m - 1):
        lo, hi = _span(sched, parent, m, (pos - t) % m)
        sched.steps.append(Step.make(chips, nxt, lo, lo, hi - lo, False))
