"""`strategy = "nsga2"`: Optuna's NSGA-II sampler draws the points, a generation at a time.

    for each generation: ask `population` trials (each a choice from every grid list),
    evaluate them together on the backend, tell Optuna their objective values
    (a failed point, or one with an undefined objective, is told as failed)

The trial number is the point's index. The sampler is seeded (`sweep.seed`), so a
resumed sweep asks the same trials again; those already in results.csv are told their
recorded values instead of being evaluated. Optuna is an optional dependency.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tilecc.sweep.backends import require
from tilecc.sweep.objectives import OBJECTIVES

if TYPE_CHECKING:
    from tilecc.sweep.execute import _Run

__all__ = ["run_nsga2", "POPULATION"]

POPULATION = 16  # trials per generation (fewer when the sweep has fewer trials)


def run_nsga2(run: _Run) -> None:
    optuna = require("optuna", 'strategy = "nsga2"')
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = run.spec
    workload = spec.workloads[0]
    label = run.label(workload)
    population = max(2, min(POPULATION, spec.trials))
    sampler = optuna.samplers.NSGAIISampler(seed=spec.seed, population_size=population)
    directions = ["maximize" if OBJECTIVES[o].maximise else "minimize" for o in spec.objectives]
    study = optuna.create_study(directions=directions, sampler=sampler)
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in spec.grid.items()}
    if run.fidelity == "estimate":
        first = [(i, spec.point_at(i * _size(spec) // max(spec.calibration_points, 1)))
                 for i in range(min(spec.calibration_points, _size(spec)))]
        run.calibrate(workload, first)
    index = 0
    while index < spec.trials:
        trials = [study.ask(dists) for _ in range(min(population, spec.trials - index))]
        items = [(index + j, {k: t.params[k] for k in spec.grid}) for j, t in enumerate(trials)]
        values: dict[int, list[float] | None] = {}
        todo = []
        for i, point in items:
            row = run.store.done.get((label, i))
            if row is None:
                todo.append((i, point))
            else:
                values[i] = _values(row, spec.objectives)
        for r in run.evaluate(workload, todo):
            values[r[0]] = _values(run.record(label, r), spec.objectives)
        for (i, _), trial in zip(items, trials):
            v = values[i]
            if v is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, v)
        index += len(trials)


def _size(spec: Any) -> int:
    n = 1
    for v in spec.grid.values():
        n *= len(v)
    return n


def _values(row: dict[str, str], objectives: tuple[str, ...]) -> list[float] | None:
    if row["failure"]:
        return None
    v = [float(row[o]) for o in objectives]
    return None if any(math.isnan(x) for x in v) else v
