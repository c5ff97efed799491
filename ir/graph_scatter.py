"""graph ops that write into a copy of a tensor: the scatter family, and strided views.

``graph.index_scatter`` is the one op every ATen scatter imports to (``index_put``,
``index_copy``, ``index_add``, ``slice_scatter``, ``select_scatter``, ``scatter``,
``scatter_add``, ``scatter_reduce``, see `frontend/aten_scatter.py`): the result is
`dest` with the slices ``src[..., n, ...]`` (along `dim`) written to, or combined
with, the slices ``dest[..., index[n], ...]``, for n in order. `reduce` is ``none``
(assignment: of duplicate indices the last wins, as torch's CPU kernels do), ``sum``,
``prod``, ``amax`` or ``amin`` (duplicates all combine, in index order). Indices are
i32 in ``[0, dest.shape[dim])`` (the importer normalises negative ones).

``graph.as_strided`` is ``torch.as_strided`` on the row-major elements of its input:
element ``i`` of the result is input element ``offset + sum(i_d * stride_d)``.

Syntax::

    %y = graph.index_scatter %cache, %pos, %k dim 2 reduce "none"
        : tensor<1x2x8x4xf32>, tensor<1xi32>, tensor<1x2x1x4xf32> -> tensor<1x2x8x4xf32>
    %w = graph.as_strided %x size array<i64: 3, 3> stride array<i64: 1, 1> offset 0
        : tensor<5xf32> -> tensor<3x3xf32>
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import I64, DenseArrayBase, IntegerAttr, StringAttr, TensorType, i64
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import GraphOp, as_value, check_tensor, element_dtype, fmt_type, set_loc
from tilecc.simulator.isa import DType

REDUCTIONS = ("none", "sum", "prod", "amax", "amin")
_UFUNC = {"sum": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}


@irdl_op_definition
class IndexScatterOp(GraphOp):
    """`dest` with slices of `src` along `dim` written to (or combined with) the slices
    ``index[n]``: ``src.shape == dest.shape`` except ``src.shape[dim] == len(index)``."""

    name = "graph.index_scatter"
    dest = operand_def(TensorType)
    index = operand_def(TensorType)
    src = operand_def(TensorType)
    dim = prop_def(IntegerAttr[I64])
    reduce = prop_def(StringAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$dest `,` $index `,` $src `dim` $dim `reduce` $reduce attr-dict `:` type($dest) `,` "
        "type($index) `,` type($src) `->` type($result)"
    )

    @staticmethod
    def infer(dest: Attribute, index: Attribute, src: Attribute, dim: int, reduce: str) -> TensorType:
        op = IndexScatterOp.name
        dest = check_tensor(dest, op, "dest")
        index = check_tensor(index, op, "index")
        src = check_tensor(src, op, "src")
        shape = list(dest.get_shape())
        if not 0 <= dim < len(shape):
            raise ShapeError(f"{op}: dim {dim} out of range for {fmt_type(dest)}")
        if reduce not in REDUCTIONS:
            raise ShapeError(f"{op}: reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
        if element_dtype(index) != DType.I32 or index.get_num_dims() != 1:
            raise ShapeError(f"{op}: the index must be a 1-D i32 tensor, got {fmt_type(index)}")
        want = list(shape)
        want[dim] = index.get_shape()[0]
        if list(src.get_shape()) != want or src.get_element_type() != dest.get_element_type():
            raise ShapeError(
                f"{op}: src {fmt_type(src)} must be {fmt_type(TensorType(dest.get_element_type(), want))} "
                f"(dest {fmt_type(dest)} with dim {dim} the index length)"
            )
        return dest

    def params(self) -> tuple[int, str]:
        return self.dim.value.data, self.reduce.data

    def infer_result_type(self) -> TensorType:
        return self.infer(self.dest.type, self.index.type, self.src.type, *self.params())

    @classmethod
    def make(
        cls, dest: SSAValue, index: SSAValue, src: SSAValue, dim: int, reduce: str = "none",
        *, loc: str | None = None,
    ) -> IndexScatterOp:
        dest, index, src = as_value(dest), as_value(index), as_value(src)
        t = cls.infer(dest.type, index.type, src.type, dim, reduce)
        op = cls.create(
            operands=[dest, index, src], result_types=[t],
            properties={"dim": IntegerAttr(dim, i64), "reduce": StringAttr(reduce)},
        )
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        dest, index, src = args
        dim, reduce = self.params()
        out = np.array(dest, copy=True)
        idx = np.asarray(index).astype(np.int64).reshape(-1)
        size = out.shape[dim]
        bad = (idx < 0) | (idx >= size)
        if bad.any():
            raise IndexError(
                f"{self.name}: index {int(idx[bad][0])} out of range for dim {dim} of size {size}"
            )
        o = np.moveaxis(out, dim, 0)  # a view: writes land in `out`
        s = np.moveaxis(np.asarray(src, dtype=out.dtype), dim, 0)
        if reduce == "none":
            for n, i in enumerate(idx.tolist()):  # in order: the last of duplicates wins
                o[i] = s[n]
        else:
            _UFUNC[reduce].at(o, idx, s)
        return out


@irdl_op_definition
class AsStridedOp(GraphOp):
    """``torch.as_strided(x, size, stride, offset)`` over the row-major elements of x."""

    name = "graph.as_strided"
    input = operand_def(TensorType)
    size = prop_def(DenseArrayBase.constr(I64))
    stride = prop_def(DenseArrayBase.constr(I64))
    offset = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `size` $size `stride` $stride `offset` $offset attr-dict `:` type($input) "
        "`->` type($result)"
    )

    @staticmethod
    def infer(x: Attribute, size: Sequence[int], stride: Sequence[int], offset: int) -> TensorType:
        op = AsStridedOp.name
        x = check_tensor(x, op, "input")
        if len(size) != len(stride):
            raise ShapeError(f"{op}: size {list(size)} and stride {list(stride)} differ in rank")
        if any(n < 0 for n in size) or any(s < 0 for s in stride) or offset < 0:
            raise ShapeError(
                f"{op}: sizes, strides and the offset must be >= 0, got size {list(size)}, "
                f"stride {list(stride)}, offset {offset}"
            )
        numel = int(np.prod(x.get_shape(), dtype=np.int64))
        if 0 not in size:
            last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
            if last >= numel:
                raise ShapeError(
                    f"{op}: size {list(size)}, stride {list(stride)}, offset {offset} reach "
                    f"element {last}, outside the {numel} elements of {fmt_type(x)}"
                )
        return TensorType(x.get_element_type(), list(size))

    def params(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        return (
            tuple(self.size.get_values()), tuple(self.stride.get_values()), self.offset.value.data,
        )

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, *self.params())

    @classmethod
    def make(
        cls, x: SSAValue, size: Sequence[int], stride: Sequence[int], offset: int = 0,
        *, loc: str | None = None,
    ) -> AsStridedOp:
        x = as_value(x)
        size, stride = [int(n) for n in size], [int(s) for s in stride]
        t = cls.infer(x.type, size, stride, int(offset))
        op = cls.create(
            operands=[x], result_types=[t],
            properties={
                "size": DenseArrayBase.from_list(i64, size),
                "stride": DenseArrayBase.from_list(i64, stride),
                "offset": IntegerAttr(int(offset), i64),
            },
        )
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        size, stride, offset = self.params()
        flat = np.ascontiguousarray(args[0]).reshape(-1)
        view = np.lib.stride_tricks.as_strided(
            flat[offset:], shape=size, strides=[s * flat.itemsize for s in stride]
        )
        return np.ascontiguousarray(view)


SCATTER_OPS: tuple[type[GraphOp], ...] = (IndexScatterOp, AsStridedOp)
