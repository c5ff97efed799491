"""Attention as models write it: the explicit chain around a softmax.

    scores = matmul(q, k^T)            (through views: reshapes, casts, expands, permutes)
    scores = scores * c  |  scores / c (optional; c a compile-time scalar)
    scores = scores + mask             (optional: an additive mask, any broadcast)
           | where(cond, scores, big negative)   (or the branches swapped)
    p = softmax(scores, dim=-1)
    out = matmul(p, v)

`match_attention(softmax, const)` finds that chain around one `graph.softmax` (each
intermediate used once), with `const` evaluating compile-time values (a scale, a mask's
fill). Two clients read it: the intrinsic-work counter (`ir/graph_work.py`: the explicit
form costs what `graph.sdpa` costs) and the rewrite that turns the chain into
`graph.sdpa` (`passes/graph/attention.py`), so the two agree on what is an attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.dtypes import masked_value
from tilecc.simulator.isa import DType

MASKED_AT_OR_BELOW = -1e30  # an additive mask value that drops its key

# views and casts an attention chain may pass through (each value used once)
CHAIN_VIEWS = (g.ReshapeOp, g.CastOp, g.ExpandOp, g.PermuteOp)

ConstFn = Callable[[SSAValue], "np.ndarray | None"]


def numel(v: SSAValue) -> int:
    return math.prod(g.shape_of(v))


def masked(values: np.ndarray, dt: DType) -> np.ndarray:
    """Where an additive mask of element type `dt` drops its key: at or below -1e30, or
    at the type's most negative finite value (f16's is -65504)."""
    low = masked_value(dt) if dt != DType.I32 else MASKED_AT_OR_BELOW
    return values <= max(MASKED_AT_OR_BELOW, low)


@dataclass
class MaskStep:
    """The chain's mask: ``add`` (`value` the additive mask) or ``where`` (`value` the
    condition; the scores are kept where it equals `keep_when`; `fill` the big negative)."""

    op: Operation
    kind: str
    value: SSAValue
    keep_when: bool = True
    fill: SSAValue | None = None


@dataclass
class AttentionChain:
    qk: g.MatmulOp
    pv: g.MatmulOp
    softmax: g.SoftmaxOp
    scale: float
    mask: MaskStep | None
    ops: set[Operation] = field(default_factory=set[Operation])
    # the views and casts between the matmuls and the softmax, in chain order
    views: list[Operation] = field(default_factory=list[Operation])
    # the scale multiplies the masked scores ((s + mask) * c), not the scores alone
    scale_after_mask: bool = False


def match_attention(sm: g.SoftmaxOp, const: ConstFn) -> AttentionChain | None:
    """The explicit attention around softmax `sm`, or None when `sm` is not in one."""
    x = sm.input
    if sm.axis != len(g.shape_of(x)) - 1:
        return None
    ops: set[Operation] = {sm}
    views: list[Operation] = []
    # forward: softmax -> views -> matmul(p, v)
    v = sm.result
    while True:
        if not v.has_one_use():
            return None
        use = next(iter(v.uses))
        nxt = use.operation
        if isinstance(nxt, CHAIN_VIEWS) and numel(nxt.results[0]) == numel(v):
            ops.add(nxt)
            views.append(nxt)
            v = nxt.results[0]
            continue
        if not (isinstance(nxt, g.MatmulOp) and use.index == 0):
            return None
        pv = nxt
        break
    ops.add(pv)
    # backward: softmax <- views, mask, scale <- matmul(q, k^T)
    scale: float = 1.0
    mask: MaskStep | None = None
    seen_scale = scale_first = False
    while True:
        if not x.has_one_use():
            return None
        owner = x.owner
        if isinstance(owner, CHAIN_VIEWS) and numel(owner.results[0]) == numel(owner.operands[0]):
            views.insert(0, owner)
            x = owner.operands[0]
        elif isinstance(owner, g.MulOp | g.DivOp) and not seen_scale:
            k, x_next = _scalar(const, owner.operands[1]), owner.operands[0]
            if k is None and isinstance(owner, g.MulOp):  # the scalar first: s * scores
                k, x_next = _scalar(const, owner.operands[0]), owner.operands[1]
            if k is None or k == 0:
                return None
            scale = (1.0 / k) if isinstance(owner, g.DivOp) else k
            seen_scale, x = True, x_next
            scale_first = mask is None
        elif isinstance(owner, g.AddOp) and mask is None:
            i = _chain_operand(owner, x)
            if i is None:
                return None
            mask = MaskStep(owner, "add", owner.operands[1 - i])
            x = owner.operands[i]
        elif isinstance(owner, gi.WhereOp) and mask is None:
            found = _where_mask(const, owner, x)
            if found is None:
                return None
            mask, x = found
        elif isinstance(owner, g.MatmulOp):
            break
        else:
            return None
        ops.add(owner)
    qk = owner
    ops.add(qk)
    if g.shape_of(qk.result)[-2:] != g.shape_of(sm.result)[-2:]:
        return None
    return AttentionChain(qk, pv, sm, scale, mask, ops, views, scale_first and mask is not None)


def _scalar(const: ConstFn, v: SSAValue) -> float | None:
    if numel(v) != 1:
        return None
    k = const(v)
    return None if k is None else float(k.reshape(-1)[0])


def _chain_operand(op: Operation, x: SSAValue) -> int | None:
    """Which operand of the binary `op` the chain value came through (its result is x)."""
    n = numel(x)
    full = [i for i, o in enumerate(op.operands) if numel(o) == n]
    if len(full) == 1:
        return full[0]
    for i in full:  # both full: the one a matmul produced (through views and a scale)
        owner = op.operands[i].owner
        while isinstance(owner, (*CHAIN_VIEWS, g.MulOp, g.DivOp)):
            owner = max(owner.operands, key=numel).owner
        if isinstance(owner, g.MatmulOp):
            return i
    return None


def _where_mask(const: ConstFn, w: gi.WhereOp, x: SSAValue) -> tuple[MaskStep, SSAValue] | None:
    """A `where` applying a mask: one branch the chain, the other a big negative constant."""
    n = numel(x)
    for keep, drop, when in ((w.x, w.y, True), (w.y, w.x, False)):
        d = const(drop)
        if numel(keep) != n or d is None or not bool(np.all(masked(d, g.element_dtype(drop.type)))):
            continue
        return MaskStep(w, "where", w.cond, when, drop), keep
    return None
