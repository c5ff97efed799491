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
  with one loop nest per input. A step s > 1 along a dim of size N is a unit-step access
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
from xdsl.dialects.builtin import TensorType, f32, i32
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import tile
from tilecc.passes.kernel_builder import KernelBuilder


def masked_value(dt) -> float:
    from tilecc.frontend.aten_index import masked_value as mv

    return mv(dt)


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
    lw, kb: KernelBuilder, src: SSAValue, src_off: Sequence[int], dst: SSAValue,
    dst_off: Sequence[int], extent: Sequence[int], name: str,
) -> None:
    """Copy the region `extent` of kernel argument `src` at `src_off` into `dst` at
    `dst_off` (same rank >= 2) through SRAM tiles: rows walk dim -2, columns dim -1."""
    rank = len(extent)
    R, C = extent[-2], extent[-1]
    TR = min(lw.P, R)
    TC = lw._col_tile(C, 1)
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

    lw._outer_loops(kb, list(extent[:-2]), ivs, body)


def _at_least_2d(shape: Sequence[int]) -> tuple[int, ...]:
    return (1,) * (2 - len(shape)) + tuple(shape) if len(shape) < 2 else tuple(shape)


def _copy_kernel(
    lw, what: str, loc: str, src: SSAValue, src_off: Sequence[int], dst: SSAValue,
    dst_off: Sequence[int], extent: Sequence[int],
) -> None:
    """One kernel copying a region of HBM tensor `src` into HBM tensor `dst` (equal ranks)."""
    pad = 2 - len(extent) if len(extent) < 2 else 0
    src = lw.view(src, (1,) * pad + _shape(src.type))
    dst = lw.view(dst, (1,) * pad + _shape(dst.type))
    src_off, dst_off = ([0] * pad + list(v) for v in (src_off, dst_off))
    extent = [1] * pad + list(extent)
    kb = KernelBuilder(lw.kernel_name(what), [src.type, dst.type], loc)
    _copy_nest(lw, kb, kb.args[0], src_off, kb.args[1], dst_off, extent, "buf")
    lw.launch(kb, [src, dst])


def lower_slice(lw, op: gi.SliceOp, loc: str) -> None:
    res = op.results[0]
    out_shape = _shape(res.type)
    dim, start, end, step = op._params()
    src = lw.materialise(op.input)
    shape = list(_shape(src.type))
    out = lw.hbm(out_shape, _elem(res.type))
    L = out_shape[dim]
    if _prod(out_shape) == 0:
        lw.values[res] = out
        return
    if step > 1 and L > 1:
        N = shape[dim]
        if N % step:
            # copy the span into a buffer padded to L * step along `dim`, then view it
            span = (L - 1) * step + 1
            padded = shape[:dim] + [L * step] + shape[dim + 1 :]
            tmp = lw.hbm(padded, _elem(res.type))
            ext = shape[:dim] + [span] + shape[dim + 1 :]
            off = [0] * len(shape)
            off[dim] = start
            _copy_kernel(lw, "slice_span", loc, src, off, tmp, [0] * len(shape), ext)
            src, shape, start, N = tmp, padded, 0, L * step
        # element start + j*step of dim = element (start//step + j, start%step) of [N/step, step]
        split = shape[:dim] + [N // step, step] + shape[dim + 1 :]
        src = lw.view(src, split)
        off = [0] * len(split)
        off[dim], off[dim + 1] = start // step, start % step
        ext = list(out_shape[:dim]) + [L, 1] + list(out_shape[dim + 1 :])
        dst = lw.view(out, ext)
        _copy_kernel(lw, "slice", loc, src, off, dst, [0] * len(ext), ext)
    else:
        off = [0] * len(shape)
        off[dim] = start
        _copy_kernel(lw, "slice", loc, src, off, out, [0] * len(shape), out_shape)
    lw.values[res] = out


def lower_concat(lw, op: gi.ConcatOp, loc: str) -> None:
    res = op.results[0]
    out_shape = _shape(res.type)
    dim = op.dim.value.data
    out = lw.hbm(out_shape, _elem(res.type))
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


def lower_gather_rows(lw, op: gi.GatherRowsOp, loc: str) -> None:
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
    TC = lw._col_tile(D, 2)
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


def lower_where(lw, op: gi.WhereOp, loc: str) -> None:
    res = op.results[0]
    shape = lw._out_shape2(_shape(res.type))
    c, x, y = op.operands
    if c in lw.scalars:  # a constant condition picks one side
        chosen = x if lw.scalars[c] != 0.0 else y
        operand = lw._aligned(chosen, shape)

        def copy(kb, bufs, ob, r, cc):
            kb.add(tile.UnaryOp("copy", bufs[0], ob, r, cc))

        out = lw.map_kernel("where", loc, shape, _elem(res.type), [operand], copy)
        lw.values[res] = lw.view(out, _shape(res.type))
        return
    sx = lw.scalars.get(x)
    sy = lw.scalars.get(y)
    tensors = [c] + [v for v, s in ((x, sx), (y, sy)) if s is None]
    operands = [lw._aligned(v, shape) for v in tensors]

    def compute(kb, bufs, ob, r, cc):
        TR, TC = _shape(ob.type)
        cb = bufs[0]
        rest = list(bufs[1:])
        t = kb.alloc([TR, TC], f32, tile.SRAM, "sel")
        if sx is None:
            kb.add(tile.BinaryOp("mask", rest.pop(0), cb, t, r, cc))
        else:
            kb.add(tile.ScalarOp("mask", cb, sx, t, r, cc, swap=True))
        nc = kb.alloc([TR, TC], f32, tile.SRAM, "other")
        kb.add(tile.ScalarOp("eq", cb, 0.0, nc, r, cc))
        if sy is None:
            kb.add(tile.BinaryOp("mask", rest.pop(0), nc, nc, r, cc))
        else:
            kb.add(tile.ScalarOp("mask", nc, sy, nc, r, cc, swap=True))
        kb.add(tile.BinaryOp("add", t, nc, ob, r, cc))

    out = lw.map_kernel("where", loc, shape, _elem(res.type), operands, compute)
    lw.values[res] = lw.view(out, _shape(res.type))


# ---------------------------------------------------------------------------
# Row-wise
# ---------------------------------------------------------------------------


def lower_log_softmax(lw, op: gi.LogSoftmaxOp, loc: str) -> None:
    res = op.results[0]
    shape = _shape(res.type)
    if op.axis != len(shape) - 1:
        raise CompileError(
            f"graph.log_softmax at {loc}: only the last dimension is supported, got dim {op.axis}"
        )
    x, R, C = lw._rows_view(op.input, loc, "graph.log_softmax")
    out = lw.hbm((R, C), _elem(res.type))
    TR = min(lw.P, R)
    kb = KernelBuilder(lw.kernel_name("log_softmax"), [x.type, out.type], loc)
    with kb.tiles(R, TR) as (r0, r):
        zero, cc, one = kb.const(0), kb.const(C), kb.const(1)
        xb = kb.alloc([TR, C], _elem(x.type), tile.SRAM, "x")
        kb.add(tile.LoadOp(kb.args[0], [r0, zero], xb, r, cc, 0, 1))
        mx = kb.alloc([TR, 1], f32, tile.SRAM, "max")
        kb.add(tile.ReduceOp("max", xb, mx, r, cc))
        s = kb.alloc([TR, C], f32, tile.SRAM, "shifted")
        kb.add(tile.BinaryOp("sub", xb, mx, s, r, cc, "column"))
        e = kb.alloc([TR, C], f32, tile.SRAM, "e")
        kb.add(tile.UnaryOp("exp", s, e, r, cc))
        sm = kb.alloc([TR, 1], f32, tile.SRAM, "sum")
        kb.add(tile.ReduceOp("sum", e, sm, r, cc))
        kb.add(tile.UnaryOp("log", sm, sm, r, one))
        ob = kb.alloc([TR, C], _elem(res.type), tile.SRAM, "out")
        kb.add(tile.BinaryOp("sub", s, sm, ob, r, cc, "column"))
        kb.add(tile.StoreOp(ob, kb.args[1], [r0, zero], r, cc, 0, 1))
    lw.launch(kb, [x, out])
    lw.values[res] = lw.view(out, shape)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def lower_sdpa(lw, op: gi.SdpaOp, loc: str) -> None:
    """The decomposition into graph ops (built detached, lowered, then erased)."""
    res = op.results[0]
    q, k, v = op.q, op.k, op.v
    et = _elem(res.type)
    dt = g.element_dtype(res.type)
    tmp: list[Operation] = []

    def add(o: Operation) -> SSAValue:
        g.set_loc(o, loc)
        tmp.append(o)
        lw.lower(o)
        return o.results[0]

    try:
        rank = len(_shape(k.type))
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        kt = add(g.PermuteOp.make(k, perm))
        s = add(g.MatmulOp.make(q, kt))
        scale = op.scale.value.data
        if scale != 1.0:
            s = add(g.MulOp.make(s, add(g.ConstantOp.make(np.float32(scale), dt))))
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


# ---------------------------------------------------------------------------
# Elementwise: the kernels of GraphToTile
# ---------------------------------------------------------------------------


def _unary(fn: str) -> Callable[[Any, Any, str], None]:
    return lambda lw, op, loc: lw.lower_unary(op, fn, loc)


def _binary(fn: str) -> Callable[[Any, Any, str], None]:
    return lambda lw, op, loc: lw.lower_binary(op, fn, loc)


LOWERINGS: dict[type, Callable[[Any, Any, str], None]] = {
    gi.GatherRowsOp: lower_gather_rows,
    gi.SliceOp: lower_slice,
    gi.ConcatOp: lower_concat,
    gi.AbsOp: _unary("abs"),
    gi.LogOp: _unary("log"),
    gi.ErfOp: _unary("erf"),
    gi.PowOp: _binary("pow"),
    gi.MinimumOp: _binary("min"),
    gi.EqOp: _binary("eq"),
    gi.NeOp: _binary("ne"),
    gi.LtOp: _binary("lt"),
    gi.LeOp: _binary("le"),
    gi.GtOp: _binary("gt"),
    gi.GeOp: _binary("ge"),
    gi.WhereOp: lower_where,
    gi.LogSoftmaxOp: lower_log_softmax,
    gi.SdpaOp: lambda lw, op, loc: _attention(lw, op, loc),
}


def _attention(lw, op, loc: str) -> None:
    """-O2: the flash-attention kernel of lower_attention.py (which falls back to
    `lower_sdpa` at -O0 and where it does not apply)."""
    from tilecc.passes.lower_attention import lower_attention

    lower_attention(lw, op, loc)


__all__ = ["LOWERINGS"]
