"""Timeline traces of simulated programs: Chrome trace-event JSON (opens in ui.perfetto.dev).

`chrome_trace(stream, config, start, end, kernels)` turns the per-instruction start and
end cycles that `machine.simulate` measures (`SimResult.start`, `.end`) into a trace-event
dict; `write_trace(path, ...)` writes the same trace as a file (gzip when the name ends in
``.gz``). The trace holds:

- one process (``pid``, default 1) for the core, named with ``process_name``;
- one thread track per queue, in this order: ``kernels`` (one slice per kernel, from the
  kernel spans or, without them, from the BARRIER records), ``dma0`` .. ``dma{Q-1}``,
  ``matrix``, ``vector``; named with ``thread_name`` events, tids 1, 2, ... in that order;
- one complete (``X``) slice per non-barrier instruction: name ``"<op> #<index>"``
  (``dma.load #7``, ``matmul #9``, ``vec.exp #12``), ``cat`` the engine (``dma``,
  ``matrix``, ``vector``), ``args`` {cycles, start_cycle, asm (the assembly line), the
  sizes (rows/cols/bytes for a DMA, M/K/N for a matmul, rows/cols for a vector op), waits
  (``"s1>=2 <- #7, s3>=1 <- #9"``: each wait and the instruction that satisfied it)};
- no partial overlap on any track (Perfetto drops such slices): each queue's slices take
  the first *lane* where they fit, lane 0 being the queue's own track and lane L an extra
  track ``"<queue> overlap L"`` right after it. In-order queues need one lane; an engine
  whose timing lets it issue before the previous result is ready (a pipelined matrix
  engine) gets one lane per instruction in flight;
- flow arrows (``s``, then ``f`` with ``bp: "e"``; name and cat ``sem``) for semaphore
  edges: a wait ``wait_sem[j] >= v`` (v >= 1) is satisfied by the v-th completion, by end
  time, of an instruction signalling that semaphore since the last BARRIER (semaphores
  reset there); the arrow runs from that instruction's slice to the waiting one's;
- counters (``C``): ``SRAM bytes`` and ``ACC bytes`` ({"used": B}): per kernel, the area
  of the union of the (partition x byte) rectangles of its on-chip operands, stepping at
  kernel boundaries; ``HBM bandwidth (GB/s)`` ({"load": x, "store": y}): each DMA moves
  its bytes at a constant rate over its whole duration; the sum, at every change.

Times: ``ts``/``dur`` are microseconds (floats) at ``config.clock_ghz`` (the core clock), rounded to whole
nanoseconds, Perfetto's resolution (it reads ``llround(ts * 1000)``): rounding is
monotone, so slices that touch in cycles touch in the trace and none overlap partially;
the exact cycles are in ``args``. ``displayTimeUnit`` is ``"ns"`` (current Perfetto only
notes it; very old builds read ``ts`` as nanoseconds then).

Size: a trace holds at most ``max_events`` events (default 2,000,000: ~270 MB of JSON).
A larger one keeps the earliest events (and flows only with both ends) and says so in
``otherData`` (``truncated``, ``events_total``, ``events_kept``, ``cutoff_us``) and in a
``process_labels`` event shown in the UI.

Perfetto compatibility: pid and tid 0 are never used (Perfetto makes them the kernel's
swapper), and no event holds a JSON array (Perfetto's tokenizer rejects those).
Speed: the JSON text is built directly from numpy columns; 100k instructions (~500k
events, ~70 MB) take 2-3 s, half of it the assembly text.
"""

from __future__ import annotations

import gzip
import heapq
import json
import json.encoder
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import (
    FUNC_ENUM,
    ITEMSIZE,
    OPCODE_ENGINE,
    RECORD,
    DType,
    Engine,
    Flag,
    Mem,
    Opcode,
)
from tilecc.simulator.listing import instruction_lines

__all__ = ["DEFAULT_MAX_EVENTS", "chrome_trace", "write_trace"]

DEFAULT_MAX_EVENTS = 2_000_000

_HBM_COUNTER = "HBM bandwidth (GB/s)"
_MEM_COUNTERS = {Mem.SRAM: "SRAM bytes", Mem.ACC: "ACC bytes"}
_UNION_GRID_LIMIT = 4_000_000  # cells of the exact union-area grid; above: bounding box

Spans = Sequence[tuple[str, int, int]]


# ----------------------------------------------------------------------------- names


def _op_name_table() -> dict[int, str]:
    """Short op name by ``opcode * 256 + func`` (the asm mnemonic without modifiers)."""
    names = {
        int(Opcode.DMA_LOAD) * 256: "dma.load",
        int(Opcode.DMA_STORE) * 256: "dma.store",
        int(Opcode.DMA_GATHER) * 256: "dma.gather",
        int(Opcode.DMA_SCATTER) * 256: "dma.scatter",
        int(Opcode.MATMUL) * 256: "matmul",
    }
    for op in Opcode:
        if op in FUNC_ENUM:
            prefix = "reduce_" if op == Opcode.VEC_REDUCE else ""
            for f in FUNC_ENUM[op]:
                names[int(op) * 256 + int(f)] = f"vec.{prefix}{f.name.lower()}"
        elif int(op) * 256 not in names:
            names[int(op) * 256] = op.name.lower().replace("_", ".", 1)
    return names


def _engine_lut() -> np.ndarray:
    """Engine of each opcode (255 = barrier, -1 = unknown opcode)."""
    lut = np.full(256, -1, dtype=np.int64)
    for op, engine in OPCODE_ENGINE.items():
        lut[int(op)] = int(engine)
    return lut


_ENGINE = _engine_lut()
_OP_NAMES = _op_name_table()


def _itemsize_lut() -> np.ndarray:
    lut = np.zeros(256, dtype=np.int64)
    for d in DType:
        lut[int(d)] = ITEMSIZE[d]
    return lut


_ITEMSIZE = _itemsize_lut()


def _asm_lines(sub: np.ndarray) -> list[str]:
    """The assembly line of each record of `sub` (`simulator.listing`, one pass for all)."""
    if sub.size == 0:
        return []
    try:
        return list(instruction_lines(sub))
    except Exception:  # a record with no assembly form (hand-made stream): one by one
        pass
    out = []
    for i in range(sub.size):
        try:
            out.append(next(instruction_lines(sub[i : i + 1])))
        except Exception:
            out.append(f"<opcode {int(sub['opcode'][i])}: no assembly form>")
    return out


def _num(x: float) -> int | float:
    """An integral float as an int (for args)."""
    return int(x) if float(x).is_integer() else x


# ----------------------------------------------------------------------------- lanes


def _assign_lanes(begin: np.ndarray, finish: np.ndarray) -> tuple[np.ndarray, int]:
    """First-fit lanes so that slices on one lane never overlap: slices in (begin,
    index) order each take the lowest lane whose last slice ended by their begin.
    Returns (lane per slice, number of lanes)."""
    n = begin.size
    lane = np.zeros(n, dtype=np.int64)
    if n <= 1:
        return lane, 1
    order = np.lexsort((np.arange(n), begin))
    b, f = begin[order], finish[order]
    if np.all(b[1:] >= np.maximum.accumulate(f)[:-1]):
        return lane, 1  # in-order queue: the common case
    free: list[int] = []  # lane ids free now (min-heap)
    busy: list[tuple[int, int]] = []  # (end, lane)
    lanes = 0
    out = [0] * n
    for k, (t0, t1) in enumerate(zip(b.tolist(), f.tolist(), strict=True)):
        while busy and busy[0][0] <= t0:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            ln = heapq.heappop(free)
        else:
            ln = lanes
            lanes += 1
        out[k] = ln
        heapq.heappush(busy, (t1, ln))
    lane[order] = out
    return lane, lanes


# ----------------------------------------------------------------------------- kernels


def kernel_membership(
    n: int, is_barrier: np.ndarray, kernels: Spans | None
) -> tuple[list[str], list[tuple[int, int]], np.ndarray]:
    """(names, (first, count) spans, kernel id of each record or -1)."""
    kid = np.full(n, -1, dtype=np.int64)
    if kernels is None:
        bars = np.flatnonzero(is_barrier)
        firsts = np.concatenate([[0], bars + 1])
        lasts = np.concatenate([bars, [n]])
        names, spans = [], []
        for k, (a, b) in enumerate(zip(firsts.tolist(), lasts.tolist(), strict=True)):
            if b > a:  # skip empty segments (e.g. after the final barrier)
                kid[a:b] = len(names)
                names.append(f"kernel {k}")
                spans.append((a, b - a))
        return names, spans, kid
    names, spans = [], []
    for k, item in enumerate(kernels):
        try:
            name, first, count = item
            first, count = int(first), int(count)
        except (TypeError, ValueError):
            raise ValueError(
                f"kernel span {k} must be (name, first record, count), got {item!r}"
            ) from None
        if first < 0 or count < 0 or first + count > n:
            raise ValueError(
                f"kernel span {k} ({name!r}, {first}, {count}) is outside the stream of {n} records"
            )
        kid[first : first + count] = k
        names.append(str(name))
        spans.append((first, count))
    return names, spans, kid


# ----------------------------------------------------------------------------- counters


def _union_area(r: np.ndarray) -> int:
    """Area of the union of rectangles [p0, p1) x [b0, b1) (rows of `r`)."""
    p0, p1, b0, b1 = r[:, 0], r[:, 1], r[:, 2], r[:, 3]
    if r.shape[0] == 1:
        return int((p1 - p0)[0] * (b1 - b0)[0])
    ps = np.unique(np.concatenate([p0, p1]))
    bs = np.unique(np.concatenate([b0, b1]))
    if ps.size * bs.size > _UNION_GRID_LIMIT:
        return int((p1.max() - p0.min()) * (b1.max() - b0.min()))
    grid = np.zeros((ps.size, bs.size), dtype=np.int64)
    i0, i1 = np.searchsorted(ps, p0), np.searchsorted(ps, p1)
    j0, j1 = np.searchsorted(bs, b0), np.searchsorted(bs, b1)
    np.add.at(grid, (i0, j0), 1)
    np.add.at(grid, (i1, j0), -1)
    np.add.at(grid, (i0, j1), -1)
    np.add.at(grid, (i1, j1), 1)
    covered = grid.cumsum(axis=0).cumsum(axis=1)[:-1, :-1] > 0
    cells = np.diff(ps)[:, None] * np.diff(bs)[None, :]
    return int(cells[covered].sum())


def _on_chip_footprints(
    stream: np.ndarray, kid: np.ndarray, n_kernels: int
) -> dict[int, np.ndarray]:
    """Bytes of SRAM and ACC each kernel touches: {mem: int64[n_kernels]}."""
    op = stream["opcode"].astype(np.int64)
    rows = stream["rows"].astype(np.int64)
    cols = stream["cols"].astype(np.int64)
    k = stream["k"].astype(np.int64)
    flags = stream["flags"].astype(np.int64)
    mm = _ENGINE[op] == Engine.MATRIX
    vec = _ENGINE[op] == Engine.VECTOR
    dma = _ENGINE[op] == Engine.DMA
    binary = op == Opcode.VEC_BINARY
    gather = (op == Opcode.DMA_GATHER) | (op == Opcode.DMA_SCATTER)  # b: an i32 index column
    b_imm = (flags & Flag.B_IMM) != 0
    b_col = (binary & ((flags & Flag.B_COLUMN) != 0) & ~b_imm) | gather
    # operand slots that may be on chip (slots in HBM are filtered out below by a_/o_mem)
    slots = (
        ("a", dma | mm | vec, np.where(mm, k, rows), np.where(mm, rows, cols)),
        ("b", mm | (binary & ~b_imm) | gather, np.where(mm, k, rows), np.where(b_col, 1, cols)),
        ("o", dma | mm | vec, rows, np.where(op == Opcode.VEC_REDUCE, 1, cols)),
    )
    parts = []
    for slot, mask, nrows, ncols in slots:
        mem = stream[f"{slot}_mem"].astype(np.int64)
        m = mask & (kid >= 0) & ((mem == Mem.SRAM) | (mem == Mem.ACC))
        if not m.any():
            continue
        p0 = stream[f"{slot}_part"][m].astype(np.int64)
        b0 = stream[f"{slot}_addr"][m].astype(np.int64)
        nbytes = ncols[m] * _ITEMSIZE[stream[f"{slot}_dtype"][m]]
        parts.append(np.stack([kid[m], mem[m], p0, p0 + nrows[m], b0, b0 + nbytes], axis=1))
    out: dict[int, np.ndarray] = {Mem.SRAM: np.zeros(n_kernels, np.int64), Mem.ACC: np.zeros(n_kernels, np.int64)}
    if not parts:
        return out
    rects = np.concatenate(parts)
    rects = rects[np.lexsort(rects.T[::-1])]  # sorted by (kernel, mem, p0, p1, b0, b1)
    rects = rects[np.append(True, (rects[1:] != rects[:-1]).any(axis=1))]  # distinct
    group = rects[:, 0] * 4 + rects[:, 1]
    cuts = np.flatnonzero(np.diff(group)) + 1
    for chunk in np.split(rects, cuts):
        out[Mem(int(chunk[0, 1]))][int(chunk[0, 0])] = _union_area(chunk[:, 2:])
    return out


def _step_counter(
    times: np.ndarray, deltas: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Sum piecewise-constant step changes: (unique times, value of each series after
    the changes at each time). `deltas` are parallel to `times`."""
    if times.size == 0:
        return times, [d[:0] for d in deltas]
    order = np.argsort(times, kind="stable")
    t = times[order]
    last = np.flatnonzero(np.append(t[1:] != t[:-1], True))
    values = []
    for d in deltas:
        v = np.cumsum(d[order])[last]
        v[np.abs(v) < 1e-9 * max(1.0, float(np.abs(d).max(initial=0.0)))] = 0.0
        values.append(np.maximum(v, 0.0))
    return t[last], values


# ----------------------------------------------------------------------------- the trace

_q = json.encoder.encode_basestring_ascii  # a JSON string literal (C-accelerated)


def _check_inputs(
    stream: np.ndarray, start: np.ndarray, end: np.ndarray, max_events: int | None
) -> tuple[np.ndarray, np.ndarray, int]:
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD or stream.ndim != 1:
        raise ValueError("the instruction stream must be a 1-D numpy array of isa.RECORD")
    n = stream.size
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    if start.shape != (n,) or end.shape != (n,):
        raise ValueError(
            f"start and end must hold one cycle per record ({n}), got shapes "
            f"{start.shape} and {end.shape}"
        )
    if n and not (np.isfinite(start).all() and np.isfinite(end).all()):
        raise ValueError("start and end cycles must be finite")
    bad = np.flatnonzero((start < 0) | (end < start))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"instruction {i}: start {start[i]} / end {end[i]} cycles (need 0 <= start <= end)"
        )
    max_events = DEFAULT_MAX_EVENTS if max_events is None else int(max_events)
    if max_events < 1:
        raise ValueError(f"max_events must be positive, got {max_events}")
    return start, end, max_events


def _trace_text(
    stream: np.ndarray,
    config: HardwareConfig,
    start: np.ndarray,
    end: np.ndarray,
    kernels: Spans | None,
    max_events: int | None,
    pid: int,
) -> str:
    """The trace as JSON text: built directly as text (much faster than json.dumps of
    dicts); `chrome_trace` parses it back, so both entry points give the same trace."""
    start, end, max_events = _check_inputs(stream, start, end, max_events)
    n = stream.size
    pid = int(pid)
    if pid <= 0:
        raise ValueError(f"pid must be positive (Perfetto treats pid 0 as the swapper), got {pid}")
    ghz = float(config.clock_ghz)
    queues = int(config.dma.queues)

    op = stream["opcode"].astype(np.int64)
    engine = _ENGINE[op]
    is_barrier = engine == Engine.ALL
    is_dma = engine == Engine.DMA
    is_mm = engine == Engine.MATRIX
    is_vec = engine == Engine.VECTOR
    unknown = np.flatnonzero(engine < 0)
    if unknown.size:
        raise ValueError(f"instruction {int(unknown[0])}: unknown opcode {int(op[unknown[0]])}")
    queue = stream["queue"].astype(np.int64)
    bad_q = np.flatnonzero(is_dma & (queue >= queues))
    if bad_q.size:
        i = int(bad_q[0])
        raise ValueError(f"instruction {i}: DMA queue {int(queue[i])}, the target has {queues}")
    eng = np.full(n, -1, dtype=np.int64)
    eng[is_dma] = queue[is_dma]
    eng[is_mm] = queues
    eng[is_vec] = queues + 1
    engine_names = [f"dma{q}" for q in range(queues)] + ["matrix", "vector"]

    # integer nanoseconds: rounding is monotone, so "a ends before b starts" survives it
    s_ns = np.rint(start / ghz).astype(np.int64)
    e_ns = np.rint(end / ghz).astype(np.int64)

    # ---- kernels: the window of each kernel's instructions
    knames, kspans, kid = kernel_membership(n, is_barrier, kernels)
    nk = len(knames)
    work = np.flatnonzero(~is_barrier)
    kw = work[kid[work] >= 0]
    k_has = np.zeros(nk, dtype=bool)
    k_has[kid[kw]] = True
    k_c0 = np.full(nk, np.inf)
    k_c1 = np.zeros(nk)
    np.minimum.at(k_c0, kid[kw], start[kw])
    np.maximum.at(k_c1, kid[kw], end[kw])
    k_c0[~k_has] = 0.0
    k_t0 = np.rint(k_c0 / ghz).astype(np.int64)
    k_t1 = np.rint(k_c1 / ghz).astype(np.int64)
    kidx = np.flatnonzero(k_has)  # kernels holding an instruction get a slice

    # ---- tracks (tids from 1): kernels, then each engine, each followed by its lanes
    k_lane, k_nl = _assign_lanes(k_t0[kidx], k_t1[kidx])
    track_names = ["kernels"] + [f"kernels overlap {j}" for j in range(1, k_nl)]
    tid = np.zeros(n, dtype=np.int64)
    for e, ename in enumerate(engine_names):
        idx = np.flatnonzero(eng == e)
        lanes, nl = _assign_lanes(s_ns[idx], e_ns[idx])
        tid[idx] = 1 + len(track_names) + lanes
        track_names += [ename] + [f"{ename} overlap {j}" for j in range(1, nl)]

    # ---- semaphore edges: wait (s >= v) <- the v-th completion (by end, then index) of
    # an instruction signalling s in the same barrier-separated segment
    seg = np.cumsum(is_barrier) - is_barrier
    sig = stream["signal_sem"].astype(np.int64)
    wsem = stream["wait_sem"].astype(np.int64)
    wval = stream["wait_val"].astype(np.int64)
    n_sem = int(max(config.semaphores, sig.max(initial=-1) + 1, wsem.max(initial=-1) + 1))
    sig_idx = np.flatnonzero((sig >= 0) & ~is_barrier)
    sig_key = seg[sig_idx] * n_sem + sig[sig_idx]
    by_completion = np.lexsort((sig_idx, end[sig_idx], sig_key))
    sig_key, sig_idx = sig_key[by_completion], sig_idx[by_completion]
    w_i, w_j = np.nonzero((wsem >= 0) & (wval >= 1) & ~is_barrier[:, None])
    w_sem, w_val = wsem[w_i, w_j], wval[w_i, w_j]
    w_key = seg[w_i] * n_sem + w_sem
    lo = np.searchsorted(sig_key, w_key, side="left")
    found = w_val <= np.searchsorted(sig_key, w_key, side="right") - lo
    w_src = np.full(w_i.size, -1, dtype=np.int64)
    w_src[found] = sig_idx[lo[found] + w_val[found] - 1]
    # one flow per (source, waiter) pair
    m = max(n, 1)
    pair = np.unique(w_src[found] * m + w_i[found])
    f_src, f_dst = pair // m, pair % m
    # flow ends just inside the slices they bind to (Perfetto binds to the enclosing one)
    f_ts = s_ns[f_dst] + (e_ns[f_dst] - s_ns[f_dst] >= 2)
    s_ts = np.where(e_ns[f_src] > s_ns[f_src], e_ns[f_src] - 1, s_ns[f_src])
    s_ts = np.minimum(s_ts, f_ts)

    # ---- counters: on-chip bytes per kernel, stepping at kernel boundaries
    foot = _on_chip_footprints(stream, kid, nk)
    mem_t: list[int] = []
    mem_v: list[tuple[int, int]] = []
    korder = kidx[np.argsort(k_t0[kidx], kind="stable")].tolist()
    for pos, k in enumerate(korder):
        t0, t1 = int(k_t0[k]), int(k_t1[k])
        value = (int(foot[Mem.SRAM][k]), int(foot[Mem.ACC][k]))
        if mem_t and mem_t[-1] == t0:  # replaces the previous kernel's closing zero
            mem_v[-1] = value
        else:
            mem_t.append(t0)
            mem_v.append(value)
        if pos + 1 == len(korder) or int(k_t0[korder[pos + 1]]) > t1:
            mem_t.append(t1)
            mem_v.append((0, 0))
    mem_ts = np.repeat(np.array(mem_t, dtype=np.int64), 2)  # SRAM, then ACC, per time

    # ---- counters: HBM bandwidth, each DMA at a constant rate over its duration
    nbytes = (
        stream["rows"].astype(np.int64) * stream["cols"].astype(np.int64)
        * _ITEMSIZE[stream["a_dtype"]]
    )
    dma = np.flatnonzero(is_dma & (end > start))
    rate = nbytes[dma] / ((end[dma] - start[dma]) / ghz)  # bytes per ns = GB/s
    load = (op[dma] != Opcode.DMA_STORE) & (op[dma] != Opcode.DMA_SCATTER)  # loads, gathers
    zero = np.zeros_like(rate)
    bw_t, (bw_load, bw_store) = _step_counter(
        np.concatenate([s_ns[dma], e_ns[dma]]),
        [
            np.concatenate([np.where(load, rate, zero), np.where(load, -rate, zero)]),
            np.concatenate([np.where(load, zero, rate), np.where(load, zero, -rate)]),
        ],
    )

    # ---- event text, per category; each builder formats the events `sel` picks
    P = f'"pid":{pid}'
    code = op * 256 + stream["func"].astype(np.int64)

    def kernel_events(sel: np.ndarray) -> list[str]:
        ks = kidx[sel]
        return [
            f'{{"ph":"X",{P},"tid":{1 + ln},"name":{_q(knames[k])},"cat":"kernel",'
            f'"ts":{t0 / 1000},"dur":{(t1 - t0) / 1000},"args":{{"kernel":{k},'
            f'"first":{kspans[k][0]},"count":{kspans[k][1]},"cycles":{_num(c1 - c0)},'
            f'"start_cycle":{_num(c0)},"end_cycle":{_num(c1)}}}}}'
            for k, ln, t0, t1, c0, c1 in zip(
                ks.tolist(), k_lane[sel].tolist(), k_t0[ks].tolist(), k_t1[ks].tolist(),
                k_c0[ks].tolist(), k_c1[ks].tolist(), strict=True,
            )
        ]

    def instruction_events(sel: np.ndarray) -> list[str]:
        idx = work[sel]
        sub = stream[idx]
        asm = [_q(t) for t in _asm_lines(sub)]
        waits: dict[int, str] = {}
        if w_i.size:  # w_i is sorted: each waiter's waits form one run
            want = np.isin(w_i, idx)
            for i, w, v, src in zip(w_i[want].tolist(), w_sem[want].tolist(),
                                    w_val[want].tolist(), w_src[want].tolist(), strict=True):
                text = f"s{w}>={v} <- #{src}" if src >= 0 else f"s{w}>={v} (no signal found)"
                prev = waits.get(i)
                waits[i] = text if prev is None else f"{prev}, {text}"
        c0, c1 = start[idx], end[idx]
        integral = bool((c0 == np.floor(c0)).all() and (c1 == np.floor(c1)).all())
        cycles = (c1 - c0).astype(np.int64) if integral else c1 - c0
        c0 = c0.astype(np.int64) if integral else c0
        cls = np.where(is_dma[idx], 0, np.where(is_mm[idx], 1, 2)).tolist()
        out = []
        append = out.append
        for i, t, a, b, x0, dx, cd, c, txt, r, cc, kk, nb in zip(
            idx.tolist(), tid[idx].tolist(), s_ns[idx].tolist(), e_ns[idx].tolist(),
            c0.tolist(), cycles.tolist(), code[idx].tolist(), cls, asm,
            sub["rows"].tolist(), sub["cols"].tolist(), sub["k"].tolist(), nbytes[idx].tolist(),
            strict=True,
        ):
            if c == 0:
                sizes = f'"rows":{r},"cols":{cc},"bytes":{nb}'
                cat = "dma"
            elif c == 1:
                sizes = f'"M":{r},"K":{kk},"N":{cc}'
                cat = "matrix"
            else:
                sizes = f'"rows":{r},"cols":{cc}'
                cat = "vector"
            wl = waits.get(i)
            if wl is not None:
                sizes += f',"waits":"{wl}"'
            append(
                f'{{"ph":"X",{P},"tid":{t},"name":"{_OP_NAMES.get(cd, "?")} #{i}","cat":"{cat}",'
                f'"ts":{a / 1000},"dur":{(b - a) / 1000},"args":{{"cycles":{dx},'
                f'"start_cycle":{x0},"asm":{txt},{sizes}}}}}'
            )
        return out

    def memory_events(sel: np.ndarray) -> list[str]:
        names = (_MEM_COUNTERS[Mem.SRAM], _MEM_COUNTERS[Mem.ACC])
        return [
            f'{{"ph":"C",{P},"tid":1,"name":"{names[p & 1]}","ts":{mem_t[p >> 1] / 1000},'
            f'"args":{{"used":{mem_v[p >> 1][p & 1]}}}}}'
            for p in sel.tolist()
        ]

    def bandwidth_events(sel: np.ndarray) -> list[str]:
        return [
            f'{{"ph":"C",{P},"tid":1,"name":"{_HBM_COUNTER}","ts":{t / 1000},'
            f'"args":{{"load":{a},"store":{b}}}}}'
            for t, a, b in zip(bw_t[sel].tolist(), np.round(bw_load[sel], 6).tolist(),
                               np.round(bw_store[sel], 6).tolist(), strict=True)
        ]

    def flow_starts(sel: np.ndarray) -> list[str]:
        return [
            f'{{"ph":"s",{P},"tid":{t},"name":"sem","cat":"sem","id":{f + 1},"ts":{ts / 1000}}}'
            for f, t, ts in zip(sel.tolist(), tid[f_src[sel]].tolist(), s_ts[sel].tolist(),
                                strict=True)
        ]

    def flow_ends(sel: np.ndarray) -> list[str]:
        return [
            f'{{"ph":"f",{P},"tid":{t},"name":"sem","cat":"sem","id":{f + 1},"ts":{ts / 1000},'
            '"bp":"e"}'
            for f, t, ts in zip(sel.tolist(), tid[f_dst[sel]].tolist(), f_ts[sel].tolist(),
                                strict=True)
        ]

    # output order: by time, then this category order (slices before the flows that bind
    # to them, flow starts before their ends: a kept flow end implies a kept start)
    categories: list[tuple[np.ndarray, Callable[[np.ndarray], list[str]]]] = [
        (k_t0[kidx], kernel_events),
        (s_ns[work], instruction_events),
        (mem_ts, memory_events),
        (bw_t, bandwidth_events),
        (s_ts, flow_starts),
        (f_ts, flow_ends),
    ]
    offsets = np.cumsum([0] + [ts.size for ts, _ in categories])
    total = int(offsets[-1])
    all_ts = np.concatenate([ts.astype(np.int64) for ts, _ in categories])
    order = np.lexsort((np.arange(total), all_ts))

    meta = [
        {"ph": "M", "pid": pid, "tid": 1, "ts": 0.0, "name": "process_name",
         "args": {"name": f"tilecc core 0 ({config.name})"}},
        {"ph": "M", "pid": pid, "tid": 1, "ts": 0.0, "name": "process_sort_index",
         "args": {"sort_index": 0}},
    ]
    for j, tname in enumerate(track_names):
        for key, value in (("thread_name", {"name": tname}), ("thread_sort_index",
                                                               {"sort_index": j + 1})):
            meta.append({"ph": "M", "pid": pid, "tid": j + 1, "ts": 0.0, "name": key,
                         "args": value})
    if max_events < len(meta) + 1:
        raise ValueError(
            f"max_events={max_events} is below the {len(meta) + 1} metadata events this "
            "trace always holds"
        )
    budget = max_events - len(meta) - 1  # one event left for the truncation label
    truncated = total + len(meta) > max_events
    if truncated:
        keep = np.zeros(total, dtype=bool)
        keep[order[:budget]] = True
        fs, fe, nf = int(offsets[4]), int(offsets[5]), f_src.size
        both = keep[fs : fs + nf] & keep[fe : fe + nf]  # flows keep both ends or neither
        keep[fs : fs + nf] = both
        keep[fe : fe + nf] = both
        order = order[keep[order]]
    rank = np.full(total, -1, dtype=np.int64)  # output position, -1 when dropped
    rank[order] = np.arange(order.size)
    events: list[str] = [""] * order.size
    for c, (_, build) in enumerate(categories):
        sel = np.flatnonzero(rank[offsets[c] : offsets[c + 1]] >= 0)
        if sel.size:
            for pos, text in zip(rank[offsets[c] + sel].tolist(), build(sel), strict=True):
                events[pos] = text

    kept = len(meta) + order.size + (1 if truncated else 0)
    other: dict[str, Any] = {
        "generator": "tilecc.simulator.trace",
        "target": config.name,
        "clock_ghz": ghz,
        "instructions": int(work.size),
        "kernels": nk,
        "cycles": float(end.max()) if n else 0.0,
        "truncated": bool(truncated),
        "events_total": total + len(meta),
        "events_kept": kept,
        "max_events": max_events,
    }
    if truncated:
        cutoff = int(all_ts[order[-1]]) / 1000 if order.size else 0.0
        other["cutoff_us"] = cutoff
        meta.append({
            "ph": "M", "pid": pid, "tid": 1, "ts": 0.0, "name": "process_labels",
            "args": {"labels": f"TRUNCATED at {cutoff:.3f} us: {kept} of "
                               f"{other['events_total']} events (max_events={max_events})"},
        })
    head = ",\n".join(json.dumps(e, separators=(",", ":")) for e in meta)
    body = ",\n".join(events)
    return (
        '{"traceEvents":[\n' + head + (",\n" + body if body else "") + '\n],'
        '"displayTimeUnit":"ns","otherData":' + json.dumps(other, separators=(",", ":")) + "}"
    )


def chrome_trace(
    stream: np.ndarray,
    config: HardwareConfig,
    start: np.ndarray,
    end: np.ndarray,
    kernels: Spans | None = None,
    *,
    max_events: int | None = None,
    pid: int = 1,
) -> dict[str, Any]:
    """The Chrome trace-event dict (``{"traceEvents": [...], "displayTimeUnit": "ns",
    "otherData": {...}}``) of `stream` run on `config`, from the simulated `start` and
    `end` cycle of each record (`SimResult.start`, `SimResult.end`). `kernels` are the
    program's (name, first record, record count) spans (`Program.kernels`); without
    them, kernels are the BARRIER-separated segments. Events are in time order,
    metadata first. See the module docstring for what the trace holds.

    Raises ValueError for a stream that is not `isa.RECORD`s, start/end arrays of the
    wrong shape or with end < start, unknown opcodes or DMA queues, bad kernel spans."""
    return json.loads(_trace_text(stream, config, start, end, kernels, max_events, pid))


def write_trace(
    path: str | os.PathLike[str],
    stream: np.ndarray,
    config: HardwareConfig,
    start: np.ndarray,
    end: np.ndarray,
    kernels: Spans | None = None,
    *,
    max_events: int | None = None,
    pid: int = 1,
) -> Path:
    """Write the `chrome_trace` of the arguments to `path` as JSON (gzip-compressed when
    the name ends in ``.gz``; ui.perfetto.dev and chrome://tracing open both) and return
    the path. The file is written whole and then renamed into place."""
    text = _trace_text(stream, config, start, end, kernels, max_events, pid)
    data = text.encode("ascii")
    p = Path(path)
    if p.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(p)
    return p
