"""Which layout a window op's output takes: padded, when its users read it that way.

A convolution or pooling writes its output zero-padded (rows of W + 2, a zero ring)
when every user can take it so: a stride-1 3x3 window with padding 1 (reads it as its
phase image), a strided window (builds its phase images from it), the spatial mean, or a
residual add a later convolution's -O2 epilogue fuses. The decision looks ahead at
those consumers (planning their convolution kernels) and builds nothing:

    %y = graph.conv2d(%x, ...)  ; %z = graph.relu %y  ; graph.conv2d(%z, 3x3, s1, p1)
    plan_output_layout(lw, %z, steps, ...) -> OutputLayout(Wp=W + 2, nonneg=True, wanted=True, absorbed=[])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_nn as nn
from tilecc.ir.graph_fusion import FusedOp
from tilecc.passes.graph_to_tile.nn.common import value_shape
from tilecc.passes.graph_to_tile.nn.conv_plan import o2_feasible
from tilecc.passes.graph_to_tile.nn.epilogue import Step
from tilecc.passes.graph_to_tile.nn.state import PadInfo, new_padded, padded_hbm

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def conv_reads_padded(op: Operation) -> bool:
    """Whether a convolution / pooling consumer can take its input padded: a stride-1 3x3
    window with padding 1 reads it directly; a strided one builds its phase images from
    it (the padding ring is part of the image)."""
    if isinstance(op, nn.Conv2dOp):
        (sh, sw), (ph, pw), (dh, dw), _, _ = op.params
        ws = value_shape(op.weight)
        k = (ws[2], ws[3])
    elif isinstance(op, nn.MaxPool2dOp):
        k, (sh, sw), (ph, pw), (dh, dw), _ = op.params
    elif isinstance(op, nn.AvgPool2dOp):
        prm = op.params
        k, (sh, sw), (ph, pw) = prm[0], prm[1], prm[2]
        dh, dw = 1, 1
        if prm[3]:  # ceil_mode: windows past the edge
            return False
    else:
        return False
    if (sh, sw) == (1, 1):
        return (ph, pw) == (1, 1) and (dh, dw) == (1, 1) and tuple(k) == (3, 3)
    return True


def conv_absorbing(lw: LoweringContext, add: Operation, v: SSAValue) -> nn.Conv2dOp | None:
    """The convolution, not lowered yet, whose epilogue will fuse `add` (a residual add of
    `v`): the add's other operand comes from it through single-use per-channel affine
    ops (a batch norm), the way `fuse_epilogue` walks."""
    lhs, rhs = add.operands
    o = rhs if lhs is v else lhs
    if o is v:
        return None
    while True:
        if not o.has_one_use():
            return None
        owner = o.owner
        if isinstance(owner, nn.Conv2dOp):
            return owner if o not in lw.values else None
        if isinstance(owner, (g.MulOp, g.AddOp)):
            a, b = owner.operands
            const = [u for u in (a, b) if isinstance(u.owner, (g.WeightOp, g.ConstantOp))]
            if len(const) != 1:
                return None
            o = b if const[0] is a else a
            continue
        return None


def wants_padded(lw: LoweringContext, v: SSAValue, N: int, C: int, H: int, W: int, nonneg: bool,
                 absorbed: list[tuple[Operation, Operation]] | None = None, strict: list[bool] | None = None) -> bool:
    """Whether every user of `v` takes it in the padded layout (-O2 only); residual adds
    expected in a later convolution's epilogue are appended to `absorbed` as (add, conv);
    `strict` gets True when some user needs rows of exactly W + 2 (a stride-1 window
    reading it directly, or an epilogue adding it), else the row width is free."""
    if lw.opt_level < 2 or not v.uses:
        return False
    for use in v.uses:
        u = use.operation
        if isinstance(u, (nn.Conv2dOp, nn.MaxPool2dOp, nn.AvgPool2dOp)) and u.operands[0] is v:
            if not conv_reads_padded(u) or (isinstance(u, nn.MaxPool2dOp) and not nonneg):
                return False
            stride = u.params[0] if isinstance(u, nn.Conv2dOp) else u.params[1]
            if strict is not None and tuple(stride) == (1, 1):  # reads it as its phase image
                strict.append(True)
        elif isinstance(u, g.AddOp):
            conv = conv_absorbing(lw, u, v)
            if conv is None or tuple(value_shape(conv.results[0])) != (N, C, H, W) or not o2_feasible(lw, conv):
                return False
            if absorbed is not None:
                absorbed.append((u, conv))
            if strict is not None:
                strict.append(True)
        elif isinstance(u, (nn.SumOp, nn.MeanOp)) and len(value_shape(v)) == 4 and set(u.axes) == {2, 3}:
            pass
        elif isinstance(u, FusedOp) and len(value_shape(v)) == 4 and _pooled_in(u, use.index):
            pass  # a classifier head's average pool, the prologue of its matmul (`norm_gemv.py`)
        else:
            return False
    return True


def _pooled_in(group: FusedOp, index: int) -> bool:
    """Whether the group's input `index` is read only by spatial means (``[N, C, H, W]``
    over dims 2 and 3), which read a zero-padded map as well as a natural one."""
    arg = group.block.args[index]
    return bool(arg.uses) and all(isinstance(u.operation, nn.MeanOp) and set(u.operation.axes) == {2, 3}
                                  for u in arg.uses)


@dataclass
class OutputLayout:
    """A window op's output stored padded: rows of `Wp`, `nonneg` when every value is >= 0;
    `wanted`: every user asked for it (else a padded residual operand forced it, and the
    other users read a natural copy); `absorbed`: the (residual add, convolution) pairs a
    later convolution's epilogue is expected to fuse."""

    Wp: int
    nonneg: bool
    wanted: bool
    absorbed: list[tuple[Operation, Operation]]


def plan_output_layout(lw: LoweringContext, final: SSAValue, steps: list[Step], N: int, C: int, OH: int, OW: int,
                       nonneg: bool | None = None, wq: int = 0) -> OutputLayout | None:
    """The layout of a window op's output: padded when every user takes it padded, or
    when a fused residual operand is padded (the epilogue reads operands in its own
    layout); natural (None) otherwise (padded operands are then read through a natural
    copy). Builds no kernel (a later convolution's epilogue is planned, lowering the
    weights and constants it reads)."""
    if lw.opt_level < 2:
        return None
    if nonneg is None:
        nonneg = bool(steps) and steps[-1].kind == "unary" and steps[-1].fn == "relu"
    absorbed: list[tuple[Operation, Operation]] = []
    strict: list[bool] = []
    wanted = wants_padded(lw, final, N, C, OH, OW, nonneg, absorbed, strict)
    infos = [padded_hbm(lw, st.value) for st in steps if st.kind == "tile"]
    if infos and not all(i is not None and (i.H, i.W, i.pt, i.pl, i.Wp) == (OH, OW, 1, 1, OW + 2) for i in infos):
        return None
    if not (wanted or infos):
        return None
    # rows as wide as the producer's accumulator rows where no user needs W + 2 (the
    # epilogue then writes whole bands without compacting rows)
    Wp = wq if (not strict and not infos and wq >= OW + 2) else OW + 2
    return OutputLayout(Wp, nonneg, wanted, absorbed)


def realise_output_layout(lw: LoweringContext, plan: OutputLayout | None, final: SSAValue, N: int, C: int,
                          OH: int, OW: int, elem: Attribute, key: SSAValue | None = None,
                          ) -> tuple[PadInfo | None, bool]:
    """The padded output tensor of `plan` (None: natural) and whether the users asked
    for it; the residual adds expected in later epilogues are recorded under `key` (the
    op's result; `final` by default)."""
    if plan is None:
        return None, False
    for add, conv in plan.absorbed:
        lw.nn.absorb.setdefault(conv, []).append((add, key or final))
    return new_padded(lw, N, C, OH, OW, elem, plan.nonneg, Wp=plan.Wp), plan.wanted
