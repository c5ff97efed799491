"""npu-collective-tree: the double binary tree all-reduce (NCCL 2.4; Sanders, Speck and
Traeff 2009), chunked and pipelined, lowered into one chip's link records; any n >= 2.

Two binary trees over the chips (simulator/interconnect/algorithms/double_binary_tree.py:
tree A the balanced in-order tree, tree B A mirrored or shifted, so that most of A's leaves
are B's inner nodes); tree A all-reduces the first half of the buffer, tree B the second.
Each half is cut into C chunks. A chip at depth l of a tree of depth D receives chunk c
from its children (adding, REDUCE) in step c + D - l - 1, sends the partial sum to its
parent in step c + D - l, receives the total from its parent in step c + D + l - 1 and
forwards it to its children in step c + D + l; the root adds its children's chunks and
starts the broadcast. The chunks pipeline: C + 2D - 1 steps, alpha-beta

    (C + 2D - 1)(alpha + S / (2 C B))      (formulas.double_binary_tree; each chunk one hop)

which counts one transfer per step; here a chip's sends share its one send queue (an inner
node of tree A sends up once and down twice per chunk, and as a leaf of tree B once more),
so on a switch, where each chip has one port, a chip moves about 2 S per all-reduce, as
the ring does (the schedule side's contention mode says the same).

Before:

    all_reduce(x: f32[8] at X) -> y: f32[8] at Y        n = 2 chips, C = 1

After (chip 1 of 2: the root of tree A over elements [0, 4), the leaf of tree B over [4, 8)):

    link.send l0 hbm[X+16 ...]:f32 -> chip0 1x4                       signal(s0)  B: up to the root
    link.recv l1 chip0 + hbm[X+0 ...]:f32 -> hbm[Y+0 ...]:f32 1x4     signal(s1)  A: chip 0's half summed
    link.send l0 hbm[Y+0 ...]:f32 -> chip0 1x4      wait(s1 >= 1)     signal(s0)  A: broadcast down
    link.recv l1 chip0 -> hbm[Y+16 ...]:f32 1x4                       signal(s1)  B: the total from the root

The schedule's steps (and the hazards by byte range) are lowered by collective_lowering.py.
"""

from __future__ import annotations

import numpy as np

from tilecc.passes.npu.collective_lowering import CollectiveLoweringError, lower_schedule
from tilecc.simulator.interconnect.algorithms import double_binary_tree
from tilecc.simulator.isa import DType

__all__ = ["best_tree_chunks", "tree_all_reduce"]


def tree_all_reduce(rank: int, n: int, x_addr: int, y_addr: int, elements: int, dtype: DType,
                    chunks: int = 1) -> np.ndarray:
    """Chip `rank`'s records of the all-reduce from X (unchanged) into Y, each half of the
    buffer in `chunks` pipelined chunks (at most half the elements)."""
    if n < 2:
        raise CollectiveLoweringError(f"a tree all-reduce needs at least 2 chips, got {n}")
    if elements < 2:
        raise CollectiveLoweringError(f"a tree all-reduce splits the buffer in two halves: {elements} element(s)")
    if chunks < 1:
        raise CollectiveLoweringError(f"chunks must be >= 1, got {chunks}")
    sched = double_binary_tree.schedule("all_reduce", n, elements, min(chunks, elements // 2))
    return lower_schedule(sched, rank, x_addr, y_addr, dtype)


def best_tree_chunks(n: int, nbytes: int, alpha_ns: float, bytes_per_ns: float) -> int:
    """The chunk count minimising the alpha-beta time above (the schedule side's rule)."""
    return double_binary_tree.best_chunks(n, nbytes, alpha_ns, bytes_per_ns)
