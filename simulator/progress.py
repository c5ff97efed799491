"""Progress of long compiles and simulations, for whoever listens (the CLI's display).

    with progress.listen(events.append):                 # the CLI installs a listener
        progress.report("lower-graph-to-tile", 37, 120, "k36_fused_matmul", unit="op")
    events[0]  ->  Event("lower-graph-to-tile", 37, 120, "k36_fused_matmul", "op")
    str(events[0])  ->  "lower-graph-to-tile: op 37/120 k36_fused_matmul"

The compiler driver reports each pass as it starts, lower-graph-to-tile each op it has
lowered (with the kernel it made), the simulator the fraction of the program it has
executed. A ground module (standard library only, like `passes/remarks.py`'s collector)
so that the passes and the simulator may both import it; `report` costs one
context-variable read when nothing listens.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Event", "listen", "listening", "report"]


@dataclass(frozen=True)
class Event:
    phase: str  # a pass name, "simulate", or a step of the CLI ("export", "eager", ...)
    done: int = 0  # units finished of `total` (0 of 0: the phase has just started)
    total: int = 0
    detail: str = ""  # what was just done: a kernel's name
    unit: str = ""  # what `done` counts: "op", "instruction"

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total > 0 else None

    def __str__(self) -> str:
        text = self.phase
        if self.total > 0:
            text += f": {self.unit + ' ' if self.unit else ''}{self.done:,}/{self.total:,}"
        if self.detail:
            text += f"{' ' if self.total > 0 else ': '}{self.detail}"
        return text


Listener = Callable[[Event], None]
_LISTENER: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("tilecc_progress", default=None)


def listening() -> bool:
    """Whether a listener is installed (to skip building what only a listener reads)."""
    return _LISTENER.get() is not None


def report(phase: str, done: int = 0, total: int = 0, detail: str = "", unit: str = "") -> None:
    """Tell the listener, if any, where the work stands."""
    fn = _LISTENER.get()
    if fn is not None:
        fn(Event(phase, done, total, detail, unit))


@contextlib.contextmanager
def listen(fn: Listener) -> Iterator[None]:
    """Send the events reported inside the block to `fn` (nested: the innermost wins)."""
    token = _LISTENER.set(fn)
    try:
        yield
    finally:
        _LISTENER.reset(token)
