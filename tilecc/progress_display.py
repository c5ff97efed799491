"""The command line's progress line: what a long compile or simulation is doing now.

    with ProgressDisplay(enabled=not args.quiet) as display:   # listens to simulator/progress.py
        ...compile and simulate...
    display.phase   # the last phase reported ("lower-graph-to-tile"): names an internal error

A `rich` progress bar on stderr (``lower-graph-to-tile: op 37/120 k36_fused_matmul``, the
fraction simulated), shown only when stderr is a terminal and only once the work has
taken `DELAY_S` seconds (short commands print nothing); it disappears when done. The
listener always records the phase, for the CLI's one-line internal-error report.
"""

from __future__ import annotations

import contextlib
import sys
import time
from types import TracebackType
from typing import Any

from tilecc.simulator import progress

DELAY_S = 2.0  # seconds of work before the bar appears


class ProgressDisplay:
    def __init__(self, enabled: bool = True, stream: Any = None, delay_s: float = DELAY_S):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled and callable(isatty) and bool(isatty())
        self.delay_s = delay_s
        self.phase = ""
        self._t0 = self._drawn = 0.0
        self._bar: Any = None  # rich.progress.Progress, created once the delay has passed
        self._task: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ProgressDisplay:
        self._t0 = time.monotonic()
        self._stack.enter_context(progress.listen(self.on_event))
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def on_event(self, event: progress.Event) -> None:
        changed, self.phase = event.phase != self.phase, event.phase
        now = time.monotonic()
        if not self.enabled or now - self._t0 < self.delay_s:
            return
        bar = self._bar if self._bar is not None else self._start()
        # drawn at once on a new phase, else by rich's own refresh (at most ~10 times a second)
        redraw = changed or now - self._drawn >= 0.1
        if redraw:
            self._drawn = now
        total = event.total if event.total > 0 else None
        bar.update(self._task, description=str(event), completed=event.done, total=total, refresh=redraw)

    def _start(self) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, stderr=self.stream is sys.stderr)
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                             TimeElapsedColumn(), console=console, transient=True)
        self._task = self._bar.add_task("", total=None)
        self._bar.start()
        return self._bar
