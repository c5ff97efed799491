"""RMSNorm as `transformers` models write it, matched from its `graph.mean`.

    h = f32(x)                              (the upcast; absent when x is fp32)
    n = h * rsqrt(mean(h * h | h ** 2, -1, keepdim) + eps)
    y = w * out(n)                          (Llama, Qwen2, Mistral: cast, then weight)
      | out(n * w)                          (Gemma: weight in fp32 (its 1 + w), then cast)

`out` is the cast back to x's element type (absent in fp32); multiplies match with their
operands in either order; `w` is any tensor of the last dim's size; eps a scalar
constant; every intermediate is used once. `match_rms_norm(mean)` returns the match or,
for a chain of this shape that differs in one way (the mean over another dim, no
keepdim, bf16 arithmetic without the upcast, a cast to another type, an intermediate
used twice), the reason it is not one, which the rewrite
(`passes/graph/rms_norm.py`) reports as a remark. The intrinsic-work counter
(`ir/graph_work.py`) counts a matched chain as `graph.rms_norm`'s work.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_nn as nn
from tilecc.ir.graph_patterns import scalar_value
from tilecc.simulator.isa import DType


@dataclass
class RmsNormMatch:
    x: SSAValue
    weight: SSAValue
    eps: float
    cast_before_weight: bool
    final: Operation  # its result is the norm's
    ops: list[Operation]  # every op of the chain, `final` included


def _only_user(v: SSAValue) -> Operation | None:
    uses = list(v.uses)
    return uses[0].operation if len(uses) == 1 else None


def _other(op: Operation, v: SSAValue) -> SSAValue | None:
    """The operand of binary `op` that is not `v` (None when both are)."""
    a, b = op.operands
    return b if a is v and b is not v else a if b is v and a is not v else None


def _squared(sq: Operation) -> SSAValue | None:
    """h when `sq` is ``h * h`` or ``h ** 2``."""
    if isinstance(sq, g.MulOp) and sq.operands[0] is sq.operands[1]:
        return sq.operands[0]
    if isinstance(sq, gi.PowOp) and scalar_value(sq.operands[1]) == 2.0:
        return sq.operands[0]
    return None


def match_rms_norm(mean: Operation) -> RmsNormMatch | str | None:
    """The RMSNorm whose mean of squares is `mean`; a reason string for a near-match;
    None when `mean` is not in an RMSNorm-shaped chain at all."""
    if not isinstance(mean, nn.MeanOp) or not isinstance(mean.input.owner, Operation):
        return None
    sq = mean.input.owner
    h = _squared(sq)
    add = _only_user(mean.result)
    if h is None or not isinstance(add, g.AddOp):
        return None
    eps_v = _other(add, mean.result)
    eps = scalar_value(eps_v) if eps_v is not None else None
    rs = _only_user(add.results[0])
    if eps is None or not isinstance(rs, g.RsqrtOp):
        return None
    norm = _only_user(rs.results[0])
    if not isinstance(norm, g.MulOp) or _other(norm, rs.results[0]) is not h:
        return None
    # an RMSNorm-shaped chain: from here on a mismatch is a near-match with its reason
    shape = g.shape_of(h)
    if mean.axes != (len(shape) - 1,):
        return f"the mean is over dims {list(mean.axes)}, not the last dim {len(shape) - 1} alone"
    if not mean.keepdim.value.data:
        return "the mean does not keep its dim"
    if eps < 0:
        return f"eps {eps} is negative"
    if g.element_dtype(h.type) != DType.F32:
        return f"the arithmetic is in {g.element_dtype(h.type).name.lower()}, not fp32 (no upcast)"
    chain: list[Operation] = [sq, mean, add, rs, norm]
    uses = {len(list(v.uses)) for v in (sq.results[0], mean.result, add.results[0], rs.results[0])}
    if uses != {1}:
        return "an intermediate of the norm has another user"
    x = h
    if isinstance(h.owner, g.CastOp):
        x = h.owner.operands[0]
        chain.insert(0, h.owner)
    in_dt = g.element_dtype(x.type)
    out = norm.results[0]
    nxt = _only_user(out)
    if nxt is None:
        return "the normalised rows have several users (no weight multiply)"
    if isinstance(nxt, g.CastOp):  # Llama: cast to the input type, then the weight
        if g.element_dtype(nxt.results[0].type) != in_dt:
            return f"the normalised rows are cast to {g.element_dtype(nxt.results[0].type).name.lower()}, not the " \
                   f"input's {in_dt.name.lower()}"
        mul = _only_user(nxt.results[0])
        w = _other(mul, nxt.results[0]) if isinstance(mul, g.MulOp) else None
        if not isinstance(mul, g.MulOp) or w is None or g.shape_of(w) != shape[-1:] \
                or g.shape_of(mul.results[0]) != shape:
            return "the cast rows are not multiplied by a weight of the last dim's size"
        return RmsNormMatch(x, w, eps, True, mul, [*chain, nxt, mul])
    w = _other(nxt, out) if isinstance(nxt, g.MulOp) else None
    if w is None or g.shape_of(w) != shape[-1:] or g.shape_of(nxt.results[0]) != shape:
        return "the normalised rows are not multiplied by a weight of the last dim's size"
    if g.element_dtype(w.type) != DType.F32:
        return f"the fp32 rows are multiplied by a {g.element_dtype(w.type).name.lower()} weight"
    if in_dt == DType.F32:
        return RmsNormMatch(x, w, eps, False, nxt, [*chain, nxt])
    back = _only_user(nxt.results[0])
    if not isinstance(back, g.CastOp) or g.element_dtype(back.results[0].type) != in_dt:
        return f"the weighted rows are not cast back to the input's {in_dt.name.lower()}"
    return RmsNormMatch(x, w, eps, False, back, [*chain, nxt, back])


__all__ = ["RmsNormMatch", "match_rms_norm"]
