"""Reductions (graph.sum / mean / amax / amin) over any set of dims.

One kernel per run of adjacent reduced dims (innermost first); each reduces the
middle dim of an ``[A, B, C]`` view: along the free dimension (`tile.reduce`) when the
reduced elements are innermost (C = 1), else by combining whole tiles while walking B:

    %y = graph.sum %x dims [1, 3] : [2, 5, 3, 7] -> [2, 3]
      -> k0_reduce_sum(%x as [30, 7, 1], %t [30, 1] f32):   tile.reduce "sum" per row tile
         k1_reduce_sum(%t as [2, 5, 3], %y [2, 3]):         tile.binary "add" over the 5 tiles

Few long rows (a loss's full sum) would leave all but a few partitions idle: each row is
spread over Bp partitions first (`_partition_split`), then its Bp partials reduced:

    %y = graph.sum %x dims [0, 1] : [512, 12288] -> []
      -> k0_reduce_sum(%x as [128, 49152, 1], %p [128, 1] f32)   one piece per partition
         k1_reduce_sum(%p as [1, 128, 1], %y [1, 1])             the 128 partials
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import graph_nn as nn
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    cdiv,
    lin,
    present,
    sram_budget,
    tiles,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.layout import natural_of_info
from tilecc.passes.graph_to_tile.nn.state import padded_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def lower_reduce(lw: LoweringContext, op: nn.ReduceOp, loc: str) -> None:
    """One kernel per run of adjacent reduced dims (innermost first); each reduces the
    middle dim of an ``[A, B, C]`` view."""
    x, res = op.input, op.results[0]
    shape = value_shape(x)
    axes = set(op.axes)
    fn = op.FN
    info = padded_of(lw, x)
    if info is not None:
        if fn in ("sum", "mean") and axes == {2, 3} and len(shape) == 4:
            # the zeros of the padding add nothing; a mean divides by H * W
            A = info.N * info.C
            outv = lw.hbm((A, 1), value_elem(res))
            _reduce_kernel(lw, loc, fn, lw.view(info.hbm, (A, info.L, 1)), outv, A, info.L, 1,
                           info.H * info.W if fn == "mean" else 1)
            lw.values[res] = lw.view(outv, value_shape(res))
            return
        x_nat = natural_of_info(lw, info, loc)
        lw.values[x] = x_nat
    # dims of size 1 do not matter; merge neighbours with the same role
    blocks: list[list[int]] = []  # [size, reduced]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        red = d in axes
        if blocks and blocks[-1][1] == red:
            blocks[-1][0] *= size
        else:
            blocks.append([size, red])
    cur = lw.materialise(x)
    out_elem = value_elem(res)
    nred = sum(1 for b in blocks if b[1])
    if nred == 0:
        if value_elem(cur) == out_elem:
            lw.values[res] = lw.view(cur, value_shape(res))
            return
    done = 0
    while True:
        idx = max((i for i, b in enumerate(blocks) if b[1]), default=None)
        if idx is None:
            # nothing (left) to reduce: a rounding copy, for a dtype change only
            n = math.prod(value_shape(cur))
            outv = lw.hbm((1, n), out_elem)
            _reduce_kernel(lw, loc, "copy", lw.view(cur, (1, 1, n)), outv, 1, 1, n, 1)
            cur = outv
            break
        A = math.prod(b[0] for b in blocks[:idx])
        B = blocks[idx][0]
        Cc = math.prod(b[0] for b in blocks[idx + 1:])
        done += 1
        last = done == nred
        outv = lw.hbm((A, Cc), out_elem if last else f32)
        _reduce_kernel(lw, loc, fn, lw.view(cur, (A, B, Cc)), outv, A, B, Cc, B if fn == "mean" else 1)
        cur = outv
        del blocks[idx]
        # merge the now-adjacent kept blocks
        merged: list[list[int]] = []
        for b in blocks:
            if merged and merged[-1][1] == b[1]:
                merged[-1][0] *= b[0]
            else:
                merged.append(list(b))
        blocks = merged
        if last:
            break
    lw.values[res] = lw.view(cur, value_shape(res))


def _reduce_kernel(
    lw: LoweringContext, loc: str, fn: str, x: SSAValue, out: SSAValue, A: int, B: int, Cc: int, div: int,
) -> None:
    """``out[a, c] = fn_b x[a, b, c]`` (`x` viewed [A, B, Cc], `out` [A, Cc]); mean divides by `div`."""
    elem, out_elem = value_elem(x), value_elem(out)
    combine = {"sum": "add", "mean": "add", "max": "max", "min": "min", "copy": "add"}[fn]
    rfn = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "copy": "sum"}[fn]
    budget = sram_budget(lw) // 2
    P = lw.P
    if Cc == 1 and fn != "copy":
        Bp = _partition_split(A, B, P)
        if Bp > 1:
            # few long rows: each row's elements spread over Bp partitions (a contiguous
            # row viewed [Bp, B / Bp]), reduced there, then the Bp partials per row
            part = lw.hbm((A * Bp, 1), f32)
            _reduce_kernel(lw, loc, "sum" if fn == "mean" else fn, lw.view(x, (A * Bp, B // Bp, 1)), part,
                           A * Bp, B // Bp, 1, 1)
            _reduce_kernel(lw, loc, fn, lw.view(part, (A, Bp, 1)), out, A, Bp, 1, div)
            return
    if Cc == 1:
        # the reduced elements along the free dimension, in chunks of BC
        TR = min(P, A)
        BC = max(1, min(B, budget // (element_size(elem) * 2)))
        nchunks = cdiv(B, BC)
        xv = lw.view(x, (A, B))
        ov = lw.view(out, (A, 1))
        k = HbmKernel(lw, f"reduce_{fn}", loc, [xv, ov])
        kb = k.kb
        one = kb.const(1)
        ntiles = cdiv(A, TR)
        if nchunks == 1 and 1 < ntiles <= _UNROLL_TILES and (ntiles + 1) * BC * element_size(elem) <= budget:
            # few row tiles of one chunk each (a CNN's global mean pool): each tile its own
            # buffers and DMA queues, so the loads, reductions and stores overlap (one
            # buffer set ran them one tile after another, ~8,000 cycles each on `cloud`)
            # (every load issued before the first store, so none queues behind one; the
            # stores from the last queue down: on the store queues alone it measured
            # 2,400 cycles worse on ResNet-18 224)
            nq = lw.cfg.dma.queues
            xts = [kb.alloc([TR, BC], elem, tile.SRAM, "x") for _ in range(ntiles)]
            rows = [(kb.const(min(TR, A - t * TR)), kb.const(t * TR)) for t in range(ntiles)]
            for t, (r, a0) in enumerate(rows):
                kb.add(tile.LoadOp(k.arg(xv), [a0, kb.const(0)], xts[t], r, kb.const(B), 0, 1, queue=t % nq))
            for t, (r, a0) in enumerate(rows):
                at = kb.alloc([TR, 1], f32, tile.SRAM, "acc")
                ot = kb.alloc([TR, 1], out_elem, tile.SRAM, "out")
                kb.add(tile.ReduceOp(rfn, xts[t], at, r, kb.const(B)))
                _finish(kb, fn, at, ot, r, one, div)
                kb.add(tile.StoreOp(ot, k.arg(ov), [a0, kb.const(0)], r, one, 0, 1, queue=nq - 1 - t % nq))
            k.launch()
            return
        xb = kb.alloc([TR, BC], elem, tile.SRAM, "x")
        accb = kb.alloc([TR, 1], f32, tile.SRAM, "acc")
        part = kb.alloc([TR, 1], f32, tile.SRAM, "part") if nchunks > 1 else None
        ob = kb.alloc([TR, 1], out_elem, tile.SRAM, "out")
        with tiles(kb, A, TR) as (_, a0, r):
            first = kb.const(min(BC, B))
            kb.add(tile.LoadOp(k.arg(xv), [a0, kb.const(0)], xb, r, first, 0, 1))
            kb.add(tile.ReduceOp(rfn, xb, accb, r, first))
            if nchunks > 1:
                part_b = present(part, "reduce's partial buffer")
                with kb.loop(nchunks - 1) as i:
                    b0 = lin(kb, BC, (BC, i))
                    bc = kb.const(BC) if B % BC == 0 else kb.mini(kb.const(BC), kb.subi(kb.const(B), b0))
                    kb.add(tile.LoadOp(k.arg(xv), [a0, b0], xb, r, bc, 0, 1))
                    kb.add(tile.ReduceOp(rfn, xb, part_b, r, bc))
                    kb.add(tile.BinaryOp(combine, accb, part_b, accb, r, one))
            _finish(kb, fn, accb, ob, r, one, div)
            kb.add(tile.StoreOp(ob, k.arg(ov), [a0, kb.const(0)], r, one, 0, 1))
        k.launch()
        return
    # whole tiles combined while walking the reduced dim
    xv, ov = x, out
    if A == 1 and Cc >= 2 * P:
        # spread the kept elements over the partitions: x [B, Cp, Cf], out [Cp, Cf]
        Cp = max(d for d in range(1, P + 1) if Cc % d == 0)
        if Cp > 1:
            xv, ov = lw.view(x, (B, Cp, Cc // Cp)), lw.view(out, (Cp, Cc // Cp))
            A, Cc = Cp, Cc // Cp
            rows_dim, red_dim = 1, 0
        else:
            rows_dim, red_dim = 0, 1
    else:
        rows_dim, red_dim = 0, 1
    TR = min(P, A)
    TCc = max(1, min(Cc, budget // (4 * 3)))
    k = HbmKernel(lw, f"reduce_{fn}", loc, [xv, ov])
    kb = k.kb
    xb = kb.alloc([TR, TCc], elem, tile.SRAM, "x")
    accb = kb.alloc([TR, TCc], f32, tile.SRAM, "acc")
    ob = kb.alloc([TR, TCc], out_elem, tile.SRAM, "out")
    with tiles(kb, A, TR) as (_, a0, r), tiles(kb, Cc, TCc) as (_, c0, cc):
        def idx(b: SSAValue) -> list[SSAValue]:
            ind: list[SSAValue] = [c0, c0, c0]
            ind[rows_dim], ind[red_dim] = a0, b
            return ind

        kb.add(tile.LoadOp(k.arg(xv), idx(kb.const(0)), accb if elem == f32 else xb, r, cc, rows_dim, 2))
        if elem != f32:
            kb.add(tile.UnaryOp("copy", xb, accb, r, cc))
        if B > 1:
            with kb.loop(B - 1) as b:
                kb.add(tile.LoadOp(k.arg(xv), idx(lin(kb, 1, (1, b))), xb, r, cc, rows_dim, 2))
                kb.add(tile.BinaryOp(combine, accb, xb, accb, r, cc))
        _finish(kb, fn, accb, ob, r, cc, div)
        kb.add(tile.StoreOp(ob, k.arg(ov), [a0, c0], r, cc, 0, 1))
    k.launch()


_UNROLL_TILES = 8  # row tiles of a one-chunk reduction unrolled with buffers of their own
SPLIT_MIN_ROW = 2048  # elements per row below which one row per partition is fast enough
SPLIT_MIN_PIECE = 256  # elements per partition of a split row (below: the second pass dominates)


def _partition_split(A: int, B: int, P: int) -> int:
    """Partitions to spread each of `A` rows of `B` reduced elements over: the largest
    divisor of B with A * Bp <= P and pieces of at least SPLIT_MIN_PIECE elements (1: no
    split, when the rows alone fill half the partitions, the rows are short, or B has no
    such divisor)."""
    if A * 2 > P or B < SPLIT_MIN_ROW:
        return 1
    for d in range(P // A, 1, -1):
        if B % d == 0 and B // d >= SPLIT_MIN_PIECE:
            return d
    return 1


def _finish(kb: KernelBuilder, fn: str, accb: SSAValue, ob: SSAValue, rows: SSAValue, cols: SSAValue, div: int) -> None:
    """The accumulator rounded into the output buffer (a mean divided by `div`)."""
    if fn == "mean" and div != 1:
        kb.add(tile.ScalarOp("div", accb, float(div), ob, rows, cols))
    else:
        kb.add(tile.UnaryOp("copy", accb, ob, rows, cols))


