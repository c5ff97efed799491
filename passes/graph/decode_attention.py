"""decode-attention (part of canonicalize-graph): a grouped-query decode step's query heads
as the rows of one attention per KV head.

A decode step attends one query row per sequence and head over the KV cache. With
grouped-query attention, `repeat_kv` expands each KV head's cache over its G query heads
(a copy of the cache) and sdpa then runs B*H heads of one row each: the flash kernel
(`passes/graph_to_tile/attention/`) pays its per-head latency chain B*H times for a
single row. With L = 1 the G query heads of a group attend the same keys and values, so
they are G query *rows* of one attention over that KV head's cache: B*Hkv heads of G
rows, no expanded copy of the cache, the cache read once per KV head.

Before (2 KV heads, 2 query heads per group, cache length 16)::

    %k4 = graph.reshape (graph.expand (graph.reshape %kc)) : ... -> tensor<2x4x16x8xf32>
    %v4 = ... the same of %vc
    %o  = graph.sdpa %q, %k4, %v4, %mask scale 0.35 causal false
        : tensor<2x4x1x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x1x1x16xf32> -> tensor<2x4x1x8xf32>

After::

    %qg = graph.reshape %q    : tensor<2x4x1x8xf32> -> tensor<2x2x2x8xf32>
    %og = graph.sdpa %qg, %kc, %vc, %mask scale 0.35 causal false
        : tensor<2x2x2x8xf32>, tensor<2x2x16x8xf32>, tensor<2x2x16x8xf32>, tensor<2x1x1x16xf32> -> tensor<2x2x2x8xf32>
    %o  = graph.reshape %og   : tensor<2x2x2x8xf32> -> tensor<2x4x1x8xf32>

Applies to a `graph.sdpa` with one query row whose k and v are `repeat_kv` expansions
(`passes/graph/attention._kv_groups`) and whose mask, if any, is the same for every head
(head dim 1) or splits into (KV heads, group); causal with one row keeps every key, so
it is dropped. Others are left as they are, with a ``missed`` remark when only the mask
stands in the way.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.passes import remarks
from tilecc.passes.graph.attention import _kv_groups

PASS = "canonicalize-graph"


def rewrite_decode_attention(fn: func.FuncOp) -> int:
    """Rewrite every grouped-query one-row `graph.sdpa` of `fn`; the number rewritten."""
    count = 0
    for op in list(fn.body.block.ops):
        if isinstance(op, gi.SdpaOp) and op.parent is not None and g.shape_of(op.q)[-2] == 1:
            count += _rewrite(fn, op)
    return count


def _rewrite(fn: func.FuncOp, op: gi.SdpaOp) -> int:
    block = fn.body.block
    loc = g.source_loc(op)

    def emit(new: Operation) -> SSAValue:
        block.insert_op_before(new, op)
        return new.results[0]

    def reshaped(x: SSAValue, shape: Sequence[int]) -> SSAValue:
        return x if list(g.shape_of(x)) == list(shape) else emit(g.ReshapeOp.make(x, list(shape), loc=loc))

    out_shape = list(g.shape_of(op.result))
    batch = out_shape[:-2]
    q_shape, k_shape, v_shape = g.shape_of(op.q), g.shape_of(op.k), g.shape_of(op.v)
    if len(batch) < 1 or list(q_shape[:-2]) != batch or list(k_shape[:-2]) != batch or list(v_shape[:-2]) != batch:
        return 0
    groups = _kv_groups(op.k, op.v, batch)
    if groups is None:
        return 0
    (xk, xv), gb = groups  # [*b, Hkv, 1, S, E] expanded over G = gb[-1] query heads
    bb, G = gb[:-1], gb[-1]
    mask = None
    if op.mask is not None:
        mask = _grouped_mask(op.mask, len(batch), G, reshaped)
        if mask is None:
            remarks.emit(PASS, "missed", "decode attention: the mask differs between the heads of a group", loc)
            return 0
    S = k_shape[-2]
    k = reshaped(xk, [*bb, S, k_shape[-1]])
    v = reshaped(xv, [*bb, S, v_shape[-1]])
    q = reshaped(op.q, [*bb, G, q_shape[-1]])
    out = emit(gi.SdpaOp.make(q, k, v, mask, scale=float(op.scale.value.data), causal=False, loc=loc))
    op.result.replace_all_uses_with(reshaped(out, out_shape))
    op.detach()
    op.erase()
    remarks.emit(PASS, "passed", lambda: (
        f"decode attention: {G} query heads per KV head as {G} query rows of one attention per KV head "
        f"(cache {S}, no repeat_kv copy)"), loc)
    return 1


def _grouped_mask(mask: SSAValue, rank: int, G: int, reshaped) -> SSAValue | None:
    """The mask (broadcasting to ``[*b, H, 1, S]``) in the dims ``[*b, Hkv, G, S]``: a
    head dim of 1 stays 1 (and the row dim 1 broadcasts over the G rows); None when
    the mask varies over the heads."""
    shape = list(g.shape_of(mask))
    full = [1] * (rank + 2 - len(shape)) + shape  # [*b', H', 1, S]
    if full[-3] != 1:
        return None
    return reshaped(mask, full)
