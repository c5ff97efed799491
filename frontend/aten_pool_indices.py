"""``max_pool2d_with_indices`` with its indices used: a first-max-wins scan over the
window's taps, in graph ops the fuser makes one elementwise kernel of.

torch's CPU kernel scans each window row by row from ``maxval = -inf`` and
``maxindex`` = the window's first in-image position, taking a tap when
``val > maxval || isnan(val)``; padding positions are never visited. The same scan:

    xp   = graph.pad x (-inf; high enough for ceil_mode windows)
    v_t  = graph.slice xp (tap t = (i, j): rows i*dh :: sh, cols j*dw :: sw)   (views)
    best = -inf ; idx = first in-image position (a constant [OH, OW] table)
    for t in taps:  take = (v_t > best) | (v_t != v_t)
                    best = where(take, v_t, best) ; idx = where(take, idx_t, idx)

where ``idx_t`` is the constant table of tap t's flat input positions ``h * W + w``.
A padded tap reads -inf, which never beats ``best``, so it is never taken (and an
all -inf window keeps its first in-image position, like torch). Values and indices
equal eager exactly; indices are computed in fp32 (exact below 2**24 positions),
stored as int32 and returned as int64. Cost: three or four vector ops per tap and
output element, against one for the values alone (which keep the pooling kernel
when the indices are unused). An unbatched [C, H, W] input is a batch of one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_nn as nn
from tilecc.simulator.isa import DType


def _pair(v: Any) -> tuple[int, int]:
    vals = [int(t) for t in (v if isinstance(v, list | tuple) else [v])]
    return (vals[0], vals[0]) if len(vals) == 1 else (vals[0], vals[1])


def max_pool_with_indices(
    imp: Any, x: SSAValue, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
    dt: DType,
) -> tuple[SSAValue, SSAValue]:
    """(values in `dt`, indices as i32) of torch's max_pool2d_with_indices."""
    emit = imp.emit
    shape = list(g.shape_of(x))
    batched = len(shape) == 4
    x4 = x if batched else emit(g.ReshapeOp.make(x, [1, *shape]))
    n, c, h, w = g.shape_of(x4)
    (kh, kw), (ph, pw), (dh, dw) = _pair(kernel), _pair(padding), _pair(dilation)
    sh, sw = _pair(stride) if stride else (kh, kw)
    oh = nn.pool_out_size(h, kh, sh, ph, dh, ceil_mode)
    ow = nn.pool_out_size(w, kw, sw, pw, dw, ceil_mode)
    nn.MaxPool2dOp.make(x4, [kh, kw], [sh, sw], [ph, pw], [dh, dw], ceil_mode)  # validates like pooling
    hp = max(h + 2 * ph, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + 2 * pw, (ow - 1) * sw + (kw - 1) * dw + 1)
    xf = imp.cast_to(x4, DType.F32)
    xp = emit(nn.PadOp.make(xf, [0, 0, ph, pw], [0, 0, hp - h - ph, wp - w - pw], float("-inf")))
    rows = np.arange(oh)[:, None] * sh - ph  # the window's first row / column, per output
    cols = np.arange(ow)[None, :] * sw - pw

    def table(a: np.ndarray) -> SSAValue:
        return emit(g.ConstantOp.make(a.astype(np.float32), DType.F32))

    # the first in-image position of each window (torch's initial maxindex)
    r0 = np.where(rows < 0, rows + ((-rows + dh - 1) // dh) * dh, rows)
    c0 = np.where(cols < 0, cols + ((-cols + dw - 1) // dw) * dw, cols)
    idx = table(np.broadcast_to(r0 * w + c0, (oh, ow)))
    best = table(np.array(float("-inf")))
    for i in range(kh):
        for j in range(kw):
            r, q = i * dh, j * dw
            v = emit(gi.SliceOp.make(xp, 2, r, r + (oh - 1) * sh + 1, sh))
            v = emit(gi.SliceOp.make(v, 3, q, q + (ow - 1) * sw + 1, sw))
            take = emit(g.MaximumOp.make(emit(gi.GtOp.make(v, best)), emit(gi.NeOp.make(v, v))))
            best = emit(gi.WhereOp.make(take, v, best))
            idx = emit(gi.WhereOp.make(take, table(np.broadcast_to((rows + r) * w + cols + q, (oh, ow))), idx))
    values = imp.cast_to(best, dt)
    indices = emit(g.CastOp.make(idx, DType.I32))
    if not batched:
        values = emit(g.ReshapeOp.make(values, [c, oh, ow]))
        indices = emit(g.ReshapeOp.make(indices, [c, oh, ow]))
    return values, indices
