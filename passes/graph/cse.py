"""Common-subexpression elimination over the graph IR (part of canonicalize-graph).

Graph ops have no side effects (an in-place update of a buffer is a graph op whose
result is the updated tensor, see `dead_code`), so two ops of the same kind, on the same
operands, with the same properties and attributes (the source location aside) and the
same result types compute the same values: the later one is replaced by the earlier.
Ops with regions (fused groups) are left alone, and so is an op whose result is a program
output (two outputs must not share one buffer). Identical layers recompute the same
values from the same inputs: a decoder's KV-cache index normalisation, position masks
and rotary tables from `cache_position`, once per layer; after this pass, once.

Before::

    %i0 = graph.lt %pos, %c0 {tilecc.loc = "layers.0.self_attn ..."} : tensor<1xi32> ...
    %a  = graph.index_copy %k0, %i0, ...
    %i1 = graph.lt %pos, %c0 {tilecc.loc = "layers.1.self_attn ..."} : tensor<1xi32> ...
    %b  = graph.index_copy %k1, %i1, ...

After::

    %i0 = graph.lt %pos, %c0 {tilecc.loc = "layers.0.self_attn ..."} ...
    %a  = graph.index_copy %k0, %i0, ...
    %b  = graph.index_copy %k1, %i0, ...
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Operation

from tilecc.ir import graph as g
from tilecc.ir.graph_base import LOC_ATTR

__all__ = ["eliminate_common_subexpressions"]


def _key(op: Operation) -> tuple | None:
    if not isinstance(op, g.GraphOp) or op.regions or not op.results:
        return None
    attrs = tuple(sorted((k, v) for k, v in op.attributes.items() if k != LOC_ATTR))
    props = tuple(sorted(op.properties.items()))
    try:
        key = (op.name, tuple(op.operands), props, attrs, tuple(r.type for r in op.results))
        hash(key)
    except TypeError:  # an attribute that cannot be hashed: left alone
        return None
    return key


def eliminate_common_subexpressions(fn: func.FuncOp) -> int:
    """Replace every graph op equal to an earlier one (see the module docstring) by it;
    the number of ops removed."""
    seen: dict[tuple, Operation] = {}
    removed = 0
    for op in list(fn.body.block.ops):
        key = _key(op)
        if key is None:
            continue
        first = seen.setdefault(key, op)
        if first is op:
            continue
        if any(isinstance(u.operation, func.ReturnOp) for r in op.results for u in r.uses):
            continue  # a program output keeps its own buffer (outputs never alias each other)
        for mine, theirs in zip(op.results, first.results, strict=True):
            mine.replace_all_uses_with(theirs)
        op.detach()
        op.erase()
        removed += 1
    return removed
