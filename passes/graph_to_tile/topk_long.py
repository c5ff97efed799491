"""graph.topk_indices of rows too long for one SRAM partition: k streaming passes.

Pass j finds the extreme among the elements that come strictly after the previous
winner in the order (value descending, index ascending): ``x < v_prev`` or ``x ==
v_prev and index > i_prev``. That needs no memory of the earlier winners but the last
one, so each pass streams the row from HBM in chunks of CH columns: per chunk, the
allowed elements (others -inf via ``mask + log``), its maximum and the lowest index
holding it, merged into the row's best so far (a later chunk replaces it only with a
strictly greater value, or when nothing was found yet: ties keep the lowest index).
Cost: k * C * ~16 vector element cycles per row and the row read k times from HBM
(argmax of an LM's vocabulary: one pass).

Before (graph)::

    %i = graph.topk_indices %x dim 1 k 1 largest true : tensor<2x5000xf32> -> tensor<2x1xi32>

After (tile)::

    func.func @k0_topk_long(%x, %iota: memref<5000xf32>, %hi: memref<64xf32>, ..., %out) {
      tile.load %hi[0] into %vprev ...; tile.load %neg1[0] into %iprev ...   // +inf, -1
      scf.for %j = 0 to 1 {
        tile.load %lo[0] into %best ...; tile.load %zero[0] into %found ...  // -inf, 0
        scf.for %c = 0 to 5 {                                               // chunks of 1000
          tile.load %x[%r0, %c0] into %v; tile.load %iota[%c0] into %io ... row_dim -1
          (allowed, mask + log, max, eq, min-reduce of the index, merge into best)
        }
        tile.store %bidx into %out[%r0, %j]; tile.unary "copy" %best into %vprev ...
    }}
"""

from __future__ import annotations

import math

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.errors import TensorTooLargeError
from tilecc.ir import tile
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import HbmKernel, const_hbm, fill, fill_row, sram_budget, tiles
from tilecc.passes.graph_to_tile.shapes import elem_of

MAX_STREAMED = 1 << 24  # k * C: a full sort of a 4096-element row; beyond, quadratic work is refused
CHUNK_BUFFERS = 6  # [TR, CH] buffers: values, iota, allowed, two scratch; the input's own


def chunk_columns(lw: LoweringContext, C: int) -> int:
    return max(1, min(C, sram_budget(lw) // (2 * (CHUNK_BUFFERS + 1) * 4)))


def topk_long_kernel(lw: LoweringContext, loc: str, x: SSAValue, R: int, C: int, k: int, largest: bool,
                     out: SSAValue) -> None:
    """`out[r, j]` = the index of the j-th extreme of row r of `x` ([R, C] HBM view)."""
    if C >= 1 << 24:
        raise TensorTooLargeError(f"graph.topk_indices at {loc}: a row of {C} elements: indices past 2**24 "
                                  "are not exact in the vector engine's fp32")
    if k * C > MAX_STREAMED:
        raise TensorTooLargeError(
            f"graph.topk_indices at {loc}: selecting {k} of a row of {C} elements (longer than an SRAM "
            f"partition holds with its buffers) streams the row {k} times ({k * C} element-passes, over the "
            f"{MAX_STREAMED} limit); a sort of a long row is not lowered (no merge sort across tiles): "
            "sort shorter rows, or select fewer (topk)"
        )
    CH = chunk_columns(lw, C)
    iota = const_hbm(lw, np.arange(C, dtype=np.float32), f32)
    consts = {v: fill_row(lw, v, f32, 1) for v in (math.inf, -math.inf, -1.0, 0.0)}
    args = [x, iota, *consts.values(), out]
    kern = HbmKernel(lw, "topk_long", loc, args)
    kb = kern.kb
    TR = min(lw.P, R)
    in_elem = elem_of(x.type)

    def buf(name: str, cols: int = CH) -> SSAValue:
        return kb.alloc([TR, cols], f32, tile.SRAM, name)

    xin = kb.alloc([TR, CH], in_elem, tile.SRAM, "xin") if in_elem != f32 else None
    v, io, ok, t1, t2 = buf("v"), buf("iota"), buf("allowed"), buf("t1"), buf("t2")
    col = {n: buf(n, 1) for n in ("vprev", "iprev", "best", "bidx", "m", "i", "any", "found", "g1", "g2")}
    o = kb.alloc([TR, 1], elem_of(out.type), tile.SRAM, "out")
    one = kb.const(1)

    def init(name: str, value: float, r: SSAValue) -> None:
        fill(kb, col[name], r, 1, kern.arg(consts[value]))

    with tiles(kb, R, TR) as (_, r0, r):
        init("vprev", math.inf, r)  # pass 0: every element comes after (+inf, -1)
        init("iprev", -1.0, r)
        with kb.loop(k) as j:
            init("best", -math.inf, r)
            init("found", 0.0, r)
            init("bidx", 0.0, r)
            with tiles(kb, C, CH) as (_, c0, cc):
                kb.add(tile.LoadOp(kern.arg(x), [r0, c0], xin if xin is not None else v, r, cc, 0, 1))
                if xin is not None or not largest:
                    kb.add(tile.UnaryOp("copy" if largest else "neg", xin if xin is not None else v, v, r, cc))
                kb.add(tile.LoadOp(kern.arg(iota), [c0], io, r, cc, -1, 0))
                _chunk(kb, v, io, ok, t1, t2, col, r, cc, float(C))
                _merge(kb, col, r, one)
            kb.add(tile.UnaryOp("copy", col["bidx"], o, r, one))
            kb.add(tile.StoreOp(o, kern.arg(out), [r0, j], r, one, 0, 1))
            kb.add(tile.UnaryOp("copy", col["best"], col["vprev"], r, one))
            kb.add(tile.UnaryOp("copy", col["bidx"], col["iprev"], r, one))
    kern.launch()


def _chunk(kb: KernelBuilder, v: SSAValue, io: SSAValue, ok: SSAValue, t1: SSAValue, t2: SSAValue,
           col: dict[str, SSAValue], r: SSAValue, cc: SSAValue, big: float) -> None:
    """The chunk's maximum among the allowed elements (`col["m"]`), the lowest index
    holding it (`col["i"]`, `big` when none) and whether any was allowed (`col["any"]`)."""

    def b(fn: str, lhs: SSAValue, rhs: SSAValue, dst: SSAValue, mode: str = "tile") -> None:
        kb.add(tile.BinaryOp(fn, lhs, rhs, dst, r, cc, mode))

    b("lt", v, col["vprev"], t1, "column")
    b("eq", v, col["vprev"], t2, "column")
    b("gt", io, col["iprev"], ok, "column")
    b("mul", t2, ok, ok)
    b("add", ok, t1, ok)  # x < v_prev, or x == v_prev past i_prev
    b("mask", v, ok, t1)
    kb.add(tile.UnaryOp("log", ok, t2, r, cc))  # 0, or -inf where not allowed
    b("add", t1, t2, t1)
    kb.add(tile.ReduceOp("max", t1, col["m"], r, cc))
    kb.add(tile.ReduceOp("max", ok, col["any"], r, cc))
    b("eq", t1, col["m"], t2, "column")
    b("mul", t2, ok, t2)  # the allowed maxima
    kb.add(tile.ScalarOp("sub", io, big, t1, r, cc))  # index - big < 0
    b("mul", t2, t1, t2)
    kb.add(tile.ReduceOp("min", t2, col["i"], r, cc))
    kb.add(tile.ScalarOp("add", col["i"], big, col["i"], r, kb.const(1)))


def _merge(kb: KernelBuilder, col: dict[str, SSAValue], r: SSAValue, one: SSAValue) -> None:
    """best, bidx <- the chunk's when its maximum is strictly greater, or when nothing
    was found before and the chunk allowed something; found |= any."""

    def b(fn: str, lhs: str, rhs: str, dst: str) -> None:
        kb.add(tile.BinaryOp(fn, col[lhs], col[rhs], col[dst], r, one))

    b("gt", "m", "best", "g1")
    kb.add(tile.ScalarOp("sub", col["found"], 1.0, col["g2"], r, one, swap=True))  # 1 - found
    b("mul", "g2", "any", "g2")
    b("max", "g1", "g2", "g1")  # take
    kb.add(tile.ScalarOp("sub", col["g1"], 1.0, col["g2"], r, one, swap=True))  # keep
    b("mask", "best", "g2", "best")
    b("mask", "m", "g1", "m")
    b("add", "best", "m", "best")
    b("mask", "bidx", "g2", "bidx")
    b("mask", "i", "g1", "i")
    b("add", "bidx", "i", "bidx")
    b("max", "found", "any", "found")
