"""The NPU simulator: timing, then functional execution in simulated time order.

`simulate(stream, config, hbm)` runs an instruction stream (`isa.RECORD`) in three steps,
each in its own module:

1. **Check** (`simulator.decode`, vectorised over the whole stream): opcodes, engines,
   DMA queues, element types, memories, flags, tile sizes, matmul limits and semaphore
   ids are valid, and every operand lies inside its memory (the sanitiser). Errors name
   the instruction index, its engine and opcode, the memory and the offending range.

2. **Timing** (`simulator.scheduler`): a discrete-event simulation of the engine queues,
   each instruction's durations given by the closed forms of `simulator.timing` (DMA:
   fixed part plus transfer at its rate alone (its engines, short-chunk-derated, at most
   the HBM peak), the DMA engines and HBM shared by the transfers in flight; matrix:
   preload, streaming, fill and drain, pipelined or not; vector: latency plus element
   groups times the op cost). ``BARRIER`` splits the stream
   into kernels; a deadlock raises `DeadlockError` naming each blocked engine. With
   ``record=False`` start/end times are not kept and a timing-only run proceeds a
   chunk of whole kernels at a time.

3. **Functional** (`simulator.functional`, ``functional=True``): numpy execution on
   modelled memories, each instruction reading its operands at its simulated start and
   writing its result at its simulated end.

`simulator.stats` turns the schedule and the stream's counts into the `SimResult`
(cycles, busy time, utilisation, stalls, bytes, MACs); with ``sanitize=True``
`simulator.sanitizers` checks races, uninitialised reads and deadlocks first.
"""

from __future__ import annotations

import numpy as np

from tilecc.errors import SimulatorError
from tilecc.simulator import progress
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.functional import FunctionalMachine, single_threaded_torch
from tilecc.simulator.gc_pause import gc_paused
from tilecc.simulator.isa import RECORD, Opcode
from tilecc.simulator.scheduler import Schedule, schedule
from tilecc.simulator.stats import SimResult, counts, sim_result

__all__ = ["SimResult", "simulate"]


# record=False schedules the stream in chunks of whole kernels of about this many
# instructions, so the per-instruction working set does not grow with the stream
_CHUNK = 1 << 14


def simulate(
    stream: np.ndarray,
    config: HardwareConfig,
    hbm: np.ndarray | None,
    *,
    functional: bool = True,
    record: bool = True,
    sanitize: bool = False,
) -> SimResult:
    """Run `stream` on `config`; with `functional`, execute it on `hbm` (changed in place).

    `hbm` is the whole HBM image, a flat writable uint8 array (ignored in timing-only
    mode, where it may be None and bounds are checked against the configured capacity).
    With ``record=False`` the per-instruction start/end times are not kept (the result's
    `start`/`end` are None) and a timing-only run checks and schedules the stream a
    chunk of whole kernels at a time, so its memory does not grow with the stream.
    With ``sanitize`` the sanitisers (`simulator.sanitizers`: races, reads of
    never-written memory, deadlocks) check the scheduled program before it executes.
    """
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD or stream.ndim != 1:
        raise SimulatorError("the instruction stream must be a 1-D numpy array of isa.RECORD")
    if functional:
        _check_hbm_image(hbm)
    hbm_size = len(hbm) if hbm is not None else config.hbm.capacity_bytes
    if functional or record or sanitize:
        prog = DecodedProgram(stream, config)
        prog.check(hbm_size)
        progress.report("simulate", 0, len(stream), "timing", unit="instruction")
        with gc_paused():  # the scheduler allocates millions of short-lived tuples
            sched = schedule(prog, record=True)
        if sanitize:
            progress.report("simulate", 0, len(stream), "sanitizers", unit="instruction")
            from tilecc.simulator.sanitizers import sanitize as run_sanitizers

            run_sanitizers(stream, config, sched.start, sched.end, hbm_size=hbm_size)
        if functional:
            assert hbm is not None and sched.start is not None and sched.end is not None
            with single_threaded_torch():
                FunctionalMachine(config, hbm).run(prog, sched.start, sched.end)
        figures = counts(prog)
        if not record:
            sched.start = sched.end = None
        return sim_result(config, prog.engine_names, sched, figures)
    totals: Schedule | None = None
    figures = {}
    names: list[str] = []
    t, kernel = 0.0, 0
    for lo, hi in _chunks(stream):
        progress.report("simulate", lo, len(stream), "timing", unit="instruction")
        prog = DecodedProgram(stream[lo:hi], config, offset=lo)
        prog.check(hbm_size)
        with gc_paused():
            sched = schedule(prog, t, kernel, record=False)
        # a chunk ends with a barrier (except the last): the next kernel numbers on
        kernel += sched.kernels - 1
        t = sched.finish
        part = counts(prog)
        figures = {k: figures.get(k, 0) + v for k, v in part.items()}
        names = prog.engine_names
        totals = sched if totals is None else _add_schedules(totals, sched)
        del prog
    assert totals is not None
    return sim_result(config, names, totals, figures)


def _chunks(stream: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) slices of about `_CHUNK` instructions that end just after a barrier."""
    n = len(stream)
    if n <= _CHUNK:
        return [(0, n)]
    cuts = np.flatnonzero(stream["opcode"] == Opcode.BARRIER) + 1
    spans, lo = [], 0
    while lo < n:
        k = np.searchsorted(cuts, lo + _CHUNK, side="right")  # cuts <= lo + _CHUNK
        hi = int(cuts[k - 1]) if k > 0 and cuts[k - 1] > lo else None
        if hi is None:  # one kernel longer than a chunk: up to its barrier, or the end
            later = cuts[cuts > lo]
            hi = int(later[0]) if later.size else n
        spans.append((lo, hi))
        lo = hi
    return spans


def _add_schedules(a: Schedule, b: Schedule) -> Schedule:
    return Schedule(
        start=None,
        end=None,
        finish=b.finish,
        kernels=a.kernels + b.kernels - 1,
        busy=[x + y for x, y in zip(a.busy, b.busy, strict=True)],
        semaphore_stall=[x + y for x, y in zip(a.semaphore_stall, b.semaphore_stall, strict=True)],
        hbm_stall=[x + y for x, y in zip(a.hbm_stall, b.hbm_stall, strict=True)],
        hbm_busy=a.hbm_busy + b.hbm_busy,
    )


def _check_hbm_image(hbm: np.ndarray | None) -> None:
    if hbm is None:
        raise SimulatorError("functional simulation needs an HBM image (a flat uint8 array)")
    if not isinstance(hbm, np.ndarray) or hbm.dtype != np.uint8 or hbm.ndim != 1:
        raise SimulatorError("the HBM image must be a 1-D numpy uint8 array")
    if not (hbm.flags.c_contiguous and hbm.flags.writeable):
        raise SimulatorError("the HBM image must be contiguous and writable")


