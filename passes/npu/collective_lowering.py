"""npu-collective-lowering: a collective's schedule (simulator/interconnect/schedule.py:
steps of point-to-point transfers between chip buffers) lowered into one chip's
LINK_SEND / LINK_RECV records.

The schedule side says *what* moves (every algorithm of simulator/interconnect/algorithms/
as steps of (src, dst, offset, count, reduce) transfers over one buffer per chip); this
file says how chip `rank` does its part in its own instruction stream, with the chunked
ring's conventions (passes/npu/collectives.py): sends on link queue 0 signal semaphore 0,
receives on link queue 1 signal semaphore 1, so "semaphore 1 >= k" means "my first k
receives are done" (a queue runs in order).

- The buffer is two HBM regions: X (the chip's contribution, never written) and Y (the
  result). An element is read from X until a receive has written it in Y, from Y after
  (an all-gather works in place: X = Y, every element already "written").
- A transfer of `count` elements is cut into `chunks` pieces (bounds(): the sender and
  the receiver cut alike, so the pieces pair first in, first out); a piece of step t+1
  waits only for the receives of step t that wrote its bytes, so the pieces pipeline.
- Records go out in step order, a step's sends before its receives; each send waits
  for the last earlier receive that wrote any of its bytes (read after write) and each
  receive for the last earlier send that read any of the bytes it writes (write after
  read: a step's sends read the values from before the step, the schedule's rule).
  Receives write in queue order, so a REDUCE receive reads its own operand after every
  earlier receive has written it. Both rules are by byte range, found here, so every
  algorithm gets its hazards from one place.

Deadlock-free by construction: a send of step t waits only on receives of steps < t, a
receive of step t only on sends of steps <= t, and both queues run in step order.

Before (step 0 of halving-doubling all-reduce, n = 2, 8 elements; chip 1's part):

    Step(src=[0 1], dst=[1 0], src_off=[4 0], dst_off=[4 0], count=[4 4], reduce=[T T])
    Step(src=[0 1], dst=[1 0], src_off=[0 4], dst_off=[0 4], count=[4 4], reduce=[F F])

After (`lower_schedule(sched, 1, X, Y, f32)`, chunks = 1):

    link.send l0 hbm[X+0 ...]:f32 -> chip0 1x4                      signal(s0)   step 0: lower half from x
    link.recv l1 chip0 + hbm[X+16 ...]:f32 -> hbm[Y+16 ...]:f32 1x4  signal(s1)   upper half summed into y
    link.send l0 hbm[Y+16 ...]:f32 -> chip0 1x4    wait(s1 >= 1)     signal(s0)   step 1: my reduced half
    link.recv l1 chip0 -> hbm[Y+0 ...]:f32 1x4                       signal(s1)   the partner's reduced half
"""

from __future__ import annotations

import numpy as np

from tilecc.errors import TileccError
from tilecc.simulator.interconnect.schedule import Schedule, bounds
from tilecc.simulator.isa import ITEMSIZE, DType, Engine, Flag, Mem, Opcode, empty_stream

__all__ = ["LINK_QUEUES", "lower_schedule"]

LINK_QUEUES = (0, 1)  # link queue of the sends, of the receives (the ring's)
_SEND_SEM, _RECV_SEM = 0, 1


class CollectiveLoweringError(TileccError):
    """A schedule that cannot be lowered into link records as given (names the transfer)."""


def lower_schedule(sched: Schedule, rank: int, x_addr: int, y_addr: int, dtype: DType,
                   chunks: int = 1) -> np.ndarray:
    """Chip `rank`'s records of `sched` (see the module docstring): X at `x_addr`, Y at
    `y_addr`, the buffer of `sched.elements` elements of `dtype`; `x_addr == y_addr`
    works in place (an all-gather)."""
    if not 0 <= rank < sched.n:
        raise CollectiveLoweringError(f"rank {rank} is not a chip of the {sched.n}")
    if chunks < 1:
        raise CollectiveLoweringError(f"chunks must be >= 1, got {chunks}")
    b = _Builder(sched.elements, x_addr, y_addr, dtype)
    for t, step in enumerate(sched.steps):
        mine_s = np.flatnonzero(step.src == rank).tolist()
        mine_r = np.flatnonzero(step.dst == rank).tolist()
        for j in mine_s:
            for lo, cnt in _pieces(int(step.src_off[j]), int(step.count[j]), chunks):
                b.send(int(step.dst[j]), lo, cnt, t)
        for j in mine_r:
            for lo, cnt in _pieces(int(step.dst_off[j]), int(step.count[j]), chunks):
                b.recv(int(step.src[j]), lo, cnt, bool(step.reduce[j]), t)
    out = sched.io_slices(rank)[1]
    if sched.collective in ("all_reduce", "reduce_scatter") and not b.written[out].all():
        raise CollectiveLoweringError(f"{sched.algorithm} {sched.collective}: chip {rank}'s result "
                                      f"[{out.start}, {out.stop}) is not all written by its receives")
    return b.records()


def _pieces(lo: int, count: int, chunks: int) -> list[tuple[int, int]]:
    out = []
    for c in range(min(chunks, count)):
        a, e = bounds(lo, count, min(chunks, count), c)
        out.append((int(a), int(e - a)))
    return out


class _Builder:
    def __init__(self, elements: int, x_addr: int, y_addr: int, dtype: DType):
        self.isz = ITEMSIZE[dtype]
        self.dtype, self.x, self.y = dtype, x_addr, y_addr
        self.written = np.full(elements, x_addr == y_addr)
        self.recs: list[dict] = []
        self.reads: list[tuple[int, int, int]] = []  # sends: (byte lo, byte hi, ordinal)
        self.writes: list[tuple[int, int, int]] = []  # receives: (byte lo, byte hi, ordinal)

    def _source(self, lo: int, cnt: int, t: int, what: str) -> int:
        """Where elements [lo, lo + cnt) are now: X, or Y once received."""
        w = self.written[lo: lo + cnt]
        if w.all():
            return self.y + lo * self.isz
        if not w.any():
            return self.x + lo * self.isz
        raise CollectiveLoweringError(f"step {t}: the {what} of elements [{lo}, {lo + cnt}) reads some from the "
                                      "input and some from the result (a schedule this lowering does not split)")

    def send(self, peer: int, lo: int, cnt: int, t: int) -> None:
        a = self._source(lo, cnt, t, "send")
        hi = a + cnt * self.isz
        after = max((o for wl, wh, o in self.writes if wl < hi and a < wh), default=0)
        self.reads.append((a, hi, len(self.reads) + 1))
        self.recs.append(dict(opcode=Opcode.LINK_SEND, queue=LINK_QUEUES[0], a_dtype=self.dtype,
                              o_dtype=self.dtype, a_mem=Mem.HBM, a_addr=a, rows=1, cols=cnt, hbm_rs=cnt,
                              hbm_cs=1, k=peer, signal_sem=_SEND_SEM, wait=(_RECV_SEM, after)))

    def recv(self, peer: int, lo: int, cnt: int, reduce: bool, t: int) -> None:
        own = self._source(lo, cnt, t, "reduction") if reduce else 0
        o = self.y + lo * self.isz
        hi = o + cnt * self.isz
        after = max((s for rl, rh, s in self.reads if rl < hi and o < rh), default=0)
        self.written[lo: lo + cnt] = True
        self.writes.append((o, hi, len(self.writes) + 1))
        self.recs.append(dict(opcode=Opcode.LINK_RECV, queue=LINK_QUEUES[1], flags=Flag.REDUCE if reduce else 0,
                              a_dtype=self.dtype, o_dtype=self.dtype, a_mem=Mem.HBM, o_mem=Mem.HBM, a_addr=own,
                              o_addr=o, rows=1, cols=cnt, hbm_rs=cnt, hbm_cs=1, k=peer, signal_sem=_RECV_SEM,
                              wait=(_SEND_SEM, after)))

    def records(self) -> np.ndarray:
        s = empty_stream(len(self.recs))
        for i, fields in enumerate(self.recs):
            s["engine"][i] = int(Engine.LINK)
            sem, val = fields.pop("wait")
            for key, value in fields.items():
                s[key][i] = int(value)
            if val > 0:
                s["wait_sem"][i, 0] = sem
                s["wait_val"][i, 0] = val
        return s
