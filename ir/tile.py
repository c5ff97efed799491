"""The `tile` dialect: kernels as loops over on-chip tiles.

The hub of the compiler: the graph lowering produces it, the npu lowering consumes it.

- A kernel is a `func.func` carrying the unit attribute `tile.kernel`; its arguments
  are HBM tensors (`memref` without memory space). Loops are `scf.for` over tile
  indices, index arithmetic is `arith`.
- On-chip buffers are `tile.alloc` results: 2-D memrefs in memory space
  `#tile.space<"sram">` or `#tile.space<"acc">`; the first dimension maps to
  partitions. Tile ops act on the leading ``rows x cols`` corner of a buffer (dynamic
  sizes, so edge tiles need no masks).
- `tile.subview` names a window (row / column offset) of an on-chip buffer, so one
  buffer can hold several tiles; `tile.load` / `tile.store` take optional `row_step` /
  `col_step` to walk a dimension with a stride (every s-th element).
- The program entry `func.func @main` allocates HBM intermediates (`tile.hbm_alloc`),
  aliases reshapes (`tile.view`) and launches kernels with `func.call`.

Example (one tile of a copy kernel)::

    %buf = tile.alloc {buffer = "x"} : memref<16x64xf32, #tile.space<"sram">>
    tile.load %x[%i, %c0] into %buf sizes(%r, %c) {row_dim = 0 : i64, col_dim = 1 : i64}
        : memref<37x53xf32>, memref<16x64xf32, #tile.space<"sram">>
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import ClassVar, cast

from xdsl.dialects.builtin import (
    BoolAttr,
    DenseIntOrFPElementsAttr,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    NoneAttr,
    StringAttr,
    UnitAttr,
    i1,
    i64,
)
from xdsl.ir import Attribute, Dialect, Operation, ParametrizedAttribute, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    var_operand_def,
)
from xdsl.utils.exceptions import VerifyException

SRAM = "sram"
ACC = "acc"
HBM = "hbm"

UNARY_FNS = (
    "copy",
    "relu",
    "gelu",
    "gelu_tanh",
    "exp",
    "tanh",
    "sigmoid",
    "neg",
    "abs",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "log",
    "silu",
    "square",
    "erf",
)
BINARY_FNS = (
    "add", "sub", "mul", "div", "max", "min", "pow", "eq", "ne", "lt", "le", "gt", "ge", "mask",
)
REDUCE_FNS = ("sum", "max", "min")

KERNEL_ATTR = "tile.kernel"

# an operand as the builders take it: a value, or the single-result op that defines it
Value = SSAValue | Operation


@irdl_attr_definition
class MemSpaceAttr(ParametrizedAttribute):
    """An on-chip memory: `#tile.space<"sram">` or `#tile.space<"acc">`."""

    name = "tile.space"
    level: StringAttr

    def verify(self) -> None:
        if self.level.data not in (SRAM, ACC):
            raise VerifyException(
                f'unknown memory space "{self.level.data}" (expected "sram" or "acc")'
            )


def onchip_type(shape: Sequence[int], element_type: Attribute, space: str) -> MemRefType:
    return _onchip_memref(element_type, tuple(shape), MemSpaceAttr(StringAttr(space)))


@lru_cache(maxsize=4096)
def _onchip_memref(element_type: Attribute, shape: tuple[int, ...], space: Attribute) -> MemRefType:
    """The memref type of an on-chip buffer or window, built once per (element type, shape,
    space): attributes are immutable, and xDSL's MemRefType constructor checks its shape
    against a generic constraint on every call (the matmul kernels make tens of
    thousands of windows)."""
    return MemRefType(element_type, list(shape), NoneAttr(), space)


def space_of(t: Attribute) -> str:
    """`hbm`, `sram` or `acc` for a memref type."""
    assert isinstance(t, MemRefType)
    ms = t.memory_space
    if isinstance(ms, MemSpaceAttr):
        return ms.level.data
    return HBM


def _as_memref(t: Attribute) -> MemRefType[Attribute] | None:
    """`t` as a memref type; None when it is not one."""
    # every memref's element type is an Attribute; isinstance alone leaves it unknown
    return cast(MemRefType[Attribute], t) if isinstance(t, MemRefType) else None


def _memref(t: Attribute) -> MemRefType[Attribute]:
    """`t`, which the op's operand and result constraints make a memref type."""
    m = _as_memref(t)
    assert m is not None, t
    return m


def _expect_space(op: IRDLOperation, what: str, value: SSAValue, spaces: tuple[str, ...]) -> None:
    t = _as_memref(value.type)
    if t is None:
        raise VerifyException(f"{op.name}: {what} must be a memref, got {value.type}")
    space = space_of(t)
    if space not in spaces:
        raise VerifyException(
            f"{op.name}: {what} must live in {' or '.join(spaces)}, got {space} ({t})"
        )
    if space != HBM and t.get_num_dims() != 2:
        raise VerifyException(f"{op.name}: on-chip {what} must be 2-D, got {t}")


def _fn_prop(op: IRDLOperation, allowed: tuple[str, ...]) -> None:
    fn = op.properties["fn"]
    assert isinstance(fn, StringAttr)
    if fn.data not in allowed:
        raise VerifyException(f'{op.name}: unknown fn "{fn.data}" (allowed: {", ".join(allowed)})')


@irdl_op_definition
class AllocOp(IRDLOperation):
    """An on-chip buffer; `offset` (bytes within each partition) is set by plan-sram."""

    name = "tile.alloc"
    buffer = prop_def(StringAttr)
    offset = opt_prop_def(IntegerAttr)
    result = result_def(MemRefType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self, type: MemRefType, buffer: str):
        super().__init__(result_types=[type], properties={"buffer": StringAttr(buffer)})

    def verify_(self) -> None:
        _expect_space(self, "result", self.result, (SRAM, ACC))


@irdl_op_definition
class HbmAllocOp(IRDLOperation):
    """An HBM tensor of the program; `offset` is set by plan-hbm. `zeroed`: the program
    relies on the tensor starting as zeros (a padded layout whose ring is never written),
    so plan-hbm gives it bytes of its own (the HBM image starts zeroed)."""

    name = "tile.hbm_alloc"
    offset = opt_prop_def(IntegerAttr)
    input = opt_prop_def(IntegerAttr)  # the program's input number
    weight = opt_prop_def(StringAttr)  # a weight of the program, by name
    value = opt_prop_def(DenseIntOrFPElementsAttr)  # a constant's data
    zeroed = opt_prop_def(UnitAttr)
    result = result_def(MemRefType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict `:` type($result)"

    def __init__(
        self,
        type: MemRefType,
        *,
        input: int | None = None,
        weight: str | None = None,
        value: DenseIntOrFPElementsAttr | None = None,
        zeroed: bool = False,
    ):
        props: dict[str, Attribute] = {}
        if zeroed:
            props["zeroed"] = UnitAttr()
        if input is not None:
            props["input"] = IntegerAttr(input, i64)
        if weight is not None:
            props["weight"] = StringAttr(weight)
        if value is not None:
            props["value"] = value
        super().__init__(result_types=[type], properties=props)

    def verify_(self) -> None:
        _expect_space(self, "result", self.result, (HBM,))


@irdl_op_definition
class ViewOp(IRDLOperation):
    """Another look at the bytes of an HBM tensor: a reshape, a permutation, a slice or
    a broadcast, with no data movement.

    A result without a layout is the source's bytes in row-major order (a reshape of a
    contiguous tensor). A result with a strided layout addresses elements of the *root*
    allocation (the `tile.hbm_alloc` the chain of views starts from): element ``i`` is
    at ``offset + sum(i[d] * strides[d])`` elements from the root's first byte, so DMAs
    that read the view walk the strides (a permutation is permuted strides, a slice an
    offset and a scaled stride, a broadcast a stride of 0)::

        %q = tile.view %qkv : memref<512x2304xbf16> to
            memref<12x512x64xbf16, strided<[64, 2304, 1]>>
    """

    name = "tile.view"
    source = operand_def(MemRefType)
    result = result_def(MemRefType)
    assembly_format = "$source attr-dict `:` type($source) `to` type($result)"

    def __init__(self, source: Value, type: MemRefType):
        super().__init__(operands=[source], result_types=[type])

    def verify_(self) -> None:
        src, dst = _memref(self.source.type), _memref(self.result.type)
        if src.element_type != dst.element_type:
            raise VerifyException(f"tile.view: {src} and {dst} differ in element type")
        if isinstance(dst.layout, NoneAttr) and isinstance(src.layout, NoneAttr):
            if _numel(src) != _numel(dst):
                raise VerifyException(f"tile.view: {src} and {dst} differ in element count")
            return
        if _numel(dst) == 0:
            return
        lo, hi = element_span(dst)
        slo, shi = element_span(src) if _numel(src) else (0, -1)
        if lo < slo or hi > shi:
            raise VerifyException(
                f"tile.view: {dst} reaches elements [{lo}, {hi}] outside its source's [{slo}, {shi}]"
            )


def layout_of(t: MemRefType) -> tuple[tuple[int, ...], int]:
    """(element strides, element offset) of an HBM memref: its strided layout, or
    row-major strides and offset 0 without one."""
    from xdsl.dialects.builtin import StridedLayoutAttr

    if isinstance(t.layout, StridedLayoutAttr):
        strides = t.layout.get_strides()
        offset = t.layout.get_offset()
        ints = tuple(s for s in strides if isinstance(s, int))
        assert len(ints) == len(strides) and isinstance(offset, int)
        return tuple(int(s) for s in ints), int(offset)
    return row_major(t.get_shape()), 0


def row_major(shape: Sequence[int]) -> tuple[int, ...]:
    out: list[int] = []
    acc = 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(out[::-1])


def element_span(t: MemRefType) -> tuple[int, int]:
    """The first and last element (from the root) a non-empty memref can address."""
    strides, offset = layout_of(t)
    lo = hi = offset
    for n, s in zip(t.get_shape(), strides):
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    return lo, hi


def is_contiguous(t: MemRefType) -> bool:
    """Row-major and dense (any offset): the bytes a reshape can reinterpret."""
    strides, _ = layout_of(t)
    shape = t.get_shape()
    return 0 in shape or all(s == r for n, s, r in zip(shape, strides, row_major(shape)) if n != 1)


def _numel(t: MemRefType) -> int:
    n = 1
    for d in t.get_shape():
        n *= d
    return n


def _steps(row_step: int, col_step: int) -> dict[str, Attribute]:
    """The optional `row_step` / `col_step` properties (omitted when 1)."""
    props: dict[str, Attribute] = {}
    if row_step != 1:
        props["row_step"] = IntegerAttr(row_step, i64)
    if col_step != 1:
        props["col_step"] = IntegerAttr(col_step, i64)
    return props


class _DimsOp(IRDLOperation):
    """Base of the DMA ops. row_dim / col_dim: the HBM dimensions a tile's rows and columns
    walk (-1: broadcast); optional row_step / col_step (default 1): elements of that
    dimension per tile row / column, e.g. ``col_step = 2`` reads every other element."""

    def step(self, key: str) -> int:
        v = self.properties.get(key)
        return v.value.data if isinstance(v, IntegerAttr) else 1

    def _verify_dims(self, op: IRDLOperation, hbm: SSAValue, indices: Sequence[SSAValue]) -> None:
        rank = _memref(hbm.type).get_num_dims()
        if len(indices) != rank:
            raise VerifyException(f"{op.name}: {len(indices)} indices for a rank-{rank} tensor")
        for key in ("row_dim", "col_dim"):
            v = op.properties[key]
            assert isinstance(v, IntegerAttr)
            if not -1 <= v.value.data < max(rank, 1) or (rank == 0 and v.value.data != -1):
                raise VerifyException(f"{op.name}: {key} = {v.value.data} out of range for rank {rank}")
        for key in ("row_step", "col_step"):
            if self.step(key) < 1:
                raise VerifyException(f"{op.name}: {key} must be >= 1, got {self.step(key)}")


@irdl_op_definition
class SubviewOp(IRDLOperation):
    """A window of an on-chip buffer: rows [row, row + R) and columns [col, col + C) of
    `source`, R x C being the result's shape. Tile ops on the result access the source's
    bytes (synchronisation treats the window as the whole source buffer)::

        %w = tile.subview %buf[%c0, %off] : memref<16x512xf32, #tile.space<"sram">>
            to memref<16x64xf32, #tile.space<"sram">>
    """

    name = "tile.subview"
    source = operand_def(MemRefType)
    row = operand_def(IndexType())
    col = operand_def(IndexType())
    result = result_def(MemRefType)
    assembly_format = (
        "$source `[` $row `,` $col `]` attr-dict `:` type($source) `to` type($result)"
    )

    def __init__(self, source: SSAValue, row: Value, col: Value, shape: Sequence[int]):
        t = _memref(source.type)
        rt = _onchip_memref(t.element_type, tuple(shape), t.memory_space)
        super().__init__(operands=[source, row, col], result_types=[rt])

    def verify_(self) -> None:
        _expect_space(self, "source", self.source, (SRAM, ACC))
        _expect_space(self, "result", self.result, (SRAM, ACC))
        src, res = _memref(self.source.type), _memref(self.result.type)
        if src.element_type != res.element_type or space_of(src) != space_of(res):
            raise VerifyException(f"tile.subview: {src} and {res} differ in element type or space")
        (sr, sc), (rr, rc) = src.get_shape(), res.get_shape()
        offsets = [const_index(v) for v in (self.row, self.col)]
        for what, off, size, limit in (("rows", offsets[0], rr, sr), ("columns", offsets[1], rc, sc)):
            if size > limit or (off is not None and off + size > limit):
                raise VerifyException(
                    f"tile.subview: {what} [{off}, {off}+{size}) exceed the source's {limit}"
                    if off is not None else f"tile.subview: {size} {what} exceed the source's {limit}"
                )


def const_index(v: SSAValue) -> int | None:
    from xdsl.dialects import arith

    owner = v.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return int(owner.value.value.data)
    return None


@irdl_op_definition
class LoadOp(_DimsOp):
    """DMA an HBM tile into an on-chip buffer.

    Element (r, c) of the tile comes from `src[indices + r * e(row_dim) + c * e(col_dim)]`.
    """

    name = "tile.load"
    src = operand_def(MemRefType)
    indices = var_operand_def(IndexType())
    dst = operand_def(MemRefType)
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    row_dim = prop_def(IntegerAttr)
    col_dim = prop_def(IntegerAttr)
    row_step = opt_prop_def(IntegerAttr)
    col_step = opt_prop_def(IntegerAttr)
    # optional DMA queue (modulo the target's queue count); default: loads alternate
    queue = opt_prop_def(IntegerAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True), ParsePropInAttrDict())
    assembly_format = (
        "$src `[` $indices `]` `into` $dst `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($src) `,` type($dst)"
    )

    def __init__(
        self, src: Value, indices: Sequence[Value], dst: Value, rows: Value, cols: Value,
        row_dim: int, col_dim: int, row_step: int = 1, col_step: int = 1, queue: int | None = None,
    ):
        props: dict[str, Attribute] = {
            "row_dim": IntegerAttr(row_dim, i64), "col_dim": IntegerAttr(col_dim, i64),
            **_steps(row_step, col_step),
        }
        if queue is not None:
            props["queue"] = IntegerAttr(queue, i64)
        super().__init__(operands=[src, list(indices), dst, rows, cols], properties=props)

    def verify_(self) -> None:
        _expect_space(self, "source", self.src, (HBM,))
        _expect_space(self, "destination", self.dst, (SRAM, ACC))
        self._verify_dims(self, self.src, self.indices)


@irdl_op_definition
class StoreOp(_DimsOp):
    """DMA the leading rows x cols of an on-chip buffer to an HBM tile."""

    name = "tile.store"
    src = operand_def(MemRefType)
    dst = operand_def(MemRefType)
    indices = var_operand_def(IndexType())
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    row_dim = prop_def(IntegerAttr)
    col_dim = prop_def(IntegerAttr)
    row_step = opt_prop_def(IntegerAttr)
    col_step = opt_prop_def(IntegerAttr)
    # optional DMA queue (modulo the target's queue count); default: the last queue
    queue = opt_prop_def(IntegerAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True), ParsePropInAttrDict())
    assembly_format = (
        "$src `into` $dst `[` $indices `]` `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($src) `,` type($dst)"
    )

    def __init__(
        self, src: Value, dst: Value, indices: Sequence[Value], rows: Value, cols: Value,
        row_dim: int, col_dim: int, row_step: int = 1, col_step: int = 1, queue: int | None = None,
    ):
        props: dict[str, Attribute] = {
            "row_dim": IntegerAttr(row_dim, i64), "col_dim": IntegerAttr(col_dim, i64),
            **_steps(row_step, col_step),
        }
        if queue is not None:
            props["queue"] = IntegerAttr(queue, i64)
        super().__init__(operands=[src, dst, list(indices), rows, cols], properties=props)

    def verify_(self) -> None:
        _expect_space(self, "source", self.src, (SRAM, ACC))
        _expect_space(self, "destination", self.dst, (HBM,))
        self._verify_dims(self, self.dst, self.indices)
        for key in ("row_dim", "col_dim"):
            v = self.properties[key]
            assert isinstance(v, IntegerAttr)
            if v.value.data == -1 and self.indices:
                raise VerifyException("tile.store: a store cannot broadcast (row_dim/col_dim -1)")


@irdl_op_definition
class GatherOp(IRDLOperation):
    """Indirect DMA: rows of a 2-D HBM table selected by an on-chip index column.

    Element (r, c) of the tile is ``table[index[r, 0], col + c]`` for r < rows, c < cols;
    `index` is an on-chip i32 buffer (one index per partition). An index outside
    ``[0, table rows)`` is a run-time `MemoryAccessError`. Example::

        tile.gather %wte[%c0] by %ids into %rows sizes(%r, %c)
            : memref<1000x128xf32>, memref<16x1xi32, #tile.space<"sram">>, memref<16x128xf32, ...>
    """

    name = "tile.gather"
    table = operand_def(MemRefType)
    col = operand_def(IndexType())
    index = operand_def(MemRefType)
    dst = operand_def(MemRefType)
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    # optional DMA queue (modulo the target's queue count); default: the loads' rotation
    queue = opt_prop_def(IntegerAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$table `[` $col `]` `by` $index `into` $dst `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($table) `,` type($index) `,` type($dst)"
    )

    def __init__(
        self, table: Value, col: Value, index: Value, dst: Value, rows: Value, cols: Value,
        queue: int | None = None,
    ):
        props: dict[str, Attribute] = {} if queue is None else {"queue": IntegerAttr(queue, i64)}
        super().__init__(operands=[table, col, index, dst, rows, cols], properties=props)

    def verify_(self) -> None:
        _expect_space(self, "table", self.table, (HBM,))
        _expect_space(self, "index", self.index, (SRAM, ACC))
        _expect_space(self, "destination", self.dst, (SRAM, ACC))
        t = _memref(self.table.type)
        if t.get_num_dims() != 2:
            raise VerifyException(f"tile.gather: the table must be 2-D, got {t}")
        it = _memref(self.index.type)
        et = it.element_type
        if not (isinstance(et, IntegerType) and et.bitwidth == 32):
            raise VerifyException(f"tile.gather: indices must be i32, got {it}")
        dt = _memref(self.dst.type)
        if dt.element_type != t.element_type:
            raise VerifyException(f"tile.gather: table {t} and destination {dt} element types differ")


@irdl_op_definition
class ScatterOp(IRDLOperation):
    """Indirect store: rows of an on-chip tile to the HBM table rows an on-chip index
    column selects (the mirror of `tile.gather`).

    The table is the last two dimensions of an HBM tensor of rank >= 2; `indices` are
    its leading indices then the column offset (one per dimension but the row
    dimension). Row r of the tile (``rows x cols``) goes to
    ``table[lead..., index[r, 0], col : col + cols]``, rows in order (of duplicate
    indices the last row wins); an index outside ``[0, table rows)`` is a run-time
    `MemoryAccessError`. `queue` (optional) names the DMA queue, default the last
    (the stores' queue), so scatters and stores to one tensor stay in order. Example::

        tile.scatter %rows by %ids into %cache[%h, %c0] sizes(%r, %c)
            : memref<16x64xf32, #tile.space<"sram">>, memref<16x1xi32, ...>, memref<4x32x64xf32>
    """

    name = "tile.scatter"
    src = operand_def(MemRefType)
    index = operand_def(MemRefType)
    table = operand_def(MemRefType)
    indices = var_operand_def(IndexType())
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    queue = opt_prop_def(IntegerAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$src `by` $index `into` $table `[` $indices `]` `sizes` `(` $rows `,` $cols `)` "
        "attr-dict `:` type($src) `,` type($index) `,` type($table)"
    )

    def __init__(
        self, src: Value, index: Value, table: Value, indices: Sequence[Value], rows: Value,
        cols: Value, queue: int | None = None,
    ):
        props: dict[str, Attribute] = {}
        if queue is not None:
            props["queue"] = IntegerAttr(queue, i64)
        super().__init__(operands=[src, index, table, list(indices), rows, cols], properties=props)

    def verify_(self) -> None:
        _expect_space(self, "source", self.src, (SRAM, ACC))
        _expect_space(self, "index", self.index, (SRAM, ACC))
        _expect_space(self, "table", self.table, (HBM,))
        t = _memref(self.table.type)
        if t.get_num_dims() < 2 or len(self.indices) != t.get_num_dims() - 1:
            raise VerifyException(
                f"tile.scatter: a table of rank >= 2 takes one index per dimension but the "
                f"row dimension; got {len(self.indices)} for {t}"
            )
        it = _memref(self.index.type)
        et = it.element_type
        if not (isinstance(et, IntegerType) and et.bitwidth == 32):
            raise VerifyException(f"tile.scatter: indices must be i32, got {it}")
        st = _memref(self.src.type)
        if st.element_type != t.element_type:
            raise VerifyException(f"tile.scatter: source {st} and table {t} element types differ")


@irdl_op_definition
class MatmulOp(IRDLOperation):
    """acc[m x n] (+)= lhsT[k x m]^T @ rhs[k x n] on the matrix engine.

    `accumulate` (i1) adds to the accumulator instead of overwriting it.
    """

    name = "tile.matmul"
    lhsT = operand_def(MemRefType)
    rhs = operand_def(MemRefType)
    acc = operand_def(MemRefType)
    m = operand_def(IndexType())
    k = operand_def(IndexType())
    n = operand_def(IndexType())
    accumulate = operand_def(i1)
    assembly_format = (
        "$lhsT `,` $rhs `into` $acc `sizes` `(` $m `,` $k `,` $n `)` `accumulate` `(` "
        "$accumulate `)` attr-dict `:` type($lhsT) `,` type($rhs) `,` type($acc)"
    )

    def __init__(
        self, lhsT: Value, rhs: Value, acc: Value, m: Value, k: Value, n: Value, accumulate: Value
    ):
        super().__init__(operands=[lhsT, rhs, acc, m, k, n, accumulate])

    def verify_(self) -> None:
        _expect_space(self, "lhsT", self.lhsT, (SRAM,))
        _expect_space(self, "rhs", self.rhs, (SRAM,))
        _expect_space(self, "acc", self.acc, (ACC,))
        acc = _memref(self.acc.type)
        if not isinstance(acc.element_type, Float32Type):
            raise VerifyException(f"tile.matmul: accumulator must be f32, got {acc}")
        if self.accumulate.type != i1:
            raise VerifyException("tile.matmul: accumulate must be i1")


class _VectorOp(IRDLOperation):
    def _verify_vector(self, inputs: Sequence[SSAValue], output: SSAValue) -> None:
        for v in inputs:
            _expect_space(self, "input", v, (SRAM, ACC))
        _expect_space(self, "output", output, (SRAM, ACC))


@irdl_op_definition
class UnaryOp(_VectorOp):
    """out = fn(input) elementwise on the vector engine (fp32 math, rounded to out)."""

    name = "tile.unary"
    input = operand_def(MemRefType)
    output = operand_def(MemRefType)
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    fn = prop_def(StringAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$fn $input `into` $output `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($input) `,` type($output)"
    )

    def __init__(self, fn: str, input: Value, output: Value, rows: Value, cols: Value):
        super().__init__(operands=[input, output, rows, cols], properties={"fn": StringAttr(fn)})

    def verify_(self) -> None:
        self._verify_vector([self.input], self.output)
        _fn_prop(self, UNARY_FNS)


@irdl_op_definition
class BinaryOp(_VectorOp):
    """out = lhs fn rhs (with `swap`: rhs fn lhs); rhs is a tile or (rhs_mode "column")
    a rows x 1 column broadcast along the free dimension."""

    name = "tile.binary"
    lhs = operand_def(MemRefType)
    rhs = operand_def(MemRefType)
    output = operand_def(MemRefType)
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    fn = prop_def(StringAttr)
    rhs_mode = prop_def(StringAttr)
    swap = opt_prop_def(UnitAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$fn $lhs `,` $rhs `into` $output `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($lhs) `,` type($rhs) `,` type($output)"
    )

    MODES: ClassVar[tuple[str, ...]] = ("tile", "column")

    def __init__(
        self, fn: str, lhs: Value, rhs: Value, output: Value, rows: Value, cols: Value,
        rhs_mode: str = "tile", swap: bool = False,
    ):
        props: dict[str, Attribute] = {"fn": StringAttr(fn), "rhs_mode": StringAttr(rhs_mode)}
        if swap:
            props["swap"] = UnitAttr()
        super().__init__(operands=[lhs, rhs, output, rows, cols], properties=props)

    def verify_(self) -> None:
        self._verify_vector([self.lhs, self.rhs], self.output)
        _fn_prop(self, BINARY_FNS)
        if self.rhs_mode.data not in self.MODES:
            raise VerifyException(f'tile.binary: unknown rhs_mode "{self.rhs_mode.data}"')


@irdl_op_definition
class ScalarOp(_VectorOp):
    """out = input fn imm (or imm fn input with `swap`)."""

    name = "tile.scalar"
    input = operand_def(MemRefType)
    output = operand_def(MemRefType)
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    fn = prop_def(StringAttr)
    imm = prop_def(FloatAttr)
    swap = opt_prop_def(UnitAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$fn $input `,` $imm `into` $output `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($input) `,` type($output)"
    )

    def __init__(
        self, fn: str, input: Value, imm: float, output: Value, rows: Value, cols: Value, swap: bool = False
    ):
        props: dict[str, Attribute] = {"fn": StringAttr(fn), "imm": FloatAttr(imm, Float32Type())}
        if swap:
            props["swap"] = UnitAttr()
        super().__init__(operands=[input, output, rows, cols], properties=props)

    def verify_(self) -> None:
        self._verify_vector([self.input], self.output)
        _fn_prop(self, BINARY_FNS)


@irdl_op_definition
class ReduceOp(_VectorOp):
    """out[rows x 1] = reduce_fn(input[rows x cols]) along the free dimension."""

    name = "tile.reduce"
    input = operand_def(MemRefType)
    output = operand_def(MemRefType)
    rows = operand_def(IndexType())
    cols = operand_def(IndexType())
    fn = prop_def(StringAttr)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = (
        "$fn $input `into` $output `sizes` `(` $rows `,` $cols `)` attr-dict "
        "`:` type($input) `,` type($output)"
    )

    def __init__(self, fn: str, input: Value, output: Value, rows: Value, cols: Value):
        super().__init__(operands=[input, output, rows, cols], properties={"fn": StringAttr(fn)})

    def verify_(self) -> None:
        self._verify_vector([self.input], self.output)
        _fn_prop(self, REDUCE_FNS)


Tile = Dialect(
    "tile",
    [
        AllocOp, HbmAllocOp, ViewOp, SubviewOp, LoadOp, StoreOp, GatherOp, ScatterOp, MatmulOp,
        UnaryOp, BinaryOp, ScalarOp, ReduceOp,
    ],
    [MemSpaceAttr],
)

__all__ = [
    "Tile",
    "MemSpaceAttr",
    "AllocOp",
    "HbmAllocOp",
    "ViewOp",
    "layout_of",
    "row_major",
    "element_span",
    "is_contiguous",
    "SubviewOp",
    "LoadOp",
    "StoreOp",
    "GatherOp",
    "ScatterOp",
    "MatmulOp",
    "UnaryOp",
    "BinaryOp",
    "ScalarOp",
    "ReduceOp",
    "onchip_type",
    "space_of",
    "KERNEL_ATTR",
    "BoolAttr",
]
