"""Row-wise graph ops: softmax, layer norm and RMS norm keep whole rows on chip, one kernel each.

A row is the last dim (softmax over another dim moves it last with a transposing copy
and back); a row too long for an SRAM partition with its working buffers is a
`TensorTooLargeError`.

Before (graph)::

    %y = graph.softmax %x {dim = 1} : tensor<64x100xf32>

After (tile)::

    func.func @k0_softmax(%x: memref<64x100xf32>, %out: memref<64x100xf32>) attributes {tile.kernel} {
      scf.for ... {                   // row tiles
        tile.load ...; tile.reduce "max" ...; tile.binary "sub" ... "column"; tile.unary "exp" ...
        tile.reduce "add" ...; tile.binary "div" ... "column"; tile.store ...
    }}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import Operation

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.rms_norm_split import lower_rms_norm_split, split_of
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel


def lower_softmax(lw: LoweringContext, op: Operation, loc: str) -> None:
    """Softmax along the last dim (any other dim: moved last by a transposing copy
    and back): one row-wise kernel."""
    if not isinstance(op, g.SoftmaxOp):
        raise CompileError(f"lower_softmax at {loc}: {op.name} is not a graph.softmax")
    res = op.results[0]
    shape = shape_of(res.type)
    dim = op.dim.value.data
    src = lw.materialise(op.operands[0])
    perm = list(range(len(shape)))
    if shape and dim != len(shape) - 1:
        perm = [d for d in perm if d != dim] + [dim]
        src = lw.permuted(src, perm, loc)
    x, R, C = lw.rows_view(None, loc, "graph.softmax", src=src)
    out = lw.rowwise_kernel("softmax", loc, x, R, C, elem_of(res.type))
    if perm != sorted(perm):
        moved = [shape[d] for d in perm]
        lw.values[res] = lw.permuted(lw.view(out, moved), list(np.argsort(perm)), loc)
    else:
        lw.values[res] = lw.view(out, shape)


def lower_layer_norm(lw: LoweringContext, op: Operation, loc: str) -> None:
    """Layer norm over the last `normalized_ndim` dims, with its weight and bias."""
    if not isinstance(op, g.LayerNormOp):
        raise CompileError(f"lower_layer_norm at {loc}: {op.name} is not a graph.layer_norm")
    res = op.results[0]
    nd = op.normalized_ndim.value.data
    eps = op.eps.value.data
    x, R, C = lw.rows_view(op.operands[0], loc, "graph.layer_norm", row_ndim=nd)
    w = lw.view(lw.materialise(op.operands[1]), (1, C))
    b = lw.view(lw.materialise(op.operands[2]), (1, C))
    out = lw.rowwise_kernel("layer_norm", loc, x, R, C, elem_of(res.type), (w, b), float(eps))
    lw.values[res] = lw.view(out, shape_of(res.type))



def rms_norm_nodes(ek: ElementwiseKernel, op: g.RmsNormOp, x: int, w: int) -> int:
    """The nodes of an RMS norm of node `x` with weight node `w` (a [1, C] row): the
    row-wise ``rms_norm`` (the layer norm's statistics without the mean subtraction)
    with the weight in fp32, or, with ``cast_before_weight``, the normalised rows rounded
    to the result type and then multiplied by the weight (Llama's order)."""
    from tilecc.passes.graph_to_tile.elementwise.dag import Imm

    elem = elem_of(op.result.type)
    if not op.weight_after_cast:
        return ek.rowwise("rms_norm", [x, w], elem, op.eps_value)
    n = ek.rowwise("rms_norm", [x, ek.imm(1.0)], elem, op.eps_value)
    weight = ek.values[w]
    if isinstance(weight, Imm) and weight.value == 1.0:  # a weight of ones (folded into the matmuls after it)
        return n  # n is rounded to the result type already: times one changes nothing
    return ek.binary("mul", n, w, elem)


def lower_rms_norm(lw: LoweringContext, op: Operation, loc: str) -> None:
    """RMS norm over the last dim, with its weight: one row-wise kernel (few rows: one
    kernel with each row split over partitions, `rms_norm_split.py`)."""
    from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

    if not isinstance(op, g.RmsNormOp):
        raise CompileError(f"lower_rms_norm at {loc}: {op.name} is not a graph.rms_norm")
    res = op.results[0]
    x, R, C = lw.rows_view(op.operands[0], loc, "graph.rms_norm")
    k = split_of(lw, R, C)
    if k is not None:  # few rows (a decode step): each spread over k partitions
        lower_rms_norm_split(lw, op, x, R, C, k, loc)
        return
    w = lw.view(lw.materialise(op.operands[1]), (1, C))
    ek = ElementwiseKernel(lw, "rms_norm", loc, (R, C))
    y = rms_norm_nodes(ek, op, ek.leaf_hbm(x, [0, 1]), ek.leaf_hbm(w, [None, 1]))
    ek.output(y, elem_of(res.type))
    lw.values[res] = lw.view(ek.build()[0], shape_of(res.type))


LOWERINGS = {g.SoftmaxOp: lower_softmax, g.LayerNormOp: lower_layer_norm, g.RmsNormOp: lower_rms_norm}
