"""``aten.convolution`` beyond a batched 2-d convolution, rewritten onto ``graph.conv2d``.

- 1-d (``[N, C, L]``, weights ``[Co, Ci/g, K]``): a 2-d convolution of height 1,
  ``[N, C, 1, L]`` with ``[Co, Ci/g, 1, K]``, stride / padding / dilation ``(1, s)``,
  ``(0, p)``, ``(1, d)``; the reshapes are free views, so it runs the 2-d kernels.
- unbatched input (``[C, L]`` / ``[C, H, W]``): a batch of one.
- transposed (``conv_transpose1d/2d``): the direct form of the
  gradient of a strided convolution. The input is zero-interleaved (``graph.pad`` of a
  unit dim after each spatial dim, then a reshape: ``x[i]`` lands at ``s*i``), padded by
  ``d*(k-1) - p`` on each side (plus ``output_padding`` after; negative amounts crop),
  and convolved at stride 1 with the weights flipped in space and transposed per group
  (``w'[g, o, i] = w[g, i, o]``; at compile time, or for a run-time weight with a gather
  of the reversed taps and two permutes). The interleave costs ``s`` times the MACs of the
  direct form per spatial dim (the zero rows are multiplied), which is what it costs.

    %y = aten.convolution(%x: [1, 80, 300], %w: [384, 80, 3], stride [2], padding [1])
      -> %x4 = graph.reshape %x : [1, 80, 1, 300]
         %y4 = graph.conv2d %x4, %w4 stride [1, 2] padding [0, 1] : -> [1, 384, 1, 150]
         %y  = graph.reshape %y4 : [1, 384, 150]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.fx import Node
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_nn as nn
from tilecc.simulator.isa import DType


def convolution_nd(h: Any, node: Node, a: dict[str, Any]) -> SSAValue:
    """`h` is the aten_nn handler object (emit, x_of, known, new_weight, Unsupported)."""
    stride, padding, dilation = (list(a[k]) for k in ("stride", "padding", "dilation"))
    nd = len(stride)
    if nd not in (1, 2):
        raise h.Unsupported(f"{nd}-d convolution (tilecc: 1-d and 2-d)")
    groups = int(a["groups"])
    shape, dt = h.imp.out_meta(node)
    x = h.x_of(node, a["input"], dt)
    xs = g.shape_of(x)
    batched = len(xs) == nd + 2
    if len(xs) not in (nd + 1, nd + 2):
        raise h.Unsupported(f"a rank-{len(xs)} input of a {nd}-d convolution")
    x4 = h.emit(g.ReshapeOp.make(x, ([] if batched else [1]) + list(xs[: -nd]) + [1] * (2 - nd) + list(xs[-nd:])))
    lift = (lambda v, pad: [pad] * (2 - nd) + [int(t) for t in v])  # noqa: E731
    s2, p2, d2 = lift(stride, 1), lift(padding, 0), lift(dilation, 1)
    bias = h.imp.cast_to(h.imp.value(a["bias"]), dt) if a["bias"] is not None else None
    wdata = h.known(a["weight"])
    if a["transposed"]:
        y4 = _transposed(h, node, a, x4, wdata, bias, s2, p2, d2, groups, nd, dt)
    elif wdata is not None:
        w4 = wdata.reshape(*wdata.shape[:2], *([1] * (2 - nd)), *wdata.shape[2:])
        packed = h.packed_weight(a["weight"], w4, groups, dt)
        y4 = h.emit(nn.Conv2dOp.make(x4, packed, bias, s2, p2, d2, groups, "gihwo"))
    else:
        w = h.x_of(node, a["weight"], dt)
        ws = g.shape_of(w)
        w4 = h.emit(g.ReshapeOp.make(w, list(ws[:2]) + [1] * (2 - nd) + list(ws[2:])))
        y4 = h.emit(nn.Conv2dOp.make(x4, w4, bias, s2, p2, d2, groups, "oihw"))
    return h.emit(g.ReshapeOp.make(y4, list(shape)))


def _transposed(
    h: Any, node: Node, a: dict[str, Any], x4: SSAValue, wdata: Any, bias: SSAValue | None,
    s2: list[int], p2: list[int], d2: list[int], groups: int, nd: int, dt: Any,
) -> SSAValue:
    op2 = [0] * (2 - nd) + [int(t) for t in a["output_padding"]]
    if wdata is not None:
        w = wdata.float().numpy()  # [Ci, Co/g, *k]
        w = w.reshape(*w.shape[:2], *([1] * (2 - nd)), *w.shape[2:])
        ci, cog, kh, kw = w.shape
        wg = w.reshape(groups, ci // groups, cog, kh, kw).transpose(0, 2, 1, 3, 4)[:, :, :, ::-1, ::-1]
        wconv = np.ascontiguousarray(wg.reshape(groups * cog, ci // groups, kh, kw))
        name = f"{h.name_of(a['weight'], 'conv_transpose.weight')}.flipped"
        wv = h.new_weight(name, nn.pack_weight(wconv, groups), dt)
        layout = "gihwo"
    else:
        wv, (ci, cog, kh, kw) = _flipped_runtime_weight(h, node, a["weight"], groups, nd, dt)
        layout = "oihw"
    n, c, hh, ww = g.shape_of(x4)
    sh, sw = s2
    if sh > 1 or sw > 1:  # zero-interleave: x[i] at s*i
        x6 = h.emit(g.ReshapeOp.make(x4, [n, c, hh, 1, ww, 1]))
        x6 = h.emit(nn.PadOp.make(x6, [0] * 6, [0, 0, 0, sh - 1, 0, sw - 1]))
        x4 = h.emit(g.ReshapeOp.make(x6, [n, c, hh * sh, ww * sw]))
    low = [d * (k - 1) - p for d, k, p in zip(d2, (kh, kw), p2)]
    # the interleave's s - 1 trailing zeros are not part of the input: cropped here
    high = [lo + o - (s - 1) for lo, o, s in zip(low, op2, s2)]
    if any(low) or any(high):
        x4 = h.emit(nn.PadOp.make(x4, [0, 0, *low], [0, 0, *high]))
    return h.emit(nn.Conv2dOp.make(x4, wv, bias, 1, 0, d2, groups, layout))


def _flipped_runtime_weight(
    h: Any, node: Node, wa: Any, groups: int, nd: int, dt: Any,
) -> tuple[SSAValue, tuple[int, int, int, int]]:
    """A run-time ``[Ci, Co/g, *k]`` weight as the ``oihw`` weight of the equivalent
    convolution: transposed per group and flipped in space. Flipping both spatial dims
    reverses the flattened ``kh*kw`` order, one ``graph.gather_rows`` with reversed
    indices over taps moved to dim 0 (two permutes; the weight is small)."""
    w = h.x_of(node, wa, dt)
    ws = list(g.shape_of(w))
    ci, cog, kh, kw = ws[0], ws[1], *([1] * (2 - nd) + ws[2:])
    cig, taps = ci // groups, kh * kw
    w5 = h.emit(g.ReshapeOp.make(w, [groups, cig, cog, taps]))
    t = h.emit(g.PermuteOp.make(w5, [3, 0, 2, 1]))  # [taps, G, Co/g, Ci/g]
    rev = h.emit(g.ConstantOp.make(np.arange(taps - 1, -1, -1, dtype=np.float32), DType.I32))
    t = h.emit(gi.GatherRowsOp.make(t, rev))
    o = h.emit(g.PermuteOp.make(t, [1, 2, 3, 0]))  # [G, Co/g, Ci/g, taps]
    return h.emit(g.ReshapeOp.make(o, [groups * cog, cig, kh, kw])), (ci, cog, kh, kw)
