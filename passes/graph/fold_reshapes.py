"""Reshape chains (part of canonicalize-graph): one reshape, or none, for a chain of them.

A row-major reshape of a row-major reshape is one reshape of the first input; a
reshape to its input's own type is the input. Chains come from model code (a 4-D
head layout viewed 3-D for a batched matmul and back) and from rewrites that reshape
operands into an op's layout (`passes/graph/attention.py` reshapes an explicit
attention's 3-D q, v and result to and from sdpa's 4-D); left in, they hide a
`permute` or `slice` view from the consumer that would read through it (the flash
kernel reads q, k, v and writes its result through ``permute(reshape(...))`` views),
so a copy kernel materialises the layout instead.

Before::

    %q3 = graph.reshape %q4  : tensor<1x12x512x64xbf16> -> tensor<12x512x64xbf16>
    %q  = graph.reshape %q3  : tensor<12x512x64xbf16> -> tensor<1x12x512x64xbf16>
    %o  = graph.sdpa %q, %k, %v ...

After (``%q3`` is erased once unused)::

    %o  = graph.sdpa %q4, %k, %v ...

A reshape that a function returns keeps its place (the output stays a value of its
own).
"""

from __future__ import annotations

from xdsl.dialects import func

from tilecc.ir import graph as g


def fold_reshapes(fn: func.FuncOp) -> int:
    """Fold every reshape chain of `fn`; the number of reshapes changed or removed."""
    count = 0
    for op in list(fn.body.block.ops):
        if not isinstance(op, g.ReshapeOp) or op.parent is None:
            continue
        src = op.input
        while isinstance(src.owner, g.ReshapeOp):
            src = src.owner.input
        if src is op.input and src.type != op.result.type:
            continue
        if src.type == op.result.type and not any(isinstance(u.operation, func.ReturnOp) for u in op.result.uses):
            op.result.replace_all_uses_with(src)
        elif src is not op.input:
            op.operands = [src]
        else:
            continue
        count += 1
    return count


__all__ = ["fold_reshapes"]
