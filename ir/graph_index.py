"""graph ops for indexing, slicing, joining, comparisons and selection, and the
elementwise ops real transformers add to the base set.

They build on the base classes of `tilecc.ir.graph` and join the `graph` dialect there.

Integer and bool tensors are ``i32`` tensors (`DType.I32`): int64 / int32 values
(token ids, positions) as int32, bools as 0 / 1. Comparisons produce ``i32`` 0 / 1; a
condition (of ``graph.where``) is true where it is non-zero. References compute on
float32 values like every graph op, so integer values are exact up to 2**24.

Syntax::

    %e = graph.gather_rows %wte, %ids : tensor<1000x128xf32>, tensor<1x16xi32> -> tensor<1x16x128xf32>
    %q = graph.slice %qkv dim 2 start 0 end 128 step 1 : tensor<1x16x384xf32> -> tensor<1x16x128xf32>
    %c = graph.concat %a, %b dim 1 : tensor<2x3xf32>, tensor<2x5xf32> -> tensor<2x8xf32>
    %m = graph.lt %x, %y : tensor<4x5xf32>, tensor<5xf32> -> tensor<4x5xi32>
    %w = graph.where %m, %x, %y : tensor<4x5xi32>, tensor<4x5xf32>, tensor<5xf32> -> tensor<4x5xf32>
    %p = graph.pow %x, %e : tensor<4x5xf32>, tensor<f32> -> tensor<4x5xf32>
    %l = graph.log_softmax %x dim 1 : tensor<4x5xf32>
    %a = graph.sdpa %q, %k, %v, %mask scale 0.125 causal false
        : tensor<1x4x16x32xf32>, tensor<1x4x16x32xf32>, tensor<1x4x16x32xf32>, tensor<16x16xf32>
        -> tensor<1x4x16x32xf32>
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    I64,
    BoolAttr,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    TensorType,
    f64,
    i1,
    i32,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    VarConstraint,
    base,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    var_operand_def,
)

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
from tilecc.ir.graph_elementwise import BinaryElementwiseOp, UnaryElementwiseOp, erf64
from tilecc.simulator.isa import DType


def _int(v: int) -> IntegerAttr:
    return IntegerAttr(int(v), i64)


def _norm_dim(op: str, dim: int, rank: int) -> int:
    if not -rank <= dim < rank:
        raise ShapeError(f"{op}: dim {dim} out of range for rank {rank}")
    return dim % rank


# ---------------------------------------------------------------------------
# Indirect indexing: rows of a table by an index tensor
# ---------------------------------------------------------------------------


@irdl_op_definition
class GatherRowsOp(GraphOp):
    """``table[indices]`` along dim 0 (embedding, ``x[idx]``): the result has shape
    ``indices.shape + table.shape[1:]``; indices are i32 in ``[0, table.shape[0])``."""

    name = "graph.gather_rows"
    table = operand_def(TensorType)
    indices = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$table `,` $indices attr-dict `:` type($table) `,` type($indices) `->` type($result)"
    )

    @staticmethod
    def infer(table: Attribute, indices: Attribute) -> TensorType:
        op = GatherRowsOp.name
        table = check_tensor(table, op, "table")
        indices = check_tensor(indices, op, "indices")
        if table.get_num_dims() < 1:
            raise ShapeError(f"{op}: the table must have rank >= 1, got {fmt_type(table)}")
        if element_dtype(indices) != DType.I32:
            raise ShapeError(f"{op}: indices must be i32, got {fmt_type(indices)}")
        shape = (*indices.get_shape(), *table.get_shape()[1:])
        return TensorType(table.get_element_type(), shape)

    def infer_result_type(self) -> TensorType:
        return self.infer(self.table.type, self.indices.type)

    @classmethod
    def make(cls, table: SSAValue, indices: SSAValue, *, loc: str | None = None) -> GatherRowsOp:
        table, indices = as_value(table), as_value(indices)
        t = cls.infer(table.type, indices.type)
        op = cls.create(operands=[table, indices], result_types=[t])
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        table, indices = args
        idx = np.asarray(indices).astype(np.int64)
        n = table.shape[0]
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise IndexError(
                f"graph.gather_rows: index {int(idx[bad].reshape(-1)[0])} out of range for "
                f"a table of {n} rows"
            )
        return np.ascontiguousarray(table[idx])


# ---------------------------------------------------------------------------
# Slicing and joining
# ---------------------------------------------------------------------------


def slice_length(size: int, start: int, end: int, step: int) -> int:
    return max(0, -(-(end - start) // step))


@irdl_op_definition
class SliceOp(GraphOp):
    """``x[..., start:end:step, ...]`` along `dim` (normalised: 0 <= start <= end <= size,
    step >= 1)."""

    name = "graph.slice"
    input = operand_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    start = prop_def(IntegerAttr[I64])
    end = prop_def(IntegerAttr[I64])
    step = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `dim` $dim `start` $start `end` $end `step` $step attr-dict "
        "`:` type($input) `->` type($result)"
    )

    @staticmethod
    def infer(x: Attribute, dim: int, start: int, end: int, step: int) -> TensorType:
        op = SliceOp.name
        x = check_tensor(x, op, "input")
        shape = list(x.get_shape())
        if not 0 <= dim < len(shape):
            raise ShapeError(f"{op}: dim {dim} out of range for {fmt_type(x)}")
        if step < 1:
            raise ShapeError(f"{op}: step must be >= 1, got {step}")
        if not 0 <= start <= end <= shape[dim]:
            raise ShapeError(
                f"{op}: bounds [{start}, {end}) must satisfy 0 <= start <= end <= {shape[dim]} "
                f"(dim {dim} of {fmt_type(x)})"
            )
        shape[dim] = slice_length(shape[dim], start, end, step)
        return TensorType(x.get_element_type(), shape)

    def slice_params(self) -> tuple[int, int, int, int]:
        return (self.dim.value.data, self.start.value.data, self.end.value.data, self.step.value.data)

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, *self.slice_params())

    @classmethod
    def make(
        cls,
        x: SSAValue,
        dim: int,
        start: int | None = None,
        end: int | None = None,
        step: int = 1,
        *,
        loc: str | None = None,
    ) -> SliceOp:
        """Python slice semantics: negative bounds count from the end, out-of-range clamp."""
        x = as_value(x)
        t = check_tensor(x.type, cls.name, "input")
        rank = t.get_num_dims()
        dim = _norm_dim(cls.name, int(dim), rank)
        if step < 1:
            raise ShapeError(f"{cls.name}: step must be >= 1, got {step}")
        size = t.get_shape()[dim]
        start, end, _ = slice(start, end, step).indices(size)
        end = max(start, end)
        res = cls.infer(t, dim, start, end, int(step))
        props = {"dim": _int(dim), "start": _int(start), "end": _int(end), "step": _int(step)}
        op = cls.create(operands=[x], result_types=[res], properties=props)
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        dim, start, end, step = self.slice_params()
        index = [slice(None)] * x.ndim
        index[dim] = slice(start, end, step)
        return np.ascontiguousarray(x[tuple(index)])


@irdl_op_definition
class ConcatOp(GraphOp):
    """``torch.cat(inputs, dim)``: equal element types and equal sizes but in `dim`."""

    name = "graph.concat"
    inputs = var_operand_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = "$inputs `dim` $dim attr-dict `:` type($inputs) `->` type($result)"

    @staticmethod
    def infer(types: Sequence[Attribute], dim: int) -> TensorType:
        op = ConcatOp.name
        if not types:
            raise ShapeError(f"{op}: needs at least one input")
        tensors = [check_tensor(t, op, f"input #{i}") for i, t in enumerate(types)]
        same_element(op, *tensors)
        first = list(tensors[0].get_shape())
        if not 0 <= dim < len(first):
            raise ShapeError(f"{op}: dim {dim} out of range for {fmt_type(tensors[0])}")
        total = 0
        for t in tensors:
            s = list(t.get_shape())
            if len(s) != len(first) or any(a != b for j, (a, b) in enumerate(zip(s, first)) if j != dim):
                raise ShapeError(
                    f"{op}: shapes {', '.join(fmt_type(t) for t in types)} differ outside dim {dim}"
                )
            total += s[dim]
        first[dim] = total
        return TensorType(tensors[0].get_element_type(), first)

    def infer_result_type(self) -> TensorType:
        return self.infer([v.type for v in self.inputs], self.dim.value.data)

    @classmethod
    def make(cls, inputs: Sequence[SSAValue], dim: int, *, loc: str | None = None) -> ConcatOp:
        vals = [as_value(v) for v in inputs]
        if not vals:
            raise ShapeError(f"{cls.name}: needs at least one input")
        rank = check_tensor(vals[0].type, cls.name, "input #0").get_num_dims()
        dim = _norm_dim(cls.name, int(dim), rank)
        t = cls.infer([v.type for v in vals], dim)
        op = cls.create(operands=vals, result_types=[t], properties={"dim": _int(dim)})
        set_loc(op, loc)
        return op

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        return np.concatenate(xs, axis=self.dim.value.data)


# ---------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------


@irdl_op_definition
class AbsOp(UnaryElementwiseOp):
    name = "graph.abs"

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.abs(x)


@irdl_op_definition
class LogOp(UnaryElementwiseOp):
    name = "graph.log"

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return np.log(x)


@irdl_op_definition
class ErfOp(UnaryElementwiseOp):
    name = "graph.erf"

    @staticmethod
    def compute(x: np.ndarray) -> np.ndarray:
        return erf64(x.astype(np.float64)).astype(np.float32)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.power(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


@irdl_op_definition
class PowOp(BinaryElementwiseOp):
    name = "graph.pow"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _pow(a, b)


@irdl_op_definition
class MinimumOp(BinaryElementwiseOp):
    name = "graph.minimum"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.minimum(a, b)  # NaN-propagating, like torch.minimum


class CompareOp(BinaryElementwiseOp):
    """``lhs op rhs`` with broadcasting; equal operand element types; an i32 0 / 1 result."""

    @classmethod
    def infer(cls, lhs: Attribute, rhs: Attribute) -> TensorType:
        et = super().infer(lhs, rhs)  # checks operands, element types and broadcasting
        return TensorType(i32, et.get_shape())

    def reference(self, *args: np.ndarray) -> np.ndarray:
        a, b = args
        with np.errstate(all="ignore"):
            return type(self).compute(np.asarray(a, np.float32), np.asarray(b, np.float32)).astype(np.float32)


@irdl_op_definition
class EqOp(CompareOp):
    name = "graph.eq"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.equal(a, b)


@irdl_op_definition
class NeOp(CompareOp):
    name = "graph.ne"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.not_equal(a, b)


@irdl_op_definition
class LtOp(CompareOp):
    name = "graph.lt"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.less(a, b)


@irdl_op_definition
class LeOp(CompareOp):
    name = "graph.le"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.less_equal(a, b)


@irdl_op_definition
class GtOp(CompareOp):
    name = "graph.gt"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.greater(a, b)


@irdl_op_definition
class GeOp(CompareOp):
    name = "graph.ge"

    @staticmethod
    def compute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.greater_equal(a, b)


@irdl_op_definition
class WhereOp(GraphOp):
    """``cond ? x : y`` elementwise with broadcasting of all three; `cond` of any element
    type is true where non-zero; `x` and `y` share the result element type."""

    name = "graph.where"
    cond = operand_def(TensorType)
    x = operand_def(TensorType)
    y = operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = (
        "$cond `,` $x `,` $y attr-dict `:` type($cond) `,` type($x) `,` type($y) `->` type($result)"
    )

    @staticmethod
    def infer(c: Attribute, x: Attribute, y: Attribute) -> TensorType:
        op = WhereOp.name
        c = check_tensor(c, op, "cond")
        x = check_tensor(x, op, "x")
        y = check_tensor(y, op, "y")
        et = same_element(op, x, y)
        return TensorType(et, broadcast_shapes(op, c.get_shape(), x.get_shape(), y.get_shape()))

    def infer_result_type(self) -> TensorType:
        return self.infer(self.cond.type, self.x.type, self.y.type)

    @classmethod
    def make(cls, c: SSAValue, x: SSAValue, y: SSAValue, *, loc: str | None = None) -> WhereOp:
        c, x, y = as_value(c), as_value(x), as_value(y)
        t = cls.infer(c.type, x.type, y.type)
        op = cls.create(operands=[c, x, y], result_types=[t])
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        c, x, y = args
        return np.where(np.asarray(c) != 0, x, y).astype(np.float32)


# ---------------------------------------------------------------------------
# Row-wise: log_softmax; attention
# ---------------------------------------------------------------------------


@irdl_op_definition
class LogSoftmaxOp(GraphOp):
    """``x - max - log(sum(exp(x - max)))`` along `dim` (non-negative)."""

    name = "graph.log_softmax"
    T: ClassVar = VarConstraint("T", base(TensorType))
    input = operand_def(T)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(T)

    assembly_format = "$input `dim` $dim attr-dict `:` type($result)"

    def infer_result_type(self) -> TensorType:
        t = check_tensor(self.input.type, self.name, "input")
        d = self.dim.value.data
        if not 0 <= d < t.get_num_dims():
            raise ShapeError(f"{self.name}: dim {d} out of range for {fmt_type(t)}")
        return t

    @classmethod
    def make(cls, x: SSAValue, dim: int, *, loc: str | None = None) -> LogSoftmaxOp:
        x = as_value(x)
        t = check_tensor(x.type, cls.name, "input")
        rank = t.get_num_dims()
        if rank == 0:
            raise ShapeError(f"{cls.name}: the input must have rank >= 1")
        dim = _norm_dim(cls.name, int(dim), rank)
        op = cls.create(operands=[x], result_types=[t], properties={"dim": _int(dim)})
        set_loc(op, loc)
        return op

    @property
    def axis(self) -> int:
        return self.dim.value.data

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x = np.asarray(args[0], dtype=np.float64)
        m = np.max(x, axis=self.axis, keepdims=True)
        with np.errstate(all="ignore"):
            s = x - m
            return (s - np.log(np.sum(np.exp(s), axis=self.axis, keepdims=True))).astype(np.float32)


@irdl_op_definition
class SdpaOp(GraphOp):
    """Scaled dot-product attention ``softmax(q @ k^T * scale + mask) @ v``.

    q ``[..., L, E]``, k ``[..., S, E]``, v ``[..., S, Ev]`` (batch dims broadcast), an
    optional additive float `mask` broadcasting to ``[..., L, S]``, ``causal`` masks the
    keys above the diagonal (``torch.ones(L, S).tril()``; the lowering adds the dtype's
    most negative finite value there). Result ``[..., L, Ev]``.
    """

    name = "graph.sdpa"
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    mask = opt_operand_def(TensorType)
    scale = prop_def(FloatAttr[Float64Type])
    causal = prop_def(BoolAttr)
    result = result_def(TensorType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$q `,` $k `,` $v (`,` $mask^)? `scale` $scale `causal` $causal attr-dict `:` "
        "type($q) `,` type($k) `,` type($v) (`,` type($mask)^)? `->` type($result)"
    )

    @staticmethod
    def infer(
        q: Attribute, k: Attribute, v: Attribute, mask: Attribute | None
    ) -> TensorType:
        op = SdpaOp.name
        checked: list[TensorType] = []
        for what, a in (("q", q), ("k", k), ("v", v)):
            t = check_tensor(a, op, what)
            if t.get_num_dims() < 2:
                raise ShapeError(f"{op}: {what} must have rank >= 2, got {fmt_type(t)}")
            checked.append(t)
        q, k, v = checked
        et = same_element(op, q, k, v)
        qs, ks, vs = (list(t.get_shape()) for t in (q, k, v))
        if qs[-1] != ks[-1]:
            raise ShapeError(f"{op}: q and k head sizes differ: {fmt_type(q)}, {fmt_type(k)}")
        if ks[-2] != vs[-2]:
            raise ShapeError(f"{op}: k and v sequence lengths differ: {fmt_type(k)}, {fmt_type(v)}")
        batch = broadcast_shapes(op, qs[:-2], ks[:-2], vs[:-2])
        L, S = qs[-2], ks[-2]
        if mask is not None:
            mask = check_tensor(mask, op, "mask")
            same_element(op, q, mask)
            full = broadcast_shapes(op, (*batch, L, S), mask.get_shape())
            if list(full) != [*batch, L, S]:
                raise ShapeError(
                    f"{op}: mask {fmt_type(mask)} does not broadcast to the scores {[*batch, L, S]}"
                )
        return TensorType(et, [*batch, L, vs[-1]])

    def infer_result_type(self) -> TensorType:
        m = self.mask.type if self.mask is not None else None
        return self.infer(self.q.type, self.k.type, self.v.type, m)

    @classmethod
    def make(
        cls,
        q: SSAValue,
        k: SSAValue,
        v: SSAValue,
        mask: SSAValue | None = None,
        *,
        scale: float | None = None,
        causal: bool = False,
        loc: str | None = None,
    ) -> SdpaOp:
        q, k, v = as_value(q), as_value(k), as_value(v)
        m = as_value(mask) if mask is not None else None
        t = cls.infer(q.type, k.type, v.type, m.type if m is not None else None)
        if scale is None:
            scale = 1.0 / math.sqrt(check_tensor(q.type, cls.name, "q").get_shape()[-1])
        op = cls.build(
            operands=[q, k, v, [m] if m is not None else []],
            result_types=[t],
            properties={"scale": FloatAttr(float(scale), f64), "causal": IntegerAttr(int(bool(causal)), i1)},
        )
        set_loc(op, loc)
        return op

    @property
    def is_causal(self) -> bool:
        return bool(self.causal.value.data)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        q, k, v, *mask = args  # the mask when the op has one
        q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
        s = np.matmul(q64, np.swapaxes(k64, -1, -2)) * self.scale.value.data
        if mask:
            s = s + np.asarray(mask[0], np.float64)
        if self.is_causal:
            L, S = s.shape[-2:]
            s = np.where(np.tril(np.ones((L, S), dtype=bool)), s, -np.inf)
        with np.errstate(all="ignore"):
            m = np.max(s, axis=-1, keepdims=True)
            e = np.exp(s - m)
            p = e / np.sum(e, axis=-1, keepdims=True)
        return np.matmul(p, v64).astype(np.float32)


COMPARE_OPS: tuple[type[CompareOp], ...] = (EqOp, NeOp, LtOp, LeOp, GtOp, GeOp)

INDEX_OPS: tuple[type[GraphOp], ...] = (
    GatherRowsOp, SliceOp, ConcatOp, AbsOp, LogOp, ErfOp, PowOp, MinimumOp, *COMPARE_OPS,
    WhereOp, LogSoftmaxOp, SdpaOp,
)
