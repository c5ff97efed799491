"""npu-collective-ring2d: the multi-dimensional ring on a torus lowered into one chip's link
records (torus:AxB, chip id x + A y; also AxBxC).

All-reduce: a ring reduce-scatter along dimension 0 (the A chips of a row, each ending with
1/A of the buffer summed over the row), an all-reduce of that shard by a ring along
dimension 1 (reduce-scatter then all-gather over the B chips of a column, 1/(AB) blocks),
then the all-gather along dimension 0. Each ring uses only its dimension's links, so on a
torus every step is one hop and the two dimensions' messages shrink by A then B:

    2 (A-1)(alpha + S/(A B)) + 2 (B-1)(alpha + S/(A B B))     (formulas.multiring)

The standalone reduce-scatter goes from the last dimension to the first and the all-gather
back, so that chip r ends with (or starts from) shard r of the buffer (the ring halves'
convention). The schedule is simulator/interconnect/algorithms/ring.py's with the torus's
dims; collective_lowering.py lowers it, each transfer in `chunks` pipelined pieces.

Before:

    all_reduce(x: f32[8] at X) -> y: f32[8] at Y        torus:2x2, this chip r = 0 (x 0, y 0)

After (chip 0; shard s = elements [2s, 2s+2); chunks = 1):

    link.send l0 hbm[X+16 ...]:f32 -> chip1 1x4                       signal(s0)  dim 0: half 1 out
    link.recv l1 chip1 + hbm[X+0 ...]:f32 -> hbm[Y+0 ...]:f32 1x4     signal(s1)  half 0 summed over the row
    link.send l0 hbm[Y+8 ...]:f32 -> chip2 1x2      wait(s1 >= 1)     signal(s0)  dim 1: shard 1 out
    link.recv l1 chip2 + hbm[Y+0 ...]:f32 -> hbm[Y+0 ...]:f32 1x2     signal(s1)  shard 0 = the sum
    link.send l0 hbm[Y+0 ...]:f32 -> chip2 1x2      wait(s1 >= 2)     signal(s0)  dim 1: all-gather
    link.recv l1 chip2 -> hbm[Y+8 ...]:f32 1x2      wait(s0 >= 2)     signal(s1)
    link.send l0 hbm[Y+0 ...]:f32 -> chip1 1x4      wait(s1 >= 3)     signal(s0)  dim 0: all-gather
    link.recv l1 chip1 -> hbm[Y+16 ...]:f32 1x4                       signal(s1)
"""

from __future__ import annotations

import math

import numpy as np

from tilecc.passes.npu.collective_lowering import CollectiveLoweringError, lower_schedule
from tilecc.simulator.interconnect.algorithms import ring
from tilecc.simulator.isa import DType

__all__ = ["ring2d_all_gather", "ring2d_all_reduce", "ring2d_reduce_scatter"]


def ring2d_all_reduce(rank: int, dims: tuple[int, ...], x_addr: int, y_addr: int, elements: int, dtype: DType,
                      chunks: int = 1) -> np.ndarray:
    return lower_schedule(_schedule("all_reduce", dims, elements), rank, x_addr, y_addr, dtype, chunks)


def ring2d_reduce_scatter(rank: int, dims: tuple[int, ...], x_addr: int, y_addr: int, elements: int,
                          dtype: DType, chunks: int = 1) -> np.ndarray:
    return lower_schedule(_schedule("reduce_scatter", dims, elements), rank, x_addr, y_addr, dtype, chunks)


def ring2d_all_gather(rank: int, dims: tuple[int, ...], y_addr: int, elements: int, dtype: DType,
                      chunks: int = 1) -> np.ndarray:
    return lower_schedule(_schedule("all_gather", dims, elements), rank, y_addr, y_addr, dtype, chunks)


def _schedule(collective: str, dims: tuple[int, ...], elements: int):
    if len(dims) < 2 or min(dims) < 2:
        raise CollectiveLoweringError(f"a 2-D ring needs a torus of >= 2 dimensions of >= 2 chips, got dims {dims}")
    return ring.schedule(collective, math.prod(dims), elements, tuple(dims), "ring2d")
