"""Depthwise convolution (one input channel per group) on the vector engine.

Per tap, a per-partition column multiply of the slab by the tap's weight, accumulated
in fp32; the bias and the fused steps in the epilogue (`window.window_kernel`):

    graph.conv2d %x [1, 32, 20, 20], %w [32, 1, 3, 3] groups 32  ->
      k1_conv2d_dw(%x, %w, ..., %out):
        tile.load %w[c0, 0] -> %wbuf [TC, 9]
        per band: tile.binary "mul" %slab[off_t], %wbuf[:, t] {column} -> %tmp; "add" %acc, %tmp -> %acc
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    ALIGN,
    HbmKernel,
    lin,
    partition_bytes,
    sub,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.conv_plan import ConvIO, ConvProblem
from tilecc.passes.graph_to_tile.nn.window import (
    Bufs,
    WindowIO,
    WindowOps,
    window_kernel,
)

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def emit_conv_depthwise(lw: LoweringContext, prob: ConvProblem, io: ConvIO) -> None:
    """Depthwise (one input channel per group): per tap a per-partition column multiply."""
    op, loc, geo, G, mult, layout = io.op, io.loc, prob.geo, prob.G, prob.Co_g, prob.layout
    x, w, b = op.input, op.weight, op.bias
    elem = value_elem(x)
    out_elem = value_elem(op.results[0])
    T = len(geo.taps)
    wv = lw.materialise(w)
    # [G, mult * T] in tap-major (gihwo: t * mult + j) or multiplier-major (oihw: j * T + t) order
    wview = lw.view(wv, (G, T * mult))

    def wcol(kb: KernelBuilder, t: int, j: SSAValue) -> SSAValue:
        return lin(kb, t * mult, (1, j)) if layout == "gihwo" else lin(kb, t, (T, j))

    bview = lw.view(lw.materialise(b), (G * mult, 1)) if b is not None else None

    def weights_and_bias(kb: KernelBuilder, k: HbmKernel, c0: SSAValue, c: SSAValue, TC: int, bufs: Bufs) -> None:
        kb.add(tile.LoadOp(k.arg(wview), [c0, kb.const(0)], bufs["w"], c, kb.const(T * mult), 0, 1))

    def tap_op(kb: KernelBuilder, t: int, slab_sub: SSAValue, accv: SSAValue, rows: SSAValue, cols: SSAValue,
               bufs: Bufs, j: SSAValue) -> None:
        wc = sub(kb, bufs["w"], 0, wcol(kb, t, j), [value_shape(bufs["w"])[0], 1])
        if t == 0:
            kb.add(tile.BinaryOp("mul", slab_sub, wc, accv, rows, cols, "column"))
        else:
            tmp = bufs["tmp"]
            kb.add(tile.BinaryOp("mul", slab_sub, wc, tmp, rows, cols, "column"))
            kb.add(tile.BinaryOp("add", accv, tmp, accv, rows, cols))

    def compact_fn(kb: KernelBuilder, k: HbmKernel, bufs: Bufs, c0: SSAValue, j: SSAValue) -> Callable[..., None]:
        def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int) -> None:
            if bview is not None:
                kb.add(tile.LoadOp(k.arg(bview), [lin(kb, 0, (mult, c0), (1, j)), kb.const(0)], bufs["bias"],
                                   rows, kb.const(1), 0, -1, mult, 1))
                kb.add(tile.BinaryOp("add", s_, bufs["bias"], d_, rows, kb.const(cols), "column"))
            else:
                kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))
        return compact

    extra = [wview] + ([bview] if bview is not None else [])

    def extra_bufs(kb: KernelBuilder, TC: int, Lmax: int) -> Bufs:
        bufs = {"w": kb.alloc([TC, T * mult], elem, tile.SRAM, "w"), "tmp": kb.alloc([TC, Lmax], f32, tile.SRAM, "tmp")}
        if b is not None:
            bufs["bias"] = kb.alloc([TC, 1], value_elem(b), tile.SRAM, "bias")
        return bufs

    def extra_bytes(rb: int) -> int:
        return partition_bytes(T * mult, element_size(elem)) + partition_bytes(geo.lp(rb), 4) + ALIGN

    io_ = WindowIO(io.src, io.out, elem, out_elem, io.steps, mult, extra, io.pad)
    ops = WindowOps(tap_op, compact_fn, weights_and_bias, extra_bufs, extra_bytes)
    window_kernel(lw, loc, "conv2d_dw", geo, io_, ops)
