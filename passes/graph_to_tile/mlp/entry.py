"""Lowering of a `graph.fused "mlp"` group (passes/graph/fuse_mlp.py) as one kernel
whose hidden activation never leaves SRAM (kernel.py).

The group holds two ``matmul`` groups: the up projection (an optional layer-norm
prologue, the matmul, a bias row, an elementwise activation of the product alone:
gelu exact or tanh, relu, silu, any chain of unary and scalar ops; or, gated (SwiGLU),
of the product and a bias-free matmul of the same x, which the group also holds) and the down
projection (the matmul reading the hidden as its A, its bias row, an epilogue such as
a residual add). This module checks that the kernel applies, builds the parts
(`FusedPart`s of passes/graph_to_tile/fused_matmul.py), the problem (problem.py), picks
the schedule (cost.py; with an autotuner, the fastest of its best, tuning.py) and emits the kernel.

Where it does not apply it emits nothing and returns False (the caller lowers the two
inner groups as their own kernels, the hidden through HBM), with a ``missed`` remark
saying why: a non-2-D or one-row matmul, mixed element types, an activation reading
another tensor (its operands would lie across partitions), or no schedule fitting
SRAM and the accumulator (both weights stay resident).

Before::

    %y = graph.fused "mlp" (%x, %w1, %b1, %w2, %b2, %r) { fused "matmul" ..., fused "matmul" ... }

After (one kernel; the hidden is an SRAM buffer, never an HBM tensor)::

    func.call @k3_fused_mlp(%x, %w1, %w2, %ident, %ones, %b1, %b2, %r, %y)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir.dtypes import element_size
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.weight_layout import tiled_name, tiled_shape
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel, TileProgram
from tilecc.passes.graph_to_tile.fused_matmul import (
    FusedPart,
    _build,
    _hoist_bytes,
    _sram_per_col,
    epilogue_outputs,
    epilogue_part,
)
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.matmul_problem import weight_of
from tilecc.passes.graph_to_tile.mlp.cost import choose, w1_tiled
from tilecc.passes.graph_to_tile.mlp.kernel import MlpArgs, MlpKernel
from tilecc.passes.graph_to_tile.mlp.problem import MlpProblem
from tilecc.passes.graph_to_tile.shapes import dense_attr, elem_of, shape_of
from tilecc.passes.schedule.matmul_schedule import MatmulProblem

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

DTYPES = ("f32", "bf16", "f16")


class _NotFused(Exception):
    """Why the fused kernel does not apply (the remark's text)."""


def _groups(op: FusedOp) -> tuple[FusedOp, FusedOp]:
    inner = [o for o in op.block.ops if isinstance(o, FusedOp)]
    if len(inner) != 2:
        raise _NotFused("the group does not hold two matmul groups")
    return inner[0], inner[1]


def _matmul(group: FusedOp) -> Operation:
    return next(o for o in group.block.ops if isinstance(o, g.MatmulOp))


def _bind_group(lw: LoweringContext, group: FusedOp, skip: tuple[SSAValue, ...] = ()) -> None:
    """Block arguments of an inner group stand for its inputs (`skip`: the hidden, not
    a lowered value); its scalar constants are immediates."""
    from tilecc.passes.graph_to_tile.conversion import lower_op

    for arg, v in zip(group.block.args, group.inputs, strict=True):
        if any(v is k for k in skip):
            continue
        if v in lw.scalars:
            lw.scalars[arg] = lw.scalars[v]
        else:
            lw.values[arg] = lw.materialise(v)
    for inner in group.block.ops:
        if isinstance(inner, g.ConstantOp):
            lower_op(lw, inner)


def _from(v: SSAValue, group: FusedOp) -> bool:
    """Whether `v` is `group`'s result, through reshapes."""
    while isinstance(v.owner, g.ReshapeOp):
        v = v.owner.operands[0]
    return v.owner is group


def _stripped(v: SSAValue) -> SSAValue:
    """`v` through reshapes."""
    while isinstance(v.owner, g.ReshapeOp):
        v = v.owner.operands[0]
    return v


def _dtype(elem: object) -> str:
    from tilecc.passes.graph_to_tile.matmul_problem import _dtype_name

    return _dtype_name(elem)  # pyright: ignore[reportArgumentType]


def lower_mlp_group(lw: LoweringContext, op: FusedOp, loc: str) -> bool:
    """`op` as one fused MLP kernel; False (nothing emitted, a remark) where it does not apply."""
    if lw.opt_level < 2:
        return False
    outer = remarks.enabled()
    # the parts' remarks (a bias on the matrix engine, ...) hold only if the kernel is built
    with remarks.collecting() as mine:
        try:
            _lower(lw, op, loc)
            why = None
        except _NotFused as e:
            why = str(e)
    if why is not None:
        remarks.emit("lower-graph-to-tile", "missed", f"mlp group not fused into one kernel: {why}; its two "
                     "matmul groups run as separate kernels (the hidden goes through HBM)", loc)
        return False
    for r in mine.remarks if outer else ():
        remarks.emit(r.pass_name, r.kind, r.message, r.loc or None)  # (none: the outer scope's place)
    return True


def _prologue(lw: LoweringContext, up: FusedOp, mm: Operation, M: int, K: int, loc: str) -> FusedPart | None:
    ops = [o for o in up.block.ops if not isinstance(o, (YieldOp, g.ConstantOp))]
    pro_ops = ops[: ops.index(mm)]
    if not any(not isinstance(o, g.ReshapeOp) for o in pro_ops):
        return None
    a_val = mm.operands[0]
    while isinstance(a_val.owner, g.ReshapeOp) and a_val.owner in pro_ops:
        a_val = a_val.owner.operands[0]
    ek = ElementwiseKernel(lw, "prologue", loc, (M, K))
    ref: dict[SSAValue, int] = {}
    _build(ek, lw, pro_ops, ref)
    ek.classify()
    pro = FusedPart(ek, ref[a_val], [])
    pro.split_leaves(hoist=True)
    if not pro.per_tile:
        raise _NotFused("the prologue loads no rows")
    return pro


def _norm_prologue(lw: LoweringContext, norm: Operation, M: int, K: int, loc: str) -> FusedPart:
    """A gated MLP's norm (in the group, outside its matmul groups) as the prologue."""
    ek = ElementwiseKernel(lw, "prologue", loc, (M, K))
    ref: dict[SSAValue, int] = {}
    _build(ek, lw, [norm], ref)
    ek.classify()
    pro = FusedPart(ek, ref[norm.results[0]], [])
    pro.split_leaves(hoist=True)
    if not pro.per_tile:
        raise _NotFused("the prologue loads no rows")
    return pro


def _lower(lw: LoweringContext, op: FusedOp, loc: str) -> None:
    up, down = _groups(op)
    mm1, mm2 = _matmul(up), _matmul(down)
    hidden_in = next(v for v in down.inputs if _from(v, up))
    a1, w1 = mm1.operands
    w2 = mm2.operands[1]
    s1, s2 = shape_of(mm1.results[0].type), shape_of(mm2.results[0].type)
    if len(s1) != 2 or len(s2) != 2 or len(shape_of(w1.type)) != 2 or len(shape_of(w2.type)) != 2:
        raise _NotFused("a matmul is batched")
    (M, H), (_, N) = s1, s2
    K = shape_of(w1.type)[0]
    if min(M, H, N, K) < 2:
        raise _NotFused(f"a dimension of 1 (M={M}, K={K}, H={H}, N={N})")
    names = {_dtype(elem_of(v.type)) for v in (a1, w1, w2, hidden_in)}
    if len(names) != 1 or next(iter(names)) not in DTYPES:
        raise _NotFused(f"the matmuls' operands mix element types ({', '.join(sorted(names))})")
    # a gated MLP: the bias-free matmul x @ Wu whose product the activation multiplies by
    gate = next((o for o in op.block.ops if isinstance(o, g.MatmulOp)), None)
    if gate is not None and elem_of(gate.operands[1].type) != elem_of(w1.type):
        raise _NotFused("the gate's weights mix element types")
    gate_in = tuple(v for v in up.inputs if gate is not None and _stripped(v) is gate.results[0])
    # a gated MLP's norm (x's producer inside the group): the kernel's prologue
    norm = next((o for o in op.block.ops if isinstance(o, (g.LayerNormOp, g.RmsNormOp))), None)
    norm_in = tuple(v for v in up.inputs if norm is not None and _stripped(v) is norm.results[0])
    _bind_group(lw, up, skip=gate_in + norm_in)
    _bind_group(lw, down, skip=(hidden_in,))

    gated: list[int] = []

    def gate_leaf(ek: ElementwiseKernel, v: SSAValue) -> int | None:
        """The gate's product (a block argument standing for it): an accumulator tile."""
        if gate is None or not any(a is v and any(i is k for k in gate_in) for a, i in zip(up.block.args, up.inputs)):
            return None
        gated.append(ek.given_leaf(elem_of(v.type)))
        return gated[-1]

    act = epilogue_part(lw, up, mm1, (M, H), loc, bias_in_acc=True, operand=gate_leaf if gate is not None else None)
    if act is None or act.hoisted or act.per_tile or len(act.values) != 1 or len(gated) != (gate is not None):
        raise _NotFused("the activation reads a tensor besides the product, a bias row and a gate's product")
    pro = _prologue(lw, up, mm1, M, K, loc) if norm is None else _norm_prologue(lw, norm, M, K, loc)
    epi = epilogue_part(lw, down, mm2, (M, N), loc, bias_in_acc=True)

    ea = elem_of(a1.type)
    eh = elem_of(hidden_in.type)
    eo = elem_of(mm2.results[0].type)
    tiles = MatmulProblem.make(lw.cfg, M, K, N)
    fields: dict = {}
    cost, n_ops = act.cost()
    fields.update(act_cost=cost, act_ops=n_ops,
                  act_sram=TileProgram.sram_bytes(act.ek, tiles.TM, 1, {}, [act.root],
                                                  frozenset({act.root, act.ek.outputs[0][0]})))
    if epi is not None:
        cost, n_ops = epi.cost()
        fields.update(epi_cost=cost, epi_ops=n_ops, epi_sram_per_col=_sram_per_col(epi),
                      epi_sram=sum(_hoist_bytes(epi.ek, i, N) for i in epi.hoisted))
    if pro is not None:
        cost, n_ops = pro.cost()
        fields.update(pro_cost=cost, pro_ops=n_ops,
                      pro_sram=TileProgram.sram_bytes(pro.ek, K, 2, {i: 2 for i in pro.per_tile}, [pro.root],
                                                      frozenset({pro.root}))
                      + sum(_hoist_bytes(pro.ek, i, K) for i in pro.hoisted))
    TK, ia = tiles.TK, element_size(ea)
    nh = -(-H // TK)
    if gate is not None:
        fields["gated"] = True
    if weight_of(w1) is not None and K % TK == 0 and (gate is None or weight_of(gate.operands[1]) is not None):
        fields["w1_tileable"] = True
    if weight_of(w2) is not None and H % TK == 0:  # the fewest tiles moving 8 KiB per partition
        fields["w2_group"] = next((d for d in range(1, nh + 1) if nh % d == 0 and d * N * ia >= 8192), nh)
    p = MlpProblem(M, K, H, N, ia, element_size(eo), _dtype(ea) == "f32", tiles.TM, TK, tiles.TN, **fields)
    if lw.mlp_policy is not None:  # autotuning (tuning.py): the group alone judges each candidate
        from tilecc.passes.graph_to_tile.mlp.tuning import group_signature, mlp_alone

        sig = group_signature(op, {"a": _dtype(ea), "hidden": _dtype(eh), "out": _dtype(eo),
                                   "gated": gate is not None, "prologue": pro is not None,
                                   "epilogue": epi is not None})
        s = lw.mlp_policy(p, lambda: mlp_alone(op), sig)
    else:
        s = choose(p, lw.cfg)
    if s is None:
        raise _NotFused(f"no schedule fits SRAM and the accumulator (W1 and W2 resident: {2 * K * H * p.ia} and "
                        f"{2 * H * N * p.ia} bytes over the partitions, hidden {p.TM}x{H} twice)")

    for bias in (act.bias, epi.bias if epi is not None else None):
        if bias is not None and elem_of(bias.type) != elem_of(a1.type):
            raise _NotFused("a bias row's element type differs from the operands'")
    TM = p.TM
    x = lw.view(lw.materialise(a1), (M, K)) if pro is None else None
    w1v = _tiled(lw, w1, (1, p.nk, p.TK, p.nh // s.g, s.g * p.TK)) if w1_tiled(p, s) else None
    w2v = _tiled(lw, w2, (p.nh // p.w2_group, p.w2_group, p.TK, 1, N)) if p.w2_group else None
    wuv = None
    if gate is not None:
        wu = gate.operands[1]
        wuv = _tiled(lw, wu, (1, p.nk, p.TK, p.nh // s.g, s.g * p.TK)) if w1v is not None else \
            lw.view(lw.materialise(wu), (K, H))
    w1t, w2t = w1v is not None, p.w2_group if w2v is not None else 0
    if w1v is None:
        w1v = lw.view(lw.materialise(w1), (K, H))
    if w2v is None:
        w2v = lw.view(lw.materialise(w2), (H, N))
    ident = lw.hbm([TM, TM], ea, value=dense_attr(np.eye(TM, dtype=np.float32), ea, [TM, TM]))
    ones = lw.hbm([1, TM], ea, value=dense_attr(np.ones((1, TM), dtype=np.float32), ea, [1, TM]))
    b1 = lw.view(lw.materialise(act.bias), (1, H)) if act.bias is not None else None
    b2 = lw.view(lw.materialise(epi.bias), (1, N)) if epi is not None and epi.bias is not None else None
    epi_args: list[SSAValue] = []
    epi_outs: list[SSAValue] = []
    out = None
    if epi is not None:
        epi_outs = epilogue_outputs(lw, epi, (M, N))
        epi_args = [epi.ek.leaf_of(i).value for i in epi.hoisted + epi.per_tile] + epi_outs
    else:
        out = lw.output_buffer(mm2.results[0], eo)
    pro_args = [pro.ek.leaf_of(i).value for i in pro.hoisted + pro.per_tile] if pro is not None else []
    named = [x, w1v, w2v, out, ident, ones, b1, b2, wuv]
    flat = [v for v in named if v is not None] + epi_args + pro_args
    kb = KernelBuilder(lw.kernel_name("fused_mlp"), [v.type for v in flat], loc)
    kargs = iter(kb.args)
    bound = [next(kargs) if v is not None else None for v in named]
    rest = list(kargs)
    def given(v: SSAValue | None, what: str) -> SSAValue:
        if v is None:
            raise CompileError(f"internal: the fused MLP kernel's {what} argument is missing")
        return v

    margs = MlpArgs(bound[0], given(bound[1], "W1"), given(bound[2], "W2"), bound[3], given(bound[4], "identity"),
                    given(bound[5], "ones row"), bound[6], bound[7],
                    rest[: len(epi_args)], rest[len(epi_args):], w1t, w2t, bound[8], gated[0] if gated else None)
    kernel = MlpKernel(kb, p, s, margs, ea=ea, eh=eh, eo=eo, act=act, epi=epi, pro=pro,
                       queues=lw.cfg.dma.queues)
    kernel.emit()
    lw.launch(kb, flat)
    remarks.emit("lower-graph-to-tile", "passed", lambda: (
        f"mlp {M}x{K}x{H}x{N}: one kernel, the hidden computed transposed ({H} units on partitions) and kept in "
        f"SRAM, never stored; W1 and W2 resident ({s}, chosen by the "
        f"{'autotuner' if lw.mlp_policy else 'cost model'}; pre-tiled: W1 {'yes' if w1t else 'no'}, W2 "
        f"{f'{w2t} hidden tiles per transfer' if w2t else 'no'})"), loc)
    if epi is not None:
        for v, o in zip(epi.values, epi_outs, strict=True):
            lw.values[v] = lw.view(o, shape_of(v.type))
    else:
        lw.values[mm2.results[0]] = out  # pyright: ignore[reportArgumentType]
    _results(lw, down)


def _tiled(lw: LoweringContext, v: SSAValue, dims: tuple[int, int, int, int, int]) -> SSAValue | None:
    """Weight `v` stored in HBM in the pre-tiled order of `dims` (ir/weight_layout.py), or
    None where `v` is no weight."""
    w = weight_of(v)
    if w is None:
        return None
    lw.materialise(v)  # the source's allocation: replays of this kernel map it to their own weight
    return lw.hbm(list(tiled_shape(*dims)), elem_of(v.type), weight=tiled_name(w.weight, *dims))


def _results(lw: LoweringContext, group: FusedOp) -> None:
    from tilecc.passes.graph_to_tile.fused import _results as results

    results(lw, group)


__all__ = ["lower_mlp_group"]
