"""graph.topk_indices: selection by repeated extreme, whole rows on chip, one kernel.

The selected dim is moved last (a transposing copy when it is not), the tensor viewed
as rows ``[R, C]``; each tile of rows sits on partitions with its C elements along the
free dimension. `k` passes each find the row maximum, the lowest index holding it
(compare with the maximum, multiply by an iota row that is negative and zero where an
element was already taken, min-reduce), store that index, and knock the winner out
(``x = mask(x, ne) + log(ne)``: -inf at the winner, exact elsewhere). ``largest =
false`` negates the row first; ties go to the lowest index either way, which is
torch's ``sort(stable=True)`` / ``argmax`` order. Cost per row: about 12 vector element
cycles per element and pass (k * C * 12 on the lanes of a row tile); fine for
routing's small k and expert counts, quadratic for a full sort of a long row. A row
too long for one SRAM partition with its buffers streams from HBM instead, one pass
per selected element (`topk_long.py`).

Before (graph)::

    %i = graph.topk_indices %x dim 1 k 2 largest true : tensor<8x4xf32> -> tensor<8x2xi32>

After (tile)::

    func.func @k0_topk(%x: memref<8x4xf32>, %iota: memref<4xf32>, %out: memref<8x2xi32>) {
      tile.load %x[...] into %v ...; tile.load %iota[0] into %ifree ... row_dim -1
      scf.for %j = 0 to 2 {
        tile.reduce "max" %v into %m; tile.binary "eq" %v, %m "column" into %hit
        tile.binary "mul" %hit, %ifree into %hit; tile.reduce "min" %hit into %i
        tile.scalar "add" %i, 4.0 into %o; tile.store %o into %out[%r0, %j]
        tile.binary "ne" %iota, %i "column" into %keep; tile.binary "mul" %ifree, %keep ...
        tile.binary "mask" %v, %keep into %v; tile.unary "log" %keep ...; tile.binary "add" ...
    }}
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph_routing as gr
from tilecc.ir import tile
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.nn.common import HbmKernel, const_hbm, sram_budget, tiles
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.passes.graph_to_tile.topk_long import topk_long_kernel

_ROW_BUFFERS = 6  # fp32 row buffers: values, iota, free iota, hit, keep, log(keep); and the input's


def lower_topk_indices(lw: LoweringContext, op: Operation, loc: str) -> None:
    if not isinstance(op, gr.TopkIndicesOp):
        raise CompileError(f"lower_topk_indices at {loc}: {op.name} is not a graph.topk_indices")
    dim, k, largest = op.params
    res = op.results[0]
    shape = shape_of(op.input.type)
    rank = len(shape)
    src = lw.materialise(op.input)
    perm = [d for d in range(rank) if d != dim] + [dim]
    if perm != list(range(rank)):
        src = lw.permuted(src, perm, loc)
    moved = [shape[d] for d in perm]
    C = moved[-1]
    R = math.prod(moved[:-1])
    x = lw.view(src, (R, C))
    out = lw.hbm((R, k), elem_of(res.type))
    if 2 * (_ROW_BUFFERS + 1) * 4 * C <= sram_budget(lw):
        _whole_rows_kernel(lw, loc, x, R, C, k, largest, out)
    else:  # k passes streaming the row in chunks
        topk_long_kernel(lw, loc, x, R, C, k, largest, out)
    idx = lw.view(out, (*moved[:-1], k))
    if perm != list(range(rank)):
        idx = lw.permuted(idx, list(np.argsort(perm)), loc)
    lw.values[res] = lw.view(idx, shape_of(res.type))


def _whole_rows_kernel(lw: LoweringContext, loc: str, x: SSAValue, R: int, C: int, k: int, largest: bool,
                       out: SSAValue) -> None:
    """`out[r, j]` = the index of the j-th extreme of row r of `x` ([R, C]), rows on chip."""
    iota = const_hbm(lw, np.arange(C, dtype=np.float32) - C, f32)  # -C .. -1: the index minus C
    kern = HbmKernel(lw, "topk", loc, [x, iota, out])
    kb = kern.kb
    TR = min(lw.P, R)
    in_elem = elem_of(x.type)
    xin = kb.alloc([TR, C], in_elem, tile.SRAM, "xin") if in_elem != f32 else None
    v = kb.alloc([TR, C], f32, tile.SRAM, "v")
    io = kb.alloc([TR, C], f32, tile.SRAM, "iota")
    ifree = kb.alloc([TR, C], f32, tile.SRAM, "ifree")
    hit = kb.alloc([TR, C], f32, tile.SRAM, "hit")
    keep = kb.alloc([TR, C], f32, tile.SRAM, "keep")
    pen = kb.alloc([TR, C], f32, tile.SRAM, "pen")
    m = kb.alloc([TR, 1], f32, tile.SRAM, "max")
    i = kb.alloc([TR, 1], f32, tile.SRAM, "idx")
    o = kb.alloc([TR, 1], elem_of(out.type), tile.SRAM, "out")
    zero, one, cols = kb.const(0), kb.const(1), kb.const(C)
    with tiles(kb, R, TR) as (_, r0, r):
        kb.add(tile.LoadOp(kern.arg(x), [r0, zero], xin if xin is not None else v, r, cols, 0, 1))
        if xin is not None or not largest:
            kb.add(tile.UnaryOp("copy" if largest else "neg", xin if xin is not None else v, v, r, cols))
        kb.add(tile.LoadOp(kern.arg(iota), [zero], io, r, cols, -1, 0))
        kb.add(tile.UnaryOp("copy", io, ifree, r, cols))
        with kb.loop(k) as j:
            kb.add(tile.ReduceOp("max", v, m, r, cols))
            kb.add(tile.BinaryOp("eq", v, m, hit, r, cols, "column"))
            kb.add(tile.BinaryOp("mul", hit, ifree, hit, r, cols))  # -C + index where a free maximum
            kb.add(tile.ReduceOp("min", hit, i, r, cols))  # the lowest such index, minus C
            kb.add(tile.ScalarOp("add", i, float(C), o, r, one))
            kb.add(tile.StoreOp(o, kern.arg(out), [r0, j], r, one, 0, 1))
            if k > 1:  # knock the winner out for the next pass
                kb.add(tile.BinaryOp("ne", io, i, keep, r, cols, "column"))
                kb.add(tile.BinaryOp("mul", ifree, keep, ifree, r, cols))
                kb.add(tile.BinaryOp("mask", v, keep, v, r, cols))
                kb.add(tile.UnaryOp("log", keep, pen, r, cols))  # 0, or -inf at the winner
                kb.add(tile.BinaryOp("add", v, pen, v, r, cols))
    kern.launch()


LOWERINGS = {gr.TopkIndicesOp: lower_topk_indices}
