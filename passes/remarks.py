"""Optimisation remarks: what each pass decided and why, one line per decision.

A pass reports a decision with one call::

    from tilecc.passes import remarks
    remarks.emit("fuse-graph", "passed", "fused matmul, add, gelu into one matmul kernel", loc)
    remarks.emit("fuse-graph", "missed", lambda: f"did not fuse {what}: {why}", loc)

Kinds follow LLVM's optimisation remarks: ``passed`` (a transformation done),
``missed`` (one not done, with the reason) and ``analysis`` (a figure that explains a
choice: a cost, a footprint). The message may be a callable, so nothing is formatted
when nobody collects.

Remarks go to the innermost active `collecting()` scope (a `contextvars.ContextVar`,
so a compile nested in another, as the autotuner's are, keeps its remarks apart);
without one, `emit` is a no-op. A remark without a location takes the scope's
current location (`at(loc)`: the lowering sets it per graph op).
`runtime.compiler.compile_graph` collects a program's remarks into
``Program.meta["remarks"]`` and the report carries them; `tilecc explore --remarks`
prints them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

KINDS = ("passed", "missed", "analysis")


@dataclass(frozen=True)
class Remark:
    pass_name: str
    kind: str
    message: str
    loc: str = ""

    def __str__(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        return f"{where}remark [{self.pass_name}] {self.kind}: {self.message}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> Remark:
        return Remark(str(d["pass_name"]), str(d["kind"]), str(d["message"]), str(d.get("loc", "")))


@dataclass
class Collector:
    remarks: list[Remark] = field(default_factory=list)
    loc: str = ""  # location of remarks emitted without one

    def add(self, pass_name: str, kind: str, message: str, loc: str | None) -> None:
        if kind not in KINDS:
            raise ValueError(f"remark kind {kind!r}: expected one of {', '.join(KINDS)}")
        self.remarks.append(Remark(pass_name, kind, message, loc if loc else self.loc))

    def withdraw(self, keep: Callable[[Remark], bool]) -> int:
        """Drop the remarks `keep` rejects (a later step undid what they say); how many."""
        before = len(self.remarks)
        self.remarks = [r for r in self.remarks if keep(r)]
        return before - len(self.remarks)

    def to_json(self) -> list[dict[str, str]]:
        return [r.to_dict() for r in self.remarks]


_ACTIVE: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("tilecc_remarks", default=None)


def enabled() -> bool:
    return _ACTIVE.get() is not None


def emit(pass_name: str, kind: str, message: str | Callable[[], str], loc: str | None = None) -> None:
    """Record one decision of `pass_name` (a no-op outside `collecting()`)."""
    c = _ACTIVE.get()
    if c is None:
        return
    c.add(pass_name, kind, message() if callable(message) else message, loc)


def withdraw(pass_name: str, kind: str, loc: str, containing: str) -> int:
    """Drop the active scope's remarks of `pass_name` and `kind` at `loc` whose message
    contains `containing`: a later step of the same compile made them wrong (fuse-mlp
    joins the two groups a fuse-graph `missed` remark says stayed apart). How many."""
    c = _ACTIVE.get()
    if c is None:
        return 0
    return c.withdraw(lambda r: not (r.pass_name == pass_name and r.kind == kind and r.loc == loc
                                     and containing in r.message))


@contextmanager
def collecting() -> Iterator[Collector]:
    """A scope whose remarks go to the yielded collector (nested scopes shadow it)."""
    c = Collector()
    token = _ACTIVE.set(c)
    try:
        yield c
    finally:
        _ACTIVE.reset(token)


@contextmanager
def at(loc: str) -> Iterator[None]:
    """Remarks emitted in this scope without a location get `loc`."""
    c = _ACTIVE.get()
    if c is None:
        yield
        return
    saved, c.loc = c.loc, loc
    try:
        yield
    finally:
        c.loc = saved


__all__ = ["KINDS", "Collector", "Remark", "at", "collecting", "emit", "enabled", "withdraw"]
