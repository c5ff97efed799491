"""Full fidelity: one task of a sweep, compiled and simulated, in whichever process runs
it (the sweep's own, a pool worker, a Ray worker).

    task = Task(workload="examples/mlp.py:mlp", config=<config TOML tables>, points=(0, 5))
    evaluate_task(task) -> [Outcome(index=0, figures={...}, failure=""), Outcome(index=5, ...)]

A task is one (workload, effective config): the points it serves differ at most in their
`[area]` tables, which change neither the program nor its simulation, so they share one
compile and one run (`execute.py` groups them). The run is functional and compared with
torch eager: a program that does not match is a failed point, as is one that does not
compile or fit (the `TileccError`'s one line is the reason). Sanitisers run when
``TILECC_SANITIZE=1``, as everywhere.

A point deployed over several chips or replicas (tilecc/sweep/systems.py) runs in
tilecc/sweep/evaluate_system.py; every point's area is its chips' sum.

A worker keeps each workload it loaded (the model, its inputs, eager's outputs and the
exported program) for the next task of the same workload (`_workload`, a small LRU).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from tilecc.cli_args import one_line
from tilecc.errors import TileccError
from tilecc.simulator.area import area
from tilecc.simulator.config import from_dict
from tilecc.sweep.knobs import MODEL_KNOBS
from tilecc.sweep.objectives import Figures
from tilecc.sweep.systems import Deployment

__all__ = ["Outcome", "Task", "evaluate_task", "figures_of"]


@dataclass(frozen=True)
class Task:
    workload: str  # FILE.py:FACTORY
    config: dict[str, Any]  # the effective config's TOML tables (the first point's)
    points: tuple[int, ...]  # the point indices it serves
    areas: tuple[dict[str, Any], ...] = ()  # each point's [area] table (default: the config's)
    knobs: dict[str, Any] = field(default_factory=dict)  # workload knobs (tilecc/sweep/knobs.py)
    deployment: Deployment = field(default_factory=Deployment)  # over chips (tilecc/sweep/systems.py)


@dataclass(frozen=True)
class Outcome:
    index: int
    figures: dict[str, Any] = field(default_factory=dict)  # Figures as a dict; empty if failed
    failure: str = ""


@functools.lru_cache(maxsize=4)
def _workload(spec: str, knobs: str = "{}") -> tuple[Any, tuple, list, Any]:
    """(exported program, inputs, eager outputs, model) of `FILE.py:FACTORY` with the
    workload knobs (JSON of tilecc/sweep/knobs.py's model knobs) applied."""
    from tilecc.cli import load_factory, run_eager
    from tilecc.frontend.torch_export import export_model
    from tilecc.sweep.knobs import apply_knobs

    model, inputs = load_factory(spec)
    model, inputs = apply_knobs(model, inputs, json.loads(knobs))
    expected = run_eager(model, inputs)
    return export_model(model, inputs), inputs, expected, model


@functools.lru_cache(maxsize=4)
def _graph(spec: str, knobs: str = "{}") -> Any:
    """The graph IR of `_workload(spec, knobs)`'s exported program (its bound's work)."""
    from tilecc.frontend.torch_export import import_exported_program

    return import_exported_program(_workload(spec, knobs)[0])


def figures_of(report: Any, cfg: Any) -> Figures:
    return Figures(
        cycles=float(report.cycles),
        latency_us=float(report.time_us),
        energy_j=float(report.energy["joules"]),
        roofline_cycles=float(report.roofline_cycles),
        macs=float(report.macs),
        area_mm2=area(cfg).total if cfg.area is not None else float("nan"),
        bottleneck=str(report.bottleneck),
    )


def evaluate_task(task: Task) -> list[Outcome]:
    """Compile `task.workload` for its config, simulate it, compare with eager; one
    outcome per point (failed points say why)."""
    try:
        with warnings.catch_warnings():  # as in the CLI: a library's warning is no result
            if not os.environ.get("TILECC_DEBUG"):
                warnings.simplefilter("ignore")
            report, cfg = _run(task)
    except TileccError as e:
        return [Outcome(i, failure=one_line(str(e)) or type(e).__name__) for i in task.points]
    except Exception as e:  # an internal error fails the point, not the sweep
        why = f"internal error: {type(e).__name__}: {one_line(str(e))}"
        return [Outcome(i, failure=why) for i in task.points]
    if isinstance(report, str):
        return [Outcome(i, failure=report) for i in task.points]
    areas = task.areas or tuple(task.config["area"] for _ in task.points)
    out = []
    for index, area_table in zip(task.points, areas):
        point_cfg = from_dict({**task.config, "area": area_table}, f"point {index}")
        figures = report if isinstance(report, Figures) else figures_of(report, point_cfg)
        mm2 = task.deployment.chips * area(point_cfg).total if point_cfg.area is not None else float("nan")
        out.append(Outcome(index, figures={**vars(figures), "area_mm2": mm2}))  # every chip's area
    return out


def _run(task: Task) -> tuple[Any, Any]:
    import torch

    from tilecc.runtime.cache import compile_cached
    from tilecc.runtime.compare import compare
    from tilecc.runtime.executor import run_program

    cfg = from_dict(task.config, f"point {task.points[0]}")
    if task.knobs.get("phase", "forward") == "decode":
        return _run_decode(task, cfg)
    if task.knobs.get("phase", "forward") == "train":
        from tilecc.sweep.evaluate_train import run_train

        return run_train(task.workload, {k: v for k, v in task.knobs.items() if k in MODEL_KNOBS}, cfg), cfg
    model_knobs = {k: v for k, v in task.knobs.items() if k in MODEL_KNOBS}
    ep, inputs, expected, model = _workload(task.workload, json.dumps(model_knobs, sort_keys=True))
    if task.deployment.chips > 1:
        from tilecc.sweep.evaluate_system import run_deployed

        graph = _graph(task.workload, json.dumps(model_knobs, sort_keys=True))
        return run_deployed(task.deployment, task.config, cfg, graph, inputs, model), cfg
    program = compile_cached(ep, cfg, None)
    sanitize = os.environ.get("TILECC_SANITIZE", "0") == "1"
    outputs, report = run_program(program, inputs, sanitize=sanitize)
    ok, worst = compare(outputs, [torch.as_tensor(e) for e in expected])
    if not ok:
        return f"the compiled program does not match eager (max abs error {worst:.3g})", cfg
    return report, cfg


DECODE_STEPS = 3  # greedy tokens a decode point generates and compares (the prefill's, then 2 decode steps)


def _run_decode(task: Task, cfg: Any) -> tuple[Any, Any]:
    """A `phase = "decode"` point: the LM's prefill and decode programs (static KV cache,
    tilecc/llm/) on the point's config, `DECODE_STEPS` greedy tokens on the simulator
    against eager `model.generate`; the figures of one decode step, `tokens` = the batch."""
    import torch

    from tilecc.generate_cli import load_lm
    from tilecc.llm.generate import eager_generate, run_generation
    from tilecc.llm.programs import compile_programs
    from tilecc.sweep.knobs import apply_knobs

    dp = task.deployment.dp
    if task.deployment.replica_chips > 1:  # refused by the spec (tilecc/sweep/systems.py)
        return "phase \"decode\" runs each replica on one chip (tp = pp = 1)", cfg
    batch, prompt = int(task.knobs.get("batch", 1)), int(task.knobs.get("prompt_len", 16))
    if batch % dp:
        return f"dp = {dp}: a batch of {batch} sequences cannot be split over {dp} replicas", cfg
    batch //= dp  # one replica's share
    model, _ = apply_knobs(load_lm(task.workload), (), {k: v for k, v in task.knobs.items() if k in MODEL_KNOBS})
    model = model.eval()
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(0))
    expected = eager_generate(model, ids, DECODE_STEPS)  # before the cache wrapper changes the rotary
    progs = compile_programs(model, batch=batch, prompt_len=prompt, max_len=prompt + DECODE_STEPS, target=cfg)
    tokens, _, steps = run_generation(progs, ids, DECODE_STEPS)
    if tokens != expected:
        return "the generated tokens differ from eager model.generate's", cfg
    step = figures_of(steps[-1], cfg)
    if dp == 1:
        return dataclasses.replace(step, tokens=float(batch)), cfg
    # dp replicas step together: one replica's time, every replica's energy and tokens; the
    # bound of the whole batch over dp chips is not the replica's (no full-batch program): NaN
    return dataclasses.replace(step, energy_j=dp * step.energy_j, macs=dp * step.macs, tokens=float(dp * batch),
                               roofline_cycles=float("nan")), cfg
