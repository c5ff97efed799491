"""The CNN family's state in the lowering context: padded activations and shared constants.

A window op (convolution, pooling) may store its result *padded* (`PadInfo`): the
zero ring its stride-1 3x3 consumers read as padding is part of the tensor, so they
need no padding kernel. `NnState` (the context's `nn` field) records which graph values
and HBM tensors are padded, the natural copies made of them, the residual adds a later
convolution is expected to absorb, and the HBM constants kernels share.

    info = new_padded(lw, N, C, H, W, bf16, nonneg=True)   # hbm [N, C, (H + 2) * (W + 2)]
    set_padded(lw, res, info); padded_of(lw, res) -> info
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xdsl.ir import Attribute, Operation, SSAValue

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


@dataclass
class PadInfo:
    """An activation stored zero-padded: ``hbm[n, c, (h + pt) * Wp + w + pl] = x[n, c, h, w]``,
    zeros elsewhere (``[N, C, Hp * Wp]``). A stride-1 3x3 convolution with padding 1
    reads it as its phase image directly (no padding kernel), its accumulator rows have
    the same width Wp, so a producer writes whole bands with the padding columns zeroed
    by a mask instead of compacting row by row, and a residual operand in this layout
    lines up with the accumulator. `nonneg`: every value is >= 0 (after a relu), so a
    max pool may read the zeros as its padding."""
    hbm: SSAValue
    N: int
    C: int
    H: int
    W: int
    pt: int
    pl: int
    Hp: int
    Wp: int
    nonneg: bool

    @property
    def L(self) -> int:
        return self.Hp * self.Wp


@dataclass
class NnState:
    """What the CNN family remembers between the ops of one conversion
    (`LoweringContext.nn`)."""

    # HBM constants shared by kernels: (data bytes, element type, shape) -> tensor
    consts: dict[tuple[bytes, str, tuple[int, ...]], SSAValue] = field(default_factory=dict)
    # constant rows of one value: (value bytes, element type) -> the longest row made
    fill_rows: dict[tuple[bytes, str], SSAValue] = field(default_factory=dict)
    padded: dict[SSAValue, PadInfo] = field(default_factory=dict)  # graph value -> its padded layout
    padded_hbm: dict[SSAValue, PadInfo] = field(default_factory=dict)  # padded HBM tensor -> its layout
    # a convolution not lowered yet -> the (residual add, padded value) pairs its epilogue
    # is expected to fuse (`check_absorbed` gives the value a natural copy if it does not)
    absorb: dict[Operation, list[tuple[Operation, SSAValue]]] = field(default_factory=dict)
    natural_hbm: dict[SSAValue, SSAValue] = field(default_factory=dict)  # padded tensor -> natural copy


def padded_of(lw: LoweringContext, v: SSAValue) -> PadInfo | None:
    """The padded layout of graph value `v`, if it is stored padded."""
    return lw.nn.padded.get(v)


def padded_hbm(lw: LoweringContext, hbm: SSAValue | None) -> PadInfo | None:
    """The padded layout of HBM tensor `hbm`, if it is a padded activation."""
    return None if hbm is None else lw.nn.padded_hbm.get(hbm)


def new_padded(lw: LoweringContext, N: int, C: int, H: int, W: int, elem: Attribute, nonneg: bool,
               pad: int = 1, Wp: int | None = None) -> PadInfo:
    """A new zeroed HBM tensor in the padded layout (rows of `Wp`, default W + 2 pad)."""
    Hp, Wp = H + 2 * pad, Wp or W + 2 * pad
    info = PadInfo(lw.hbm((N, C, Hp * Wp), elem, zeroed=True), N, C, H, W, pad, pad, Hp, Wp, nonneg)
    lw.nn.padded_hbm[info.hbm] = info
    return info


def set_padded(lw: LoweringContext, v: SSAValue, info: PadInfo) -> None:
    lw.nn.padded[v] = info

