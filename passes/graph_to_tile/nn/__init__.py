"""lower-graph-to-tile for convolutional networks: convolution, pooling, resizing, padding
and reductions (the "nn" op family of `passes/graph_to_tile/registry.py`).

Layout of the windowed ops (convolution, pooling): channels on partitions, output
positions along the free dimension, the input as phase images (`geometry.py`, built by
`pad.py` / `phase_split.py`); activations between such ops may stay padded
(`state.py`, `layout.py`, `layout_plan.py`). A convolution is planned (`conv_plan.py`,
pure: problem -> plan) and then emitted by one of the kernels (`conv_gemm_o2.py`,
`conv_stem.py`, `conv_small.py`, `conv_gemm.py`, `conv_depthwise.py` on `window.py`),
with the elementwise ops after it fused into its epilogue (`epilogue.py`). Pooling
(`pool.py`), resizing (`resize.py`), constant padding (`pad.py`) and reductions
(`reduce.py`) are one kernel family each.

    %y = graph.conv2d %x, %w ... ; %r = graph.relu %y ; %p = graph.max_pool2d %r 3 2 1
      -> func.call @k0_conv2d_pad(%x, %xq)      (the image's phase images)
         func.call @k1_conv2d(%xq, %w, ..., %r)  (%y and %r: one kernel, %r stored padded)
         func.call @k2_max_pool2d_pad(...) ; func.call @k3_max_pool2d(...)
"""

from __future__ import annotations

import tilecc.ir.graph  # noqa: F401 (first: ir/graph.py imports graph_nn at its end)
from tilecc.ir import graph_nn as nn
from tilecc.passes.graph_to_tile.nn.conv import lower_conv2d
from tilecc.passes.graph_to_tile.nn.pad import lower_pad
from tilecc.passes.graph_to_tile.nn.pool import (
    lower_adaptive_avg_pool,
    lower_avg_pool,
    lower_max_pool,
)
from tilecc.passes.graph_to_tile.nn.reduce import lower_reduce
from tilecc.passes.graph_to_tile.nn.resize import lower_upsample

# each lowering takes its own op class (the registry dispatches on the class)
LOWERINGS = {
    nn.Conv2dOp: lower_conv2d,
    nn.MaxPool2dOp: lower_max_pool,
    nn.AvgPool2dOp: lower_avg_pool,
    nn.AdaptiveAvgPool2dOp: lower_adaptive_avg_pool,
    nn.UpsampleNearest2dOp: lower_upsample,
    nn.PadOp: lower_pad,
    **{cls: lower_reduce for cls in nn.REDUCE_OPS},
}
