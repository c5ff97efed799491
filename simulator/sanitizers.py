"""Sanitisers: checks that a program is well synchronised and well behaved.

`sanitize(stream, config, start, end)` raises the first problem it finds (the one at the
lowest instruction index) as one of:

- `MemoryAccessError`: an operand outside its memory (and the other structural
  `SimulatorError`s of `simulator.decode`'s checks, which everything else relies on);
- `DeadlockError`: waits that can never be met. Semaphores only count up within a
  kernel, so whether a kernel deadlocks does not depend on timing; the message names
  each blocked engine, its head instruction and the semaphores it waits on (awaited and
  reachable values);
- `RaceError` (`check_races`): two instructions on different engine queues touch
  overlapping bytes, at least one writing, and neither happens before the other;
- `UninitializedReadError` (`check_uninitialized`): an instruction reads SRAM or
  accumulator bytes that nothing wrote before its simulated start.

Every message names the instruction(s) as ``instruction 17 (matrix): <asm text>``
(`describe`) and the memory range or semaphores involved. The analyses live in their
own modules: `sync_analysis` (happens-before as vector clocks, deadlocks, redundant
waits), `footprints` (what each instruction touches), `races`, `uninitialized`.
"""

from __future__ import annotations

import re

import numpy as np

from tilecc.errors import SimulatorError
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.isa import RECORD
from tilecc.simulator.listing import describe
from tilecc.simulator.races import race_problem
from tilecc.simulator.sync_analysis import Problem, SyncAnalysis, analyze
from tilecc.simulator.uninitialized import uninitialized_problem

__all__ = [
    "SyncAnalysis",
    "analyze_sync",
    "check_races",
    "check_uninitialized",
    "describe",
    "redundant_waits",
    "sanitize",
]


def sanitize(
    stream: np.ndarray,
    config: HardwareConfig,
    start: np.ndarray | None = None,
    end: np.ndarray | None = None,
    *,
    hbm_size: int | None = None,
) -> None:
    """Raise the problem at the lowest instruction index, if any (see the module doc).

    Structural and bounds errors come first (nothing else is meaningful without them);
    then deadlocks, races (ordered by the later instruction of the pair) and
    uninitialised reads (by the reading instruction) compete on instruction index.
    `start`/`end` are `SimResult.start`/`.end`; without them a timing-only `simulate`
    supplies them (when the program does not deadlock). `hbm_size` bounds HBM
    operands (default: the configured capacity).
    """
    prog = _checked_program(stream, config, hbm_size)
    sync = analyze(prog, want_redundant=False)
    problems: list[Problem] = []
    if sync.deadlock is not None:
        problems.append(sync.deadlock)
    race = race_problem(prog, sync)
    if race is not None:
        problems.append(race)
    if sync.deadlock is None:
        if start is None or end is None:
            from tilecc.simulator.machine import simulate

            res = simulate(stream, config, None, functional=False)
            start, end = res.start, res.end
            if start is None or end is None:
                raise SimulatorError("the timing simulation recorded no start / end times")
        uninit = uninitialized_problem(prog, start, end)
        if uninit is not None:
            problems.append(uninit)
    if problems:
        raise min(problems, key=lambda p: p[0])[1]


def check_races(stream: np.ndarray, config: HardwareConfig) -> None:
    """Raise `RaceError` for the first unordered conflicting pair (by the later
    instruction), or `DeadlockError` when a kernel's waits can never be met (the
    happens-before relation is undefined beyond that point)."""
    prog = _checked_program(stream, config, None)
    sync = analyze(prog, want_redundant=False)
    race = race_problem(prog, sync)
    if race is not None and (sync.deadlock is None or race[0] < sync.deadlock[0]):
        raise race[1]
    if sync.deadlock is not None:
        raise sync.deadlock[1]


def check_uninitialized(
    stream: np.ndarray, config: HardwareConfig, start: np.ndarray, end: np.ndarray
) -> None:
    """Raise `UninitializedReadError` for the lowest-indexed instruction that reads
    SRAM/ACC bytes not written before its simulated start."""
    prog = _checked_program(stream, config, None)
    problem = uninitialized_problem(prog, start, end)
    if problem is not None:
        raise problem[1]


def _checked_program(
    stream: np.ndarray, config: HardwareConfig, hbm_size: int | None
) -> DecodedProgram:
    """The machine's program view after its structure and bounds checks; their errors
    are re-raised naming the instruction with its asm text."""
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD or stream.ndim != 1:
        raise SimulatorError("the instruction stream must be a 1-D numpy array of isa.RECORD")
    prog = DecodedProgram(stream, config)
    prog.stream_records = stream  # for messages (asm text)
    size = config.hbm.capacity_bytes if hbm_size is None else int(hbm_size)
    try:
        prog.check(size)
    except SimulatorError as e:
        better = _with_asm(e, stream)
        if better is e:
            raise
        raise better from e
    return prog


# the machine's 'instruction 7 (dma1 DMA_LOAD): ...' (before it names the asm text itself)
_MACHINE_WHERE = re.compile(r"^instruction (\d+) \([a-z]+\d* [A-Z_]+\): ")


def _with_asm(e: SimulatorError, stream: np.ndarray) -> SimulatorError:
    m = _MACHINE_WHERE.match(str(e))
    if m is None or int(m.group(1)) >= len(stream):
        return e
    return type(e)(f"{describe(stream, int(m.group(1)))}: {str(e)[m.end():]}")


def analyze_sync(stream: np.ndarray, config: HardwareConfig) -> SyncAnalysis:
    """Vector clocks, topological order, deadlock and redundant waits of a stream."""
    prog = _checked_program(stream, config, None)
    return analyze(prog, want_redundant=True)


def redundant_waits(stream: np.ndarray, config: HardwareConfig) -> np.ndarray:
    """bool [n, MAX_WAITS]: wait slots implied by program order and the instruction's
    other waits (transitively), which a scheduler may drop."""
    red = analyze_sync(stream, config).redundant
    assert red is not None
    return red
