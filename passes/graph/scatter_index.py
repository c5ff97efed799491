"""fold-scatter-indices (part of canonicalize-graph): a scatter index known at compile
time becomes one `graph.constant`.

The importer wraps negative indices (``index + (index < 0) * size``) in graph ops, so a
constant index (a prefill's KV-cache positions ``arange(P)``, `tilecc/llm/programs.py`)
would otherwise be recomputed by a kernel on every run, and the scatter's lowering could
not see its values. With the values folded, `passes/graph_to_tile/scatter.py` writes a
contiguous range of rows as block copies instead of indirect stores.

Before (the positions 0..5 of a cache of 8)::

    %p = graph.weight "folded.arange"       : tensor<6xi32>
    %l = graph.lt %p, %zero                 : tensor<6xi32>, tensor<i32> -> tensor<6xi32>
    %w = graph.mul %l, %eight               : ...
    %i = graph.add %p, %w                   : ...
    %r = graph.index_scatter %cache, %i, %k dim 2 reduce "none" : ...

After::

    %i = graph.constant dense<[0, 1, 2, 3, 4, 5]> : tensor<6xi32>
    %r = graph.index_scatter %cache, %i, %k dim 2 reduce "none" : ...

An index whose values are not known (a decode step's position, an input) is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from xdsl.dialects import func

from tilecc.ir import graph as g
from tilecc.ir import graph_scatter as gs
from tilecc.ir.graph_consts import ConstValues
from tilecc.passes import remarks

PASS = "canonicalize-graph"


def fold_scatter_indices(fn: func.FuncOp, weights: Mapping[str, np.ndarray] | None = None) -> int:
    """Replace each compile-time scatter index of `fn` by a `graph.constant`; the count."""
    const = ConstValues(weights)
    count = 0
    for op in list(fn.body.block.ops):
        if not isinstance(op, gs.IndexScatterOp) or isinstance(op.index.owner, g.ConstantOp):
            continue
        values = const(op.index)
        if values is None:
            continue
        loc = g.source_loc(op)
        new = g.ConstantOp.make(values, g.element_dtype(op.index.type), loc=loc)
        fn.body.block.insert_op_before(new, op)
        op.operands[1] = new.results[0]
        count += 1
        remarks.emit(PASS, "passed", lambda n=values.size: f"graph.index_scatter's index is known at compile "
                     f"time: folded to a constant of {n} values", loc)
    return count
