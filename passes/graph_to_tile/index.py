"""lower-graph-to-tile, continued: tile kernels for indexing, slicing, joining,
comparisons, selection and attention.

Each function takes the `GraphToTile` lowering state, the graph op and its source
location, emits kernels with `KernelBuilder` and records the op's HBM result in
`lowering.values`.

Strategies:

- ``graph.gather_rows`` (embedding, ``x[idx]``): per tile of up to P indices, one DMA
  loads the i32 indices onto partitions, then an indirect DMA (``tile.gather`` ->
  ``DMA_GATHER``) fetches the selected table rows, a column tile at a time, and a DMA
  stores them. No vector work.
- ``graph.slice`` / ``graph.concat``: DMA-only copies (HBM -> SRAM -> HBM), the source
  (slice) or destination (concat) index shifted by the offset; a concat is one kernel
  with one loop nest per input, over the inputs viewed as rows ``[outer, C_j * inner]``
  of the output ``[outer, C * inner]`` where their strides allow (no unit-dim walks).
  A step s > 1 along a dim of size N is a unit-step access
  of the view ``[N / s, s]`` when s divides N; otherwise the span is first copied into a
  buffer padded to a multiple of s (two kernels).
- comparisons, ``pow``, ``minimum``, ``abs``, ``log``, ``erf``: the elementwise kernels
  of `GraphToTile` (vector functions ``eq ne lt le gt ge``, ``pow``, ``min``, ...).
- ``graph.where``: ``mask(x, c) + mask(y, c == 0)`` (``mask(a, b)`` = a where b != 0,
  else 0): exact, and an unselected inf / NaN does not leak; scalar x / y are
  immediates.
- ``graph.log_softmax``: whole rows on chip like softmax: ``x - max - log(sum(exp(x -
  max)))``.
- ``graph.sdpa``: ``permute(k)``, ``matmul``, scale, (mask add | causal constant add:
  0 / the dtype's most negative finite value), ``softmax``, ``matmul`` -- the kernels
  of the decomposed graph ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from xdsl.dialects.builtin import TensorType, i32
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import tile
from tilecc.ir.dtypes import masked_value
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.conversion import lower_op
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import reshape_strides


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(t.get_shape())


def _elem(t: Any) -> Any:
    return t.element_type


def _prod(xs: Sequence[int]) -> int:
    return int(np.prod(xs, dtype=np.int64)) if len(xs) else 1


# ---------------------------------------------------------------------------
# DMA copies of regions (slice, concat)
# ---------------------------------------------------------------------------


def _copy_nest(
    lw: LoweringContext, kb: KernelBuilder, src: SSAValue, src_off: Sequence[int], dst: SSAValue,
    dst_off: Sequence[int], extent: Sequence[int], name: str,
) -> None:
    """Copy the region `extent` of kernel argument `src` at `src_off` into `dst` at
    `dst_off` (same rank >= 2) through SRAM tiles: rows walk dim -2, columns dim -1."""
    rank = len(extent)
    R, C = extent[-2], extent[-1]
    TR = min(lw.P, R)
    TC = lw.col_tile(C, 1)
    elem = _elem(src.type)
    ivs: list[SSAValue] = []

    def shifted(idx: Sequence[SSAValue], off: Sequence[int]) -> list[SSAValue]:
        return [kb.addi(i, kb.const(o)) if o else i for i, o in zip(idx, off, strict=True)]

    def body() -> None:
        with kb.tiles(R, TR) as (r0, r), kb.tiles(C, TC) as (c0, c):
            idx = [*ivs, r0, c0]
            buf = kb.alloc([TR, TC], elem, tile.SRAM, name)
            kb.add(tile.LoadOp(src, shifted(idx, src_off), buf, r, c, rank - 2, rank - 1))
            kb.add(tile.StoreOp(buf, dst, shifted(idx, dst_off), r, c, rank - 2, rank - 1))

    lw.outer_loops(kb, list(extent[:-2]), ivs, body)


def lower_slice(lw: LoweringContext, op: gi.SliceOp, loc: str) -> None:
    """A view: the start folds into the offset, the step into the stride of `dim`."""
    res = op.results[0]
    dim, start, _end, step = op.slice_params()
    src = lw.materialise(op.input)
    strides, offset = lw.layout(src)
    new = list(strides)
    new[dim] = strides[dim] * step
    lw.values[res] = lw.strided(src, _shape(res.type), new, offset + start * strides[dim])


def _concat_rows(lw: LoweringContext, op: gi.ConcatOp, out: SSAValue
                 ) -> tuple[list[SSAValue], SSAValue, int] | None:
    """A concat along `dim` as one of rows: (the inputs, the output, the axis along which
    they are placed side by side) as 2-D views, so the copies fill partitions with rows
    instead of walking unit dims one DMA at a time. With more than one outer row (the
    product of the dims before `dim`): inputs ``[outer, C_j * inner]`` placed along the
    columns of ``[outer, C * inner]`` (a decode step's ``[B, H, 1, D]`` rotate-half);
    with one (a CNN's channel concat of ``[1, C_j, H, W]``): inputs ``[C_j, inner]``
    placed along the rows of ``[C, inner]``, one DMA per 128 channels instead of one per
    channel. None where an input's strides do not allow the view without a copy, or the
    concat is already along the output's rows."""
    out_shape = _shape(op.results[0].type)
    dim = op.dim.value.data
    outer, inner = _prod(out_shape[:dim]), _prod(out_shape[dim + 1:])
    if outer > 1:
        if len(out_shape) <= 2 and dim == len(out_shape) - 1:
            return None  # already rows of the output
        axis = 1
        view = lambda c: [outer, c * inner]  # noqa: E731
    elif inner > 1:
        axis = 0
        view = lambda c: [c, inner]  # noqa: E731
    else:
        return None  # a single row
    srcs = []
    for v in op.inputs:
        src = lw.materialise(v)
        shape = view(_shape(v.type)[dim])
        strides, offset = lw.layout(src)
        new = reshape_strides(_shape(src.type), strides, shape)
        if new is None:
            return None
        srcs.append(lw.strided(src, shape, new, offset))
    return srcs, lw.view(out, view(out_shape[dim])), axis


def lower_concat(lw: LoweringContext, op: gi.ConcatOp, loc: str) -> None:
    res = op.results[0]
    out_shape = _shape(res.type)
    dim = op.dim.value.data
    out = lw.hbm(out_shape, _elem(res.type))
    rows = _concat_rows(lw, op, out) if len(out_shape) >= 2 else None
    if rows is not None:
        srcs, dst, axis = rows
        kb = KernelBuilder(lw.kernel_name("concat"), [s.type for s in srcs] + [dst.type], loc)
        pos = 0
        for j, s in enumerate(srcs):
            width = _shape(s.type)[axis]
            if _prod(_shape(s.type)):
                off = [0, pos] if axis == 1 else [pos, 0]
                _copy_nest(lw, kb, kb.args[j], [0, 0], kb.args[-1], off, _shape(s.type), f"part{j}")
            pos += width
        lw.launch(kb, [*srcs, dst])
        lw.values[res] = out
        return
    pad = 2 - len(out_shape) if len(out_shape) < 2 else 0
    full = (1,) * pad + out_shape
    srcs = [lw.view(lw.materialise(v), (1,) * pad + _shape(v.type)) for v in op.inputs]
    dst = lw.view(out, full)
    kb = KernelBuilder(lw.kernel_name("concat"), [s.type for s in srcs] + [dst.type], loc)
    pos = 0
    for j, s in enumerate(srcs):
        ext = _shape(s.type)
        if _prod(ext):
            off = [0] * len(full)
            off[dim + pad] = pos
            _copy_nest(lw, kb, kb.args[j], [0] * len(full), kb.args[-1], off, ext, f"part{j}")
        pos += ext[dim + pad]
    lw.launch(kb, [*srcs, dst])
    lw.values[res] = out


# ---------------------------------------------------------------------------
# Indirect DMA
# ---------------------------------------------------------------------------


def lower_gather_rows(lw: LoweringContext, op: gi.GatherRowsOp, loc: str) -> None:
    res = op.results[0]
    out_shape = _shape(res.type)
    table = lw.materialise(op.table)
    V = _shape(table.type)[0]
    D = _prod(_shape(table.type)[1:])
    N = _prod(_shape(op.indices.type))
    out = lw.hbm(out_shape, _elem(res.type))
    if N == 0 or D == 0:
        lw.values[res] = out
        return
    table2 = lw.view(table, (V, D))
    idx2 = lw.view(lw.materialise(op.indices), (N, 1))
    out2 = lw.view(out, (N, D))
    elem = _elem(res.type)
    TR = min(lw.P, N)
    TC = lw.col_tile(D, 2)
    kb = KernelBuilder(lw.kernel_name("gather"), [table2.type, idx2.type, out2.type], loc)
    with kb.tiles(N, TR) as (r0, r):
        zero, one = kb.const(0), kb.const(1)
        ib = kb.alloc([TR, 1], i32, tile.SRAM, "index")
        kb.add(tile.LoadOp(kb.args[1], [r0, zero], ib, r, one, 0, 1))
        with kb.tiles(D, TC) as (c0, c):
            rows = kb.alloc([TR, TC], elem, tile.SRAM, "rows")
            kb.add(tile.GatherOp(kb.args[0], c0, ib, rows, r, c))
            kb.add(tile.StoreOp(rows, kb.args[2], [r0, c0], r, c, 0, 1))
    lw.launch(kb, [table2, idx2, out2])
    lw.values[res] = out


# ---------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------


def lower_where(lw: LoweringContext, op: gi.WhereOp, loc: str) -> None:
    from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

    res = op.results[0]
    c, x, y = op.operands
    ek = ElementwiseKernel(lw, "where", loc, _shape(res.type))
    lw.finish_elementwise(ek, res, ek.where(ek.leaf(c), ek.leaf(x), ek.leaf(y), _elem(res.type)))


# ---------------------------------------------------------------------------
# Row-wise
# ---------------------------------------------------------------------------


def lower_log_softmax(lw: LoweringContext, op: gi.LogSoftmaxOp, loc: str) -> None:
    res = op.results[0]
    shape = _shape(res.type)
    if op.axis != len(shape) - 1:
        raise CompileError(
            f"graph.log_softmax at {loc}: only the last dimension is supported, got dim {op.axis}"
        )
    x, R, C = lw.rows_view(op.input, loc, "graph.log_softmax")
    lw.values[res] = lw.view(lw.rowwise_kernel("log_softmax", loc, x, R, C, _elem(res.type)), shape)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def lower_sdpa(lw: LoweringContext, op: gi.SdpaOp, loc: str) -> None:
    """The decomposition into graph ops (built detached, lowered, then erased)."""
    res = op.results[0]
    q, k, v = op.q, op.k, op.v
    et = _elem(res.type)
    dt = g.element_dtype(res.type)
    tmp: list[Operation] = []

    def add(o: Operation) -> SSAValue:
        g.set_loc(o, loc)
        tmp.append(o)
        lower_op(lw, o)
        return o.results[0]

    try:
        rank = len(_shape(k.type))
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        kt = add(g.PermuteOp.make(k, perm))
        s = add(g.MatmulOp.make(q, kt))
        scale = op.scale.value.data
        if scale != 1.0:
            s = add(g.MulOp.make(s, add(g.ConstantOp.make(np.asarray(scale, dtype=np.float32), dt))))
        if op.mask is not None:
            s = add(g.AddOp.make(s, op.mask))
        if op.is_causal:
            L, S = _shape(s.type)[-2:]
            low = masked_value(dt)  # finite: the constant's printed form reads back
            causal = np.where(np.tril(np.ones((L, S), dtype=bool)), 0.0, low).astype(np.float32)
            s = add(g.AddOp.make(s, add(g.ConstantOp.make(causal, dt))))
        p = add(g.SoftmaxOp.make(s, len(_shape(s.type)) - 1))
        o = add(g.MatmulOp.make(p, v))
        assert isinstance(o.type, TensorType) and _elem(o.type) == et
        lw.values[res] = lw.view(lw.materialise(o), _shape(res.type))
    finally:
        for t in reversed(tmp):
            t.erase()


LOWERINGS: dict[type, Callable[[Any, Any, str], None]] = {
    gi.GatherRowsOp: lower_gather_rows,
    gi.SliceOp: lower_slice,
    gi.ConcatOp: lower_concat,
    gi.WhereOp: lower_where,
    gi.LogSoftmaxOp: lower_log_softmax,
    gi.SdpaOp: lambda lw, op, loc: _attention(lw, op, loc),
}


def _attention(lw: LoweringContext, op: gi.SdpaOp, loc: str) -> None:
    """-O2: the flash-attention kernel of attention/ (which falls back to
    `lower_sdpa` at -O0 and where it does not apply)."""
    from tilecc.passes.graph_to_tile.attention import lower_attention

    lower_attention(lw, op, loc)


__all__ = ["LOWERINGS"]
