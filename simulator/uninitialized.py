"""Uninitialised reads: an instruction reading SRAM or accumulator bytes nothing wrote before.

The accesses are replayed in simulated order (reads at an instruction's start, writes at
its end, an accumulating matmul's read of its output just before it writes it; at equal
times the writes first, in program order, as the functional machine does) over a
per-byte shadow of SRAM and the accumulator. Memory starts uninitialised at program
start and stays written across barriers.
"""

from __future__ import annotations

import numpy as np

from tilecc.errors import SimulatorError, UninitializedReadError
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.footprints import SLOTS, Footprints, on_chip_footprints, where_text
from tilecc.simulator.gc_pause import gc_paused
from tilecc.simulator.isa import Mem
from tilecc.simulator.listing import describe
from tilecc.simulator.sync_analysis import Problem

__all__ = ["uninitialized_problem"]


def uninitialized_problem(prog: DecodedProgram, start: np.ndarray, end: np.ndarray) -> Problem | None:
    """The lowest-indexed read of never-written on-chip bytes, if any."""
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    if start.shape != (prog.n,) or end.shape != (prog.n,):
        raise SimulatorError(
            f"start/end must hold one time per instruction ({prog.n}), got shapes "
            f"{start.shape} and {end.shape}"
        )
    fp = on_chip_footprints(prog)
    if len(fp) == 0:
        return None
    # reads at the start, writes at the end; an accumulating matmul reads its output
    # when it writes it (read-modify-write at the end, just before its own write). At
    # equal times the end-of-instruction accesses go first, in program order, as the
    # functional machine does them.
    at_end = fp.write | (fp.slot == 2)
    time = np.where(at_end, end[fp.instr], start[fp.instr])
    phase = (~at_end).astype(np.int8)
    order = np.lexsort((fp.write, fp.instr, phase, time))
    cfg = prog.config
    shadow = {
        int(Mem.SRAM): np.zeros((cfg.sram.partitions, cfg.sram.bytes_per_partition), dtype=bool),
        int(Mem.ACC): np.zeros(
            (cfg.accumulator.partitions, cfg.accumulator.bytes_per_partition), dtype=bool
        ),
    }
    with gc_paused():
        best = _replay(order, fp, shadow)
    if best is None:
        return None
    i, f, rect = best
    slot = SLOTS[int(fp.slot[f])]
    role, when = prog.role(i, slot), start[i]
    if slot == "o":  # an accumulating matmul, at its end
        role, when = "output (accumulate reads it)", end[i]
    message = (
        f"{describe(prog.records(), i)}: reads uninitialised {where_text(*rect)} "
        f"({role}): nothing wrote those bytes before cycle {when:g}"
    )
    return i, UninitializedReadError(message, i)


def _replay(
    order: np.ndarray, fp: Footprints, shadow: dict[int, np.ndarray]
) -> tuple[int, int, tuple[int, int, int, int, int]] | None:
    """(instruction, footprint, never-written rectangle) of the lowest-indexed read of
    bytes not yet written when the accesses happen in `order`."""
    written: set[tuple[int, int, int, int, int]] = set()
    full: set[tuple[int, int, int, int, int]] = set()
    best: tuple[int, int, tuple[int, int, int, int, int]] | None = None  # (instr, fp, rect)
    cols = [getattr(fp, f)[order].tolist() for f in ("instr", "mem", "p0", "p1", "b0", "b1")]
    writes = fp.write[order].tolist()
    fps = order.tolist()
    for i, mem, p0, p1, b0, b1, w, f in zip(*cols, writes, fps, strict=True):
        key = (mem, p0, p1, b0, b1)
        if w:
            if key not in written:
                written.add(key)
                shadow[mem][p0:p1, b0:b1] = True
            continue
        if key in full or (best is not None and i >= best[0]):
            continue
        view = shadow[mem][p0:p1, b0:b1]
        if view.all():
            full.add(key)
            continue
        rows = np.flatnonzero(~view.all(axis=1))
        bytes_ = np.flatnonzero(~view.all(axis=0))
        rect = (mem, p0 + int(rows[0]), p0 + int(rows[-1]) + 1, b0 + int(bytes_[0]),
                b0 + int(bytes_[-1]) + 1)
        best = (i, f, rect)
    return best

