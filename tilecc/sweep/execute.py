"""Run a sweep: draw the points, evaluate them (full or estimate fidelity) on a backend,
write each row as it finishes, then the Pareto column and the report page.

    summary = run_sweep(load_spec("study.toml"), "out/", workers=4, fidelity="full")
    print(summary)          # points, failed, Pareto, time, the estimate's error

Points are numbered in the sweep's order (the grid's, the random draw's sorted, or the
nsga2 trial number) and each (workload, point) is evaluated at most once per sweep:
points whose configs differ only in `[area]` share one compile and simulation (one
`evaluate.Task`), and an nsga2 trial that repeats a config reuses the first result.
A point whose config is invalid (`matrix.rows` > `sram.partitions`) fails with the
`ConfigError`'s line before anything runs.

`--fidelity estimate` first simulates `calibration_points` points per workload (spread
over the sweep) to fit the estimator (tilecc/sweep/estimate.py) and measure its error,
then estimates every point in this process.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from tilecc.errors import ConfigError, TileccError
from tilecc.simulator.area import area
from tilecc.simulator.config import HardwareConfig
from tilecc.sweep.backends import Backend, make_backend, require
from tilecc.sweep.estimate import EstimateError, Estimator
from tilecc.sweep.evaluate import Outcome, Task
from tilecc.sweep.knobs import is_knob
from tilecc.sweep.objectives import OBJECTIVES, Figures, objective_value
from tilecc.sweep.pareto import pareto_mask
from tilecc.sweep.results import ResultStore
from tilecc.sweep.spec import SweepSpec, apply_point, knob_part

__all__ = ["SweepSummary", "run_sweep", "FIDELITIES"]

FIDELITIES = ("full", "estimate")
# (index, point, figures or None, failure)
Result = tuple[int, dict[str, Any], Figures | None, str]
ProgressFn = Callable[[int, int, int, float], None]  # done, failed, total, seconds so far


@dataclass
class SweepSummary:
    points: int
    failed: int
    pareto: int
    resumed: int
    seconds: float
    fidelity: str
    out_dir: str
    estimate_errors: dict[str, EstimateError] = field(default_factory=dict)
    estimate_rate: float = 0.0  # points per second in the estimator (calibration apart)
    rows: list[dict[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        rate = (self.points - self.resumed) / self.seconds if self.seconds > 0 else 0.0
        lines = [f"sweep             {self.points} points ({self.fidelity} fidelity), {self.failed} failed, "
                 f"{self.pareto} on the Pareto front" + (f", {self.resumed} resumed" if self.resumed else ""),
                 f"time              {self.seconds:.1f} s ({rate:.1f} points/s)"]
        if self.estimate_rate:
            lines.append(f"estimate tier     {self.estimate_rate:,.0f} points/s (one core: config, estimate and "
                         "its CSV row; the calibration's simulations apart)")
        for w, err in self.estimate_errors.items():
            lines.append(f"{w}: {err.summary()}")
        lines += [f"results           {self.out_dir}/results.csv", f"report            {self.out_dir}/report.html"]
        return "\n".join(lines)


def _fmt(v: Any) -> str:
    """A value as the CSV keeps it (floats exactly, by repr)."""
    return repr(v) if isinstance(v, float) else str(v)


class _Run:
    """One sweep's state: the spec, the store, the backend and the per-sweep memo."""

    def __init__(self, spec: SweepSpec, store: ResultStore, backend: Backend, fidelity: str,
                 progress: ProgressFn | None, on_point: Callable[[int], None] | None, total: int):
        self.spec, self.store, self.backend, self.fidelity = spec, store, backend, fidelity
        self.progress, self.on_point, self.total = progress, on_point, total
        self.memo: dict[tuple[str, str], Outcome] = {}  # (workload, effective config) -> first outcome
        self.estimators: dict[str, Estimator] = {}
        self.errors: dict[str, EstimateError] = {}
        self.t0 = time.monotonic()
        self.failed = sum(1 for r in store.done.values() if r["failure"])
        self.resumed = len(store.done)
        self.estimate_seconds = 0.0  # estimating and writing points (the tier's speed, calibration apart)
        self.estimated = 0

    def label(self, workload: str) -> str:
        return workload if len(self.spec.workloads) > 1 else ""

    def record(self, workload: str, r: Result) -> dict[str, str]:
        index, point, figures, failure = r
        row = {"point": str(index), **{k: _fmt(v) for k, v in point.items()}, "failure": failure}
        if len(self.spec.workloads) > 1:
            row["workload"] = workload
        if figures is not None:
            row.update({o: _fmt(objective_value(o, figures)) for o in self.spec.objectives})
            row["bottleneck"] = figures.bottleneck
        self.store.append(row)
        self.failed += bool(failure)
        if self.progress:
            self.progress(len(self.store.done), self.failed, self.total, time.monotonic() - self.t0)
        if self.on_point:
            self.on_point(len(self.store.done) - self.resumed)
        return row

    # ---- evaluation of a batch of points of one workload ----------------------------
    def evaluate(self, workload: str, items: list[tuple[int, dict[str, Any]]]) -> Iterator[Result]:
        valid: list[tuple[int, dict[str, Any], HardwareConfig]] = []
        for index, point in items:
            try:
                cfg = self.spec.config(point, "config")
                self.spec.deployment(point)
            except ConfigError as e:
                yield index, point, None, str(e)
                continue
            valid.append((index, point, cfg))
        if self.fidelity == "estimate":
            yield from self._estimate(workload, valid)
        else:
            yield from self._full(workload, valid)

    def _estimate(self, workload: str, valid: list[tuple[int, dict[str, Any], HardwareConfig]]) -> Iterator[Result]:
        est = self.estimators[workload]
        for index, point, cfg in valid:
            try:
                yield index, point, est.figures(cfg), ""
            except TileccError as e:
                yield index, point, None, str(e)

    def _full(self, workload: str, valid: list[tuple[int, dict[str, Any], HardwareConfig]]) -> Iterator[Result]:
        groups: dict[str, list[tuple[int, dict[str, Any], HardwareConfig]]] = {}
        for index, point, cfg in valid:
            groups.setdefault(self._effective(point), []).append((index, point, cfg))
        by_index = {i: (p, c) for i, p, c in valid}
        tasks, key_of = [], {}  # a task's first point -> its effective config
        for key, members in groups.items():  # insertion order: deterministic
            known = self.memo.get((workload, key))
            if known is not None:
                for index, point, cfg in members:
                    yield index, point, _with_area(known, cfg, self.spec.deployment(point).chips), known.failure
                continue
            eff = apply_point(self.spec.base_data, {k: v for k, v in members[0][1].items()
                                                    if not k.startswith("area.")})
            areas = tuple(apply_point(self.spec.base_data, p)["area"] for _, p, _ in members)
            first = members[0][1]
            tasks.append(Task(workload, eff, tuple(i for i, _, _ in members), areas, knob_part(first),
                              self.spec.deployment(first)))
            key_of[members[0][0]] = key
        for outcomes in self.backend.run(tasks):
            self.memo.setdefault((workload, key_of[outcomes[0].index]), outcomes[0])
            for o in outcomes:
                point, _ = by_index[o.index]
                yield o.index, point, Figures(**o.figures) if o.figures else None, o.failure

    def _effective(self, point: dict[str, Any]) -> str:
        """The config without its area, with the workload knobs and the deployment over
        chips: what the compile and the simulation depend on."""
        data = apply_point(self.spec.base_data, {k: v for k, v in point.items() if not k.startswith("area.")})
        return json.dumps([data, knob_part(point), asdict(self.spec.deployment(point))], sort_keys=True)

    def calibrate(self, workload: str, points: list[tuple[int, dict[str, Any]]]) -> None:
        """Estimate fidelity: fit the workload's estimator on simulated sample points."""
        est = self.estimators[workload] = Estimator(workload)
        n = min(self.spec.calibration_points, len(points))
        sample = [points[(2 * i + 1) * len(points) // (2 * n)] for i in range(n)]
        pairs = []
        for _, point, figures, _ in self._full(workload, self._configs(sample)):
            if figures is not None:
                pairs.append((self.spec.config(point, "config"), figures))
        self.errors[workload] = est.calibrate(pairs)

    def _configs(self, items: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any], HardwareConfig]]:
        out = []
        for index, point in items:
            try:
                out.append((index, point, self.spec.config(point, "config")))
            except ConfigError:
                continue
        return out


def _with_area(o: Outcome, cfg: HardwareConfig, chips: int) -> Figures | None:
    """A memoised outcome with this point's area (`chips` chips of `cfg`)."""
    if not o.figures:
        return None
    return Figures(**{**o.figures, "area_mm2": chips * area(cfg).total if cfg.area is not None else float("nan")})


def run_sweep(spec: SweepSpec, out_dir: str, *, workers: int = 1, resume: bool = False, ray: str | None = None,
              fidelity: str = "full", progress: ProgressFn | None = None,
              on_point: Callable[[int], None] | None = None) -> SweepSummary:
    """Run `spec` into `out_dir` (see the module docstring); `on_point(n)` is called after
    the n-th point this run finished was written (tests interrupt a sweep there)."""
    if fidelity not in FIDELITIES:
        raise TileccError(f"--fidelity {fidelity!r}: expected one of {', '.join(FIDELITIES)}")
    if spec.strategy == "nsga2":
        require("optuna", 'strategy = "nsga2"')
    knobs = [k for k in spec.keys if is_knob(k)]
    if fidelity == "estimate" and knobs:
        raise TileccError(f"--fidelity estimate: the estimator models the hardware config only; "
                          f"the workload knob '{knobs[0]}' needs --fidelity full")
    if fidelity == "estimate" and spec.system:
        raise TileccError("--fidelity estimate: the estimator models one chip; 'sweep.system' needs --fidelity full")
    store = ResultStore.open(out_dir, spec, fidelity, resume)
    total = len(spec.workloads) * (spec.trials if spec.strategy == "nsga2" else len(spec.points()))
    backend = make_backend(workers, ray)
    run = _Run(spec, store, backend, fidelity, progress, on_point, total)
    try:
        if spec.strategy == "nsga2":
            from tilecc.sweep.nsga2 import run_nsga2

            run_nsga2(run)
        else:
            _run_points(run)
    finally:
        store.close()
        backend.close()
    rows = _finish(spec, store)
    from tilecc.sweep.report_html import write_report

    write_report(spec, rows, out_dir, fidelity)
    return SweepSummary(points=len(rows), failed=sum(1 for r in rows if r["failure"]),
                        pareto=sum(1 for r in rows if r["pareto"] == "true"), resumed=run.resumed,
                        seconds=time.monotonic() - run.t0, fidelity=fidelity, out_dir=str(out_dir),
                        estimate_errors=run.errors, rows=rows,
                        estimate_rate=run.estimated / run.estimate_seconds if run.estimate_seconds else 0.0)


def _run_points(run: _Run) -> None:
    points = list(enumerate(run.spec.points()))
    for w in run.spec.workloads:
        label = run.label(w)
        todo = [(i, p) for i, p in points if (label, i) not in run.store.done]
        if not todo:
            continue
        if run.fidelity == "estimate":
            run.calibrate(w, points)
        t = time.perf_counter()
        for r in run.evaluate(w, todo):
            run.record(label, r)
        if run.fidelity == "estimate":
            run.estimate_seconds += time.perf_counter() - t
            run.estimated += len(todo)


def _finish(spec: SweepSpec, store: ResultStore) -> list[dict[str, str]]:
    """The final rows in sweep order with the Pareto column, per workload."""
    rows = sorted(store.done.values(), key=lambda r: (spec.workloads.index(r["workload"])
                                                      if "workload" in r else 0, int(r["point"])))
    maximise = [OBJECTIVES[o].maximise for o in spec.objectives]
    for w in dict.fromkeys(r.get("workload", "") for r in rows):
        mine = [r for r in rows if r.get("workload", "") == w]
        values = [[float(r[o]) if r.get(o) and not r["failure"] else math.nan for o in spec.objectives] for r in mine]
        for r, on in zip(mine, pareto_mask(values, maximise)):
            r["pareto"] = "true" if on else "false"
    store.finish(rows)
    return rows
