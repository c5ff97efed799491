"""Lowering of `graph.fused` groups (from fuse-graph) to single kernels.

- ``elementwise`` and ``rowwise`` groups become one `ElementwiseKernel`
  (passes/graph_to_tile/elementwise/): the region's ops are the DAG's nodes, its block
  arguments the leaves (loaded once per tile), its yielded values the outputs; a
  row-wise op makes tiles hold whole rows.
- ``matmul`` groups lower as one kernel (passes/graph_to_tile/fused_matmul.py: the epilogue on
  each accumulator tile, the layer-norm prologue producing A rows on chip); where that
  kernel does not apply, as up to three: the prologue as one row-wise kernel, the
  matmul, the epilogue as one elementwise kernel.
- ``mlp`` groups lower as one kernel keeping the hidden on chip
  (passes/graph_to_tile/mlp/), else as their inner ``matmul`` groups.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.passes.graph_to_tile.conversion import lower_op
from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel, add_graph_op
from tilecc.passes.graph_to_tile.rowwise import rms_norm_nodes
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.passes.vector_fns import elementwise_fn

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def squeezed2(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The iteration space of a group: unit dims dropped, at least 2 dims."""
    s = tuple(d for d in shape if d != 1)
    return (1,) * (2 - len(s)) + s if len(s) < 2 else s


def lower_fused(lw: LoweringContext, op: FusedOp, loc: str) -> None:
    """A `graph.fused` group as its kernels (module docstring)."""
    kind = op.kind.data
    _bind(lw, op)
    if kind in ("elementwise", "rowwise"):
        y = op.block.last_op
        assert isinstance(y, YieldOp)
        ops = [o for o in op.block.ops if o is not y]
        if not _lone_rms_norm(lw, ops):
            lower_subdag(lw, ops, list(y.values), loc, _kernel_name(op), _space(ops))
    elif kind == "matmul":
        lower_matmul_group(lw, op, loc)
    elif kind == "mlp":
        from tilecc.passes.graph_to_tile.mlp.entry import lower_mlp_group

        if not lower_mlp_group(lw, op, loc):
            lower_unfused(lw, op)  # its matmul groups, each as above
    else:
        lower_unfused(lw, op)
    _results(lw, op)


def _bind(lw: LoweringContext, op: FusedOp) -> None:
    """Block arguments stand for the group's inputs; scalar constants are immediates;
    a layout offered to a result goes to the value yielded for it."""
    y = op.block.last_op
    assert isinstance(y, YieldOp)
    for res, v in zip(op.results, y.values, strict=True):
        if res in lw.layout_requests:
            lw.layout_requests[v] = lw.layout_requests.pop(res)
    from tilecc.passes.graph_to_tile.nn.state import padded_of, set_padded

    for arg, v in zip(op.block.args, op.inputs, strict=True):
        if v in lw.scalars:
            lw.scalars[arg] = lw.scalars[v]
            continue
        info = padded_of(lw, v)
        if info is not None:  # an activation stored padded (a classifier head's pooled map)
            set_padded(lw, arg, info)
            if v not in lw.values:
                continue  # every user takes it padded (`layout_plan.wants_padded`): no natural copy
        lw.values[arg] = lw.materialise(v)
    for inner in op.block.ops:
        if isinstance(inner, g.ConstantOp):
            lower_op(lw, inner)


def _results(lw: LoweringContext, op: FusedOp) -> None:
    """The group's results are the values yielded for them (and their layouts)."""
    y = op.block.last_op
    assert isinstance(y, YieldOp)
    for res, v in zip(op.results, y.values, strict=True):
        if v in lw.scalars:
            lw.scalars[res] = lw.scalars[v]
        else:
            lw.values[res] = lw.values[v]
        if v in lw.absorbed:
            lw.absorbed[res] = lw.absorbed[v]
        lw.layout_requests.pop(v, None)


def _lone_rms_norm(lw: LoweringContext, ops: list[Operation]) -> bool:
    """Lower `ops` op by op when they are one RMS norm (and views, constants) over few
    rows: its own lowering splits the rows over partitions (rms_norm_split.py), which a
    row-wise DAG cannot. Whether it did."""
    from tilecc.passes.graph_to_tile.rms_norm_split import split_of

    norms = [o for o in ops if not isinstance(o, (g.ReshapeOp, g.ConstantOp))]
    if len(norms) != 1 or not isinstance(norms[0], g.RmsNormOp):
        return False
    shape = shape_of(norms[0].results[0].type)
    if split_of(lw, math.prod(shape[:-1]), shape[-1]) is None:
        return False
    for o in ops:
        if not isinstance(o, g.ConstantOp):
            lower_op(lw, o)
    return True


def lower_unfused(lw: LoweringContext, op: FusedOp) -> None:
    """The region's ops one by one (each its own kernel)."""
    for inner in op.block.ops:
        if not isinstance(inner, (YieldOp, g.ConstantOp)):
            lower_op(lw, inner)


def lower_matmul_group(lw: LoweringContext, op: FusedOp, loc: str) -> None:
    """A matmul with its prologue (the ops before it: a layer norm producing A) and
    epilogue (the ops after it)."""
    from tilecc.passes.graph_to_tile.fused_matmul import lower_fused_matmul
    from tilecc.passes.graph_to_tile.norm_gemv import lower_gemv_group

    ops = [o for o in op.block.ops if not isinstance(o, (YieldOp, g.ConstantOp))]
    mm = next(o for o in ops if isinstance(o, g.MatmulOp))
    if lw.opt_level >= 2 and (lower_fused_matmul(lw, op, mm, loc)
                              or lower_gemv_group(lw, op, mm, loc, epilogue=True)):
        return  # (a one-row matmul with its norm and epilogue: norm_gemv.py)
    y = op.block.last_op
    assert isinstance(y, YieldOp)
    pro, epi = ops[: ops.index(mm)], ops[ops.index(mm) + 1 :]
    if not (pro and lw.opt_level >= 2 and lower_gemv_group(lw, op, mm, loc, epilogue=False)):
        # (else the norm computed the one-row matmul's row: norm_gemv.py)
        if pro and not _lone_rms_norm(lw, pro):
            lower_subdag(lw, pro, _needed(pro, [mm, *epi], y), loc, _ops_name(pro), _space(pro))
        lower_op(lw, mm)
    if epi:
        lower_subdag(lw, epi, _needed(epi, [], y), loc, _ops_name(epi), squeezed2(shape_of(mm.results[0].type)))


def _needed(part: list[Operation], later: list[Operation], y: YieldOp) -> list[SSAValue]:
    """Values computed in `part` that `later` ops or the group's outputs use."""
    used = {v for o in later for v in o.operands} | set(y.values)
    return [r for o in part for r in o.results if r in used]


def _space(ops: list[Operation]) -> tuple[int, ...]:
    """The iteration space of a group's ops: its row-wise op's, else its first
    computing op's (reshapes in a group keep the element count)."""
    row_ops = (g.LayerNormOp, g.RmsNormOp, g.SoftmaxOp, gi.LogSoftmaxOp)
    rows: list[Operation] = [o for o in ops if isinstance(o, row_ops)]
    ops = rows or [o for o in ops if not isinstance(o, (g.ReshapeOp, g.ConstantOp))] or ops
    return squeezed2(shape_of(ops[0].results[0].type))


def lower_subdag(
    lw: LoweringContext, ops: list[Operation], outputs: list[SSAValue], loc: str, name: str, space: tuple[int, ...]
) -> None:
    """Elementwise / row-wise `ops` as one kernel computing `outputs` over `space`
    (their other operands are lowered values: HBM tensors or immediates)."""
    ek = ElementwiseKernel(lw, name, loc, space)
    ref: dict[SSAValue, int] = {}
    inside = {r for o in ops for r in o.results}
    args = {v: v for o in ops for v in o.operands if v not in inside}
    build_dag(ek, lw, ops, args, ref)
    for v in outputs:
        ek.output(ref[v], elem_of(v.type), value=v)
    for v, out in zip(outputs, ek.build(), strict=True):
        lw.values[v] = lw.view(out, shape_of(v.type))


def build_dag(ek: ElementwiseKernel, lw: LoweringContext, ops: list[Operation], args: dict[SSAValue, SSAValue],
              ref: dict[SSAValue, int]) -> None:
    """Nodes of `ek` for the elementwise / row-wise graph ops `ops`; `args` maps block
    arguments to the (lowered) graph values they stand for, `ref` collects the node of
    every value computed."""

    def use(v: SSAValue, at: tuple[int, ...]) -> int:
        if v in ref:
            return ref[v]
        if v in args:
            return ek.leaf_at(args[v], at)
        raise CompileError(f"fused kernel {ek.what}: value {v} is defined outside the group")

    for o in ops:
        if isinstance(o, YieldOp):
            return
        res = o.results[0]
        at = shape_of(res.type)
        if isinstance(o, g.ConstantOp):
            data = o.values()
            if data.size != 1:
                raise CompileError(f"fused kernel {ek.what}: a tensor constant inside the group")
            ref[res] = ek.imm(float(data.reshape(-1)[0]))
        elif isinstance(o, g.ReshapeOp):
            ref[res] = use(o.operands[0], shape_of(o.operands[0].type))
        elif elementwise_fn(o) is not None:
            ref[res] = add_graph_op(ek, o, [use(v, at) for v in o.operands])
        elif isinstance(o, g.LayerNormOp):
            x, w, b = o.operands
            eps = o.eps.value.data
            ref[res] = ek.rowwise("layer_norm", [use(x, at), use(w, at), use(b, at)], elem_of(res.type), eps)
        elif isinstance(o, g.RmsNormOp):
            ref[res] = rms_norm_nodes(ek, o, use(o.operands[0], at), use(o.operands[1], at))
        elif isinstance(o, g.SoftmaxOp):
            ref[res] = ek.rowwise("softmax", [use(o.operands[0], at)], elem_of(res.type))
        elif isinstance(o, gi.LogSoftmaxOp):
            ref[res] = ek.rowwise("log_softmax", [use(o.operands[0], at)], elem_of(res.type))
        else:
            raise CompileError(f"fused kernel {ek.what}: {o.name} cannot be part of an elementwise group")


def _kernel_name(op: FusedOp) -> str:
    """The kernel name of a group: its ops' (`_ops_name`)."""
    return _ops_name(list(op.block.ops))


def _ops_name(ops: list[Operation]) -> str:
    """`add` for one op, `fused_<anchor or first op>` for several."""
    names = [o.name.removeprefix("graph.") for o in ops if not isinstance(o, (YieldOp, g.ConstantOp, g.ReshapeOp))]
    anchor = next((n for n in names if n in ("layer_norm", "rms_norm", "softmax", "log_softmax", "matmul")), None)
    head = anchor or (names[0] if names else "fused")
    return f"fused_{head}" if len(names) > 1 else head


__all__ = ["LOWERINGS", "lower_fused", "lower_unfused", "build_dag", "lower_subdag", "squeezed2"]


LOWERINGS = {FusedOp: lower_fused}
