"""Which graph values can never hold an infinity or a NaN, whatever the program's inputs.

`never_infinite(v)` is True when a finite bound on ``|v|`` follows from how `v` is
built (`magnitude`): a constant (its largest magnitude), an integer or boolean tensor
(its type's range), ``where(cond, x, y)`` (the larger bound of x and y: the condition
only chooses), a view (reshape, expand, permute, slice), a cast whose source bound fits
the target type's finite range (rounding cannot overflow then), or the result of a
`graph.fused` group yielding one of these; with compile-time values (`const`: a weight
with data), their own. Anything else (an input, arithmetic that may overflow) has no
bound: False.

The attention kernel reads it for its additive mask (`passes/graph_to_tile/attention`):
a mask that may hold -inf is clamped to the lowest finite value before the matrix
engine adds it (the identity's zeros times -inf would be NaN), one vector pass over
every mask row per head; the mask transformers builds from the positions of a static
cache (``where(key <= query, 0, finfo.min)``) needs none. canonicalize-graph, which has
the weights, marks such an sdpa with the `MASK_FINITE` attribute
(`passes/graph/attention.py`); the lowering also asks again without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, ContainerType, Float16Type, Float32Type, Float64Type, IntegerType
from xdsl.ir import Attribute, BlockArgument, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_fusion as gf
from tilecc.ir import graph_index as gi

__all__ = ["MASK_FINITE", "magnitude", "never_infinite"]

MASK_FINITE = "tilecc.mask_finite"  # a graph.sdpa attribute: its mask is never -inf

Const = Callable[[SSAValue], np.ndarray | None]
_VIEWS = (g.ReshapeOp, g.ExpandOp, g.PermuteOp, gi.SliceOp)
# the largest finite magnitude of each float type
_FLOAT_MAX: dict[type, float] = {
    BFloat16Type: 3.3895313892515355e38,
    Float16Type: 65504.0,
    Float32Type: float(np.finfo(np.float32).max),
    Float64Type: float(np.finfo(np.float64).max),
}


def _element(v: SSAValue) -> Attribute:
    t = v.type
    if isinstance(t, ContainerType):
        return cast(Attribute, cast(Any, t).get_element_type())
    return t


def _type_max(elem: Attribute) -> float | None:
    if isinstance(elem, IntegerType):
        return float(2 ** max(elem.bitwidth - 1, 1))
    return _FLOAT_MAX.get(type(elem))


def never_infinite(v: SSAValue, const: Const | None = None) -> bool:
    """Whether `v` holds only finite values for every input (see the module docstring)."""
    return magnitude(v, const) is not None


def magnitude(v: SSAValue, const: Const | None = None) -> float | None:
    """A finite bound on ``|v|`` for every input, or None where none is known."""
    elem = _element(v)
    if isinstance(elem, IntegerType):
        return float(2 ** max(elem.bitwidth - 1, 1))
    known = const(v) if const is not None else None
    if known is not None:
        return float(np.max(np.abs(known), initial=0.0)) if np.all(np.isfinite(known)) else None
    if isinstance(v, BlockArgument):  # an argument of a fused group's region: its operand
        fused = v.owner.parent_op()
        return magnitude(fused.operands[v.index], const) if isinstance(fused, gf.FusedOp) else None
    owner = v.owner
    if isinstance(owner, g.ConstantOp):
        values = owner.values()
        return float(np.max(np.abs(values), initial=0.0)) if np.all(np.isfinite(values)) else None
    if isinstance(owner, _VIEWS):
        return magnitude(owner.operands[0], const)
    if isinstance(owner, gi.WhereOp):
        x, y = magnitude(owner.x, const), magnitude(owner.y, const)
        return None if x is None or y is None else max(x, y)
    if isinstance(owner, g.CastOp):  # rounding to the nearest cannot overflow below the type's max
        src, limit = magnitude(owner.operands[0], const), _type_max(elem)
        return src if src is not None and limit is not None and src <= limit else None
    if isinstance(owner, gf.FusedOp):
        yields = owner.regions[0].block.last_op
        if not isinstance(yields, gf.YieldOp):
            return None
        return magnitude(yields.operands[next(i for i, r in enumerate(owner.results) if r is v)], const)
    return None
