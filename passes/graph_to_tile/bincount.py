"""graph.bincount: a one-hot compare on the vector engine, a column sum on the matrix engine.

The N input values (flattened) go on partitions, a tile of TK at a time (TK = the
array's rows); each compares its value with an iota row ``0 .. length-1`` (``tile.binary
"eq"`` with the value as a column: a one-hot row, all zeros for a value outside
``[0, length)``), and the matrix engine sums the one-hot rows weighted by a ones column
(or the weights column): ``acc[1, L] += w[TK, 1]^T @ onehot[TK, L]``, exact in the fp32
accumulator (counts up to 2**24). The length is walked in chunks of the array's columns.
Cost: N * L vector element cycles (the compare) and N * L MACs.

Before (graph)::

    %c = graph.bincount %x, %w length 8 : tensor<32xi32>, tensor<32xf32> -> tensor<8xf32>

After (tile)::

    func.func @k0_bincount(%x: memref<32x1xi32>, %w: memref<32x1xf32>, %iota: memref<8xf32>,
                           %out: memref<1x8xf32>) {
      scf.for %c0 ... {                                   // chunks of the length
        tile.load %iota[%c0] into %io ... row_dim -1      // the iota row on every partition
        scf.for %k0 ... {                                 // tiles of the values
          tile.load %x[%k0, 0] into %v; tile.load %w[%k0, 0] into %wt
          tile.binary "eq" %io, %v "column" into %oh
          tile.matmul %wt, %oh into %acc accumulate(%k0 != 0)
        }
        tile.unary "copy" %acc into %o; tile.store %o into %out[0, %c0]
    }}
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import Operation

from tilecc.errors import CompileError
from tilecc.ir import graph_routing as gr
from tilecc.ir import tile
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.nn.common import HbmKernel, const_hbm, fill, fill_row, tiles
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of


def lower_bincount(lw: LoweringContext, op: Operation, loc: str) -> None:
    if not isinstance(op, gr.BincountOp):
        raise CompileError(f"lower_bincount at {loc}: {op.name} is not a graph.bincount")
    res = op.results[0]
    L = op.length.value.data
    N = math.prod(shape_of(op.input.type))
    x = lw.view(lw.materialise(op.input), (N, 1))
    w = lw.view(lw.materialise(op.weights), (N, 1)) if op.weights is not None else None
    iota = const_hbm(lw, np.arange(L, dtype=np.float32), f32)
    ones = fill_row(lw, 1.0, f32, 1) if w is None else None
    out = lw.hbm((1, L), elem_of(res.type))
    args = [x, *([w] if w is not None else []), *([ones] if ones is not None else []), iota, out]
    kern = HbmKernel(lw, "bincount", loc, args)
    kb = kern.kb
    cfg = lw.cfg
    TK = min(cfg.matrix.rows, lw.P, N)
    TL = min(cfg.matrix.cols, cfg.accumulator.bytes_per_partition // 4, L)
    zero, one = kb.const(0), kb.const(1)
    wt = kb.alloc([TK, 1], elem_of(w.type) if w is not None else f32, tile.SRAM, "w")
    if ones is not None:  # a resident ones column
        fill(kb, wt, kb.const(TK), 1, kern.arg(ones))
    with tiles(kb, L, TL) as (_, c0, lc):
        io = kb.alloc([TK, TL], f32, tile.SRAM, "iota")
        kb.add(tile.LoadOp(kern.arg(iota), [c0], io, kb.const(TK), lc, -1, 0))
        acc = kb.alloc([1, TL], f32, tile.ACC, "acc")
        with tiles(kb, N, TK) as (_, k0, kk):
            v = kb.alloc([TK, 1], elem_of(x.type), tile.SRAM, "v")
            kb.add(tile.LoadOp(kern.arg(x), [k0, zero], v, kk, one, 0, 1))
            if w is not None:
                kb.add(tile.LoadOp(kern.arg(w), [k0, zero], wt, kk, one, 0, 1))
            oh = kb.alloc([TK, TL], elem_of(wt.type), tile.SRAM, "onehot")
            kb.add(tile.BinaryOp("eq", io, v, oh, kk, lc, "column"))
            kb.add(tile.MatmulOp(wt, oh, acc, one, kk, lc, kb.ne_zero(k0)))
        o = kb.alloc([1, TL], elem_of(res.type), tile.SRAM, "out")
        kb.add(tile.UnaryOp("copy", acc, o, one, lc))
        kb.add(tile.StoreOp(o, kern.arg(out), [zero, c0], one, lc, 0, 1))
    kern.launch()
    lw.values[res] = lw.view(out, shape_of(res.type))


LOWERINGS = {gr.BincountOp: lower_bincount}
