"""The -O2 matmul kernel: blocked GEMM with on-chip transposes and multi-buffered loads.

The matrix engine computes ``acc[M x N] (+)= lhsT[K x M]^T @ rhs[K x N]`` with K on
partitions for both operands. B (``[K, N]``, row-major) loads as it is; A (``[M, K]``)
would need an element-strided DMA (one descriptor per element, ~2-byte chunks), which
is what the -O0 kernel does. Here A loads in its natural layout (``[m rows, k cols]``,
one descriptor per row) and is transposed on the matrix engine by a matmul with an
identity (``a^T @ I``), the result copied from the accumulator into a resident
``lhsT`` buffer. Schedule, per batch index::

    for each block of nb m-tiles (TM rows each):          # nb chosen by SRAM capacity
        for j, kt: load A[m_j, k_t] -> transpose -> lhsT[j][:, kt]   # once per block
        for n-chunks of TNL columns (two per loop iteration, accumulator sets 0 / 1):
            for kt (unrolled): load B[k_t, n-chunk] into rhs[kt % D]  # D-deep prefetch
                for j, sub-tile t: matmul lhsT[j][kt], rhs[t] -> acc[set][j][t]
            for j: copy acc -> out buffer, store the TM x TNL tile

- A is read once per m-block, B once per m-block (``nb * TM`` rows reuse each B tile),
  the output written once: HBM traffic is compulsory traffic times ``1 + M/(nb TM)``
  for B.
- B loads are ``TNL`` columns wide so each row is at least ``dma.efficient_chunk_bytes``;
  the matmuls use ``TN``-column windows of them (``tile.subview``).
- ``D`` rotating rhs buffers let the loads of the next k tiles run ahead of the
  matmuls; the two accumulator / output sets let the evacuation (vector copy and store)
  of one n-chunk overlap the matmuls of the next.

All sizes are static (edge tiles are peeled in Python), so the kernel works for any
M, K, N. Returns False when even one m-tile's ``lhsT`` does not fit SRAM; the caller
then uses the -O0 kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr, f32, i1
from xdsl.ir import Operation, SSAValue

from tilecc.ir import tile
from tilecc.passes.kernel_builder import KernelBuilder

ALIGN = 64
MAX_BLOCK = 8  # m-tiles per block (bounded by SRAM and the accumulator)
RHS_DEPTH = 4  # rotating rhs buffers


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def lower_matmul_blocked(lw, op: Operation, loc: str) -> bool:
    from tilecc.passes.graph_to_tile import _dense, _elem, _itemsize, _shape, matmul_dims

    dims = matmul_dims(op)
    if dims is None:
        return False
    res, out_shape, a, b, M, K, N = dims
    rank = len(out_shape)
    ea, eb, eo = _elem(a.type), _elem(b.type), _elem(res.type)
    ia, ib, io = _itemsize(ea), _itemsize(eb), _itemsize(eo)
    cfg = lw.cfg
    P = cfg.sram.partitions
    TM = min(cfg.accumulator.partitions, P, cfg.matrix.rows, cfg.matrix.cols)
    TK = min(cfg.matrix.rows, P)
    TN = min(cfg.matrix.cols, cfg.accumulator.bytes_per_partition // 4)
    nk = -(-K // TK)
    tw = max(1, min(4, nk, cfg.matrix.cols // TM))  # transposes per accumulator tile (one copy)
    ncol = -(-N // TN)
    # rhs loads as wide as the accumulator allows (long DMA transfers amortise the fixed
    # per-transfer latency); D of them in flight
    latency_bytes = (cfg.dma.latency_cycles + cfg.hbm.latency_cycles) * cfg.hbm.bytes_per_cycle

    def plan(nb: int) -> tuple[int, int, int] | None:
        """(w, D, KC) for a block of nb m-tiles, or None if it does not fit."""
        acc_left = cfg.accumulator.bytes_per_partition - 2 * _align(tw * TM * 4)
        w = min(ncol, 16, acc_left // (2 * nb * _align(TN * 4)))
        if w < 1:
            return None
        tile_bytes = min(K, TK) * w * TN * ib
        D = 1 if nk == 1 else max(2, min(8, nk, -(-int(latency_bytes) // max(tile_bytes, 1)) + 1))
        KC = K
        while True:
            sram = (2 * _align(KC * ia) + _align(TM * ia) + D * _align(w * TN * ib)
                    + nb * _align(nk * TM * ia) + 2 * nb * _align(w * TN * io))
            if sram <= cfg.sram.bytes_per_partition:
                return w, D, KC
            if KC > TK:
                KC = max(TK, (KC // 2) // TK * TK)
            elif D > 2:
                D -= 1
            elif w > 1:
                w -= 1
            else:
                return None

    nb = min(MAX_BLOCK, -(-M // TM))
    chosen = None
    while nb > 0 and (chosen := plan(nb)) is None:
        nb -= 1
    if chosen is None:
        return False
    w, D, KC = chosen
    TNL = w * TN
    nkc = -(-K // KC)
    # DMA queues: stores use the last one (tile-to-npu); B tiles the first Q-2, A rows the
    # one before the stores, so neither waits in line behind a store or the other
    Q = cfg.dma.queues
    q_rhs = max(1, Q - 2) if Q >= 3 else 1
    q_a = Q - 2 if Q >= 3 else 0

    A = lw._aligned_batch(a, out_shape[:-2], (M, K))
    B = lw._aligned_batch(b, out_shape[:-2], (K, N))
    ident = lw.hbm([TM, TM], ea, value=_dense(np.eye(TM, dtype=np.float32), ea, [TM, TM]))
    out = lw.hbm(out_shape, eo)
    kb = KernelBuilder(lw.kernel_name("matmul"), [A.value.type, B.value.type, ident.type, out.type], loc)
    argA, argB, argI, argO = kb.args
    c = kb.const
    true, false = _bool(kb, True), _bool(kb, False)

    # buffers, allocated once at the top of the kernel
    ibuf = kb.alloc([TM, TM], ea, tile.SRAM, "ident")
    kb.add(tile.LoadOp(argI, [c(0), c(0)], ibuf, c(TM), c(TM), 0, 1))
    a_nat = [kb.alloc([TM, KC], ea, tile.SRAM, "a") for _ in range(2)]
    acc_t = [kb.alloc([TK, tw * TM], f32, tile.ACC, "acc_t") for _ in range(2)]
    lhsT = [kb.alloc([TK, nk * TM], ea, tile.SRAM, "lhsT") for _ in range(nb)]
    rhs = [kb.alloc([TK, TNL], eb, tile.SRAM, "rhs") for _ in range(D)]
    acc = [[[kb.alloc([TM, TN], f32, tile.ACC, "acc") for _ in range(w)] for _ in range(nb)] for _ in range(2)]
    obuf = [[kb.alloc([TM, TNL], eo, tile.SRAM, "out") for _ in range(nb)] for _ in range(2)]

    def window(buf: SSAValue, col: int, shape: Sequence[int]) -> SSAValue:
        if col == 0 and list(shape) == list(_shape(buf.type)):
            return buf
        return kb.add(tile.SubviewOp(buf, c(0), c(col), shape)).results[0]

    lhsT_win = [[window(lhsT[j], kt * TM, [TK, TM]) for kt in range(nk)] for j in range(nb)]
    rhs_win = [[window(rhs[d], t * TN, [TK, TN]) for t in range(w)] for d in range(D)]
    out_win = [[[window(obuf[s][j], t * TN, [TM, TN]) for t in range(w)] for j in range(nb)] for s in range(2)]
    ksz = [min(TK, K - kt * TK) for kt in range(nk)]
    ivs: list[SSAValue] = []
    counter = [0]

    def batch_idx(o) -> list[SSAValue]:
        return [ivs[d] if o.imap[d] is not None else c(0) for d in range(rank - 2)]

    def n_chunk(m_base: SSAValue, msz: list[int], n0: SSAValue, ncols: int, s: int) -> None:
        subs = [(t, min(TN, ncols - t * TN)) for t in range(-(-ncols // TN))]
        for kt in range(nk):
            rb = counter[0] % D
            counter[0] += 1
            kb.add(tile.LoadOp(argB, [*batch_idx(B), c(kt * TK), n0], rhs[rb], c(ksz[kt]), c(ncols), rank - 2, rank - 1,
                                queue=rb % q_rhs))
            for j, ms in enumerate(msz):
                for t, cs in subs:
                    kb.add(tile.MatmulOp(lhsT_win[j][kt], rhs_win[rb][t], acc[s][j][t], c(ms), c(ksz[kt]), c(cs),
                                         true if kt else false))
        for j, ms in enumerate(msz):
            for t, cs in subs:
                kb.add(tile.UnaryOp("copy", acc[s][j][t], out_win[s][j][t], c(ms), c(cs)))
            m0 = kb.addi(m_base, c(j * TM)) if j else m_base
            kb.add(tile.StoreOp(obuf[s][j], argO, [*ivs, m0, n0], c(ms), c(ncols), rank - 2, rank - 1))

    a_win = [[window(a_nat[q], (kt * TK) % KC, [TM, min(TK, KC - (kt * TK) % KC)]) for kt in range(nk)] for q in range(2)]
    t_win = [[window(acc_t[q], u * TM, [TK, TM]) for u in range(tw)] for q in range(2)]
    t_dst = {}

    def m_block(m_base: SSAValue, msz: list[int]) -> None:
        """Load the block's A rows (KC columns per DMA), transpose them on the matrix
        engine (tw k-tiles per accumulator tile, one vector copy each) into lhsT."""
        load_n, tile_n = 0, 0
        for j, ms in enumerate(msz):
            m0 = kb.addi(m_base, c(j * TM)) if j else m_base
            for kc in range(nkc):
                q = load_n % 2
                load_n += 1
                cols = min(KC, K - kc * KC)
                kb.add(tile.LoadOp(argA, [*batch_idx(A), m0, c(kc * KC)], a_nat[q], c(ms), c(cols),
                                   rank - 2, rank - 1, queue=q_a))
                kts = list(range(kc * KC // TK, -(-(kc * KC + cols) // TK)))
                for g0 in range(0, len(kts), tw):
                    group = kts[g0:g0 + tw]
                    t = tile_n % 2
                    tile_n += 1
                    for u, kt in enumerate(group):
                        kb.add(tile.MatmulOp(a_win[q][kt], ibuf, t_win[t][u], c(ksz[kt]), c(ms), c(ms), false))
                    # one copy of the group: columns u*TM.. of acc_t -> lhsT columns kt0*TM..
                    kt0, width = group[0], len(group) * TM
                    key = (j, kt0, width)
                    if key not in t_dst:
                        t_dst[key] = window(lhsT[j], kt0 * TM, [TK, width])
                    src = acc_t[t] if width == tw * TM else window(acc_t[t], 0, [TK, width])
                    rows = max(ksz[kt] for kt in group)
                    if ms == TM and len({ksz[kt] for kt in group}) == 1:
                        kb.add(tile.UnaryOp("copy", src, t_dst[key], c(rows), c(width)))
                    else:  # a short m tile leaves gaps between the transposed k tiles
                        for u, kt in enumerate(group):
                            kb.add(tile.UnaryOp("copy", t_win[t][u], lhsT_win[j][kt], c(ksz[kt]), c(ms)))
        pairs, rest = divmod(N, 2 * TNL)
        if pairs:
            with kb.loop(pairs) as i:
                n0 = kb.muli(i, c(2 * TNL)) if pairs > 1 else c(0)
                n_chunk(m_base, msz, n0, TNL, 0)
                n_chunk(m_base, msz, kb.addi(n0, c(TNL)), TNL, 1)
        base = pairs * 2 * TNL
        s = 0
        while rest > 0:
            cols = min(TNL, rest)
            n_chunk(m_base, msz, c(base), cols, s)
            base, rest, s = base + cols, rest - cols, 1 - s

    def body() -> None:
        MB = nb * TM
        full, rem = divmod(M, MB)
        if full:
            with kb.loop(full) as i:
                m_block(kb.muli(i, c(MB)) if full > 1 else c(0), [TM] * nb)
        if rem:
            msz = [TM] * (rem // TM) + ([rem % TM] if rem % TM else [])
            m_block(c(full * MB), msz)

    lw._outer_loops(kb, out_shape[:-2], ivs, body)
    lw.launch(kb, [A.value, B.value, ident, out])
    lw.values[res] = out
    return True


def _bool(kb: KernelBuilder, value: bool) -> SSAValue:
    return kb._add_entry(arith.ConstantOp(IntegerAttr(int(value), i1)))
