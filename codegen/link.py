"""Link consecutive kernels of the expanded stream: semaphores on shared memory instead of barriers.

Before (`expand_module`): every kernel ends with a BARRIER, so kernel k+1's first loads
(its weights, which no earlier kernel writes) wait for kernel k's last store:

    k1: DMA_LOAD w1 ... MATMUL ... DMA_STORE h   (semaphores 0..s1)
    BARRIER                                      every engine drains, semaphores reset
    k2: DMA_LOAD w2 ; DMA_LOAD h ... DMA_STORE y (semaphores 0..s2)
    BARRIER

After (`link_kernels`): consecutive kernels form one barrier-free group; semaphores
are pooled per signalling engine (`_pool_semaphores`: a kernel reuses the ids of the
kernels before it, its wait values raised by their signals), and every instruction of
a kernel waits, through ordinary semaphore waits, only for the instructions of earlier
kernels of the group that touch the same memory (HBM byte ranges, SRAM and accumulator
byte ranges): read after write, write after read, write after write. Independent work
(the weight load) starts as soon as its queue reaches it:

    k1: DMA_LOAD w1 ... MATMUL ... DMA_STORE h  signal L0      (L0: dma0's link semaphore)
    k2: DMA_LOAD w2 ; MATMUL wait L0 >= 1 ... DMA_STORE y
    BARRIER

Rules (each keeps the program correct, and the sanitisers check the result like any
kernel: the race detector sees the instructions of the whole group in one segment):

- A wait on instruction t of engine e is met through t's own signal: the semaphore t
  signals in its kernel, else e's link semaphore, which t then signals; the wait value
  is that semaphore's count of signals up to t (every semaphore is signalled from one
  engine, which completes in order, so the count is reached exactly when t is done: a
  load waits for the stores of its rows, not for the last store of the queue). A
  requirement an earlier instruction of the same queue already waits for is not
  repeated (queues run in order). A wait that finds no free slot replaces
  two waits on one engine by the later one, or moves to an earlier instruction of its
  queue (waiting earlier is always safe) in its kernel or, where none has room, in an
  earlier kernel but after the awaited instruction in program order (so the wait still
  points backwards: a kernel's first instruction on a queue that must wait for more
  engines than it has slots no longer costs a barrier).
- Waits point only backwards in program order, to earlier kernels, so linking adds no
  deadlock. On-chip footprints are compared by byte range over all partitions. HBM ones
  are run patterns (`hbm_runs`: a band of rows of an activation, a column block of a
  matrix, a transposed load are exact); the pairs whose bounding ranges meet are
  tested by `runs_meet` (two column blocks of one matrix, interleaved, do not wait for
  each other). An operand strided in both dimensions, and an indirect DMA's table,
  count as a superset (conservative: a false conflict costs overlap, never order).
  `plan-sram` places each kernel's buffers above the previous kernel's (a ring), so
  consecutive kernels' buffers are disjoint where they fit side by side.
- A group ends (a full BARRIER stays) where it would exceed `max_group` instructions
  (it bounds the sanitisers' and the scheduler's per-segment work) or before the first
  kernel that cannot be linked to the ones before it (more pooled semaphores than the
  target has, a semaphore signalled from several engines, no wait slot; the longest
  linkable runs are found by bisection): each reason is a remark.
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.footprints import Footprints, hbm_bounding, hbm_runs, on_chip_footprints, runs_meet
from tilecc.simulator.isa import Engine, Opcode, empty_stream

__all__ = ["DEFAULT_MAX_GROUP", "link_kernels"]

Spans = list[tuple[str, int, int]]


class _NoLink(Exception):
    """A group that cannot be linked (the reason is its message)."""

DEFAULT_MAX_GROUP = 1 << 16  # instructions per linked group


def link_kernels(
    stream: np.ndarray, spans: Spans, config: HardwareConfig, *, max_group: int = DEFAULT_MAX_GROUP,
) -> tuple[np.ndarray, Spans, list[str]]:
    """The stream of `expand_module` (each kernel followed by a BARRIER) with the
    barriers between the kernels of each group removed and cross-kernel semaphore
    waits added; its new spans; remarks (why a barrier stayed)."""
    if len(spans) < 2:
        return stream, spans, []
    groups: list[list[int]] = [[0]]
    remarks: list[str] = []
    size = spans[0][2]
    for k in range(1, len(spans)):
        count = spans[k][2]
        if size + count > max_group:
            remarks.append(
                f"link: barrier kept before kernel '{spans[k][0]}': the linked group would "
                f"exceed {max_group} instructions"
            )
            groups.append([k])
            size = count
        else:
            groups[-1].append(k)
            size += count
    out: list[np.ndarray] = []
    new_spans: Spans = []
    pos = 0
    for g in groups:
        part = np.concatenate([stream[spans[k][1] : spans[k][1] + spans[k][2]] for k in g])
        local = []
        at = 0
        for k in g:
            local.append((spans[k][0], at, spans[k][2]))
            at += spans[k][2]
        for seg, seg_spans in _link_prefixes(part, local, config, remarks):
            out += [seg, _barrier()]
            new_spans += [(name, pos + s, c) for name, s, c in seg_spans]
            pos += len(seg) + 1
    return np.concatenate(out), new_spans, remarks


def _link_prefixes(part: np.ndarray, local: Spans, config: HardwareConfig,
                   remarks: list[str]) -> list[tuple[np.ndarray, Spans]]:
    """The group linked, or, where it cannot be as a whole, cut into the longest
    linkable runs of consecutive kernels (found by bisection; linking a run needs
    no more than linking a longer run that contains it), a barrier between runs.

    The first run is looked for from the whole group down; each later one first tries
    the previous run's length and one kernel more (a model's repeated layers cut
    alike), then the whole rest, and bisects between the longest that linked and the
    first that did not: the same runs as bisecting from the whole rest each time,
    without linking the long rest of a group cut every few kernels again and again."""
    segments: list[tuple[np.ndarray, Spans]] = []
    i = 0
    prev = 0  # the previous run's length in kernels (0: none yet)
    while i < len(local):

        def attempt(j: int) -> tuple[np.ndarray, Spans] | str:
            run = local[i:j]
            base = run[0][1]
            end = run[-1][1] + run[-1][2]
            spans = [(name, a - base, c) for name, a, c in run]
            if len(run) == 1:
                return part[base:end], spans
            try:
                return _link_group(part[base:end], spans, config), spans
            except _NoLink as e:
                return str(e)

        # upward probes until one fails: [i, lo) links (a single kernel always does;
        # `best` is its linked stream once computed), [i, hi) does not
        n = len(local)
        probes = [min(n, i + prev), min(n, i + prev + 1), n] if prev else [n]
        lo, best, hi, why = i + 1, None, n + 1, ""
        for j in probes:
            if j <= lo:
                continue
            got = attempt(j)
            if isinstance(got, str):
                hi, why = j, got
                break
            lo, best = j, got
        if best is None:
            best = attempt(lo)
        assert not isinstance(best, str)  # a single kernel always "links"
        if hi > n:  # the whole rest links
            segments.append(best)
            break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            res = attempt(mid)
            if isinstance(res, str):
                hi, why = mid, res
            else:
                lo, best = mid, res
        segments.append(best)
        remarks.append(f"link: barrier kept before kernel '{local[lo][0]}': {why}")
        prev = lo - i
        i = lo
    return segments


def _barrier() -> np.ndarray:
    rec = empty_stream(1)
    rec["opcode"] = int(Opcode.BARRIER)
    rec["engine"] = int(Engine.ALL)
    return rec


def _link_group(s: np.ndarray, spans: Spans, config: HardwareConfig) -> np.ndarray:
    """One group's kernels (no barriers between them) with semaphores renumbered and
    the cross-kernel waits added."""
    s = s.copy()
    n = len(s)
    kernel_of = np.zeros(n, dtype=np.int64)
    for k, (_, start, count) in enumerate(spans):
        kernel_of[start : start + count] = k
    prog = DecodedProgram(s, config)
    eng = prog.eng
    n_eng = prog.n_engines  # DMA queues, matrix, vector, link queues
    link_sem = _pool_semaphores(s, eng, kernel_of, len(spans), n_eng, config)

    fp = on_chip_footprints(prog)
    fp = fp.take(np.flatnonzero(eng[fp.instr] >= 0))
    # one coordinate space for all memories: (mem, byte) -> cell, partitions ignored
    key_lo = fp.mem * (1 << 50) + fp.b0
    key_hi = fp.mem * (1 << 50) + np.maximum(fp.b1, fp.b0 + 1)
    edges = np.unique(np.r_[key_lo, key_hi])
    c0 = np.searchsorted(edges, key_lo)
    c1 = np.searchsorted(edges, key_hi)
    n_cells = max(len(edges) - 1, 1)
    # each instruction's 1-based position on its engine queue within the group
    ordinal = np.zeros(n, dtype=np.int64)
    queue_members = []
    for e in range(n_eng):
        idx = np.flatnonzero(eng == e)
        ordinal[idx] = np.arange(1, idx.size + 1)
        queue_members.append(idx)
    # ordinal of the last writer (reader) per cell and engine; one row more than cells,
    # always 0, so that a range's end is a valid index for `_query`'s reduceat
    last_w = np.zeros((n_cells + 1, n_eng), dtype=np.int64)
    last_r = np.zeros((n_cells + 1, n_eng), dtype=np.int64)
    fk = kernel_of[fp.instr]
    order = np.argsort(fk, kind="stable")
    bounds = np.searchsorted(fk[order], np.arange(len(spans) + 1))
    need = np.zeros((n, n_eng), dtype=np.int64)  # required ordinal per engine, cross-kernel
    for k in range(len(spans)):
        rows = order[bounds[k] : bounds[k + 1]]
        if k > 0:
            _query(rows, fp, c0, c1, eng, last_w, last_r, need)
        _update(rows, fp, c0, c1, eng, ordinal, last_w, last_r)
    hbm = hbm_bounding(prog)
    _hbm_need(prog, hbm.take(np.flatnonzero(eng[hbm.instr] >= 0)), kernel_of, eng, ordinal, need)
    _place_waits(s, eng, kernel_of, need, ordinal, queue_members, link_sem)
    return s


def _pool_semaphores(s, eng, kernel_of, n_kernels: int, n_eng: int, config: HardwareConfig) -> list[int]:
    """Renumber the group's semaphores in place so that kernels reuse them without a
    reset, and return one link semaphore per engine.

    Each kernel's semaphore signalled from engine e becomes one of e's pool ids (its
    rank among e's semaphores in the kernel); a wait's value grows by the signals that
    id received in earlier kernels of the group. An id is only ever signalled from one
    engine, which completes in order, so ``id >= base + v`` holds exactly when the
    kernel's own v-th signal has come (the earlier kernels' signals come first on that
    queue): no wait is met early, none waits on a later kernel, and the scheduler's
    dataflow rule stays exact."""
    sig = s["signal_sem"].astype(np.int64)
    has = np.flatnonzero(sig >= 0)
    key = kernel_of[has] * (1 << 20) + sig[has]
    uk, first_at, inv = np.unique(key, return_index=True, return_inverse=True)
    e_lo = np.full(len(uk), n_eng, dtype=np.int64)
    e_hi = np.full(len(uk), -1, dtype=np.int64)
    np.minimum.at(e_lo, inv, eng[has])
    np.maximum.at(e_hi, inv, eng[has])
    if (e_lo != e_hi).any():
        raise _NoLink("a semaphore is signalled from several engines")
    u_kernel, u_sem, u_eng = uk >> 20, uk & ((1 << 20) - 1), e_lo
    # rank of each (kernel, sem) among its kernel's semaphores of its engine
    order = np.lexsort((u_sem, u_eng, u_kernel))
    grp = u_kernel[order] * n_eng + u_eng[order]
    new_grp = np.r_[True, grp[1:] != grp[:-1]]
    pos = np.arange(len(order))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = pos - np.maximum.accumulate(np.where(new_grp, pos, 0))
    width = np.zeros(n_eng, dtype=np.int64)
    np.maximum.at(width, u_eng, rank + 1)
    base = np.r_[0, np.cumsum(width)]
    total = int(base[-1]) + n_eng
    if total > config.semaphores:
        raise _NoLink(f"its kernels need {total} pooled semaphores ({config.semaphores} exist)")
    phys = base[u_eng] + rank  # physical id per (kernel, sem)
    lookup = dict(zip(uk.tolist(), phys.tolist(), strict=True))
    # waits: id and value (+ the id's signals in earlier kernels of the group)
    new_sig = np.full(len(s), -1, dtype=np.int64)
    new_sig[has] = phys[inv]
    counts = np.zeros((n_kernels + 1, total), dtype=np.int64)
    np.add.at(counts, (kernel_of[has] + 1, new_sig[has]), 1)
    before = np.cumsum(counts, axis=0)  # before[k, id]: signals of id in kernels < k
    wi, wj = np.nonzero(s["wait_sem"] >= 0)
    if len(wi):
        wkey = kernel_of[wi] * (1 << 20) + s["wait_sem"][wi, wj].astype(np.int64)
        try:
            wphys = np.array([lookup[x] for x in wkey.tolist()], dtype=np.int64)
        except KeyError as e:
            raise _NoLink("a kernel waits on a semaphore it never signals") from e
        s["wait_val"][wi, wj] = s["wait_val"][wi, wj].astype(np.int64) + before[kernel_of[wi], wphys]
        s["wait_sem"][wi, wj] = wphys
    s["signal_sem"] = new_sig
    del first_at
    return [int(base[-1]) + e for e in range(n_eng)]


def _unique_rows(cols: list[np.ndarray], sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the integer columns `cols` (column i in [0, sizes[i])), and each
    row's number: one int64 key per row where the sizes' product fits (a sort of
    scalars; `np.unique(axis=0)` sorts structured rows, an order of magnitude slower),
    else the rows themselves. The rows' order is unspecified."""
    span = 1
    for n in sizes:
        span *= max(n, 1)
    if span >= 1 << 62:
        uniq, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return uniq, inv.reshape(-1)
    key = cols[0].astype(np.int64)
    for c, n in zip(cols[1:], sizes[1:], strict=True):
        key = key * max(n, 1) + c
    ukey, inv = np.unique(key, return_inverse=True)
    out = np.empty((len(ukey), len(cols)), dtype=np.int64)
    for i in range(len(cols) - 1, -1, -1):
        n = max(sizes[i], 1)
        out[:, i] = ukey % n
        ukey = ukey // n
    return out, inv.reshape(-1)


def _ranges(rows: np.ndarray, c0: np.ndarray, c1: np.ndarray, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct cell ranges of footprints `rows`, and each row's range number."""
    return _unique_rows([c0[rows], c1[rows]], [n_cells + 1, n_cells + 1])


def _query(rows, fp, c0, c1, eng, last_w, last_r, need) -> None:
    """need[i, e] = max over the cells footprint rows of i touch of the ordinals of
    earlier kernels' conflicting accesses on engine e (writes for a read; writes and
    reads for a write)."""
    if not len(rows):
        return
    uniq, inv = _ranges(rows, c0, c1, len(last_w) - 1)
    # the max over each range [a, b) at once: reduceat over the interleaved bounds
    # (a range's b is at most the cell count, a valid row: last_w has one row more)
    bounds = uniq.reshape(-1)
    empty = (uniq[:, 1] <= uniq[:, 0])[:, None]
    w_max = np.where(empty, 0, np.maximum.reduceat(last_w, bounds, axis=0)[0::2])
    r_max = np.where(empty, 0, np.maximum.reduceat(last_r, bounds, axis=0)[0::2])
    got = np.where(fp.write[rows][:, None], np.maximum(w_max[inv], r_max[inv]), w_max[inv])
    np.maximum.at(need, fp.instr[rows], got)


def _hbm_need(prog: DecodedProgram, fp: Footprints, kernel_of, eng, ordinal, need) -> None:
    """need[i, e] >= the ordinal of every access on engine e, in an earlier kernel, that
    shares an HBM byte with one of i's (RAW, WAR, WAW).

    Candidates are the pairs whose bounding ranges meet, one of them writing: a write's
    range holds the other's start, or the other's range holds the write's start (one
    sort, two searches). `runs_meet` then keeps those whose run patterns share a byte,
    so a band of rows of an activation waits for the stores of its rows, not for every
    store whose bounding range meets it."""
    if not len(fp) or not fp.write.any():
        return
    pitch, width, count = hbm_runs(prog, fp)
    b1 = np.maximum(fp.b1, fp.b0 + 1)
    by_start = np.argsort(fp.b0, kind="stable")
    starts = fp.b0[by_start]
    writes = np.flatnonzero(fp.write)
    w_by_start = writes[np.argsort(fp.b0[writes], kind="stable")]
    w_starts = fp.b0[w_by_start]
    # (1) each write against the accesses starting in [its start, its end)
    lo = np.searchsorted(starts, fp.b0[writes], side="left")
    hi = np.searchsorted(starts, b1[writes], side="left")
    x1, y1 = _expand(writes, lo, hi, by_start)
    # (2) each access against the writes starting in (its start, its end)
    lo = np.searchsorted(w_starts, fp.b0, side="right")
    hi = np.searchsorted(w_starts, b1, side="left")
    x2, y2 = _expand(np.arange(len(fp)), lo, hi, w_by_start)
    x, y = np.r_[x1, x2], np.r_[y1, y2]
    kx, ky = kernel_of[fp.instr[x]], kernel_of[fp.instr[y]]
    keep = kx != ky
    x, y, kx, ky = x[keep], y[keep], kx[keep], ky[keep]
    early = np.where(kx < ky, x, y)  # the access of the earlier kernel
    late = np.where(kx < ky, y, x)
    meet = runs_meet(fp.b0[early], pitch[early], width[early], count[early],
                     fp.b0[late], pitch[late], width[late], count[late])
    early, late = early[meet], late[meet]
    ie, il = fp.instr[early], fp.instr[late]
    np.maximum.at(need, (il, eng[ie]), ordinal[ie])


def _expand(who: np.ndarray, lo: np.ndarray, hi: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (who[r], order[t]) for every t in [lo[r], hi[r])."""
    cnt = np.maximum(hi - lo, 0)
    rep = np.repeat(np.arange(len(who)), cnt)
    first = np.cumsum(cnt) - cnt
    return who[rep], order[lo[rep] + np.arange(rep.size) - first[rep]]


def _update(rows, fp, c0, c1, eng, ordinal, last_w, last_r) -> None:
    """The state after a kernel: the last writer and reader of each cell per engine."""
    if not len(rows):
        return
    e = eng[fp.instr[rows]]
    o = ordinal[fp.instr[rows]]
    w = fp.write[rows].astype(np.int64)
    size = len(last_w)
    uniq, inv = _unique_rows([c0[rows], c1[rows], e, w], [size, size, last_w.shape[1], 2])
    best = np.zeros(len(uniq), dtype=np.int64)
    np.maximum.at(best, inv, o)
    for (a, b, ee, ww), v in zip(uniq.tolist(), best.tolist(), strict=True):
        target = last_w if ww else last_r
        np.maximum(target[a:b, ee], v, out=target[a:b, ee])


def _place_waits(s, eng, kernel_of, need, ordinal, queue_members, link_sem: list[int]) -> None:
    """Turn need[i, e] into semaphore waits (see the module docstring), in place."""
    n, n_eng = need.shape
    # (waiting queue, its position, the awaited instruction, which signals)
    requests: list[tuple[int, int, int]] = []
    for e_w in range(n_eng):
        q = queue_members[e_w]
        if not len(q):
            continue
        req = need[q].copy()
        req[:, e_w] = 0  # the own queue is in order already
        have = np.maximum.accumulate(req, axis=0)
        prev = np.r_[np.zeros((1, n_eng), dtype=np.int64), have[:-1]]
        for r, e_t in zip(*np.nonzero(req > prev), strict=True):
            x = int(queue_members[e_t][int(req[r, e_t]) - 1])
            if s["signal_sem"][x] < 0:
                s["signal_sem"][x] = link_sem[e_t]
            requests.append((int(e_w), int(r), x))
    # each signal's value: its semaphore's signals up to it, in program order
    sig = s["signal_sem"].astype(np.int64)
    has = np.flatnonzero(sig >= 0)
    order = np.argsort(sig[has], kind="stable")
    ks = sig[has][order]
    new = np.r_[True, ks[1:] != ks[:-1]] if len(ks) else np.zeros(0, bool)
    p = np.arange(len(ks))
    count_at = np.zeros(n, dtype=np.int64)
    count_at[has[order]] = p - np.maximum.accumulate(np.where(new, p, 0)) + 1
    producer = dict(zip(zip(sig[has].tolist(), count_at[has].tolist(), strict=True), has.tolist(),
                        strict=True))
    for e_w, r, x in requests:
        _add_wait(s, queue_members[e_w], r, int(sig[x]), int(count_at[x]), kernel_of, producer, eng, x)


def _add_wait(s: np.ndarray, q: np.ndarray, r: int, sem: int, val: int, kernel_of: np.ndarray,
              producer: dict[tuple[int, int], int], eng: np.ndarray, awaited: int) -> None:
    """Wait `sem >= val` (instruction `awaited` done) on instruction q[r], or on the
    nearest earlier instruction of its queue with room (waiting earlier is always safe)
    that is in its kernel or after `awaited` in program order: every wait then still
    points backwards in program order, so no cycle closes (an instruction of an earlier
    kernel before `awaited` could close one). Room: a free slot, or two waits met by signallers on
    one engine, of which the later one implies the other (engines complete in order)."""
    k = kernel_of[q[r]]
    while r >= 0 and (kernel_of[q[r]] == k or int(q[r]) > awaited):
        i = int(q[r])
        ws, wv = s["wait_sem"][i], s["wait_val"][i]
        same = np.flatnonzero(ws == sem)
        if same.size:
            wv[same[0]] = max(int(wv[same[0]]), val)
            return
        free = np.flatnonzero(ws < 0)
        if free.size:
            ws[free[0]], wv[free[0]] = sem, val
            return
        # one wait per signalling engine: the latest signaller
        latest: dict[int, tuple[int, int, int]] = {}
        for w, v in [*zip(ws.tolist(), wv.tolist(), strict=True), (sem, val)]:
            x = producer.get((w, v))
            if x is None:
                latest = {}
                break
            e = int(eng[x])
            if e not in latest or latest[e][0] < x:
                latest[e] = (x, w, v)
        if latest and len(latest) <= len(ws):
            kept = sorted(latest.values())
            ws[:] = -1
            wv[:] = 0
            for slot, (_, w, v) in enumerate(kept):
                ws[slot], wv[slot] = w, v
            return
        r -= 1
    raise _NoLink("no free wait slot for a cross-kernel wait")
