"""merge-linears: linear layers reading one activation become one wider matmul.

Llama's q/k/v projections read the same normalised rows, as do its MLP's gate and up
projections. Each is a matmul by a weight ``[K, N_i]``; with the weights concatenated
along the output dim they are one matmul by ``[K, sum N_i]`` whose result, sliced along
its last dim, gives every original result (the slices are views: the lowering folds a
slice into its reader's offset and strides, passes/graph_to_tile/index.py). Two wins:
the norm feeding them has one reader, so fuse-graph makes it the matmul's prologue
instead of a kernel of its own (where A has more than one row: a decode GEMV keeps the
norm as its own row-split kernel, passes/graph_to_tile/fused.py), and a decode step's
GEMV streams one wider weight from HBM in one kernel instead of three narrower ones.

A group is the matmuls whose A operand is the same value (or the same view of one value:
reshapes of it to the same type) and whose B operand is a 2-D `graph.weight` of one
element type (bf16 / f32, or the one-byte i8 / f8e4m3 of a quantised model, whose
per-channel scale canonicalize-graph has moved past the matmul: passes/graph/lowp_matmul.py).
Each member's chain of single-use epilogue ops by a weight of its N columns (the scale
``mul``, the bias ``add``) is merged too, as far as every member has the same chain;
what differs stays on the member's slice. Weights concatenate in their own storage:
`Bf16Weight` bits stay bf16 bits, a `MetaWeight` (meta-device model) gives a
`MetaWeight` of the merged shape.

Where A has more than one row and the members' results meet in an elementwise op (a
gated MLP's ``silu(gate) * up``) they stay apart: unmerged, that op is the second
matmul's fused epilogue, computed on chip; merged, it would be a vector kernel of its
own over the whole result (one 1B-shaped Llama layer, prefill of 128 tokens: 1.82 M
cycles with gate/up merged, 1.65 M apart). A decode step's GEMV (one row) takes no fused
epilogue (passes/graph_to_tile/fused_matmul.py), so there gate and up merge. A matmul
whose B operand is not a weight (a tensor-parallel segment takes its weights as inputs,
runtime/system_compile.py), or a weight of another element type than the group's
(another quantisation scheme), is left alone with a `missed` remark.

Before::

    %n = graph.rms_norm %x, %g eps 1e-05 : ...
    %wq = graph.weight "q_proj.weight.permute" : tensor<2048x2048xbf16>
    %q = graph.matmul %n, %wq : tensor<1x2048xbf16>, tensor<2048x2048xbf16> -> tensor<1x2048xbf16>
    %wk = graph.weight "k_proj.weight.permute" : tensor<2048x512xbf16>
    %k = graph.matmul %n, %wk : tensor<1x2048xbf16>, tensor<2048x512xbf16> -> tensor<1x512xbf16>

After::

    %w = graph.weight "q_proj.weight.permute+k_proj.weight.permute" : tensor<2048x2560xbf16>
    %qk = graph.matmul %n, %w : tensor<1x2048xbf16>, tensor<2048x2560xbf16> -> tensor<1x2560xbf16>
    %q = graph.slice %qk dim 1 start 0 end 2048 step 1 : ... -> tensor<1x2048xbf16>
    %k = graph.slice %qk dim 1 start 2048 end 2560 step 1 : ... -> tensor<1x512xbf16>

It needs the weights' data, so it runs on the program's weights (`runtime/compiler.py`,
between canonicalize-graph and fuse-graph at -O2), not as a module pass.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from typing import Any, cast

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.bf16_weights import Bf16Weight
from tilecc.ir.meta_weights import MetaWeight
from tilecc.passes import remarks
from tilecc.passes.graph.canonicalize import dead_code

__all__ = ["merge_linears"]

PASS = "merge-linears"
EPILOGUE = (g.AddOp, g.MulOp)  # bias, per-channel scale
ELEMENTWISE = (g.UnaryElementwiseOp, g.BinaryElementwiseOp, g.CastOp, g.ReshapeOp)  # and views


def merge_linears(module: ModuleOp, weights: MutableMapping[str, Any]) -> int:
    """Merge every group of linears in `module` (see the module docstring); the merged
    weights go into `weights`, and the sources nothing reads any more leave it. The
    number of matmuls removed."""
    removed = 0
    replaced: set[str] = set()
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        count = sum(_merge(fn, group, weights, replaced) for group in _groups(fn, weights))
        if count:
            dead_code(fn)
        removed += count
    if replaced:
        used = {op.weight for op in module.walk() if isinstance(op, g.WeightOp)}
        for name in replaced - used:
            del weights[name]
    return removed


def _weight(v: SSAValue) -> g.WeightOp | None:
    op = v.owner
    return op if isinstance(op, g.WeightOp) else None


def _source(a: SSAValue) -> tuple[SSAValue, object]:
    """The value A's rows come from, with A's type: two reshapes of one value to one type are one A."""
    owner = a.owner
    if isinstance(owner, g.ReshapeOp):
        return owner.operands[0], a.type
    return a, a.type


def _groups(fn: func.FuncOp, weights: MutableMapping[str, object]) -> list[list[g.MatmulOp]]:
    by_a: dict[tuple[SSAValue, object], list[g.MatmulOp]] = {}
    for op in fn.body.block.ops:
        if isinstance(op, g.MatmulOp) and len(g.shape_of(op.operands[1])) == 2:
            by_a.setdefault(_source(op.operands[0]), []).append(op)
    groups = []
    for mms in by_a.values():
        if len(mms) < 2:
            continue
        consts = [m for m in mms if (w := _weight(m.operands[1])) is not None and w.weight in weights]
        for m in mms:
            if m not in consts and consts:
                remarks.emit(PASS, "missed", f"did not merge {_where(m)} with {len(consts)} linear(s) on the same "
                             "input: its weight is not a compile-time constant", g.source_loc(m))
        by_type: dict[object, list[g.MatmulOp]] = {}
        for m in consts:
            by_type.setdefault(m.operands[1].type.element_type, []).append(m)  # pyright: ignore[reportAttributeAccessIssue]
        if len(by_type) > 1:
            kinds = ", ".join(f"{len(ms)} with {t}" for t, ms in by_type.items())
            remarks.emit(PASS, "missed", f"linears on one input have weights of different element types "
                         f"(quantisation schemes: {kinds}); merged only those of one type", g.source_loc(consts[0]))
        groups += [ms for ms in by_type.values() if len(ms) >= 2]
    return groups


def _where(op: Operation) -> str:
    return f"{op.name} ({g.source_loc(op) or 'no location'})"


def _chain(mm: g.MatmulOp) -> list[tuple[Operation, int, g.WeightOp]]:
    """`mm`'s epilogue: (op, index of the chain's operand, the weight of N columns), each
    op the single user of the previous value."""
    n = g.shape_of(mm.results[0])[-1]
    out = []
    v = mm.results[0]
    while v.has_one_use():
        user = v.get_user_of_unique_use()
        if not isinstance(user, EPILOGUE) or user.results[0].type != v.type:
            break
        idx = 0 if user.operands[0] is v else 1
        w = _weight(user.operands[1 - idx])
        shape = g.shape_of(user.operands[1 - idx])
        if w is None or not shape or shape[-1] != n or any(d != 1 for d in shape[:-1]):
            break
        out.append((user, idx, w))
        v = user.results[0]
    return out


def _meet(mms: list[g.MatmulOp], depth: int = 6) -> bool:
    """Whether the results of two of `mms` reach one elementwise op within `depth`
    elementwise steps (each member's epilogue chain included)."""
    seen: dict[Operation, int] = {}
    for i, m in enumerate(mms):
        frontier, mine = [m.results[0]], set()
        for _ in range(depth):
            users = {u.operation for v in frontier for u in v.uses if isinstance(u.operation, ELEMENTWISE)}
            users -= mine
            mine |= users
            frontier = [r for op in users for r in op.results]
        for op in mine:
            if seen.setdefault(op, i) != i:
                return True
    return False


def _signature(op: Operation, idx: int, w: g.WeightOp) -> tuple:
    return type(op), idx, len(g.shape_of(w.result)), w.result.type.element_type  # pyright: ignore[reportAttributeAccessIssue]


def _merge(fn: func.FuncOp, mms: list[g.MatmulOp], weights: MutableMapping[str, object], replaced: set[str]) -> int:
    ws = [_weight(m.operands[1]) for m in mms]
    assert all(w is not None for w in ws)
    wops: list[g.WeightOp] = [w for w in ws if w is not None]
    values = [weights[w.weight] for w in wops]
    if any(isinstance(v, MetaWeight) for v in values) and not all(isinstance(v, MetaWeight) for v in values):
        remarks.emit(PASS, "missed", "linears on one input mix weights with and without values", g.source_loc(mms[0]))
        return 0
    rows = math.prod(g.shape_of(mms[0].operands[0])[:-1])
    if rows > 1 and _meet(mms):
        remarks.emit(PASS, "missed", f"did not merge {len(mms)} linears on one input of {rows} rows: their results "
                     "meet in an elementwise op (a gated MLP's silu(gate) * up), which one matmul's fused epilogue "
                     "computes on chip; merged, it would be a vector kernel of its own over the whole result",
                     g.source_loc(mms[0]))
        return 0
    chains = [_chain(m) for m in mms]
    depth = 0
    while all(len(c) > depth for c in chains) and len({_signature(*c[depth]) for c in chains}) == 1:
        depth += 1
    ns = [g.shape_of(m.results[0])[-1] for m in mms]
    block = fn.body.block
    first = min(mms, key=lambda m: block.get_operation_index(m))
    loc = g.source_loc(first)
    new_ops: list[Operation] = []

    def merged_weight(srcs: list[g.WeightOp]) -> SSAValue:
        name = _fresh(weights, "+".join(w.weight for w in srcs))
        weights[name] = _concat([_shaped(weights[w.weight], g.shape_of(w.result)) for w in srcs])
        replaced.update(w.weight for w in srcs)
        t0 = srcs[0].result.type
        shape = list(g.shape_of(srcs[0].result))
        shape[-1] = sum(g.shape_of(w.result)[-1] for w in srcs)
        op = g.WeightOp.make(name, g.tensor_type(shape, g.element_dtype(t0)), loc=loc)
        new_ops.append(op)
        return op.results[0]

    mm = g.MatmulOp.make(first.operands[0], merged_weight(wops), loc=loc)
    new_ops.append(mm)
    v = mm.results[0]
    for d in range(depth):
        op0, idx, _w = chains[0][d]
        w = merged_weight([c[d][2] for c in chains])
        make = cast(Any, type(op0)).make  # a graph op class: every one has make
        step = make(*((v, w) if idx == 0 else (w, v)), loc=g.source_loc(op0))
        new_ops.append(step)
        v = step.results[0]
    lasts = [c[depth - 1][0].results[0] if depth else m.results[0] for m, c in zip(mms, chains, strict=True)]
    dim = len(g.shape_of(v)) - 1
    offset = 0
    slices = []
    for n, old in zip(ns, lasts, strict=True):
        s = gi.SliceOp.make(v, dim, offset, offset + n, 1, loc=g.source_loc(old.owner))  # pyright: ignore[reportArgumentType]
        offset += n
        new_ops.append(s)
        slices.append((old, s))
    block.insert_ops_before(new_ops, first)
    for old, s in slices:
        old.replace_all_uses_with(s.results[0])
    remarks.emit(PASS, "passed", lambda: f"merged {len(mms)} linears on one input into one matmul "
                 f"[{g.shape_of(mm.operands[1])[0]} x {sum(ns)}] (N = {' + '.join(map(str, ns))})"
                 + (f" with {depth} epilogue op(s) each" if depth else ""), loc)
    return len(mms) - 1


def _shaped(value: object, shape: tuple[int, ...]) -> object:
    """`value` (an array, `Bf16Weight` or `MetaWeight`) in the shape its `graph.weight` has."""
    if isinstance(value, (Bf16Weight, MetaWeight)):
        return value.reshape(*shape)
    return np.asarray(value).reshape(shape)


def _concat(values: list[object]) -> object:
    """The weights `values` side by side along their last dim, in their storage."""
    if all(isinstance(v, MetaWeight) for v in values):
        metas = [v for v in values if isinstance(v, MetaWeight)]
        shape = (*metas[0].shape[:-1], sum(m.shape[-1] for m in metas))
        return MetaWeight(shape, metas[0].dtype)
    if all(isinstance(v, Bf16Weight) for v in values):
        return Bf16Weight(np.concatenate([v.bits for v in values if isinstance(v, Bf16Weight)], axis=-1))
    arrays = [np.asarray(v) for v in values]
    return np.concatenate(arrays, axis=-1)


def _fresh(weights: MutableMapping[str, object], name: str) -> str:
    base, i = name, 1
    while name in weights:
        name, i = f"{base}.{i}", i + 1
    return name
