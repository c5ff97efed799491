"""Recursive halving-doubling (Thakur, Rabenseifner and Gropp 2005), n a power of 2.

Reduce-scatter by recursive halving: in step i (distance d = n/2, n/4, ..., 1) chip r and
its partner r XOR d split their current region (2d shards) in halves; the chip whose bit d
is clear keeps the lower half and sends the upper one (added into the partner), the other
the reverse. After log2 n steps chip r holds shard r. The all-gather by recursive doubling
retraces the steps, exchanging the halves (copies).

    time = 2 log2(n) alpha + 2 (n-1)/n S/B   (all-reduce; the reduce-scatter or the
                                              all-gather alone: half of it)
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.interconnect.schedule import Schedule, Step, bounds


def schedule(collective: str, n: int, elements: int) -> Schedule:
    sched = Schedule(collective, "halving_doubling", n, elements)
    chips = np.arange(n, dtype=np.int64)

    def offset(shard: np.ndarray) -> np.ndarray:
        return bounds(0, elements, n, shard)[0]

    first = np.zeros(n, np.int64)  # the region: shards [first, first + 2d)
    held = []  # (first shard, shards) held after each halving step
    d = n // 2
    while d >= 1:
        upper = (chips & d) != 0
        keep = np.where(upper, first + d, first)
        send = np.where(upper, first, first + d)
        if collective in ("reduce_scatter", "all_reduce"):
            lo, hi = offset(send), offset(send + d)
            sched.steps.append(Step.make(chips, chips ^ d, lo, lo, hi - lo, True))
        first = keep
        held.append((keep, d))
        d //= 2
    if collective in ("all_gather", "all_reduce"):
        d = 1
        while d < n:  # doubling: send the d shards I hold, receive my partner's
            start, width = held.pop()
            lo, hi = offset(start), offset(start + width)
            sched.steps.append(Step.make(chips, chips ^ d, lo, lo, hi - lo, False))
            d *= 2
    return sched
