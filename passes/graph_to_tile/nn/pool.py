"""Pooling: max and average pooling (window kernels on the vector engine) and adaptive
average pooling (separable window sums).

    %y = graph.max_pool2d %x kernel 3 stride 2 pad 1 : [1, 64, 112, 112] -> [1, 64, 56, 56]
      -> k5_max_pool2d_pad(%x, %xq)      phase images, -inf outside (none when %x is stored
                                         padded and >= 0: its zero ring is the padding)
         k6_max_pool2d(%xq, ..., %y)     per tap: tile.binary "max" (see `window.py`)
    %z = graph.adaptive_avg_pool2d %y (1, 1)  ->  k7_adaptive_avg_pool2d: tile.reduce "sum"; tile.scalar "div"

A 3x3 / 2 max pool after an image stem convolution never reaches this module at -O2:
the convolution's lowering runs it in its own kernel (`conv_stem_pool.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import TensorTooLargeError
from tilecc.ir import graph_nn as nn
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    const_hbm,
    lin,
    partition_bytes,
    sram_budget,
    sub,
    tiles,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.geometry import Geometry
from tilecc.passes.graph_to_tile.nn.layout import phase_image, record_layout
from tilecc.passes.graph_to_tile.nn.layout_plan import (
    plan_output_layout,
    realise_output_layout,
)
from tilecc.passes.graph_to_tile.nn.state import padded_of
from tilecc.passes.graph_to_tile.nn.window import (
    Bufs,
    WindowIO,
    WindowOps,
    window_kernel,
)

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def lower_max_pool(lw: LoweringContext, op: nn.MaxPool2dOp, loc: str) -> None:
    """The max over every tap of the window (a -inf fill outside the input)."""
    kernel, stride, padding, dilation, _ = op.params
    x, res = op.input, op.results[0]
    N, C, H, W = value_shape(x)
    _, _, OH, OW = value_shape(res)
    geo = Geometry(N, C, H, W, OH, OW, kernel, stride, padding, dilation)
    src = phase_image(lw, x, geo, float("-inf"), loc, "max_pool2d")
    xinfo = padded_of(lw, x)
    plan = plan_output_layout(lw, res, [], N, C, OH, OW, nonneg=xinfo is not None and xinfo.nonneg)
    pad, wanted = realise_output_layout(lw, plan, res, N, C, OH, OW, value_elem(res))
    out = pad.hbm if pad is not None else lw.hbm((N, C, OH, OW), value_elem(res))
    ntaps = len(geo.taps)

    def tap_op(kb: KernelBuilder, t: int, slab_sub: SSAValue, accv: SSAValue, rows: SSAValue, cols: SSAValue,
               bufs: Bufs, j: SSAValue) -> None:
        if ntaps == 1:
            kb.add(tile.UnaryOp("copy", slab_sub, accv, rows, cols))
        elif t == 1:
            kb.add(tile.BinaryOp("max", bufs["first"], slab_sub, accv, rows, cols))
        elif t > 1:
            kb.add(tile.BinaryOp("max", accv, slab_sub, accv, rows, cols))
        else:
            bufs["first"] = slab_sub

    def compact_fn(kb: KernelBuilder, k: HbmKernel, bufs: Bufs, c0: SSAValue, j: SSAValue) -> Callable[..., None]:
        def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int) -> None:
            kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

        return compact

    window_kernel(lw, loc, "max_pool2d", geo, WindowIO(src, out, value_elem(x), value_elem(res), pad=pad),
                  WindowOps(tap_op, compact_fn))
    lw.values[res] = out
    record_layout(lw, res, pad, wanted, loc)


def lower_avg_pool(lw: LoweringContext, op: nn.AvgPool2dOp, loc: str) -> None:
    """The sum over the window divided by its divisor (zeros outside the input)."""
    kernel, stride, padding, ceil_mode, cip, divisor = op.params
    x, res = op.input, op.results[0]
    N, C, H, W = value_shape(x)
    _, _, OH, OW = value_shape(res)
    geo = Geometry(N, C, H, W, OH, OW, kernel, stride, padding, (1, 1))
    div = nn.avg_pool_divisors(H, W, OH, OW, kernel, stride, padding, cip, divisor)
    src = phase_image(lw, x, geo, 0.0, loc, "avg_pool2d")
    out = lw.hbm((N, C, OH, OW), value_elem(res))
    _avg_window(lw, loc, "avg_pool2d", geo, src, out, div, value_elem(x), value_elem(res))
    lw.values[res] = out


def _avg_window(lw: LoweringContext, loc: str, what: str, geo: Geometry, src: SSAValue, out: SSAValue,
                div: np.ndarray, elem: Attribute, out_elem: Attribute) -> None:
    """Sum of the taps, divided by `div` ([OH, OW] divisors; one immediate when uniform)."""
    ntaps = len(geo.taps)

    def tap_op(kb: KernelBuilder, t: int, slab_sub: SSAValue, accv: SSAValue, rows: SSAValue, cols: SSAValue,
               bufs: Bufs, j: SSAValue) -> None:
        if ntaps == 1:
            kb.add(tile.UnaryOp("copy", slab_sub, accv, rows, cols))
        elif t == 1:
            kb.add(tile.BinaryOp("add", bufs["first"], slab_sub, accv, rows, cols))
        elif t > 1:
            kb.add(tile.BinaryOp("add", accv, slab_sub, accv, rows, cols))
        else:
            bufs["first"] = slab_sub

    if np.all(div == div.flat[0]):
        dval = float(div.flat[0])

        def compact_fn(kb: KernelBuilder, k: HbmKernel, bufs: Bufs, c0: SSAValue, j: SSAValue) -> Callable[..., None]:
            def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int) -> None:
                kb.add(tile.ScalarOp("div", s_, dval, d_, rows, kb.const(cols)))

            return compact

        window_kernel(lw, loc, what, geo, WindowIO(src, out, elem, out_elem), WindowOps(tap_op, compact_fn))
        return
    dview = const_hbm(lw, div.astype(np.float32).reshape(-1), f32)

    def compact_fn_rows(kb: KernelBuilder, k: HbmKernel, bufs: Bufs, c0: SSAValue, j: SSAValue) -> Callable[..., None]:
        # divisors of the band, loaded once per band as a row-broadcast tile
        def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int, r: SSAValue | None = None) -> None:
            off = [(OW, bufs["oh0"])] + ([(OW, r)] if r is not None else [])
            dv = sub(kb, bufs["div"], 0, 0, [value_shape(bufs["div"])[0], cols])
            kb.add(tile.LoadOp(k.arg(dview), [lin(kb, 0, *off)], dv, rows, kb.const(cols), -1, 0))
            kb.add(tile.BinaryOp("div", s_, dv, d_, rows, kb.const(cols)))
        return compact

    OW = geo.OW

    def div_buf(kb: KernelBuilder, TC: int, Lmax: int) -> Bufs:
        return {"div": kb.alloc([TC, Lmax], f32, tile.SRAM, "div")}

    def div_bytes(rb: int) -> int:
        return partition_bytes(geo.lp(rb), 4)

    window_kernel(lw, loc, what, geo, WindowIO(src, out, elem, out_elem, extra_args=[dview]),
                  WindowOps(tap_op, compact_fn_rows, extra_bufs=div_buf, extra_bytes=div_bytes, row_aware=True))


def lower_adaptive_avg_pool(lw: LoweringContext, op: nn.AdaptiveAvgPool2dOp, loc: str) -> None:
    """Separable window sums on the vector engine: per channel tile the image is on chip;
    width windows are reduced row by row, then height windows, then divided by the counts."""
    x, res = op.input, op.results[0]
    N, C, H, W = value_shape(x)
    _, _, OH, OW = value_shape(res)
    elem, out_elem = value_elem(x), value_elem(res)
    rh, rw = nn.adaptive_windows(H, OH), nn.adaptive_windows(W, OW)
    counts = np.array([[(he - hs) * (we - ws) for ws, we in rw] for hs, he in rh], dtype=np.float32)
    TC = min(lw.P, C)
    S, OS = H * W, OH * OW
    need = (partition_bytes(S, element_size(elem)) + partition_bytes(OW * H, 4) + 2 * partition_bytes(OS, 4)
            + partition_bytes(OS, element_size(out_elem)))
    if need > sram_budget(lw):
        raise TensorTooLargeError(
            f"graph.adaptive_avg_pool2d at {loc}: a {H}x{W} image does not fit one SRAM partition"
        )
    xv = lw.view(lw.materialise(x), (N, C, S))
    out = lw.hbm((N, C, OH, OW), out_elem)
    ov = lw.view(out, (N, C, OS))
    uniform = bool(np.all(counts == counts.flat[0]))
    cv = None if uniform else const_hbm(lw, counts.reshape(-1), f32)
    k = HbmKernel(lw, "adaptive_avg_pool2d", loc, [xv, ov] + ([cv] if cv is not None else []))
    kb = k.kb
    xb = kb.alloc([TC, S], elem, tile.SRAM, "x")
    t1 = kb.alloc([TC, OW * H], f32, tile.SRAM, "rows")
    ob32 = kb.alloc([TC, OS], f32, tile.SRAM, "sums")
    ob = kb.alloc([TC, OS], out_elem, tile.SRAM, "out")
    db = None
    if cv is not None:
        db = kb.alloc([TC, OS], f32, tile.SRAM, "counts")
        kb.add(tile.LoadOp(k.arg(cv), [kb.const(0)], db, kb.const(TC), kb.const(OS), -1, 0))

    def red(src: SSAValue, col: int | SSAValue, n_: int, dst: SSAValue, dcol: int | SSAValue, rows: SSAValue) -> None:
        kb.add(tile.ReduceOp("sum", sub(kb, src, 0, col, [TC, n_]), sub(kb, dst, 0, dcol, [TC, 1]),
                             rows, kb.const(n_)))

    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        kb.add(tile.LoadOp(k.arg(xv), [n, c0, kb.const(0)], xb, c, kb.const(S), 1, 2))
        if OS == 1:
            red(xb, 0, S, ob32, 0, c)
        else:
            # width windows: t1[:, ow * H + h] = sum_w x[h, w in window(ow)]
            if W % OW == 0:
                f = W // OW
                with kb.loop(OW) as o, kb.loop(H) as h:
                    red(xb, lin(kb, 0, (W, h), (f, o)), f, t1, lin(kb, 0, (H, o), (1, h)), c)
            else:
                for o, (ws, we) in enumerate(rw):
                    with kb.loop(H) as h:
                        red(xb, lin(kb, ws, (W, h)), we - ws, t1, lin(kb, o * H, (1, h)), c)
            # height windows: sums[:, oh * OW + ow] = sum_h t1[:, ow * H + h in window(oh)]
            if H % OH == 0:
                f = H // OH
                with kb.loop(OH) as o, kb.loop(OW) as w_:
                    red(t1, lin(kb, 0, (H, w_), (f, o)), f, ob32, lin(kb, 0, (OW, o), (1, w_)), c)
            else:
                for o, (hs, he) in enumerate(rh):
                    with kb.loop(OW) as w_:
                        red(t1, lin(kb, hs, (H, w_)), he - hs, ob32, lin(kb, o * OW, (1, w_)), c)
        if db is None:
            kb.add(tile.ScalarOp("div", ob32, float(counts.flat[0]), ob, c, kb.const(OS)))
        else:
            kb.add(tile.BinaryOp("div", ob32, db, ob, c, kb.const(OS)))
        kb.add(tile.StoreOp(ob, k.arg(ov), [n, c0, kb.const(0)], c, kb.const(OS), 1, 2))
    k.launch()
    lw.values[res] = out


