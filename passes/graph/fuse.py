"""fuse-graph: group the graph ops that become one kernel into `graph.fused` regions.

Each group keeps its intermediates on chip; only its outputs (values used outside the
group) reach HBM. Groups, formed greedily in program order (as XLA's and TVM's
producer-consumer fusion do):

- **matmul** (kind ``matmul``): a `graph.matmul` with its epilogue (elementwise ops on
  its result: bias, activation, residual add, scaling, casts) and, when the A operand
  is a layer norm or RMS norm used only by this matmul, that norm (with its own prologue)
  as the producer of the A rows; a norm that several matmuls read as their A rows (the
  gate and up projections of a Llama MLP) is the prologue of the first, which yields it;
  a one-row matmul (a CNN's classifier head at batch 1) takes the global average pool
  producing its row (`graph.mean` over the spatial dims, through reshapes);
- **row-wise** (kind ``rowwise``): a layer norm or RMS norm over the last dim, a softmax or
  log_softmax along the last dim, with an elementwise prologue producing its input
  (a residual add: its value, used later, becomes a second output) and an
  elementwise epilogue;
- **elementwise** (kind ``elementwise``): connected elementwise ops over one iteration
  space (e.g. a decomposed activation), any number of inputs and outputs.

A convolution's chain of single-use elementwise consumers (batch norm, residual add,
activation) is left to the convolution lowering, which fuses it into its epilogue.

Shapes that differ only by unit dims are one iteration space, so a reshape that only
adds or removes unit dims fuses (``[512, 3072] -> [1, 512, 3072]``). Scalar constants
are cloned into the regions (they become immediates); weights and larger constants are
inputs. A group is formed only when no path leaves it and re-enters it (the result
stays acyclic); the function is then re-ordered topologically.

Before::

    %m = graph.matmul %a, %w : ...
    %y = graph.add %m, %bias : ...
    %z = graph.gelu %y approximate "tanh" : ...

After::

    %z = graph.fused "matmul" (%a, %w, %bias) : (...) -> tensor<...> {
    ^bb0(%a1: ..., %w1: ..., %b1: ...):
      %m = graph.matmul %a1, %w1 : ...
      %y = graph.add %m, %b1 : ...
      %z1 = graph.gelu %y approximate "tanh" : ...
      graph.yield %z1 : ...
    }
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TypeGuard

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.graph_nn import MeanOp
from tilecc.passes import remarks
from tilecc.passes.session import CompileSession
from tilecc.passes.vector_fns import elementwise_fn

NORMS = (g.LayerNormOp, g.RmsNormOp)  # the row-wise ops a matmul takes as its prologue


def squeezed(t: Attribute) -> tuple[int, ...]:
    assert isinstance(t, TensorType)
    return tuple(int(d) for d in t.get_shape() if d != 1)


def is_transparent(op: Operation) -> bool:
    """A reshape that only adds or removes unit dims."""
    return isinstance(op, g.ReshapeOp) and squeezed(op.operands[0].type) == squeezed(op.results[0].type)


def keeps_rows(op: Operation) -> bool:
    """A reshape that keeps the last dim (rows of it merge or split): a layer norm over
    the last dim computes the same rows before or after it."""
    a, r = g.shape_of(op.operands[0]), g.shape_of(op.results[0])
    return len(a) >= 1 and len(r) >= 1 and a[-1] == r[-1]


def is_free(op: Operation) -> bool:
    return isinstance(op, (g.WeightOp, g.ConstantOp))


def is_scalar_const(op: Operation | Block | None) -> TypeGuard[g.ConstantOp]:
    return isinstance(op, g.ConstantOp) and op.values().size == 1


def is_elementwise(op: Operation) -> bool:
    return elementwise_fn(op) is not None or isinstance(op, g.ReshapeOp)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def compatible(op: Operation, space: tuple[int, ...], inside: set[Operation]) -> bool:
    """Whether elementwise `op` computes in a group of iteration space `space`: its
    result is that space up to unit dims, or has as many elements (a reshape in
    between) with every operand from outside the group a scalar or a whole tensor
    (viewed in the group's space; a broadcast would not map)."""
    mine = squeezed(op.results[0].type)
    if mine == space:
        return True
    if _numel(mine) != _numel(space):
        return False
    for v in op.operands:
        p = v.owner
        if isinstance(p, Operation) and p in inside:
            continue
        if not (is_scalar_const(p) or _numel(squeezed(v.type)) == _numel(space)):
            return False
    return True


def is_rowwise(op: Operation) -> bool:
    """The row-wise ops a fused kernel computes on whole rows of the last dim."""
    if isinstance(op, g.LayerNormOp):
        shape = g.shape_of(op.results[0])
        return op.normalized_ndim.value.data == 1 and len(shape) >= 1 and shape[-1] > 1
    if isinstance(op, g.RmsNormOp):
        return g.shape_of(op.results[0])[-1] > 1
    if isinstance(op, (g.SoftmaxOp, gi.LogSoftmaxOp)):
        shape = g.shape_of(op.results[0])
        dim = op.dim.value.data if isinstance(op, g.SoftmaxOp) else op.axis
        return len(shape) >= 1 and dim == len(shape) - 1 and shape[-1] > 1
    return False


def is_matmul(op: Operation) -> bool:
    return isinstance(op, g.MatmulOp) and all(len(g.shape_of(v)) >= 2 for v in op.operands)


@dataclass(eq=False)
class _Group:
    kind: str
    anchor: Operation | None
    ops: list[Operation] = field(default_factory=list)
    # values computed from the anchor's result (a matmul's epilogue works on them only)
    epilogue: set[SSAValue] = field(default_factory=set)

    @property
    def space(self) -> tuple[int, ...]:
        """The iteration space an elementwise op joins: the anchor's result space."""
        op = self.anchor if self.anchor is not None else self.ops[0]
        return squeezed(op.results[0].type)


class Fuser:
    def __init__(self, fn: func.FuncOp, session: CompileSession | None = None):
        self.fn = fn
        self.pos = {op: i for i, op in enumerate(fn.body.block.ops)}
        self.group: dict[Operation, _Group] = {}
        self.session = session
        # ops an earlier attempt failed to lower fused (passes/fallback.py): left alone
        self.excluded: set[Operation] = set()
        if session is not None and fn.sym_name.data == "forward":
            session.numbering.number(list(fn.body.block.ops))
            no_fuse = session.fallback.no_fuse
            self.excluded = {op for op, i in session.numbering.ordinal.items() if i in no_fuse}

    # ---- legality ---------------------------------------------------------------
    def legal(self, ops: set[Operation]) -> bool:
        """No path from `ops` through ops outside back into `ops`."""
        last = max(self.pos[o] for o in ops)
        seen: set[Operation] = set()
        frontier = [u.operation for o in ops for r in o.results for u in r.uses if u.operation not in ops]
        while frontier:
            op = frontier.pop()
            if op in seen or op not in self.pos or self.pos[op] > last:
                continue
            seen.add(op)
            for r in op.results:
                for u in r.uses:
                    if u.operation in ops:
                        return False
                    frontier.append(u.operation)
        return True

    def merge(self, into: _Group, other: _Group) -> None:
        into.ops = sorted(set(into.ops) | set(other.ops), key=self.pos.__getitem__)
        into.epilogue |= other.epilogue
        for o in other.ops:
            self.group[o] = into

    def add(self, grp: _Group, op: Operation, epilogue: bool) -> None:
        grp.ops.append(op)
        self.group[op] = grp
        if epilogue:
            grp.epilogue.update(op.results)

    # ---- grouping ---------------------------------------------------------------
    def run(self) -> int:
        owned = _conv_epilogues(self.fn)
        for op in list(self.fn.body.block.ops):
            if op in owned or op in self.excluded:
                continue
            if is_matmul(op):
                grp = _Group("matmul", op, [op], set(op.results))
                self.group[op] = grp
                self.matmul_prologue(grp)
            elif is_rowwise(op):
                grp = _Group("rowwise", op, [op], set(op.results))
                self.group[op] = grp
                self.rowwise_prologue(grp)
            elif is_elementwise(op):
                self.place(op)
        if remarks.enabled():
            self.explain_missed()
        return self.materialise()

    def producer_group(self, v: SSAValue) -> _Group | None:
        op = v.owner
        return self.group.get(op) if isinstance(op, Operation) else None

    def rowwise_prologue(self, grp: _Group) -> None:
        """An elementwise group producing the row-wise op's input joins as its prologue."""
        anchor = grp.anchor
        if anchor is None:  # a row-wise group is made with its op as the anchor
            raise CompileError("fuse: a row-wise group without its row-wise op")
        prod = self.producer_group(anchor.operands[0])
        if prod is None or prod.kind != "elementwise":
            return
        if any(not compatible(o, grp.space, set(prod.ops)) for o in prod.ops):
            return
        if self.legal(set(prod.ops) | set(grp.ops)):
            self.merge(grp, prod)
            grp.epilogue = set(anchor.results)

    def matmul_prologue(self, grp: _Group) -> None:
        """A layer norm (with its prologue, no epilogue) whose result only this matmul
        reads, as its A operand rows: computed on chip, never stored. A result that
        later matmuls read as their A rows too (Llama's MLP norm, read by the gate and
        up projections) joins the first of them, which also stores it for the others:
        the norm is computed once, under that matmul, instead of as a kernel ahead of it."""
        mm = grp.anchor
        assert mm is not None
        if self.mean_prologue(grp):
            return
        a = mm.operands[0]
        shared = not a.has_one_use() and self.rows_of_later_matmuls(a, mm)
        chain: list[Operation] = []
        while isinstance(a.owner, g.ReshapeOp) and keeps_rows(a.owner) and (
                a.has_one_use() or (shared and a is mm.operands[0])):
            chain.append(a.owner)
            a = a.owner.operands[0]
        ln = a.owner
        if any(c in self.excluded for c in chain):
            return
        prod = self.group.get(ln) if isinstance(ln, Operation) else None
        single = a.has_one_use() or (shared and a is mm.operands[0])
        if prod is None or prod.kind != "rowwise" or not isinstance(ln, NORMS) or not single:
            return
        if prod.anchor is not ln or any(self.pos[o] > self.pos[ln] and o not in chain for o in prod.ops):
            return  # the layer norm's group has an epilogue: keep it a kernel of its own
        if len(g.shape_of(mm.operands[0])) != 2 or len(g.shape_of(mm.operands[1])) != 2:
            return
        merged = set(prod.ops) | set(grp.ops) | set(chain)
        if self.legal(merged):
            for c in chain:
                self.group[c] = grp
            grp.ops = sorted(merged, key=self.pos.__getitem__)
            for o in prod.ops:
                self.group[o] = grp

    def mean_prologue(self, grp: _Group) -> bool:
        """A global average pool as a one-row matmul's prologue (a CNN's classifier
        head: the mean over the spatial dims of ``[1, C, H, W]``, reshaped to the
        ``[1, C]`` row): the matmul's kernel reduces the map into its A row on chip
        (`norm_gemv.py`), so the pool is no kernel of its own."""
        mm = grp.anchor
        assert mm is not None
        row = g.shape_of(mm.operands[0])
        if len(row) != 2 or row[0] != 1 or len(g.shape_of(mm.operands[1])) != 2:
            return False
        v, chain = mm.operands[0], []
        while isinstance(v.owner, g.ReshapeOp):  # single-use reshapes of the pooled row
            if not v.has_one_use():
                return False
            chain.append(v.owner)
            v = v.owner.operands[0]
        mean = v.owner
        if not isinstance(mean, MeanOp) or not v.has_one_use():
            return False
        x = g.shape_of(mean.operands[0])
        if len(x) < 3 or x[0] != 1 or x[1] != row[1] or mean.axes != tuple(range(2, len(x))):
            return False
        if mean in self.group or any(o in self.excluded for o in [*chain, mean]):
            return False
        # a reshape that only drops unit dims may sit in an elementwise group of reshapes
        if any(c in self.group and not all(isinstance(o, g.ReshapeOp) for o in self.group[c].ops) for c in chain):
            return False
        merged = set(grp.ops) | set(chain) | {mean}
        if not self.legal(merged):
            return False
        for c in chain:
            if c in self.group:
                self.group[c].ops.remove(c)
        for o in [*chain, mean]:
            self.group[o] = grp
        grp.ops = sorted(merged, key=self.pos.__getitem__)
        return True

    def rows_of_later_matmuls(self, v: SSAValue, mm: Operation) -> bool:
        """Whether every user of `v` is a matmul reading it as its A rows, `mm` the
        first of them in program order."""
        users = [u.operation for u in v.uses]
        return all(is_matmul(u) and u.operands[0] is v and u not in self.excluded and self.pos[u] >= self.pos[mm]
                   for u in users)

    def place(self, op: Operation) -> None:
        cands: list[_Group] = []
        for v in op.operands:
            grp = self.producer_group(v)
            if grp is None or grp in cands or not compatible(op, grp.space, set(grp.ops)):
                continue
            if grp.kind == "matmul" and v not in grp.epilogue:
                continue  # a matmul's prologue values are rows of A, not output tiles
            if grp.kind == "rowwise" and grp.anchor is not None and self.pos[grp.anchor] > self.pos[op]:
                continue
            cands.append(grp)
        anchored = [c for c in cands if c.kind != "elementwise"]
        target: _Group | None = None
        for c in anchored + [c for c in cands if c.kind == "elementwise"]:
            if self.legal(set(c.ops) | {op}):
                target = c
                break
        if target is None:
            grp = _Group("elementwise", None, [op])
            self.group[op] = grp
            return
        on_epilogue = any(v in target.epilogue for v in op.operands)
        self.add(target, op, on_epilogue or target.kind == "elementwise")
        if target.kind == "elementwise":
            target.epilogue.update(op.results)
        for c in cands:  # other elementwise producers in the same space join too
            if c is target or c.kind != "elementwise" or self.group.get(op) is not target:
                continue
            if c.space != target.space:
                continue
            if target.kind == "matmul" and _feeds(c.ops, target.anchor, self.pos):
                continue  # it computes the matmul's operands: a kernel before it, not its epilogue
            if self.legal(set(c.ops) | set(target.ops)):
                self.merge(target, c)
        target.ops.sort(key=self.pos.__getitem__)

    # ---- remarks ----------------------------------------------------------------
    def explain_missed(self) -> None:
        """One `missed` remark per producer -> consumer edge between two groups that
        fusion could have joined: why the consumer did not join the producer's group."""
        seen: set[tuple[int, int]] = set()
        for op in self.fn.body.block.ops:
            mine = self.group.get(op)
            if mine is None or is_transparent(op):
                continue
            for v in op.operands:
                prod = self.producer_group(v)
                if prod is None or prod is mine or (id(prod), id(mine)) in seen:
                    continue
                if all(isinstance(o, g.ReshapeOp) for o in prod.ops):
                    continue  # a view, not a kernel
                seen.add((id(prod), id(mine)))
                why = self.why_not(op, v, prod, mine)
                if why:
                    remarks.emit("fuse-graph", "missed", f"did not fuse {op.name} into the {prod.kind} group of "
                                 f"{_describe(prod.ops, 3)} ({g.source_loc(prod.ops[0])}): {why}", g.source_loc(op))

    def why_not(self, op: Operation, v: SSAValue, prod: _Group, mine: _Group) -> str:
        if mine.anchor is op and op is not None:
            if is_matmul(op):
                a = v
                while isinstance(a.owner, g.ReshapeOp):  # the rows of A through reshapes
                    a = a.owner.operands[0]
                users = sum(1 for _ in a.uses)
                if isinstance(a.owner, NORMS) and users > 1:
                    return (f"the norm's result has {users} users (a prologue feeds one matmul, or the first of "
                            "matmuls reading it as their A rows)")
                if prod.kind == "matmul":
                    return ("its A rows are another matmul's output, and a matmul takes only a single-use layer "
                            "norm or RMS norm as its prologue (fuse-mlp joins an MLP's two projections instead)")
                return ("a matmul takes only a single-use layer norm or RMS norm as its prologue (a one-row "
                        "matmul also a global average pool)")
            return f"{op.name} starts a {mine.kind} kernel; only an elementwise group joins it as prologue"
        if mine.kind != "elementwise" and mine.anchor is not None and prod.kind != "elementwise":
            return f"it belongs to the {mine.kind} group of {mine.anchor.name}"
        if not compatible(op, prod.space, set(prod.ops)):
            return (f"its iteration space {list(squeezed(op.results[0].type))} differs from the group's "
                    f"{list(prod.space)}")
        if prod.kind == "matmul" and v not in prod.epilogue:
            return "it reads the matmul's A rows (the prologue), not its output tiles"
        if not self.legal(set(prod.ops) | {op}):
            return "the merged group would have a path that leaves it and re-enters (a cycle)"
        return f"it joined the {mine.kind} group of {_describe(mine.ops, 3)} first"

    # ---- rewriting --------------------------------------------------------------
    def materialise(self) -> int:
        """Wrap every group of two or more ops in a graph.fused; re-order the body."""
        block = self.fn.body.block
        ops = list(block.ops)
        for grp in {id(x): x for x in self.group.values()}.values():
            _trim(grp)
        self.group = {o: grp for grp in {id(x): x for x in self.group.values()}.values() for o in grp.ops}
        groups: list[_Group] = []
        for op in ops:
            grp = self.group.get(op)
            if grp is not None and grp not in groups and len([o for o in grp.ops if not is_transparent(o)]) >= 2:
                groups.append(grp)
        if not groups:
            return 0
        unit: dict[Operation, Operation | _Group] = {op: op for op in ops}
        for grp in groups:
            for o in grp.ops:
                unit[o] = grp
        order = _topological(ops, unit, self.pos)
        for op in ops:
            op.detach()
        for u in order:
            if isinstance(u, _Group):
                block.add_op(self.build(u))
            else:
                block.add_op(u)
        for grp in groups:
            for o in reversed(grp.ops):
                o.erase()
        return len(groups)

    def build(self, grp: _Group) -> FusedOp:
        inside = set(grp.ops)
        inputs: list[SSAValue] = []
        scalars: list[Operation] = []
        for o in grp.ops:
            for v in o.operands:
                p = v.owner
                if isinstance(p, Operation) and p in inside:
                    continue
                if is_scalar_const(p):
                    if p not in scalars:
                        scalars.append(p)
                elif v not in inputs:
                    inputs.append(v)
        outputs = [r for o in grp.ops for r in o.results if any(u.operation not in inside for u in r.uses)]
        body = Block(arg_types=[v.type for v in inputs])
        mapping: dict[SSAValue, SSAValue] = dict(zip(inputs, body.args))
        for c in scalars:
            clone = c.clone()
            body.add_op(clone)
            mapping[c.results[0]] = clone.results[0]
        for o in grp.ops:
            clone = o.clone(value_mapper=mapping)
            body.add_op(clone)
            for a, b in zip(o.results, clone.results):
                mapping[a] = b
        body.add_op(YieldOp(*[mapping[v] for v in outputs]))
        fused = FusedOp(grp.kind, inputs, [v.type for v in outputs], Region(body))
        if self.session is not None:
            numbering = self.session.numbering
            numbering.members[fused] = frozenset(numbering.ordinal[o] for o in grp.ops if o in numbering.ordinal)
        anchor = grp.anchor if grp.anchor is not None else grp.ops[0]
        g.set_loc(fused, g.source_loc(anchor))
        remarks.emit("fuse-graph", "passed", lambda: (
            f"fused {_describe(grp.ops)} into one {grp.kind} kernel ({len(inputs)} inputs, "
            f"{len(outputs)} outputs to HBM; intermediates stay on chip)"), g.source_loc(anchor))
        for v, r in zip(outputs, fused.results):
            v.replace_all_uses_with(r)
        return fused


def _feeds(ops: list[Operation], anchor: Operation | None, pos: dict[Operation, int]) -> bool:
    """Whether any of `ops` computes an operand of `anchor`, directly or through other
    ops (the walk stops at ops placed before the earliest of `ops`)."""
    if anchor is None or not ops:
        return False
    inside, first = set(ops), min(pos[o] for o in ops)
    frontier = [v.owner for v in anchor.operands]
    seen: set[Operation] = set()
    while frontier:
        p = frontier.pop()
        if not isinstance(p, Operation) or p in seen or pos.get(p, -1) < first:
            continue
        if p in inside:
            return True
        seen.add(p)
        frontier.extend(v.owner for v in p.operands)
    return False


def _describe(ops: list[Operation], most: int = 8) -> str:
    """``graph.matmul, graph.add, graph.gelu`` (transparent reshapes left out)."""
    names = [o.name.removeprefix("graph.") for o in ops if not is_transparent(o)]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _conv_epilogues(fn: func.FuncOp) -> set[Operation]:
    """The chains of single-use elementwise ops after each convolution: the convolution
    lowering fuses them into its own epilogue (passes/graph_to_tile/nn/), so they are left out
    of the groups formed here."""
    from tilecc.ir import graph_nn as nn

    owned: set[Operation] = set()
    for op in fn.body.block.ops:
        if not isinstance(op, nn.Conv2dOp):
            continue
        cur = op.results[0]
        while cur.has_one_use():
            user = cur.get_user_of_unique_use()
            if user is None or elementwise_fn(user) is None or user.results[0].type != cur.type:
                break
            owned.add(user)
            cur = user.results[0]
    return owned


def _trim(grp: _Group) -> None:
    """Drop reshapes at a group's edge: one only the outside uses is a free view of the
    group's output, one of an input only feeding such reshapes is a view of the input."""
    changed = True
    while changed:
        changed = False
        inside = set(grp.ops)
        for o in list(grp.ops):
            if not isinstance(o, g.ReshapeOp) or o is grp.anchor:
                continue
            users_inside = any(u.operation in inside for u in o.results[0].uses)
            src = o.operands[0].owner
            from_inside = isinstance(src, Operation) and src in inside
            if not users_inside or not from_inside:
                grp.ops.remove(o)
                changed = True


def _topological(
    ops: list[Operation], unit: dict[Operation, Operation | _Group], pos: dict[Operation, int]
) -> list[Operation | _Group]:
    """Units (ops or groups) in an order where each comes after the units it uses;
    ties keep the original program order."""
    first: dict[int, int] = {}
    by_id: dict[int, Operation | _Group] = {}
    for op in ops:
        u = unit[op]
        first.setdefault(id(u), pos[op])
        by_id[id(u)] = u
    users: dict[int, set[int]] = {k: set() for k in first}
    pending: dict[int, set[int]] = {k: set() for k in first}
    for op in ops:
        me = id(unit[op])
        for v in op.operands:
            p = v.owner
            if isinstance(p, Operation) and p in unit and id(unit[p]) != me:
                pending[me].add(id(unit[p]))
                users[id(unit[p])].add(me)
    heap = [(first[k], k) for k in first if not pending[k]]
    heapq.heapify(heap)
    order: list[Operation | _Group] = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(by_id[k])
        for w in sorted(users[k], key=first.__getitem__):
            pending[w].discard(k)
            if not pending[w]:
                heapq.heappush(heap, (first[w], w))
    if len(order) != len(first):
        raise CompileError("fuse-graph: the fusion groups form a cycle")
    return order


def fuse(fn: func.FuncOp, session: CompileSession | None = None) -> int:
    """Fuse the ops of `fn` in place; the number of groups formed. With a `session`, the
    ops of @forward are numbered for fallbacks and those its plan excludes stay unfused."""
    from tilecc.passes.graph.canonicalize import dead_code
    from tilecc.passes.graph.fuse_mlp import fuse_mlp

    n = Fuser(fn, session).run()
    if session is None or "fuse-mlp" not in session.disabled:
        n += fuse_mlp(fn, session)  # up- and down-projection groups joined (fuse_mlp.py)
    dead_code(fn)
    return n


@dataclass(frozen=True)
class FuseGraphPass(ModulePass):
    name = "fuse-graph"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in op.ops:
            if isinstance(f, func.FuncOp):
                fuse(f)
