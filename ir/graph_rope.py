"""Rotary position embedding as one graph op: ``graph.rope``.

    y = x * cos + rotate_half(x) * sin,    rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])

x ``[..., S, D]`` (D even; in an LLM ``[B, H, S, D]``, the transposed view of a q or k
projection), cos and sin broadcasting to x (``[B, 1, S, D]``: one row per position,
shared by every head). The result has x's shape and element type. Each step rounds to
that type as eager does op by op (``x * cos`` rounded, ``rotate_half(x) * sin``
rounded, their sum rounded; the negation and the concatenation are exact).

`passes/graph/rope.py` recognises the decomposed form models export (slices, neg,
concat, two muls and an add); `passes/graph_to_tile/rope/` lowers it to one kernel
over the projection's natural ``[S, H * D]`` layout.

Syntax::

    %y = graph.rope %x, %cos, %sin : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32>,
        tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, result_def

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import (
    GraphOp,
    as_value,
    broadcast_shapes,
    check_tensor,
    element_dtype,
    fmt_type,
    same_element,
    set_loc,
)
from tilecc.simulator.numerics import round_to


@irdl_op_definition
class RopeOp(GraphOp):
    """``x * cos + rotate_half(x) * sin`` (module docstring)."""

    name = "graph.rope"
    x = operand_def(TensorType)
    cos = operand_def(TensorType)
    sin = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = "$x `,` $cos `,` $sin attr-dict `:` type($x) `,` type($cos) `,` type($sin) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, cos: Attribute, sin: Attribute) -> TensorType:
        op = RopeOp.name
        x = check_tensor(x, op, "x")
        cos = check_tensor(cos, op, "cos")
        sin = check_tensor(sin, op, "sin")
        same_element(op, x, cos, sin)
        shape = list(x.get_shape())
        if len(shape) < 2 or shape[-1] % 2 or shape[-1] == 0:
            raise ShapeError(f"{op}: x must be [..., S, D] with D even and positive, got {fmt_type(x)}")
        for what, t in (("cos", cos), ("sin", sin)):
            if list(broadcast_shapes(op, shape, t.get_shape())) != shape or t.get_shape()[-1] != shape[-1]:
                raise ShapeError(f"{op}: {what} {fmt_type(t)} does not broadcast to x {fmt_type(x)} "
                                 "along all but its last dim (which must be D)")
        return x

    def infer_result_type(self) -> TensorType:
        return self.infer(self.x.type, self.cos.type, self.sin.type)

    @classmethod
    def make(cls, x: SSAValue, cos: SSAValue, sin: SSAValue, *, loc: str | None = None) -> RopeOp:
        x, cos, sin = as_value(x), as_value(cos), as_value(sin)
        t = cls.infer(x.type, cos.type, sin.type)
        op = cls.create(operands=[x, cos, sin], result_types=[t])
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, cos, sin = (np.asarray(a, dtype=np.float32) for a in args)
        dt = element_dtype(self.result.type)
        h = x.shape[-1] // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        a = round_to(x * cos, dt)
        b = round_to(rot * sin, dt)
        return np.asarray(round_to(a + b, dt), dtype=np.float32)


ROPE_OPS = (RopeOp,)
