"""npu-collective-halving-doubling: recursive halving-doubling (Rabenseifner; Thakur,
Rabenseifner and Gropp 2005) lowered into one chip's link records, any n >= 2.

Reduce-scatter by recursive halving: in the step of distance d = n/2, n/4, ..., 1, chip r
exchanges half of its current region with chip r XOR d, keeping the half its bit d selects
and adding the partner's copy of it (REDUCE); after log2(n) steps chip r holds shard r of
the sum. All-gather by recursive doubling: d = 1, 2, ..., n/2, chip r sends the shards it
holds to r XOR d and receives the partner's (overwrite). Time, each step one transfer per
chip (simulator/interconnect/formulas.py):

    all-reduce                    2 log2(n) alpha + 2 (n-1)/n S/B
    reduce-scatter, all-gather    log2(n) alpha + (n-1)/n S/B

n not a power of 2: the even chips below 2r (r = n - 2^floor(log2 n)) first fold into
their right neighbour (a reducing receive of the whole buffer there; all-gather: their
shard), the 2^floor(log2 n) others run the above, and the folded chips receive their
result last (the schedule's docstring):

    all-reduce                    2 (alpha + S/B) + 2 log2(p') alpha + 2 (p'-1)/p' S/B

The schedule is simulator/interconnect/algorithms/halving_doubling.py's; its lowering into
records (hazards by byte range, `chunks` pieces per transfer) is collective_lowering.py's.

Before:

    all_reduce(x: f32[8] at X) -> y: f32[8] at Y        n = 4 chips, this chip r = 1

After (chip 1 of 4, 8 elements, chunks = 1; shard s = elements [2s, 2s+2)):

    link.send l0 hbm[X+16 ...]:f32 -> chip3 1x4                       signal(s0)  d=2: shards 2-3 out
    link.recv l1 chip3 + hbm[X+0 ...]:f32 -> hbm[Y+0 ...]:f32 1x4     signal(s1)  shards 0-1 summed
    link.send l0 hbm[Y+0 ...]:f32 -> chip0 1x2      wait(s1 >= 1)     signal(s0)  d=1: shard 0 out
    link.recv l1 chip0 + hbm[Y+8 ...]:f32 -> hbm[Y+8 ...]:f32 1x2     signal(s1)  shard 1 = the sum
    link.send l0 hbm[Y+8 ...]:f32 -> chip0 1x2      wait(s1 >= 2)     signal(s0)  d=1: shard 1 back
    link.recv l1 chip0 -> hbm[Y+0 ...]:f32 1x2      wait(s0 >= 2)     signal(s1)  shard 0
    link.send l0 hbm[Y+0 ...]:f32 -> chip3 1x4      wait(s1 >= 3)     signal(s0)  d=2: shards 0-1
    link.recv l1 chip3 -> hbm[Y+16 ...]:f32 1x4                       signal(s1)  shards 2-3

`hd_reduce_scatter` and `hd_all_gather` are the halves alone, with the ring halves'
buffer conventions (passes/npu/collectives.py).
"""

from __future__ import annotations

import numpy as np

from tilecc.passes.npu.collective_lowering import CollectiveLoweringError, lower_schedule
from tilecc.simulator.interconnect.algorithms import halving_doubling
from tilecc.simulator.isa import DType

__all__ = ["hd_all_gather", "hd_all_reduce", "hd_reduce_scatter"]


def hd_all_reduce(rank: int, n: int, x_addr: int, y_addr: int, elements: int, dtype: DType,
                  chunks: int = 1) -> np.ndarray:
    """Chip `rank`'s records of the all-reduce of `elements` elements from X (left unchanged)
    into Y (the sum)."""
    return lower_schedule(_schedule("all_reduce", n, elements), rank, x_addr, y_addr, dtype, chunks)


def hd_reduce_scatter(rank: int, n: int, x_addr: int, y_addr: int, elements: int, dtype: DType,
                      chunks: int = 1) -> np.ndarray:
    """Chip `rank` ends with shard `rank` of the sum at its place in the buffer at Y."""
    return lower_schedule(_schedule("reduce_scatter", n, elements), rank, x_addr, y_addr, dtype, chunks)


def hd_all_gather(rank: int, n: int, y_addr: int, elements: int, dtype: DType, chunks: int = 1) -> np.ndarray:
    """Chip `rank`'s shard `rank` is at its place in the buffer at Y; every chip ends with all."""
    return lower_schedule(_schedule("all_gather", n, elements), rank, y_addr, y_addr, dtype, chunks)


def _schedule(collective: str, n: int, elements: int):
    if n < 2:
        raise CollectiveLoweringError(f"halving-doubling needs 2 chips or more, got {n}")
    return halving_doubling.schedule(collective, n, elements)
