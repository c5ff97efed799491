"""Topologies and routing: link counts, hand-computed routes on every topology, routes
that are connected and shortest (hypothesis over pairs), the vectorised hop counts, and
the translations (and XORs) that the contention simulator's symmetry rule relies on
mapping routes onto routes of the same link orbits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilecc.errors import ConfigError
from tilecc.simulator.interconnect.routing import path_stats, route
from tilecc.simulator.interconnect.topology import parse_topology


def nodes_of(topo, src, dst):
    links = route(topo, src, dst)
    return [src] + [int(topo.link_dst[i]) for i in links]


@pytest.mark.parametrize("spec, chips, switches, links", [
    ("ring:8", 8, 0, 16),
    ("ring:2", 2, 0, 2),                      # one neighbour each way
    ("torus:4x4", 16, 0, 64),
    ("torus:2x3", 6, 0, 6 + 12),              # a size-2 dimension has one link per chip
    ("torus:4x4x4", 64, 0, 384),
    ("switch:5", 5, 1, 10),
    ("fattree:k=2,levels=3", 8, 12, 16 + 2 * 2 * 8),
    ("fattree:k=4,levels=2,oversubscription=2", 16, 8, 32 + 2 * 16),
])
def test_sizes(spec, chips, switches, links):
    topo = parse_topology(spec)
    assert (topo.n_chips, topo.n_switches, len(topo.link_src)) == (chips, switches, links)
    assert topo.spec.split(",oversub")[0] == spec.split(",oversub")[0]


@pytest.mark.parametrize("spec, src, dst, nodes", [
    ("ring:8", 0, 3, [0, 1, 2, 3]),
    ("ring:8", 0, 5, [0, 7, 6, 5]),           # the shorter way round
    ("ring:8", 2, 6, [2, 3, 4, 5, 6]),        # a tie goes the + way
    ("ring:8", 6, 1, [6, 7, 0, 1]),           # wrapping
    ("torus:4x4", 0, 10, [0, 1, 2, 6, 10]),   # (2,2): dimension 0 first, ties +
    ("torus:4x4", 0, 15, [0, 3, 15]),         # (3,3): -1 in each dimension, wrapping
    ("torus:4x4", 5, 4, [5, 4]),
    ("torus:2x2x2", 0, 7, [0, 1, 3, 7]),
    ("switch:4", 1, 3, [1, 4, 3]),            # one hop through the switch (node 4)
    ("fattree:k=2,levels=3", 0, 1, [0, 8, 1]),              # the same leaf (switch 8)
    ("fattree:k=2,levels=3", 0, 2, [0, 8, 12, 9, 2]),       # up to level 2 and down
    ("fattree:k=2,levels=3", 0, 7, [0, 8, 13, 19, 15, 11, 7]),  # to the top: d-mod-k up-links
    ("fattree:k=2,levels=3", 3, 3, [3]),
])
def test_hand_computed_routes(spec, src, dst, nodes):
    topo = parse_topology(spec)
    assert nodes_of(topo, src, dst) == nodes


def test_fattree_oversubscription_scales_upper_links_only():
    topo = parse_topology("fattree:k=4,levels=2,oversubscription=2")
    hops, switches, scale = path_stats(topo, np.array([0, 0, 5]), np.array([1, 4, 5]))
    assert hops.tolist() == [2, 4, 0] and switches.tolist() == [1, 3, 0]
    assert scale.tolist() == [1.0, 0.5, 1.0]
    up = [topo.link_scale[i] for i in route(topo, 0, 4)]
    assert up == [1.0, 0.5, 0.5, 1.0]


SPECS = ["ring:7", "ring:8", "torus:4x4", "torus:3x5", "torus:2x3x4", "switch:6",
         "fattree:k=2,levels=3", "fattree:k=3,levels=2", "fattree:k=4,levels=2,oversubscription=3"]


def _distance(topo, s, d):
    if topo.kind in ("ring", "torus"):
        ds = (topo.digits(np.array([d])) - topo.digits(np.array([s])))[0] % np.array(topo.dims)
        return int(np.minimum(ds, np.array(topo.dims) - ds).sum())
    if topo.kind == "switch":
        return 2 * (s != d)
    k = topo.dims[0]
    level = next(lv for lv in range(len(topo.dims) + 1) if s // k**lv == d // k**lv)
    return 2 * level


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(SPECS), st.integers(0, 10**6), st.integers(0, 10**6))
def test_routes_are_connected_shortest_and_match_path_stats(spec, a, b):
    topo = parse_topology(spec)
    s, d = a % topo.n_chips, b % topo.n_chips
    links = route(topo, s, d)
    nodes = nodes_of(topo, s, d)
    assert nodes[0] == s and nodes[-1] == d
    assert all(topo.link_src[x] == n for x, n in zip(links, nodes))  # consecutive links
    assert all(n >= topo.n_chips for n in nodes[1:-1]) or topo.kind in ("ring", "torus")
    assert len(links) == _distance(topo, s, d)
    hops, switches, _ = path_stats(topo, np.array([s]), np.array([d]))
    assert hops[0] == len(links)
    assert switches[0] == sum(n >= topo.n_chips for n in nodes)


def _translate(topo, chip, v, group):
    if group == "xor":
        return chip ^ v
    dig = (topo.digits(np.array([chip])) + topo.digits(np.array([v]))) % np.array(topo.dims)
    return int(topo.undigits(dig)[0])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(SPECS + ["switch:8#xor", "fattree:k=2,levels=3#xor", "fattree:k=4,levels=2#xor"]),
       st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_group_maps_routes_to_routes_of_the_same_orbits(spec, a, b, v):
    spec, _, group = spec.partition("#")
    topo = parse_topology(spec)
    n = topo.n_chips
    s, d, v = a % n, b % n, v % n
    moved = route(topo, _translate(topo, s, v, group), _translate(topo, d, v, group))
    assert topo.link_orbit[moved].tolist() == topo.link_orbit[route(topo, s, d)].tolist()


def test_link_orbits_are_free_orbits():
    """Each orbit holds exactly n links (the group acts freely), so a link's load is chip 0's
    transfers' crossings of its orbit."""
    for spec in SPECS:
        topo = parse_topology(spec)
        counts = np.bincount(topo.link_orbit)
        counts = counts[counts > 0]  # a size-2 dimension has no "-" orbit
        assert set(counts.tolist()) == {topo.n_chips}, spec


@pytest.mark.parametrize("spec, message", [
    ("ring", "is not a topology"),
    ("mesh:4", "is not a topology"),
    ("ring:1", "the ring size must be >= 2, got 1"),
    ("ring:x", "the ring size 'x' is not a whole number"),
    ("torus:4", "a torus has 2 or 3 dimensions"),
    ("torus:4x4x4x4", "a torus has 2 or 3 dimensions"),
    ("torus:4x0", "must be >= 2, got 0"),
    ("switch:100000", "must be <= 65536"),
    ("fattree:k=4", "missing 'levels='"),
    ("fattree:k=4,levels=2,oversubscription=0.5", "oversubscription must be a number >= 1"),
    ("fattree:k=4,levels=2,colour=red", "'colour=red' is not one of"),
    ("fattree:k=4,k=2,levels=2", "'k' is given twice"),
    ("fattree:k=16,levels=5", "at most 65536"),
    (7, "must be a string"),
])
def test_bad_specs_name_key_value_and_rule(spec, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as e:
        parse_topology(spec, "system.topology")
    assert "'system.topology'" in str(e.value)
