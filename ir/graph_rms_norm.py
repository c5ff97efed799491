"""graph.rms_norm: root-mean-square norm over the last dim, computed in fp32.

    %y = graph.rms_norm %x, %w eps 1.000000e-06 : tensor<2x5x64xbf16>, tensor<64xbf16> -> tensor<2x5x64xbf16>
    %y = graph.rms_norm %x, %w eps 1.000000e-06 cast_before_weight : ... (Llama's order)

``h = f32(x); n = h * rsqrt(mean(h * h, -1) + eps)``, then either ``y = out(n * w)``
(Gemma's order: the weight multiply in fp32, then the cast to the result type; Gemma's
``1 + w`` is the weight operand) or, with ``cast_before_weight``, ``y = out(w * out(n))``
(Llama / Qwen2 / Mistral: ``weight * h.to(input_dtype)``, the normalised row rounded to
the result type before the weight multiply). In fp32 the two orders are the same.

The decomposed spellings `transformers` models export are matched in
`ir/graph_rms_norm_pattern.py` and rewritten into this op by
`passes/graph/rms_norm.py`; it lowers to one row-wise kernel
(`passes/graph_to_tile/rowwise.py`) or into the prologue of the matmul reading it.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import Float64Type, FloatAttr, TensorType, UnitAttr, f64
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, prop_def, result_def

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import GraphOp, as_value, check_tensor, element_dtype, set_loc, shape_of
from tilecc.simulator.numerics import round_to


@irdl_op_definition
class RmsNormOp(GraphOp):
    """RMS norm over the last dim with a weight of the last dim's size (fp32 arithmetic)."""

    name = "graph.rms_norm"
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    eps = prop_def(FloatAttr[Float64Type])
    cast_before_weight = opt_prop_def(UnitAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $weight `eps` $eps (`cast_before_weight` $cast_before_weight^)? "
        "attr-dict `:` type($input) `,` type($weight) `->` type($result)"
    )

    @staticmethod
    def check(x: Attribute, w: Attribute, out: Attribute, eps: float) -> None:
        op = RmsNormOp.name
        xt, wt, ot = check_tensor(x, op, "input"), check_tensor(w, op, "weight"), check_tensor(out, op, "result")
        shape = tuple(xt.get_shape())
        if not shape or shape[-1] < 1:
            raise ShapeError(f"{op}: input {list(shape)} has no last dim to normalise")
        if tuple(wt.get_shape()) != shape[-1:]:
            raise ShapeError(f"{op}: weight shape {list(wt.get_shape())} must be [{shape[-1]}] (the last dim of "
                             f"input {list(shape)})")
        if tuple(ot.get_shape()) != shape:
            raise ShapeError(f"{op}: result shape {list(ot.get_shape())} must equal the input's {list(shape)}")
        if not eps == eps or eps < 0:
            raise ShapeError(f"{op}: eps must be a non-negative number, got {eps}")

    def verify_(self) -> None:
        self.check(self.input.type, self.weight.type, self.result.type, self.eps.value.data)

    @classmethod
    def make(cls, x: SSAValue, weight: SSAValue, eps: float, result_type: TensorType, *,
             cast_before_weight: bool = False, loc: str | None = None) -> RmsNormOp:
        x, weight = as_value(x), as_value(weight)
        cls.check(x.type, weight.type, result_type, float(eps))
        props: dict[str, Attribute] = {"eps": FloatAttr(float(eps), f64)}
        if cast_before_weight:
            props["cast_before_weight"] = UnitAttr()
        return set_loc(cls.create(operands=[x, weight], result_types=[result_type], properties=props), loc)

    @property
    def eps_value(self) -> float:
        return float(self.eps.value.data)

    @property
    def weight_after_cast(self) -> bool:
        return self.cast_before_weight is not None

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, w = args
        h = np.asarray(x, dtype=np.float32).astype(np.float64)
        n = (h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.eps_value)).astype(np.float32)
        w32 = np.asarray(w, dtype=np.float32)
        if self.weight_after_cast:
            n = np.asarray(round_to(n, element_dtype(self.result.type)), dtype=np.float32).reshape(n.shape)
        return (n * w32).astype(np.float32).reshape(shape_of(self.result))


__all__ = ["RmsNormOp"]
