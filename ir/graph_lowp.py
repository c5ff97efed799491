"""The dequantised one-byte weight: ``cast(q) * s``, q an i8 / f8e4m3 [K, N] tensor and s
one row [1, N] of per-output-channel scales in the cast's element type.

The front end writes a weight-only quantised linear's weight this way
(frontend/lowp_weights.py); canonicalize-graph moves the scale past the matmul that
reads it (passes/graph/lowp_matmul.py), and the roofline bound (ir/graph_work.py) counts
the product as no vector work for the same reason: the scale commutes with the
contraction, so it is applied to the matmul's result, not to the weight.

    match_lowp_weight(%w)  ->  (%q, %s) or None

A W8A8 matmul (tilecc/quantize.py, ``activations="int8"``) multiplies two int8 tensors
converted to float; `int8_source` finds the i8 tensor under such an operand, so the
rewrite (passes/graph/w8a8_matmul.py) and the bound (ir/graph_work.py: MACs at the
8-bit rate) see the same int8 x int8 product.

    int8_source(%a)  ->  %a_i8 or None
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.simulator.isa import LOW_PRECISION, DType


def match_lowp_weight(w: SSAValue) -> tuple[SSAValue, SSAValue] | None:
    """(q, s) if `w` is ``cast(q) * s`` with q a one-byte [K, N] tensor and s [1, N]."""
    mul = w.owner
    if not isinstance(mul, g.MulOp):
        return None
    for c, s in ((mul.lhs, mul.rhs), (mul.rhs, mul.lhs)):
        cast = c.owner
        if not isinstance(cast, g.CastOp) or g.element_dtype(cast.input.type) not in LOW_PRECISION:
            continue
        q = cast.input
        k_n, s_shape = g.shape_of(q), g.shape_of(s)
        if len(k_n) == 2 and s_shape == (1, k_n[1]) and s.type == g.tensor_type(s_shape, g.element_dtype(w.type)):
            return q, s
    return None


def int8_source(v: SSAValue) -> SSAValue | None:
    """x when `v` is ``graph.cast x`` of an i8 tensor to a float type (through an i32
    cast: the front end's integer tensors are i32; the cast possibly reshaped, as a
    linear's [B, S, K] input is to [B*S, K]: x then has the cast's shape), else None."""
    if isinstance(v.owner, g.ReshapeOp):
        v = v.owner.input
    cast = v.owner
    if not isinstance(cast, g.CastOp) or g.element_dtype(v.type) not in (DType.F32, DType.BF16, DType.F16):
        return None
    x = cast.input
    widen = x.owner
    if g.element_dtype(x.type) == DType.I32 and isinstance(widen, g.CastOp):
        x = widen.input
    return x if g.element_dtype(x.type) == DType.I8 else None


def only_matmul_rhs(w: SSAValue) -> bool:
    """Whether every use of `w` is as the rhs of a 2-D-weight matmul."""
    return bool(w.uses) and all(isinstance(u.operation, g.MatmulOp) and u.index == 1 for u in w.uses)


__all__ = ["int8_source", "match_lowp_weight", "only_matmul_rhs"]
