"""recognise-attention (part of canonicalize-graph): explicit attention -> `graph.sdpa`.

Many model definitions (GPT-2's and BERT's eager attention in `transformers`, hand-written
blocks) spell attention out: ``matmul(q, k^T)``, a scale, a mask, softmax, ``matmul(p, v)``.
Lowered op by op, every score tile goes to HBM and back and a causal mask's upper
triangle is computed and then thrown away; as one `graph.sdpa` it runs as the flash
kernel (`passes/graph_to_tile/attention/`), which skips masked tiles. The chain is the
one `ir/graph_attention.py` defines (the intrinsic-work counter reads the same).

Before (GPT-2 eager, one head group; views elided)::

    %s  = graph.matmul %q3, %kT3          : tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<4x16x16xf32>
    %s4 = graph.reshape %s                : ... -> tensor<1x4x16x16xf32>
    %t  = graph.mul %s4, %c               : (scale 0.1767...)
    %u  = graph.add %t, %mask             : tensor<1x4x16x16xf32>, tensor<1x1x16x16xf32>
    %p  = graph.softmax %u dim 3
    %o  = graph.matmul %p3, %v3           : ... -> tensor<4x16x32xf32>

After (the mask is the causal pattern: 0 on and below the diagonal, the dtype's most
negative value above)::

    %o4 = graph.sdpa %q4, %k4, %v4 scale 0.1767... causal true : ... -> tensor<1x4x16x32xf32>
    %o  = graph.reshape %o4               : ... -> tensor<4x16x32xf32>

q, k and v are reshaped into the softmax's batch dims; k is found under its transpose
(``reshape(permute(k, [.., -1, -2]))``: the permute is dropped, no copy) or transposed
explicitly. A compile-time mask (with the weights' data) that is exactly causal becomes
``causal`` (also on a `graph.sdpa` exported with such an ``attn_mask``);
any other additive mask is kept as sdpa's mask; ``where(cond, s, -big)``
becomes the additive mask ``where(cond, 0, -big)``. Grouped-query attention's
`repeat_kv` (k and v expanded over each group's heads) becomes sdpa over
``[*b, groups, n]`` batch dims with k and v broadcast, no copies; so does a `graph.sdpa`
exported with `repeat_kv`'d k and v (sdpa after Llama's `repeat_kv`: q, the mask and the
result reshaped to the grouped batch dims, k and v the unrepeated caches; one query row
is left to decode-attention, which makes the heads rows). `mark_finite_masks` marks sdpa
masks that never hold -inf (`ir/graph_finite.py`). A chain that cannot be rewritten (a
cast inside it: softmax in another precision; a mask applied in another view of the
scores; batch dims that differ otherwise) stays as written, with a ``missed`` remark
naming why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import UnitAttr
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.graph_attention import AttentionChain, masked, match_attention
from tilecc.ir.graph_consts import ConstValues
from tilecc.ir.graph_finite import MASK_FINITE, never_infinite
from tilecc.passes import remarks

PASS = "canonicalize-graph"


def recognise_attention(fn: func.FuncOp, weights: Mapping[str, np.ndarray] | None = None) -> int:
    """Rewrite every explicit attention of `fn` into `graph.sdpa`; the number rewritten.
    With `weights`, compile-time masks are read (a causal one becomes ``causal``)."""
    const = ConstValues(weights)
    count = 0
    for op in list(fn.body.block.ops):
        if isinstance(op, gi.SdpaOp):
            causal = _causal_sdpa(op, const) if op.mask is not None and not op.is_causal else None
            count += (causal is not None) + _grouped_sdpa(fn, causal or op)
            continue
        if not isinstance(op, g.SoftmaxOp) or op.parent is None:
            continue
        chain = match_attention(op, const)
        if chain is None:
            continue
        loc = g.source_loc(op)
        why = _not_rewritable(chain)
        if why is not None:
            remarks.emit(PASS, "missed", f"explicit attention left decomposed: {why}", loc)
            continue
        causal, grouped = _rewrite(fn, chain, const, loc)
        count += 1
        remarks.emit(PASS, "passed", lambda c=causal, gr=grouped, ch=chain: (
            f"explicit attention (matmul, {'scale, ' if ch.scale != 1.0 else ''}"
            f"{(ch.mask.kind + ' mask, ') if ch.mask is not None else ''}softmax, matmul) -> graph.sdpa"
            f"{' causal (the mask is the causal pattern)' if c else ''}"
            f"{f'; grouped-query: each k/v head serves {gr} query heads (no repeat_kv copies)' if gr else ''}"), loc)
    return count


def mark_finite_masks(fn: func.FuncOp, weights: Mapping[str, np.ndarray] | None = None) -> None:
    """Mark every `graph.sdpa` whose mask never holds -inf (`ir/graph_finite.py`, with the
    weights' values) with `MASK_FINITE`: the attention kernel adds it without a clamp."""
    const = ConstValues(weights)
    for op in fn.body.block.ops:
        if isinstance(op, gi.SdpaOp) and op.mask is not None and MASK_FINITE not in op.attributes:
            if never_infinite(op.mask, const):
                op.attributes[MASK_FINITE] = UnitAttr()


def _causal_sdpa(op: gi.SdpaOp, const: ConstValues) -> gi.SdpaOp | None:
    """`graph.sdpa` with a compile-time mask that is exactly the causal pattern (what
    `scaled_dot_product_attention(q, k, v, attn_mask=causal_mask)` exports) becomes
    ``causal`` with no mask: the flash kernel then skips the masked tiles. The new op, or
    None where not rewritten."""
    assert op.mask is not None
    values = const(op.mask)
    if values is None:
        return None
    scores = [*g.shape_of(op.result)[:-1], g.shape_of(op.k)[-2]]
    L, S = scores[-2], scores[-1]
    dropped = masked(values, g.element_dtype(op.mask.type))
    if bool(np.any(values[~dropped] != 0)) or not _is_tril(~dropped, scores, np.tril(np.ones((L, S), dtype=bool))):
        return None
    loc = g.source_loc(op)
    new = gi.SdpaOp.make(op.q, op.k, op.v, None, scale=float(op.scale.value.data), causal=True, loc=loc)
    op.parent_block().insert_op_before(new, op)  # type: ignore[union-attr]
    op.result.replace_all_uses_with(new.result)
    remarks.emit(PASS, "passed", "graph.sdpa's compile-time mask is the causal pattern -> causal "
                 "(masked tiles skipped)", loc)
    return new


def _grouped_sdpa(fn: func.FuncOp, op: gi.SdpaOp) -> int:
    """`graph.sdpa` whose k and v are grouped-query attention's `repeat_kv` (what
    `scaled_dot_product_attention` after Llama's `repeat_kv` exports) runs over the
    batch dims ``[*b, groups, n]`` with k and v broadcast over each group's n heads:
    no copies of the repeated k and v, and each group's K^T / V loaded once. 1 if rewritten."""
    batch = list(g.shape_of(op.q))[:-2]
    if g.shape_of(op.q)[-2] == 1:  # one query row: decode-attention makes the heads rows instead
        return 0
    if list(g.shape_of(op.k))[:-2] != batch or list(g.shape_of(op.v))[:-2] != batch:
        return 0
    groups = _kv_groups(op.k, op.v, batch)
    if groups is None:
        return 0
    (k, v), grouped = groups
    block, loc = fn.body.block, g.source_loc(op)

    def reshaped(x: SSAValue, shape: Sequence[int]) -> SSAValue:
        if list(g.shape_of(x)) == list(shape):
            return x
        r = g.ReshapeOp.make(x, shape, loc=loc)
        block.insert_op_before(r, op)
        return r.results[0]

    qs = g.shape_of(op.q)
    q = reshaped(op.q, [*grouped, *qs[-2:]])
    mask = None if op.mask is None else _split_head_dim(op.mask, grouped[-1], reshaped)
    new = gi.SdpaOp.make(q, k, v, mask, scale=float(op.scale.value.data), causal=op.is_causal, loc=loc)
    block.insert_op_before(new, op)
    op.result.replace_all_uses_with(reshaped(new.result, g.shape_of(op.result)))
    block.erase_op(op)
    remarks.emit(PASS, "passed", f"graph.sdpa's k and v are repeat_kv copies: grouped-query attention, each "
                 f"k/v head serves {grouped[-1]} query heads (no copies)", loc)
    return 1


def _batch(shape: Sequence[int]) -> int:
    return math.prod(shape[:-2])


def _not_rewritable(ch: AttentionChain) -> str | None:
    """Why the chain cannot become one sdpa (None: it can)."""
    if any(not isinstance(v, g.ReshapeOp) for v in ch.views):
        kinds = sorted({v.name.removeprefix("graph.") for v in ch.views if not isinstance(v, g.ReshapeOp)})
        return f"a {', '.join(kinds)} between the matmuls and the softmax (softmax in another precision or layout)"
    scores = g.shape_of(ch.softmax.input)
    q, kt, v = g.shape_of(ch.qk.lhs), g.shape_of(ch.qk.rhs), g.shape_of(ch.pv.rhs)
    n = _batch(scores)
    if len(scores) < 2 or _batch(q) != n or _batch(kt) != n or _batch(v) != n:
        return (f"batch dims differ (q {list(q)}, k^T {list(kt)}, v {list(v)}, scores {list(scores)}): "
                "a broadcast or grouped-query expansion")
    dts = {g.element_dtype(x.type) for x in (ch.qk.lhs, ch.qk.rhs, ch.pv.rhs, ch.softmax.input)}
    if len(dts) != 1:
        return "q, k, v and the scores have different element types"
    m = ch.mask
    if m is not None and list(g.shape_of(m.op.results[0])) != list(scores):
        return "the mask is applied in another view of the scores than the softmax's"
    if m is not None and m.kind == "add" and g.element_dtype(m.value.type) not in dts:
        return "the mask's element type differs from the scores'"
    return None


def _rewrite(fn: func.FuncOp, ch: AttentionChain, const: ConstValues, loc: str) -> tuple[bool, int]:
    """Insert the sdpa before the second matmul and use it; (whether it is causal, the
    query heads per k/v head of a grouped-query attention, else 0)."""
    block = fn.body.block
    anchor = ch.pv

    def emit(op: Operation) -> SSAValue:
        block.insert_op_before(op, anchor)
        return op.results[0]

    def reshaped(x: SSAValue, shape: Sequence[int]) -> SSAValue:
        return x if list(g.shape_of(x)) == list(shape) else emit(g.ReshapeOp.make(x, shape, loc=loc))

    scores = list(g.shape_of(ch.softmax.input))
    batch, L, S = scores[:-2], scores[-2], scores[-1]
    E, Ev = g.shape_of(ch.qk.lhs)[-1], g.shape_of(ch.pv.rhs)[-1]
    k = reshaped(_untransposed(ch.qk.rhs, emit, loc), [*batch, S, E])
    v = reshaped(ch.pv.rhs, [*batch, S, Ev])
    mask, causal = _mask(ch, const, scores, emit, loc)
    groups, n = _kv_groups(k, v, batch), 0
    if groups is not None:  # grouped-query: k and v broadcast over each group's heads
        (k, v), batch = groups
        n = batch[-1]
        if mask is not None:
            mask = _split_head_dim(mask, batch[-1], reshaped)
    q = reshaped(ch.qk.lhs, [*batch, L, E])
    out = emit(gi.SdpaOp.make(q, k, v, mask, scale=ch.scale, causal=causal, loc=loc))
    ch.pv.result.replace_all_uses_with(reshaped(out, g.shape_of(ch.pv.result)))
    return causal, n


def _kv_groups(k: SSAValue, v: SSAValue, batch: list[int]) -> tuple[tuple[SSAValue, SSAValue], list[int]] | None:
    """Grouped-query attention's `repeat_kv`: k and v ``reshape(expand(x))`` with x
    ``[*b, g, 1, S, E]`` expanded to ``[*b, g, n, S, E]`` and the heads merged (g n = the
    softmax's head dim). Returns ((x_k, x_v), the batch dims ``[*b, g, n]``), so sdpa
    broadcasts each group's k and v over its n heads instead of materialising copies."""
    found = []
    for t in (k, v):
        e = t.owner
        while isinstance(e, g.ReshapeOp):
            e = e.operands[0].owner
        if not isinstance(e, g.ExpandOp):
            return None
        src, full = g.shape_of(e.operands[0]), g.shape_of(e.results[0])
        if len(full) != len(batch) + 3 or list(full[:-4]) != list(batch[:-1]) or src[-3] != 1 or full[-3] == 1:
            return None
        if full[-4] * full[-3] != batch[-1] or list(src[:-3]) != list(full[:-3]) or src[-2:] != full[-2:]:
            return None
        found.append((e.operands[0], list(full[:-2])))
    (xk, bk), (xv, bv) = found
    if bk != bv:
        return None
    return (xk, xv), bk


def _split_head_dim(mask: SSAValue, n: int, reshaped) -> SSAValue:
    """The mask in the grouped batch dims: its head dim (the one before ``[L, S]``, which
    lines up with the scores' head dim) split into (groups, n), or a unit dim added beside
    it when the mask broadcasts over heads."""
    shape = list(g.shape_of(mask))
    i = len(shape) - 3  # the head dim
    if i < 0:  # no head dim: broadcasting from the right covers the groups
        return mask
    d = shape[i]
    new = shape[:i] + ([1, 1] if d == 1 else [d // n, n]) + shape[i + 1:]
    return reshaped(mask, new)


def _untransposed(kt: SSAValue, emit, loc: str) -> SSAValue:
    """k from k^T: under a reshape of a permute swapping the last two dims, the permute's
    input (no copy); else an explicit transpose."""
    owner = kt.owner
    if isinstance(owner, g.ReshapeOp):
        inner = owner.operands[0].owner
        if isinstance(inner, g.PermuteOp) and _swaps_last_two(inner.permutation):
            k = inner.operands[0]
            if _batch(g.shape_of(k)) == _batch(g.shape_of(kt)):
                return k
    if isinstance(owner, g.PermuteOp) and _swaps_last_two(owner.permutation):
        return owner.operands[0]
    r = len(g.shape_of(kt))
    return emit(g.PermuteOp.make(kt, [*range(r - 2), r - 1, r - 2], loc=loc))


def _swaps_last_two(perm: Sequence[int]) -> bool:
    r = len(perm)
    return r >= 2 and list(perm) == [*range(r - 2), r - 1, r - 2]


def _mask(ch: AttentionChain, const: ConstValues, scores: list[int], emit, loc: str) -> tuple[SSAValue | None, bool]:
    """(sdpa's additive mask or None, causal)."""
    m = ch.mask
    if m is None:
        return None, False
    dt = g.element_dtype(ch.softmax.input.type)
    L, S = scores[-2], scores[-1]
    tril = np.tril(np.ones((L, S), dtype=bool))
    if m.kind == "add":
        values = const(m.value)
        if values is not None:
            dropped = masked(values, g.element_dtype(m.value.type))
            pure = not bool(np.any(values[~dropped] != 0))
            if pure and _is_tril(~dropped, scores, tril):
                return None, True
        mask = m.value
        if ch.scale_after_mask and ch.scale != 1.0 and not (values is not None and pure):
            mask = emit(g.MulOp.make(mask, emit(g.ConstantOp.make(float(ch.scale), dt, loc=loc)), loc=loc))
        return mask, False
    assert m.fill is not None
    cond = const(m.value)
    if cond is not None:
        keep = (cond != 0) if m.keep_when else (cond == 0)
        if _is_tril(keep, scores, tril):
            return None, True
    zero = emit(g.ConstantOp.make(0.0, dt, loc=loc))
    fill = m.fill if g.element_dtype(m.fill.type) == dt else emit(g.CastOp.make(m.fill, dt, loc=loc))
    x, y = (zero, fill) if m.keep_when else (fill, zero)
    return emit(gi.WhereOp.make(m.value, x, y, loc=loc)), False


def _is_tril(keep: np.ndarray, scores: list[int], tril: np.ndarray) -> bool:
    """Whether `keep` (broadcasting to the scores) keeps exactly the causal pairs. Only
    the last two dims are expanded (a mask shared by every head is compared once, not
    per head: a [1, 1, 2048, 2050] prefill mask against [1, 32, 2048, 2050] scores)."""
    try:
        if np.broadcast_shapes(keep.shape, tuple(scores)) != tuple(scores):
            return False
    except ValueError:
        return False
    return bool(np.all(np.broadcast_to(keep, (*keep.shape[:-2], *tril.shape)) == tril))
