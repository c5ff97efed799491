"""The attention kernel's list scheduler: the order each engine queue runs a body in.

A kernel body (one or more heads; a loop runs bodies over the remaining heads) is
first written as a plain sequential program over rotating buffers (accumulators,
``P^T``, ``Q^T``, DMA rings), one `SchedOp` per instruction; `schedule` then reorders it
into the order each engine queue runs::

    program order:   load K0, mm K0^T, copy, load Q0, mm Q0^T, mul, mm S, max, ..., exp, mm PV
      -> emitted:    load K0, load Q0, mm K0^T, mm Q0^T, copy, mul, mm S(q0), mm S(q1), max, ...
                     (each load on the DMA queue of its buffer: `tile.load ... queue = 1`;
                      each store on the first free queue)

An instruction may move ahead of any other it shares no buffer with (`buffer_deps`: the
rule `npu-insert-sync` derives semaphores from, so the emitted order keeps every
dependence); priorities are critical-path lengths (an edge to another engine costs the
producer's latency, one on its own in-order queue its occupancy); and each buffer's
loads keep one DMA queue (picked when its first load issues; several queues would need
one semaphore wait each; a store only reads its buffer: the first free queue takes it).
Several priority variants are scheduled (`list_schedule`) and each order is *replayed*
(`replay`) with the simulator's timing rules (`tilecc.simulator.timing`: in-order
queues, pipelined matmuls, processor-shared HBM;
exact for a kernel of one body): the fastest is emitted, and the replay's cycles are the
kernel's estimate. So the pass-1 matmuls of the next q-tile fill the matrix engine while
the vector engine runs this q-tile's exps, and loads run ahead into free buffers.

The replay and the list scheduler add a matmul's parts in the order ``start + S + D``
(the simulator adds ``start + (S + D)``); the estimate agrees with the simulated cycles
to within rounding, and the order is kept so that ties between schedules, and so the
programs, stay as they are.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tilecc.errors import CompileError
from tilecc.passes.graph_to_tile.attention.plan import DEBUG, SCHEDULE_TRIES
from tilecc.simulator.timing import DmaPattern, TimingRules


@dataclass(eq=False)
class SchedOp:
    """One instruction of a body: its engine kind, the buffers it reads and writes (by
    name), its durations, and `emit`, which builds its tile op (given its DMA queue)."""

    kind: str  # "load", "store", "mm", "vec"
    emit: Callable[[int | None], None]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    prio: tuple[int, ...]
    a: float  # mm: streaming cycles; vec: duration; dma: fixed cycles
    b: float = 0.0  # dma: transfer cycles
    queue: int | None = None  # dma: its queue (a store without one: the first free)
    share: float = 1.0  # dma: its rate alone as a fraction of the HBM peak
    engines: int = 1  # dma: the DMA engines its transfer runs on
    idx: int = 0
    deps: set[int] = field(default_factory=set)


Order = list[tuple[SchedOp, int | None]]  # instructions in issue order, each load's DMA queue


@dataclass
class ScheduleInit:
    """The engines' state before a body: after the kernel's prologue for the first one
    (later bodies follow a loop or another body: only the buffers' queues carry over)."""

    qfree: list[float] | None = None  # when each DMA queue is free (None: at 0)
    ready: dict[str, float] = field(default_factory=dict)  # buffer -> when the prologue's last access ends
    qmap: dict[str, int] = field(default_factory=dict)  # buffer -> the DMA queue its loads use
    pre: Order = field(default_factory=list)  # the prologue's instructions (for the replay)
    vec: float = 0.0  # when the vector engine is free


class AttentionTiming(TimingRules):
    """The simulator's timing rules (`tilecc.simulator.timing`) in the per-instruction
    view the list scheduler needs."""

    def mm(self, m: int, k: int, n: int, fp32: bool) -> float:
        """Streaming cycles (S) of one [m x k] @ [k x n] matmul."""
        return self.matmul_stream(m, k, n, fp32)

    def vec(self, kind: str, fn: str, rows: int, cols: int, inputs: int = 1) -> float:
        """One vector instruction of `kind` (unary, binary, reduce) function `fn`."""
        return self.vector_time(rows, cols, self.vector_op_cost(kind, fn), inputs)

    def occupancy(self, o: SchedOp) -> float:
        """Cycles an instruction holds its engine."""
        if o.kind == "mm":
            return max(self.preload, self.matmul_streaming(o.a))
        return o.a + o.b

    def latency(self, o: SchedOp) -> float:
        """Cycles from an instruction's start to its result."""
        if o.kind == "mm":
            return self.matmul_latency(o.a)
        return o.a + o.b

    def dma(self, rows: int, cols: int, isz: int,
            pattern: DmaPattern = DmaPattern.CONTIGUOUS) -> tuple[float, float]:
        """(fixed cycles, transfer cycles): one descriptor per row (contiguous), per column
        (a DMA transpose), or per element (strided)."""
        descriptors = self.dma_descriptors(rows, cols, pattern)
        return self.dma_fixed(descriptors), self.dma_transfer(rows, cols, isz, pattern)

    def dma_sharing(self, rows: int, cols: int, isz: int,
                    pattern: DmaPattern = DmaPattern.CONTIGUOUS) -> tuple[float, int]:
        """What sharing counts of a DMA (`SchedOp.share`, `SchedOp.engines`): its rate
        alone as a fraction of the HBM peak, and the engines it runs on."""
        share = self.dma_hbm_share(self.dma_rate(rows, cols, isz, pattern))
        return share, self.dma_engines(rows)


def buffer_deps(ops: Sequence[SchedOp]) -> list[set[int]]:
    """Per op, the earlier ops it depends on through a buffer: the last writer of what it
    reads or writes (RAW, WAW) and the readers since then of what it writes (WAR)."""
    last_w: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    out: list[set[int]] = []
    for i, o in enumerate(ops):
        d: set[int] = {last_w[b] for b in (*o.reads, *o.writes) if b in last_w}
        for b in o.writes:
            d.update(readers.get(b, ()))
        for b in o.reads:
            readers.setdefault(b, []).append(i)
        for b in o.writes:
            last_w[b] = i
            readers[b] = []
        d.discard(i)
        out.append(d)
    return out


def schedule(ops: list[SchedOp], tm: AttentionTiming, queues: int, init: ScheduleInit | None = None,
             tries: int = SCHEDULE_TRIES) -> tuple[Order, float]:
    """A topological order of `ops` (dependences: shared buffers, in the given order) for
    the engines' queues, and each load's DMA queue: list schedules under a few
    priority functions (critical paths by latency or by engine occupancy, and seeded
    perturbations of them), the one with the earliest estimated end.
    `init`: the engines' state after the kernel's prologue (``qfree``, ``vec``, and
    ``ready``: buffer -> when the prologue's last access to it ends)."""
    init = init if init is not None else ScheduleInit()
    for i, (o, deps) in enumerate(zip(ops, buffer_deps(ops))):
        o.idx = i
        o.deps = deps
    n = len(ops)
    succ: list[list[int]] = [[] for _ in range(n)]
    for o in ops:
        for d in sorted(o.deps):
            succ[d].append(o.idx)

    eng = [engine_of(o, queues) for o in ops]
    lat_w = [tm.latency(o) for o in ops]
    occ_w = [tm.occupancy(o) for o in ops]

    def levels(scale: Sequence[float] | np.ndarray | None = None) -> list[float]:
        """Longest path from each instruction to the end of the body: an edge to another
        engine costs the producer's latency, one on its own (in-order) queue only its
        occupancy of the engine."""
        level = [0.0] * n
        for i in range(n - 1, -1, -1):
            f = scale[i] if scale is not None else 1.0
            best = lat_w[i]
            for x in succ[i]:
                w = lat_w[i] if eng[x] != eng[i] else occ_w[i]
                if w + level[x] > best:
                    best = w + level[x]
            level[i] = best * f
        return level

    lat = levels()
    variants = [lat]
    rng = np.random.default_rng(0)
    for _ in range(tries):
        variants.append(levels(rng.uniform(0.97, 1.03, n)))
    best: tuple[Order, float, list[float], list[float], list[float]] | None = None
    spans = []
    for level in variants:
        order, _, start, end = list_schedule(ops, succ, level, tm, queues, init)
        span = replay(order, tm, queues, init)
        spans.append(round(span))
        if best is None or span < best[1]:
            best = (order, span, level, start, end)
    assert best is not None
    # loads in the order their data is needed: the planned start of their first
    # consumer in the best schedule so far (repeated while it helps)
    for _ in range(3):
        level = list(best[2])
        end = best[4]
        for i, o in enumerate(ops):
            if o.kind == "load" and succ[i]:
                # when its consumers could start but for the loads they wait on
                level[i] = -min(max([end[d] for d in ops[x].deps if ops[d].kind != "load"], default=0.0)
                                for x in succ[i])
        order, _, start, end = list_schedule(ops, succ, level, tm, queues, init)
        span = replay(order, tm, queues, init)
        spans.append(round(span))
        if span >= best[1]:
            break
        best = (order, span, level, start, end)
    if DEBUG:
        occ_by: dict[str, float] = {}
        for o in ops:
            occ_by[o.kind] = occ_by.get(o.kind, 0.0) + tm.occupancy(o)
        print(f"attention schedule: {n} ops, planned ends {spans}, critical path {max(lat):,.0f}, "
              f"occupancy {({k: round(x) for k, x in occ_by.items()})}")
    return best[0], best[1]


def replay(order: Order, tm: AttentionTiming, queues: int, init: ScheduleInit) -> float:
    """The end of a schedule, timed the way the simulator times it: each engine runs
    its instructions in program order (`init.pre`, the kernel prologue, then
    `order`), an instruction waits for the earlier ones of other engines it shares a
    buffer with, pipelined matmuls overlap, DMA transfers share the engines and HBM
    (each at ``1 / TimingRules.dma_slowdown`` of its alone rate)."""
    seq_all = [(o, o.queue if o.kind in ("load", "store") and q is None else q) for o, q in init.pre]
    seq_all += list(order)
    n = len(seq_all)
    eng_of = [0] * n
    seqs: list[list[int]] = [[] for _ in range(queues + 2)]
    deps: list[list[int]] = []
    for k, ((o, q), d) in enumerate(zip(seq_all, buffer_deps([o for o, _ in seq_all]))):
        e = q if o.kind in ("load", "store") and q is not None else engine_of(o, queues)
        eng_of[k] = e
        seqs[e].append(k)
        deps.append(sorted(x for x in d if eng_of[x] != e))
    order = seq_all
    end: list[float | None] = [None] * n
    head = [0] * (queues + 2)
    free = [0.0] * (queues + 2)
    busy = [False] * queues
    MAT = queues
    stream_free = 0.0
    pending: list[tuple[float, int]] = []  # DMAs to join HBM: (time, k)
    flying: dict[int, float] = {}  # DMA k -> transfer work left (cycles alone)
    t_now = 0.0
    slow = 1.0  # the transfers in flight progress 1/slow as fast as alone

    def slowdown() -> float:
        ops = [order[x][0] for x in flying]
        return tm.dma_slowdown([o.share for o in ops], [o.engines for o in ops])
    while True:
        progress = True
        while progress:
            progress = False
            for e in range(queues + 2):
                seq = seqs[e]
                while head[e] < len(seq):
                    k = seq[head[e]]
                    if e < queues and busy[e]:
                        break
                    t = free[e]
                    known = True
                    for d in deps[k]:
                        x = end[d]
                        if x is None:
                            known = False
                            break
                        t = max(t, x)
                    if not known:
                        break
                    o = order[k][0]
                    head[e] += 1
                    progress = True
                    if e < queues:
                        busy[e] = True
                        heapq.heappush(pending, (t + o.a, k))
                        break
                    if e == MAT and tm.pipelined:
                        f = max(t + tm.preload, stream_free)
                        free[e] = f
                        stream_free = f + tm.matmul_streaming(o.a)
                        end[k] = f + tm.matmul_result_after_streaming(o.a)
                    elif e == MAT:
                        end[k] = free[e] = t + tm.matmul_latency(o.a)
                    else:
                        end[k] = free[e] = t + o.a
        # the next HBM event: a transfer joins or the first one in flight finishes
        t_fin, k_fin = math.inf, -1
        if flying:
            k_fin = min(flying, key=lambda x: (flying[x], x))
            t_fin = t_now + flying[k_fin] * slow
        if pending and pending[0][0] <= t_fin:
            t_join, k = heapq.heappop(pending)
            t_join = max(t_join, t_now)
            for x in flying:
                flying[x] -= (t_join - t_now) / slow
            t_now = t_join
            flying[k] = order[k][0].b
            slow = slowdown()
            continue
        if k_fin < 0:
            break
        for x in flying:
            flying[x] -= (t_fin - t_now) / slow
        t_now = t_fin
        del flying[k_fin]
        slow = slowdown()
        end[k_fin] = free[eng_of[k_fin]] = t_fin
        busy[eng_of[k_fin]] = False
    done = [x for x in end if x is not None]
    if len(done) != len(end):
        raise CompileError("attention schedule: the replay deadlocked (an instruction never became ready)")
    return max(done, default=0.0)


def engine_of(o: SchedOp, queues: int) -> int:
    """The engine queue of an instruction: DMA queues 0.. (a load: its buffer's queue
    once known, else -1), then matrix, vector."""
    if o.kind == "store":
        return queues - 1
    if o.kind == "load":
        return -1
    return queues if o.kind == "mm" else queues + 1


def list_schedule(ops: list[SchedOp], succ: list[list[int]], level: Sequence[float], tm: AttentionTiming,
                  queues: int, init: ScheduleInit) -> tuple[Order, float, list[float], list[float]]:
    """One list schedule: whenever an engine is free, the ready instruction with the
    highest `level` (else the one ready first); issued in estimated start order. A
    buffer's loads all use one DMA queue: the first free when its first load issues."""
    n = len(ops)
    left = [len(o.deps) for o in ops]
    pro = init.ready
    dep_ready = [max([pro.get(b, 0.0) for b in o.reads + o.writes], default=0.0) for o in ops]
    MAT, VEC = queues, queues + 1
    qmap: dict[str, int] = dict(init.qmap)
    eng = [engine_of(o, queues) for o in ops]
    ready: list[list[int]] = [[] for _ in range(queues + 2)]
    anyq: list[int] = []  # ready loads of buffers without a queue yet, and ready stores

    def enqueue(i: int) -> None:
        o = ops[i]
        if o.kind == "store" and o.queue is None:  # any queue: the first free
            anyq.append(i)
            return
        if o.kind == "load":
            q = qmap.get(o.writes[0])
            if q is None:
                anyq.append(i)
                return
            eng[i] = q
        ready[eng[i]].append(i)

    for i in range(n):
        if left[i] == 0:
            enqueue(i)
    free = list(init.qfree if init.qfree is not None else [0.0] * queues) + [0.0, init.vec]
    stream_free = span = 0.0
    start = [0.0] * n
    end = [0.0] * n
    out: list[tuple[SchedOp, int | None]] = []
    while True:
        best = None  # (start, -level, index, engine)
        for e_ in range(queues + 2):
            cands = ready[e_] + anyq if e_ < queues else ready[e_]
            if not cands:
                continue
            t_e = free[e_]
            now = [i for i in cands if dep_ready[i] <= t_e]
            if now:
                i = max(now, key=lambda x: (level[x], -x))
                key = (t_e, -level[i], i, e_)
            else:
                i = min(cands, key=lambda x: (dep_ready[x], -level[x], x))
                key = (dep_ready[i], -level[i], i, e_)
            if best is None or key < best:
                best = key
        if best is None:
            break
        t, _, i, e_ = best
        o = ops[i]
        if o.kind in ("load", "store"):
            if o.kind == "load" and o.writes[0] not in qmap:
                qmap[o.writes[0]] = e_
                anyq.remove(i)
                eng[i] = e_
            elif o.kind == "store" and o.queue is None:
                anyq.remove(i)
                eng[i] = e_
            else:
                ready[e_].remove(i)
            # HBM is shared by the transfers in flight (processor sharing): this one's
            # transfer slows by the number of queues transferring when it starts
            busy = sum(1 for q in range(queues) if q != e_ and free[q] > t + o.a)
            e = free[e_] = t + o.a + o.b * (1 + busy)
        elif o.kind == "mm":
            ready[e_].remove(i)
            if tm.pipelined:
                f = max(t + tm.preload, stream_free)
                free[MAT] = f
                stream_free = f + tm.matmul_streaming(o.a)
                e = f + tm.matmul_result_after_streaming(o.a)
            else:
                e = free[MAT] = t + tm.matmul_latency(o.a)
        else:
            ready[e_].remove(i)
            e = free[VEC] = t + o.a
        span = max(span, e)
        start[i], end[i] = t, e
        out.append((o, e_ if o.kind in ("load", "store") else None))
        for x in succ[i]:
            left[x] -= 1
            if eng[x] != e_ and dep_ready[x] < e:  # its own queue runs in order: no wait
                dep_ready[x] = e
            if left[x] == 0:
                enqueue(x)
    assert len(out) == n, "attention schedule: dependence cycle"
    return out, span, start, end
