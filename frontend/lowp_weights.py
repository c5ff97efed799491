"""One-byte weights: the dequantisation pattern of weight-only quantised linears
(tilecc/quantize.py) imported with the weight kept in int8 / fp8 e4m3.

torch.export gives, for `QuantizedLinear` (all inputs compile-time constants)::

    %c = aten._to_copy(%weight_q, dtype=bf16)      # int8 or float8_e4m3fn, [N, K]
    %s = aten.unsqueeze(%scale, 1)                 # [N, 1]
    %w = aten.mul(%c, %s)
    %t = aten.permute(%w, [1, 0])                  # [K, N]
    %y = aten.mm(%x, %t)                           # (or addmm with the bias)

The importer folds constants, so without this module the matmul would read the
dequantised weight (2-4 bytes a parameter) from HBM. `track` follows the chain while it
folds (the fold still happens: every other user sees the dequantised value); when a
tracked value is materialised, `materialise` emits it as::

    %q = graph.weight "up.weight_q.T" : tensor<K x N x i8>        # one byte a parameter
    %c = graph.cast %q : tensor<K x N x i8> -> tensor<K x N x bf16>
    %s = graph.weight "up.scale.row" : tensor<1 x N x bf16>
    %w = graph.mul %c, %s

which equals eager's value exactly (the graph interpreter computes it), and which
canonicalize-graph rewrites around the matmul into `mul(matmul(x, q), s)`: the matrix
engine takes the one-byte weight, the scale is the matmul's epilogue
(passes/graph/lowp_matmul.py).

A W8A8 linear (tilecc/quantize.py, ``activations="int8"``) converts its int8 weight
without scaling it (``aten.t(aten._to_copy(weight_q, f32))``: the scale is applied to
the product); that transposed conversion materialises as ``graph.cast`` of the one-byte
``[K, N]`` weight, which canonicalize-graph turns into an int8 x int8 matmul
(passes/graph/w8a8_matmul.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from tilecc.ir import graph as g
from tilecc.simulator.isa import DType

aten = torch.ops.aten

ONE_BYTE: dict[torch.dtype, DType] = {torch.int8: DType.I8, torch.float8_e4m3fn: DType.F8E4M3}
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class LowpWeight:
    """A folded constant that equals `q.to(dtype) * scale[:, None]`, transposed or not."""

    q: torch.Tensor  # [N, K], one byte per element
    q_name: str
    dtype: torch.dtype  # the dequantised weight's dtype (the activations')
    scale: torch.Tensor | None = None  # [N] in `dtype`; None while only converted
    scale_name: str = ""
    transposed: bool = False


def _const(imp: Any, a: Any) -> torch.Tensor | None:
    v = imp.const_values.get(a) if isinstance(a, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def track(imp: Any, node: Node) -> None:
    """After `node` folded: record it in `imp.lowp` if it continues a dequantisation."""
    out = imp.const_values.get(node)
    if not isinstance(out, torch.Tensor):
        return
    args = node.args
    if node.target == aten._to_copy.default and out.dtype in _FLOATS and out.dim() == 2:
        q = _const(imp, args[0])
        if q is not None and q.dtype in ONE_BYTE:
            imp.lowp[node] = LowpWeight(q, imp.const_names.get(args[0], f"folded.{node.name}"), out.dtype)
        return
    if node.target == aten.mul.Tensor and len(args) == 2:
        for a, b in ((args[0], args[1]), (args[1], args[0])):
            src = imp.lowp.get(a) if isinstance(a, Node) else None
            s = _const(imp, b)
            if src is None or src.scale is not None or src.transposed or s is None:
                continue
            if tuple(s.shape) == (src.q.shape[0], 1) and s.dtype == src.dtype:
                name = imp.const_names.get(b, f"folded.{node.name}")
                imp.lowp[node] = LowpWeight(src.q, src.q_name, src.dtype, s[:, 0], name)
                return
        return
    if node.target in (aten.permute.default, aten.t.default) and isinstance(args[0], Node):
        src = imp.lowp.get(args[0])
        perm = list(args[1]) if len(args) > 1 else [1, 0]  # pyright: ignore[reportArgumentType]
        if src is not None and perm == [1, 0]:
            imp.lowp[node] = LowpWeight(src.q, src.q_name, src.dtype, src.scale, src.scale_name, not src.transposed)


def materialise(imp: Any, node: Node) -> Any:
    """The graph value of a tracked constant: one-byte weight, cast, times the scale (or
    the transposed weight, cast, unscaled: W8A8). None for any other value (the caller
    folds it)."""
    from tilecc.frontend.torch_export import _dtype
    from tilecc.frontend.torch_values import _weight_values

    w = imp.lowp.get(node)
    if w is None or (w.scale is None and not w.transposed):
        return None
    q = w.q.T.contiguous() if w.transposed else w.q.contiguous()
    q_name = f"{w.q_name}.T" if w.transposed else w.q_name
    if q_name not in imp.weights:
        imp.weights[q_name] = _weight_values(q.float(), q_name)  # a MetaWeight on the meta device
    dt = _dtype(w.dtype)
    qv = imp.emit(g.WeightOp.make(q_name, g.tensor_type(list(q.shape), ONE_BYTE[w.q.dtype])))
    if w.scale is None:
        return imp.cast_to(qv, dt)
    s = w.scale.reshape((1, -1) if w.transposed else (-1, 1)).contiguous()
    s_name = f"{w.scale_name}.{'row' if w.transposed else 'column'}"
    if s_name not in imp.weights:
        imp.weights[s_name] = _weight_values(s.float(), s_name)
    sv = imp.emit(g.WeightOp.make(s_name, g.tensor_type(list(s.shape), dt)))
    return imp.emit(g.MulOp.make(imp.cast_to(qv, dt), sv))
