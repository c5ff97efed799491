"""Softmax and log-softmax over any dimension, as the row-wise kernels want them.

The row-wise kernels (`passes/graph_to_tile/rowwise.py`) reduce along the free
dimension, the innermost one. Over another dim the importer swaps that dim with the
last (``graph.permute``, a strided DMA copy on the NPU, or a view absorbed by its
producer), applies the op over the last dim and swaps back; a rank-0 tensor is a row
of one:

    %y = aten._softmax(%x: [2, 5, 3], dim 1)
      -> %t = graph.permute %x [0, 2, 1] ; %s = graph.softmax %t dim 2
         %y = graph.permute %s [0, 2, 1]
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g


def over_any_dim(
    emit: Callable[[Operation], SSAValue], make: Callable[[SSAValue, int], Operation], x: SSAValue, dim: int,
) -> SSAValue:
    """``make(x, dim)`` (a softmax-like op over `dim`) built over the last dim."""
    rank = len(g.shape_of(x))
    if rank == 0:
        row = emit(g.ReshapeOp.make(x, [1]))
        return emit(g.ReshapeOp.make(emit(make(row, 0)), []))
    d = dim % rank
    if d == rank - 1:
        return emit(make(x, d))
    perm = list(range(rank))
    perm[d], perm[-1] = perm[-1], perm[d]
    y = emit(make(emit(g.PermuteOp.make(x, perm)), rank - 1))
    return emit(g.PermuteOp.make(y, perm))
