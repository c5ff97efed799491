"""`tilecc sweep SPEC.toml --out DIR`: the command line of the design-space sweep.

    tilecc sweep examples/sweep/mlp_tiny.toml --out /tmp/study [--workers N] [--resume]
                 [--ray ADDRESS|local] [--fidelity full|estimate] [-q]

Everything is validated before any point runs (the spec, the output directory, the
optional dependencies the options need), so a bad spec is one ``error:`` line and exit 2.
On a terminal a progress line shows the points done, failed and the estimated time
left; a summary follows at the end (points, failures, Pareto points, the estimate's
measured error, the output files).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from tilecc.cli_args import add_quiet
from tilecc.simulator import progress as sim_progress

__all__ = ["add_sweep_parser", "cmd_sweep"]

MAX_WORKERS = 1024


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of workers") from None
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{n} workers: expected 1 to {MAX_WORKERS}")
    return n


def add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser("sweep", help="design-space exploration: sweep hardware configs over workloads, "
                                      "Pareto fronts in DIR/results.csv and DIR/report.html")
    sw.add_argument("spec", help="a sweep spec (.toml with a [sweep] table; see tilecc/sweep/spec.py)")
    sw.add_argument("--out", required=True, help="output directory (results.csv, report.html)")
    sw.add_argument("--workers", type=_workers, default=None,
                    help="local worker processes (default: the CPU count; 1 runs in this process)")
    sw.add_argument("--resume", action="store_true", help="continue an interrupted sweep in DIR")
    sw.add_argument("--ray", metavar="ADDRESS", help="run on Ray: a cluster address, or 'local' (needs ray)")
    sw.add_argument("--fidelity", choices=["full", "estimate"], default="full",
                    help="full: compile and simulate every point; estimate: the cost model, calibrated on "
                         "a few simulated points (>= 100 points/s)")
    add_quiet(sw)
    sw.set_defaults(fn=cmd_sweep)


class _SweepProgress:
    """A rich progress line on a terminal's stderr: points done, failed, time left."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, failed: int, total: int, seconds: float) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("sweep {task.description}"), BarColumn(), TimeElapsedColumn(),
                                 TextColumn("left"), TimeRemainingColumn(), console=Console(stderr=True),
                                 transient=True)
            self._task = self._bar.add_task("", total=total)
            self._bar.start()
        self._bar.update(self._task, completed=done, total=total,
                         description=f"{done}/{total} points, {failed} failed")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def cmd_sweep(args: argparse.Namespace) -> int:
    from tilecc.sweep.backends import require
    from tilecc.sweep.execute import run_sweep
    from tilecc.sweep.spec import load_spec

    spec = load_spec(args.spec)  # validated before anything else
    if args.ray:
        require("ray", "--ray")
    require("matplotlib", "the sweep's report")
    workers = args.workers or os.cpu_count() or 1
    bar = _SweepProgress(enabled=not args.quiet)
    t0 = time.monotonic()
    try:
        with sim_progress.listen(lambda event: None):  # the points' compile phases are not shown
            summary = run_sweep(spec, args.out, workers=workers, resume=args.resume, ray=args.ray,
                                fidelity=args.fidelity, progress=bar)
    finally:
        bar.close()
    print(summary)
    if not args.quiet:
        print(f"wall time         {time.monotonic() - t0:.1f} s")
    return 0
