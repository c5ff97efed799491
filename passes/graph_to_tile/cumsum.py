"""graph.cumsum: a triangular matmul per column block on the matrix engine, a carry
between blocks on the vector engine.

The summed dim is moved last (a transposing copy when it is not) and the tensor viewed
as rows ``[R, N]``. Per tile of TM rows, the row is walked in blocks of TN columns
(TN = the array's side): the block, loaded transposed (its columns on partitions), times
an upper-triangular ones constant ``U[k, n] = (k <= n)`` gives the block's running sums
in the fp32 accumulator; the vector engine adds the carry (the running sum up to the
block, a per-row column) and takes the block's last column as the next carry. Exact for
integers below 2**24 (fp32 accumulation). Cost: R * N * TN MACs, and R * N adds (+ a
rounding copy for 16-bit results) on the vector engine; the constant is TN x TN, not
N x N.

Before (graph)::

    %s = graph.cumsum %x dim 1 : tensor<4x40xf32> -> tensor<4x40xf32>

After (tile, `tiny`: TN = 16)::

    func.func @k0_cumsum(%x: memref<4x40xf32>, %u: memref<16x16xf32>, %zero: memref<64xf32>,
                         %out: memref<4x40xf32>) {
      tile.load %u[0, 0] into %tri ...; tile.load %zero[0] into %carry ... row_dim -1
      scf.for %b = 0 to 3 {                                 // column blocks, in order
        tile.load %x[0, %c0] into %xt ... row_dim 1 col_dim 0     // transposed
        tile.matmul %xt, %tri into %acc ... accumulate(false)
        tile.binary "add" %acc, %carry "column" into %s ...    // all 16 columns
        tile.unary "copy" %s[:, 15] into %carry ...; tile.store %s into %out[0, %c0] ...
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
from tilecc.passes.graph_to_tile.nn.common import HbmKernel, const_hbm, false_i1, fill, fill_row, sub, tiles
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of


def lower_cumsum(lw: LoweringContext, op: Operation, loc: str) -> None:
    if not isinstance(op, gr.CumsumOp):
        raise CompileError(f"lower_cumsum at {loc}: {op.name} is not a graph.cumsum")
    res = op.results[0]
    dim = op.dim.value.data
    shape = shape_of(res.type)
    rank = len(shape)
    src = lw.materialise(op.input)
    perm = [d for d in range(rank) if d != dim] + [dim]
    if perm != list(range(rank)):
        src = lw.permuted(src, perm, loc)
    moved = [shape[d] for d in perm]
    N = moved[-1]
    R = math.prod(moved[:-1])
    elem = elem_of(res.type)
    x = lw.view(src, (R, N))
    out = lw.hbm((R, N), elem)
    cfg = lw.cfg
    TN = min(cfg.matrix.rows, cfg.matrix.cols, cfg.accumulator.bytes_per_partition // 4, N)
    TM = min(lw.P, cfg.accumulator.partitions, R)
    upper = const_hbm(lw, np.triu(np.ones((TN, TN), dtype=np.float32)), elem)
    zero = fill_row(lw, 0.0, f32, 1)
    kern = HbmKernel(lw, "cumsum", loc, [x, upper, zero, out])
    kb = kern.kb
    tri = kb.alloc([TN, TN], elem, tile.SRAM, "tri")
    kb.add(tile.LoadOp(kern.arg(upper), [kb.const(0), kb.const(0)], tri, kb.const(TN), kb.const(TN), 0, 1))
    carry = kb.alloc([TM, 1], f32, tile.SRAM, "carry")
    one, full = kb.const(1), kb.const(TN)
    with tiles(kb, R, TM) as (_, r0, m):
        fill(kb, carry, m, 1, kern.arg(zero))
        with tiles(kb, N, TN) as (_, c0, n):
            xt = kb.alloc([TN, TM], elem, tile.SRAM, "xt")
            kb.add(tile.LoadOp(kern.arg(x), [r0, c0], xt, n, m, 1, 0))  # transposed: columns on partitions
            acc = kb.alloc([TM, TN], f32, tile.ACC, "acc")
            # all TN columns: past a partial block's n, a column of U sums the whole block,
            # so the last column is the block's total (the next carry) at a static index
            kb.add(tile.MatmulOp(xt, tri, acc, m, n, full, false_i1(kb)))
            s = kb.alloc([TM, TN], f32, tile.SRAM, "sums")
            kb.add(tile.BinaryOp("add", acc, carry, s, m, full, "column"))
            kb.add(tile.UnaryOp("copy", sub(kb, s, 0, TN - 1, [TM, 1]), carry, m, one))
            ob = s
            if elem != f32:
                ob = kb.alloc([TM, TN], elem, tile.SRAM, "out")
                kb.add(tile.UnaryOp("copy", s, ob, m, n))
            kb.add(tile.StoreOp(ob, kern.arg(out), [r0, c0], m, n, 0, 1))
    kern.launch()
    y = lw.view(out, moved)
    if perm != list(range(rank)):
        y = lw.permuted(y, list(np.argsort(perm)), loc)
    lw.values[res] = lw.view(y, shape)


LOWERINGS = {gr.CumsumOp: lower_cumsum}
