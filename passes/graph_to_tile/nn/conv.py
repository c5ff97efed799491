"""graph.conv2d: plan the kernel, build the input's phase images, emit the kernel with
the fused epilogue.

The elementwise chain after the convolution (batch norm, residual add, activation)
runs in its epilogue (`epilogue.fuse_epilogue`); `layout_plan` decides whether the
output is stored padded for its consumers; `conv_plan.plan_conv` picks the kernel and
its tiling; one emitter builds it.

Before (graph)::

    %y = graph.conv2d %x, %w {stride = [1, 1], padding = [1, 1], groups = 1, layout = "gihwo"}
         : (tensor<1x64x56x56xbf16>, tensor<1x64x9x64xbf16>) -> tensor<1x64x56x56xbf16>
    %s = graph.mul %y, %bn_scale ; %t = graph.add %s, %bn_shift ; %r = graph.relu %t

After (tile, `cloud`)::

    func.func @k4_conv2d(%x: memref<1x64x1x3364xbf16>, %w: memref<1x64x9x64xbf16>, ...,
                         %out: memref<1x64x1x3364xbf16>) {      // %x, %out stored padded (58 x 58)
      tile.load %w[...] -> %weights (resident, pieces over the DMA queues)
      per band of rows:  tile.load %x[0, ci, 0, p0 + off] -> %slab
                         tile.matmul %weights[:, tap], %slab[:, off_tap + q] -> %acc   (every tap)
                         epilogue: "mul" %scale {column}, "add" %shift {column}, "relu", mask, store
    }
    func.call @k4_conv2d(...)          // %y, %s, %t, %r: one kernel
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tilecc.ir import graph_nn as nn
from tilecc.passes.graph_to_tile.nn.common import value_elem, value_shape
from tilecc.passes.graph_to_tile.nn.conv_depthwise import emit_conv_depthwise
from tilecc.passes.graph_to_tile.nn.conv_gemm import emit_conv_gemm
from tilecc.passes.graph_to_tile.nn.conv_gemm_o2 import emit_conv_gemm_o2
from tilecc.passes.graph_to_tile.nn.conv_plan import (
    ConvIO,
    GemmO2Plan,
    GemmPlan,
    SmallO2Plan,
    SmallPlan,
    StemO2Plan,
    conv_problem,
    plan_conv,
)
from tilecc.passes.graph_to_tile.nn.conv_small import (
    emit_conv_small,
    emit_conv_small_o2,
)
from tilecc.passes.graph_to_tile.nn.conv_stem import emit_conv_stem_o2
from tilecc.passes.graph_to_tile.nn.conv_stem_pool import lower_stem_pool
from tilecc.passes.graph_to_tile.nn.epilogue import finish_fusion, fuse_epilogue
from tilecc.passes.graph_to_tile.nn.geometry import Geometry
from tilecc.passes.graph_to_tile.nn.layout import (
    check_absorbed,
    natural_of_info,
    phase_image,
    record_layout,
)
from tilecc.passes.graph_to_tile.nn.layout_plan import (
    plan_output_layout,
    realise_output_layout,
)
from tilecc.passes.graph_to_tile.nn.state import padded_hbm, padded_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def lower_conv2d(lw: LoweringContext, op: nn.Conv2dOp, loc: str) -> None:
    res = op.results[0]
    N, Co, OH, OW = value_shape(res)
    steps, fused = fuse_epilogue(lw, op, Co)
    check_absorbed(lw, op, fused, loc)
    final = fused[-1].results[0] if fused else res
    prob = conv_problem(op, steps)
    if lower_stem_pool(lw, op, prob, steps, fused, final, loc):
        return
    layout = plan_output_layout(lw, final, steps, N, Co, OH, OW, wq=prob.geo.Wq)
    plan = plan_conv(lw.cfg, lw.opt_level, prob, layout.Wp if layout is not None else None, loc)
    g = prob.geo
    if layout is not None and g.Wq < layout.Wp and g.s != (1, 1) and padded_of(lw, op.input) is not None:
        # a strided window builds its phase images anyway: rows as wide as the padded
        # output's, so the banded kernel's accumulator rows line up with it (whole bands,
        # no row-by-row compaction; the floor rows apply). Not for the small-image kernel
        # (it compacts through a selection matmul either way: wider rows only cost)
        wide = replace(prob, geo=Geometry(g.N, g.C, g.H, g.W, g.OH, g.OW, g.k, g.s, g.p, g.d,
                                          wq_pad=layout.Wp - g.Wq))
        wplan = plan_conv(lw.cfg, lw.opt_level, wide, layout.Wp, loc)
        if wplan.kernel == "gemm_o2" and wplan.padded:
            prob, plan = wide, wplan
    pad, wanted = realise_output_layout(lw, layout if plan.padded else None, final, N, Co, OH, OW,
                                        value_elem(res), key=res)
    out = pad.hbm if pad is not None else lw.hbm((N, Co, OH, OW), value_elem(res))
    src = phase_image(lw, op.input, prob.geo, 0.0, loc, "conv2d")
    io = ConvIO(op, loc, src, steps, out, pad)
    s = plan.schedule
    if plan.kernel == "depthwise":
        emit_conv_depthwise(lw, prob, io)
    elif isinstance(s, SmallO2Plan):
        emit_conv_small_o2(lw, prob, s, io)
    elif isinstance(s, StemO2Plan):
        emit_conv_stem_o2(lw, prob, s, io)
    elif isinstance(s, GemmO2Plan):
        emit_conv_gemm_o2(lw, prob, s, io)
    else:
        # the -O0 kernels read natural rows (their output is never padded)
        for st in steps:
            info = padded_hbm(lw, st.value) if st.kind == "tile" else None
            if info is not None:
                st.value = natural_of_info(lw, info, loc)
        if isinstance(s, SmallPlan):
            emit_conv_small(lw, prob, s, io)
        else:
            assert isinstance(s, GemmPlan)
            emit_conv_gemm(lw, prob, s, io)
    finish_fusion(lw, op, fused, out)
    record_layout(lw, res, pad, wanted, loc)
