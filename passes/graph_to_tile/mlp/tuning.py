"""The autotuning policy of the fused MLP kernel (entry.py): candidates from its cost
model, each timed by a measurement the driver supplies, the winner cached on disk.

    policy = mlp_tuning_policy(cfg, measure, tuner)   # runtime/compiler.py builds it
    sched = policy(problem, lambda: group_program, signature)

`measure(graph_program, schedule) -> cycles` compiles the program with every fused
MLP kernel under `schedule` and simulates it timing-only; it is a callback so that
passes/ never imports the driver or the simulator's machine. The judge program is the
MLP group alone, its groups inlined (`mlp_alone`), built only when a candidate is timed.
Candidates are the fitting schedules in the cost model's order (cost.py `rank`, whose
first is `choose`'s pick), at most `TUNE_CANDIDATES`; `passes/schedule/autotune.py`
keeps the winner per kernel signature under the kind ``"fused_mlp"``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.meta_weights import MetaWeight
from tilecc.passes.graph_to_tile.matmul_problem import weight_of
from tilecc.passes.graph_to_tile.mlp.cost import rank
from tilecc.passes.graph_to_tile.mlp.problem import MlpProblem
from tilecc.passes.graph_to_tile.mlp.schedule import MlpSchedule, fits
from tilecc.passes.graph_to_tile.shapes import shape_of
from tilecc.passes.schedule.autotune import Autotuner
from tilecc.simulator.config import HardwareConfig

MeasureMlp = Callable[[g.GraphProgram, MlpSchedule], float]
KIND = "fused_mlp"
KERNEL_VERSION = "fused-mlp-1"  # bump when the kernel's code changes (cached winners)
TUNE_CANDIDATES = 6  # schedules simulated per MLP kernel: the cost model's best


def group_signature(op: Operation, fields: Mapping[str, Any]) -> dict[str, Any]:
    """What of the MLP group changes its kernel besides the problem's numbers: `fields`
    (the caller's: element types, gated, prologue / epilogue present) and a digest of
    the group's ops (names, attributes but source locations, result types: which
    activation, prologue and epilogue ops)."""
    lines = []
    for o in op.walk():
        attrs = sorted((k, str(v)) for k, v in o.attributes.items() if k != g.LOC_ATTR)
        lines.append(f"{o.name} {attrs} {[str(r.type) for r in o.results]}")
    return {**fields, "ops": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]}


def mlp_alone(op: FusedOp) -> g.GraphProgram:
    """A graph program computing only the MLP group `op`, its groups inlined (the
    pipeline's fuse-graph and fuse-mlp group it again; intrinsic work has no rule for a
    group): its inputs are arguments, but weights, which stay weights (shapes only: the
    program is timed, not run), so that W1 and W2 may be stored pre-tiled as in the
    whole program."""
    weights: dict = {}  # MetaWeight values (shapes only), as group_alone in fused_matmul.py
    wops = [weight_of(v) for v in op.operands]
    types = [a.type for a, w in zip(op.block.args, wops) if w is None]
    block = Block(arg_types=types)
    args = iter(block.args)
    mapping: dict[SSAValue, SSAValue] = {}
    for a, w in zip(op.block.args, wops):
        if w is not None:
            weights[w.weight] = MetaWeight(tuple(shape_of(a.type)), np.dtype(np.float32))
            wop = g.WeightOp.make(w.weight, a.type)  # pyright: ignore[reportArgumentType]
            block.add_op(wop)
            mapping[a] = wop.results[0]
        else:
            mapping[a] = next(args)

    def inline(group: FusedOp) -> list[SSAValue]:
        for o in group.block.ops:
            if isinstance(o, YieldOp):
                return [mapping[v] for v in o.values]
            if isinstance(o, FusedOp):
                for arg, v in zip(o.block.args, o.operands, strict=True):
                    mapping[arg] = mapping[v]
                mapping.update(zip(o.results, inline(o)))
                continue
            clone = o.clone(value_mapper=mapping)
            block.add_op(clone)
            mapping.update(zip(o.results, clone.results))
        raise CompileError(f"the fused group at {g.source_loc(group)} has no yield")

    outs = inline(op)
    block.add_op(func.ReturnOp(*outs))
    fn = func.FuncOp("forward", (types, [r.type for r in op.results]), Region(block))
    return g.GraphProgram(ModuleOp([fn]), weights, [f"in{i}" for i in range(len(types))],
                          [f"out{i}" for i in range(len(op.results))])


def _valid(d: Mapping[str, Any], problem: MlpProblem, cfg: HardwareConfig) -> bool:
    """A cached winner is a schedule that fits (a hand-edited or stale file may hold anything)."""
    try:
        s = MlpSchedule(int(d["g"]), int(d["w"]))
    except (KeyError, TypeError, ValueError):
        return False
    return s.g >= 1 and s.w >= 1 and fits(problem, s, cfg)


def mlp_tuning_policy(
    cfg: HardwareConfig, measure: MeasureMlp, tuner: Autotuner | None = None, n_candidates: int = TUNE_CANDIDATES,
) -> Callable[..., MlpSchedule | None]:
    """(problem, judge program builder, signature) -> the fastest of the cost model's
    best `n_candidates` fitting schedules, each timed by `measure` through `tuner`'s
    on-disk cache (a new `Autotuner(cfg)` by default); None where none fits."""
    tuner_ = tuner if tuner is not None else Autotuner(cfg)

    def policy(problem: MlpProblem, program: Callable[[], g.GraphProgram],
               signature: Mapping[str, Any]) -> MlpSchedule | None:
        cands = rank(problem, cfg)[:n_candidates]
        if not cands:
            return None
        sig = {**dataclasses.asdict(problem), **signature, "kernel": KERNEL_VERSION}
        judge: list[g.GraphProgram] = []

        def timed(d: Mapping[str, Any]) -> float:
            if not judge:
                judge.append(program())
            return measure(judge[0], MlpSchedule(int(d["g"]), int(d["w"])))

        best = tuner_.tune(KIND, sig, [{"g": s.g, "w": s.w} for s in cands], timed,
                          validate=lambda d: _valid(d, problem, cfg))
        return MlpSchedule(int(best.params["g"]), int(best.params["w"]))

    policy.tuner = tuner_  # pyright: ignore[reportFunctionMemberAccess]
    return policy


__all__ = ["KERNEL_VERSION", "KIND", "TUNE_CANDIDATES", "group_signature", "mlp_alone", "mlp_tuning_policy"]
