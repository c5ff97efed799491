"""Happens-before of an instruction stream (static, independent of timing), as vector clocks.

Each engine queue (each DMA queue, ``matrix``, ``vector``) runs in program order. A wait
``wait_sem[j] >= v`` adds edges from signallers that must have completed before the
wait can be met: when every signaller of that semaphore in the kernel is on one queue,
the completions come in that queue's order, so the edge is from the v-th signaller.
When signallers are on several queues, only what holds for any timing is used: with
``T`` signals from the other queues, a queue with ``n`` signallers must have delivered
at least ``v - T`` of them, so (if ``v > T``) the edge is from its ``(v - T)``-th
signaller. A BARRIER orders everything before it before everything after it
(semaphores reset there).

The relation is computed with vector clocks (one component per queue, holding the
1-based position within the queue of the latest instruction that happens before) in
one pass over the stream in a topological order: program order, except that an
instruction whose wait is not met yet (it waits for a later signal) is parked with
everything behind it on its queue until a signal releases it, as the timing scheduler
does. A kernel whose parked instructions are never released deadlocks: `analyze`
reports it as a `DeadlockError` naming each blocked engine, its head instruction and
the semaphores it waits on (awaited and reachable values).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilecc.errors import DeadlockError, SimulatorError
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.gc_pause import gc_paused
from tilecc.simulator.isa import MAX_WAITS
from tilecc.simulator.listing import describe

__all__ = ["Problem", "SyncAnalysis", "analyze"]

# (instruction index that orders problems, exception) of each problem found
Problem = tuple[int, SimulatorError]

@dataclass
class SyncAnalysis:
    """The happens-before relation of a stream, as vector clocks.

    Queue e is ``queues[e]`` (dma0.., matrix, vector). ``ordinal[i]`` is instruction
    i's 1-based position in its queue over the whole stream (0 for barriers);
    ``clock[i, q]`` is the ordinal of the latest instruction of queue q that happens
    before i (or i itself on its own queue). ``rank`` is a topological order (-1: never
    runs, behind a deadlock). ``redundant[i, j]``: wait slot j of i is implied by
    program order and i's other waits (removing it changes no ordering).
    """

    queues: list[str]
    queue: np.ndarray
    ordinal: np.ndarray
    kernel: np.ndarray
    rank: np.ndarray
    clock: np.ndarray
    members: list[np.ndarray]
    deadlock: Problem | None
    redundant: np.ndarray | None

    def happens_before(self, a: int, b: int) -> bool:
        """Whether instruction a happens before instruction b (a != b, both run)."""
        if self.kernel[a] != self.kernel[b]:
            return bool(self.kernel[a] < self.kernel[b])
        qa = self.queue[a]
        if qa < 0 or self.queue[b] < 0:  # a barrier: ordered with everything
            return a < b
        return bool(self.clock[b, qa] >= self.ordinal[a]) and a != b



def analyze(prog: DecodedProgram, want_redundant: bool) -> SyncAnalysis:
    """Vector clocks, topological order, deadlock and (optionally) redundant waits."""
    with gc_paused():  # the walk allocates a clock per instruction
        return _analyze_walk(prog, want_redundant)




def _analyze_walk(prog: DecodedProgram, want_redundant: bool) -> SyncAnalysis:
    n, nq = prog.n, prog.n_engines
    s = prog.col
    stream_records = prog.records()
    eng_np = prog.eng
    ordinal_np = np.zeros(n, dtype=np.int64)
    members = []
    for q in range(nq):
        idx = np.flatnonzero(eng_np == q)
        ordinal_np[idx] = np.arange(1, idx.size + 1)
        members.append(idx)
    is_bar = prog.is_barrier
    kernel_np = np.cumsum(is_bar) - is_bar  # a barrier belongs to the kernel it ends
    barriers = np.flatnonzero(is_bar).tolist()
    bounds = list(zip([0] + [b + 1 for b in barriers], barriers + [n], strict=True))

    # waits in CSR form: instruction i's are [ptr[i], ptr[i + 1]), each with its source
    wi, wj = np.nonzero(s["wait_sem"] >= 0)
    w_sem = s["wait_sem"][wi, wj].astype(np.int64)
    w_val = s["wait_val"][wi, wj].astype(np.int64)
    w_src = _wait_sources(prog, kernel_np, wi, w_sem, w_val)
    ptr = np.searchsorted(wi, np.arange(n + 1)).tolist()
    w_sem_l, w_val_l, w_src_l = w_sem.tolist(), w_val.tolist(), w_src.tolist()

    eng = eng_np.tolist()
    ordv = ordinal_np.tolist()
    sig = s["signal_sem"].tolist()
    signallers = np.flatnonzero(s["signal_sem"] >= 0)

    zero = [0] * nq
    clocks: list[list[int]] = [zero] * n
    rank = [-1] * n
    red_hits: list[int] = []  # flat wait numbers found redundant
    counter = 0
    deadlock: Problem | None = None
    sem_count = [0] * prog.config.semaphores
    done_before = [0] * nq  # ordinals of each queue before the current kernel

    for kernel_index, (lo, hi) in enumerate(bounds):
        # signallers of each semaphore in this kernel, per queue (for shared semaphores)
        by_sem: dict[int, dict[int, list[int]]] | None = None
        a, b = np.searchsorted(signallers, [lo, hi])
        kernel_signallers = signallers[a:b]

        def sources(w: int, v: int) -> list[int]:
            """Signallers that must have completed once semaphore w (signalled from
            several queues) reaches v: with T signals from the other queues, a queue's
            (v - T)-th."""
            nonlocal by_sem
            if by_sem is None:
                by_sem = {}
                for x in kernel_signallers.tolist():  # noqa: B023 (called only in this kernel's iteration)
                    by_sem.setdefault(sig[x], {}).setdefault(eng[x], []).append(x)
            per_q = by_sem[w]
            total = sum(len(lst) for lst in per_q.values())
            return [lst[v - total + len(lst) - 1] for lst in per_q.values()
                    if v - total + len(lst) > 0]

        def wait_sources(k: int) -> list[int]:
            src = w_src_l[k]
            if src >= 0:
                return [src]
            if src == _SHARED:
                return sources(w_sem_l[k], w_val_l[k])
            return []

        cur = [list(done_before) for _ in range(nq)]
        pending: list[collections.deque[int]] = [collections.deque() for _ in range(nq)]
        parked: dict[int, list[int]] = {}
        need = [0] * nq
        ready: list[int] = []

        def unmet(i: int) -> tuple[int, int] | None:
            for k in range(ptr[i], ptr[i + 1]):
                if sem_count[w_sem_l[k]] < w_val_l[k]:
                    return w_sem_l[k], w_val_l[k]
            return None

        def execute(i: int) -> None:
            nonlocal counter
            e = eng[i]
            vc = cur[e]  # noqa: B023 (called only in this kernel's iteration)
            k0, k1 = ptr[i], ptr[i + 1]
            if k0 < k1:
                for k in range(k0, k1):
                    src = w_src_l[k]
                    if src >= 0:
                        if vc[eng[src]] < ordv[src]:
                            vc = list(map(max, vc, clocks[src]))
                    elif src == _SHARED:
                        for x in sources(w_sem_l[k], w_val_l[k]):
                            if vc[eng[x]] < ordv[x]:
                                vc = list(map(max, vc, clocks[x]))
                if want_redundant:
                    _mark_redundant(k0, k1, cur[e], wait_sources, eng, ordv, clocks, red_hits)  # noqa: B023 (called only in this kernel's iteration)
            if vc is cur[e]:  # noqa: B023 (called only in this kernel's iteration)
                vc = vc.copy()
            vc[e] = ordv[i]
            clocks[i] = vc
            cur[e] = vc  # noqa: B023 (called only in this kernel's iteration)
            rank[i] = counter
            counter += 1
            w = sig[i]
            if w >= 0:
                value = sem_count[w] + 1
                sem_count[w] = value
                lst = parked.get(w)  # noqa: B023 (called only in this kernel's iteration)
                if lst:
                    released = [x for x in lst if need[x] <= value]  # noqa: B023 (called only in this kernel's iteration)
                    if released:
                        parked[w] = [x for x in lst if need[x] > value]  # noqa: B023 (called only in this kernel's iteration)
                        ready.extend(released)  # noqa: B023 (called only in this kernel's iteration)

        def park(e: int, blocked: tuple[int, int]) -> None:
            w, v = blocked
            need[e] = v  # noqa: B023 (called only in this kernel's iteration)
            parked.setdefault(w, []).append(e)  # noqa: B023 (called only in this kernel's iteration)

        def drain() -> None:
            while ready:  # noqa: B023 (called only in this kernel's iteration)
                e = ready.pop()  # noqa: B023 (called only in this kernel's iteration)
                queue = pending[e]  # noqa: B023 (called only in this kernel's iteration)
                while queue:
                    blocked = unmet(queue[0])
                    if blocked is not None:
                        park(e, blocked)
                        break
                    execute(queue.popleft())

        for i in range(lo, hi):
            e = eng[i]
            if pending[e]:
                pending[e].append(i)
                continue
            if ptr[i] < ptr[i + 1]:
                blocked = unmet(i)
                if blocked is not None:
                    pending[e].append(i)
                    park(e, blocked)
                    continue
            execute(i)
            if ready:
                drain()

        stuck = [e for e in range(nq) if pending[e]]
        if stuck:
            deadlock = _deadlock_problem(
                prog, stream_records, kernel_index, stuck, pending, ptr, w_sem_l, w_val_l,
                sem_count,
            )
            break
        for x in kernel_signallers.tolist():
            sem_count[sig[x]] = 0
        for q in range(nq):
            done_before[q] = int(np.searchsorted(members[q], hi))
        if hi < n:  # the barrier
            rank[hi] = counter
            counter += 1
            clocks[hi] = list(done_before)

    redundant = None
    if want_redundant:
        redundant = np.zeros((n, MAX_WAITS), dtype=bool)
        hits = np.array(red_hits, dtype=np.int64)
        redundant[wi[hits], wj[hits]] = True
    return SyncAnalysis(
        queues=list(prog.engine_names),
        queue=eng_np,
        ordinal=ordinal_np,
        kernel=kernel_np,
        rank=np.array(rank, dtype=np.int64),
        clock=np.array(clocks, dtype=np.int64).reshape(n, nq),
        members=members,
        deadlock=deadlock,
        redundant=redundant,
    )


_NO_EDGE, _NEVER, _SHARED = -1, -2, -3  # wait sources that are not an instruction


def _wait_sources(
    prog: DecodedProgram, kernel: np.ndarray, wi: np.ndarray, w_sem: np.ndarray, w_val: np.ndarray
) -> np.ndarray:
    """For each wait: the signaller it orders after (the v-th signaller of its semaphore
    in the kernel when all signallers are on one queue), or _NO_EDGE (v = 0), _NEVER
    (fewer than v signals: it can never be met), _SHARED (signallers on several queues:
    resolved during the walk)."""
    s = prog.col
    sig_idx = np.flatnonzero(s["signal_sem"] >= 0)
    n_sem = prog.config.semaphores
    g = kernel[sig_idx] * n_sem + s["signal_sem"][sig_idx].astype(np.int64)
    order = np.lexsort((sig_idx, g))
    g, sig_idx = g[order], sig_idx[order]
    key = kernel[wi] * n_sem + w_sem
    first = np.searchsorted(g, key, side="left")
    count = np.searchsorted(g, key, side="right") - first
    out = np.full(wi.size, _NO_EDGE, dtype=np.int64)
    if sig_idx.size:
        q = prog.eng[sig_idx]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        one_queue = np.minimum.reduceat(q, starts) == np.maximum.reduceat(q, starts)
        group = np.searchsorted(starts, first, side="right") - 1
        live = (w_val > 0) & (w_val <= count)
        single = live & one_queue[np.clip(group, 0, None)]
        pos = np.clip(first + w_val - 1, 0, sig_idx.size - 1)
        out[single] = sig_idx[pos[single]]
        out[live & ~single] = _SHARED
    out[(w_val > 0) & (w_val > count)] = _NEVER
    return out


def _mark_redundant(
    k0: int, k1: int, base: list[int], wait_sources: Callable[[int], list[int]], eng: list[int],
    ordv: list[int], clocks: list[list[int]], hits: list[int],
) -> None:
    """Record the waits [k0, k1) of one instruction whose edges are implied by program
    order and its other waits (transitively)."""
    srcs = [wait_sources(k) for k in range(k0, k1)]
    for j in range(k1 - k0):
        vc = base
        for k, other in enumerate(srcs):
            if k != j:
                for src in other:
                    if vc[eng[src]] < ordv[src]:
                        vc = list(map(max, vc, clocks[src]))
        if all(vc[eng[src]] >= ordv[src] for src in srcs[j]):
            hits.append(k0 + j)


def _deadlock_problem(
    prog: DecodedProgram, records: np.ndarray, kernel: int, stuck: list[int],
    pending: list[collections.deque[int]], ptr: list[int], w_sem: list[int], w_val: list[int],
    sem_count: list[int],
) -> Problem:
    lines = []
    heads = []
    for e in stuck:
        i = pending[e][0]
        heads.append(i)
        unmet = [
            f"semaphore {w_sem[k]} >= {w_val[k]} (value {sem_count[w_sem[k]]})"
            for k in range(ptr[i], ptr[i + 1])
            if sem_count[w_sem[k]] < w_val[k]
        ]
        lines.append(
            f"{prog.engine_names[e]} blocked at {describe(records, i)} "
            f"waiting on {', '.join(unmet)}"
        )
    message = (
        f"deadlock in kernel {kernel}: waits that can never be met (semaphore values "
        f"once every runnable instruction has finished): " + "; ".join(lines)
    )
    return min(heads), DeadlockError(message)

