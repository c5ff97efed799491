"""A decode step's one-row matmul with the RMS norm that feeds it and its epilogue, as one kernel.

At batch 1 the norm before each projection (`graph.fused "matmul"` of rms_norm, matmul:
the fused-matmul kernel takes no prologue for a one-row matmul) would be its own kernel
(rms_norm_split.py: the row spread over the 128 partitions, 16 elements each for
d = 2,048) whose result the matmul loads back. That layout is exactly the one the
direct matmul (passes/graph_to_tile/matmul.py, `direct_a`) loads its row into, so the
norm is computed in place of that load: the norm kernel's store, the matmul's load and
one kernel boundary (two DMA fixed latencies on the decode critical path) go away.
The numerics are the split norm's, op for op.

Before (graph)::

    %g = graph.fused "matmul" (%x, %w_norm, %W) {
      %n = graph.rms_norm %x, %w_norm eps 1e-05 : tensor<1x1x2048xbf16>, ...
      %y = graph.matmul %n, %W : ... -> tensor<1x1x3072xbf16>
      graph.yield %y }

After (tile, cloud)::

    func.func @k6_matmul(%x: memref<128x16xbf16>, %Wt: memref<...>, %out: memref<1x3072xbf16>,
                         %w: memref<128x16xbf16>, %g: memref<128x128xf32>) {
      tile.load %x ...; tile.load %g ...; tile.load %w ...          // the split norm's body
      ... tile.binary "mul" %n, %wb into %lhsT                        // [128, 16]: the row
      (the direct matmul: weight groups streamed, 1 x 128 matmuls, evacuation, stores)
    }

The group's epilogue (a one-byte weight's per-column scale, a residual add: the ops
after the matmul) runs in the same kernel too, on each evacuated ``[1, TNL]`` row of
the accumulator (`FusedMatmulKernel.evacuate`; its operands that do not vary along the
rows, all of them here, loaded once as one row), instead of as an elementwise kernel
of its own that loads the matmul's output back (two DMA fixed latencies on the decode
critical path). A one-row matmul with an epilogue and no norm (o_proj, down_proj and
their residual add) takes this kernel too. The epilogue runs on one vector lane (the
row is one partition, 2.5 core cycles per element and input on `cloud`): the cost
model counts it (`MatmulProblem.evac_cost`; it overlaps the next chunk's matmuls, the
last chunk's is exposed), and the epilogue is fused only where the kernel with it is
estimated no slower than the kernel without it plus the epilogue as a kernel of its
own over the partitions (`_epilogue_pays`; a long tail behind a short contraction
stays separate).

Orientation (`_variants`): the weight stationary (each 128 x 128 weight tile the
`rhs`, the one-row k-tile moving: the product a row on one partition, its evacuation
and epilogue on one vector lane) or streamed (`stream_b`: the row's k-tile the
stationary ``[TK, 1]``, each weight tile of the same group buffer the moving `lhsT`:
the product a ``[TN, 1]`` accumulator column per tile, a chunk's ``[TN, w]`` evacuated
on TN lanes, the output and the epilogue's operands viewed ``[TN, N/TN]``). Both take
one 128-cycle matmul per weight tile on `cloud` (the moving rows land on the
accumulator's partitions, so the streamed tile is 128 wide: ``max(L, S') = L``); the
cost model picks the cheaper evacuation, the streamed one wherever the output is
2-byte and whole TN-column tiles. With an epilogue (int8 down_proj of the 1B shape)::

    %g = graph.fused "matmul" (%h, %Wq, %s, %x) {
      %p = graph.matmul %h, %Wq : (tensor<1x1x8192xbf16>, tensor<8192x2048xi8>) -> ...
      %y = graph.mul %p, %s ...   %z = graph.add %y, %x ...   graph.yield %z }
    ->  one kernel: the direct GEMV (the weight streamed), then per chunk of 1,024 columns
        tile.binary "mul" %acc, %s_win into %t ; tile.binary "add" %t, %x_win into %o   // [128, 8]
        tile.store %o -> %out viewed [128, 16] (strides 1, 128)

A classifier head (`graph.fused "matmul"` of mean, reshape, matmul, add: fuse-graph's
`mean_prologue`) takes the same kernel with the average pool as its prologue
(`emit_pool`): the ``[1, C, H, W]`` map read ``[128, nk * H * W]`` (channel ``r nk + j``
on partition r, its map in a row; an activation stored with a zero ring is read as it
is, the ring summing to nothing), one sum per channel, one scale by ``1 / (H W)`` into
the row's partitions. A head's N is seldom a multiple of 128 (1,000 classes): the
problem's column tile is then the widest divisor of N in the same number of tiles
(`matmul_problem.gemv_tile_width`: 125), so the weight is pre-tiled and streamed
and the bias add runs on 125 lanes::

    %g = graph.fused "matmul" (%x, %W, %b) {   // x: tensor<1x512x7x7xbf16>
      %m = graph.mean %x dims [2, 3] keepdim true   %r = graph.reshape %m -> 1x512
      %p = graph.matmul %r, %W   %y = graph.add %p, %b   graph.yield %y }
    ->  k_matmul: tile.load %x [128, 196] ; tile.reduce "sum" x 4 ; tile.scalar "mul" 1/49
        (the streamed GEMV: 32 matmuls of [125, 1]) ; tile.binary "add" [125, 8] ; tile.store

Not used (the norm, the matmul and the epilogue lower as before): batch or rows > 1,
a norm whose result something else reads, a row that does not split over all
partitions into the matmul's k-tiles, or a schedule that is not direct.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.graph_nn import MeanOp
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel, Leaf, leaf_elem, vector_steps
from tilecc.passes.graph_to_tile.elementwise.cost import estimate_cycles
from tilecc.passes.graph_to_tile.fused_matmul import (
    FusedMatmulKernel,
    FusedPart,
    epilogue_fields,
    epilogue_outputs,
    epilogue_part,
)
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.matmul import stream_b_view
from tilecc.passes.graph_to_tile.matmul_problem import b_operand, choose_schedule, direct_a, problem_of
from tilecc.passes.graph_to_tile.nn.common import sub
from tilecc.passes.graph_to_tile.nn.state import padded_of
from tilecc.passes.graph_to_tile.rms_norm_split import emit_split_norm, split_of, split_operands
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.passes.schedule.cost_model import choose, estimate
from tilecc.passes.schedule.matmul_schedule import MatmulProblem, MatmulSchedule
from tilecc.simulator.timing import TimingRules

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


class _DecodeGemvKernel(FusedMatmulKernel):
    """The direct matmul whose row is the RMS norm of its input (`norm`; args: x, B, out,
    w, G, then the epilogue's), the average pool of a map (`pool`; args: the map viewed
    ``[TK, nk * run]``, B, out, then the epilogue's) or the row itself (args: A, B, out,
    then the epilogue's), with the group's epilogue on each evacuated row."""

    def __init__(self, *args: Any, norm: g.RmsNormOp | None, pool: tuple[int, int] = (0, 0), **kw: Any):
        super().__init__(*args, direct=True, pro=None, front=2 if norm is not None else 0, **kw)
        self.norm = norm
        self.pool = pool  # (run, divisor), run > 0: the row is a mean of runs (`emit_pool`)
        if norm is not None:
            self.argW, self.argG = self.kb.args[3:5]

    def load_a_direct(self, dst: SSAValue) -> None:
        if self.pool[0]:
            emit_pool(self.kb, self.argA, self.p.TK, self.p.nk, *self.pool, dst, queue=self.s.qa[0])
            return
        if self.norm is None:
            super().load_a_direct(dst)
            return
        p, s = self.p, self.s
        emit_split_norm(self.kb, self.norm, self.argA, self.argW, self.argG, 1, p.K, p.TK, dst,
                        queue=s.qa[0], const_queue=s.qb[0])


def _lone_norm(pro: list[Operation], mm: Operation) -> g.RmsNormOp | None | Literal[False]:
    """The RMS norm producing the matmul's row through views (None without a prologue),
    or False where the prologue is anything else or its result is read elsewhere."""
    if not pro:
        return None
    norms = [o for o in pro if not isinstance(o, (g.ReshapeOp, g.ConstantOp))]
    if len(norms) != 1 or not isinstance(norms[0], g.RmsNormOp):
        return False
    norm = norms[0]
    # A is the norm's result, through views only, and nothing else reads it
    a = mm.operands[0]
    chain = [a]
    while isinstance(a.owner, g.ReshapeOp) and a.owner in pro:
        a = a.owner.operands[0]
        chain.append(a)
    if a is not norm.results[0] or any(sum(1 for _ in v.uses) != 1 for v in chain):
        return False
    # no other value of the prologue leaves it (a view of the input the group yields)
    inside = {r for o in pro for r in o.results} - set(chain)
    if any(u.operation not in pro for r in inside for u in r.uses):
        return False
    return norm


def _lone_pool(pro: list[Operation], mm: Operation) -> MeanOp | None:
    """The global average pool producing the matmul's row through reshapes (the
    prologue fuse-graph forms for a classifier head: `Fuser.mean_prologue`), else None."""
    means = [o for o in pro if not isinstance(o, (g.ReshapeOp, g.ConstantOp))]
    if len(means) != 1 or not isinstance(means[0], MeanOp):
        return None
    a = mm.operands[0]
    while isinstance(a.owner, g.ReshapeOp) and a.owner in pro:
        a = a.owner.operands[0]
    return means[0] if a is means[0].results[0] else None


def emit_pool(kb: KernelBuilder, x_arg: SSAValue, TK: int, nk: int, S: int, div: int, dst: SSAValue, *,
              queue: int) -> None:
    """The sum of each run of `S` elements of `x_arg` (``[TK, nk * S]``: partition r
    holds A elements ``r*nk ..``, each one's S pooled values in a row: a map, or a map
    stored with a zero ring) divided by `div` (the map's size) into `dst` (``[TK, nk]``,
    the row's dtype): one load, a sum per A element, one scale by 1 / div rounded once
    to the row's type (torch's mean: an fp32 sum, then the division)."""
    z, tk = kb.const(0), kb.const(TK)
    xb = kb.alloc([TK, nk * S], elem_of(x_arg.type), tile.SRAM, "pool_in")
    kb.add(tile.LoadOp(x_arg, [z, z], xb, tk, kb.const(nk * S), 0, 1, queue=queue))
    part = kb.alloc([TK, nk], f32, tile.SRAM, "pool_sum")
    for j in range(nk):
        kb.add(tile.ReduceOp("sum", sub(kb, xb, 0, j * S, [TK, S]), sub(kb, part, 0, j, [TK, 1]), tk, kb.const(S)))
    kb.add(tile.ScalarOp("mul", part, 1.0 / div, dst, tk, kb.const(nk)))


def _separate_epilogue(lw: LoweringContext, epi: FusedPart, elem: Attribute, N: int) -> float:
    """The epilogue as an elementwise kernel of its own, the row spread over the
    partitions (`estimate_cycles`: load the product and operands, compute, store)."""
    cfg = lw.cfg
    rows = min(lw.P, N)
    while N % rows:
        rows -= 1
    leaves = [v for v in epi.ek.values if isinstance(v, Leaf) and v.value is not None]
    return estimate_cycles(TimingRules(cfg), (rows, N // rows), rows, N // rows, 1,
                           [element_size(elem)] + [element_size(leaf_elem(v)) for v in leaves],
                           [element_size(e) for _, e in epi.ek.outputs], vector_steps(epi.ek.values, cfg))


def _stream_leaf(lw: LoweringContext, ek: ElementwiseKernel, v: SSAValue, N: int, TN: int) -> int | None:
    """An epilogue operand of a streamed-weight GEMV: a contiguous 2-byte row of N,
    viewed as the output tiles are (`stream_b_view`); None for anything else."""
    src = lw.materialise(v)
    if tuple(d for d in shape_of(src.type) if d != 1) != (N,) or element_size(elem_of(src.type)) != 2:
        return None
    if lw.layout(src)[0][-1] != 1:
        return None
    return ek.leaf_hbm(stream_b_view(lw, src, N, TN), [0, 1])


@dataclass
class _Variant:
    """One way to lower the group: the orientation, the problem the cost model sees
    (with the epilogue's evacuation work), the epilogue DAG, the schedule, its estimate."""

    stream_b: bool
    problem: MatmulProblem
    epi: FusedPart | None
    sched: MatmulSchedule | None = None
    est: float = float("inf")


def _variants(lw: LoweringContext, group: FusedOp, mm: Operation, problem: MatmulProblem, with_epi: bool,
              row: SSAValue, loc: str) -> list[_Variant]:
    """The group's lowerings the cost model weighs: the weight stationary (the product
    a row on one partition: the epilogue on one lane) and, where the output allows it
    (2-byte, whole TN-column tiles, a weight-stationary array), the weight streamed
    past the row's k-tile (the product [TN, w] on TN lanes: the epilogue's vector work
    a TN-th of the row's, `evac_cost` scaled so); both take one 128-cycle matmul per
    128 x 128 weight tile (module docstring). Only direct schedules (`direct_a`: the
    row straight into the partitions, the weight pre-tiled) are kept."""
    N, TN = problem.N, problem.TN
    res = mm.results[0]
    out: list[_Variant] = []
    epi = epilogue_part(lw, group, mm, (1, N), loc) if with_epi else None
    if with_epi and epi is None:
        return []
    out.append(_Variant(False, dataclasses.replace(problem, **epilogue_fields(epi, N)) if epi else problem, epi))
    if N % TN == 0 and element_size(elem_of(res.type)) == 2 and lw.cfg.matrix.dataflow == "ws":
        epi_b = epilogue_part(lw, group, mm, (TN, N // TN), loc,
                              operand=lambda ek, v: _stream_leaf(lw, ek, v, N, TN)) if with_epi else None
        if not with_epi or epi_b is not None:
            if epi_b is not None:  # every operand a whole [TN, N / TN] image: loaded once
                epi_b.hoisted, epi_b.per_tile = epi_b.hoisted + epi_b.per_tile, []
                fields = epilogue_fields(epi_b, N // TN)
                fields["evac_cost"] /= TN
            else:
                fields = dict(evac_cost=lw.cfg.vector.op_cost.unary["copy"] / TN)
            out.append(_Variant(True, dataclasses.replace(problem, **fields), epi_b))
    for v in out:
        v.sched = choose(v.problem, lw.cfg)
        if v.sched is not None and direct_a(lw, v.problem, v.sched, row):
            v.est = estimate(v.problem, v.sched, lw.cfg)
    return [v for v in out if v.est < float("inf")]


def lower_gemv_group(lw: LoweringContext, group: FusedOp, mm: Operation, loc: str, *, epilogue: bool) -> bool:
    """The matmul group `group` (its matmul `mm`: one row, a weight B) as one direct
    kernel with its RMS-norm prologue and (`epilogue`) its epilogue; False (nothing
    emitted) where that does not apply or (`epilogue`) the cost model prefers the
    epilogue as a kernel of its own (module docstring). Without `epilogue` the kernel
    stores the product and the caller lowers the epilogue."""
    ops = [o for o in group.block.ops if not isinstance(o, (YieldOp, g.ConstantOp))]
    pro, epi_ops = ops[: ops.index(mm)], ops[ops.index(mm) + 1:]
    if not epilogue:
        epi_ops = []
    pool = _lone_pool(pro, mm)
    norm = None if pool is not None else _lone_norm(pro, mm)
    if norm is False or (norm is None and pool is None and not epi_ops) or (epilogue and not epi_ops):
        return False  # (a lone matmul lowers on its own, `lower_matmul_blocked`)
    got = problem_of(lw, mm)
    if got is None:
        return False
    problem, (res, out_shape, a, b, M, K, N) = got
    if M != 1 or problem.batch or not problem.b_weight or K % problem.TK:
        return False  # (a direct row needs a pre-tiled weight: no schedule is chosen twice)
    if norm is not None:
        x_shape = shape_of(norm.operands[0].type)
        if x_shape[-1] != K or split_of(lw, 1, K) != problem.TK:
            return False
    S = div = 0
    pooled: SSAValue | None = None
    if pool is not None:  # [1, K, spatial...] read as [TK, nk * S]: contiguous
        x_shape = shape_of(pool.operands[0].type)
        info = padded_of(lw, pool.operands[0])
        if x_shape[1] != K:
            return False
        if info is not None:  # stored zero-padded [1, K, Hp * Wp]: the ring adds nothing
            if len(x_shape) != 4:
                return False
            pooled, S, div = info.hbm, info.L, info.H * info.W
        else:
            pooled, S = lw.materialise(pool.operands[0]), math.prod(x_shape[2:])
            div = S
            if not lw.is_dense(pooled):
                return False
    row = norm.operands[0] if norm is not None else pool.operands[0] if pool is not None else a
    variants = _variants(lw, group, mm, problem, bool(epi_ops), row, loc)
    if not variants:
        return False
    best = min(variants, key=lambda v: v.est)  # (ties: the weight stationary, listed first)
    if best.epi is not None:
        plain = _variants(lw, group, mm, problem, False, row, loc)
        sep = _separate_epilogue(lw, best.epi, elem_of(res.type), N)
        alone = min(v.est for v in plain) if plain else float("inf")
        pays = best.est <= alone + sep
        remarks.emit("lower-graph-to-tile", "analysis",
                     lambda: f"matmul 1x{K}x{N}: epilogue in the GEMV ({'streamed weight, ' if best.stream_b else ''}"
                             f"{'TN lanes' if best.stream_b else 'one lane'}) estimated {best.est:,.0f} cycles "
                             f"against {alone:,.0f} + {sep:,.0f} as a kernel of its own: "
                             + ("fused" if pays else "kept separate"))
        if not pays:
            return False
    problem, epi, stream_b = best.problem, best.epi, best.stream_b
    sched = choose_schedule(lw, problem)
    if sched is None or not direct_a(lw, problem, sched, row):
        return False  # (an autotuning policy chose otherwise)
    if norm is not None:
        x = lw.materialise(norm.operands[0])
        xv, wv, gmat = split_operands(lw, norm, x, 1, K, problem.TK)
        front = [xv]
        norm_args = [wv, gmat]
    elif pooled is not None:
        front = [lw.view(pooled, (problem.TK, problem.nk * S))]
        norm_args = []
    else:
        front = [lw.view(lw.materialise(a), (problem.TK, problem.nk))]
        norm_args = []
    B = b_operand(lw, b, problem, sched, out_shape[:-2], interleaved=True)
    extra: list[SSAValue] = []
    TN = problem.TN
    if epi is not None and stream_b:  # outputs [1, N] in HBM, the tiles' view of each
        fulls = [lw.hbm(shape_of(v.type), e) for v, (_, e) in zip(epi.values, epi.ek.outputs, strict=True)]
        epi_outs = [stream_b_view(lw, f, N, TN) for f in fulls]
        out = lw.view(fulls[0], out_shape)
        extra = [epi.ek.leaf_of(i).value for i in epi.hoisted + epi.per_tile] + epi_outs
    elif epi is not None:
        fulls = epi_outs = epilogue_outputs(lw, epi, (1, N))
        out = lw.view(epi_outs[0], out_shape)
        extra = [epi.ek.leaf_of(i).value for i in epi.hoisted + epi.per_tile] + epi_outs
    else:
        fulls = []
        out = lw.hbm(out_shape, elem_of(res.type))
    out_arg = stream_b_view(lw, out, N, TN, lead=len(out_shape) - 2) if stream_b else out
    args = [*front, B.value, out_arg, *norm_args, *extra]
    kb = KernelBuilder(lw.kernel_name("matmul"), [v.type for v in args], loc)
    ea = elem_of(norm.results[0].type) if norm is not None else elem_of(a.type)
    eb, eo = elem_of(b.type), elem_of(res.type)
    kernel = _DecodeGemvKernel(kb, problem, sched, lw.cfg, rank=len(out_shape), a_imap=[0, 1], b_imap=B.imap,
                               elems=(ea, eb, eo), norm=norm, pool=(S, div), epi=epi, out_shape=tuple(out_shape),
                               stream_b=stream_b)
    kernel.emit(out_shape[:-2])
    lw.launch(kb, args)
    if epi is None:
        lw.values[res] = out
    else:
        for v, o in zip(epi.values, fulls, strict=True):
            lw.values[v] = lw.view(o, shape_of(v.type))
    if norm is not None:
        remarks.emit("lower-graph-to-tile", "passed",
                     lambda: f"rms_norm + matmul 1x{K}x{N}: the norm computes the matmul's row in the partitions "
                             f"(one kernel; the norm's store and the matmul's load removed)")
    elif pool is not None:
        remarks.emit("lower-graph-to-tile", "passed",
                     lambda: f"mean + matmul 1x{K}x{N}: the average pool over {div} positions computes the matmul's "
                             f"row in the partitions (one kernel; the pool's store and the matmul's load removed)")
    else:
        remarks.emit("lower-graph-to-tile", "passed",
                     lambda: f"matmul 1x{K}x{N}: the A row loads straight into the partitions ({problem.nk} "
                             f"contiguous elements each, the weight's rows interleaved to match): no transposes")
    if stream_b:
        remarks.emit("lower-graph-to-tile", "passed",
                     lambda: f"matmul 1x{K}x{N}: the weight streams past the row's k-tile (stationary "
                             f"[{problem.TK}, 1]), its product [{TN}, {sched.w}] per chunk on {TN} lanes")
    if epi is not None:
        names = ", ".join(o.name.removeprefix("graph.") for o in epi_ops)
        remarks.emit("lower-graph-to-tile", "passed",
                     lambda: f"matmul 1x{K}x{N}: its epilogue ({names}) runs on each evacuated "
                             f"{'tile' if stream_b else 'row'} (one kernel; the product's store and reload removed)")
    return True


__all__ = ["lower_gemv_group"]
