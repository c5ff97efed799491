"""The schedule: when each instruction of a decoded stream starts and ends, in cycles.

Engines are one in-order queue per DMA queue (``dma0``, ``dma1``, ...), ``matrix`` and
``vector``; all run in parallel. An instruction starts when its engine is free and each
of its waits is met (semaphore ``wait_sem[i]`` has value ``>= wait_val[i]``); on
completion (its result is ready) it adds 1 to ``signal_sem``. Events are processed in
time order, so every start time is exact. Each instruction's durations come from the
closed forms of `simulator.timing` (`durations`); on top of them:

- DMA: the fixed part, then the transfer. Transfers in flight share the DMA engines
  and HBM: each progresses at ``m`` times its alone rate ``r_i`` (`TimingRules.dma_rate`),
  ``m = 1 / max(1, sum(r_i) / hbm.bytes_per_cycle, sum(n_eng_i) / dma.engines)``
  (`TimingRules.dma_slowdown`; ``n_eng_i`` the engines transfer i runs on), every finish
  time recomputed whenever a transfer starts or ends, so neither HBM nor the engines
  ever exceed their peak. ``n`` full-rate transfers each get ``1/n``; transfers that the
  engines or short chunks limit run side by side at their own rate while the sums allow.
- MATMUL, ``matrix.mode = "compatible"`` (SCALE-Sim): the instruction occupies the
  engine ``L + S + D`` cycles; folds do not overlap. ``"pipelined"``: the stationary
  operand is double-buffered and the array streams one matmul while the next preloads.
  A matmul that starts (its waits met, the engine free) at ``t`` preloads until ``t +
  L``, streams over ``[s, s + S')`` with ``s = max(t + L, end of the previous matmul's
  streaming)``, frees the engine for the next matmul at ``s`` (its preload may start)
  and has its result ready at ``s + S + D``, when it signals (alone: ``L + S + D``, the
  compatible figure). Back-to-back matmuls thus issue every ``max(S'_i, L)`` cycles and
  pay ``L`` and ``D`` once per chain; the streaming intervals never overlap, so the
  engine never exceeds R*C MACs per cycle (R*C/p with fp32 operands), and results come
  in order.
- VECTOR: its whole duration on the engine.

``BARRIER`` splits the stream into kernels: it starts and ends when every earlier
instruction has ended, nothing after it starts earlier, and semaphores reset to 0.
When no engine can progress, `DeadlockError` lists each blocked engine, its head
instruction and the semaphores it waits on (awaited and current values). The
schedule also measures each engine's busy cycles and its stalls (cycles its next
instruction waited on semaphores; for DMA queues, transfer cycles lost to sharing
the DMA engines and HBM).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from tilecc.errors import DeadlockError, SimulatorError
from tilecc.simulator.decode import DecodedProgram, itemsize_lut
from tilecc.simulator.isa import DType, Opcode
from tilecc.simulator.timing import TimingRules, vector_cost_factors

__all__ = ["Durations", "Schedule", "durations", "schedule", "semaphore_producers"]


@dataclass
class Durations:
    """Per-instruction timing parameters, in cycles (see `durations`)."""

    first: np.ndarray  # DMA: fixed part; pipelined matmul: preload; other: whole duration
    second: np.ndarray  # DMA: transfer time alone at its effective bandwidth; pipelined
    #                     matmul: streaming occupancy S' = max(S, min interval); other: 0
    third: np.ndarray  # pipelined matmul: streaming start to result ready (S + D); else 0
    share: np.ndarray  # DMA: its rate alone as a fraction of the HBM peak; else 0
    engines: np.ndarray  # DMA: the DMA engines its transfer runs on; else 0


def durations(prog: DecodedProgram) -> Durations:
    """The closed forms of `simulator.timing`, per instruction of the stream."""
    cfg, s, op = prog.config, prog.col, prog.op
    rules = TimingRules(cfg)
    itemsize = itemsize_lut()
    rows, cols = prog.rows.astype(np.float64), prog.cols.astype(np.float64)
    first = np.zeros(prog.n, dtype=np.float64)
    second = np.zeros(prog.n, dtype=np.float64)
    third = np.zeros(prog.n, dtype=np.float64)
    share = np.zeros(prog.n, dtype=np.float64)
    engines = np.zeros(prog.n, dtype=np.int64)

    dma = prog.is_dma
    if dma.any():
        isz = itemsize[s["a_dtype"][dma]].astype(np.float64)
        r, c = rows[dma], cols[dma]
        # a gather / scatter copies `cols` contiguous elements per indexed row
        pattern = rules.dma_pattern(s["hbm_rs"][dma], s["hbm_cs"][dma], isz, prog.is_indirect[dma])
        first[dma] = rules.dma_fixed(rules.dma_descriptors(r, c, pattern))
        second[dma] = rules.dma_transfer(r, c, isz, pattern)
        share[dma] = rules.dma_hbm_share(rules.dma_rate(r, c, isz, pattern))
        engines[dma] = rules.dma_engines(prog.rows[dma])

    mm = prog.is_mm
    if mm.any():
        fp32 = (s["a_dtype"][mm] == DType.F32) | (s["b_dtype"][mm] == DType.F32)
        speedup = rules.lowp_speedup(s["a_dtype"][mm].astype(np.int64), s["b_dtype"][mm].astype(np.int64))
        stream = rules.matmul_stream(prog.rows[mm], prog.k[mm], prog.cols[mm], fp32, speedup)
        if rules.pipelined:
            first[mm] = rules.preload
            second[mm] = rules.matmul_streaming(stream)
            third[mm] = rules.matmul_result_after_streaming(stream)
        else:
            first[mm] = rules.matmul_latency(stream)

    vec = prog.is_vec
    if vec.any():
        factor = vector_cost_factors(cfg, op[vec], s["func"][vec], prog.flags[vec])
        first[vec] = rules.vector_time(rows[vec], cols[vec], factor)
    return Durations(first, second, third, share, engines)


@dataclass
class Schedule:
    """What `schedule` measured on one stream (or chunk of kernels)."""

    start: np.ndarray | None  # float64 [n], or None when not recorded
    end: np.ndarray | None
    finish: float  # end of the last kernel
    kernels: int  # kernels scheduled (barrier-separated segments, empty ones included)
    busy: list[float]  # per engine: cycles with at least one of its instructions in flight
    semaphore_stall: list[float]  # per engine: cycles its head instruction waited on semaphores
    hbm_stall: list[float]  # per DMA queue: transfer cycles lost to sharing the engines and HBM
    hbm_busy: float  # cycles with at least one transfer on HBM


# event kinds of the general scheduler, in the low two bits of an event code
# (code = 4 * index + kind)
_DONE, _JOIN, _FREE = 0, 1, 2


def schedule(
    prog: DecodedProgram, t0: float = 0.0, kernel0: int = 0, *, record: bool = True,
    general: bool = False,
) -> Schedule:
    """Start and end cycle of every instruction, exactly, kernel after kernel from `t0`.

    Two algorithms give the same times (bit for bit; `general=True` forces the second):

    - **dataflow** (a kernel where every awaited semaphore is signalled from one engine
      queue, as compiled code always is): engines complete in order, so a wait
      ``sem >= v`` is met exactly when the v-th signaller in program order completes;
      `_producers` finds that instruction for every wait, vectorised. The matrix and
      vector engines then run ahead without an event queue (start = max(engine free,
      ends of the producers)); only DMA transfers, which share HBM, go through time
      order: the earliest of the pending joins and the next finish is processed, after
      every engine has advanced as far as known ends allow (whatever is still unknown
      starts no earlier than that event).
    - **general**: a discrete-event simulation. Events are (time, code) in a heap:
      `_DONE` (an instruction completes: its signal counts, its engine takes the next
      instruction unless it is a pipelined matrix engine), `_JOIN` (a DMA's fixed part
      is over: its transfer joins HBM), `_FREE` (a pipelined matmul starts streaming:
      the engine may preload the next one). An engine blocked on a semaphore waits in
      `waiters[sem]` until the value it needs is reached.

    DMA sharing runs in virtual time: every transfer in flight progresses at ``1/k`` of
    its alone rate, ``k = TimingRules.dma_slowdown`` of the transfers in flight (``n``
    for n full-rate ones), so a transfer that joins at virtual time V finishes when
    virtual time reaches ``V + alone time``; the next finish is at real time ``t +
    (tag - V) * k``, recomputed whenever a transfer joins or leaves.
    """
    if prog.links:
        raise SimulatorError("the stream has link instructions (LINK_SEND / LINK_RECV): it is one chip's "
                             "part of a multi-chip program; run it with simulator/multichip.py's cosimulate")
    sch = _Scheduler(prog, t0, kernel0)
    if general:
        for kernel in range(len(sch.bounds)):
            sch.run_general(kernel)
    else:
        sch.run_dataflow()
    return sch.result(record)


def semaphore_producers(prog: DecodedProgram) -> np.ndarray:
    """[n x width] int64: each instruction's producers, the instructions whose completion
    meets its semaphore waits (`_producers`' rule: the v-th signaller of the semaphore in
    program order within the barrier-separated kernel), then -1s. Exact for compiled
    code (every awaited semaphore signalled from one engine queue)."""
    kernel_of = np.cumsum(prog.is_barrier) - prog.is_barrier
    n_kernels = int(prog.is_barrier.sum()) + 1
    prod, _ = _producers(prog, prog.col["wait_sem"], prog.col["wait_val"], kernel_of, n_kernels)
    return prod


def _producers(
    prog: DecodedProgram, wait_sem: np.ndarray, wait_val: np.ndarray, kernel_of: np.ndarray,
    n_kernels: int,
) -> tuple[np.ndarray, np.ndarray]:
    """[n x width] int64: each instruction's producers from column 0 on, then -1s (at
    least one, a sentinel). The producer of a wait ``sem >= v`` (v > 0) is the
    instruction whose completion meets it if its engine completes in order: the v-th
    signaller of ``sem`` in program order within the kernel. And per kernel whether that
    rule is exact: every awaited semaphore signalled from one engine queue, every wait
    reachable, no wait on a later instruction of its own queue."""
    n = len(wait_sem)
    n_sem = prog.config.semaphores
    sig = prog.col["signal_sem"]
    signallers = np.flatnonzero((sig >= 0) & ~prog.is_barrier)
    keys = kernel_of[signallers] * n_sem + sig[signallers]
    order = np.argsort(keys, kind="stable")  # by (kernel, sem), then program order
    keys, signallers = keys[order], signallers[order]
    # groups of signallers of one semaphore in one kernel: key, first position, size
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys
    group_key = keys[first]
    size = np.diff(np.r_[first, len(keys)])
    used = wait_sem >= 0
    who = np.nonzero(used)[0]
    wkey = kernel_of[who] * n_sem + wait_sem[used]
    value = wait_val[used].astype(np.int64)
    g = np.minimum(np.searchsorted(group_key, wkey), max(len(group_key) - 1, 0))
    if len(group_key):
        hit = group_key[g] == wkey
        reachable = value <= np.where(hit, size[g], 0)
        pick = signallers[np.minimum(first[g] + value - 1, len(keys) - 1)]
    else:
        reachable = value <= 0
        pick = value
    found = np.where(reachable & (value > 0), pick, -1)
    exact = np.ones(n_kernels, dtype=bool)
    exact[kernel_of[who[~reachable]]] = False
    if len(keys):
        eng = prog.eng[signallers]
        mixed = np.minimum.reduceat(eng, first) != np.maximum.reduceat(eng, first)
        if mixed.any():
            exact[kernel_of[who[np.isin(wkey, group_key[mixed])]]] = False
    found_eng = np.where(found >= 0, prog.eng[np.maximum(found, 0)], -1)
    own_later = (found_eng == prog.eng[who]) & (found > who)
    exact[kernel_of[who[own_later]]] = False
    # each row's producers from column 0, then -1s (at least one: a sentinel)
    keep = found >= 0
    rows, found = who[keep], found[keep]
    run_start = np.r_[True, rows[1:] != rows[:-1]] if len(rows) else np.zeros(0, bool)
    column = np.arange(len(rows)) - np.maximum.accumulate(
        np.where(run_start, np.arange(len(rows)), 0)
    )
    width = int(column.max(initial=-1)) + 2
    prod = np.full((n, width), -1, dtype=np.int64)
    prod[rows, column] = found
    return prod, exact


class _Scheduler:
    """The per-chunk state of `schedule`: instruction lists, then measured totals.

    The schedulers only compute each instruction's `start`, `end` and `join` (a DMA's
    HBM join time; a pipelined matmul's streaming start); `result` derives busy cycles
    and stalls from them with numpy, the same way for both algorithms."""

    def __init__(self, prog: DecodedProgram, t0: float, kernel0: int):
        self.prog = prog
        self.kernel0 = kernel0
        self.t0 = t0
        self.dur = dur = durations(prog)
        n, n_queues = prog.n, prog.queues
        self.n_queues = n_queues
        self.n_eng = n_queues + 2
        self.pipelined = prog.config.matrix.mode == "pipelined"
        s = prog.col
        self.first, self.second, self.third = (
            dur.first.tolist(), dur.second.tolist(), dur.third.tolist()
        )
        self.share, self.dma_engines = dur.share.tolist(), dur.engines.tolist()
        self.slowdown = TimingRules(prog.config).dma_slowdown
        self.eng = prog.eng.tolist()
        self._waits = s["wait_sem"], s["wait_val"]
        barriers_np = np.flatnonzero(prog.is_barrier)
        kernel_of = np.cumsum(prog.is_barrier) - prog.is_barrier
        n_kernels = len(barriers_np) + 1
        prod, self.simple = _producers(prog, *self._waits, kernel_of, n_kernels)
        self.prod_stride = prod.shape[1]
        self.prod = prod.ravel().tolist()
        del prod, kernel_of
        self._general_ready = False
        self.start, self.end = [0.0] * n, [-1.0] * n
        self.join = [0.0] * n
        self.queues_np = [np.flatnonzero(prog.eng == e) for e in range(self.n_eng)]
        self.queues = [q.tolist() for q in self.queues_np]
        self.barriers = barriers_np.tolist()
        self.bounds = [0] + [b + 1 for b in self.barriers]
        self.limits = self.barriers + [n]
        self.heads = [np.searchsorted(q, self.bounds).tolist() for q in self.queues_np]
        self.tails = [np.searchsorted(q, self.limits).tolist() for q in self.queues_np]
        self.now = t0

    def result(self, record: bool) -> Schedule:
        """Busy cycles, stalls and HBM busy time from the start/end/join lists."""
        prog, n_queues = self.prog, self.n_queues
        start = np.array(self.start, dtype=np.float64)
        end = np.array(self.end, dtype=np.float64)
        join = np.array(self.join, dtype=np.float64)
        # when each kernel started: t0, then each barrier's time
        kernel_start = np.r_[self.t0, end[prog.is_barrier]]
        kernel_of = np.cumsum(prog.is_barrier) - prog.is_barrier
        busy, sem_stall, hbm_stall = [], [], []
        for e, q in enumerate(self.queues_np):
            if not len(q):
                busy.append(0.0)
                sem_stall.append(0.0)
                hbm_stall.append(0.0)
                continue
            s, t = start[q], end[q]
            # the engine could start an instruction once the previous one on it (same
            # kernel) freed it: at its end, or a pipelined matmul's streaming start
            freed = join[q] if (e == n_queues and self.pipelined) else t
            same_kernel = np.r_[False, kernel_of[q][1:] == kernel_of[q][:-1]]
            ready = np.where(same_kernel, np.r_[0.0, freed[:-1]], kernel_start[kernel_of[q]])
            sem_stall.append(float((s - ready).sum()))
            # cycles with at least one of its instructions in flight (union of intervals)
            before = np.maximum.accumulate(np.r_[-np.inf, t[:-1]])
            busy.append(float(np.maximum(t - np.maximum(s, before), 0.0).sum()))
            # DMA: transfer time beyond its time alone (lost to sharing engines and HBM)
            lost = (t - join[q] - self.dur.second[q]).sum() if e < n_queues else 0.0
            hbm_stall.append(float(lost))
        # HBM busy: union of the transfer intervals [join, end) of all DMAs
        dma = np.flatnonzero(prog.is_dma)
        order = np.argsort(join[dma], kind="stable")
        j, t = join[dma][order], end[dma][order]
        before = np.maximum.accumulate(np.r_[-np.inf, t[:-1]]) if len(t) else t
        hbm_busy = float(np.maximum(t - np.maximum(j, before), 0.0).sum()) if len(t) else 0.0
        return Schedule(
            start=start if record else None,
            end=end if record else None,
            finish=self.now,
            kernels=len(self.bounds),
            busy=busy,
            semaphore_stall=sem_stall,
            hbm_stall=hbm_stall[:n_queues],
            hbm_busy=hbm_busy,
        )

    def _close_kernel(self, kernel: int, now: float) -> None:
        self.now = now
        if kernel < len(self.barriers):
            b = self.barriers[kernel]
            self.start[b] = self.end[b] = now

    # -- dataflow ---------------------------------------------------------------------

    def run_dataflow(self) -> None:
        """Schedule every kernel, by dataflow where `_producers` found every wait's
        producer, else (or when the kernel deadlocks) by `run_general`."""
        start, end, join, first, second = self.start, self.end, self.join, self.first, self.second
        prod, stride, queues, eng = self.prod, self.prod_stride, self.queues, self.eng
        n_queues, third, n_eng = self.n_queues, self.third, self.n_eng
        share, dma_eng, slowdown = self.share, self.dma_engines, self.slowdown
        matrix, vector = n_queues, n_queues + 1
        pipelined = self.pipelined
        heappush, heappop = heapq.heappush, heapq.heappop
        heads_np = np.array(self.heads, dtype=np.int64).T  # [kernel, engine]
        tails_np = np.array(self.tails, dtype=np.int64).T
        heads, tails = heads_np.tolist(), tails_np.tolist()
        # per kernel: the matrix/vector engines with work, the DMA queues with work
        has_work = (heads_np < tails_np).tolist()
        del heads_np, tails_np
        compute_engines = (vector, matrix)
        dma_engines = range(n_queues)
        barriers, n_barriers = self.barriers, len(self.barriers)
        simple = self.simple.tolist()
        blocked_on = [-1] * n_eng  # the producer an engine's head waits for
        now = self.now
        for kernel in range(len(tails)):
            if not simple[kernel]:
                self.now = now
                self.run_general(kernel)
                now = self.now
                continue
            head, tail = heads[kernel], tails[kernel]
            free = [now] * n_eng  # when each engine can start its next instruction
            kernel_end = now
            stream_free = now  # pipelined matrix: when the array stops streaming
            work = has_work[kernel]
            active = [e for e in compute_engines if work[e]]
            dma_idle = [e for e in dma_engines if work[e]]  # queues to start
            pending: list[tuple[float, int]] = []  # heap of transfers to join: (time, index)
            flying: list[tuple[float, int]] = []  # heap of transfers on HBM: (virtual tag, index)
            v_now = t_ps = 0.0  # HBM virtual time, and the real time it was last brought to
            slow = 1.0  # the transfers in flight progress 1/slow as fast as alone
            resolved = True  # an end became known: engines may advance
            while True:
                progress = resolved
                while progress:
                    progress = False
                    for e in active:
                        h, tl = head[e], tail[e]
                        if h == tl:
                            continue
                        b = blocked_on[e]
                        if b >= 0 and end[b] < 0.0:
                            continue
                        q, f = queues[e], free[e]
                        streams = e == matrix and pipelined
                        while h < tl:
                            i = q[h]
                            t = f
                            j = i * stride
                            p = prod[j]
                            while p >= 0:
                                x = end[p]
                                if x < 0.0:
                                    break
                                if x > t:
                                    t = x
                                j += 1
                                p = prod[j]
                            if p >= 0:
                                blocked_on[e] = p
                                break
                            start[i] = t
                            if streams:
                                f = t + first[i]  # preload done
                                if f < stream_free:
                                    f = stream_free
                                stream_free = f + second[i]
                                join[i] = f
                                end[i] = f + third[i]
                            else:
                                end[i] = f = t + first[i]
                            h += 1
                        if h != head[e]:
                            progress = True
                            head[e], free[e] = h, f
                            x = end[q[h - 1]]  # ends come in order
                            if x > kernel_end:
                                kernel_end = x
                    if dma_idle:
                        still = []
                        for e in dma_idle:
                            i = queues[e][head[e]]
                            t = free[e]
                            j = i * stride
                            p = prod[j]
                            while p >= 0:
                                x = end[p]
                                if x < 0.0:
                                    break
                                if x > t:
                                    t = x
                                j += 1
                                p = prod[j]
                            if p >= 0:
                                still.append(e)
                                continue
                            start[i] = t
                            heappush(pending, (t + first[i], i))
                        dma_idle = still
                resolved = False
                # the next HBM event: a transfer joins, or one finishes
                if flying:
                    tag, i = flying[0]
                    t = t_ps + (tag - v_now) * slow
                    if pending and pending[0][0] < t:
                        t, i = heappop(pending)
                        v_now += (t - t_ps) / slow
                        t_ps = join[i] = t
                        heappush(flying, (v_now + second[i], i))
                        slow = slowdown([share[x] for _, x in flying], [dma_eng[x] for _, x in flying])
                        continue
                    heappop(flying)
                    v_now, t_ps = (tag, t) if flying else (0.0, t)
                    slow = slowdown([share[x] for _, x in flying], [dma_eng[x] for _, x in flying])
                elif pending:
                    jt, i = heappop(pending)
                    t = jt + second[i]
                    join[i] = jt
                    if pending and pending[0][0] < t:  # another joins before it ends
                        t_ps = jt
                        flying.append((second[i], i))
                        slow = slowdown([share[i]], [dma_eng[i]])
                        continue
                    # alone on HBM from join to end (the arithmetic of the general case)
                else:
                    break
                # DMA i completes at t
                e = eng[i]
                end[i] = free[e] = t
                if t > kernel_end:
                    kernel_end = t
                h = head[e] = head[e] + 1
                if h < tail[e]:
                    dma_idle.append(e)
                resolved = True
            if head != tail:  # a deadlock: undo, and let the general scheduler report it
                for i in range(self.bounds[kernel], self.limits[kernel]):
                    end[i] = -1.0
                self.now = now
                self.run_general(kernel)
                continue
            now = kernel_end
            if kernel < n_barriers:
                b = barriers[kernel]
                start[b] = end[b] = now
        self.now = now

    # -- general ----------------------------------------------------------------------

    def _prepare_general(self) -> None:
        """The lists only the general scheduler reads, made on first use."""
        # waits compacted to the front of each row, so the first -1 ends them
        wait_sem, wait_val = self._waits
        order = np.argsort(wait_sem < 0, axis=1, kind="stable")
        wait_sem = np.take_along_axis(wait_sem, order, axis=1)
        wait_val = np.take_along_axis(wait_val, order, axis=1)
        self.n_waits = wait_sem.shape[1]
        self.wait_sem = wait_sem.ravel().tolist()
        self.wait_val = wait_val.ravel().tolist()
        self.sig = self.prog.col["signal_sem"].tolist()
        self.sem = [0] * self.prog.config.semaphores
        self.waiters: list[list[int] | None] = [None] * self.prog.config.semaphores
        self._general_ready = True

    def run_general(self, kernel: int) -> None:
        """Schedule one kernel by discrete-event simulation (any semaphore pattern)."""
        if not self._general_ready:
            self._prepare_general()
        start, end, join, first, second = self.start, self.end, self.join, self.first, self.second
        eng, sig, queues = self.eng, self.sig, self.queues
        wait_sem, wait_val, n_waits = self.wait_sem, self.wait_val, self.n_waits
        sem, waiters = self.sem, self.waiters
        n_queues, n_eng, third = self.n_queues, self.n_eng, self.third
        share, dma_eng, slowdown = self.share, self.dma_engines, self.slowdown
        matrix = n_queues
        pipelined = self.pipelined
        heappush, heappop = heapq.heappush, heapq.heappop
        now = self.now
        head = [h[kernel] for h in self.heads]
        tail = [t[kernel] for t in self.tails]
        heap: list[tuple[float, int]] = []
        need = [0] * n_eng
        stream_free = now  # pipelined matrix engine: when the array stops streaming
        ps: list[tuple[float, int]] = []  # transfers in flight: (virtual finish tag, index)
        v_now = 0.0  # HBM virtual time
        t_ps = now  # real time at which v_now was last brought up to date
        slow = 1.0  # the transfers in flight progress 1/slow as fast as alone

        def try_start(e: int, t: float) -> None:
            """Start engine e's head instruction at time t, or park e on a semaphore."""
            nonlocal stream_free
            i = queues[e][head[e]]
            j0 = i * n_waits
            if wait_sem[j0] >= 0:
                for j in range(j0, j0 + n_waits):
                    w = wait_sem[j]
                    if w < 0:
                        break
                    if sem[w] < wait_val[j]:
                        need[e] = wait_val[j]
                        parked = waiters[w]
                        if parked is None:
                            waiters[w] = [e]
                        else:
                            parked.append(e)
                        return
            start[i] = t
            if e < n_queues:
                heappush(heap, (t + first[i], 4 * i + _JOIN))
            elif e == matrix and pipelined:
                streaming = t + first[i]  # preload done
                if streaming < stream_free:
                    streaming = stream_free
                stream_free = streaming + second[i]
                join[i] = streaming
                heappush(heap, (streaming, 4 * i + _FREE))
                heappush(heap, (streaming + third[i], 4 * i + _DONE))
            else:
                heappush(heap, (t + first[i], 4 * i + _DONE))

        for e in range(n_eng):
            if head[e] < tail[e]:
                try_start(e, now)
        while True:
            if ps:
                t = t_ps + (ps[0][0] - v_now) * slow
                if heap and heap[0][0] < t:
                    t, code = heappop(heap)
                else:  # a transfer finishes: the others speed up
                    v_now, i = heappop(ps)
                    t_ps = t
                    code = 4 * i + _DONE
                    slow = slowdown([share[x] for _, x in ps], [dma_eng[x] for _, x in ps])
                    if not ps:
                        v_now = 0.0
            elif heap:
                t, code = heappop(heap)
            else:
                break
            i = code >> 2
            kind = code & 3
            e = eng[i]
            if kind == _JOIN:
                if ps:
                    v_now += (t - t_ps) / slow
                t_ps = join[i] = t
                heappush(ps, (v_now + second[i], i))
                slow = slowdown([share[x] for _, x in ps], [dma_eng[x] for _, x in ps])
                continue
            if kind == _DONE:
                end[i] = t
                now = t
                w = sig[i]
                if w >= 0:
                    value = sem[w] + 1
                    sem[w] = value
                    parked = waiters[w]
                    if parked:
                        released = [x for x in parked if need[x] <= value]
                        if released:
                            waiters[w] = [x for x in parked if need[x] > value]
                            for x in released:
                                try_start(x, t)
                if e == matrix and pipelined:
                    continue
            # the engine takes its next instruction
            head[e] += 1
            if head[e] < tail[e]:
                try_start(e, t)
        blocked = [e for e in range(n_eng) if head[e] < tail[e]]
        if blocked:
            raise DeadlockError(
                _deadlock_message(
                    self.prog, self.kernel0 + kernel, now, blocked, head, queues, sem
                )
            )
        for w in set(sig[self.bounds[kernel] : self.limits[kernel]]):
            if w >= 0:
                sem[w] = 0
                waiters[w] = None
        self._close_kernel(kernel, now)


def _deadlock_message(
    prog: DecodedProgram, kernel: int, now: float, blocked: list[int], head: list[int],
    queues: list[list[int]], sem: list[int],
) -> str:
    s = prog.col
    lines = []
    for e in sorted(blocked):
        i = queues[e][head[e]]
        waits = [
            f"semaphore {int(w)} >= {int(v)} (value {sem[int(w)]})"
            for w, v in zip(s["wait_sem"][i], s["wait_val"][i], strict=True)
            if w >= 0 and sem[int(w)] < v
        ]
        opcode = Opcode(int(s["opcode"][i])).name
        lines.append(
            f"{prog.engine_names[e]} blocked at instruction {i + prog.offset} ({opcode}) "
            f"waiting on {', '.join(waits)}"
        )
    return f"deadlock in kernel {kernel} at cycle {now:g}: " + "; ".join(lines)


