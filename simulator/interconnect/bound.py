"""The alpha-beta time of an algorithm on a topology, from the closed forms of formulas.py
with each step's alpha and bandwidth taken from its routes (the slowest pair of the step):

    ring            alpha, B of the routes r -> r+1
    multiring       per dimension d: the routes to the next chip along d
    halving_doubling per distance d: the routes r -> r XOR d (the sum of the steps); n not a
                    power of 2: the core chips' routes, and the fold's and unfold's
    double_binary_tree  the slowest tree edge
    pairwise        per step t: the routes r -> r+t
    direct          the route 0 -> peer

Where every step's routes have the same alpha and bandwidth (a ring on a ring, one ring per
dimension on a torus, anything on a switch) this is the closed form exactly, and ideal mode
(ideal.py) agrees with it; elsewhere ideal mode can only be faster (chips run ahead).
"""

from __future__ import annotations

import math

import numpy as np

from tilecc.simulator.interconnect import formulas
from tilecc.simulator.interconnect.routing import path_stats
from tilecc.simulator.interconnect.system import LinkConfig
from tilecc.simulator.interconnect.topology import Topology


def _worst(topo: Topology, link: LinkConfig, src: np.ndarray, dst: np.ndarray) -> tuple[float, float]:
    hops, switches, scale = path_stats(topo, src, dst)
    return float(link.path_latency_ns(hops, switches).max()), float(link.bandwidth_gbs * scale.min())


def alpha_beta_ns(collective: str, algorithm: str, topo: Topology, link: LinkConfig, nbytes: float,
                  chunks: int = 1, peer: int | None = None) -> float:
    n = topo.n_chips
    chips = np.arange(n)
    if algorithm == "ring":
        a, b = _worst(topo, link, chips, (chips + 1) % n)
        return formulas.ring(collective, n, nbytes, a, b)
    if algorithm == "multiring":
        alphas, bws = [], []
        for d, size in enumerate(topo.dims):
            stride = math.prod(topo.dims[:d])
            pos = (chips // stride) % size
            a, b = _worst(topo, link, chips, chips + ((pos + 1) % size - pos) * stride)
            alphas.append(a)
            bws.append(b)
        return formulas.multiring(collective, topo.dims, nbytes, alphas, bws)
    if algorithm == "halving_doubling":
        return _halving_doubling(collective, topo, link, nbytes)
    if algorithm == "double_binary_tree":
        from tilecc.simulator.interconnect.algorithms.double_binary_tree import trees

        edges = [(np.nonzero(p >= 0)[0], p[p >= 0]) for p, _ in trees(n)]
        src = np.concatenate([e[0] for e in edges])
        dst = np.concatenate([e[1] for e in edges])
        a, b = _worst(topo, link, np.concatenate([src, dst]), np.concatenate([dst, src]))
        return formulas.double_binary_tree(n, nbytes, a, b, chunks)
    if algorithm == "pairwise":
        return sum(a + nbytes / n / b for a, b in (_worst(topo, link, chips, (chips + t) % n) for t in range(1, n)))
    a, b = _worst(topo, link, np.array([0]), np.array([n - 1 if peer is None else peer]))
    return a + nbytes / b


def _halving_doubling(collective: str, topo: Topology, link: LinkConfig, nbytes: float) -> float:
    from tilecc.simulator.interconnect.algorithms.halving_doubling import core_chips

    n = topo.n_chips
    chips = core_chips(n)
    core = len(chips)
    ranks = np.arange(core)
    steps = [_worst(topo, link, chips, chips[ranks ^ (1 << i)]) for i in range(core.bit_length() - 1)]
    if core == n or collective == "all_reduce":
        one = sum(a + nbytes / 2 ** (i + 1) / b for i, (a, b) in enumerate(reversed(steps)))
        one = 2 * one if collective == "all_reduce" else one
        if core == n:
            return one
    folded = 2 * np.arange(n - core)
    fold, unfold = _worst(topo, link, folded, folded + 1), _worst(topo, link, folded + 1, folded)
    if collective == "all_reduce":
        return fold[0] + nbytes / fold[1] + one + unfold[0] + nbytes / unfold[1]
    order = steps if collective == "all_gather" else steps[::-1]
    per = [fold, *order, unfold]
    return formulas.folded_path(collective, n, nbytes, [a for a, _ in per], [b for _, b in per])
