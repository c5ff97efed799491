"""The race detector: two engine queues touching the same bytes with no ordering between them.

Two instructions on different engine queues race when they touch overlapping bytes, at
least one writing, and neither happens before the other (`sync_analysis`). They are
found FastTrack style, vectorised with numpy, over the `footprints` of the stream:
only HBM operands whose bounding range can meet a write on another queue in the same
kernel are split into exact byte intervals. Within each kernel and memory, the
partition and byte coordinates are compressed to the edges that occur, so each
footprint covers a few cells. Events (cell, instruction) sorted by (cell, topological
rank) give, for each event and each other queue q, the last write (and read) by q in
that cell before it; the event races when that access's position in q exceeds the
event's clock for q. The race reported is the one whose later instruction comes first.
"""

from __future__ import annotations

import numpy as np

from tilecc.errors import RaceError
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.footprints import (
    SLOTS,
    Footprints,
    hbm_bounding,
    hbm_intervals,
    on_chip_footprints,
    range_text,
    where_text,
)
from tilecc.simulator.isa import Mem
from tilecc.simulator.listing import describe
from tilecc.simulator.sync_analysis import Problem, SyncAnalysis

__all__ = ["race_problem"]

# footprints per chunk of kernels in the race detector (bounds its memory)
_CHUNK_FOOTPRINTS = 200_000


def race_problem(prog: DecodedProgram, sync: SyncAnalysis) -> Problem | None:
    """The first race (by its later instruction), if any."""
    runs = sync.rank >= 0
    chip = on_chip_footprints(prog)
    chip = chip.take(np.flatnonzero(runs[chip.instr]))
    hbm = hbm_bounding(prog)
    hbm = hbm.take(np.flatnonzero(runs[hbm.instr]))
    kern = sync.kernel
    n_kernels = int(kern.max()) + 1 if prog.n else 0
    # chunks of whole kernels, by on-chip footprint count
    per_kernel = np.bincount(kern[chip.instr], minlength=n_kernels)
    cut = [0]
    total = 0
    for k, c in enumerate(per_kernel.tolist()):
        if total and total + c > _CHUNK_FOOTPRINTS:
            cut.append(k)
            total = 0
        total += c
    cut.append(n_kernels)
    chip_k, hbm_k = kern[chip.instr], kern[hbm.instr]
    chip_order, hbm_order = np.argsort(chip_k, kind="stable"), np.argsort(hbm_k, kind="stable")
    chip_sorted, hbm_sorted = chip_k[chip_order], hbm_k[hbm_order]
    for k0, k1 in zip(cut[:-1], cut[1:], strict=True):
        a, b = np.searchsorted(chip_sorted, [k0, k1])
        c, d = np.searchsorted(hbm_sorted, [k0, k1])
        fps = [chip.take(chip_order[a:b])]
        h = _hbm_candidates(prog, sync, hbm.take(hbm_order[c:d]), k0)
        if len(h):
            fps.append(h)
        found = _detect(prog, sync, Footprints.concat(fps), k0)
        if found is not None:
            return found
    return None


def _hbm_candidates(prog: DecodedProgram, sync: SyncAnalysis, fp: Footprints, k0: int) -> Footprints:
    """The HBM accesses whose bounding range meets a write on another queue (or that
    write and meet any access on another queue), split into exact byte intervals."""
    if len(fp) == 0 or not fp.write.any():
        return fp.take(np.zeros(0, dtype=np.int64))
    q = sync.queue[fp.instr]
    lo, hi = _dense_keys(sync.kernel[fp.instr] - k0, fp.b0, fp.b1)
    cand = np.zeros(len(fp), dtype=bool)
    for queue in np.unique(q).tolist():
        mine = q == queue
        wL, wH = _merge_intervals(lo[mine & fp.write], hi[mine & fp.write])
        aL, aH = _merge_intervals(lo[mine], hi[mine])
        others = ~mine
        cand |= others & (_meets(wL, wH, lo, hi) | (fp.write & _meets(aL, aH, lo, hi)))
    idx = np.flatnonzero(cand)
    if idx.size == 0:
        return fp.take(idx)
    rows: list[tuple[int, int, bool, int, int]] = []
    for j in idx.tolist():
        i = int(fp.instr[j])
        for b0, b1 in hbm_intervals(prog, i, SLOTS[int(fp.slot[j])]):
            rows.append((i, int(fp.slot[j]), bool(fp.write[j]), b0, b1))
    arr = np.array([(r[0], r[1], r[3], r[4]) for r in rows], dtype=np.int64).reshape(-1, 4)
    m = arr.shape[0]
    return Footprints(
        instr=arr[:, 0],
        slot=arr[:, 1],
        mem=np.full(m, int(Mem.HBM), dtype=np.int64),
        p0=np.zeros(m, dtype=np.int64),
        p1=np.ones(m, dtype=np.int64),
        b0=arr[:, 2],
        b1=arr[:, 3],
        write=np.array([r[2] for r in rows], dtype=bool),
    )


def _dense_keys(
    group: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Order-preserving small integer keys for (group, lo) and (group, hi): values are
    ranked first, so any address range fits in int64."""
    vals, inv = np.unique(np.concatenate([lo, hi]), return_inverse=True)
    inv = inv.reshape(-1)
    width = vals.size
    g = group.astype(np.int64) * width
    return g + inv[: lo.size], g + inv[lo.size :]


def _compress(group: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cell index ranges [c0, c1) of [lo, hi) among the edges of its group."""
    klo, khi = _dense_keys(group, lo, hi)
    keys = np.unique(np.concatenate([klo, khi]))
    return np.searchsorted(keys, klo), np.searchsorted(keys, khi)


def _detect(prog: DecodedProgram, sync: SyncAnalysis, fp: Footprints, k0: int) -> Problem | None:
    """FastTrack over compressed cells: the first event (in topological rank) that an
    access by another queue, not ordered before it, conflicts with."""
    if len(fp) == 0:
        return None
    group = (sync.kernel[fp.instr] - k0) * 3 + fp.mem
    pc0, pc1 = _compress(group, fp.p0, fp.p1)
    bc0, bc1 = _compress(group, fp.b0, fp.b1)
    n_b = int(bc1.max()) + 1
    npc, nbc = pc1 - pc0, bc1 - bc0
    count = npc * nbc
    ev_fp = np.repeat(np.arange(len(fp)), count)
    t = np.arange(ev_fp.size) - np.repeat(np.cumsum(count) - count, count)
    cell = (pc0[ev_fp] + t // nbc[ev_fp]) * n_b + bc0[ev_fp] + t % nbc[ev_fp]
    instr = fp.instr[ev_fp]
    rank = sync.rank[instr]
    order = np.lexsort((rank, cell))
    ev_fp, cell, instr, rank = ev_fp[order], cell[order], instr[order], rank[order]
    write = fp.write[ev_fp]
    queue = sync.queue[instr]
    ordinal = sync.ordinal[instr]
    new = np.ones(cell.size, dtype=bool)
    new[1:] = cell[1:] != cell[:-1]
    seg = np.cumsum(new) - 1
    base = seg * (1 << 32)  # ordinals < 2**32; events per chunk < 2**30
    best: tuple[int, int, int, bool] | None = None  # (rank, event, queue, against write)
    for q in range(len(sync.queues)):
        if not (queue == q).any():
            continue
        other = queue != q
        if not other.any():
            continue
        clock = sync.clock[instr, q]
        for against_write in (True, False):
            mine = (queue == q) & (write if against_write else ~write)
            if not mine.any():
                continue
            last = np.maximum.accumulate(base + np.where(mine, ordinal, 0)) - base
            bad = other & (last > clock)
            if not against_write:
                bad &= write
            hit = np.flatnonzero(bad)
            if hit.size:
                e = int(hit[np.argmin(rank[hit])])
                if best is None or rank[e] < best[0]:
                    best = (int(rank[e]), e, q, against_write)
    if best is None:
        return None
    _, e, q, against_write = best
    # the partner: the last access by q in this cell before e (its ordinal is `last`)
    mine = (queue == q) & (write if against_write else ~write)
    in_cell = np.flatnonzero((cell == cell[e]) & mine & (np.arange(cell.size) <= e))
    partner = int(instr[in_cell[-1]])
    return _race_message(prog, fp, int(ev_fp[e]), partner, against_write)


def _race_message(
    prog: DecodedProgram, fp: Footprints, fx: int, partner: int, partner_writes: bool
) -> Problem:
    records = prog.records()
    x = int(fp.instr[fx])
    mem = int(fp.mem[fx])
    # the partner's operand that overlaps x's operand
    cands = np.flatnonzero(
        (fp.instr == partner) & (fp.mem == mem) & (fp.write == partner_writes)
        & (fp.p0 < fp.p1[fx]) & (fp.p1 > fp.p0[fx]) & (fp.b0 < fp.b1[fx]) & (fp.b1 > fp.b0[fx])
    )
    fy = int(cands[0]) if cands.size else fx
    slot_x, slot_y = SLOTS[int(fp.slot[fx])], SLOTS[int(fp.slot[fy])]
    if mem == Mem.HBM:
        xs = hbm_intervals(prog, x, slot_x)
        ys = hbm_intervals(prog, partner, slot_y)
        common = [
            (max(a0, b0), min(a1, b1))
            for a0, a1 in xs
            for b0, b1 in ys
            if max(a0, b0) < min(a1, b1)
        ]
        lo, hi = min(c[0] for c in common), max(c[1] for c in common)
        nbytes = sum(c[1] - c[0] for c in common)
        where = f"HBM bytes {range_text(lo, hi)}"
        if nbytes != hi - lo:
            where += f" ({nbytes} bytes in that range)"
    else:
        p0 = max(int(fp.p0[fx]), int(fp.p0[fy]))
        p1 = min(int(fp.p1[fx]), int(fp.p1[fy]))
        b0 = max(int(fp.b0[fx]), int(fp.b0[fy]))
        b1 = min(int(fp.b1[fx]), int(fp.b1[fy]))
        where = where_text(mem, p0, p1, b0, b1)
    verb_x = "writes" if fp.write[fx] else "reads"
    verb_y = "writes" if partner_writes else "reads"
    # a matmul that accumulates reads its output too
    first, second = sorted((x, partner))
    what = {
        x: f"{prog.engine_names[int(prog.eng[x])]} {verb_x} {prog.role(x, slot_x)}",
        partner: f"{prog.engine_names[int(prog.eng[partner])]} {verb_y} "
        f"{prog.role(partner, slot_y)}",
    }
    message = (
        f"race between {describe(records, first)} and {describe(records, second)}: "
        f"{what[first]} and {what[second]} overlapping {where}, with no ordering between "
        f"them (no queue order, semaphore wait or barrier)"
    )
    return second, RaceError(message, (first, second))



def _merge_intervals(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted disjoint [L, H)."""
    if lo.size == 0:
        return lo, hi
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    new = np.ones(lo.size, dtype=bool)
    new[1:] = lo[1:] > reach[:-1]  # overlapping or touching intervals merge
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], lo.size) - 1
    return lo[starts], reach[ends]


def _meets(L: np.ndarray, H: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each [lo, hi) meets the union of sorted disjoint [L, H)."""
    if L.size == 0:
        return np.zeros(lo.size, dtype=bool)
    k = np.searchsorted(L, hi, side="left") - 1
    ok = k >= 0
    return ok & (H[np.maximum(k, 0)] > lo)

