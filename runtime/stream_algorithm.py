"""Which in-stream algorithm lowers a collective, and its records for every chip.

    name = choose("all_reduce", "auto", topo, link, nbytes=65536, itemsize=4)   # "halving_doubling"
    recs = lower("all_reduce", name, topo, link, x_of, y_of, elements, dtype, chunks)  # per chip

`algorithm` (`parallel={"collectives": "stream", "algorithm": ...}`, `tilecc run ...
--collectives stream --algorithm ...`):

    ring              the chunked ring (passes/npu/collectives.py)          every collective, any n
    halving_doubling  recursive halving-doubling (collective_halving_doubling.py)  any n (fold
                      into 2^floor(log2 n) chips first, unfold last)
    tree              the double binary tree (collective_tree.py)           all-reduce only
    ring2d            one ring per torus dimension (collective_ring2d.py)   torus topologies
    auto              the applicable one with the least alpha-beta time on the topology

`auto` uses the schedule side's cost (simulator/interconnect/collective.py's rule for its
`algorithm=None`): every applicable algorithm's schedule timed in ideal mode (alpha-beta
per step over the routed links), those whose steps share no link preferred (contention
would slow the others), the fastest of them chosen. The tree's chunk count is the one
minimising its alpha-beta time on the topology's worst route (as the schedule side's).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tilecc.errors import TileccError
from tilecc.passes.npu.collective_halving_doubling import hd_all_gather, hd_all_reduce, hd_reduce_scatter
from tilecc.passes.npu.collective_ring2d import ring2d_all_gather, ring2d_all_reduce, ring2d_reduce_scatter
from tilecc.passes.npu.collective_tree import tree_all_reduce
from tilecc.passes.npu.collectives import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from tilecc.simulator.interconnect import contention
from tilecc.simulator.interconnect.collective import make_schedule
from tilecc.simulator.interconnect.ideal import ideal_time_ns
from tilecc.simulator.interconnect.system import LinkConfig
from tilecc.simulator.interconnect.topology import Topology
from tilecc.simulator.isa import ITEMSIZE, DType

__all__ = ["ALGORITHMS", "choose", "lower"]

ALGORITHMS = ("auto", "ring", "halving_doubling", "tree", "ring2d")
_SCHEDULE_NAME = {"ring": "ring", "halving_doubling": "halving_doubling", "tree": "double_binary_tree",
                  "ring2d": "multiring"}


class StreamAlgorithmError(TileccError):
    """An in-stream algorithm that does not apply to the collective or the topology."""


def why_not(op: str, name: str, topo: Topology, elements: int) -> str | None:
    """Why algorithm `name` cannot lower `op` of `elements` elements on `topo`, or None."""
    if name == "tree" and op != "all_reduce":
        return f"tree lowers all_reduce only, not {op}"
    if name == "tree" and elements < 2:
        return f"tree splits the buffer in two halves; {elements} element(s)"
    if name == "ring2d" and topo.kind != "torus":
        return f"ring2d runs one ring per torus dimension; {topo.spec} is not a torus"
    return None


def choose(op: str, algorithm: str, topo: Topology, link: LinkConfig, elements: int, itemsize: int) -> str:
    """The algorithm that lowers `op` (`algorithm` itself, checked, or auto's choice)."""
    if algorithm not in ALGORITHMS:
        raise StreamAlgorithmError(f"collective algorithm {algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
    if algorithm != "auto":
        why = why_not(op, algorithm, topo, elements)
        if why:
            raise StreamAlgorithmError(f"collectives='stream', algorithm={algorithm!r} for {op}: {why} "
                                       "(use algorithm='auto' or 'ring')")
        return algorithm
    best: tuple[bool, float, str] | None = None
    for name in ALGORITHMS[1:]:
        if why_not(op, name, topo, elements) is not None:
            continue
        sched = make_schedule(op, _SCHEDULE_NAME[name], topo, link, elements, itemsize)
        key = (contention.shares_links(sched, topo) is not False, ideal_time_ns(sched, topo, link, itemsize), name)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None  # the ring always applies
    return best[2]


def tree_chunks(topo: Topology, link: LinkConfig, elements: int, itemsize: int) -> int:
    return make_schedule("all_reduce", "double_binary_tree", topo, link, elements, itemsize).chunks


def lower(op: str, name: str, topo: Topology, link: LinkConfig, x_of: Callable[[int], int],
          y_of: Callable[[int], int], elements: int, dtype: DType, chunks: int) -> list[np.ndarray]:
    """Every chip's records of `op` by algorithm `name` (choose()'s answer): X at x_of(r),
    Y at y_of(r) (an all-gather works in place at Y)."""
    n, dims = topo.n_chips, topo.dims
    if name == "tree":
        c = tree_chunks(topo, link, elements, ITEMSIZE[dtype])
        return [tree_all_reduce(r, n, x_of(r), y_of(r), elements, dtype, c) for r in range(n)]
    fns = {"ring": (ring_all_reduce, ring_reduce_scatter, ring_all_gather),
           "halving_doubling": (hd_all_reduce, hd_reduce_scatter, hd_all_gather),
           "ring2d": (ring2d_all_reduce, ring2d_reduce_scatter, ring2d_all_gather)}[name]
    size = dims if name == "ring2d" else n
    if op == "all_reduce":
        return [fns[0](r, size, x_of(r), y_of(r), elements, dtype, chunks) for r in range(n)]
    if op == "reduce_scatter":
        return [fns[1](r, size, x_of(r), y_of(r), elements, dtype, chunks) for r in range(n)]
    return [fns[2](r, size, y_of(r), elements, dtype, chunks) for r in range(n)]
