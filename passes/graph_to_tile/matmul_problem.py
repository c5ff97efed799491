"""A graph matmul as the -O2 kernels see it: its `MatmulProblem` (`problem_of`), the
schedule the lowering's policy or the cost model chooses (`choose_schedule`, with its
remark), and the operands the schedule implies: a pre-tiled weight B (`b_operand`) and
whether the A row loads straight into lhsT (`direct_a`). The first steps of the matmul
family's problem -> schedule -> cost model -> emitter split, shared by the plain kernel
(`passes/graph_to_tile/matmul.py`), fused groups (`fused_matmul.py`) and the decode GEMV
(`norm_gemv.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import Float32Type
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir.graph import GraphProgram, WeightOp
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.shapes import MatmulDims, Operand
from tilecc.passes.schedule.matmul_schedule import MatmulProblem, MatmulSchedule
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def _dtype_name(elem: Attribute) -> str:
    from xdsl.dialects.builtin import BFloat16Type, Float8E4M3FNType, Float16Type, IntegerType

    if isinstance(elem, Float32Type):
        return "f32"
    if isinstance(elem, BFloat16Type):
        return "bf16"
    if isinstance(elem, Float16Type):
        return "f16"
    if isinstance(elem, Float8E4M3FNType):
        return "f8e4m3"  # one-byte weights (passes/graph/lowp_matmul.py)
    if isinstance(elem, IntegerType) and elem.width.data == 8:
        return "i8"
    return ""


def problem_of(lw: LoweringContext, op: Operation) -> tuple[MatmulProblem, MatmulDims] | None:
    """(MatmulProblem, dims) of a graph.matmul, or None when the kernel does not apply."""
    from tilecc.passes.graph_to_tile.shapes import elem_of, matmul_dims, shape_of

    dims = matmul_dims(op)
    if dims is None:
        return None
    res, out_shape, a, b, M, K, N = dims
    names = [_dtype_name(elem_of(v.type)) for v in (a, b, res)]
    if "" in names:
        return None
    a_shape, b_shape = shape_of(a.type), shape_of(b.type)
    batch = tuple(out_shape[:-2])

    def walks(shape: Sequence[int]) -> tuple[bool, ...]:
        full = (1,) * (len(batch) + 2 - len(shape)) + tuple(shape)
        return tuple(full[d] == batch[d] for d in range(len(batch)))

    problem = MatmulProblem.make(lw.cfg, M, K, N, batch=batch, a_batch=walks(a_shape), b_batch=walks(b_shape),
                                 a_dtype=names[0], b_dtype=names[1], o_dtype=names[2])
    if not batch and weight_of(b) is not None and tuple(b_shape) == (K, N):
        problem = dataclasses.replace(problem, b_weight=True, a_produced=produced(a))
        if M == 1 and N % problem.TN:
            problem = dataclasses.replace(problem, TN=gemv_tile_width(N, problem.TN))
    return problem, dims


def gemv_tile_width(N: int, TN: int) -> int:
    """The column tile of a one-row matmul by a weight whose N is not a multiple of the
    array's `TN` columns (a classifier head): the widest divisor of N within [TN / 2, TN]
    in as many tiles (a 1,000-class classifier: 125, eight whole tiles instead of seven
    and a 104-column rest), else TN. Whole tiles let the weight be stored pre-tiled (`pretile_ok`), so
    the row loads straight into the partitions (`direct_a`) and the epilogue runs in
    the GEMV kernel; the tile count is the same as with TN (ceil(N / TN)). N below TN
    is one tile of N columns."""
    if N < TN:
        return N
    for t in range(TN, TN // 2 - 1, -1):
        if N % t == 0 and N // t == -(-N // TN):
            return t
    return TN


def produced(v: SSAValue) -> bool:
    """Whether `v` (through a fused group's block argument and reshapes) is computed by
    an op of the program, not a program input, weight or constant."""
    from xdsl.ir import BlockArgument

    from tilecc.ir.graph import ConstantOp, ReshapeOp
    from tilecc.ir.graph_fusion import outer_value

    while True:
        v = outer_value(v)
        if isinstance(v, BlockArgument):  # a program input
            return False
        if not isinstance(v.owner, ReshapeOp):
            return not isinstance(v.owner, (WeightOp, ConstantOp))
        v = v.owner.operands[0]


def choose_schedule(
    lw: LoweringContext, problem: MatmulProblem, program: Callable[[], GraphProgram] | None = None
) -> MatmulSchedule | None:
    """The schedule of this matmul: the lowering's policy (autotuning, a forced
    schedule) if it has one, else the cost model's choice. `program` builds the graph
    program whose cycles judge a candidate when the kernel is more than the matmul alone
    (a fused group); by default the autotuner times the matmul alone."""
    policy = lw.matmul_policy
    from tilecc.passes.schedule.cost_model import choose

    sched = policy(problem, program) if policy is not None else choose(problem, lw.cfg)
    remarks.emit("lower-graph-to-tile", "passed" if sched else "missed",
                 lambda: schedule_remark(problem, sched, lw.cfg, "autotuner" if policy else "cost model"))
    return sched


def schedule_remark(p: MatmulProblem, s: MatmulSchedule | None, cfg: HardwareConfig, by: str) -> str:
    """One line: the matmul, the tile and schedule chosen, the estimated cycles."""
    from tilecc.passes.schedule.cost_model import estimate, rank

    batch = "x".join(str(b) for b in p.batch)
    dtypes = p.a_dtype if p.b_dtype == p.a_dtype else f"{p.a_dtype} x {p.b_dtype}"  # a one-byte weight
    shape = f"matmul {batch + ' x ' if batch else ''}{p.M}x{p.K}x{p.N} ({dtypes})"
    if s is None:
        return f"{shape}: no -O2 schedule fits the target; the -O0 kernel is used"
    n = len(rank(p, cfg))
    return (f"{shape}: {by} chose tile {p.TM} x {s.w * p.TN} x {p.TK} (M x N x K; nb={s.nb} m-tiles per "
            f"block, g={s.g} k-tiles per B group, B x{s.b_sets} buffered, "
            f"{'pipelined' if s.pipelined else 'not pipelined'}), estimated {estimate(p, s, cfg):,.0f} cycles "
            f"(best of {n} schedules)")


def weight_of(v: SSAValue) -> WeightOp | None:
    """The `graph.weight` behind `v` (through the block arguments of fused groups, nested
    ones included: an mlp group's matmul groups), or None."""
    from tilecc.ir.graph_fusion import outer_value

    v = outer_value(v)
    return v.owner if isinstance(v.owner, WeightOp) else None


def direct_a(lw: LoweringContext, p: MatmulProblem, s: MatmulSchedule, a: SSAValue) -> bool:
    """Whether the kernel loads its A row straight into lhsT (no transposes): one row
    (M = 1, no batch), a pre-tiled weight B (whole k-tiles), A dense in HBM."""
    return s.pretiled and p.M == 1 and not p.batch and p.K % p.TK == 0 and lw.is_dense(lw.materialise(a))


def b_operand(lw: LoweringContext, b: SSAValue, p: MatmulProblem, s: MatmulSchedule,
              batch: Sequence[int], *, interleaved: bool = False) -> Operand:
    """The kernel's B argument: the operand as it is, or (`s.pretiled`) the weight stored
    in the kernel's tile order (`ir/weight_layout.py`), a new weight derived from it
    (`interleaved`: its rows in the order of a direct A row, `direct_a`)."""
    from tilecc.ir.weight_layout import tiled_name, tiled_shape
    from tilecc.passes.graph_to_tile.shapes import elem_of

    if not s.pretiled:
        return lw.aligned_batch(b, batch, (p.K, p.N))
    w = weight_of(b)
    if w is None:
        raise CompileError("lower-graph-to-tile: a pre-tiled B must be a weight")
    tnl = s.w * p.TN
    dims = (p.K // (s.g * p.TK), s.g, p.TK, p.N // tnl, tnl)
    lw.materialise(b)  # the source's allocation: replays of this kernel map it to their own weight
    v = lw.hbm(list(tiled_shape(*dims)), elem_of(b.type), weight=tiled_name(w.weight, *dims, interleaved=interleaved))
    remarks.emit("lower-graph-to-tile", "passed",
                 lambda: f"weight '{w.weight}' stored pre-tiled for its matmul: {s.g} k-tiles x {tnl} columns "
                         f"per transfer ({s.g * tnl * p.ib:,} contiguous bytes per partition)")
    return Operand(v, [0, 1])
