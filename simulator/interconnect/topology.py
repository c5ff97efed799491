"""Interconnect topologies: chips, switches and the directed links between them.

    ring:8                                  8 chips, links i -> i+1 and i+1 -> i
    torus:4x4 / torus:8x8x16                 wrap-around links in every dimension
    switch:16                               every chip has one link to and one from a switch
    fattree:k=4,levels=2,oversubscription=2  a k-ary L-tree (k**L chips, L levels of k**(L-1)
                                            switches); switch-to-switch links at B / O

Chip ids are mixed-radix numbers over `Topology.dims` (ring and switch: (n,); torus: the
dimension sizes, the first varying fastest; fat-tree: L digits of base k). Links are full
duplex: one directed link per direction, each with the link bandwidth times `scale`.

Every topology admits the translations of its chip digits (adding a vector mod `dims`) as
automorphisms that act freely on the links; `link_orbit` names each link's class under that
group (a ring's + and - directions; a torus's (dimension, direction); a fat-tree's (level,
up/down)). The contention simulator uses it to simulate symmetric schedules once
(contention.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from tilecc.errors import ConfigError

KINDS = ("ring", "torus", "switch", "fattree")
MAX_CHIPS = 65536
SPEC_FORMS = "ring:N, torus:AxB[xC], switch:N or fattree:k=K,levels=L[,oversubscription=O]"


@dataclass(frozen=True)
class Topology:
    kind: str
    dims: tuple[int, ...]  # the chip id's mixed radix (see the module docstring)
    oversubscription: float = 1.0  # fat-tree: switch-to-switch links carry 1/O of the bandwidth
    # links, built by `build`: source and destination node (chips 0..n-1, then switches)
    link_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)
    link_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)
    link_scale: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)
    link_orbit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)
    link_index: dict[tuple[int, int], int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_chips(self) -> int:
        return math.prod(self.dims)

    @property
    def n_switches(self) -> int:
        if self.kind == "switch":
            return 1
        if self.kind == "fattree":
            k, levels = self.dims[0], len(self.dims)
            return levels * k ** (levels - 1)
        return 0

    @property
    def spec(self) -> str:
        if self.kind in ("ring", "switch"):
            return f"{self.kind}:{self.dims[0]}"
        if self.kind == "torus":
            return "torus:" + "x".join(map(str, self.dims))
        return f"fattree:k={self.dims[0]},levels={len(self.dims)},oversubscription={self.oversubscription:g}"

    def link(self, a: int, b: int) -> int:
        """The id of the directed link from node a to node b."""
        return self.link_index[(a, b)]

    def digits(self, chips: np.ndarray) -> np.ndarray:
        """[len(chips), len(dims)] mixed-radix digits of chip ids."""
        out = np.empty((len(chips), len(self.dims)), np.int64)
        rest = np.asarray(chips, np.int64)
        for i, d in enumerate(self.dims):
            out[:, i], rest = rest % d, rest // d
        return out

    def undigits(self, digits: np.ndarray) -> np.ndarray:
        out = np.zeros(len(digits), np.int64)
        for i in reversed(range(len(self.dims))):
            out = out * self.dims[i] + digits[:, i]
        return out

    def relative(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """dst translated by the translation that takes src to chip 0 (digit-wise dst - src)."""
        d = (self.digits(dst) - self.digits(src)) % np.asarray(self.dims)
        return self.undigits(d)

    def fattree_switch(self, level: int, w: int) -> int:
        """The node id of fat-tree switch `w` at `level` (1 = leaf)."""
        k, levels = self.dims[0], len(self.dims)
        return self.n_chips + (level - 1) * k ** (levels - 1) + w


def parse_topology(text: object, key: str = "topology") -> Topology:
    """A topology spec (see the module docstring), built; `ConfigError` naming `key`, the
    value and the rule otherwise."""
    if not isinstance(text, str):
        raise ConfigError(f"'{key}' must be a string like {SPEC_FORMS}, got {text!r}")
    kind, sep, rest = text.strip().partition(":")
    if not sep or kind not in KINDS:
        raise ConfigError(f"'{key}' = {text!r} is not a topology (expected {SPEC_FORMS})")
    if kind in ("ring", "switch"):
        dims, over = (_count(rest, key, text, kind),), 1.0
    elif kind == "torus":
        parts = rest.split("x")
        if not 2 <= len(parts) <= 3:
            raise ConfigError(f"'{key}' = {text!r}: a torus has 2 or 3 dimensions (torus:AxB or torus:AxBxC)")
        dims, over = tuple(_count(p, key, text, "torus dimension") for p in parts), 1.0
    else:
        dims, over = _fattree(rest, key, text)
    n = math.prod(dims)
    if n > MAX_CHIPS:
        raise ConfigError(f"'{key}' = {text!r} has {n} chips (at most {MAX_CHIPS})")
    return build(Topology(kind, dims, over))


def _count(part: str, key: str, text: str, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", part.strip()):
        raise ConfigError(f"'{key}' = {text!r}: the {what} size {part!r} is not a whole number")
    v = int(part)
    if v < 2:
        raise ConfigError(f"'{key}' = {text!r}: the {what} size must be >= 2, got {v}")
    if v > MAX_CHIPS:
        raise ConfigError(f"'{key}' = {text!r}: the {what} size must be <= {MAX_CHIPS}, got {v}")
    return v


def _fattree(rest: str, key: str, text: str) -> tuple[tuple[int, ...], float]:
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in ("k", "levels", "oversubscription"):
            raise ConfigError(f"'{key}' = {text!r}: {item!r} is not one of k=K, levels=L, oversubscription=O")
        if name in fields:
            raise ConfigError(f"'{key}' = {text!r}: '{name}' is given twice")
        fields[name] = value.strip()
    for need in ("k", "levels"):
        if need not in fields:
            raise ConfigError(f"'{key}' = {text!r}: missing '{need}=' (fattree:k=K,levels=L[,oversubscription=O])")
    k = _count(fields["k"], key, text, "fat-tree radix k")
    if not re.fullmatch(r"[0-9]+", fields["levels"]) or not 1 <= int(fields["levels"]) <= 16:
        raise ConfigError(f"'{key}' = {text!r}: levels must be a whole number in 1..16, got {fields['levels']!r}")
    levels = int(fields["levels"])
    if k**levels > MAX_CHIPS:
        raise ConfigError(f"'{key}' = {text!r} has k**levels = {k}**{levels} chips (at most {MAX_CHIPS})")
    over_s = fields.get("oversubscription", "1")
    try:
        over = float(over_s)
    except ValueError:
        over = math.nan
    if not (math.isfinite(over) and over >= 1):
        raise ConfigError(f"'{key}' = {text!r}: oversubscription must be a number >= 1, got {over_s!r}")
    return (k,) * levels, over


def build(topo: Topology) -> Topology:
    """`topo` with its links (src, dst, bandwidth scale, orbit) filled in."""
    links: list[tuple[int, int, float, int]] = []
    n = topo.n_chips
    chips = np.arange(n)
    if topo.kind in ("ring", "torus"):
        digits = topo.digits(chips)
        for d, size in enumerate(topo.dims):
            steps = (1,) if size == 2 else (1, -1)  # a size-2 dimension has one neighbour
            for s in steps:
                nd = digits.copy()
                nd[:, d] = (nd[:, d] + s) % size
                orbit = 2 * d + (s < 0)
                links += [(int(a), int(b), 1.0, orbit) for a, b in zip(chips, topo.undigits(nd))]
    elif topo.kind == "switch":
        links += [(c, n, 1.0, 0) for c in range(n)] + [(n, c, 1.0, 1) for c in range(n)]
    else:
        links += _fattree_links(topo)
    src, dst, scale, orbit = (np.array(col) for col in zip(*links))
    index = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(src, dst))}
    return Topology(topo.kind, topo.dims, topo.oversubscription, src.astype(np.int64), dst.astype(np.int64),
                    scale.astype(np.float64), orbit.astype(np.int64), index)


def _fattree_links(topo: Topology) -> list[tuple[int, int, float, int]]:
    """Chip c hangs off leaf switch c // k; switch w of level l connects up to the k
    switches of level l+1 that equal w except in digit l-1 (base k)."""
    k, levels, n = topo.dims[0], len(topo.dims), topo.n_chips
    out: list[tuple[int, int, float, int]] = []
    for c in range(n):
        leaf = topo.fattree_switch(1, c // k)
        out += [(c, leaf, 1.0, 0), (leaf, c, 1.0, 1)]
    up_scale = 1.0 / topo.oversubscription
    for level in range(1, levels):
        for w in range(k ** (levels - 1)):
            digit = (w // k ** (level - 1)) % k
            for v in range(k):
                w2 = w + (v - digit) * k ** (level - 1)
                a, b = topo.fattree_switch(level, w), topo.fattree_switch(level + 1, w2)
                out += [(a, b, up_scale, 2 * level), (b, a, up_scale, 2 * level + 1)]
    return out
