"""The autotuning policy of the -O2 matmul kernels: candidates from the cost model,
each timed by a measurement the driver supplies, the winner cached on disk.

    policy = tuning_policy(cfg, measure_program)      # runtime/compiler.py builds it
    sched = policy(problem)                           # the matmul alone judges
    sched = policy(problem, lambda: group_program)    # a fused group's kernel judges

`measure_program(graph_program, schedule) -> cycles` compiles the program with every
matmul under `schedule` and simulates it; it is a callback so that passes/ never
imports the driver or the simulator's machine. Candidates are the cost model's best
`TUNE_CANDIDATES` schedules, chosen to differ (`diverse`); `autotune.py` keeps the
winners per kernel signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import BFloat16Type, Float8E4M3FNType, Float16Type, IntegerType, ModuleOp, TensorType, f32
from xdsl.ir import Block, Region

from tilecc.ir import graph as g
from tilecc.ir.meta_weights import MetaWeight
from tilecc.passes.schedule.autotune import Autotuner
from tilecc.passes.schedule.cost_model import choose, rank
from tilecc.passes.schedule.matmul_schedule import MatmulProblem, MatmulSchedule, fits
from tilecc.simulator.config import HardwareConfig

GraphProgram = g.GraphProgram
MeasureProgram = Callable[[GraphProgram, MatmulSchedule], float]
KERNEL_VERSION = "matmul-resident-1"  # bump when the kernel's code changes (cached winners)

TUNE_CANDIDATES = 8  # schedules the autotuner simulates per matmul: the cost model's best


def kernel_alone(problem: MatmulProblem, cfg: HardwareConfig) -> GraphProgram:
    """A graph program holding only this matmul (inputs a, b; output out)."""
    elem = {"f32": f32, "bf16": BFloat16Type(), "f16": Float16Type(), "i8": IntegerType(8),
            "f8e4m3": Float8E4M3FNType()}
    p = problem
    a_shape = [x if w else 1 for x, w in zip(p.batch, p.a_batch)] + [p.M, p.K]
    b_shape = [x if w else 1 for x, w in zip(p.batch, p.b_batch)] + [p.K, p.N]
    ta, tb = TensorType(elem[p.a_dtype], a_shape), TensorType(elem[p.b_dtype], b_shape)
    if p.b_weight:  # B a weight (it may be stored pre-tiled): shapes only, timed without values
        block = Block(arg_types=[ta])
        wop = g.WeightOp.make("b", tb)
        block.add_op(wop)
        b_val = wop.results[0]
        weights: dict = {"b": MetaWeight(tuple(b_shape), np.dtype(np.float32))}
    else:
        block = Block(arg_types=[ta, tb])
        b_val, weights = block.args[1], {}
    mm = g.MatmulOp.make(block.args[0], b_val, loc="<autotune>")
    block.add_op(mm)
    block.add_op(func.ReturnOp(mm.results[0]))
    args = [ta] if p.b_weight else [ta, tb]
    fn = func.FuncOp("forward", (args, [mm.results[0].type]), Region(block))
    return g.GraphProgram(ModuleOp([fn]), weights, ["a", "b"][:len(args)], ["out"])


def diverse(ranked: Sequence[tuple[float, MatmulSchedule]], first: MatmulSchedule, n: int) -> list[MatmulSchedule]:
    """The best-ranked schedules that differ from each other (and from `first`) in the
    block, the chunk width, the number of B queues or staggering; then the next best."""
    def shape(s: MatmulSchedule) -> tuple:
        return (s.nb, s.w, len(s.qb), s.stagger)

    seen = {shape(first)}
    out: list[MatmulSchedule] = []
    for _, s in ranked:
        if len(out) < n and s != first and shape(s) not in seen:
            seen.add(shape(s))
            out.append(s)
    for _, s in ranked:
        if len(out) < n and s != first and s not in out:
            out.append(s)
    return out


def _valid_schedule(d: Mapping[str, Any], problem: MatmulProblem, cfg: HardwareConfig) -> bool:
    """A cached winner is a schedule that fits (a hand-edited or stale file may hold anything)."""
    try:
        s = MatmulSchedule.from_dict(d)
    except (KeyError, TypeError, ValueError):
        return False
    Q = cfg.dma.queues
    return (s.nb >= 1 and s.w >= 1 and s.g >= 1 and s.b_sets in (1, 2) and bool(s.qb) and bool(s.qa)
            and all(0 <= q < Q for q in s.qb + s.qa) and fits(problem, s, cfg))


def tuning_policy(
    cfg: HardwareConfig, measure_program: MeasureProgram, tuner: Autotuner | None = None,
    n_candidates: int = TUNE_CANDIDATES,
) -> Callable[..., MatmulSchedule | None]:
    """problem -> schedule: the fastest of the cost model's best `n_candidates`
    schedules (the first is the cost model's own choice), each timed by
    `measure_program` — the driver's callback that compiles a graph program with every
    matmul under one schedule and simulates it (passes never run the simulator) — via
    `tuner`'s on-disk cache (a new `Autotuner(cfg)` by default). The policy's second
    argument is the graph program that judges a candidate (a fused group's kernel);
    by default the matmul alone (`kernel_alone`); it is built only if a candidate is timed."""
    tuner = tuner if tuner is not None else Autotuner(cfg)

    def policy(problem: MatmulProblem, program: Callable[[], GraphProgram] | None = None) -> MatmulSchedule | None:
        first = choose(problem, cfg)
        if first is None:
            return None
        cands = [first] + diverse(rank(problem, cfg), first, n_candidates - 1)
        sig = {**problem.signature(), "tiles": [problem.TM, problem.TK, problem.TN], "kernel": KERNEL_VERSION}

        judge: list[GraphProgram] = []

        def timed(d: Mapping[str, Any]) -> float:
            if not judge:
                judge.append(program() if program is not None else kernel_alone(problem, cfg))
            return measure_program(judge[0], MatmulSchedule.from_dict(d))

        best = tuner.tune("matmul", sig, [s.to_dict() for s in cands], timed,
                          validate=lambda d: _valid_schedule(d, problem, cfg))
        return MatmulSchedule.from_dict(best.params)

    policy.tuner = tuner
    return policy
