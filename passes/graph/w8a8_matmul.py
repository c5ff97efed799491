"""W8A8 matmuls: a float matmul of two int8 values converted to float becomes one int8 x
int8 matmul, accumulated in fp32 (run by canonicalize-graph).

A W8A8 linear (tilecc/quantize.py, ``activations="int8"``) quantises its input per row
and multiplies the integers in float: ``F.linear(x_q.float(), weight_q.float())``. The
front end keeps the weight one byte a parameter (frontend/lowp_weights.py), so the graph
multiplies two casts of i8 tensors. Every i8 x i8 product (|p| <= 127**2) and every sum
of them below 2**24 in magnitude is exact in fp32, so reading the i8 operands directly
computes the same values: the matrix engine runs at its 8-bit rate
(``matrix.int8_speedup``; simulator/timing.py `lowp_speedup`), the activation's DMA and
SRAM traffic is one byte an element, and the row and channel scales that follow are
the matmul's epilogue (fuse-graph).

Before::

    %xq = graph.cast %r : tensor<1x64xf32> -> tensor<1x64xi8>
    %xi = graph.cast %xq : tensor<1x64xi8> -> tensor<1x64xi32>     // the front end's int tensors
    %a = graph.cast %xi : tensor<1x64xi32> -> tensor<1x64xf32>
    %q = graph.weight "up.weight_q.T" : tensor<64x128xi8>
    %b = graph.cast %q : tensor<64x128xi8> -> tensor<64x128xf32>
    %y = graph.matmul %a, %b : tensor<1x64xf32>, tensor<64x128xf32> -> tensor<1x128xf32>

After::

    %y = graph.matmul %xq, %q : tensor<1x64xi8>, tensor<64x128xi8> -> tensor<1x128xf32>

A cast reshaped before the matmul (a linear's ``[B, S, K]`` input viewed ``[B*S, K]``)
becomes the same reshape of the i8 tensor. A matmul of another float type (bf16 casts)
keeps its rounding: the int8 matmul's fp32
result is cast to it.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Operation

from tilecc.ir import graph as g
from tilecc.ir.graph_lowp import int8_source


def rewrite_w8a8_matmuls(fn: func.FuncOp) -> int:
    """Matmuls of two float-converted i8 tensors -> i8 x i8 matmuls; the number rewritten."""
    count = 0
    for op in list(fn.body.block.ops):
        if not isinstance(op, g.MatmulOp):
            continue
        a, b = int8_source(op.lhs), int8_source(op.rhs)
        if a is None or b is None:
            continue
        loc = g.source_loc(op)
        new: list[Operation] = []
        if g.shape_of(a) != g.shape_of(op.lhs):  # the cast was reshaped ([B, S, K] -> [B*S, K])
            new.append(g.ReshapeOp.make(a, g.shape_of(op.lhs), loc=loc))
            a = new[-1].results[0]
        if g.shape_of(b) != g.shape_of(op.rhs):
            new.append(g.ReshapeOp.make(b, g.shape_of(op.rhs), loc=loc))
            b = new[-1].results[0]
        mm = g.MatmulOp.make(a, b, loc=loc)
        new.append(mm)
        if op.results[0].type != mm.results[0].type:
            new.append(g.CastOp.make(mm.results[0], g.element_dtype(op.results[0].type), loc=loc))
        fn.body.block.insert_ops_before(new, op)
        op.results[0].replace_all_uses_with(new[-1].results[0])
        count += 1
    return count
