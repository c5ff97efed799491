"""Nearest-neighbour resizing (graph.upsample_nearest2d) on the vector engine.

Per channel tile the image is on chip; each output row is built from its source row
with one column-broadcast add of -0.0 (exact) per run of equal source columns, and
repeated output rows are copies:

    %y = graph.upsample_nearest2d %x scale 2 : [1, 17, 5, 6] -> [1, 17, 10, 12]
      -> k0_upsample_nearest2d(%x, %y, %zeros):
           tile.load %x -> %xb;  scf.for %i (5 rows) { scf.for %r (6 runs):
             tile.binary "add" %zeros[:, :2], %xb[:, 6i + r] {column} -> %ob[:, 24i + 2r]
           tile.unary "copy" %ob[row 2i] -> %ob[row 2i + 1] };  tile.store %ob -> %y
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import SSAValue

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir import graph_nn as nn
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    fill,
    fill_row,
    lin,
    partition_bytes,
    sram_budget,
    sub,
    tiles,
    value_elem,
    value_shape,
)

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def _runs(index: np.ndarray) -> list[tuple[int, int, int]]:
    """(source, first output, length) of the runs of equal source indices."""
    out: list[tuple[int, int, int]] = []
    for o, src in enumerate(index.tolist()):
        if out and out[-1][0] == src and out[-1][1] + out[-1][2] == o:
            out[-1] = (src, out[-1][1], out[-1][2] + 1)
        else:
            out.append((src, o, 1))
    return out


def _regular(runs: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """(source step, run length) when run i is (i * step, i * length, length)."""
    if not runs:
        return None
    L = runs[0][2]
    a = runs[1][0] if len(runs) > 1 else 1
    if all(r == (i * a, i * L, L) for i, r in enumerate(runs)):
        return a, L
    return None


_MAX_UNROLLED = 256


def lower_upsample(lw: LoweringContext, op: nn.UpsampleNearest2dOp, loc: str) -> None:
    """Per channel tile: the image on chip; each output row is built from its source row
    with one column-broadcast op per run of equal source columns, repeated rows are copies."""
    x, res = op.input, op.results[0]
    N, C, H, W = value_shape(x)
    _, _, OH, OW = value_shape(res)
    elem = value_elem(x)
    rmap, cmap = op.index_maps()
    rruns, cruns = _runs(rmap), _runs(cmap)
    rreg, creg = _regular(rruns), _regular(cruns)
    if (rreg is None and len(rruns) > _MAX_UNROLLED) or (creg is None and len(cruns) * (
        1 if rreg else len(rruns)
    ) > _MAX_UNROLLED):
        raise CompileError(
            f"graph.upsample_nearest2d at {loc}: a {H}x{W} -> {OH}x{OW} resize with a non-integer "
            "scale is too irregular to unroll"
        )
    TC = min(lw.P, C)
    maxl = max(r[2] for r in cruns)
    isz = element_size(elem)
    if partition_bytes(H * W, isz) + partition_bytes(OH * OW, isz) + partition_bytes(maxl, isz) > sram_budget(lw):
        raise TensorTooLargeError(
            f"graph.upsample_nearest2d at {loc}: a {OH}x{OW} output image does not fit one SRAM partition"
        )
    xv = lw.view(lw.materialise(x), (N, C, H * W))
    out = lw.hbm((N, C, OH, OW), elem)
    ov = lw.view(out, (N, C, OH * OW))
    zero = fill_row(lw, -0.0, elem, maxl)
    k = HbmKernel(lw, "upsample_nearest2d", loc, [xv, ov, zero])
    kb = k.kb
    xb = kb.alloc([TC, H * W], elem, tile.SRAM, "x")
    ob = kb.alloc([TC, OH * OW], elem, tile.SRAM, "out")
    zb = kb.alloc([TC, maxl], elem, tile.SRAM, "zero")
    fill(kb, zb, kb.const(TC), maxl, k.arg(zero))  # x + (-0.0) == x, bit for bit

    def expand_row(c: SSAValue, src_row: SSAValue, dst_row: SSAValue) -> None:
        def put(scol: SSAValue, ocol: SSAValue, length: int) -> None:
            kb.add(tile.BinaryOp(
                "add", sub(kb, zb, 0, 0, [TC, length]), sub(kb, xb, 0, scol, [TC, 1]),
                sub(kb, ob, 0, ocol, [TC, length]), c, kb.const(length), "column",
            ))

        if creg is not None:
            a, L = creg
            with kb.loop(len(cruns)) as i:
                put(lin(kb, 0, (W, src_row), (a, i)), lin(kb, 0, (OW, dst_row), (L, i)), L)
        else:
            for w0, o0, L in cruns:
                put(lin(kb, w0, (W, src_row)), lin(kb, o0, (OW, dst_row)), L)

    def repeat_row(c: SSAValue, dst_row: SSAValue, times: int) -> None:
        for t in range(1, times):
            kb.add(tile.UnaryOp(
                "copy", sub(kb, ob, 0, lin(kb, 0, (OW, dst_row)), [TC, OW]),
                sub(kb, ob, 0, lin(kb, t * OW, (OW, dst_row)), [TC, OW]), c, kb.const(OW),
            ))

    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        kb.add(tile.LoadOp(k.arg(xv), [n, c0, kb.const(0)], xb, c, kb.const(H * W), 1, 2))
        if rreg is not None:
            a, L = rreg
            with kb.loop(len(rruns)) as i:
                dst = lin(kb, 0, (L, i))
                expand_row(c, lin(kb, 0, (a, i)), dst)
                repeat_row(c, dst, L)
        else:
            for h0, o0, L in rruns:
                expand_row(c, kb.const(h0), kb.const(o0))
                repeat_row(c, kb.const(o0), L)
        kb.add(tile.StoreOp(ob, k.arg(ov), [n, c0, kb.const(0)], c, kb.const(OH * OW), 1, 2))
    k.launch()
    lw.values[res] = out


