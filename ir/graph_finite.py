"""Which graph values can never hold an infinity or a NaN, whatever the program's inputs.

`never_infinite(v)` is True when every element of `v` is finite by construction: a
constant whose values are all finite, an integer or boolean tensor (also cast to a float
type of at least bf16's range), a cast of a finite float that cannot overflow (to the
same type, fp32 or fp64), ``where(cond, x, y)`` of two such values (the condition may be
anything: it only chooses), a view of one (reshape, expand, permute, slice), or the
result of a `graph.fused` group yielding one of these; with compile-time values (a
weight with data), their own. Anything else (an input, arithmetic that may overflow)
is not known finite: False.

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

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float32Type, Float64Type, IntegerType
from xdsl.ir import Block, BlockArgument, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_fusion as gf
from tilecc.ir import graph_index as gi

__all__ = ["MASK_FINITE", "never_infinite"]

MASK_FINITE = "tilecc.mask_finite"  # a graph.sdpa attribute: its mask is never -inf

_VIEWS = (g.ReshapeOp, g.ExpandOp, g.PermuteOp, gi.SliceOp)
# float types at least as wide in range as any integer tensor's values (i32 up to 2^31)
_WIDE = (BFloat16Type, Float32Type, Float64Type)


def _element(v: SSAValue):
    t = v.type
    return t.element_type if hasattr(t, "element_type") else t  # pyright: ignore[reportAttributeAccessIssue]


def never_infinite(v: SSAValue, const: Callable[[SSAValue], np.ndarray | None] | None = None) -> bool:
    """Whether `v` holds only finite values for every input (see the module docstring).
    `const` (`ir/graph_consts.ConstValues`) gives compile-time values where known: a
    weight or folded constant with data counts by its values."""
    if isinstance(_element(v), IntegerType):
        return True
    known = const(v) if const is not None else None
    if known is not None:
        return bool(np.all(np.isfinite(known)))
    if isinstance(v, BlockArgument):  # an argument of a fused group's region: its operand
        block = v.owner
        fused = block.parent_op() if isinstance(block, Block) else None
        if isinstance(fused, gf.FusedOp):
            return never_infinite(fused.operands[v.index], const)
        return False
    owner = v.owner
    if isinstance(owner, g.ConstantOp):
        return bool(np.all(np.isfinite(owner.values())))
    if isinstance(owner, _VIEWS):
        return never_infinite(owner.operands[0], const)
    if isinstance(owner, gi.WhereOp):
        return never_infinite(owner.x, const) and never_infinite(owner.y, const)
    if isinstance(owner, g.CastOp):  # exact, or rounding that cannot overflow
        src, dst = _element(owner.operands[0]), _element(v)
        if isinstance(src, IntegerType):
            return isinstance(dst, _WIDE)
        widens = type(src) is type(dst) or isinstance(dst, (Float32Type, Float64Type))
        return widens and never_infinite(owner.operands[0], const)
    if isinstance(owner, gf.FusedOp):
        yields = owner.regions[0].block.last_op
        if not isinstance(yields, gf.YieldOp):
            return False
        return never_infinite(yields.operands[list(owner.results).index(v)], const)
    return False
