"""fuse-mlp (a step of fuse-graph): two matmul groups joined by an MLP hidden become one
`graph.fused "mlp"` group, so the hidden activation can stay on chip.

After `Fuser` has formed its groups, a ``matmul`` group (the up projection: an
optional norm prologue, the matmul, a bias and an activation) whose one output only
feeds, through unit-dim reshapes, the A operand of a second ``matmul`` group without a
prologue (the down projection, its bias and a residual add) is wrapped with it in an
``mlp`` group. The two groups stay whole inside it, so the lowering
(passes/graph_to_tile/mlp/) can run them as one kernel whose hidden never reaches HBM,
or, where that kernel does not apply, lower the inner groups as before.

Before::

    %h = graph.fused "matmul" (%x, %w1, %b1) { matmul, add, gelu; graph.yield %g }
    %r = graph.reshape %h : tensor<1x512x3072xbf16> -> tensor<512x3072xbf16>
    %y = graph.fused "matmul" (%r, %w2, %b2, %x) { matmul, add, add; graph.yield %s }

After::

    %y = graph.fused "mlp" (%x, %w1, %b1, %w2, %b2) {
    ^bb0(...):
      %h = graph.fused "matmul" (...) { ... }
      %r = graph.reshape %h
      %y1 = graph.fused "matmul" (%r, ...) { ... }
      graph.yield %y1
    }

A gated MLP (SwiGLU, Llama's ``down(silu(gate(x)) * up(x))``) joins the same way: its up
group is the gate projection whose epilogue multiplies by a bias-free matmul of the same
x, and that matmul joins the group too (`_gate_partner`), with the norm making x when
only the two projections read it (`_norm_of`: the kernel's prologue). fuse-graph's
shared-prologue rule runs first and puts such a norm into the gate projection's group
(which stores it for the up projection; `passes/graph/fuse.py`), so a Llama MLP behind
its norm keeps three matmul kernels: the pair is then no mlp group (the first group has
two outputs). Preferring the mlp group where its weights fit SRAM would need that fit
known at fuse time (a 1B model's MLP weights never fit, and the shared prologue wins).

Not joined (the groups stay as they are): a hidden with another user or more outputs
of the first group, a second group with a prologue, a hidden that is not the second
matmul's A operand.
"""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue

from tilecc.ir import graph as g
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.passes import remarks
from tilecc.passes.session import CompileSession


def _inner_ops(group: FusedOp) -> list[Operation]:
    return [o for o in group.block.ops if not isinstance(o, (YieldOp, g.ConstantOp))]


def _matmul_of(group: FusedOp) -> g.MatmulOp | None:
    mms = [o for o in group.block.ops if isinstance(o, g.MatmulOp)]
    return mms[0] if len(mms) == 1 else None


def _reads_only_as_a(group: FusedOp, arg: SSAValue) -> bool:
    """Whether block argument `arg` of `group` is read only as its matmul's A (through
    reshapes), and the matmul is the group's first computing op (no prologue)."""
    mm = _matmul_of(group)
    if mm is None:
        return False
    ops = _inner_ops(group)
    if any(not isinstance(o, g.ReshapeOp) for o in ops[: ops.index(mm)]):
        return False
    v = arg
    while True:
        uses = list(v.uses)
        if len(uses) != 1:
            return False
        user = uses[0].operation
        if user is mm:
            return uses[0].index == 0
        if not isinstance(user, g.ReshapeOp):
            return False
        v = user.results[0]


def _pair(up: FusedOp) -> tuple[list[Operation], FusedOp] | None:
    """(the reshapes between, the down group) where `up` starts an MLP, else None."""
    mm = _matmul_of(up)
    if up.kind.data != "matmul" or len(up.results) != 1 or mm is None:
        return None
    y = up.block.last_op
    assert isinstance(y, YieldOp)
    ops = _inner_ops(up)
    if y.values[0].owner in ops[: ops.index(mm)] or len(g.shape_of(mm.results[0])) != 2:
        return None  # the output is a prologue value
    v, chain = up.results[0], []
    while True:
        uses = list(v.uses)
        if len(uses) != 1:
            return None
        user = uses[0].operation
        if isinstance(user, g.ReshapeOp):
            chain.append(user)
            v = user.results[0]
            continue
        if not isinstance(user, FusedOp) or user.kind.data != "matmul":
            return None
        if not _reads_only_as_a(user, user.block.args[uses[0].index]):
            return None
        return chain, user


def _strip(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, g.ReshapeOp):
        v = v.owner.operands[0]
    return v


def _gate_partner(up: FusedOp) -> list[Operation]:
    """A gated MLP (SwiGLU: ``act(x @ Wg) * (x @ Wu)``): the bias-free matmul ``x @ Wu``
    (and the reshapes after it) whose product the up group's epilogue reads, with the up
    group's x and a weight of its matmul's shape, used by nothing else; [] where there
    is none."""
    mm = _matmul_of(up)
    if mm is None:
        return []
    a = _strip(mm.operands[0])
    if not isinstance(a, BlockArgument) or a.owner.parent_op() is not up:
        return []
    x = _strip(up.inputs[a.index])
    for v in up.inputs:
        chain: list[Operation] = []
        while isinstance(v.owner, g.ReshapeOp) and v.has_one_use():
            chain.append(v.owner)
            v = v.owner.operands[0]
        um = v.owner
        if not isinstance(um, g.MatmulOp) or not v.has_one_use() or _strip(um.operands[0]) is not x:
            continue
        if um.operands[1].type != mm.operands[1].type or not isinstance(um.operands[1].owner, g.WeightOp):
            continue
        return [*_norm_of(x, {up, um, *chain}), um, *reversed(chain)]
    return []


def _norm_of(x: SSAValue, users: set[Operation]) -> list[Operation]:
    """A gated MLP's x made by a lone layer norm or RMS norm read only by the gate and
    up projections (through reshapes): the norm and those reshapes, its prologue; else []."""
    if not isinstance(x.owner, (g.LayerNormOp, g.RmsNormOp)):
        return []
    found: list[Operation] = [x.owner]
    frontier = [x]
    while frontier:
        for u in list(frontier.pop().uses):
            if u.operation in users:
                continue
            if not isinstance(u.operation, g.ReshapeOp):
                return []
            found.append(u.operation)
            frontier.append(u.operation.results[0])
    return found


def _wrap(up: FusedOp, chain: list[Operation], down: FusedOp, session: CompileSession | None) -> FusedOp:
    members = [*_gate_partner(up), up, *chain, down]
    inside = set(members)
    inputs: list[SSAValue] = []
    for o in members:
        for v in o.operands:
            if not (isinstance(v.owner, Operation) and v.owner in inside) and v not in inputs:
                inputs.append(v)
    body = Block(arg_types=[v.type for v in inputs])
    mapping = dict(zip(inputs, body.args))
    outer_results = list(down.results)
    fused = FusedOp("mlp", inputs, [r.type for r in outer_results], Region(body))
    down.parent_block().insert_op_before(fused, down)  # pyright: ignore[reportOptionalMemberAccess]
    for r, new in zip(outer_results, fused.results):
        r.replace_all_uses_with(new)
    for o in members:
        o.detach()
        o.operands = [mapping.get(v, v) for v in o.operands]
        body.add_op(o)
    body.add_op(YieldOp(*outer_results))
    g.set_loc(fused, g.source_loc(up))
    if session is not None:
        numbering = session.numbering
        numbering.members[fused] = frozenset().union(
            *(numbering.members.get(o, frozenset()) for o in (up, down)),
            *(frozenset({numbering.ordinal[o]}) for o in members if o in numbering.ordinal))
    return fused


def fuse_mlp(fn: func.FuncOp, session: CompileSession | None = None) -> int:
    """Wrap each up-projection group and its down-projection group of `fn` in one
    ``mlp`` group (module docstring); the number formed."""
    n = 0
    for op in list(fn.body.block.ops):
        if not isinstance(op, FusedOp) or op.parent_block() is not fn.body.block:
            continue
        got = _pair(op)
        if got is None:
            continue
        chain, down = got
        # fuse-graph's remark that the down projection's matmul did not join the up
        # group (a matmul takes no matmul as its prologue) is true of fuse-graph's
        # groups but no longer of the kernel: the mlp group joins them
        mm = _matmul_of(down)
        if mm is not None:
            remarks.withdraw("fuse-graph", "missed", g.source_loc(mm), "into the matmul group of")
        # the down group must follow the reshapes and the up group (program order)
        fused = _wrap(op, chain, down, session)
        remarks.emit("fuse-mlp", "passed", "joined the up- and down-projection matmul groups into one mlp "
                     "group (the hidden activation can stay on chip)", g.source_loc(fused))
        n += 1
    return n


__all__ = ["fuse_mlp"]
