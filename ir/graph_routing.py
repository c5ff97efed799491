"""graph ops for routing: the selection and counting ops mixture-of-experts layers use.

`graph.topk_indices` is the one selection op: the indices of the `k` largest (or
smallest) elements along `dim`, in order, ties broken by the lowest index (torch's
``topk(sorted=True)`` / ``sort(stable=True)`` / ``argmax`` / ``argmin`` rule). The
importer builds ``topk``, ``sort``, ``argsort``, ``argmax`` / ``argmin`` and
``max.dim`` / ``min.dim`` from it; their values are a gather of the input by these
indices (exact: no arithmetic touches them).

`graph.cumsum` is the running sum along a dim (the group offsets of grouped experts,
positions from attention masks).

`graph.bincount` counts (or sums weights of) the i32 values of its input that fall in
``[0, length)``; values outside are ignored. ``bincount`` with a static length and
``histc`` (after the importer computes each element's bin with torch's own formula)
build on it.

Syntax::

    %i = graph.topk_indices %x dim 1 k 2 largest true : tensor<16x8xf32> -> tensor<16x2xi32>
    %c = graph.bincount %bins length 8 : tensor<32xi32> -> tensor<8xi32>
    %h = graph.bincount %bins, %w length 8 : tensor<32xi32>, tensor<32xf32> -> tensor<8xf32>
    %s = graph.cumsum %h dim 0 : tensor<8xf32> -> tensor<8xf32>
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import I64, BoolAttr, IntegerAttr, TensorType, i32, i64
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, opt_operand_def, prop_def, result_def

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import GraphOp, as_value, check_tensor, element_dtype, fmt_type, set_loc
from tilecc.simulator.isa import DType


def _int(v: int) -> IntegerAttr:
    return IntegerAttr(int(v), i64)


def stable_order(x: np.ndarray, axis: int, largest: bool) -> np.ndarray:
    """The positions of `x` along `axis` from the largest (or smallest) value, equal
    values in index order (NaN is not ordered: the lowering does not rank it)."""
    key = -np.asarray(x, np.float64) if largest else np.asarray(x, np.float64)
    return np.argsort(key, axis=axis, kind="stable")


@irdl_op_definition
class TopkIndicesOp(GraphOp):
    """The i32 indices of the `k` largest (`largest`) or smallest elements along `dim`,
    largest (smallest) first, ties by the lowest index; the result is the input's shape
    with `k` in `dim`."""

    name = "graph.topk_indices"
    input = operand_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    k = prop_def(IntegerAttr[I64])
    largest = prop_def(BoolAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$input `dim` $dim `k` $k `largest` $largest attr-dict `:` type($input) `->` type($result)"
    )

    @staticmethod
    def infer(x: Attribute, dim: int, k: int) -> TensorType:
        op = TopkIndicesOp.name
        x = check_tensor(x, op, "input")
        shape = list(x.get_shape())
        if not 0 <= dim < len(shape):
            raise ShapeError(f"{op}: dim {dim} out of range for {fmt_type(x)}")
        if not 1 <= k <= shape[dim]:
            raise ShapeError(f"{op}: k = {k} must be in [1, {shape[dim]}] (dim {dim} of {fmt_type(x)})")
        shape[dim] = k
        return TensorType(i32, shape)

    @property
    def params(self) -> tuple[int, int, bool]:
        """(dim, k, largest)."""
        return self.dim.value.data, self.k.value.data, bool(self.largest.value.data)

    def infer_result_type(self) -> TensorType:
        dim, k, _ = self.params
        return self.infer(self.input.type, dim, k)

    @classmethod
    def make(cls, x: SSAValue, dim: int, k: int, largest: bool = True, *, loc: str | None = None) -> TopkIndicesOp:
        x = as_value(x)
        rank = check_tensor(x.type, cls.name, "input").get_num_dims()
        if not -rank <= dim < rank:
            raise ShapeError(f"{cls.name}: dim {dim} out of range for rank {rank}")
        dim %= rank
        t = cls.infer(x.type, dim, int(k))
        props = {"dim": _int(dim), "k": _int(k), "largest": BoolAttr.from_bool(bool(largest))}
        op = cls.create(operands=[x], result_types=[t], properties=props)
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        dim, k, largest = self.params
        order = stable_order(x, dim, largest)
        return np.take(order, np.arange(k), axis=dim).astype(np.float32)


@irdl_op_definition
class BincountOp(GraphOp):
    """``out[v] = sum of weights[i] (1 without weights) over i with input[i] == v`` for
    ``v in [0, length)``: a count of the i32 values of `input` (any shape, flattened);
    values outside ``[0, length)`` are ignored. The result element type is the op's
    (i32 counts, or the weights' float type)."""

    name = "graph.bincount"
    input = operand_def(TensorType)
    weights = opt_operand_def(TensorType)
    length = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input (`,` $weights^)? `length` $length attr-dict `:` type($input) (`,` type($weights)^)? "
        "`->` type($result)"
    )

    @staticmethod
    def check(x: Attribute, w: Attribute | None, length: int) -> None:
        op = BincountOp.name
        x = check_tensor(x, op, "input")
        if element_dtype(x) != DType.I32:
            raise ShapeError(f"{op}: the input must be i32, got {fmt_type(x)}")
        if length < 1:
            raise ShapeError(f"{op}: length must be >= 1, got {length}")
        if w is None:
            return
        wt = check_tensor(w, op, "weights")
        if tuple(wt.get_shape()) != tuple(x.get_shape()):
            raise ShapeError(f"{op}: weights {fmt_type(wt)} and input {fmt_type(x)} differ in shape")

    def infer_result_type(self) -> TensorType:
        w = self.weights.type if self.weights is not None else None
        self.check(self.input.type, w, self.length.value.data)
        return TensorType(self.result.type.get_element_type(), [self.length.value.data])  # type: ignore[union-attr]

    @classmethod
    def make(
        cls, x: SSAValue, length: int, weights: SSAValue | None = None, *, result_type: Attribute | None = None,
        loc: str | None = None,
    ) -> BincountOp:
        x = as_value(x)
        w = as_value(weights) if weights is not None else None
        cls.check(x.type, w.type if w is not None else None, int(length))
        if result_type is None:
            result_type = check_tensor(w.type, cls.name, "weights").get_element_type() if w is not None else i32
        t = TensorType(result_type, [int(length)])
        op = cls.build(operands=[x, [w] if w is not None else []], result_types=[t],
                       properties={"length": _int(length)})
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x = np.asarray(args[0]).reshape(-1).astype(np.int64)
        w = np.asarray(args[1], np.float64).reshape(-1) if len(args) > 1 else np.ones(x.shape, np.float64)
        n = self.length.value.data
        keep = (x >= 0) & (x < n)
        return np.bincount(x[keep], weights=w[keep], minlength=n)[:n].astype(np.float32)


@irdl_op_definition
class CumsumOp(GraphOp):
    """The running sum along `dim` (non-negative) of a float tensor (the importer casts
    integers to f32: exact below 2**24); fp32 accumulation, each output rounded to the
    element type."""

    name = "graph.cumsum"
    input = operand_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = "$input `dim` $dim attr-dict `:` type($input) `->` type($result)"

    def infer_result_type(self) -> TensorType:
        t = check_tensor(self.input.type, self.name, "input")
        if not 0 <= self.dim.value.data < t.get_num_dims():
            raise ShapeError(f"{self.name}: dim {self.dim.value.data} out of range for {fmt_type(t)}")
        if element_dtype(t) == DType.I32:
            raise ShapeError(f"{self.name}: the input must be a float tensor, got {fmt_type(t)}")
        return t

    @classmethod
    def make(cls, x: SSAValue, dim: int, *, loc: str | None = None) -> CumsumOp:
        x = as_value(x)
        t = check_tensor(x.type, cls.name, "input")
        rank = t.get_num_dims()
        if not -rank <= dim < rank:
            raise ShapeError(f"{cls.name}: dim {dim} out of range for rank {rank}")
        op = cls.create(operands=[x], result_types=[t], properties={"dim": _int(dim % rank)})
        op.infer_result_type()
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        return np.cumsum(np.asarray(args[0], np.float64), axis=self.dim.value.data).astype(np.float32)


ROUTING_OPS: tuple[type[GraphOp], ...] = (TopkIndicesOp, BincountOp, CumsumOp)
