"""The graph dialect's ground: element types, shape and location helpers, the `GraphOp` base.

Every graph op (`ir/graph.py`, `ir/graph_elementwise.py`, `ir/graph_nn.py`,
`ir/graph_index.py`) derives from `GraphOp`: it verifies by inferring its result type
(`infer_result_type`, raising `ShapeError`) and comparing, and gives its numpy
semantics in `reference`. The helpers convert between xDSL element types and the ISA's
`DType`, broadcast shapes and read or set the ``"tilecc.loc"`` attribute:

    tensor_type([5, 37], DType.BF16)         ->  tensor<5x37xbf16>
    broadcast_shapes("graph.add", [5, 1], [37])  ->  (5, 37)
    set_loc(op, "model.py:12"); source_loc(op)   ->  "model.py:12"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, cast

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    IntegerType,
    StringAttr,
    TensorType,
    i32,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.utils.exceptions import VerifyException

from tilecc.errors import ShapeError
from tilecc.simulator.isa import DTYPE_NAMES, DType

LOC_ATTR = "tilecc.loc"
UNKNOWN_LOC = "<unknown>"

OpT = TypeVar("OpT", bound=Operation)

# ---------------------------------------------------------------------------
# Types and helpers
# ---------------------------------------------------------------------------

_ELEMENT_DTYPES: dict[type[Attribute], DType] = {
    Float32Type: DType.F32,
    BFloat16Type: DType.BF16,
    Float16Type: DType.F16,
    Float8E4M3FNType: DType.F8E4M3,  # one-byte weights (frontend/lowp_weights.py)
}
i8 = IntegerType(8)  # one-byte weights (frontend/lowp_weights.py)
_DTYPE_ELEMENTS: dict[DType, Attribute] = {
    DType.F32: Float32Type(),
    DType.BF16: BFloat16Type(),
    DType.F16: Float16Type(),
    DType.I32: i32,
    DType.I8: i8,
    DType.F8E4M3: Float8E4M3FNType(),
}
# numpy storage of each element type (bf16 as raw uint16 bits, f8e4m3 as raw uint8 bits)
NP_STORAGE = {DType.F32: np.float32, DType.F16: np.float16, DType.BF16: np.uint16, DType.I32: np.int32,
              DType.I8: np.int8, DType.F8E4M3: np.uint8}


def _is_supported(et: Attribute) -> bool:
    return type(et) in _ELEMENT_DTYPES or et in (i32, i8)


def element_dtype(t: Attribute) -> DType:
    """The `DType` of a tensor type's element type (or of an element type itself)."""
    et: Attribute = cast(TensorType[Attribute], t).get_element_type() if isinstance(t, TensorType) else t
    if et == i32:
        return DType.I32
    if et == i8:
        return DType.I8
    try:
        return _ELEMENT_DTYPES[type(et)]
    except KeyError:
        raise ValueError(f"unsupported element type {et} (tilecc: f32, bf16, f16, i32)") from None


def element_type(dtype: DType | Attribute) -> Attribute:
    """The xdsl element type of a `DType` (an xdsl float type is returned unchanged)."""
    if isinstance(dtype, Attribute):
        element_dtype(dtype)  # validates
        return dtype
    try:
        return _DTYPE_ELEMENTS[DType(dtype)]
    except KeyError:
        raise ValueError(f"unsupported element type {dtype!r} (tilecc: f32, bf16, f16, i32)") from None



def tensor_type(shape: Sequence[int], dtype: DType | Attribute) -> TensorType:
    """``tensor<shape x dtype>`` from a shape and a `DType` (or an xdsl element type)."""
    return TensorType(element_type(dtype), [int(d) for d in shape])


def shape_of(v: SSAValue | TensorType) -> tuple[int, ...]:
    t = v.type if isinstance(v, SSAValue) else v
    assert isinstance(t, TensorType), t
    return tuple(t.get_shape())


def source_loc(op: Operation) -> str:
    """The op's ``"tilecc.loc"`` (``"fc1 (Linear) @ model.py:12"``, ``"file.py:LINE"``,
    ``"file.tdsl:LINE:COL"``), or ``"<unknown>"``."""
    a = op.attributes.get(LOC_ATTR)
    if isinstance(a, StringAttr):
        return a.data
    return UNKNOWN_LOC


def set_loc(op: OpT, loc: str | None) -> OpT:
    """Attach ``"tilecc.loc"`` to `op` (no-op when `loc` is None); returns `op`."""
    if loc is not None:
        op.attributes[LOC_ATTR] = StringAttr(loc)
    return op


def fmt_type(t: Attribute) -> str:
    if isinstance(t, TensorType):
        t = cast(TensorType[Attribute], t)  # isinstance leaves the element type parameter unknown
        try:
            dt = DTYPE_NAMES[element_dtype(t)]
        except ValueError:
            dt = str(t.get_element_type())
        return f"tensor<{'x'.join(str(d) for d in t.get_shape())}{'x' if t.get_shape() else ''}{dt}>"
    return str(t)


def check_tensor(t: Attribute, op: str, what: str) -> TensorType[Attribute]:
    """Raise ShapeError unless `t` is a static tensor of f32 / bf16 / f16 / i32."""
    if not isinstance(t, TensorType):
        raise ShapeError(f"{op}: {what} must be a tensor, got {t}")
    t = cast(TensorType[Attribute], t)  # isinstance leaves the element type parameter unknown
    shape = t.get_shape()
    if any(d < 0 for d in shape):
        raise ShapeError(f"{op}: {what} must have a static shape, got {t}")
    if not _is_supported(t.get_element_type()):
        raise ShapeError(
            f"{op}: {what} element type must be f32, bf16, f16 or i32, got {t.get_element_type()}"
        )
    return t


def same_element(op: str, *types: TensorType) -> Attribute:
    et = types[0].get_element_type()
    if any(t.get_element_type() != et for t in types[1:]):
        raise ShapeError(
            f"{op}: operand element types differ: {', '.join(fmt_type(t) for t in types)}"
        )
    return et


def broadcast_shapes(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy / torch broadcasting; ShapeError naming `op` and the shapes on mismatch."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(
                f"{op}: shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def as_value(x: SSAValue | Operation) -> SSAValue:
    return SSAValue.get(x)


# ---------------------------------------------------------------------------
# Base class
# ---------------------------------------------------------------------------


class GraphOp(IRDLOperation):
    """Common behaviour: verification through type inference, `reference`."""

    def infer_result_type(self) -> TensorType:
        """The result type implied by operands and properties (raises ShapeError)."""
        raise NotImplementedError

    def verify_(self) -> None:
        try:
            for i, o in enumerate(self.operands):
                check_tensor(o.type, self.name, f"operand #{i}")
            check_tensor(self.results[0].type, self.name, "result")
            inferred = self.infer_result_type()
        except ShapeError as e:
            raise VerifyException(str(e)) from None
        res = self.results[0].type
        if res != inferred:
            raise VerifyException(
                f"{self.name}: result type {fmt_type(res)} does not match the inferred "
                f"type {fmt_type(inferred)} (operands: "
                f"{', '.join(fmt_type(o.type) for o in self.operands) or 'none'})"
            )

    def reference(self, *args: np.ndarray) -> np.ndarray:
        raise NotImplementedError(self.name)
