"""The `graph` dialect: ATen-granularity tensor ops with static shapes.

Values are builtin `TensorType`s with a static shape and element type f32, bf16,
f16 or i32 (integer and bool tensors; bools are 0 / 1, see `graph_index`). A module
holds one ``func.func @forward``: user inputs are its arguments,
parameters / buffers / lifted constants are ``graph.weight`` ops whose data lives in
`GraphProgram.weights`, small constants are ``graph.constant``.

Every op:

- prints and parses in a custom assembly format that keeps the attr-dict, so the
  discardable attribute ``"tilecc.loc"`` (``"file.py:LINE"``) survives a round trip;
- verifies operand / result types in ``verify_()`` (raising `VerifyException`);
- has a builder ``Op.make(...)`` that infers the result type and raises
  `tilecc.errors.ShapeError` on operands it cannot take;
- has ``reference(*args)``: numpy semantics on float32 values (the interpreter rounds
  each result to the result element type).

Sample::

    %0 = graph.weight "fc1.weight" {tilecc.loc = "model.py:12"} : tensor<53x37xf32>
    %1 = graph.permute %0 [1, 0] : tensor<53x37xf32> -> tensor<37x53xf32>
    %2 = graph.matmul %arg0, %1 : tensor<5x37xf32>, tensor<37x53xf32> -> tensor<5x53xf32>
    %3 = graph.gelu %2 approximate "none" : tensor<5x53xf32>

This file holds the sources (weight, constant), matmul, softmax and layer norm, the
views and the cast, the dialect and `GraphProgram`; the op families are in files of
their own and re-exported here (``g.AddOp``): `graph_base` (element types, helpers,
the `GraphOp` base), `graph_elementwise`, `graph_nn`, `graph_index` and
`graph_fusion` (fused regions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, cast

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    I64,
    AnyDenseElement,
    BytesAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, Dialect, SSAValue
from xdsl.irdl import (
    AnyAttr,
    ParamAttrConstraint,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
)

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import LOC_ATTR as LOC_ATTR  # re-exported
from tilecc.ir.graph_base import (  # noqa: F401 (re-exported: g.GraphOp, g.element_dtype, ...)
    NP_STORAGE,
    GraphOp,
    as_value,
    broadcast_shapes,
    check_tensor,
    element_dtype,
    element_type,
    fmt_type,
    same_element,
    set_loc,
    tensor_type,
)
from tilecc.ir.graph_base import UNKNOWN_LOC as UNKNOWN_LOC  # re-exported
from tilecc.ir.graph_base import shape_of as shape_of  # re-exported
from tilecc.ir.graph_base import source_loc as source_loc  # re-exported
from tilecc.ir.graph_elementwise import (  # noqa: F401 (re-exported: g.AddOp, ...)
    AddOp,
    BinaryElementwiseOp,
    DivOp,
    ExpOp,
    GeluOp,
    MaximumOp,
    MulOp,
    NegOp,
    ReluOp,
    RsqrtOp,
    SigmoidOp,
    SiluOp,
    SqrtOp,
    SubOp,
    TanhOp,
    UnaryElementwiseOp,
)
from tilecc.ir.graph_elementwise import erf64 as erf64  # re-exported
from tilecc.ir.graph_elementwise import gelu_reference as gelu_reference  # re-exported
from tilecc.ir.graph_fusion import FUSION_OPS
from tilecc.ir.graph_index import INDEX_OPS
from tilecc.ir.graph_nn import NN_OPS
from tilecc.ir.graph_rms_norm import RmsNormOp as RmsNormOp  # re-exported: g.RmsNormOp (its own file)
from tilecc.ir.graph_rope import ROPE_OPS
from tilecc.ir.graph_routing import ROUTING_OPS
from tilecc.ir.graph_scatter import SCATTER_OPS
from tilecc.simulator.isa import LOW_PRECISION, DType

_element_type = element_type  # `make` methods take a parameter named `element_type`


# ---------------------------------------------------------------------------
# Sources: weights and constants
# ---------------------------------------------------------------------------


@irdl_op_definition
class WeightOp(GraphOp):
    """A parameter, buffer or lifted constant; data in `GraphProgram.weights[name]`."""

    name = "graph.weight"
    weight_name = prop_def(StringAttr, prop_name="name")
    result = result_def(TensorType)

    assembly_format = "$name attr-dict `:` type($result)"

    @classmethod
    def make(cls, name: str, type: TensorType, *, loc: str | None = None) -> WeightOp:
        check_tensor(type, cls.name, "result")
        op = cls.create(result_types=[type], properties={"name": StringAttr(name)})
        return set_loc(op, loc)

    @property
    def weight(self) -> str:
        return self.weight_name.data

    def infer_result_type(self) -> TensorType:
        return self.result.type

    def reference(self, *args: np.ndarray) -> np.ndarray:
        raise NotImplementedError(
            f"graph.weight {self.weight!r}: its data lives in GraphProgram.weights"
        )


@irdl_op_definition
class ConstantOp(GraphOp):
    """A small constant (scalars are rank-0 tensors)."""

    name = "graph.constant"
    T: ClassVar = VarConstraint("T", base(TensorType))
    value = prop_def(ParamAttrConstraint(DenseIntOrFPElementsAttr, (T, AnyAttr())))
    result = result_def(T)

    assembly_format = "$value attr-dict"

    @classmethod
    def make(
        cls, value: np.ndarray | float, element_type: DType | Attribute, *, loc: str | None = None
    ) -> ConstantOp:
        from tilecc.simulator.numerics import f32_to_bf16_bits, round_to

        arr = np.asarray(value, dtype=np.float32)
        t = tensor_type(arr.shape, element_type)
        dt = element_dtype(t)
        arr = np.asarray(round_to(arr, dt), dtype=np.float32).reshape(arr.shape)
        if dt == DType.BF16:
            data = f32_to_bf16_bits(arr).reshape(arr.shape)
        else:
            data = arr.astype(NP_STORAGE[dt])
        raw = np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<")).tobytes()
        # the element type is one of f32 / bf16 / f16 / i32 (checked by element_dtype above)
        attr = DenseIntOrFPElementsAttr(cast(TensorType[AnyDenseElement], t), BytesAttr(raw))
        op = cls.create(result_types=[t], properties={"value": attr})
        return set_loc(op, loc)

    def infer_result_type(self) -> TensorType:
        return cast(TensorType[Attribute], self.value.type)  # constrained to a tensor (T)

    def values(self) -> np.ndarray:
        """The constant as float32 values of the result's shape."""
        from tilecc.simulator.numerics import bf16_bits_to_f32

        t = self.value.type
        dt = element_dtype(t)
        raw = np.frombuffer(self.value.data.data, dtype=np.dtype(NP_STORAGE[dt]).newbyteorder("<"))
        vals = bf16_bits_to_f32(raw) if dt == DType.BF16 else raw.astype(np.float32)
        shape = tuple(t.get_shape())
        n = math.prod(shape)
        if vals.size == 1 and n != 1:
            vals = np.broadcast_to(vals, (n,))
        return np.array(vals, dtype=np.float32).reshape(shape)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        return self.values()


# ---------------------------------------------------------------------------
# Matmul
# ---------------------------------------------------------------------------


def matmul_shape(op: str, a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"{op}: operands must have rank >= 2, got {list(a)} and {list(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(
            f"{op}: contraction dims differ: {list(a)} @ {list(b)} ({a[-1]} != {b[-2]})"
        )
    try:
        batch = broadcast_shapes(op, a[:-2], b[:-2])
    except ShapeError:
        raise ShapeError(
            f"{op}: batch dims of {list(a)} and {list(b)} do not broadcast"
        ) from None
    return (*batch, a[-2], b[-1])


@irdl_op_definition
class MatmulOp(GraphOp):
    """torch.matmul on rank >= 2 operands: [..., M, K] @ [..., K, N], batch broadcast."""

    name = "graph.matmul"
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    )

    @staticmethod
    def infer(lhs: Attribute, rhs: Attribute) -> TensorType:
        lhs = check_tensor(lhs, MatmulOp.name, "lhs")
        rhs = check_tensor(rhs, MatmulOp.name, "rhs")
        if element_dtype(rhs) in LOW_PRECISION and element_dtype(lhs) in (DType.BF16, DType.F16, DType.F32):
            # a one-byte weight (i8 / f8e4m3) against float activations: the weight-only
            # quantised matmul (passes/graph/lowp_matmul.py); the result has lhs's type
            return TensorType(lhs.get_element_type(), matmul_shape(MatmulOp.name, lhs.get_shape(), rhs.get_shape()))
        if element_dtype(lhs) == element_dtype(rhs) == DType.I8:
            # int8 x int8 (W8A8: passes/graph/w8a8_matmul.py): the fp32 accumulator's values
            return TensorType(Float32Type(), matmul_shape(MatmulOp.name, lhs.get_shape(), rhs.get_shape()))
        et = same_element(MatmulOp.name, lhs, rhs)
        return TensorType(et, matmul_shape(MatmulOp.name, lhs.get_shape(), rhs.get_shape()))

    def infer_result_type(self) -> TensorType:
        return self.infer(self.lhs.type, self.rhs.type)

    @classmethod
    def make(cls, lhs: SSAValue, rhs: SSAValue, *, loc: str | None = None) -> MatmulOp:
        lhs, rhs = as_value(lhs), as_value(rhs)
        t = cls.infer(lhs.type, rhs.type)
        return set_loc(cls.create(operands=[lhs, rhs], result_types=[t]), loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        a, b = args
        # accumulate in float64: a tighter reference than any fp32 summation order
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)



# ---------------------------------------------------------------------------
# Reductions-with-broadcast: softmax, layer norm
# ---------------------------------------------------------------------------


@irdl_op_definition
class SoftmaxOp(GraphOp):
    """Softmax along `dim` (non-negative)."""

    name = "graph.softmax"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(T)

    assembly_format = "$input `dim` $dim attr-dict `:` type($result)"

    def infer_result_type(self) -> TensorType:
        t = check_tensor(self.input.type, self.name, "input")
        d = self.dim.value.data
        if not 0 <= d < max(t.get_num_dims(), 1):
            raise ShapeError(
                f"graph.softmax: dim {d} out of range for {fmt_type(t)} (must be in [0, {max(t.get_num_dims(), 1)}))"
            )
        return t

    @classmethod
    def make(cls, x: SSAValue, dim: int, *, loc: str | None = None) -> SoftmaxOp:
        x = as_value(x)
        t = check_tensor(x.type, cls.name, "input")
        rank = t.get_num_dims()
        if not -max(rank, 1) <= dim < max(rank, 1):
            raise ShapeError(f"graph.softmax: dim {dim} out of range for shape {list(t.get_shape())}")
        dim %= max(rank, 1)  # a rank-0 softmax (dim 0 or -1) is over the single element
        op = cls.create(
            operands=[x], result_types=[t], properties={"dim": IntegerAttr(dim, i64)}
        )
        return set_loc(op, loc)

    @property
    def axis(self) -> int:
        return self.dim.value.data

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 0:
            return np.ones_like(x, dtype=np.float32) if np.isfinite(x) else np.full_like(x, np.nan, dtype=np.float32)
        m = np.max(x, axis=self.axis, keepdims=True)
        with np.errstate(all="ignore"):
            e = np.exp(x - m)
            return (e / np.sum(e, axis=self.axis, keepdims=True)).astype(np.float32)


@irdl_op_definition
class LayerNormOp(GraphOp):
    """Layer norm over the trailing `normalized_ndim` dims; ``y = (x-mean)*rstd*w + b``."""

    name = "graph.layer_norm"
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = operand_def(TensorType)
    normalized_ndim = prop_def(IntegerAttr[I64])
    eps = prop_def(FloatAttr[Float64Type])
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $weight `,` $bias `normalized_ndim` $normalized_ndim `eps` $eps "
        "attr-dict `:` type($input) `,` type($weight) `,` type($bias) `->` type($result)"
    )

    @staticmethod
    def infer(
        x: Attribute, w: Attribute, b: Attribute, normalized_ndim: int, eps: float
    ) -> TensorType:
        op = LayerNormOp.name
        x = check_tensor(x, op, "input")
        w = check_tensor(w, op, "weight")
        b = check_tensor(b, op, "bias")
        same_element(op, x, w, b)
        shape = tuple(x.get_shape())
        if not 1 <= normalized_ndim <= len(shape):
            raise ShapeError(
                f"{op}: normalized_ndim {normalized_ndim} out of range for input {list(shape)}"
            )
        norm = shape[len(shape) - normalized_ndim :]
        for what, t in (("weight", w), ("bias", b)):
            if tuple(t.get_shape()) != norm:
                raise ShapeError(
                    f"{op}: {what} shape {list(t.get_shape())} must equal the normalised "
                    f"dims {list(norm)} of input {list(shape)}"
                )
        if eps != eps:
            raise ShapeError(f"{op}: eps must be a number, got {eps}")
        return x

    def infer_result_type(self) -> TensorType:
        return self.infer(
            self.input.type, self.weight.type, self.bias.type,
            self.normalized_ndim.value.data, self.eps.value.data,
        )

    @classmethod
    def make(
        cls,
        x: SSAValue,
        weight: SSAValue,
        bias: SSAValue,
        normalized_ndim: int,
        eps: float,
        *,
        loc: str | None = None,
    ) -> LayerNormOp:
        x, weight, bias = as_value(x), as_value(weight), as_value(bias)
        t = cls.infer(x.type, weight.type, bias.type, int(normalized_ndim), float(eps))
        op = cls.create(
            operands=[x, weight, bias],
            result_types=[t],
            properties={
                "normalized_ndim": IntegerAttr(int(normalized_ndim), i64),
                "eps": FloatAttr(float(eps), f64),
            },
        )
        return set_loc(op, loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, w, b = args
        n = self.normalized_ndim.value.data
        axes = tuple(range(x.ndim - n, x.ndim))
        x64 = np.asarray(x, dtype=np.float64)
        mean = np.mean(x64, axis=axes, keepdims=True)
        var = np.mean((x64 - mean) ** 2, axis=axes, keepdims=True)
        y = (x64 - mean) / np.sqrt(var + self.eps.value.data)
        return (y * w.astype(np.float64) + b.astype(np.float64)).astype(np.float32)


# ---------------------------------------------------------------------------
# Data movement / type changes
# ---------------------------------------------------------------------------


@irdl_op_definition
class PermuteOp(GraphOp):
    """``result.shape[i] = input.shape[perm[i]]`` (torch.permute)."""

    name = "graph.permute"
    input = operand_def(TensorType)
    perm = prop_def(DenseArrayBase.constr(I64))
    result = result_def(TensorType)

    assembly_format = "$input $perm attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, perm: Sequence[int]) -> TensorType:
        x = check_tensor(x, PermuteOp.name, "input")
        shape = x.get_shape()
        if sorted(perm) != list(range(len(shape))):
            raise ShapeError(
                f"graph.permute: {list(perm)} is not a permutation of the dims of {list(shape)}"
            )
        return TensorType(x.get_element_type(), [shape[p] for p in perm])

    @property
    def permutation(self) -> tuple[int, ...]:
        return tuple(self.perm.get_values())

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, self.permutation)

    @classmethod
    def make(cls, x: SSAValue, perm: Sequence[int], *, loc: str | None = None) -> PermuteOp:
        x = as_value(x)
        rank = check_tensor(x.type, cls.name, "input").get_num_dims()
        norm = [int(p) + rank if int(p) < 0 else int(p) for p in perm]
        t = cls.infer(x.type, norm)
        op = cls.create(
            operands=[x], result_types=[t], properties={"perm": DenseArrayBase.from_list(i64, norm)}
        )
        return set_loc(op, loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        return np.ascontiguousarray(np.transpose(x, self.permutation))


@irdl_op_definition
class ReshapeOp(GraphOp):
    """Row-major reshape to the result type's shape (same element count)."""

    name = "graph.reshape"
    input = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, shape: Sequence[int]) -> TensorType:
        x = check_tensor(x, ReshapeOp.name, "input")
        src = list(x.get_shape())
        shape = [int(d) for d in shape]
        n = math.prod(src)
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise ShapeError(f"graph.reshape: invalid target shape {shape} for input {src}")
        if -1 in shape:
            rest = math.prod(d for d in shape if d != -1)
            if rest == 0 or n % rest:
                raise ShapeError(f"graph.reshape: cannot reshape {src} to {shape}")
            shape[shape.index(-1)] = n // rest
        if math.prod(shape) != n:
            raise ShapeError(
                f"graph.reshape: cannot reshape {src} ({n} elements) to {shape} "
                f"({math.prod(shape)} elements)"
            )
        return TensorType(x.get_element_type(), shape)

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, self.result.type.get_shape())

    @classmethod
    def make(cls, x: SSAValue, shape: Sequence[int], *, loc: str | None = None) -> ReshapeOp:
        x = as_value(x)
        t = cls.infer(x.type, shape)
        return set_loc(cls.create(operands=[x], result_types=[t]), loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        return np.reshape(x, tuple(self.result.type.get_shape()))


@irdl_op_definition
class ExpandOp(GraphOp):
    """Broadcast to the result shape (numpy.broadcast_to / torch.expand)."""

    name = "graph.expand"
    input = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, shape: Sequence[int]) -> TensorType:
        x = check_tensor(x, ExpandOp.name, "input")
        src = list(x.get_shape())
        shape = [int(d) for d in shape]
        if len(shape) < len(src):
            raise ShapeError(f"graph.expand: cannot expand {src} to fewer dims {shape}")
        lead = len(shape) - len(src)
        out = list(shape)
        for i, s in enumerate(src):
            d = shape[lead + i]
            if d == -1:
                out[lead + i] = s
            elif s != d and s != 1:
                raise ShapeError(f"graph.expand: cannot expand {src} to {shape}")
        if any(d < 0 for d in out):
            raise ShapeError(f"graph.expand: invalid target shape {shape} for input {src}")
        return TensorType(x.get_element_type(), out)

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, self.result.type.get_shape())

    @classmethod
    def make(cls, x: SSAValue, shape: Sequence[int], *, loc: str | None = None) -> ExpandOp:
        x = as_value(x)
        t = cls.infer(x.type, shape)
        return set_loc(cls.create(operands=[x], result_types=[t]), loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        return np.ascontiguousarray(np.broadcast_to(x, tuple(self.result.type.get_shape())))


@irdl_op_definition
class CastOp(GraphOp):
    """Element type conversion (round to nearest even); the shape is unchanged."""

    name = "graph.cast"
    input = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, et: Attribute) -> TensorType:
        x = check_tensor(x, CastOp.name, "input")
        return check_tensor(TensorType(et, x.get_shape()), CastOp.name, "result")

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, self.result.type.get_element_type())

    @classmethod
    def make(
        cls, x: SSAValue, element_type: DType | Attribute, *, loc: str | None = None
    ) -> CastOp:
        x = as_value(x)
        try:
            et = _element_type(element_type)
        except ValueError as e:
            raise ShapeError(f"graph.cast: {e}") from None
        t = cls.infer(x.type, et)
        return set_loc(cls.create(operands=[x], result_types=[t]), loc)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, = args
        return np.asarray(x, dtype=np.float32).copy()


# ---------------------------------------------------------------------------
# Dialect and program container
# ---------------------------------------------------------------------------

UNARY_OPS: tuple[type[UnaryElementwiseOp], ...] = (
    ReluOp, ExpOp, TanhOp, SigmoidOp, NegOp, RsqrtOp, SqrtOp, SiluOp,
)
BINARY_OPS: tuple[type[BinaryElementwiseOp], ...] = (AddOp, SubOp, MulOp, DivOp, MaximumOp)
ALL_OPS: tuple[type[GraphOp], ...] = (
    WeightOp, ConstantOp, MatmulOp, *BINARY_OPS, *UNARY_OPS, GeluOp, SoftmaxOp,
    LayerNormOp, RmsNormOp, PermuteOp, ReshapeOp, ExpandOp, CastOp,
    # op families in their own files (graph_rms_norm, graph_nn, graph_index, graph_routing, graph_scatter,
    # graph_rope; fusion regions: graph_fusion)
    *NN_OPS, *INDEX_OPS, *ROUTING_OPS, *SCATTER_OPS, *ROPE_OPS,
)
Graph = Dialect("graph", [*ALL_OPS, *FUSION_OPS], [])



def graph_context():
    """A `Context` with builtin, func and graph loaded (for parsing graph IR)."""
    from xdsl.context import Context
    from xdsl.dialects.builtin import Builtin

    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(func.Func)
    ctx.load_dialect(Graph)
    return ctx


@dataclass
class GraphProgram:
    """A ``graph``-level program: the module plus the weight data."""

    module: ModuleOp
    weights: dict[str, np.ndarray] = field(default_factory=dict[str, np.ndarray])
    input_names: list[str] = field(default_factory=list[str])
    output_names: list[str] = field(default_factory=list[str])
    # user-facing torch dtypes ("int64", "bool", "float32", ...; empty: the element type's)
    input_dtypes: list[str] = field(default_factory=list[str])
    output_dtypes: list[str] = field(default_factory=list[str])

    @property
    def func(self) -> func.FuncOp:
        """The ``@forward`` function."""
        for op in self.module.ops:
            if isinstance(op, func.FuncOp) and op.sym_name.data == "forward":
                return op
        raise ValueError("graph module has no func.func @forward")

    def __str__(self) -> str:
        return str(self.module)
