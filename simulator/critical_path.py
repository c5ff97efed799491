"""The critical path of a simulated run: the chain of instructions that set its length.

A run's last instruction started when the last of its predecessors let it: a semaphore
it waited on was signalled (the producer completed), the instruction before it on the
same engine queue completed (DMA queues and the vector engine run one instruction at a
time; a pipelined matrix engine takes the next matmul once the previous one's streaming
has started), or a barrier drained. Walking back from the instruction that ends last
through that binding predecessor, each time, gives a chain that covers the whole run:
every cycle of it is either an instruction of the chain running or a wait that nothing
on the chain explains (``waiting``: a DMA slowed by transfers sharing HBM shows as its
own longer duration, not here). Shortening anything off the chain cannot shorten the
run; shortening the chain can, until another chain takes over.

    cp = critical_path(program.stream, program.config, sim.start, sim.end, program.kernels)
    cp.by_kind    {"matrix": 357_737, "dma load": 158_622, "vector": 115_645, ...}  (cycles)
    cp.by_kernel  [("k22_conv2d", 66_474, {"matrix": 20_840, ...}), ...]         (longest first)
    cp.by_family  [("k14_matmul", 16, 4_364_310, {"matrix": ..., ...}), ...]        (launches summed)

A kernel shared by identical layers (`share-kernels`) runs once per layer, its launches
named ``k14_matmul``, ``k14_matmul#1``, ...: `by_family` sums each kernel's launches
(name, launches on the chain, cycles, by kind), which says where a layer's time goes
in a model of many layers better than the longest single launches do.

The producers of the waits are the scheduler's (`scheduler.semaphore_producers`: the v-th
signaller of a semaphore in program order, exact for compiled code, where every awaited
semaphore is signalled from one engine queue). Segments are charged to the chain's
earlier instruction: ``[start(a), min(end(a), start(b))]`` to a's kind and the rest of
``[start(a), start(b)]`` to waiting, except between two matmuls of the pipelined matrix
engine, where the whole ``[start(a), start(b)]`` is the array's (its issue interval).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.isa import Opcode
from tilecc.simulator.scheduler import semaphore_producers
from tilecc.simulator.trace import kernel_membership

__all__ = ["CriticalPath", "critical_path"]

KINDS: tuple[str, ...] = ("matrix", "vector", "dma load", "dma store", "link", "barrier", "waiting")
_LAUNCH = re.compile(r"#\d+$")  # a shared kernel's later launches: ``k14_matmul#3``
_EPS = 1e-6


@dataclass
class CriticalPath:
    """The chain that sets a run's length, and its cycles by kind and by kernel."""

    cycles: float  # the run's length: the sum of every figure below
    by_kind: dict[str, float]
    by_kernel: list[tuple[str, float, dict[str, float]]]  # (kernel, cycles, by kind), longest first
    instructions: np.ndarray = field(repr=False)  # the chain's instruction indices, in time order

    @property
    def by_family(self) -> list[tuple[str, int, float, dict[str, float]]]:
        """(kernel, launches on the chain, cycles, by kind) with every launch of a shared
        kernel (``name#i``) summed into its kernel's row, longest first."""
        rows: dict[str, tuple[int, float, dict[str, float]]] = {}
        for name, cycles, d in self.by_kernel:
            base = _LAUNCH.sub("", name)
            n, c, kinds = rows.get(base, (0, 0.0, {k: 0.0 for k in KINDS}))
            rows[base] = (n + 1, c + cycles, {k: kinds[k] + d.get(k, 0.0) for k in KINDS})
        return sorted(((b, n, c, d) for b, (n, c, d) in rows.items()), key=lambda t: -t[2])

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        """JSON-friendly: the totals, the `top` kernels and the `top` kernels with their
        launches summed (`runtime/report.py` prints them)."""
        return {
            "cycles": float(self.cycles),
            "instructions": int(len(self.instructions)),
            "by_kind": {k: float(v) for k, v in self.by_kind.items()},
            "by_kernel": [{"kernel": name, "cycles": float(c), "by_kind": {k: float(v) for k, v in d.items()}}
                          for name, c, d in self.by_kernel[:top]],
            "by_family": [{"kernel": name, "launches": n, "cycles": float(c),
                           "by_kind": {k: float(v) for k, v in d.items()}}
                          for name, n, c, d in self.by_family[:top]],
        }



def _kind_of(op: np.ndarray) -> np.ndarray:
    lut = np.full(256, KINDS.index("waiting"), dtype=np.int64)
    lut[int(Opcode.MATMUL)] = KINDS.index("matrix")
    for o in (Opcode.VEC_UNARY, Opcode.VEC_BINARY, Opcode.VEC_REDUCE):
        lut[int(o)] = KINDS.index("vector")
    for o in (Opcode.DMA_LOAD, Opcode.DMA_GATHER):
        lut[int(o)] = KINDS.index("dma load")
    for o in (Opcode.DMA_STORE, Opcode.DMA_SCATTER):
        lut[int(o)] = KINDS.index("dma store")
    for o in (Opcode.LINK_SEND, Opcode.LINK_RECV):
        lut[int(o)] = KINDS.index("link")
    lut[int(Opcode.BARRIER)] = KINDS.index("barrier")
    return lut[op]


def critical_path(
    stream: np.ndarray, config: HardwareConfig, start: np.ndarray, end: np.ndarray,
    kernels: Sequence[tuple[str, int, int]] | None = None,
) -> CriticalPath:
    """The critical path of a run of `stream` whose instructions started and ended at
    `start` / `end` (`SimResult.start` / `.end`); `kernels`: (name, first record, count)
    spans (`Program.kernels`) for the per-kernel figures (None: the barrier-separated
    segments, as in the trace)."""
    prog = DecodedProgram(stream, config)
    n = prog.n
    st = np.asarray(start, dtype=np.float64)
    en = np.asarray(end, dtype=np.float64)
    if n == 0:
        return CriticalPath(0.0, {k: 0.0 for k in KINDS}, [], np.zeros(0, np.int64))
    prod = semaphore_producers(prog)
    eng = prog.eng
    # the previous instruction on the same engine queue, and the barrier a kernel follows
    prev_same = np.full(n, -1, dtype=np.int64)
    for e in np.unique(eng[eng >= 0]):
        idx = np.flatnonzero(eng == e)
        prev_same[idx[1:]] = idx[:-1]
    bar = np.flatnonzero(prog.is_barrier)
    last_bar = np.full(n, -1, dtype=np.int64)
    if bar.size:
        pos = np.searchsorted(bar, np.arange(n), side="left") - 1  # the latest barrier before i
        last_bar = np.where(pos >= 0, bar[np.maximum(pos, 0)], -1)
    pipelined = config.matrix.mode == "pipelined"
    kind = _kind_of(prog.op)

    chain = []
    cur = int(np.argmax(en))
    while cur >= 0:
        chain.append(cur)
        if prog.is_barrier[cur]:  # a barrier waits for everything since the one before
            lo = int(last_bar[cur]) + 1
            cands = [lo + int(np.argmax(en[lo:cur]))] if cur > lo else []
        else:
            cands = [int(p) for p in prod[cur] if p >= 0]
            for c in (int(prev_same[cur]), int(last_bar[cur])):
                if c >= 0:
                    cands.append(c)
        best, ready_best = -1, -np.inf
        for c in cands:
            ready = st[c] if (pipelined and prog.is_mm[cur] and c == prev_same[cur]) else en[c]
            if ready <= st[cur] + _EPS and ready > ready_best:
                best, ready_best = c, ready
        cur = best
    path = np.asarray(chain[::-1], dtype=np.int64)

    names, _, kernel_of = kernel_membership(n, prog.is_barrier, kernels)
    by_kind: dict[str, float] = {k: 0.0 for k in KINDS}
    per_kernel: dict[int, dict[str, float]] = {}

    def charge(i: int, what: str, cycles: float) -> None:
        if cycles <= 0:
            return
        by_kind[what] += cycles
        k = int(kernel_of[i])
        if k >= 0:
            d = per_kernel.setdefault(k, {kk: 0.0 for kk in KINDS})
            d[what] += cycles

    by_kind["waiting"] += max(0.0, float(st[path[0]]))  # before the chain's first instruction
    for a, b in zip(path[:-1], path[1:]):
        span = float(st[b] - st[a])
        if pipelined and prog.is_mm[b] and prev_same[b] == a:
            charge(int(a), "matrix", span)
            continue
        own = max(0.0, min(float(en[a]), float(st[b])) - float(st[a]))
        charge(int(a), KINDS[kind[a]], own)
        charge(int(a), "waiting", span - own)
    last = int(path[-1])
    charge(last, KINDS[kind[last]], float(en[last] - st[last]))
    by_kernel = sorted(((names[k], sum(d.values()), d) for k, d in per_kernel.items()), key=lambda t: -t[1])
    return CriticalPath(float(en[last]), by_kind, by_kernel, path)
