"""npu-collectives: a graph-level all-reduce (reduce-scatter, all-gather) lowered into one
chip's instruction stream.

The chunked ring (Patarasuk and Yuan 2009; NCCL's ring): the tensor of S elements is cut
into n blocks (one per chip), each block into C chunks. Reduce-scatter: n-1 steps; in
step t chip r sends block (r-t-1) mod n to chip r+1, which writes its own contribution
plus the data into its output (the reduction is done on write, flag REDUCE); after it,
chip r holds the sum of block r. All-gather: n-1 steps; in step t chip r forwards block
(r-t) mod n to chip r+1, which overwrites. A chunk's next send waits only for that
chunk's previous receive, so the chunks pipeline over the links, and a kernel that reads
the result waits (through `codegen/link.py`, by HBM byte range) only on the receives of
the chunks it reads.

Before (the collective, between the kernel that stores x and the kernels reading y):

    all_reduce(x: f32[E] at X) -> y: f32[E] at Y        n chips, this chip r, C chunks

After (chip r = 1 of n = 2, C = 1, E = 8; send queue l0, receive queue l1; semaphore 0
counts this chip's completed sends, 1 its completed receives):

    link.send l0 hbm[X+0 ...]:f32 -> chip0 1x4                   signal(s0)   block 0 from x
    link.recv l1 chip0 + hbm[X+16 ...]:f32 -> hbm[Y+16 ...]:f32 1x4 signal(s1)   block 1 summed
    link.send l0 hbm[Y+16 ...]:f32 -> chip0 1x4  wait(s1 >= 1)   signal(s0)   block 1 forwarded
    link.recv l1 chip0 -> hbm[Y+0 ...]:f32 1x4                   signal(s1)   block 0 received

`ring_reduce_scatter` and `ring_all_gather` are the two halves alone (sequence
parallelism): after the first, chip r's block r of its buffer is the sum; the second
starts from every chip's block r in place. One stream per chip: the peers and the block
offsets depend on the rank, so each chip gets its own records (the kernels around them
are every chip's same records).
Hazards inside the collective are ordered here: a send of Y waits for the receive that
wrote it (read after write), and an all-gather receive into a block waits for the
reduce-scatter send that read it (write after read); receives write in queue order.
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.interconnect.schedule import bounds
from tilecc.simulator.isa import ITEMSIZE, DType, Engine, Flag, Mem, Opcode, empty_stream

__all__ = ["RING_QUEUES", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]

RING_QUEUES = (0, 1)  # link queue of the sends, of the receives
_SEND_SEM, _RECV_SEM = 0, 1


def ring_all_reduce(rank: int, n: int, x_addr: int, y_addr: int, elements: int, dtype: DType,
                    chunks: int = 1) -> np.ndarray:
    """Chip `rank`'s records of a ring all-reduce of `elements` elements of `dtype` from
    HBM `x_addr` (its contribution, left unchanged) into HBM `y_addr` (the sum)."""
    return _ring(rank, n, x_addr, y_addr, elements, dtype, chunks, True, True)


def ring_reduce_scatter(rank: int, n: int, x_addr: int, y_addr: int, elements: int, dtype: DType,
                        chunks: int = 1) -> np.ndarray:
    """The reduce-scatter half: chip `rank` ends with block `rank` of the sum at its place in
    the `elements`-element buffer at `y_addr` (the other blocks of it hold partial sums)."""
    return _ring(rank, n, x_addr, y_addr, elements, dtype, chunks, True, False)


def ring_all_gather(rank: int, n: int, y_addr: int, elements: int, dtype: DType, chunks: int = 1) -> np.ndarray:
    """The all-gather half: chip `rank`'s block `rank` is already at its place in the
    `elements`-element buffer at `y_addr` (its producer wrote it there); every chip ends
    with the whole buffer."""
    return _ring(rank, n, y_addr, y_addr, elements, dtype, chunks, False, True)


def _ring(rank: int, n: int, x_addr: int, y_addr: int, elements: int, dtype: DType, chunks: int,
          scatter: bool, gather: bool) -> np.ndarray:
    if n < 2:
        raise ValueError(f"a ring collective needs at least 2 chips, got {n}")
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    isz = ITEMSIZE[dtype]
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    recs: list[dict] = []
    n_send = n_recv = 0
    rs_recv: dict[tuple[int, int], int] = {}  # (step, chunk) -> the receive's ordinal (1-based)
    rs_send: dict[tuple[int, int], int] = {}
    ag_recv: dict[tuple[int, int], int] = {}

    def piece(block: int, c: int) -> tuple[int, int]:
        lo, hi = bounds(0, elements, n, block)
        a, b = bounds(lo, hi - lo, chunks, c)
        return int(a), int(b - a)

    def send(src: int, off: int, count: int, wait: int) -> int:
        nonlocal n_send
        recs.append(dict(opcode=Opcode.LINK_SEND, queue=RING_QUEUES[0], a_dtype=dtype, o_dtype=dtype,
                         a_mem=Mem.HBM, a_addr=src + off * isz, rows=1, cols=count, hbm_rs=count, hbm_cs=1,
                         k=nxt, signal_sem=_SEND_SEM, wait=(_RECV_SEM, wait)))
        n_send += 1
        return n_send

    def recv(off: int, count: int, reduce: bool, wait: tuple[int, int]) -> int:
        nonlocal n_recv
        recs.append(dict(opcode=Opcode.LINK_RECV, queue=RING_QUEUES[1], flags=Flag.REDUCE if reduce else 0,
                         a_dtype=dtype, o_dtype=dtype, a_mem=Mem.HBM, o_mem=Mem.HBM,
                         a_addr=x_addr + off * isz if reduce else 0, o_addr=y_addr + off * isz,
                         rows=1, cols=count, hbm_rs=count, hbm_cs=1, k=prv, signal_sem=_RECV_SEM, wait=wait))
        n_recv += 1
        return n_recv

    for t in range(n - 1 if scatter else 0):  # reduce-scatter
        b_s, b_r = (rank - t - 1) % n, (rank - t - 2) % n
        for c in range(chunks):
            off, cnt = piece(b_s, c)
            if cnt:
                rs_send[t, c] = send(x_addr if t == 0 else y_addr, off, cnt, rs_recv.get((t - 1, c), 0))
            off, cnt = piece(b_r, c)
            if cnt:
                rs_recv[t, c] = recv(off, cnt, True, (-1, 0))
    for t in range(n - 1 if gather else 0):  # all-gather
        b_s, b_r = (rank - t) % n, (rank - t - 1) % n
        for c in range(chunks):
            off, cnt = piece(b_s, c)
            if cnt:
                got = (rs_recv[n - 2, c] if scatter else 0) if t == 0 else ag_recv[t - 1, c]
                send(y_addr, off, cnt, got)
            off, cnt = piece(b_r, c)
            if cnt:
                war = (_SEND_SEM, rs_send[t, c]) if t >= 1 and scatter else (-1, 0)
                ag_recv[t, c] = recv(off, cnt, False, war)
    return _records(recs)


def _records(recs: list[dict]) -> np.ndarray:
    s = empty_stream(len(recs))
    for i, fields in enumerate(recs):
        s["engine"][i] = int(Engine.LINK)
        sem, val = fields.pop("wait")
        for key, value in fields.items():
            s[key][i] = int(value)
        if sem >= 0 and val > 0:
            s["wait_sem"][i, 0] = sem
            s["wait_val"][i, 0] = val
    return s


def main(argv: list[str] | None = None) -> int:
    """`python -m tilecc.passes.npu.collectives --chips N --rank R --elements E [--chunks C]
    [--x ADDR --y ADDR --dtype f32]`: print chip R's lowered all-reduce (the FileCheck tests)."""
    import argparse

    from tilecc.simulator.isa import DTYPE_BY_NAME
    from tilecc.simulator.listing import instruction_lines

    ap = argparse.ArgumentParser(prog="python -m tilecc.passes.npu.collectives")
    ap.add_argument("--chips", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--elements", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--x", type=lambda s: int(s, 0), default=0)
    ap.add_argument("--y", type=lambda s: int(s, 0), default=0x1000)
    ap.add_argument("--dtype", choices=sorted(DTYPE_BY_NAME), default="f32")
    a = ap.parse_args(argv)
    recs = ring_all_reduce(a.rank, a.chips, a.x, a.y, a.elements, DTYPE_BY_NAME[a.dtype], a.chunks)
    print("\n".join(instruction_lines(recs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
