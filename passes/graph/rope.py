"""recognise-rope (part of canonicalize-graph): rotary position embedding -> `graph.rope`.

HF Llama, Qwen2, Mistral and Gemma apply rotary embeddings as
``q * cos + rotate_half(q) * sin`` with ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``
on the transposed view ``[B, H, S, D]`` of the projection, cos and sin ``[B, 1, S, D]``
broadcast over heads. Lowered op by op that is five kernels (two muls, neg, concat, add,
some fused) whose tiles are ``[positions x D/2]`` windows of the transposed view: many
DMAs of 64-128 bytes per partition, each paying the fixed DMA latency. As one
`graph.rope` it is one kernel over the projection's natural ``[S, H * D]`` rows
(`passes/graph_to_tile/rope/`).

Before (torch.export of LlamaAttention; views elided)::

    %q  = graph.permute %q4 [0, 2, 1, 3]   : tensor<1x8x4x16xf32> -> tensor<1x4x8x16xf32>
    %a  = graph.mul %q, %cos               : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32> -> ...
    %x1 = graph.slice %q dim 3 start 0 end 8 step 1
    %x2 = graph.slice %q dim 3 start 8 end 16 step 1
    %n  = graph.neg %x2
    %r  = graph.concat %n, %x1 dim 3
    %b  = graph.mul %r, %sin
    %y  = graph.add %a, %b

After::

    %y = graph.rope %q, %cos, %sin : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32>,
        tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>

Operands of the commutative mul and add match in either order. A ``rotate_half`` (the
concat of a negated upper half and the lower half) whose surroundings do not match
stays decomposed, with a ``missed`` remark naming why.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.graph_base import broadcast_shapes
from tilecc.ir.graph_rope import RopeOp
from tilecc.passes import remarks

PASS = "canonicalize-graph"


@dataclass
class RopeMatch:
    x: SSAValue
    cos: SSAValue
    sin: SSAValue
    add: g.AddOp


def recognise_rope(fn: func.FuncOp) -> int:
    """Rewrite every rotary embedding of `fn` into `graph.rope`; the number rewritten."""
    count = 0
    for op in list(fn.body.block.ops):
        if not isinstance(op, gi.ConcatOp) or op.parent is None:
            continue
        x = rotate_half_input(op)
        if x is None:
            continue
        loc = g.source_loc(op)
        found = _match(op, x) if isinstance(x, SSAValue) else x
        if isinstance(found, str):
            remarks.emit(PASS, "missed", f"rotate_half left decomposed: {found}", loc)
            continue
        new = RopeOp.make(found.x, found.cos, found.sin, loc=g.source_loc(found.add))
        found.add.parent_block().insert_op_before(new, found.add)  # type: ignore[union-attr]
        found.add.result.replace_all_uses_with(new.result)
        count += 1
        shape = list(g.shape_of(found.x))
        remarks.emit(PASS, "passed", lambda s=shape: (
            f"rotary embedding (x * cos + rotate_half(x) * sin) over {s} -> graph.rope"),
            g.source_loc(found.add))
    return count


def rotate_half_input(cat: gi.ConcatOp) -> SSAValue | str | None:
    """x when `cat` is ``cat(-x[..., D/2:], x[..., :D/2], dim=-1)``; why not when it is
    the concat of a negated slice and a slice of one tensor along the last dim (a near
    miss); else None."""
    rank = len(g.shape_of(cat.result))
    if int(cat.dim.value.data) not in (rank - 1, -1) or len(cat.inputs) != 2:
        return None
    neg, lo = cat.inputs
    if not isinstance(neg.owner, g.NegOp):
        return None
    hi = neg.owner.operands[0]
    if not (isinstance(hi.owner, gi.SliceOp) and isinstance(lo.owner, gi.SliceOp)):
        return None
    x = hi.owner.input
    if lo.owner.input is not x:
        return None
    D = g.shape_of(x)[-1]
    if D % 2 or not _half(lo.owner, rank, 0, D // 2) or not _half(hi.owner, rank, D // 2, D):
        return (f"the slices are not the two halves of the last dim ({D}) of one tensor "
                "(an interleaved or partial rotation)")
    return x


def _half(s: gi.SliceOp, rank: int, start: int, end: int) -> bool:
    """`s` takes elements [start, end) of the last dim, `end` being that dim's size when
    the slice runs to it (an end past it, as ``x[..., D/2:]`` may export, counts)."""
    dim, stop = int(s.dim.value.data), int(s.end.value.data)
    size = g.shape_of(s.input)[-1]
    if end == size:
        stop = min(stop, size)
    return dim in (rank - 1, -1) and int(s.start.value.data) == start and stop == end and int(s.step.value.data) == 1


def _match(cat: gi.ConcatOp, x: SSAValue) -> RopeMatch | str:
    """The rope around rotate_half `cat` of x, or why it is not one."""
    r = cat.result
    if not r.has_one_use():
        return "rotate_half(x) has other users than one mul"
    m2 = r.get_user_of_unique_use()
    if not isinstance(m2, g.MulOp):
        return f"rotate_half(x) feeds {m2.name if m2 is not None else 'nothing'}, not a mul by sin"
    sin = m2.operands[1] if m2.operands[0] is r else m2.operands[0]
    if not m2.result.has_one_use():
        return "rotate_half(x) * sin has other users than one add"
    add = m2.result.get_user_of_unique_use()
    if not isinstance(add, g.AddOp):
        return f"rotate_half(x) * sin feeds {add.name if add is not None else 'nothing'}, not an add"
    other = add.operands[0] if add.operands[1] is m2.result else add.operands[1]
    m1 = other.owner
    if not isinstance(m1, g.MulOp) or x not in m1.operands:
        return "rotate_half(x) * sin is not added to x * cos"
    cos = m1.operands[1] if m1.operands[0] is x else m1.operands[0]
    if not other.has_one_use():
        return "x * cos has other users than the add"
    shape = list(g.shape_of(x))
    if not 2 <= len(shape) <= 4:
        return f"x has rank {len(shape)}; graph.rope takes [S, D], [H, S, D] or [B, H, S, D]"
    for what, t in (("cos", cos), ("sin", sin)):
        ts = list(g.shape_of(t))
        try:
            full = list(broadcast_shapes("graph.rope", shape, ts))
        except Exception:
            full = None
        if full != shape or not ts or ts[-1] != shape[-1]:
            return f"{what} {ts} does not broadcast to x {shape} with the same last dim"
    types = {v.type.get_element_type() for v in (x, cos, sin, add.result)}  # type: ignore[union-attr]
    if len(types) != 1:
        return "x, cos, sin and the result have different element types (a cast inside the pattern)"
    return RopeMatch(x, cos, sin, add)
