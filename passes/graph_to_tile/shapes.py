"""Shapes, element types and strided views of the graph-to-tile conversion.

Small pure functions over xDSL types that every op family of `lower-graph-to-tile`
uses: the shape and element type of a tensor or memref, broadcast index maps
(`IndexMap`: output dim -> operand dim, None where the operand broadcasts), merging the
dims every operand walks alike (`collapse`), torch's view-stride rule
(`reshape_strides`), and dense constants as attributes.

    collapse((2, 3, 4), [Operand(x, [0, 1, 2])], view, layout)   # x dense
        -> ((1, 24), [Operand(x viewed [1, 24], [None, 1])])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeGuard, cast

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    IntegerType,
    MemRefType,
    TensorType,
    i8,
    i32,
)
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.ir.dense_elements import dense_floats
from tilecc.ir.dtypes import element_size

__all__ = [
    "IndexMap", "Operand", "collapse", "dense_attr", "dense_values", "elem_of", "element_size", "is_memref",
    "is_shaped", "MatmulDims", "matmul_dims", "merges", "padded_strides", "reshape_strides", "shape_of",
]

IndexMap = list[int | None]  # output dim -> operand dim (None: broadcast)
# (result, output shape, a, b, M, K, N) of a graph.matmul
MatmulDims = tuple[SSAValue, tuple[int, ...], SSAValue, SSAValue, int, int, int]


def is_shaped(t: Attribute) -> TypeGuard[TensorType[Attribute] | MemRefType[Attribute]]:
    """Whether `t` is a tensor or memref type (whose element type, as every xDSL
    parameter, is an Attribute)."""
    return isinstance(t, (TensorType, MemRefType))


def is_memref(t: Attribute) -> TypeGuard[MemRefType[Attribute]]:
    """Whether `t` is a memref type (an HBM tensor of the tile IR)."""
    return isinstance(t, MemRefType)


def shape_of(t: Attribute) -> tuple[int, ...]:
    """The static shape of a tensor or memref type."""
    if not is_shaped(t):
        raise CompileError(f"lower-graph-to-tile: expected a tensor or memref type, got {t}")
    return tuple(t.get_shape())


def elem_of(t: Attribute) -> Attribute:
    """The element type of a tensor or memref type."""
    if not is_shaped(t):
        raise CompileError(f"lower-graph-to-tile: expected a tensor or memref type, got {t}")
    return t.element_type


@dataclass
class Operand:
    value: SSAValue  # HBM memref in @main
    imap: IndexMap
def collapse(
    out_shape: Sequence[int], operands: list[Operand], view: Callable[[SSAValue, Sequence[int]], SSAValue],
    layout: Callable[[SSAValue], tuple[tuple[int, ...], int]], keep_last: bool = False,
) -> tuple[tuple[int, ...], list[Operand]]:
    """Merge adjacent output dims that every operand maps to adjacent dims of its own (in
    order, with strides that merge: a strided view's dims merge only where one walks the
    other's extent) or broadcasts; the operands become views of the merged shape.
    `keep_last` keeps the last dim on its own."""
    rank = len(out_shape)
    for o in operands:  # aligned operands (imap d or None) or permutations only
        if len(shape_of(o.value.type)) != rank or not (
            all(m is None or m == d for d, m in enumerate(o.imap))
            or (None not in o.imap and sorted(m for m in o.imap if m is not None) == list(range(rank)))
        ):
            return tuple(out_shape), operands
    groups = [[0]]
    for d in range(1, rank):
        p = groups[-1][-1]
        if keep_last and d == rank - 1:
            groups.append([d])
        elif all(_dims_merge(o, p, d, layout) for o in operands):
            groups[-1].append(d)
        else:
            groups.append([d])
    if len(groups) == rank:
        return tuple(out_shape), operands
    lead: list[list[int]] = [[]] if len(groups) < 2 else []  # keep rank 2: a leading unit dim
    shape = tuple([1] * len(lead) + [int(np.prod([out_shape[d] for d in g])) for g in groups])
    new_ops: list[Operand] = []
    for o in operands:
        oshape = shape_of(o.value.type)
        # operand dims of each output group (a broadcast group: the operand's own unit dims)
        odims = [[d if (m := o.imap[d]) is None else m for d in g] for g in groups]
        order = sorted(range(len(groups)), key=lambda i: odims[i][0])
        vshape = [1] * len(lead) + [int(np.prod([oshape[d] for d in odims[i]])) for i in order]
        imap: IndexMap = [None] * len(lead)
        imap.extend(None if o.imap[g[0]] is None else len(lead) + order.index(i) for i, g in enumerate(groups))
        new_ops.append(Operand(view(o.value, vshape), imap))
    return shape, new_ops


def _dims_merge(o: Operand, p: int, d: int, layout: Callable[[SSAValue], tuple[tuple[int, ...], int]]) -> bool:
    """Whether output dims p and d = p + 1 stay one dim for operand `o`: both broadcast,
    or adjacent dims of `o` that merge in memory."""
    mp, md = o.imap[p], o.imap[d]
    if mp is None:
        return md is None
    return md == mp + 1 and merges(o, mp, layout)


def reshape_strides(
    old_shape: Sequence[int], old_strides: Sequence[int], new_shape: Sequence[int]
) -> list[int] | None:
    """Strides that view a tensor of `old_shape`/`old_strides` as `new_shape` without
    moving data, or None when no such strides exist (torch's `computeStride`)."""
    if int(np.prod(old_shape, dtype=np.int64)) == 0 or not len(old_shape):
        return list(tile.row_major(new_shape))
    new = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * chunk):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new[view_d] = view_numel * chunk
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk = old_strides[d - 1]
                tensor_numel = view_numel = 1
    return new if view_d == -1 else None


def padded_strides(strides: Sequence[int], rank: int) -> list[int]:
    """Strides for leading unit dimensions added to reach `rank`."""
    return [0] * (rank - len(strides)) + list(strides)


def merges(o: Operand, d: int, layout: Callable[[SSAValue], tuple[tuple[int, ...], int]]) -> bool:
    """Whether operand dims d and d+1 of `o` form one dimension in memory."""
    strides, _ = layout(o.value)
    shape = shape_of(o.value.type)
    return shape[d + 1] == 1 or shape[d] == 1 or strides[d] == strides[d + 1] * shape[d + 1]


def dense_values(op: Operation) -> np.ndarray:
    attr = op.properties["value"]
    if not isinstance(attr, DenseIntOrFPElementsAttr):
        raise CompileError(f"{op.name}: its value is not a dense elements attribute")
    return np.asarray(attr.get_values(), dtype=np.float32)


def matmul_dims(op: Operation) -> MatmulDims | None:
    """(result, output shape, a, b, M, K, N) of a graph.matmul; None for rank-1 operands."""
    res = op.results[0]
    a, b = op.operands
    a_shape, b_shape = shape_of(a.type), shape_of(b.type)
    if len(a_shape) < 2 or len(b_shape) < 2:
        return None
    return res, shape_of(res.type), a, b, a_shape[-2], a_shape[-1], b_shape[-1]


def dense_attr(data: np.ndarray, elem: Attribute, shape: Sequence[int]) -> DenseIntOrFPElementsAttr:
    values = data.reshape(-1)
    if isinstance(elem, (Float32Type, BFloat16Type, Float16Type)):
        return dense_floats(values, TensorType(elem, list(shape)))
    if elem not in (i32, i8):  # i8: the identity of an int8 matmul's transposes (W8A8)
        raise CompileError(f"lower-graph-to-tile: a constant of element type {elem} (tilecc: f32, bf16, f16, i32, i8)")
    int_type = TensorType(cast(IntegerType, elem), list(shape))
    return DenseIntOrFPElementsAttr.from_list(int_type, values.astype(np.int64).tolist())


