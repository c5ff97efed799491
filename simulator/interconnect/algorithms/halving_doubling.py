"""Recursive halving-doubling (Thakur, Rabenseifner and Gropp 2005), any n >= 2.

Reduce-scatter by recursive halving: in step i (distance d = n/2, n/4, ..., 1) chip r and
its partner r XOR d split their current region (2d shards) in halves; the chip whose bit d
is clear keeps the lower half and sends the upper one (added into the partner), the other
the reverse. After log2 n steps chip r holds shard r. The all-gather by recursive doubling
retraces the steps, exchanging the halves (copies).

    time = 2 log2(n) alpha + 2 (n-1)/n S/B   (all-reduce; the reduce-scatter or the
                                              all-gather alone: half of it)

n not a power of 2 (the paper's section 4.4, MPICH's rule): with p' = 2^floor(log2 n) and
r = n - p', the even chips 0, 2, ..., 2r-2 fold into their right neighbour first, the p'
"core" chips (the odd chips below 2r, as core rank i = (c-1)/2, and the chips c >= 2r, as
core rank c - r) run the power-of-2 algorithm among themselves, and the folded chips get
their result back last:

    all-reduce      fold: chip 2i adds its whole buffer into chip 2i+1; the core runs the
                    all-reduce over p' near-equal blocks; unfold: chip 2i+1 sends the whole
                    result to chip 2i.
                    time = 2 (alpha + S/B) + 2 log2(p') alpha + 2 (p'-1)/p' S/B
    reduce-scatter  fold as the all-reduce's; the core's regions are the n shards grouped
                    by core rank (core rank i < r holds shards 2i and 2i+1, the others one),
                    so halving leaves core rank i with its own shards summed; unfold: chip
                    2i+1 sends shard 2i to chip 2i.
    all-gather      fold: chip 2i sends its shard to chip 2i+1; recursive doubling over the
                    same regions; unfold: chip 2i+1 sends the whole buffer to chip 2i.

The reduce-scatter and all-gather regions hold one or two shards, so their core steps are
not uniform; formulas.halving_doubling gives their ideal time as a critical path.
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.interconnect.schedule import Schedule, Step, bounds


def core_chips(n: int) -> np.ndarray:
    """The chip of each core rank (0 .. p'-1)."""
    core = 1 << (n.bit_length() - 1)
    extra = n - core
    i = np.arange(core, dtype=np.int64)
    return np.where(i < extra, 2 * i + 1, i + extra)


def core_regions(collective: str, n: int, elements: int) -> np.ndarray:
    """Element offsets of the core ranks' regions: rank i's region is [out[i], out[i+1]).
    All-reduce: p' near-equal blocks; the others: the shards of the chips folded into rank i."""
    core = 1 << (n.bit_length() - 1)
    extra = n - core
    i = np.arange(core + 1, dtype=np.int64)
    if collective == "all_reduce":
        return bounds(0, elements, core, i)[0]
    return bounds(0, elements, n, np.where(i < extra, 2 * i, i + extra))[0]


def schedule(collective: str, n: int, elements: int) -> Schedule:
    sched = Schedule(collective, "halving_doubling", n, elements)
    core = 1 << (n.bit_length() - 1)
    extra = n - core
    chips = core_chips(n)
    starts = core_regions(collective, n, elements)
    ranks = np.arange(core, dtype=np.int64)
    folded = 2 * np.arange(extra, dtype=np.int64)
    lo_f, hi_f = bounds(0, elements, n, folded)
    reduces = collective in ("reduce_scatter", "all_reduce")
    if extra:
        if reduces:
            sched.steps.append(Step.make(folded, folded + 1, 0, 0, elements, True))
        else:
            sched.steps.append(Step.make(folded, folded + 1, lo_f, lo_f, hi_f - lo_f, False))
    first = np.zeros(core, np.int64)  # the region: core ranks [first, first + 2d)
    held = []  # (first core rank, ranks) held after each halving step
    d = core // 2
    while d >= 1:
        upper = (ranks & d) != 0
        keep = np.where(upper, first + d, first)
        send = np.where(upper, first, first + d)
        if reduces:
            lo, hi = starts[send], starts[send + d]
            sched.steps.append(Step.make(chips, chips[ranks ^ d], lo, lo, hi - lo, True))
        first = keep
        held.append((keep, d))
        d //= 2
    if collective in ("all_gather", "all_reduce"):
        d = 1
        while d < core:  # doubling: send the regions I hold, receive my partner's
            start, width = held.pop()
            lo, hi = starts[start], starts[start + width]
            sched.steps.append(Step.make(chips, chips[ranks ^ d], lo, lo, hi - lo, False))
            d *= 2
    if extra:
        if collective == "reduce_scatter":
            sched.steps.append(Step.make(folded + 1, folded, lo_f, lo_f, hi_f - lo_f, False))
        else:
            sched.steps.append(Step.make(folded + 1, folded, 0, 0, elements, False))
    return sched
