"""Routing: the links a chip-to-chip transfer crosses, and their latency and bandwidth.

    ring     the shorter way round (a tie goes the + way)
    torus    dimension order (dimension 0 first), the shorter way in each dimension, wrapping
    switch   chip -> switch -> chip (one hop through the switch)
    fattree  up/down: up to the lowest common level m, down to the destination; going up from
             level l the route takes the up-link to the switch whose digit l-1 is the
             destination's digit l-1 (d-mod-k), so the route is deterministic

    route(topo, 5, 7)          # ring:8 -> [link 5->6, link 6->7]
    path_stats(topo, src, dst) # vectorised: hops, switches crossed, bandwidth scale

The latency of a route (LinkConfig.path_latency_ns): hops x link latency + the chips it
passes through x per-hop (forwarding) latency + the switches it passes through x switch
latency. Its bandwidth: the link bandwidth x the smallest scale on the route.
"""

from __future__ import annotations

import numpy as np

from tilecc.errors import ConfigError
from tilecc.simulator.interconnect.topology import Topology


def _check(topo: Topology, *chips: int) -> None:
    for c in chips:
        if not 0 <= c < topo.n_chips:
            raise ConfigError(f"chip {c} does not exist in {topo.spec} (chips 0..{topo.n_chips - 1})")


def route(topo: Topology, src: int, dst: int) -> list[int]:
    """The link ids a transfer from chip src to chip dst crosses, in order ([] if src == dst)."""
    _check(topo, src, dst)
    if src == dst:
        return []
    nodes = _nodes(topo, src, dst)
    return [topo.link(a, b) for a, b in zip(nodes, nodes[1:])]


def _nodes(topo: Topology, src: int, dst: int) -> list[int]:
    if topo.kind == "switch":
        return [src, topo.n_chips, dst]
    if topo.kind == "fattree":
        return _fattree_nodes(topo, src, dst)
    nodes, cur = [src], src
    stride = 1
    for size in topo.dims:
        delta = (dst // stride - src // stride) % size
        step, count = (1, delta) if 2 * delta <= size else (-1, size - delta)
        for _ in range(count):  # move digit d by one, wrapping
            digit = (cur // stride) % size
            cur += (((digit + step) % size) - digit) * stride
            nodes.append(cur)
        stride *= size
    return nodes


def lca_level(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Fat-tree: the lowest level whose switches cover both chips (1 = the same leaf)."""
    k, levels = topo.dims[0], len(topo.dims)
    m = np.full(len(src), levels, np.int64)
    for level in range(levels - 1, 0, -1):
        m = np.where(src // k**level == dst // k**level, level, m)
    return m


def _fattree_nodes(topo: Topology, src: int, dst: int) -> list[int]:
    k = topo.dims[0]
    m = int(lca_level(topo, np.array([src]), np.array([dst]))[0])
    t_digit = [(dst // k**i) % k for i in range(len(topo.dims))]
    w = src // k
    nodes = [src, topo.fattree_switch(1, w)]
    for level in range(1, m):  # up: replace digit level-1 of w by the destination's digit level-1
        w += (t_digit[level - 1] - (w // k ** (level - 1)) % k) * k ** (level - 1)
        nodes.append(topo.fattree_switch(level + 1, w))
    for level in range(m, 1, -1):  # down: digit level-2 of w becomes the destination's digit level-1
        w += (t_digit[level - 1] - (w // k ** (level - 2)) % k) * k ** (level - 2)
        nodes.append(topo.fattree_switch(level - 1, w))
    assert w == dst // k, "up/down routing must end at the destination's leaf"
    return nodes + [dst]


def path_stats(topo: Topology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hops, switches crossed, bandwidth scale) of the routes src[i] -> dst[i], vectorised;
    hops 0 where src == dst (a local copy)."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    same = src == dst
    if topo.kind == "switch":
        hops, switches, scale = np.full(len(src), 2), np.ones(len(src), np.int64), np.ones(len(src))
    elif topo.kind == "fattree":
        m = lca_level(topo, src, dst)
        hops, switches = 2 * m, 2 * m - 1
        scale = np.where(m >= 2, 1.0 / topo.oversubscription, 1.0)
    else:
        delta = (topo.digits(dst) - topo.digits(src)) % np.asarray(topo.dims)
        hops = np.minimum(delta, np.asarray(topo.dims) - delta).sum(axis=1)
        switches, scale = np.zeros(len(src), np.int64), np.ones(len(src))
    hops = np.where(same, 0, hops)
    switches = np.where(same, 0, switches)
    return hops.astype(np.int64), switches.astype(np.int64), np.where(same, 1.0, scale)
