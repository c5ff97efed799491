"""graph.rms_norm with few rows (a decode step): each row spread over k partitions,
the row's sum of squares gathered across them by one matmul on the matrix engine.

The row-wise kernel (`rowwise.py`) keeps a whole row in one partition, so a decode
step's single row of 2,048 runs every vector pass on one lane (2,048 vector cycles a
pass). Here the R rows, viewed ``[R*k, C/k]`` (row r's chunk j on partition r*k + j),
take C/k cycles a pass: per partition the partial sum of squares (a column), then
``G @ partial`` with ``G`` the block-diagonal ones ``[R*k, R*k]`` (``G[p, q] = 1`` when
p and q hold the same row) gives every partition its row's total in the accumulator,
already broadcast; the vector engine takes ``rsqrt(total / C + eps)``, scales the
chunk, rounds it (Llama's order) and multiplies by the weight's chunk (loaded once per
row). fp32 throughout (the partials and G are fp32 matmul operands: the sum is exact
fp32 addition of the partials). Used when C splits into k >= 8 chunks with R*k within
the array and the accumulator (`split_of`); otherwise the row-wise kernel.

Before (graph)::

    %y = graph.rms_norm %x, %w eps 1e-05 cast_before_weight : tensor<1x1x2048xbf16>, tensor<2048xbf16> -> ...

After (tile, cloud: k = 128, C/k = 16)::

    func.func @k0_rms_norm(%x: memref<128x16xbf16>, %w: memref<128x16xbf16>, %g: memref<128x128xf32>,
                           %out: memref<128x16xbf16>) {
      tile.load %x ...; tile.load %w ...; tile.load %g ...
      tile.unary "square" %xb into %sq; tile.reduce "sum" %sq into %part      // [128, 1]
      tile.matmul %g, %part into %acc sizes(128, 128, 1)                     // row totals
      tile.scalar "mul" %acc, 1/C; tile.scalar "add" eps; tile.unary "rsqrt"
      tile.binary "mul" %xb, %ms "column" into %n; tile.binary "mul" %n, %wb into %o
      tile.store %o into %out ...
    }
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.graph_fusion import outer_value
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import HbmKernel, const_hbm, false_i1, sub
from tilecc.passes.graph_to_tile.shapes import elem_of

MIN_CHUNKS = 8  # below this many partitions per row the row-wise kernel is as good


def split_of(lw: LoweringContext, R: int, C: int) -> int | None:
    """k, the partitions each row spreads over, or None when the rows do not split."""
    cfg = lw.cfg
    side = min(lw.P, cfg.matrix.rows, cfg.accumulator.partitions)
    k = side // max(R, 1)
    while k >= MIN_CHUNKS and C % k:
        k -= 1
    if k < MIN_CHUNKS:
        return None
    F = C // k
    if 4 * F * 8 > cfg.sram.bytes_per_partition:
        return None
    return k


def lower_rms_norm_split(lw: LoweringContext, op: g.RmsNormOp, x: SSAValue, R: int, C: int, k: int,
                         loc: str) -> None:
    """`op` over the rows of HBM view `x` ([R, C]) as one kernel with rows split k ways."""
    res = op.results[0]
    elem = elem_of(res.type)
    xv, wv, gmat = split_operands(lw, op, x, R, C, k)
    RK, F = R * k, C // k
    out = lw.hbm((RK, F), elem)
    kern = HbmKernel(lw, "rms_norm", loc, [xv, wv, gmat, out])
    kb = kern.kb
    ob = kb.alloc([RK, F], elem, tile.SRAM, "out")
    emit_split_norm(kb, op, kern.arg(xv), kern.arg(wv), kern.arg(gmat), R, C, k, ob)
    z, rk, f = kb.const(0), kb.const(RK), kb.const(F)
    kb.add(tile.StoreOp(ob, kern.arg(out), [z, z], rk, f, 0, 1))
    kern.launch()
    lw.values[res] = lw.view(out, g.shape_of(res))


def split_operands(lw: LoweringContext, op: g.RmsNormOp, x: SSAValue, R: int, C: int,
                   k: int) -> tuple[SSAValue, SSAValue, SSAValue]:
    """The kernel's HBM operands: x viewed ``[R*k, C/k]``, the weight ``[k, C/k]`` and
    the block-diagonal ones ``G``."""
    F, RK = C // k, R * k
    xv = lw.view(x, (RK, F))
    wv = lw.view(lw.materialise(op.operands[1]), (k, F))
    rows = np.arange(RK) // k
    gmat = const_hbm(lw, (rows[:, None] == rows[None, :]).astype(np.float32), f32)
    return xv, wv, gmat


def emit_split_norm(kb: KernelBuilder, op: g.RmsNormOp, x_arg: SSAValue, w_arg: SSAValue, g_arg: SSAValue,
                    R: int, C: int, k: int, dst: SSAValue, *, queue: int | None = None,
                    const_queue: int | None = None) -> None:
    """The norm of the R rows (`x_arg` ``[R*k, C/k]``) into the on-chip buffer `dst`
    (``[R*k, C/k]``, the result's dtype): the module docstring's body without its store.
    `queue` takes the x load, `const_queue` the weight and ``G`` (default: the loads'
    default queue), which no earlier kernel writes."""
    res = op.results[0]
    elem, in_elem = elem_of(res.type), elem_of(op.operands[0].type)
    w_elem = elem_of(op.operands[1].type)
    F, RK = C // k, R * k
    z, one, rk, f = kb.const(0), kb.const(1), kb.const(RK), kb.const(F)
    cq = {} if const_queue is None else {"queue": const_queue}
    xb = kb.alloc([RK, F], in_elem, tile.SRAM, "x")
    kb.add(tile.LoadOp(x_arg, [z, z], xb, rk, f, 0, 1, **({} if queue is None else {"queue": queue})))
    gb = kb.alloc([RK, RK], f32, tile.SRAM, "rowsum")
    kb.add(tile.LoadOp(g_arg, [z, z], gb, rk, rk, 0, 1, **cq))
    ones = ones_weight(op)  # folded into the matmuls after it (fold-norm-weight): no load, no multiply
    if not ones:
        wb = kb.alloc([RK, F], w_elem, tile.SRAM, "w")
        for r in range(R):  # the weight's chunks beside each row's
            kb.add(tile.LoadOp(w_arg, [z, z], sub(kb, wb, r * k, 0, [k, F]), kb.const(k), f, 0, 1, **cq))
    sq = kb.alloc([RK, F], f32, tile.SRAM, "sq")
    part = kb.alloc([RK, 1], f32, tile.SRAM, "part")
    kb.add(tile.UnaryOp("square", xb, sq, rk, f))
    kb.add(tile.ReduceOp("sum", sq, part, rk, f))
    acc = kb.alloc([RK, 1], f32, tile.ACC, "total")
    kb.add(tile.MatmulOp(gb, part, acc, rk, rk, one, false_i1(kb)))
    ms = kb.alloc([RK, 1], f32, tile.SRAM, "rstd")
    kb.add(tile.ScalarOp("mul", acc, 1.0 / C, ms, rk, one))
    kb.add(tile.ScalarOp("add", ms, op.eps_value, ms, rk, one))
    kb.add(tile.UnaryOp("rsqrt", ms, ms, rk, one))
    if ones:  # x * rstd rounded once to the result type, as n * 1 would be
        kb.add(tile.BinaryOp("mul", xb, ms, dst, rk, f, "column"))
        return
    n = kb.alloc([RK, F], elem if op.weight_after_cast else f32, tile.SRAM, "normed")
    kb.add(tile.BinaryOp("mul", xb, ms, n, rk, f, "column"))
    kb.add(tile.BinaryOp("mul", n, wb, dst, rk, f))


def ones_weight(op: g.RmsNormOp) -> bool:
    """Whether the norm's weight is a constant of ones (fold-norm-weight leaves one where
    it folded the weight into the matmuls after the norm)."""
    owner = outer_value(op.operands[1]).owner  # inside fusion groups (nested): the group's operand
    return isinstance(owner, g.ConstantOp) and bool(np.all(owner.values() == 1.0))


__all__ = ["MIN_CHUNKS", "emit_split_norm", "lower_rms_norm_split", "ones_weight", "split_of", "split_operands"]
