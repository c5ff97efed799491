"""RMSNorm (canonicalize-graph): the decomposed norm of Llama, Qwen2, Mistral and Gemma
becomes one `graph.rms_norm` (the patterns: `ir/graph_rms_norm_pattern.py`).

Before (LlamaRMSNorm, bf16)::

    %h = graph.cast %x : tensor<2x5x64xbf16> -> tensor<2x5x64xf32>
    %s = graph.mul %h, %h : ...
    %m = graph.mean %s dims [2] keepdim true : tensor<2x5x64xf32> -> tensor<2x5x1xf32>
    %e = graph.constant dense<1.000000e-06> : tensor<f32>
    %a = graph.add %m, %e : ...
    %r = graph.rsqrt %a : tensor<2x5x1xf32>
    %n = graph.mul %h, %r : ...
    %c = graph.cast %n : tensor<2x5x64xf32> -> tensor<2x5x64xbf16>
    %w = graph.weight "norm.weight" : tensor<64xbf16>
    %y = graph.mul %w, %c : tensor<64xbf16>, tensor<2x5x64xbf16> -> tensor<2x5x64xbf16>

After::

    %w = graph.weight "norm.weight" : tensor<64xbf16>
    %y = graph.rms_norm %x, %w eps 1.000000e-06 cast_before_weight
           : tensor<2x5x64xbf16>, tensor<64xbf16> -> tensor<2x5x64xbf16>

A chain of this shape that differs (the mean over another dim, bf16 arithmetic, ...)
stays decomposed with a "missed" remark saying why. The chain's ops are left to
dead-code elimination.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType

from tilecc.ir import graph as g
from tilecc.ir.graph_rms_norm_pattern import match_rms_norm
from tilecc.passes import remarks

PASS = "canonicalize-graph"


def recognise_rms_norm(fn: func.FuncOp) -> int:
    """Rewrite every decomposed RMSNorm of `fn` into `graph.rms_norm`; the number rewritten."""
    count = 0
    for op in list(fn.body.block.ops):
        if op.parent is None:
            continue  # erased with an earlier chain
        m = match_rms_norm(op)
        if m is None:
            continue
        loc = g.source_loc(op)
        if isinstance(m, str):
            remarks.emit(PASS, "missed", f"RMSNorm-shaped chain left decomposed: {m}", loc)
            continue
        res = m.final.results[0]
        assert isinstance(res.type, TensorType)
        new = g.RmsNormOp.make(m.x, m.weight, m.eps, res.type, cast_before_weight=m.cast_before_weight, loc=loc)
        fn.body.block.insert_op_before(new, m.final)
        res.replace_all_uses_with(new.results[0])
        count += 1
        remarks.emit(PASS, "passed", f"decomposed RMSNorm ({len(m.ops)} ops, eps {m.eps:g}"
                     f"{', cast before the weight' if m.cast_before_weight else ''}) -> graph.rms_norm", loc)
    return count


__all__ = ["recognise_rms_norm"]
