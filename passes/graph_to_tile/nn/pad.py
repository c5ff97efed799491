"""Padding kernels: constant padding (graph.pad) and the phase images of windowed ops.

`pad_kernel` writes ``out[n, c, ph, i*Wq + j] = x[n, c, i*sh + a - pt, j*sw + b - pl]`` (the
fill value outside ``x``) for each stride phase ``(a, b)``; one phase and stride 1 is a
plain constant pad:

    %y = graph.pad %x low [0, 0, 1, 2] high [0, 0, 0, 1] value 0.5 : [2, 3, 5, 6] -> [2, 3, 6, 9]
      ->
    func.func @k0_pad(%x: memref<2x3x5x6xf32>, %xflat, %fill: memref<64xf32>, %out: memref<1x6x1x54xf32>)
      tile.load %fill -> %q (row broadcast)             // the padding, once
      scf.for %n, %c: tile.load %x rows -> %stage; tile.unary "copy" per row -> %q
                      tile.store %q -> %out[n, c, 0, 0]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from xdsl.ir import SSAValue

from tilecc.errors import TensorTooLargeError
from tilecc.ir import graph_nn as nn
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.nn.common import (
    ALIGN,
    HbmKernel,
    cdiv,
    fill,
    fill_row,
    lin,
    partition_bytes,
    present,
    sram_budget,
    sub,
    tiles,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.geometry import PhaseSpec
from tilecc.passes.graph_to_tile.nn.pad_boxes import lower_pad_boxes
from tilecc.passes.graph_to_tile.nn.phase_split import phase_split

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def pad_kernel(
    lw: LoweringContext, what: str, loc: str, x: SSAValue, out: SSAValue, spec: PhaseSpec,
) -> None:
    """``out[n, c, ph, i*Wq + j] = x[n, c, i*sh + a - pt, j*sw + b - pl]`` (or the fill value)
    for each phase ``(a, b)``; `x` is [N, C, H, W], `out` [N, C, len(phases), Hq*Wq].

    With a stride the phases take every other element of a row, which a DMA can only
    read element by element (one descriptor and one short chunk per element). At -O2
    the phases are instead picked out on the matrix engine (`_phase_split_*`); -O0
    keeps the strided DMAs."""
    phases, s, pad, Hq, Wq, fill_value = spec.phases, spec.s, spec.pad, spec.Hq, spec.Wq, spec.fill_value
    if s != (1, 1) and lw.opt_level >= 2:
        if phase_split(lw, what, loc, x, out, spec):
            return
    N, C, H, W = value_shape(x)
    elem = value_elem(x)
    isz = element_size(elem)
    (sh, sw), (pt, pl) = s, pad
    TC = min(lw.P, C)
    nph = len(phases)
    budget = sram_budget(lw) - 2 * ALIGN
    contiguous = sh == 1 and sw == 1
    stage_cols = H * W if contiguous else 0
    whole = nph * partition_bytes(Hq * Wq, isz) + partition_bytes(max(stage_cols, 1), isz) <= budget
    if whole:
        CR = Hq
    else:
        CR = budget // ((Wq + (W if contiguous else 0)) * isz)
        if CR < 1:
            raise TensorTooLargeError(
                f"{what} at {loc}: a padded row of {Wq} elements does not fit one SRAM partition"
            )
        CR = min(CR, Hq)
        stage_cols = CR * W if contiguous else 0
    fval = fill_row(lw, fill_value, elem, (Hq if whole else CR) * Wq)
    xflat = lw.view(x, (N, C, H * W))
    k = HbmKernel(lw, what, loc, [x, xflat, fval, out])
    kb = k.kb
    xa, xfa, fa, oa = (k.arg(v) for v in (x, xflat, fval, out))
    chunks = [(q0, min(Hq, q0 + CR)) for q0 in range(0, Hq, CR)]

    def interior(a: int, b: int, q0: int, q1: int) -> tuple[int, int, int, int, bool]:
        ilo = max(0, cdiv(pt - a, sh))
        ihi = min(Hq, (H - 1 + pt - a) // sh + 1)
        jlo = max(0, cdiv(pl - b, sw))
        jhi = min(Wq, (W - 1 + pl - b) // sw + 1)
        i0, i1 = max(ilo, q0), min(ihi, q1)
        full = i0 == q0 and i1 == q1 and jlo == 0 and jhi == Wq
        return i0, i1, jlo, jhi, full

    qbufs = (
        [kb.alloc([TC, Hq * Wq], elem, tile.SRAM, f"q{i}") for i in range(nph)]
        if whole else [kb.alloc([TC, CR * Wq], elem, tile.SRAM, "q")]
    )
    stage = kb.alloc([TC, stage_cols], elem, tile.SRAM, "stage") if stage_cols else None
    if whole:  # the padding positions are the same for every (n, c): fill once
        for pi, (a, b) in enumerate(phases):
            if not interior(a, b, 0, Hq)[4]:
                fill(kb, qbufs[pi], kb.const(TC), Hq * Wq, fa)
    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        for pi, (a, b) in enumerate(phases):
            for q0, q1 in chunks:
                qb = qbufs[pi] if whole else qbufs[0]
                i0, i1, jlo, jhi, full = interior(a, b, q0, q1)
                if not whole and not full:
                    fill(kb, qb, c, (q1 - q0) * Wq, fa)
                nr, nc = i1 - i0, jhi - jlo
                if nr > 0 and nc > 0:
                    h0 = i0 * sh + a - pt
                    w0 = jlo * sw + b - pl
                    if contiguous and nc == W and Wq == W:
                        dst = sub(kb, qb, 0, (i0 - q0) * Wq, [TC, nr * W])
                        kb.add(tile.LoadOp(xfa, [n, c0, kb.const(h0 * W)], dst, c, kb.const(nr * W), 1, 2))
                    elif contiguous:
                        stage_b = present(stage, "pad's staging buffer")
                        st = sub(kb, stage_b, 0, 0, [TC, nr * W])
                        kb.add(tile.LoadOp(xfa, [n, c0, kb.const(h0 * W)], st, c, kb.const(nr * W), 1, 2))
                        with kb.loop(nr) as r:
                            s_ = sub(kb, stage_b, 0, lin(kb, w0, (W, r)), [TC, nc])
                            d_ = sub(kb, qb, 0, lin(kb, (i0 - q0) * Wq + jlo, (Wq, r)), [TC, nc])
                            kb.add(tile.UnaryOp("copy", s_, d_, c, kb.const(nc)))
                    else:
                        with kb.loop(nr) as r:
                            d_ = sub(kb, qb, 0, lin(kb, (i0 - q0) * Wq + jlo, (Wq, r)), [TC, nc])
                            kb.add(tile.LoadOp(
                                xa, [n, c0, lin(kb, h0, (sh, r)), kb.const(w0)], d_, c, kb.const(nc),
                                1, 3, 1, sw,
                            ))
                rows = q1 - q0
                kb.add(tile.StoreOp(
                    sub(kb, qb, 0, 0, [TC, rows * Wq]), oa, [n, c0, kb.const(pi), kb.const(q0 * Wq)],
                    c, kb.const(rows * Wq), 1, 3,
                ))
    k.launch()


def lower_pad(lw: LoweringContext, op: nn.PadOp, loc: str) -> None:
    """graph.pad: constant padding of the last two dims is one stride-1 `pad_kernel`
    (a fill once, one DMA per row of the interior); other dims and modes are box copies
    (`pad_boxes.py`)."""
    x, res = op.input, op.results[0]
    shape, oshape = value_shape(x), value_shape(res)
    low, high = nn.int_tuple(op.low), nn.int_tuple(op.high)
    r = len(shape)
    if op.pad_mode != "constant" or any(low[d] or high[d] for d in range(max(0, r - 2))):
        lower_pad_boxes(lw, op, loc)
        return
    H, W = (shape[-2] if r >= 2 else 1), (shape[-1] if r >= 1 else 1)
    OH, OW = (oshape[-2] if r >= 2 else 1), (oshape[-1] if r >= 1 else 1)
    pt, pl = (low[-2] if r >= 2 else 0), (low[-1] if r >= 1 else 0)
    lead = math.prod(shape[:-2]) if r > 2 else 1
    out = lw.hbm(oshape, value_elem(res))
    if lead * OH * OW:
        x4 = lw.view(lw.materialise(x), (1, lead, H, W))
        pad_kernel(
            lw, "pad", loc, x4, lw.view(out, (1, lead, 1, OH * OW)),
            PhaseSpec([(0, 0)], (1, 1), (pt, pl), OH, OW, float(op.value.value.data)),
        )
    lw.values[res] = out
