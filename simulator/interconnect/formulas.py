"""The closed forms of the alpha-beta model (docs/system.md; Thakur, Rabenseifner and Gropp
2005; NCCL's nccl-tests doc/PERFORMANCE.md for the bus bandwidth).

S bytes per chip, n chips, alpha ns per step (a route's latency), B bytes/ns (GB/s):

    ring all-reduce                 2(n-1)(alpha + S/(nB))
    ring reduce-scatter, all-gather (n-1)(alpha + S/(nB))
    multi-dimensional ring          the sum of the rings along each dimension d, the message
                                    shrinking by each dimension's size on the way
    halving-doubling all-reduce     2 log2(n) alpha + 2 (n-1)/n S/B
      n not a power of 2            2 (alpha + S/B) + 2 log2(p') alpha + 2 (p'-1)/p' S/B,
                                    p' = 2^floor(log2 n) (Thakur et al. 2005, section 4.4:
                                    the r = n - p' extra chips fold in first, get the result last)
      its reduce-scatter/all-gather the critical path of the fold, the core's steps over
                                    regions of one or two shards, the unfold (`folded_path`)
    double binary tree all-reduce   (C + 2D - 1)(alpha + S/(2CB)), D = floor(log2 n)
    pairwise all-to-all             (n-1)(alpha + S/(nB))
    bus bandwidth                   S / t x 2(n-1)/n (all-reduce), (n-1)/n (reduce-scatter,
                                    all-gather, all-to-all), 1 (send/recv)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def ring(collective: str, n: int, nbytes: float, alpha: float, bw: float) -> float:
    one = (n - 1) * (alpha + nbytes / (n * bw))
    return 2 * one if collective == "all_reduce" else one


def multiring(collective: str, dims: Sequence[int], nbytes: float, alpha: Sequence[float],
              bw: Sequence[float]) -> float:
    """One ring per dimension with that dimension's alpha and bandwidth; all-reduce and
    all-gather go from dimension 0 up (all-gather's message grows from S/n), reduce-scatter
    from the last dimension down (ring.py)."""
    total, size = 0.0, float(nbytes)
    order = list(range(len(dims)))
    if collective == "reduce_scatter":
        order.reverse()
    if collective == "all_gather":
        size = nbytes / math.prod(dims)
    for d in order:
        m = dims[d]
        if collective == "all_gather":
            size *= m
            total += (m - 1) * (alpha[d] + size / (m * bw[d]))
            continue
        total += (m - 1) * (alpha[d] + size / (m * bw[d]))
        size /= m
    return 2 * total if collective == "all_reduce" else total


def halving_doubling(collective: str, n: int, nbytes: float, alpha: float, bw: float) -> float:
    core = 1 << (n.bit_length() - 1)
    if core == n:
        one = math.log2(n) * alpha + (n - 1) / n * nbytes / bw
        return 2 * one if collective == "all_reduce" else one
    if collective == "all_reduce":
        return 2 * (alpha + nbytes / bw) + 2 * math.log2(core) * alpha + 2 * (core - 1) / core * nbytes / bw
    steps = core.bit_length() + 1  # the fold, log2(p') core steps, the unfold
    return folded_path(collective, n, nbytes, [alpha] * steps, [bw] * steps)


def folded_path(collective: str, n: int, nbytes: float, alphas: Sequence[float], bws: Sequence[float]) -> float:
    """Halving-doubling reduce-scatter or all-gather on n chips, n not a power of 2: the
    critical path of algorithms/halving_doubling.py's steps (the fold, log2(p') core steps,
    the unfold; step t's routes with alphas[t], bws[t]). Core rank i < r holds the shards of
    chips 2i and 2i+1 (S/n each), the others one, so the steps are not uniform: a pair of
    partners both end when the later of their two transfers does, each transfer starting
    when its sender is ready (the dependence rule of schedule.py)."""
    core = 1 << (n.bit_length() - 1)
    extra, shard = n - core, nbytes / n
    ranks = np.arange(core)
    held = np.concatenate([[0], np.cumsum(np.where(ranks < extra, 2, 1))])  # shards before rank i
    gather = collective == "all_gather"
    fold = alphas[0] + (shard if gather else nbytes) / bws[0]
    ready = np.where(ranks < extra, fold, 0.0)
    dists = [1 << j for j in range(core.bit_length() - 1)]
    for t, d in enumerate(dists if gather else dists[::-1], start=1):
        if gather:  # doubling: send the shards of the d ranks whose regions I hold
            lo = ranks // d * d
        else:  # halving: send the half of my region of 2d ranks that I do not keep
            first = ranks // (2 * d) * (2 * d)
            lo = np.where(ranks & d, first, first + d)
        end = ready + alphas[t] + (held[lo + d] - held[lo]) * shard / bws[t]
        ready = np.maximum(end, end[ranks ^ d])
    unfold = ready[:extra] + alphas[-1] + (nbytes if gather else shard) / bws[-1]
    return float(max(ready.max(), unfold.max()))


def double_binary_tree(n: int, nbytes: float, alpha: float, bw: float, chunks: int) -> float:
    depth = int(math.floor(math.log2(n)))
    chunk = math.ceil(math.ceil(nbytes / 2) / chunks)
    return (chunks + 2 * depth - 1) * (alpha + chunk / bw)


def pairwise(n: int, nbytes: float, alpha: float, bw: float) -> float:
    return (n - 1) * (alpha + nbytes / (n * bw))


def bus_factor(collective: str, n: int) -> float:
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective == "send_recv":
        return 1.0
    return (n - 1) / n
