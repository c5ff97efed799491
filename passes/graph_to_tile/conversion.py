"""lower-graph-to-tile: one tile kernel per graph op (or fused group), tiled to the target's memories.

Before (graph)::

    func.func @forward(%x: tensor<37x53xf32>) -> tensor<37x53xf32> {
      %y = graph.relu %x : tensor<37x53xf32>
      func.return %y : tensor<37x53xf32>
    }

After (tile; `tiny`: 16 partitions)::

    func.func @k0_relu(%x: memref<37x53xf32>, %out: memref<37x53xf32>) attributes {tile.kernel} {
      scf.for %i = %c0 to %c3 step %c1 {          // row tiles of 16, the last one 5 rows
        %r = arith.minsi %c16, %rem : index
        scf.for %j = ... {                          // column tiles
          tile.load %x[%r0, %c0] into %in sizes(%r, %c) ...
          tile.unary "relu" %in into %out_buf sizes(%r, %c) ...
          tile.store %out_buf into %out[%r0, %c0] sizes(%r, %c) ...
    }}}
    func.func @main() -> memref<37x53xf32> {
      %x = tile.hbm_alloc {input = 0 : i64} : memref<37x53xf32>
      %y = tile.hbm_alloc : memref<37x53xf32>
      func.call @k0_relu(%x, %y) : (...) -> ()
      func.return %y : memref<37x53xf32>
    }

Tile shapes come from the hardware config: rows to SRAM partitions, matmul tiles to
the systolic array (K <= rows, N <= columns) and the accumulator, columns to what fits
in a partition. Any size works: edge tiles get `min(tile, extent - start)` sizes.
Reshapes become `tile.view` (free); layout changes (permute, expand) are strided DMA
copies. The program's weights and inputs become `tile.hbm_alloc` with `weight` / `input`.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from tilecc.errors import CompileError, InternalError, TileccError
from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.weight_layout import source_of
from tilecc.passes import remarks
from tilecc.passes.fallback import OptimisationFailed, describe_exception
from tilecc.passes.graph_to_tile.context import DslKernelSource, LoweringContext
from tilecc.passes.graph_to_tile.registry import lowerings
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.passes.graph_to_tile.sharing import Recording, replay, structural_key
from tilecc.passes.session import CompileSession
from tilecc.simulator import progress
from tilecc.simulator.config import HardwareConfig, load_config


def lower_graph_to_tile(
    module: ModuleOp, cfg: HardwareConfig, opt_level: int = 2, matmul_policy: Callable[..., Any] | None = None,
    session: CompileSession | None = None, dsl_kernels: DslKernelSource | None = None, share: bool = True,
    mlp_policy: Callable[..., Any] | None = None,
) -> LoweringContext:
    """Replace `module`'s graph function @forward by tile kernels and their @main;
    with `share`, ops of one structural key launch one kernel (`sharing.py`); `mlp_policy`
    picks the fused MLP kernels' schedules (autotuning, `mlp/tuning.py`)."""
    lw = LoweringContext(cfg, opt_level, matmul_policy, session if session is not None else CompileSession(),
                         dsl_kernels=dsl_kernels, mlp_policy=mlp_policy)
    lw.memo.enabled = share
    convert(lw, module)
    return lw


def convert(lw: LoweringContext, module: ModuleOp) -> None:
    """Lower every op of @forward in order, then assemble @main from the launches."""
    forward = next(
        (op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_name.data == "forward"),
        None,
    )
    if forward is None:
        raise CompileError("lower-graph-to-tile: the module has no func.func @forward")
    for i, arg in enumerate(forward.body.block.args):
        lw.values[arg] = lw.hbm(shape_of(arg.type), elem_of(arg.type), input=i)
    lw.session.numbering.number(list(forward.body.block.ops))  # unless fuse-graph did
    outputs: list[SSAValue] = []
    # a snapshot: a lowering may fuse later ops into its kernel (erasing them) or lower
    # a later weight / constant ahead of time; both are skipped here
    ops = list(forward.body.block.ops)
    for done, op in enumerate(ops, 1):
        if op.parent is None or (
            op.results and (op.results[0] in lw.values or op.results[0] in lw.scalars)
        ):
            continue
        if isinstance(op, func.ReturnOp):
            outputs = [lw.dense(lw.materialise(v)) for v in op.arguments]
            continue
        lw.request_layout(op)
        lower_op(lw, op)
        if progress.listening():
            progress.report("lower-graph-to-tile", done, len(ops), lw.kernels[-1].sym_name.data if lw.kernels else "",
                            unit="op")
        if op.results:
            lw.layout_requests.pop(op.results[0], None)
    out_types = [v.type for v in outputs]
    main = func.FuncOp("main", ([], out_types))
    for op in lw.main_ops:
        main.body.block.add_op(op)
    main.body.block.add_op(func.ReturnOp(*outputs))
    _drop_replaced_weights(main)
    forward.detach()
    forward.erase()
    for name, n in lw.memo.shared():
        remarks.emit("lower-graph-to-tile", "passed", f"kernel {name} shared by {n} launches")
    for k in lw.kernels:
        module.body.block.add_op(k)
    module.body.block.add_op(main)



def _drop_replaced_weights(main: func.FuncOp) -> None:
    """A weight every user of which reads a pre-tiled copy (ir/weight_layout.py) leaves
    HBM: its allocation has no use."""
    allocs = [op for op in main.body.block.ops if isinstance(op, tile.HbmAllocOp) and op.weight is not None]
    sources = {source_of(op.weight.data) for op in allocs}  # pyright: ignore[reportOptionalMemberAccess]
    for op in allocs:
        if op.weight.data in sources and not op.result.uses:  # pyright: ignore[reportOptionalMemberAccess]
            op.detach()
            op.erase()


def lower_op(lw: LoweringContext, op: Operation) -> None:
    """Lower one graph op through the registry, with its location on remarks and @main ops.

    An op the session's fallback plan names is lowered at -O0. Where an -O2 lowering
    fails, `OptimisationFailed` asks the driver to compile again without that
    optimisation (passes/fallback.py); a failure of the general kernel is a
    `TileccError` naming the op and its location."""
    loc = g.source_loc(op)
    numbering, plan = lw.session.numbering, lw.session.fallback
    ordinal = numbering.ordinal.get(op)
    saved, saved_level, lw.lowering = lw.lowering, lw.opt_level, op
    if ordinal is not None and ordinal in plan.baseline:
        lw.opt_level = 0
    first_kernel = len(lw.kernels)
    key = structural_key(lw, op) if lw.memo.enabled else None
    known = lw.memo.replays.get(key) if key is not None else None
    try:
        if known is not None:  # a re-launch of a kernel already built
            replay(lw, op, known)
            _share_owner(lw, op, known.kernels)
            return
        recording = Recording(lw, op) if key is not None else None
        with remarks.at(loc):
            lowering = lowerings().get(type(op))
            if lowering is None:
                raise CompileError(f"lower-graph-to-tile: no lowering for {op.name} at {loc}")
            lowering(lw, op, loc)
        if recording is not None:
            lw.memo.replays[key] = recording.finish()  # pyright: ignore[reportArgumentType]
        members = numbering.members.get(op)
        owner = (("unfuse", members) if members else ("baseline", frozenset({ordinal}))
                 if lw.opt_level >= 2 and ordinal is not None else None)
        if owner is not None:  # a later pass's failure on these kernels falls back to this op
            for k in lw.kernels[first_kernel:]:
                numbering.kernel_owner[k.sym_name.data] = OptimisationFailed(
                    owner[0], owner[1], _describe(op), loc, "")
    except OptimisationFailed:
        raise
    except Exception as e:  # noqa: BLE001 (every failure is either a fallback or a TileccError)
        members = numbering.members.get(op)
        what = describe_exception(e)
        if members:
            raise OptimisationFailed("unfuse", members, _describe(op), loc, what) from e
        if lw.opt_level >= 2 and ordinal is not None:
            raise OptimisationFailed("baseline", frozenset({ordinal}), op.name, loc, what) from e
        if isinstance(e, TileccError):
            raise
        raise InternalError(f"internal error lowering {op.name} at {loc}: {what} (please report)") from e
    finally:
        lw.lowering, lw.opt_level = saved, saved_level


def _share_owner(lw: LoweringContext, op: Operation, kernels: list[str]) -> None:
    """A later pass's failure on a shared kernel falls back for every op launching it."""
    numbering = lw.session.numbering
    ordinal = numbering.ordinal.get(op)
    ords = numbering.members.get(op) or (frozenset({ordinal}) if ordinal is not None else frozenset())
    for k in kernels:
        old = numbering.kernel_owner.get(k)
        if old is not None and ords:
            numbering.kernel_owner[k] = OptimisationFailed(old.kind, old.ordinals | ords, old.op_name, old.loc, "")


def _describe(op: Operation) -> str:
    """``graph.fused "matmul" (graph.matmul, graph.add)``: a fused group and its ops."""
    if isinstance(op, FusedOp):
        inner = [o.name for o in op.body.block.ops if not isinstance(o, YieldOp | g.ConstantOp)]
        return f"graph.fused \"{op.kind.data}\" ({', '.join(inner)})"
    return op.name


@dataclass(frozen=True)
class LowerGraphToTilePass(ModulePass):
    name = "lower-graph-to-tile"
    target: str = "tiny"
    opt_level: int = 2

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_graph_to_tile(op, load_config(self.target), self.opt_level)
