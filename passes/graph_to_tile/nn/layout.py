"""Padded activations: reading them (phase images, natural copies) and recording them.

A window op's input stored padded (`state.PadInfo`) is its own phase image for a
stride-1 window with the same padding; other consumers get a natural copy, made once
by an "unpad" kernel:

    %x = ... stored padded: hbm [1, 64, 58 * 58]    (x [1, 64, 56, 56] with a zero ring)
    phase_image(lw, x, geo(3x3, stride 1, pad 1))  -> tile.view %x [1, 64, 1, 3364]
    natural_of_info(lw, padded_of(lw, x), loc)     -> k7_unpad(%x, %x_nat): [1, 64, 56, 56]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation, SSAValue

from tilecc.passes.graph_to_tile.nn.common import value_elem
from tilecc.passes.graph_to_tile.nn.geometry import Geometry, PhaseSpec
from tilecc.passes.graph_to_tile.nn.pad import pad_kernel
from tilecc.passes.graph_to_tile.nn.state import PadInfo, padded_of, set_padded

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def check_absorbed(lw: LoweringContext, conv: Operation, fused: list[Operation], loc: str) -> None:
    """A padded value whose residual add was expected in `conv`'s epilogue but was not
    fused gets its natural copy, for the add kernel that reads it."""
    for add, v in lw.nn.absorb.pop(conv, []):
        if add not in fused:
            info = padded_of(lw, v)
            if info is not None:
                lw.values[v] = natural_of_info(lw, info, loc)


def phase_image(lw: LoweringContext, x: SSAValue, geo: Geometry, fill_value: float, loc: str, what: str) -> SSAValue:
    """HBM ``[N, C, phases, Hq * Wq]``: the phase images of the padded input `x`. An input
    stored padded (`PadInfo`) is its own phase image for a stride-1 window with the same
    padding; otherwise the phases are built from it (its padding ring included)."""
    info = padded_of(lw, x)
    if info is not None:
        if geo.s == (1, 1) and geo.p == (info.pt, info.pl) and geo.Wq == info.Wp and geo.Hq <= info.Hp:
            return lw.view(info.hbm, (geo.N, geo.C, 1, info.L))
        out = lw.hbm((geo.N, geo.C, geo.nph, geo.Hq * geo.Wq), value_elem(info.hbm))
        pad_kernel(
            lw, f"{what}_pad", loc, lw.view(info.hbm, (geo.N, geo.C, info.Hp, info.Wp)), out,
            PhaseSpec.of(geo, 0.0 if info.nonneg else fill_value, crop=(info.pt, info.pl)),
        )
        return out
    return _phase_image_natural(lw, x, geo, fill_value, loc, what)


def _phase_image_natural(
    lw: LoweringContext, x: SSAValue, geo: Geometry, fill_value: float, loc: str, what: str,
) -> SSAValue:
    """HBM ``[N, C, phases, Hq * Wq]``: the phase images of the padded input `x`."""
    src = lw.materialise(x)
    if geo.direct:
        return lw.view(src, (geo.N, geo.C, 1, geo.H * geo.W))
    out = lw.hbm((geo.N, geo.C, geo.nph, geo.Hq * geo.Wq), value_elem(src))
    pad_kernel(
        lw, f"{what}_pad", loc, lw.view(src, (geo.N, geo.C, geo.H, geo.W)), out, PhaseSpec.of(geo, fill_value),
    )
    return out


def natural_of_info(lw: LoweringContext, info: PadInfo, loc: str) -> SSAValue:
    """A natural-layout copy of a padded activation (made once)."""
    cache = lw.nn.natural_hbm
    if info.hbm not in cache:
        out = lw.hbm((info.N, info.C, info.H, info.W), value_elem(info.hbm))
        pad_kernel(
            lw, "unpad", loc, lw.view(info.hbm, (info.N, info.C, info.Hp, info.Wp)),
            lw.view(out, (info.N, info.C, 1, info.H * info.W)),
            PhaseSpec([(0, 0)], (1, 1), (-info.pt, -info.pl), info.H, info.W, 0.0),
        )
        cache[info.hbm] = out
    return cache[info.hbm]


def record_layout(lw: LoweringContext, res: SSAValue, pad: PadInfo | None, wanted: bool, loc: str) -> None:
    """After lowering: a padded result is recorded; if its users did not all ask for the
    padded layout (it was forced by a padded residual operand), the natural copy is what
    the others read."""
    if pad is None:
        return
    set_padded(lw, res, pad)
    if not wanted:
        lw.values[res] = natural_of_info(lw, pad, loc)
