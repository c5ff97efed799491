"""Sanitisers: checks that a program is well synchronised and well behaved.

`sanitize(stream, config, start, end)` raises the first problem it finds (the one at the
lowest instruction index) as one of:

- `MemoryAccessError`: an operand outside its memory (and the other structural
  `SimulatorError`s of ``machine``'s checks, which everything else relies on);
- `DeadlockError`: waits that can never be met. Semaphores only count up within a
  kernel, so whether a kernel deadlocks does not depend on timing; the message names
  each blocked engine, its head instruction and the semaphores it waits on (awaited and
  reachable values);
- `RaceError` (`check_races`): two instructions on different engine queues touch
  overlapping bytes, at least one writing, and neither happens before the other;
- `UninitializedReadError` (`check_uninitialized`): an instruction reads SRAM or
  accumulator bytes that nothing wrote before its simulated start.

Every message names the instruction(s) as ``instruction 17 (matrix): <asm text>``
(`describe`) and the memory range or semaphores involved.

**Happens-before** (static, independent of timing). Each engine queue (each DMA queue,
``matrix``, ``vector``) runs in program order. A wait ``wait_sem[j] >= v`` adds edges
from signallers that must have completed before the wait can be met: when every
signaller of that semaphore in the kernel is on one queue, the completions come in that
queue's order, so the edge is from the v-th signaller. When signallers are on several
queues, only what holds for any timing is used: with ``T`` signals from the other
queues, a queue with ``n`` signallers must have delivered at least ``v - T`` of them,
so (if ``v > T``) the edge is from its ``(v - T)``-th signaller. A BARRIER orders
everything before it before everything after it (semaphores reset there).

The relation is computed with vector clocks (one component per queue, holding the
1-based position within the queue of the latest instruction that happens before) in
one pass over the stream in a topological order: program order, except that an
instruction whose wait is not met yet (it waits for a later signal) is parked with
everything behind it on its queue until a signal releases it, as the timing scheduler
does. A kernel whose parked instructions are never released deadlocks.

**Races** are found FastTrack style, vectorised with numpy. Footprints (the machine's
`_Program.on_chip_operands`): on-chip operands are rectangles ``[part, part + rows) x
[addr, addr + cols * itemsize)`` (matmul lhsT K x M, rhs K x N, output M x N; a REDUCE
output, a B_COLUMN operand and a gather's index column are rows x 1; a matmul with
ACCUMULATE also reads its output). HBM operands are exact strided sets, split into
contiguous byte intervals; only operands whose bounding range can meet a write on
another queue in the same kernel are split. A DMA_GATHER's rows depend on its index
data, so it counts as reading its whole table (k rows). Within each kernel and memory, the
partition and byte coordinates are compressed to the edges that occur, so each
footprint covers a few cells. Events (cell, instruction) sorted by (cell, topological
rank) give, for each event and each other queue q, the last write (and read) by q in
that cell before it; the event races when that access's position in q exceeds the
event's clock for q.

**Uninitialised reads** replay the accesses in simulated order (reads at an
instruction's start, writes at its end, an accumulating matmul's read of its output
just before it writes it; at equal times the writes first, in program order, as the
functional machine does) over a per-byte shadow of SRAM and the accumulator. Memory starts uninitialised at program start and stays written across
barriers.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tilecc.errors import (
    DeadlockError,
    MemoryAccessError,
    RaceError,
    SimulatorError,
    TileccError,
    UninitializedReadError,
)
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import (
    ITEMSIZE,
    MAX_WAITS,
    OPCODE_ENGINE,
    RECORD,
    DType,
    Engine,
    Flag,
    Mem,
    Opcode,
)
from tilecc.simulator.machine import _Program

__all__ = [
    "SyncAnalysis",
    "analyze_sync",
    "check_races",
    "check_uninitialized",
    "describe",
    "redundant_waits",
    "sanitize",
]

# (instruction index that orders problems, exception) of each problem found
_Problem = tuple[int, SimulatorError]

_SLOTS = ("a", "b", "o")
_ITEMSIZE = np.zeros(256, dtype=np.int64)
for _d in DType:
    _ITEMSIZE[int(_d)] = ITEMSIZE[_d]
_MEM_NAME = {int(Mem.HBM): "HBM", int(Mem.SRAM): "SRAM", int(Mem.ACC): "ACC"}
# footprints per chunk of kernels in the race detector (bounds its memory)
_CHUNK_FOOTPRINTS = 200_000


# ----------------------------------------------------------------------------- messages


_DMA_OPCODES = tuple(int(o) for o, e in OPCODE_ENGINE.items() if e == Engine.DMA)


def _engine_name(record: np.void) -> str:
    op = int(record["opcode"])
    if op == Opcode.BARRIER:
        return "all"
    if op in _DMA_OPCODES:
        return f"dma{int(record['queue'])}"
    if op == Opcode.MATMUL:
        return "matrix"
    if op in (Opcode.VEC_UNARY, Opcode.VEC_BINARY, Opcode.VEC_REDUCE):
        return "vector"
    return f"engine {int(record['engine'])}"


def _asm_text(record: np.void) -> str:
    from tilecc.codegen import asm  # lazy: codegen sits above the simulator

    arr = np.asarray(record, dtype=RECORD).reshape(1)
    try:
        return asm.format_instruction(arr)
    except TileccError:  # not canonical (junk in unused fields): print it anyway
        try:
            return next(asm._lines(arr))
        except Exception:  # noqa: BLE001 - a record asm cannot print at all
            return f"<opcode {int(record['opcode'])}>"


def describe(stream: np.ndarray, i: int) -> str:
    """'instruction 17 (matrix): matmul sram[p0 +0x0]:bf16, ... m=16 k=16 n=16'."""
    record = stream[int(i)]
    return f"instruction {int(i)} ({_engine_name(record)}): {_asm_text(record)}"


def _range(lo: int, hi: int) -> str:
    return f"[{lo:#x}, {hi:#x})"


def _where(mem: int, p0: int, p1: int, b0: int, b1: int) -> str:
    if mem == Mem.HBM:
        return f"HBM bytes {_range(b0, b1)}"
    return f"{_MEM_NAME[mem]} partitions [{p0}, {p1}) bytes {_range(b0, b1)}"


# ----------------------------------------------------------------------------- entry points


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
    sync = _analyze(prog, want_redundant=False)
    problems: list[_Problem] = []
    if sync.deadlock is not None:
        problems.append(sync.deadlock)
    race = _race_problem(prog, sync)
    if race is not None:
        problems.append(race)
    if sync.deadlock is None:
        if start is None or end is None:
            from tilecc.simulator.machine import simulate

            res = simulate(stream, config, None, functional=False)
            start, end = res.start, res.end
        uninit = _uninitialized_problem(prog, start, end)
        if uninit is not None:
            problems.append(uninit)
    if problems:
        raise min(problems, key=lambda p: p[0])[1]


def check_races(stream: np.ndarray, config: HardwareConfig) -> None:
    """Raise `RaceError` for the first unordered conflicting pair (by the later
    instruction), or `DeadlockError` when a kernel's waits can never be met (the
    happens-before relation is undefined beyond that point)."""
    prog = _checked_program(stream, config, None)
    sync = _analyze(prog, want_redundant=False)
    race = _race_problem(prog, sync)
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
    problem = _uninitialized_problem(prog, start, end)
    if problem is not None:
        raise problem[1]


def _checked_program(
    stream: np.ndarray, config: HardwareConfig, hbm_size: int | None
) -> _Program:
    """The machine's program view after its structure and bounds checks; their errors
    are re-raised naming the instruction with its asm text."""
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD or stream.ndim != 1:
        raise SimulatorError("the instruction stream must be a 1-D numpy array of isa.RECORD")
    prog = _Program(stream, config)
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


# ----------------------------------------------------------------------------- happens-before


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
    deadlock: _Problem | None
    redundant: np.ndarray | None

    def happens_before(self, a: int, b: int) -> bool:
        """Whether instruction a happens before instruction b (a != b, both run)."""
        if self.kernel[a] != self.kernel[b]:
            return bool(self.kernel[a] < self.kernel[b])
        qa = self.queue[a]
        if qa < 0 or self.queue[b] < 0:  # a barrier: ordered with everything
            return a < b
        return bool(self.clock[b, qa] >= self.ordinal[a]) and a != b


def analyze_sync(stream: np.ndarray, config: HardwareConfig) -> SyncAnalysis:
    """Vector clocks, topological order, deadlock and redundant waits of a stream."""
    prog = _checked_program(stream, config, None)
    return _analyze(prog, want_redundant=True)


def redundant_waits(stream: np.ndarray, config: HardwareConfig) -> np.ndarray:
    """bool [n, MAX_WAITS]: wait slots implied by program order and the instruction's
    other waits (transitively), which a scheduler may drop."""
    red = analyze_sync(stream, config).redundant
    assert red is not None
    return red


def _analyze(prog: _Program, want_redundant: bool) -> SyncAnalysis:
    with _gc_paused():  # the walk allocates a clock per instruction
        return _analyze_walk(prog, want_redundant)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: scanning a heap of millions of small lists
    again and again would make the walk quadratic."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _analyze_walk(prog: _Program, want_redundant: bool) -> SyncAnalysis:
    n, nq = prog.n, prog.queues + 2
    s = prog.col
    stream_records = _records(prog)
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
    w_sem_l, w_val_l, w_slot_l, w_src_l = w_sem.tolist(), w_val.tolist(), wj.tolist(), w_src.tolist()

    eng = eng_np.tolist()
    ordv = ordinal_np.tolist()
    sig = s["signal_sem"].tolist()
    signallers = np.flatnonzero(s["signal_sem"] >= 0)

    zero = [0] * nq
    clocks: list[list[int]] = [zero] * n
    rank = [-1] * n
    red_hits: list[int] = []  # flat wait numbers found redundant
    counter = 0
    deadlock: _Problem | None = None
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
                for x in kernel_signallers.tolist():
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
            vc = cur[e]
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
                    _mark_redundant(k0, k1, cur[e], wait_sources, eng, ordv, clocks, red_hits)
            if vc is cur[e]:
                vc = vc.copy()
            vc[e] = ordv[i]
            clocks[i] = vc
            cur[e] = vc
            rank[i] = counter
            counter += 1
            w = sig[i]
            if w >= 0:
                value = sem_count[w] + 1
                sem_count[w] = value
                lst = parked.get(w)
                if lst:
                    released = [x for x in lst if need[x] <= value]
                    if released:
                        parked[w] = [x for x in lst if need[x] > value]
                        ready.extend(released)

        def park(e: int, blocked: tuple[int, int]) -> None:
            w, v = blocked
            need[e] = v
            parked.setdefault(w, []).append(e)

        def drain() -> None:
            while ready:
                e = ready.pop()
                queue = pending[e]
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
    prog.stream_records = stream_records
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
    prog: _Program, kernel: np.ndarray, wi: np.ndarray, w_sem: np.ndarray, w_val: np.ndarray
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


def _records(prog: _Program) -> np.ndarray:
    """The stream as records again (for messages), rebuilt from the program's columns."""
    rec = getattr(prog, "stream_records", None)
    if rec is None:
        rec = np.empty(prog.n, dtype=RECORD)
        for name in RECORD.names:
            rec[name] = prog.col[name]
        prog.stream_records = rec
    return rec


def _mark_redundant(k0, k1, base, wait_sources, eng, ordv, clocks, hits) -> None:
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
    prog, records, kernel, stuck, pending, ptr, w_sem, w_val, sem_count
) -> _Problem:
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


# ----------------------------------------------------------------------------- footprints


@dataclass
class _Footprints:
    """One row per operand access: instruction, slot (0 a, 1 b, 2 o), memory, the
    rectangle [p0, p1) x [b0, b1) (HBM: partition 0, an exact byte interval, several
    rows per operand), and whether it writes."""

    instr: np.ndarray
    slot: np.ndarray
    mem: np.ndarray
    p0: np.ndarray
    p1: np.ndarray
    b0: np.ndarray
    b1: np.ndarray
    write: np.ndarray

    FIELDS: ClassVar[tuple[str, ...]] = ("instr", "slot", "mem", "p0", "p1", "b0", "b1", "write")

    @staticmethod
    def concat(parts: list[_Footprints]) -> _Footprints:
        return _Footprints(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in _Footprints.FIELDS)
        )

    def take(self, idx: np.ndarray) -> _Footprints:
        return _Footprints(*(getattr(self, f)[idx] for f in _Footprints.FIELDS))

    def __len__(self) -> int:
        return len(self.instr)


def _on_chip_footprints(prog: _Program) -> _Footprints:
    s = prog.col
    parts: list[_Footprints] = []
    acc_read = prog.is_mm & ((prog.flags & Flag.ACCUMULATE) != 0)
    for slot_i, (slot, mask, nrows, ncols) in enumerate(prog.on_chip_operands()):
        uses = [(mask, slot == "o")]
        if slot == "o":
            uses.append((acc_read, False))
        for m, write in uses:
            idx = np.flatnonzero(m)
            p0 = s[f"{slot}_part"][idx].astype(np.int64)
            b0 = s[f"{slot}_addr"][idx].astype(np.int64)
            nbytes = ncols[idx] * _ITEMSIZE[s[f"{slot}_dtype"][idx]]
            parts.append(
                _Footprints(
                    instr=idx,
                    slot=np.full(idx.size, slot_i, dtype=np.int64),
                    mem=s[f"{slot}_mem"][idx].astype(np.int64),
                    p0=p0,
                    p1=p0 + nrows[idx],
                    b0=b0,
                    b1=b0 + nbytes,
                    write=np.full(idx.size, write),
                )
            )
    return _Footprints.concat(parts)


def _hbm_shape(prog: _Program, idx: np.ndarray) -> tuple[np.ndarray, ...]:
    """(rows, cols, row stride, column stride) in elements of the HBM operands of
    instructions `idx`. A DMA_GATHER may read any row of its table, so its footprint is
    the whole table (k rows of `cols` contiguous elements)."""
    s = prog.col
    gather = prog.is_gather[idx] if hasattr(prog, "is_gather") else np.zeros(idx.size, bool)
    rows = np.where(gather, prog.k[idx], prog.rows[idx])
    cs = np.where(gather, 1, s["hbm_cs"][idx])
    return rows, prog.cols[idx], s["hbm_rs"][idx], cs


def _hbm_operands(prog: _Program) -> list[tuple[str, np.ndarray]]:
    ops = list(prog.hbm_operands())
    if hasattr(prog, "is_gather"):
        ops.append(("a", prog.is_gather))
    return ops


def _hbm_bounding(prog: _Program) -> _Footprints:
    """HBM operands with their bounding byte ranges (exact when contiguous)."""
    s = prog.col
    parts = []
    for slot, mask in _hbm_operands(prog):
        idx = np.flatnonzero(mask)
        isz = _ITEMSIZE[s[f"{slot}_dtype"][idx]]
        addr = s[f"{slot}_addr"][idx].astype(np.int64)
        rows, cols, rs, cs = _hbm_shape(prog, idx)
        tr = (rows - 1) * rs * isz
        tc = (cols - 1) * cs * isz
        lo = addr + np.minimum(tr, 0) + np.minimum(tc, 0)
        hi = addr + np.maximum(tr, 0) + np.maximum(tc, 0) + isz
        parts.append(
            _Footprints(
                instr=idx,
                slot=np.full(idx.size, _SLOTS.index(slot), dtype=np.int64),
                mem=np.full(idx.size, int(Mem.HBM), dtype=np.int64),
                p0=np.zeros(idx.size, dtype=np.int64),
                p1=np.ones(idx.size, dtype=np.int64),
                b0=lo,
                b1=hi,
                write=np.full(idx.size, slot == "o"),
            )
        )
    return _Footprints.concat(parts)


def _hbm_intervals(prog: _Program, i: int) -> list[tuple[int, int]]:
    """The exact bytes of instruction i's HBM operand as merged [lo, hi) intervals."""
    s = prog.col
    slot = "o" if prog.op[i] == Opcode.DMA_STORE else "a"
    isz = ITEMSIZE[DType(int(s[f"{slot}_dtype"][i]))]
    addr = int(s[f"{slot}_addr"][i])
    rows, cols, rs, cs = (int(x[0]) for x in _hbm_shape(prog, np.array([i])))
    if rows == 1 or rs == 0:
        rows, rs = 1, 0
    if cols == 1 or cs == 0:
        cols, cs = 1, 0
    if rows > 1 and cs == 1 and rs == cols or rows == 1 and abs(cs) == 1:
        lo = addr + min(0, (cols - 1) * cs) * isz
        return [(lo, lo + rows * cols * isz)]  # one contiguous block
    if cols > 1 and abs(cs) == 1 or cols == 1:
        # rows of contiguous runs
        width = cols * isz
        first = addr + min(0, (cols - 1) * cs) * isz
        starts = first + np.arange(rows, dtype=np.int64) * (rs * isz)
        ends = starts + width
    elif abs(rs) == 1:
        width = rows * isz
        first = addr + min(0, (rows - 1) * rs) * isz
        starts = first + np.arange(cols, dtype=np.int64) * (cs * isz)
        ends = starts + width
    else:
        r = np.arange(rows, dtype=np.int64)[:, None] * rs
        c = np.arange(cols, dtype=np.int64)[None, :] * cs
        starts = (addr + (r + c) * isz).ravel()
        ends = starts + isz
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    out: list[tuple[int, int]] = []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _merge(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _overlaps(L: np.ndarray, H: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each [lo, hi) meets the union of sorted disjoint [L, H)."""
    if L.size == 0:
        return np.zeros(lo.size, dtype=bool)
    k = np.searchsorted(L, hi, side="left") - 1
    ok = k >= 0
    return ok & (H[np.maximum(k, 0)] > lo)


# ----------------------------------------------------------------------------- races


def _race_problem(prog: _Program, sync: SyncAnalysis) -> _Problem | None:
    runs = sync.rank >= 0
    chip = _on_chip_footprints(prog)
    chip = chip.take(np.flatnonzero(runs[chip.instr]))
    hbm = _hbm_bounding(prog)
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
        found = _detect(prog, sync, _Footprints.concat(fps), k0)
        if found is not None:
            return found
    return None


def _hbm_candidates(prog: _Program, sync: SyncAnalysis, fp: _Footprints, k0: int) -> _Footprints:
    """The HBM accesses whose bounding range meets a write on another queue (or that
    write and meet any access on another queue), split into exact byte intervals."""
    if len(fp) == 0 or not fp.write.any():
        return fp.take(np.zeros(0, dtype=np.int64))
    q = sync.queue[fp.instr]
    lo, hi = _dense_keys(sync.kernel[fp.instr] - k0, fp.b0, fp.b1)
    cand = np.zeros(len(fp), dtype=bool)
    for queue in np.unique(q).tolist():
        mine = q == queue
        wL, wH = _merge(lo[mine & fp.write], hi[mine & fp.write])
        aL, aH = _merge(lo[mine], hi[mine])
        others = ~mine
        cand |= others & (_overlaps(wL, wH, lo, hi) | (fp.write & _overlaps(aL, aH, lo, hi)))
    idx = np.flatnonzero(cand)
    if idx.size == 0:
        return fp.take(idx)
    rows: list[tuple[int, int, bool, int, int]] = []
    for j in idx.tolist():
        i = int(fp.instr[j])
        for b0, b1 in _hbm_intervals(prog, i):
            rows.append((i, int(fp.slot[j]), bool(fp.write[j]), b0, b1))
    arr = np.array([(r[0], r[1], r[3], r[4]) for r in rows], dtype=np.int64).reshape(-1, 4)
    m = arr.shape[0]
    return _Footprints(
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


def _detect(prog: _Program, sync: SyncAnalysis, fp: _Footprints, k0: int) -> _Problem | None:
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
    prog: _Program, fp: _Footprints, fx: int, partner: int, partner_writes: bool
) -> _Problem:
    records = _records(prog)
    x = int(fp.instr[fx])
    mem = int(fp.mem[fx])
    # the partner's operand that overlaps x's operand
    cands = np.flatnonzero(
        (fp.instr == partner) & (fp.mem == mem) & (fp.write == partner_writes)
        & (fp.p0 < fp.p1[fx]) & (fp.p1 > fp.p0[fx]) & (fp.b0 < fp.b1[fx]) & (fp.b1 > fp.b0[fx])
    )
    fy = int(cands[0]) if cands.size else fx
    slot_x, slot_y = _SLOTS[int(fp.slot[fx])], _SLOTS[int(fp.slot[fy])]
    if mem == Mem.HBM:
        xs = _hbm_intervals(prog, x)
        ys = _hbm_intervals(prog, partner)
        common = [
            (max(a0, b0), min(a1, b1))
            for a0, a1 in xs
            for b0, b1 in ys
            if max(a0, b0) < min(a1, b1)
        ]
        lo, hi = min(c[0] for c in common), max(c[1] for c in common)
        nbytes = sum(c[1] - c[0] for c in common)
        where = f"HBM bytes {_range(lo, hi)}"
        if nbytes != hi - lo:
            where += f" ({nbytes} bytes in that range)"
    else:
        p0 = max(int(fp.p0[fx]), int(fp.p0[fy]))
        p1 = min(int(fp.p1[fx]), int(fp.p1[fy]))
        b0 = max(int(fp.b0[fx]), int(fp.b0[fy]))
        b1 = min(int(fp.b1[fx]), int(fp.b1[fy]))
        where = _where(mem, p0, p1, b0, b1)
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


# ----------------------------------------------------------------------------- uninitialised


def _uninitialized_problem(prog: _Program, start: np.ndarray, end: np.ndarray) -> _Problem | None:
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    if start.shape != (prog.n,) or end.shape != (prog.n,):
        raise SimulatorError(
            f"start/end must hold one time per instruction ({prog.n}), got shapes "
            f"{start.shape} and {end.shape}"
        )
    fp = _on_chip_footprints(prog)
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
    with _gc_paused():
        best = _replay(order, fp, shadow)
    if best is None:
        return None
    i, f, rect = best
    slot = _SLOTS[int(fp.slot[f])]
    role, when = prog.role(i, slot), start[i]
    if slot == "o":  # an accumulating matmul, at its end
        role, when = "output (accumulate reads it)", end[i]
    message = (
        f"{describe(_records(prog), i)}: reads uninitialised {_where(*rect)} "
        f"({role}): nothing wrote those bytes before cycle {when:g}"
    )
    return i, UninitializedReadError(message, i)


def _replay(
    order: np.ndarray, fp: _Footprints, shadow: dict[int, np.ndarray]
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

