"""Elementwise graph ops: binary ops with broadcasting, unary activations, GELU.

    %s = graph.add %a, %b : tensor<5x1xf32>, tensor<5x37xf32> -> tensor<5x37xf32>
    %r = graph.relu %s : tensor<5x37xf32>
    %g = graph.gelu %r approximate "tanh" : tensor<5x37xf32>

They build on `GraphOp` (`ir/graph_base.py`) and join the `graph` dialect in
`ir/graph.py`, which re-exports them (``g.AddOp``). More elementwise ops (abs, log,
pow, comparisons, where) live with the index ops in `ir/graph_index.py`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
)

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import GraphOp, as_value, broadcast_shapes, check_tensor, same_element, set_loc

# ---------------------------------------------------------------------------
# Binary elementwise
# ---------------------------------------------------------------------------


class BinaryElementwiseOp(GraphOp):
    """``lhs op rhs`` with numpy / torch broadcasting; equal element types."""

    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    )

    @classmethod
    def infer(cls, lhs: Attribute, rhs: Attribute) -> TensorType[Attribute]:
        lhs = check_tensor(lhs, cls.name, "lhs")
        rhs = check_tensor(rhs, cls.name, "rhs")
        et = same_element(cls.name, lhs, rhs)
        return TensorType(et, broadcast_shapes(cls.name, lhs.get_shape(), rhs.get_shape()))

    def infer_result_type(self) -> TensorType:
        return self.infer(self.lhs.type, self.rhs.type)

    @classmethod
    def make(cls, lhs: SSAValue, rhs: SSAValue, *, loc: str | None = None):
        lhs, rhs = as_value(lhs), as_value(rhs)
        t = cls.infer(lhs.type, rhs.type)
        return set_loc(cls.create(operands=[lhs, rhs], result_types=[t]), loc)

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(self, *args: np.ndarray) -> np.ndarray:
        a, b = args
        a = np.asarray(a, dtype=np.float32)
        b = np.asarray(b, dtype=np.float32)
        with np.errstate(all="ignore"):
            return np.asarray(self.compute(a, b), dtype=np.float32)


@irdl_op_definition
class AddOp(BinaryElementwiseOp):
    name = "graph.add"
    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b)


@irdl_op_definition
class SubOp(BinaryElementwiseOp):
    name = "graph.sub"
    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.subtract(a, b)


@irdl_op_definition
class MulOp(BinaryElementwiseOp):
    name = "graph.mul"
    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.multiply(a, b)


@irdl_op_definition
class DivOp(BinaryElementwiseOp):
    name = "graph.div"
    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.divide(a, b)


def _torch_maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(a, b)  # NaN-propagating, like torch.maximum


@irdl_op_definition
class MaximumOp(BinaryElementwiseOp):
    name = "graph.maximum"
    compute = staticmethod(_torch_maximum)


# ---------------------------------------------------------------------------
# Unary elementwise
# ---------------------------------------------------------------------------


class UnaryElementwiseOp(GraphOp):
    """``f(input)``, result of the same type."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    result = result_def(T)

    assembly_format = "$input attr-dict `:` type($result)"

    @classmethod
    def infer(cls, x: Attribute) -> TensorType[Attribute]:
        return check_tensor(x, cls.name, "input")

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type)

    @classmethod
    def make(cls, x: SSAValue, *, loc: str | None = None):
        x = as_value(x)
        t = cls.infer(x.type)
        return set_loc(cls.create(operands=[x], result_types=[t]), loc)

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        x = np.asarray(x, dtype=np.float32)
        with np.errstate(all="ignore"):
            return np.asarray(self.compute(x), dtype=np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (1.0 / (1.0 + np.exp(-x64))).astype(np.float32)


@irdl_op_definition
class ReluOp(UnaryElementwiseOp):
    name = "graph.relu"

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.where(x > 0, x, np.where(np.isnan(x), x, np.float32(0)))


@irdl_op_definition
class ExpOp(UnaryElementwiseOp):
    name = "graph.exp"
    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.exp(x)


@irdl_op_definition
class TanhOp(UnaryElementwiseOp):
    name = "graph.tanh"
    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.tanh(x)


@irdl_op_definition
class SigmoidOp(UnaryElementwiseOp):
    name = "graph.sigmoid"
    compute = staticmethod(_sigmoid)


@irdl_op_definition
class NegOp(UnaryElementwiseOp):
    name = "graph.neg"
    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.negative(x)


@irdl_op_definition
class RsqrtOp(UnaryElementwiseOp):
    name = "graph.rsqrt"

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return (1.0 / np.sqrt(x.astype(np.float64))).astype(np.float32)


@irdl_op_definition
class SqrtOp(UnaryElementwiseOp):
    name = "graph.sqrt"
    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.sqrt(x)


@irdl_op_definition
class SiluOp(UnaryElementwiseOp):
    name = "graph.silu"

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float64) * _sigmoid(x).astype(np.float64)).astype(np.float32)


def erf64(x64: np.ndarray) -> np.ndarray:
    """erf in float64 (numpy has none; torch's is vectorised and accurate)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x64, dtype=np.float64))  # pyright: ignore[reportUnknownMemberType] (torch stub: ndarray param untyped)
    return torch.special.erf(t).numpy()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType] (torch.special has no stubs)


def gelu_reference(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    x64 = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)
        y = 0.5 * x64 * (1.0 + np.tanh(inner))
    else:
        y = 0.5 * x64 * (1.0 + erf64(x64 / math.sqrt(2.0)))
    return y.astype(np.float32)


@irdl_op_definition
class GeluOp(GraphOp):
    """GELU; ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""

    name = "graph.gelu"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    approximate = prop_def(StringAttr)
    result = result_def(T)

    assembly_format = "$input `approximate` $approximate attr-dict `:` type($result)"

    APPROXIMATIONS: ClassVar = ("none", "tanh")

    def infer_result_type(self) -> TensorType:
        if self.approximate.data not in self.APPROXIMATIONS:
            raise ShapeError(
                f"graph.gelu: approximate must be 'none' or 'tanh', got {self.approximate.data!r}"
            )
        return check_tensor(self.input.type, self.name, "input")

    @classmethod
    def make(cls, x: SSAValue, approximate: str = "none", *, loc: str | None = None) -> GeluOp:
        x = as_value(x)
        if approximate not in cls.APPROXIMATIONS:
            raise ShapeError(f"graph.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        t = check_tensor(x.type, cls.name, "input")
        op = cls.create(
            operands=[x], result_types=[t], properties={"approximate": StringAttr(approximate)}
        )
        return set_loc(op, loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        return gelu_reference(x, self.approximate.data)
