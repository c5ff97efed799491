"""lower-graph-to-tile for ``graph.index_scatter``: DMA scatters into an HBM tensor.

The result is the destination itself when the scatter may write it in place (its HBM
tensor is a whole intermediate or program input, not a view, a weight or a constant,
and the scatter is the only reader of the old value), else a copy of it (one DMA copy
kernel). With the destination viewed as ``[A, V, R]`` (dims before `dim`, `dim`, dims
after) and the source as ``[A, N, R]``:

- ``reduce "none"``: per tile of up to P indices, one DMA loads the i32 indices onto
  partitions, and per outer index a and column tile a DMA loads the source rows and an
  indirect store (``tile.scatter`` -> ``DMA_SCATTER``) writes them to rows
  ``index[r]`` of the table ``out[a]``. The scatters of one a run on one DMA queue, in
  order, so of duplicate indices the last wins (torch's CPU order); different a (their
  tables are disjoint: the KV heads of a prefill's cache update) use different queues.
  Where source row n of every a lies side by side (``[S, H*D]`` rows of a projection:
  `_heads_side_by_side`), one DMA loads a tile's rows of all A and each scatter writes
  a column window of it.
  With one index and several outer indices (a decode step writing position p of every
  batch and head's cache), the rows ``a*V + index[0]`` of the table ``[A*V, R]`` are
  written by one scatter per tile of P outer indices.
- ``sum`` / ``prod`` / ``amax`` / ``amin``: a read-modify-write per index, in index
  order, on one DMA queue: gather row ``a*V + index[n]`` of the table ``[A*V, R]``,
  combine it with source row n on the vector engine, scatter it back. The queue's
  order makes duplicates exact (each one reads the row its predecessor wrote). The
  one-hot matmul (``out += onehot(index)^T @ src``) would batch P indices per matmul,
  but only for sums, with fp32 accumulation instead of torch's per-add rounding and
  ``V x N x R`` MACs; the sequential form serves every reduction exactly.

Example (``cache[:, :, pos] = k``, in place)::

    %r = graph.index_scatter %cache, %pos, %k dim 2 reduce "none"
        : tensor<1x2x8x4xf32>, tensor<1xi32>, tensor<1x2x1x4xf32> -> tensor<1x2x8x4xf32>

becomes::

    func.func @k0_scatter(%src: memref<2x1x4xf32>, %idx: memref<1x1xi32>, %t: memref<2x8x4xf32>) {
      scf.for %a = %c0 to %c2 step %c1 {
        tile.load %idx[%c0, %c0] into %index sizes(%c1, %c1) ...
        tile.load %src[%a, %c0, %c0] into %rows sizes(%c1, %c4) ...
        tile.scatter %rows by %index into %t[%a, %c0] sizes(%c1, %c4) ...
      }
    }
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_scatter as gs
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.index import _copy_nest
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import dense_attr, elem_of, shape_of

_VECTOR_FN = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


def _prod(xs: Any) -> int:
    return int(np.prod(xs, dtype=np.int64)) if len(xs) else 1


def in_place(lw: LoweringContext, dest: SSAValue, hbm: SSAValue) -> bool:
    """Whether a scatter may write graph value `dest` (HBM tensor `hbm`) in place: the
    scatter is its only user and `hbm` is a whole intermediate or input allocation."""
    if not dest.has_one_use():
        return False
    alloc = hbm.owner
    if not isinstance(alloc, tile.HbmAllocOp):
        return False  # a view: its root may have other readers
    return alloc.weight is None and alloc.value is None and alloc.zeroed is None


def destination(lw: LoweringContext, op: gs.IndexScatterOp, loc: str) -> SSAValue:
    """The dense HBM tensor the scatter writes: the destination, or a copy of it."""
    hbm = lw.materialise(op.dest)
    if in_place(lw, op.dest, hbm):
        remarks.emit("lower-graph-to-tile", "passed", lambda: "scatter writes its destination in place", loc)
        return hbm
    shape = shape_of(op.dest.type)
    out = lw.hbm(shape, elem_of(op.dest.type))
    if _prod(shape) == 0:
        return out
    full = (1,) * max(0, 2 - len(shape)) + tuple(shape)
    src, dst = lw.view(hbm, full), lw.view(out, full)
    kb = KernelBuilder(lw.kernel_name("scatter_copy"), [src.type, dst.type], loc)
    _copy_nest(lw, kb, kb.args[0], [0] * len(full), kb.args[1], [0] * len(full), full, "copy")
    lw.launch(kb, [src, dst])
    return out


def lower_index_scatter(lw: LoweringContext, op: gs.IndexScatterOp, loc: str) -> None:
    res = op.results[0]
    dim, reduce = op.params()
    shape = shape_of(res.type)
    A, V, R = _prod(shape[:dim]), shape[dim], _prod(shape[dim + 1 :])
    N = shape_of(op.index.type)[0]
    out = destination(lw, op, loc)
    lw.values[res] = out
    if N == 0 or A * R == 0:
        return
    src = lw.view(lw.materialise(op.src), (A, N, R))
    start = _constant_range(op.index, V)
    if reduce == "none" and start is not None and _copy_row_range(lw, loc, src, out, (A, V, R), start, N):
        return
    idx = lw.view(lw.materialise(op.index), (N, 1))
    if reduce == "none" and N == 1 and A > 1:
        _scatter_one_index(lw, loc, lw.view(src, (A, R)), idx, lw.view(out, (A * V, R)), A, V, R)
    elif reduce == "none" and A > 1 and _heads_side_by_side(lw, src, A, R):
        _scatter_row_blocks(lw, loc, src, idx, lw.view(out, (A, V, R)), N, R)
    elif reduce == "none":
        _scatter_rows(lw, loc, src, idx, lw.view(out, (A, V, R)), N, R)
    else:
        _combine_rows(lw, loc, src, idx, lw.view(out, (A * V, R)), A, V, N, R, _VECTOR_FN[reduce])


def _scatter_rows(
    lw: LoweringContext, loc: str, src: SSAValue, idx: SSAValue, table: SSAValue, N: int, R: int
) -> None:
    """Per tile of up to P indices (loaded once), the rows of every outer index a. The
    tables of different a are disjoint, so they spread over Q DMA queues (a on queue
    a mod Q, Q the largest divisor of A up to the queue count): each a's scatters stay
    on one queue, in index order, so of duplicate indices the last still wins."""
    A = shape_of(table.type)[0]
    elem = elem_of(table.type)
    TR, TC = min(lw.P, N), lw.col_tile(R, 2)
    Q = max(q for q in range(1, min(A, lw.cfg.dma.queues) + 1) if A % q == 0)
    kb = KernelBuilder(lw.kernel_name("scatter"), [src.type, idx.type, table.type], loc)
    zero, one = kb.const(0), kb.const(1)
    with kb.tiles(N, TR) as (n0, r):
        ib = kb.alloc([TR, 1], i32, tile.SRAM, "index")
        kb.add(tile.LoadOp(kb.args[1], [n0, zero], ib, r, one, 0, 1))
        with kb.loop(A // Q) as a0:
            for j in range(Q):
                a = kb.addi(kb.muli(a0, kb.const(Q)), kb.const(j)) if Q > 1 else a0
                queue = lw.cfg.dma.queues - 1 - j  # the rows load on it too: no wait across queues
                with kb.tiles(R, TC) as (c0, c):
                    rows = kb.alloc([TR, TC], elem, tile.SRAM, "rows")
                    kb.add(tile.LoadOp(kb.args[0], [a, n0, c0], rows, r, c, 1, 2, queue=queue))
                    kb.add(tile.ScatterOp(rows, ib, kb.args[2], [a, c0], r, c, queue=queue))
    lw.launch(kb, [src, idx, table])


def _heads_side_by_side(lw: LoweringContext, src: SSAValue, A: int, R: int) -> bool:
    """Whether source row n of every outer index lies side by side in one row of A*R
    elements (the KV heads of a projection's or rope's ``[S, H*D]`` rows), small enough
    for a few SRAM buffers."""
    strides, _ = lw.layout(src)
    return strides[0] == R and strides[2] == 1 and A * R * element_size(elem_of(src.type)) <= 16384


def _scatter_row_blocks(
    lw: LoweringContext, loc: str, src: SSAValue, idx: SSAValue, table: SSAValue, N: int, R: int
) -> None:
    """`_scatter_rows` where source row n of every outer index a lies in one row of A*R
    elements: per tile of up to P indices one DMA loads the indices, one the rows of all
    A (``[TR, A*R]``), and A scatters write column windows of it (a on queue a mod Q)."""
    A = shape_of(table.type)[0]
    elem = elem_of(table.type)
    strides, offset = lw.layout(src)
    rows_view = lw.strided(src, (N, A * R), (strides[1], 1), offset)
    TR = min(lw.P, N)
    queues = lw.cfg.dma.queues
    kb = KernelBuilder(lw.kernel_name("scatter"), [rows_view.type, idx.type, table.type], loc)
    zero, one = kb.const(0), kb.const(1)
    with kb.tiles(N, TR) as (n0, r):
        ib = kb.alloc([TR, 1], i32, tile.SRAM, "index")
        kb.add(tile.LoadOp(kb.args[1], [n0, zero], ib, r, one, 0, 1))
        rows = kb.alloc([TR, A * R], elem, tile.SRAM, "rows")
        kb.add(tile.LoadOp(kb.args[0], [n0, zero], rows, r, kb.const(A * R), 0, 1))
        for a in range(A):
            part = kb.add(tile.SubviewOp(rows, zero, kb.const(a * R), [TR, R])).results[0]
            kb.add(tile.ScatterOp(part, ib, kb.args[2], [kb.const(a), zero], r, kb.const(R),
                                  queue=queues - 1 - a % queues))
    lw.launch(kb, [rows_view, idx, table])


def _constant_range(index: SSAValue, V: int) -> int | None:
    """n0 where the index is the compile-time range n0, n0+1, .., n0+N-1 inside the
    destination's V rows (a prefill's cache positions, folded to a constant by
    passes/graph/scatter_index.py), else None."""
    owner = index.owner
    if not isinstance(owner, g.ConstantOp):
        return None
    values = owner.values().reshape(-1).astype(np.int64)
    n0 = int(values[0]) if values.size else 0
    if values.size == 0 or n0 < 0 or n0 + values.size > V:
        return None
    return n0 if bool(np.all(values == np.arange(n0, n0 + values.size))) else None


def _copy_row_range(
    lw: LoweringContext, loc: str, src: SSAValue, out: SSAValue, dims: tuple[int, int, int], n0: int, N: int
) -> bool:
    """Rows n0..n0+N-1 of every outer index a written as block copies (False: not this
    case, the caller scatters). Where source row n of every a lies side by side (a
    projection's ``[S, H*D]`` rows: the KV heads of a prefill's cache update), partition
    m holds k consecutive rows, ``[k, A*R]`` in the source (one DMA when the rows follow
    each other, else one per row j) and ``[k, R]`` contiguous in each a's destination:
    the vector engine gathers each a's k rows side by side and one DMA per a stores them
    (runs of ``k*R`` elements instead of an indirect store of ``R``-element rows)."""
    A, V, R = dims
    elem = elem_of(src.type)
    isz = element_size(elem)
    strides, offset = lw.layout(src)
    budget = min(16384, lw.cfg.sram.bytes_per_partition // 8)
    fits = [d for d in range(1, N + 1) if N % d == 0 and d * A * R * isz <= budget]
    why = ("one outer index" if A < 2 else
           "the outer indices' rows are not side by side" if (strides[0] != R or strides[2] != 1
                                                             or strides[1] < A * R) else
           f"a row of the {A} outer indices is over {budget} bytes" if not fits else None)
    if why is not None:
        remarks.emit("lower-graph-to-tile", "missed", lambda: f"scatter of the constant rows {n0}..{n0 + N - 1} "
                     f"stays indirect stores: {why}", loc)
        return False
    k = next((d for d in fits if N // d <= lw.P), fits[-1])
    M, TR, queues = N // k, min(lw.P, N // k), lw.cfg.dma.queues
    rs = strides[1]  # between source rows: A*R when they follow each other, else one load per j
    rows_view = (lw.strided(src, (M, k * A * R), (k * A * R, 1), offset) if rs == A * R
                 else lw.strided(src, (M, k, A * R), (k * rs, rs, 1), offset))
    table = lw.view(out, (A, V, R))
    tstrides, base = lw.layout(table)
    dst_view = lw.strided(table, (A, M, k * R), (tstrides[0], k * R, 1), base + n0 * R)
    kb = KernelBuilder(lw.kernel_name("scatter_rows"), [rows_view.type, dst_view.type], loc)
    zero = kb.const(0)
    with kb.tiles(M, TR) as (m0, r):
        pieces: list[tuple[SSAValue, int]] = []  # (buffer, column) of each row j's [A*R] elements
        if rs == A * R:
            rows = kb.alloc([TR, k * A * R], elem, tile.SRAM, "rows")
            kb.add(tile.LoadOp(kb.args[0], [m0, zero], rows, r, kb.const(k * A * R), 0, 1))
            pieces = [(rows, j * A * R) for j in range(k)]
        for j in range(k if rs != A * R else 0):  # own buffers: row j's copies start once it is in
            buf = kb.alloc([TR, A * R], elem, tile.SRAM, "rows")
            kb.add(tile.LoadOp(kb.args[0], [m0, kb.const(j), zero], buf, r, kb.const(A * R), 0, 2,
                               queue=j % queues))
            pieces.append((buf, 0))
        for a in range(A):
            head = kb.alloc([TR, k * R], elem, tile.SRAM, "head_rows")
            for j, (buf, col) in enumerate(pieces):
                part = kb.add(tile.SubviewOp(buf, zero, kb.const(col + a * R), [TR, R])).results[0]
                dst = kb.add(tile.SubviewOp(head, zero, kb.const(j * R), [TR, R])).results[0]
                kb.add(tile.UnaryOp("copy", part, dst, r, kb.const(R)))
            kb.add(tile.StoreOp(head, kb.args[1], [kb.const(a), m0, zero], r, kb.const(k * R), 1, 2,
                                queue=queues - 1 - a % queues))
    lw.launch(kb, [rows_view, dst_view])
    remarks.emit("lower-graph-to-tile", "passed", lambda: (
        f"scatter of the constant rows {n0}..{n0 + N - 1}: block copies of {k} rows per partition "
        f"({A} outer indices side by side), no indirect stores"), loc)
    return True


def _scatter_one_index(
    lw: LoweringContext, loc: str, src: SSAValue, idx: SSAValue, table: SSAValue, A: int, V: int, R: int
) -> None:
    """One index (a decode step's cache position) for A outer rows: rows ``a*V + index[0]``
    of the table ``[A*V, R]``, up to P of them per scatter (the index broadcast to every
    partition by a stride-0 load, plus the constant offsets ``a*V``), instead of three
    DMAs per outer index."""
    elem = elem_of(table.type)
    TR, TC = min(lw.P, A), lw.col_tile(R, 2)
    offsets = np.arange(A, dtype=np.int64).reshape(A, 1) * V
    strides, base = lw.layout(idx)
    args = [src, lw.strided(idx, (A, 1), (0, 0), base), lw.hbm((A, 1), i32, value=dense_attr(offsets, i32, (A, 1))),
            table]
    kb = KernelBuilder(lw.kernel_name("scatter"), [x.type for x in args], loc)
    zero, one = kb.const(0), kb.const(1)
    with kb.tiles(A, TR) as (a0, r):
        ib = kb.alloc([TR, 1], i32, tile.SRAM, "index")
        kb.add(tile.LoadOp(kb.args[1], [a0, zero], ib, r, one, 0, 1))
        ob = kb.alloc([TR, 1], i32, tile.SRAM, "offset")
        kb.add(tile.LoadOp(kb.args[2], [a0, zero], ob, r, one, 0, 1))
        rb = kb.alloc([TR, 1], i32, tile.SRAM, "row_index")
        kb.add(tile.BinaryOp("add", ib, ob, rb, r, one))
        with kb.tiles(R, TC) as (c0, c):
            rows = kb.alloc([TR, TC], elem, tile.SRAM, "rows")
            kb.add(tile.LoadOp(kb.args[0], [a0, c0], rows, r, c, 0, 1))
            kb.add(tile.ScatterOp(rows, rb, kb.args[3], [c0], r, c))
    lw.launch(kb, args)


def _combine_rows(
    lw: LoweringContext, loc: str, src: SSAValue, idx: SSAValue, table: SSAValue,
    A: int, V: int, N: int, R: int, fn: str,
) -> None:
    """Read-modify-write of one row per index, in order, gather and scatter on one queue."""
    elem = elem_of(table.type)
    TC = lw.col_tile(R, 3)
    queue = lw.cfg.dma.queues - 1  # the scatters' queue: each gather follows the last scatter
    args = [src, idx, table]
    if A > 1:  # row a*V + index[n] of the table [A*V, R]: the offsets a*V as a constant column
        offsets = np.arange(A, dtype=np.int64).reshape(A, 1) * V
        args.append(lw.hbm((A, 1), i32, value=dense_attr(offsets, i32, (A, 1))))
    kb = KernelBuilder(lw.kernel_name(f"scatter_{fn}"), [a.type for a in args], loc)
    zero, one = kb.const(0), kb.const(1)
    with kb.loop(A) as a:
        offset = None
        if A > 1:
            offset = kb.alloc([1, 1], i32, tile.SRAM, "offset")
            kb.add(tile.LoadOp(kb.args[3], [a, zero], offset, one, one, 0, 1))
        with kb.loop(N) as n:
            ib = kb.alloc([1, 1], i32, tile.SRAM, "index")
            kb.add(tile.LoadOp(kb.args[1], [n, zero], ib, one, one, 0, 1))
            row_index = ib
            if offset is not None:
                row_index = kb.alloc([1, 1], i32, tile.SRAM, "row_index")
                kb.add(tile.BinaryOp("add", ib, offset, row_index, one, one))
            with kb.tiles(R, TC) as (c0, c):
                row = kb.alloc([1, TC], elem, tile.SRAM, "row")
                kb.add(tile.GatherOp(kb.args[2], c0, row_index, row, one, c, queue=queue))
                part = kb.alloc([1, TC], elem, tile.SRAM, "src")
                kb.add(tile.LoadOp(kb.args[0], [a, n, c0], part, one, c, 1, 2))
                new = kb.alloc([1, TC], elem, tile.SRAM, "combined")
                kb.add(tile.BinaryOp(fn, row, part, new, one, c))
                kb.add(tile.ScatterOp(new, row_index, kb.args[2], [c0], one, c, queue=queue))
    lw.launch(kb, args)


LOWERINGS: dict[type, Callable[[Any, Any, str], None]] = {
    gs.IndexScatterOp: lower_index_scatter,
}

__all__ = ["LOWERINGS", "in_place"]
