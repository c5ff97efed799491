"""Compile-time values of a graph program: weights, constants and cheap ops of them.

`ConstValues(weights)(v)` is the value of `v` as float32 when it is known at compile
time (a `graph.weight` with data, a `graph.constant`, or a view / elementwise / where /
slice / concat / pad of such values, up to `FOLD_LIMIT` elements, evaluated with the
ops' own numpy reference), else None. The intrinsic-work counter reads masks and
scales with it (`ir/graph_work.py`), as does the attention rewrite (`passes/graph/attention.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import numpy as np
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_nn as nn
from tilecc.ir.meta_weights import MetaWeight

FOLD_LIMIT = 1 << 24  # elements: the largest value evaluated at compile time (masks)

# ops whose value is cheap to evaluate at compile time (a mask built from constants)
FOLDABLE = (
    g.ReshapeOp, g.PermuteOp, g.ExpandOp, g.CastOp, gi.SliceOp, gi.ConcatOp, nn.PadOp, gi.WhereOp,
    g.UnaryElementwiseOp, g.BinaryElementwiseOp,
)


class ConstValues:
    """Memoised compile-time values over one program's weights."""

    def __init__(self, weights: Mapping[str, np.ndarray] | None):
        self.weights: Mapping[str, np.ndarray] = weights if weights is not None else {}
        self.cache: dict[SSAValue, np.ndarray | None] = {}

    def __call__(self, v: SSAValue) -> np.ndarray | None:
        if v in self.cache:
            return self.cache[v]
        self.cache[v] = None  # also breaks cycles (there are none in a graph)
        owner = v.owner
        value: np.ndarray | None = None
        if isinstance(owner, g.WeightOp):
            data = self.weights.get(owner.weight)
            if data is not None and not isinstance(data, MetaWeight):  # a meta weight has no values
                value = np.asarray(data, dtype=np.float32).reshape(g.shape_of(v))
        elif isinstance(owner, g.ConstantOp):
            value = owner.values()
        elif isinstance(owner, FOLDABLE) and math.prod(g.shape_of(v)) <= FOLD_LIMIT:
            args = [self(o) for o in owner.operands]
            if all(a is not None for a in args):
                value = np.asarray(
                    cast(g.GraphOp, owner).reference(*cast(list[np.ndarray], args)), dtype=np.float32
                )
        self.cache[v] = value
        return value
