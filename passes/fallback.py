"""Fallbacks: an optimisation that cannot handle a case gives way to a general kernel.

An -O2 lowering (a fused group's kernel, the blocked matmul, flash attention, the
optimised convolutions) covers most shapes; where one fails on a valid program — any
exception, a compiler bug included — the compile does not stop. The driver
(`runtime/compiler.py`) compiles again with a `FallbackPlan` that names what to give up:

- a failing `graph.fused` group: its ops are left unfused (`no_fuse`), each lowered by
  its own kernel;
- a failing single op: lowered by its -O0 baseline kernel (`baseline`);
- a failure after lowering (planning, instruction selection, synchronisation): the op
  or group whose kernel it names (an -O2 kernel whose buffers overflow SRAM), as above;
  one that names no kernel: the whole program at -O0.

Each fallback is a ``missed`` remark naming the op, its location and the reason, and is
listed in ``Program.meta["fallbacks"]``. Only a failure of the general kernel itself
reaches the user, as a `TileccError` naming the op and its location (a non-tilecc
exception becomes a `CompileError` "internal error ... (please report)").

Ops are named across compiles by their *ordinal*: the position in ``@forward`` when
fuse-graph starts (or lower-graph-to-tile, when fusion is off). The passes before it are
deterministic, so the same model numbers its ops alike in every attempt.

    plan = FallbackPlan()
    session.fallback = plan            # fuse-graph numbers the ops, lowering reads the plan
    ... except OptimisationFailed as e: plan = plan.without(e)   # and compile again
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Operation

from tilecc.errors import CompileError, TileccError


class OptimisationFailed(CompileError):
    """An optimised lowering failed on op(s) `ordinals`; `kind` says what to give up
    (``unfuse`` or ``baseline``). Caught by the driver, which compiles again."""

    def __init__(self, kind: str, ordinals: frozenset[int], op_name: str, loc: str, reason: str):
        self.kind = kind
        self.ordinals = ordinals
        self.op_name = op_name
        self.loc = loc
        self.reason = reason
        super().__init__(f"{op_name} at {loc}: {reason}")


@dataclass(frozen=True)
class FallbackPlan:
    """What the next compile gives up: ops kept out of fusion, ops lowered at -O0."""

    no_fuse: frozenset[int] = frozenset()
    baseline: frozenset[int] = frozenset()

    def without(self, failure: OptimisationFailed) -> FallbackPlan:
        if failure.kind == "unfuse":
            return FallbackPlan(self.no_fuse | failure.ordinals, self.baseline)
        return FallbackPlan(self.no_fuse, self.baseline | failure.ordinals)


@dataclass
class OpNumbering:
    """The ordinals of one compile's ops: single ops by identity, fused groups by the
    ordinals of their members (filled by fuse-graph)."""

    ordinal: dict[Operation, int] = field(default_factory=dict[Operation, int])
    members: dict[Operation, frozenset[int]] = field(default_factory=dict[Operation, frozenset[int]])
    numbered: bool = False
    # kernel name -> the failure to report if a later pass cannot handle that kernel
    # (the op or group that lowered it: a later pass's failure on it falls back alike)
    kernel_owner: dict[str, OptimisationFailed] = field(default_factory=dict[str, "OptimisationFailed"])

    def number(self, ops: list[Operation]) -> None:
        """Number `ops` (the body of @forward) once per compile."""
        if self.numbered:
            return
        self.ordinal = {op: i for i, op in enumerate(ops)}
        self.numbered = True


def describe_exception(e: BaseException) -> str:
    """A tilecc error's message; another exception's type and message (an internal error)."""
    if isinstance(e, TileccError):
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    text = str(e).splitlines()[0] if str(e) else ""
    return f"internal error {type(e).__name__}{': ' + text if text else ''}"
