"""Weight-only quantised matmuls: the one-byte weight goes to the matrix engine, the
per-output-channel scale becomes the matmul's epilogue (run by canonicalize-graph).

The front end imports a quantised linear's weight as its dequantisation
(frontend/lowp_weights.py): ``w[K, N] = cast(q) * s[1, N]``. Since
``sum_k x[m, k] q[k, n] s[n] = s[n] * sum_k x[m, k] q[k, n]``, the scale moves past the
contraction, and the matmul reads q itself: one byte a parameter from HBM, multiplied
by the array as i8 / f8e4m3 against bf16 (or f32) activations (simulator/isa.py: mixed
inputs), accumulated in fp32; fuse-graph then makes the scale (and a bias) the matmul
kernel's epilogue.

Before::

    %q = graph.weight "up.weight_q.T" : tensor<64x128xi8>
    %c = graph.cast %q : tensor<64x128xi8> -> tensor<64x128xbf16>
    %s = graph.weight "up.scale.row" : tensor<1x128xbf16>
    %w = graph.mul %c, %s : ... -> tensor<64x128xbf16>
    %y = graph.matmul %x, %w : tensor<8x64xbf16>, tensor<64x128xbf16> -> tensor<8x128xbf16>

After::

    %p = graph.matmul %x, %q : tensor<8x64xbf16>, tensor<64x128xi8> -> tensor<8x128xbf16>
    %y = graph.mul %p, %s : tensor<8x128xbf16>, tensor<1x128xbf16> -> tensor<8x128xbf16>

A matmul whose rhs does not match `ir/graph_lowp.match_lowp_weight` (a scale that is
not one row of N, a batched rhs) keeps the dequantised weight: correct, computed by the
vector engine from the one-byte weight before the matmul.
"""

from __future__ import annotations

from xdsl.dialects import func

from tilecc.ir import graph as g
from tilecc.ir.graph_lowp import match_lowp_weight


def rewrite_lowp_matmuls(fn: func.FuncOp) -> int:
    """Move the scales of one-byte weights past their matmuls; the number rewritten."""
    count = 0
    for op in list(fn.body.block.ops):
        if not isinstance(op, g.MatmulOp):
            continue
        found = match_lowp_weight(op.rhs)
        if found is None or g.element_dtype(op.lhs.type) != g.element_dtype(op.rhs.type):
            continue
        q, s = found
        loc = g.source_loc(op)
        mm = g.MatmulOp.make(op.lhs, q, loc=loc)
        scaled = g.MulOp.make(mm.results[0], s, loc=loc)
        fn.body.block.insert_ops_before([mm, scaled], op)
        op.results[0].replace_all_uses_with(scaled.results[0])
        count += 1
    return count
