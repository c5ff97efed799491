"""The closed forms of the alpha-beta model (docs/system.md; Thakur, Rabenseifner and Gropp
2005; NCCL's nccl-tests doc/PERFORMANCE.md for the bus bandwidth).

S bytes per chip, n chips, alpha ns per step (a route's latency), B bytes/ns (GB/s):

    ring all-reduce                 2(n-1)(alpha + S/(nB))
    ring reduce-scatter, all-gather (n-1)(alpha + S/(nB))
    multi-dimensional ring          the sum of the rings along each dimension d, the message
                                    shrinking by each dimension's size on the way
    halving-doubling all-reduce     2 log2(n) alpha + 2 (n-1)/n S/B
    double binary tree all-reduce   (C + 2D - 1)(alpha + S/(2CB)), D = floor(log2 n)
    pairwise all-to-all             (n-1)(alpha + S/(nB))
    bus bandwidth                   S / t x 2(n-1)/n (all-reduce), (n-1)/n (reduce-scatter,
                                    all-gather, all-to-all), 1 (send/recv)
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
    one = math.log2(n) * alpha + (n - 1) / n * nbytes / bw
    return 2 * one if collective == "all_reduce" else one


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
