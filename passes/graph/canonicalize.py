"""canonicalize-graph: recognise activations that export decomposed, drop dead ops.

Models often spell activations out in primitive ops (GPT-2's ``gelu_new``, hand-written
SiLU); the NPU's vector engine computes them in one instruction. Patterns (operands of
commutative ops in either order, constants compared to 1 %, as bf16 rounds them):

- ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``  ->  ``gelu(x, "tanh")``
- ``0.5 * x * (1 + erf(x * (1/sqrt(2))))`` (or ``x / sqrt(2)``)  ->  ``gelu(x, "none")``
- ``x * sigmoid(x)``                                              ->  ``silu(x)``
- ``matmul(q, k^T)``, scale, mask, softmax, ``matmul(p, v)``       ->  ``sdpa(q, k, v)``
  (passes/graph/attention.py, which shows its IR before and after)
- ``x * cos + cat(-x[..., D/2:], x[..., :D/2]) * sin``              ->  ``rope(x, cos, sin)``
  (rotary position embedding: passes/graph/rope.py)
- ``matmul(x, cast(q_i8) * s)``                                    ->  ``matmul(x, q_i8) * s``
  (one-byte weights: passes/graph/lowp_matmul.py)
- ``matmul(f32(a_i8), f32(q_i8))``                                 ->  ``matmul(a_i8, q_i8)``
  (W8A8, both operands int8: passes/graph/w8a8_matmul.py)
- ``reshape(reshape(x))``                                          ->  ``reshape(x)``, or ``x``
  when the shapes agree (passes/graph/fold_reshapes.py)
- an op equal to an earlier one (same kind, operands, attributes)  ->  the earlier one
  (common subexpressions: passes/graph/cse.py)
- ``w * f32(x) * rsqrt(mean(f32(x)**2, -1) + eps)`` (casts back)  ->  ``rms_norm(x, w)``
  (passes/graph/rms_norm.py)

(the matchers live in `ir/graph_patterns.py`, which the roofline bound reads too)

Before::

    %h = graph.mul %x, %c05 ...            // 0.5 * x
    %p = graph.pow %x, %c3 ...             // x ** 3
    ...                                    // 6 more ops
    %y = graph.mul %h, %t1 ...

After::

    %y = graph.gelu %x approximate "tanh" {tilecc.loc = ...} : tensor<...>

The replaced ops are erased once nothing uses them (dead-code elimination runs over
the whole function).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from tilecc.ir import graph as g
from tilecc.ir.graph_patterns import match_gelu, match_silu
from tilecc.passes.graph.cse import eliminate_common_subexpressions
from tilecc.passes.graph.lowp_matmul import rewrite_lowp_matmuls
from tilecc.passes.graph.w8a8_matmul import rewrite_w8a8_matmuls


def canonicalize(fn: func.FuncOp, weights: Mapping[str, np.ndarray] | None = None) -> int:
    """Rewrite the patterns in `fn`; the number of rewrites. Explicit attentions become
    `graph.sdpa` (passes/graph/attention.py; with `weights`, a constant causal mask is
    recognised as causal)."""
    from tilecc.passes.graph.attention import mark_finite_masks, recognise_attention
    from tilecc.passes.graph.decode_attention import rewrite_decode_attention
    from tilecc.passes.graph.fold_reshapes import fold_reshapes
    from tilecc.passes.graph.rms_norm import recognise_rms_norm
    from tilecc.passes.graph.rope import recognise_rope
    from tilecc.passes.graph.scatter_index import fold_scatter_indices

    count = 0
    for op in list(fn.body.block.ops):
        new: Operation | None = None
        gelu = match_gelu(op)
        if gelu is not None:
            new = g.GeluOp.make(gelu[0], gelu[1], loc=g.source_loc(op))
        else:
            x = match_silu(op)
            if x is not None:
                new = g.SiluOp.make(x, loc=g.source_loc(op))
        if new is None:
            continue
        fn.body.block.insert_op_before(new, op)
        op.results[0].replace_all_uses_with(new.results[0])
        count += 1
    count += recognise_rms_norm(fn)  # RMSNorm (passes/graph/rms_norm.py)
    count += recognise_rope(fn)
    count += recognise_attention(fn, weights)
    count += rewrite_lowp_matmuls(fn)  # one-byte weights into the matrix engine (lowp_matmul.py)
    count += rewrite_w8a8_matmuls(fn)  # int8 x int8 (w8a8_matmul.py)
    count += rewrite_decode_attention(fn)
    mark_finite_masks(fn, weights)  # sdpa masks that never hold -inf (passes/graph/attention.py)
    count += fold_reshapes(fn)  # reshape chains, e.g. around a recognised attention (fold_reshapes.py)
    count += fold_scatter_indices(fn, weights)  # compile-time scatter indices (scatter_index.py)
    count += eliminate_common_subexpressions(fn)  # identical layers' equal values computed once (cse.py)
    dead_code(fn)
    return count


def dead_code(fn: func.FuncOp) -> None:
    """Erase graph ops whose results nobody uses (graph ops have no side effects)."""
    for op in reversed(list(fn.body.block.ops)):
        if isinstance(op, g.GraphOp) and op.results and all(not r.uses for r in op.results):
            op.detach()
            op.erase()


@dataclass(frozen=True)
class CanonicalizeGraphPass(ModulePass):
    name = "canonicalize-graph"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in op.ops:
            if isinstance(f, func.FuncOp):
                canonicalize(f)


__all__ = ["CanonicalizeGraphPass", "canonicalize", "match_gelu", "match_silu", "dead_code", "np"]
