"""The pass registry and the default pipeline."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tilecc.passes.graph.canonicalize import CanonicalizeGraphPass, canonicalize
from tilecc.passes.graph.fold_norm_affine import fold_norm_weights
from tilecc.passes.graph.fuse import FuseGraphPass, fuse
from tilecc.passes.graph.merge_linears import merge_linears
from tilecc.passes.graph_to_tile.context import DslKernelSource
from tilecc.passes.graph_to_tile.conversion import LowerGraphToTilePass, lower_graph_to_tile
from tilecc.passes.npu.insert_sync import InsertSyncPass, insert_sync
from tilecc.passes.session import CompileSession
from tilecc.passes.tile.plan_hbm import PlanHbmPass, plan_hbm
from tilecc.passes.tile.plan_sram import PlanSramPass, plan_sram
from tilecc.passes.tile_to_npu import LowerTileToNpuPass, lower_tile_to_npu
from tilecc.simulator.config import HardwareConfig

PASSES: dict[str, type[ModulePass]] = {
    p.name: p
    for p in (
        CanonicalizeGraphPass, FuseGraphPass, LowerGraphToTilePass, PlanSramPass, PlanHbmPass,
        LowerTileToNpuPass, InsertSyncPass,
    )
}

Stage = tuple[str, Callable[[ModuleOp], object]]  # (pass name, run on a module; its result unused)


def default_pipeline(
    cfg: HardwareConfig, opt_level: int = 2, matmul_policy: Callable | None = None,
    session: CompileSession | None = None, dsl_kernels: DslKernelSource | None = None,
    weights: Mapping[str, np.ndarray] | None = None, share: bool = True, mlp_policy: Callable | None = None,
    resident: bool = True, forward: bool = True,
) -> list[Stage]:
    """(pass name, function) in order; `hbm-layout` is read between plan-hbm and lowering.

    `opt_level` 0 is the baseline every figure is compared with (one single-buffered
    kernel per op, fixed tiles, strided operand loads); 2 (default) uses the optimised
    kernels (see `passes/graph_to_tile/matmul.py`). `matmul_policy` (problem -> schedule) picks
    the -O2 matmul kernels' schedules instead of the cost model (autotuning), `mlp_policy` the
    fused MLP kernels' (`passes/graph_to_tile/mlp/tuning.py`). `weights`
    (the program's data) lets canonicalize-graph read compile-time masks; a mutable mapping
    also runs merge-linears (`passes/graph/merge_linears.py`), which adds merged weights to it. `share`: ops of
    one structure launch one kernel (`passes/graph_to_tile/sharing.py`). `resident` (-O2 only):
    constant buffers stay in SRAM across kernels (`passes/tile/resident_constants.py`);
    off where kernels run one by one on another machine (the GPU backend). `forward`
    (with `resident`): activation tiles stay in SRAM from the kernel that computes them
    to the kernels that read them (`passes/tile/forward_activations.py`).
    """
    if opt_level not in (0, 2):
        raise ValueError(f"optimisation level {opt_level}: tilecc has -O0 and -O2")
    session = session if session is not None else CompileSession()
    graph: list[Stage] = []
    if opt_level >= 2:
        graph = [("canonicalize-graph", lambda m: _each_function(m, lambda f: canonicalize(f, weights)))]
        if isinstance(weights, MutableMapping):  # it concatenates weights: the driver's own copy of them
            mutable = weights
            graph.append(("fold-norm-weight", lambda m: fold_norm_weights(m, mutable)))
            graph.append(("merge-linears", lambda m: merge_linears(m, mutable)))
        graph.append(("fuse-graph", lambda m: _each_function(m, lambda f: fuse(f, session))))

    return graph + [
        ("lower-graph-to-tile", lambda m: lower_graph_to_tile(m, cfg, opt_level, matmul_policy, session, dsl_kernels,
                                                                    share, mlp_policy)),
        ("plan-sram", lambda m: plan_sram(m, cfg, resident=resident and opt_level >= 2,
                                          forward=forward and resident and opt_level >= 2)),
        ("plan-hbm", lambda m: plan_hbm(m, cfg)),
        ("lower-tile-to-npu", lambda m: lower_tile_to_npu(m, cfg)),
        ("npu-insert-sync", lambda m: insert_sync(m, cfg, session)),
    ]


def _each_function(module: ModuleOp, fn: Callable) -> None:
    from xdsl.dialects import func

    for f in module.ops:
        if isinstance(f, func.FuncOp):
            fn(f)


def pipeline_spec(target: str) -> str:
    """The default pipeline as a `tilecc-opt -p` string."""
    import dataclasses

    def spec(name: str) -> str:
        fields = {f.name for f in dataclasses.fields(PASSES[name])}
        return f"{name}{{target={target}}}" if "target" in fields else name

    return ",".join(spec(name) for name in PASSES)
