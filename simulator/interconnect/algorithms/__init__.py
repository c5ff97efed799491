"""The collective algorithms and which collectives each implements.

    build("all_reduce", "ring", topo, elements=1 << 20)   # -> Schedule
    applicable("all_reduce", topo, elements)             # the algorithms that can run it

    ring                1-D ring over chips 0..n-1              all_reduce, all_gather, reduce_scatter
    multiring           one ring per torus dimension / fat-tree level (hierarchical)   same
    halving_doubling    recursive halving-doubling (other n: fold into 2^k, then unfold) same
    double_binary_tree  NCCL's two complementary trees, chunked                     all_reduce
    pairwise            n-1 exchange steps                                           all_to_all
    direct              one transfer from chip 0 to the peer                         send_recv
"""

from __future__ import annotations

from tilecc.simulator.interconnect.algorithms import direct, double_binary_tree, halving_doubling, ring
from tilecc.simulator.interconnect.schedule import COLLECTIVES, CollectiveError, Schedule
from tilecc.simulator.interconnect.topology import Topology

REDUCTIONS = ("all_reduce", "all_gather", "reduce_scatter")
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "ring": REDUCTIONS,
    "multiring": REDUCTIONS,
    "halving_doubling": REDUCTIONS,
    "double_binary_tree": ("all_reduce",),
    "pairwise": ("all_to_all",),
    "direct": ("send_recv",),
}
ALIASES = {"hierarchical": "multiring", "rhd": "halving_doubling", "dbt": "double_binary_tree",
           "tree": "double_binary_tree"}


def check(collective: str, algorithm: str, topo: Topology, elements: int, peer: int | None = None) -> str:
    """The algorithm's canonical name, or `CollectiveError` saying why it cannot run."""
    if collective not in COLLECTIVES:
        raise CollectiveError(f"unknown collective '{collective}' (allowed: {', '.join(COLLECTIVES)})")
    name = ALIASES.get(algorithm, algorithm)
    if name not in ALGORITHMS:
        raise CollectiveError(f"unknown algorithm '{algorithm}' (allowed: {', '.join(ALGORITHMS)}; "
                              f"aliases: {', '.join(ALIASES)})")
    n = topo.n_chips
    if collective not in ALGORITHMS[name]:
        raise CollectiveError(f"algorithm '{algorithm}' does not implement {collective} "
                              f"(it implements: {', '.join(ALGORITHMS[name])})")
    if elements < 1:
        raise CollectiveError(f"{collective} of {elements} bytes: the size must be >= 1")
    if collective == "all_to_all" and elements % n:
        raise CollectiveError(f"all_to_all of {elements} bytes on {n} chips: the size must be a multiple of "
                              f"the chip count (n blocks of S/n)")
    if collective == "send_recv" and peer is not None and not 1 <= peer < n:
        raise CollectiveError(f"send_recv peer {peer} does not exist in {topo.spec} (chips 1..{n - 1}; chip 0 sends)")
    return name


def applicable(collective: str, topo: Topology, elements: int) -> list[str]:
    """The algorithms that can run `collective` on `topo` (multiring only where it differs from ring)."""
    out = []
    for name, colls in ALGORITHMS.items():
        if collective not in colls or (name == "multiring" and len(topo.dims) == 1):
            continue
        try:
            check(collective, name, topo, elements)
        except CollectiveError:
            continue
        out.append(name)
    return out


def build(collective: str, algorithm: str, topo: Topology, elements: int, chunks: int = 1,
          peer: int | None = None) -> Schedule:
    name = check(collective, algorithm, topo, elements, peer)
    n = topo.n_chips
    if name == "ring":
        return ring.schedule(collective, n, elements, (n,))
    if name == "multiring":
        return ring.schedule(collective, n, elements, topo.dims, "multiring")
    if name == "halving_doubling":
        return halving_doubling.schedule(collective, n, elements)
    if name == "double_binary_tree":
        return double_binary_tree.schedule(collective, n, elements, chunks)
    if name == "pairwise":
        return direct.all_to_all(n, elements)
    return direct.send_recv(n, elements, n - 1 if peer is None else peer)
