"""Graph ops that become HBM tensors without a kernel, or views of one.

Weights and non-splat constants become `tile.hbm_alloc`s (a splat constant becomes an
immediate); reshapes, expands and permutes that keep the innermost dim are `tile.view`s
of their operand's root (no data moves); any other permute is a transposing copy.

Before (graph)::

    %w = graph.weight {name = "fc.weight"} : tensor<64x32xf32>
    %t = graph.permute %x {perm = [1, 0, 2]} : tensor<4x8x16xf32> -> tensor<8x4x16xf32>

After (tile, in @main)::

    %w = tile.hbm_alloc {weight = "fc.weight"} : memref<64x32xf32>
    %t = tile.view %x : memref<8x4x16xf32, strided<[16, 128, 1]>>
"""

from __future__ import annotations

import numpy as np
from xdsl.ir import Operation

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.shapes import dense_values, elem_of, shape_of


def lower_weight(lw: LoweringContext, op: Operation, loc: str) -> None:
    if not isinstance(op, g.WeightOp):
        raise CompileError(f"lower_weight at {loc}: {op.name} is not a graph.weight")
    res = op.results[0]
    lw.values[res] = lw.hbm(shape_of(res.type), elem_of(res.type), weight=op.weight)


def lower_constant(lw: LoweringContext, op: Operation, loc: str) -> None:
    """A splat becomes an immediate (folded into the kernels using it), else a tensor."""
    res = op.results[0]
    data = dense_values(op)
    if data.size >= 1 and np.all(data == data.reshape(-1)[0]):
        lw.scalars[res] = float(data.reshape(-1)[0])
    else:
        lw.values[res] = lw.hbm(shape_of(res.type), elem_of(res.type), value=op.properties["value"])


def lower_reshape(lw: LoweringContext, op: Operation, loc: str) -> None:
    res = op.results[0]
    lw.values[res] = lw.view(lw.materialise(op.operands[0]), shape_of(res.type))
    if op.operands[0] in lw.absorbed:  # written in a later permute's layout (request_layout)
        lw.absorbed[res] = lw.absorbed[op.operands[0]]


def lower_expand(lw: LoweringContext, op: Operation, loc: str) -> None:
    """A broadcast view: stride 0 along the expanded dimensions."""
    res = op.results[0]
    src = lw.materialise(op.operands[0])
    out_shape = shape_of(res.type)
    shape = shape_of(src.type)
    strides, offset = lw.layout(src)
    lead = len(out_shape) - len(shape)
    new = [0] * lead + [0 if n == 1 and m != 1 else s for n, m, s in zip(shape, out_shape[lead:], strides)]
    lw.values[res] = lw.strided(src, out_shape, new, offset)


def lower_permute(lw: LoweringContext, op: Operation, loc: str) -> None:
    """A view when the innermost dimension stays innermost (DMAs still read long
    rows), else a transposing copy."""
    if not isinstance(op, g.PermuteOp):
        raise CompileError(f"lower_permute at {loc}: {op.name} is not a graph.permute")
    res = op.results[0]
    perm = [int(p) for p in op.permutation]
    if op.operands[0] in lw.absorbed:  # the producer wrote this permute's layout
        lw.values[res] = lw.absorbed[op.operands[0]]
        return
    src = lw.materialise(op.operands[0])
    out_shape = shape_of(res.type)
    if len(out_shape) < 2 or perm[-1] == len(perm) - 1:
        strides, offset = lw.layout(src)
        lw.values[res] = lw.strided(src, out_shape, [strides[p] for p in perm], offset)
        return
    lw.values[res] = lw.permuted(src, perm, loc)


LOWERINGS = {
    g.WeightOp: lower_weight,
    g.ConstantOp: lower_constant,
    g.ReshapeOp: lower_reshape,
    g.ExpandOp: lower_expand,
    g.PermuteOp: lower_permute,
}
