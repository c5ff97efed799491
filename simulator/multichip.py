"""Co-simulation: every chip's instruction stream in one event loop, the links shared.

    res = cosimulate(streams, config, system, hbms)      # hbms: one HBM image per chip, or None
    res.finish_ns, res.chips[r].start / .end (cycles), res.link_bytes, res.comm_ns

Each chip runs its own engines exactly as `simulator/scheduler.py`'s general algorithm
does (one in-order queue per DMA queue, matrix, vector; semaphores; DMA transfers
sharing the chip's DMA engines and HBM in virtual time; the pipelined matrix engine;
BARRIER drains the chip and resets its semaphores), plus one in-order queue per link
DMA queue (``link0``, ...), all in core cycles of the chips' common clock.

Links (`isa.py`'s LINK_SEND / LINK_RECV): a send that starts at t (its queue free, its
waits met) streams its bytes over the routed links (`routing.route`) and its last byte
arrives the route's latency alpha later (`routing.path_stats`, `LinkConfig.path_latency_ns`;
cut-through), so a queue's next send streams while the previous one's bytes are still on
the wire and chunks pipeline. Every directed link's bandwidth is shared equally among the transfers
streaming across it and a transfer streams at its smallest share along the route, the
rates recomputed whenever a transfer starts or ends streaming (processor sharing, as
`interconnect/contention.py`). Alone, a transfer takes bytes / B + alpha. The send
completes (signals, frees its queue and its source) when its last byte has left; a receive
completes at the later of its start and its data's arrival (the reduction of a REDUCE
receive is done on write, at line rate: an assumption, it costs no extra time; the link
DMA's HBM traffic is not charged against the chip's HBM bandwidth, also an assumption).
Transfers pair first in, first out per (sender, receiver) pair of chips.

Exposed communication (`exposed_comm_ns`): the run's time less the time of the same
streams with free links (infinite bandwidth, no latency), as the pipeline report does;
the communication time is the union over chips of the intervals a transfer is in flight
(a send's start to its last byte's arrival); hidden = communication - exposed.

Functional mode replays the schedule on real data as `simulator/functional.py` does for
one chip (operands read at an instruction's start, results written at its end, all chips'
events in one time order): a send reads its source at its start, a receive writes at
its end. Timing never depends on the data.

Identical chips are not replayed: every chip's stream is simulated (they differ in their
link peers and block offsets; tp <= 8 chips here).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tilecc.errors import DeadlockError, SimulatorError
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.functional import _EXEC_FIELDS, FunctionalMachine, _Fields, single_threaded_torch
from tilecc.simulator.interconnect.routing import path_stats, route
from tilecc.simulator.interconnect.system import LinkConfig
from tilecc.simulator.interconnect.topology import Topology
from tilecc.simulator.isa import ITEMSIZE, DType, Opcode
from tilecc.simulator.numerics import from_storage, to_storage
from tilecc.simulator.scheduler import durations
from tilecc.simulator.timing import TimingRules

__all__ = ["ChipTimes", "MultiChipResult", "cosimulate", "exposed_comm_ns", "free_link"]

_DONE, _JOIN, _FREE, _LINK = 0, 1, 2, 3


@dataclass
class ChipTimes:
    start: np.ndarray  # cycles, per instruction
    end: np.ndarray
    finish: float  # cycles
    engine_names: list[str]
    busy: list[float]  # per engine: cycles with one of its instructions in flight


@dataclass
class MultiChipResult:
    chips: list[ChipTimes]
    finish_ns: float
    link_bytes: np.ndarray  # per directed link of the topology
    link_busy_ns: np.ndarray  # per directed link: time with at least one transfer streaming
    comm_ns: float  # the union over chips and time of link transfers in flight (send starts to arrivals)
    clock_ghz: float
    extra: dict = field(default_factory=dict)


class _Chip:
    """One chip's engine state (the general scheduler's, per chip)."""

    def __init__(self, r: int, stream: np.ndarray, config: HardwareConfig, hbm_size: int):
        self.r = r
        prog = self.prog = DecodedProgram(stream, config)
        prog.check(hbm_size)
        dur = durations(prog)
        self.first, self.second, self.third = dur.first.tolist(), dur.second.tolist(), dur.third.tolist()
        self.share, self.dma_eng = dur.share.tolist(), dur.engines.tolist()
        self.eng = prog.eng.tolist()
        self.nq = prog.queues
        self.n_eng = prog.n_engines
        self.pipelined = config.matrix.mode == "pipelined"
        self.sig = prog.col["signal_sem"].tolist()
        ws, wv = prog.col["wait_sem"], prog.col["wait_val"]
        self.waits = [[(int(s), int(v)) for s, v in zip(ws[i], wv[i]) if s >= 0] for i in range(prog.n)]
        self.sem = [0] * config.semaphores
        self.waiters: list[list[int]] = [[] for _ in range(config.semaphores)]
        self.need = [0] * self.n_eng
        self.queues = [np.flatnonzero(prog.eng == e).tolist() for e in range(self.n_eng)]
        barriers = np.flatnonzero(prog.is_barrier).tolist()
        self.barriers = barriers
        bounds = [0] + [b + 1 for b in barriers]
        limits = barriers + [prog.n]
        self.heads_k = [np.searchsorted(np.asarray(q, np.int64), bounds).tolist() for q in self.queues]
        self.tails_k = [np.searchsorted(np.asarray(q, np.int64), limits).tolist() for q in self.queues]
        self.kernel = 0
        self.head = [0] * self.n_eng
        self.tail = [0] * self.n_eng
        self.in_flight = 0
        self.done = False
        self.start = [0.0] * prog.n
        self.end = [-1.0] * prog.n
        self.join = [0.0] * prog.n
        self.stream_free = 0.0
        self.ps: list[tuple[float, int]] = []  # DMA transfers on HBM: (virtual tag, index)
        self.v_now = 0.0
        self.t_ps = 0.0
        self.slow = 1.0
        self.slowdown = TimingRules(config).dma_slowdown
        self.finish = 0.0


def _pairing(chips: list[_Chip]) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """Sequence numbers: (chip, send index) -> its number on the (chip, peer) channel, and
    (chip, receive index) -> its number on the (peer, chip) channel; checks they match."""
    send_seq: dict[tuple[int, int], int] = {}
    recv_seq: dict[tuple[int, int], int] = {}
    sent: dict[tuple[int, int], list[int]] = defaultdict(list)
    got: dict[tuple[int, int], list[int]] = defaultdict(list)
    n = len(chips)
    for c in chips:
        p = c.prog
        for i in np.flatnonzero(p.is_link).tolist():
            peer = int(p.col["k"][i])
            if not 0 <= peer < n or peer == c.r:
                raise SimulatorError(f"chip {c.r}: {p.where(i)}: peer chip {peer} is not another chip "
                                     f"of the {n} (0..{n - 1})")
            size = int(p.rows[i] * p.cols[i])
            if p.is_send[i]:
                send_seq[c.r, i] = len(sent[c.r, peer])
                sent[c.r, peer].append(size)
            else:
                recv_seq[c.r, i] = len(got[peer, c.r])
                got[peer, c.r].append(size)
    for key in set(sent) | set(got):
        if sent.get(key, []) != got.get(key, []):
            s, d = key
            raise SimulatorError(f"link transfers from chip {s} to chip {d} do not pair: sends of "
                                 f"{sent.get(key, [])} elements, receives of {got.get(key, [])}")
    return send_seq, recv_seq


def cosimulate(streams: list[np.ndarray], config: HardwareConfig, topo: Topology, link: LinkConfig,
               hbms: list[np.ndarray] | None = None) -> MultiChipResult:
    """Schedule every chip's stream together; with `hbms`, also run them on that data."""
    n = len(streams)
    if n != topo.n_chips:
        raise SimulatorError(f"{n} chip streams for a topology of {topo.n_chips} chips ({topo.spec})")
    sizes = [len(h) for h in hbms] if hbms is not None else [config.hbm.capacity_bytes] * n
    chips = [_Chip(r, s, config, sizes[r]) for r, s in enumerate(streams)]
    send_seq, recv_seq = _pairing(chips)
    ghz = config.clock_ghz
    bw = (link.bandwidth_gbs * topo.link_scale / ghz).tolist()  # bytes per cycle, per directed link
    n_links = len(topo.link_src)
    arrived: dict[tuple[int, int, int], float] = {}  # (src, dst, seq) -> arrival cycle
    waiting_recv: dict[tuple[int, int, int], tuple[int, int, float]] = {}  # -> (chip, index, start)
    heap: list[tuple[float, int, int, int, int]] = []  # (time, order, kind, chip, index)
    order = [0]
    # links: transfers streaming, with their remaining bytes and routes
    active: dict[tuple[int, int], list[int]] = {}  # (chip, index) -> route
    left: dict[tuple[int, int], float] = {}
    rate: dict[tuple[int, int], float] = {}
    link_bytes = np.zeros(n_links)
    link_intervals: list[list[tuple[float, float]]] = [[] for _ in range(n_links)]
    stream_since: dict[tuple[tuple[int, int], int], float] = {}  # ((chip, send), link) -> since
    t_link = [0.0]

    arrival: dict[tuple[int, int], float] = {}  # (chip, send) -> when its last byte arrives
    alpha_memo: dict[tuple[int, int], float] = {}

    def latency(r: int, i: int) -> float:
        """The route's latency alpha, in cycles: paid after the last byte leaves (cut-through)."""
        peer = int(chips[r].prog.col["k"][i])
        if (r, peer) not in alpha_memo:
            hops, switches, _ = path_stats(topo, np.array([r]), np.array([peer]))
            alpha_memo[r, peer] = float(link.path_latency_ns(hops, switches)[0]) * ghz
        return alpha_memo[r, peer]

    def push(t: float, kind: int, r: int, i: int) -> None:
        order[0] += 1
        heapq.heappush(heap, (t, order[0], kind, r, i))

    def rerate() -> None:
        load = np.zeros(n_links + 1)
        for rt in active.values():
            for lk in rt:
                load[lk] += 1
        for key, rt in active.items():
            rate[key] = min(bw[lk] / load[lk] for lk in rt) if rt else np.inf

    def advance_links(t: float) -> None:
        dt = t - t_link[0]
        if dt > 0:
            for key in active:
                left[key] -= rate[key] * dt
        t_link[0] = t

    def try_start(c: _Chip, e: int, t: float) -> None:
        i = c.queues[e][c.head[e]]
        for w, v in c.waits[i]:
            if c.sem[w] < v:
                c.need[e] = v
                c.waiters[w].append(e)
                return
        c.start[i] = t
        c.in_flight += 1
        p = c.prog
        if e < c.nq:
            push(t + c.first[i], _JOIN, c.r, i)
        elif e == c.nq and c.pipelined:
            streaming = max(t + c.first[i], c.stream_free)
            c.stream_free = streaming + c.second[i]
            c.join[i] = streaming
            push(streaming, _FREE, c.r, i)
            push(streaming + c.third[i], _DONE, c.r, i)
        elif e < c.nq + 2:
            push(t + c.first[i], _DONE, c.r, i)
        elif p.is_send[i]:
            push(t, _LINK, c.r, i)
        else:
            key = (int(p.col["k"][i]), c.r, recv_seq[c.r, i])
            if key in arrived:
                push(max(t, arrived.pop(key)), _DONE, c.r, i)
            else:
                waiting_recv[key] = (c.r, i, t)

    def start_kernel(c: _Chip, t: float) -> None:
        k = c.kernel
        c.head = [h[k] for h in c.heads_k]
        c.tail = [x[k] for x in c.tails_k]
        c.stream_free = t
        if all(h == x for h, x in zip(c.head, c.tail)):
            end_kernel(c, t)
            return
        for e in range(c.n_eng):
            if c.head[e] < c.tail[e]:
                try_start(c, e, t)

    def end_kernel(c: _Chip, t: float) -> None:
        c.finish = t
        if c.kernel < len(c.barriers):
            b = c.barriers[c.kernel]
            c.start[b] = c.end[b] = t
            c.sem = [0] * len(c.sem)
            c.waiters = [[] for _ in c.sem]
            c.kernel += 1
            start_kernel(c, t)
        else:
            c.done = True

    def complete(c: _Chip, i: int, t: float) -> None:
        c.end[i] = t
        c.in_flight -= 1
        e = c.eng[i]
        w = c.sig[i]
        if w >= 0:
            c.sem[w] += 1
            value = c.sem[w]
            if c.waiters[w]:
                released = [x for x in c.waiters[w] if c.need[x] <= value]
                if released:
                    c.waiters[w] = [x for x in c.waiters[w] if c.need[x] > value]
                    for x in released:
                        try_start(c, x, t)
        if not (e == c.nq and c.pipelined):
            c.head[e] += 1
            if c.head[e] < c.tail[e]:
                try_start(c, e, t)
        if c.in_flight == 0 and all(h == x for h, x in zip(c.head, c.tail)):
            end_kernel(c, t)

    def dma_next(c: _Chip) -> float:
        return c.t_ps + (c.ps[0][0] - c.v_now) * c.slow if c.ps else np.inf

    for c in chips:
        start_kernel(c, 0.0)
    while True:
        t_heap = heap[0][0] if heap else np.inf
        t_dma, who = min(((dma_next(c), c.r) for c in chips), default=(np.inf, -1))
        t_lk, key_lk = np.inf, None
        for key in active:
            tt = t_link[0] + max(left[key], 0.0) / rate[key]
            if tt < t_lk:
                t_lk, key_lk = tt, key
        t = min(t_heap, t_dma, t_lk)
        if t == np.inf:
            break
        if t_lk <= t and key_lk is not None:  # a link transfer's last byte arrives
            advance_links(t)
            r, i = key_lk
            for lk in active.pop(key_lk):
                link_intervals[lk].append((stream_since.pop((key_lk, lk)), t))
            left.pop(key_lk)
            rate.pop(key_lk)
            rerate()
            _arrive(chips[r], i, t + latency(r, i), send_seq, arrived, waiting_recv, push, arrival)
            complete(chips[r], i, t)
            continue
        if t_dma <= t_heap:
            c = chips[who]
            c.v_now, i = heapq.heappop(c.ps)
            c.t_ps = t
            c.slow = c.slowdown([c.share[x] for _, x in c.ps], [c.dma_eng[x] for _, x in c.ps])
            if not c.ps:
                c.v_now = 0.0
            complete(c, i, t)
            continue
        t, _, kind, r, i = heapq.heappop(heap)
        c = chips[r]
        if kind == _JOIN:
            if c.ps:
                c.v_now += (t - c.t_ps) / c.slow
            c.t_ps = c.join[i] = t
            heapq.heappush(c.ps, (c.v_now + c.second[i], i))
            c.slow = c.slowdown([c.share[x] for _, x in c.ps], [c.dma_eng[x] for _, x in c.ps])
        elif kind == _FREE:
            e = c.eng[i]
            c.head[e] += 1
            if c.head[e] < c.tail[e]:
                try_start(c, e, t)
        elif kind == _LINK:  # a send starts streaming
            advance_links(t)
            p = c.prog
            rt = route(topo, r, int(p.col["k"][i]))
            nbytes = float(p.rows[i] * p.cols[i] * ITEMSIZE[DType(int(p.col["a_dtype"][i]))])
            c.join[i] = t
            for lk in rt:
                link_bytes[lk] += nbytes
                stream_since[(r, i), lk] = t
            if nbytes == 0 or not rt:
                _arrive(c, i, t + latency(r, i), send_seq, arrived, waiting_recv, push, arrival)
                complete(c, i, t)
            else:
                active[r, i] = rt
                left[r, i] = nbytes
                rerate()
        else:
            complete(c, i, t)
    stuck = [c for c in chips if not c.done]
    if stuck:
        raise DeadlockError("multi-chip deadlock: " + "; ".join(_blocked(c) for c in stuck))
    times = [ChipTimes(np.array(c.start), np.array(c.end), c.finish, c.prog.engine_names, _busy(c))
             for c in chips]
    finish = max(c.finish for c in chips)
    comm = _union([(c.start[i], arrival[c.r, i]) for c in chips for i in np.flatnonzero(c.prog.is_send).tolist()])
    busy_ns = np.array([_union(iv) for iv in link_intervals]) / ghz
    res = MultiChipResult(times, finish / ghz, link_bytes, busy_ns, comm / ghz, ghz)
    if hbms is not None:
        _functional(chips, hbms, config, send_seq, recv_seq)
    return res


def free_link(link: LinkConfig) -> LinkConfig:
    """The link with infinite bandwidth and no latency: communication costs nothing."""
    return dataclasses.replace(link, bandwidth_gbs=float("inf"), latency_ns=0.0, hop_latency_ns=0.0,
                               switch_latency_ns=0.0)


def exposed_comm_ns(streams: list[np.ndarray], config: HardwareConfig, topo: Topology, link: LinkConfig,
                    res: MultiChipResult) -> tuple[float, float]:
    """(exposed, time with free links): the communication's cost to the run, its time less
    the time of the same streams with `free_link` (the same schedule rules, no data). The
    rest of the communication time `res.comm_ns` was hidden under compute."""
    free = cosimulate(streams, config, topo, free_link(link)).finish_ns
    return max(res.finish_ns - free, 0.0), free


def _arrive(c: _Chip, i: int, t: float, send_seq, arrived, waiting_recv, push, arrival) -> None:
    arrival[c.r, i] = t
    key = (c.r, int(c.prog.col["k"][i]), send_seq[c.r, i])
    if key in waiting_recv:
        r, j, start = waiting_recv.pop(key)
        push(max(t, start), _DONE, r, j)
    else:
        arrived[key] = t


def _blocked(c: _Chip) -> str:
    parts = []
    for e in range(c.n_eng):
        if c.head[e] < c.tail[e]:
            i = c.queues[e][c.head[e]]
            unmet = [f"semaphore {w} >= {v} (value {c.sem[w]})" for w, v in c.waits[i] if c.sem[w] < v]
            why = ", ".join(unmet) if unmet else (
                f"its data from chip {int(c.prog.col['k'][i])}" if c.prog.is_recv[i] else "nothing (in flight)")
            parts.append(f"{c.prog.engine_names[e]} at instruction {i} ({Opcode(int(c.prog.op[i])).name}) "
                         f"waiting on {why}")
    return f"chip {c.r} kernel {c.kernel}: " + (", ".join(parts) or "no engine blocked")


def _union(iv: list[tuple[float, float]]) -> float:
    total, hi = 0.0, -np.inf
    for a, b in sorted(iv):
        if b > hi:
            total += b - max(a, hi)
            hi = b
    return total


def _busy(c: _Chip) -> list[float]:
    s, t = np.array(c.start), np.array(c.end)
    return [_union(list(zip(s[q].tolist(), t[q].tolist()))) for q in (np.asarray(x, dtype=np.int64) for x in c.queues)]


def _functional(chips: list[_Chip], hbms: list[np.ndarray], config: HardwareConfig,
                send_seq: dict, recv_seq: dict) -> None:
    """Every chip's instructions on its data, in one time order (reads at starts, writes at ends)."""
    events = []
    machines, fields, ops, reads, writes = [], [], [], [], []
    for c, hbm in zip(chips, hbms):
        m = FunctionalMachine(config, hbm)
        m.prog = c.prog
        machines.append(m)
        fields.append(_Fields({name: c.prog.col[name].tolist() for name in _EXEC_FIELDS}))
        ops.append(c.prog.op.tolist())
        rd, wr = m.handlers()
        reads.append(rd)
        writes.append(wr)
        work = np.flatnonzero(~c.prog.is_barrier).tolist()
        for i in work:
            events.append((c.end[i], 0, c.r, i))
            events.append((c.start[i], 1, c.r, i))
    events.sort()
    channel: dict[tuple[int, int, int], np.ndarray] = {}
    pending: dict[tuple[int, int], object] = {}
    with single_threaded_torch():
        for _, is_read, r, i in events:
            c, op = chips[r], ops[r][i]
            p = c.prog
            if op == Opcode.LINK_SEND:
                if is_read:
                    channel[r, int(p.col["k"][i]), send_seq[r, i]] = _hbm_region(machines[r], p, i, "a").copy()
                continue
            if op == Opcode.LINK_RECV:
                if not is_read:
                    data = channel.pop((int(p.col["k"][i]), r, recv_seq[r, i]))
                    out = _hbm_region(machines[r], p, i, "o")
                    if p.is_reduce_recv[i]:
                        d = DType(int(p.col["o_dtype"][i]))
                        own = _hbm_region(machines[r], p, i, "a")
                        data = to_storage(from_storage(own, d) + from_storage(data, d), d)
                    out[...] = data
                continue
            inst = fields[r]
            inst.i = i
            if is_read:
                pending[r, i] = reads[r][op](inst)
            else:
                writes[r][op](inst, pending.pop((r, i)))


def _hbm_region(m: FunctionalMachine, p: DecodedProgram, i: int, slot: str) -> np.ndarray:
    s = p.col
    return m.hbm_view(int(s[f"{slot}_addr"][i]), int(p.rows[i]), int(p.cols[i]), int(s["hbm_rs"][i]),
                      int(s["hbm_cs"][i]), int(s[f"{slot}_dtype"][i]))


