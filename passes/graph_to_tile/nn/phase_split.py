"""Phase images on the matrix engine: the strided gathers of `pad_kernel` at -O2.

A phase image takes every sw-th element of each row, which a DMA reads element by
element; here 0/1 selection matmuls pick the phases instead, so every DMA moves
contiguous rows:

    %x [1, 24, 30, 34] -> phases (0, 0) (0, 1) (1, 0) (1, 1) of a 3x3 stride-2 window
      per unit:  tile.matmul %x_rows, %identity -> %acc_t     (positions onto partitions)
                 tile.matmul %xT, %select -> %acc_s           (each phase's row segment)
                 tile.unary "copy" %acc_s -> %phases; ... tile.store %phases -> %xq[n, c, ph, ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, SSAValue

from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.nn.common import (
    ALIGN,
    HbmKernel,
    as_index,
    cdiv,
    consts_2d,
    false_i1,
    fill_row,
    lin,
    partition_bytes,
    present,
    sram_budget,
    sub,
    tiles,
    true_i1,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.geometry import PhaseSpec
from tilecc.passes.graph_to_tile.nn.queues import QueueModel, queue_split, store_queues
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

# A phase image takes every sw-th element of each row. DMAs read on-chip and HBM rows
# contiguously (an element stride costs a descriptor and a short chunk per element), and
# vector ops walk contiguous columns too, so the matrix engine does the selection: a
# matmul with a 0/1 matrix picks and reorders the contraction (partition) dimension.
#
# - `_phase_split_channels` (channels on partitions): per unit of a few output rows,
#   the unit's input positions are transposed onto partitions (a matmul with the
#   identity), then a selection matmul ``acc[c, n] = sum_k T[k, c] S[k, n]`` writes the
#   unit's row segment of every phase; a rank-1 accumulate adds a non-zero fill value.
# - `_phase_split_rows` (few channels, e.g. an image): per channel, rows on partitions;
#   ``(X^T R_a)`` picks the rows of row phase a (transposed), ``(.)^T C_b`` the columns
#   of column phase b, so each phase image comes out whole with rows on partitions.
#
# The products are exact for finite values (one term x * 1, the others x * 0); an
# infinite or NaN input spreads NaN over the positions sharing its unit.

_FEW_CHANNELS = 4


def phase_split(
    lw: LoweringContext, what: str, loc: str, x: SSAValue, out: SSAValue, spec: PhaseSpec,
) -> bool:
    """The phase images built on the matrix engine (`pad_kernel` at -O2); False where no
    unit of the selection fits."""
    C = value_shape(x)[1]
    if C <= _FEW_CHANNELS and spec.fill_value == 0.0:
        if _phase_split_rows(lw, what, loc, x, out, spec):
            return True
    return _phase_split_channels(lw, what, loc, x, out, spec)


Segments = tuple[tuple[int, int, int, int], ...]  # (first input row, rows, first column, columns)


@dataclass
class _ChannelSplit:
    """The plan of `_phase_split_channels`: units of `g` output rows x a block of
    columns, their kinds (units with the same contraction layout and selection share
    one: segments, K, selection, fill), and bands of units that fit SRAM."""

    TC: int  # channels per tile
    KMAX: int  # contraction rows of a unit
    NMAX: int  # columns of a selection
    g: int  # output rows per unit
    units: list[tuple[int, int]]  # output rows [i0, i1)
    blocks: list[tuple[int, int]]  # output columns [j0, j1)
    kind_data: list[tuple[Segments, int, np.ndarray, np.ndarray]]
    unit_kind: dict[tuple[int, int], int]  # (unit, block) -> kind
    needs_fill: list[bool]  # per kind: a rank-1 fill accumulate (padding positions)
    s_blocks: list[np.ndarray]
    f_blocks: list[np.ndarray]
    bands: list[tuple[int, int]]  # units [u0, u1)
    band_xrows: list[tuple[int, int]]  # per band: its first and last input row
    max_xrows: int
    max_qrows: int


def _plan_channel_split(
    cfg: HardwareConfig, shape: tuple[int, ...], isz: int, spec: PhaseSpec,
) -> _ChannelSplit | None:
    """Units, kinds and bands of a channel split of an input of `shape` ([N, C, H, W],
    `isz`-byte elements); None where no unit fits the array."""
    _, C, H, W = shape
    phases, Hq, Wq, fill_value = spec.phases, spec.Hq, spec.Wq, spec.fill_value
    (sh, sw), (pt, pl) = spec.s, spec.pad
    nph = len(phases)
    row_res = sorted({a for a, _ in phases})
    col_res = sorted({b for _, b in phases})
    KMAX = min(cfg.matrix.rows, cfg.sram.partitions, cfg.accumulator.partitions)
    NMAX = cfg.matrix.cols
    TC = min(cfg.sram.partitions, C, cfg.accumulator.partitions, cfg.matrix.cols, cfg.matrix.rows)
    nrow_i = len(row_res)  # input rows per output row
    cspan = col_res[-1] - col_res[0]

    def wlen(jl: int) -> int:
        return min(W, (jl - 1) * sw + cspan + 1)

    # unit = g output rows x a block of jl columns: K = input positions, N = outputs
    if nph * Wq <= NMAX and nrow_i * W <= KMAX:
        jl = Wq
        g = 1
        while (g + 1) <= Hq and nph * (g + 1) * Wq <= NMAX and (g + 1) * nrow_i * W <= KMAX:
            g += 1
    else:
        g = 1
        jl = 0
        for cand in range(min(Wq, NMAX // nph), 0, -1):
            if nrow_i * wlen(cand) <= KMAX:
                jl = cand
                break
        if jl == 0:
            return None
    full = jl == Wq
    blocks = [(j0, min(Wq, j0 + jl)) for j0 in range(0, Wq, jl)]
    units = [(i0, min(Hq, i0 + g)) for i0 in range(0, Hq, g)]

    def block_cols(j0: int, j1: int) -> tuple[int, int]:
        lo = max(0, j0 * sw + col_res[0] - pl)
        hi = min(W - 1, (j1 - 1) * sw + col_res[-1] - pl)
        return lo, hi

    # the layout of one unit's contraction: segments (first input row relative to the
    # unit's base row i0*sh, rows, first column, columns), in order
    def layout(i0: int, i1: int, j0: int, j1: int) -> tuple[Segments, int]:
        lo, hi = block_cols(j0, j1)
        hs = sorted({i * sh + a - pt for i in range(i0, i1) for a in row_res if 0 <= i * sh + a - pt < H})
        if lo > hi or not hs:
            return (), lo
        segs: list[list[int]] = []
        for h in hs:
            if full and lo == 0 and hi == W - 1 and segs and segs[-1][0] + segs[-1][1] == h - i0 * sh:
                segs[-1][1] += 1
            else:
                segs.append([h - i0 * sh, 1])
        return tuple((r, n, lo, hi - lo + 1) for r, n in segs), lo

    def matrices(
        i0: int, i1: int, j0: int, j1: int,
    ) -> tuple[Segments, int, np.ndarray, np.ndarray]:
        segs, _ = layout(i0, i1, j0, j1)
        K = sum(n * wc for _, n, _, wc in segs)
        gi, jn = i1 - i0, j1 - j0
        Nn = nph * gi * jn
        S = np.zeros((max(K, 1), Nn), dtype=np.float32)
        F = np.zeros((1, Nn), dtype=np.float32)
        kpos: dict[tuple[int, int], int] = {}
        k = 0
        for r, n, c0, wc in segs:
            for rr in range(n):
                for w in range(c0, c0 + wc):
                    kpos[(i0 * sh + r + rr, w)] = k
                    k += 1
        for ph, (a, b) in enumerate(phases):
            for il in range(gi):
                for jj in range(jn):
                    col = ph * gi * jn + il * jn + jj
                    h = (i0 + il) * sh + a - pt
                    w = (j0 + jj) * sw + b - pl
                    if 0 <= h < H and 0 <= w < W:
                        S[kpos[(h, w)], col] = 1.0
                    else:
                        F[0, col] = fill_value
        return segs, K, S, F

    # unit kinds: the same relative layout and matrices (interior units share one)
    kinds: dict[tuple[Segments, int, int, bytes, bytes], int] = {}
    kind_data: list[tuple[Segments, int, np.ndarray, np.ndarray]] = []
    unit_kind: dict[tuple[int, int], int] = {}
    for ui, (i0, i1) in enumerate(units):
        for bi, (j0, j1) in enumerate(blocks):
            segs, K, S, F = matrices(i0, i1, j0, j1)
            key = (segs, i1 - i0, bi, S.tobytes(), F.tobytes())
            if key not in kinds:
                kinds[key] = len(kind_data)
                kind_data.append((segs, K, S, F))
            unit_kind[(ui, bi)] = kinds[key]
    needs_fill = [bool(np.any(kd[3] != 0)) or kd[1] == 0 for kd in kind_data]
    s_blocks = [kd[2] for kd in kind_data]
    f_blocks = [kd[3] for kd in kind_data]

    # bands of units whose input rows and phase rows fit SRAM
    budget = cfg.sram.bytes_per_partition - 4 * ALIGN
    fixed = (
        4 * partition_bytes(TC, isz)  # T, four sets
        + partition_bytes(TC, isz)  # identity
        + partition_bytes(len(kind_data) * NMAX, isz)  # selections
        + partition_bytes(len(kind_data) * NMAX, isz)  # fills
        + partition_bytes(TC, isz)  # ones
    )

    def band_rows(u0: int, u1: int) -> tuple[int, int]:
        i0, i1 = units[u0][0], units[u1 - 1][1]
        hs = [i * sh + a - pt for i in range(i0, i1) for a in row_res]
        lo, hi = max(0, min(hs)), min(H - 1, max(hs))
        return lo, max(lo, hi)

    def band_bytes(u0: int, u1: int) -> int:
        lo, hi = band_rows(u0, u1)
        nrows = units[u1 - 1][1] - units[u0][0]
        return partition_bytes((hi - lo + 1) * W, isz) + partition_bytes(nph * nrows * Wq, isz)

    UB = len(units)
    while UB > 1 and max(band_bytes(u, min(len(units), u + UB)) for u in range(0, len(units), UB)) + fixed > budget:
        UB = cdiv(UB, 2)
    if band_bytes(0, 1) + fixed > budget:
        return None
    bands = [(u, min(len(units), u + UB)) for u in range(0, len(units), UB)]
    max_xrows = max(band_rows(u0, u1)[1] - band_rows(u0, u1)[0] + 1 for u0, u1 in bands)
    max_qrows = max(units[u1 - 1][1] - units[u0][0] for u0, u1 in bands)
    return _ChannelSplit(TC, KMAX, NMAX, g, units, blocks, kind_data, unit_kind, needs_fill, s_blocks, f_blocks,
                         bands, [band_rows(u0, u1) for u0, u1 in bands], max_xrows, max_qrows)


def _phase_split_channels(
    lw: LoweringContext, what: str, loc: str, x: SSAValue, out: SSAValue, spec: PhaseSpec,
) -> bool:
    """Channels on partitions: per unit of output rows, a transpose and a selection matmul."""
    N, C, H, W = value_shape(x)
    elem = value_elem(x)
    isz = element_size(elem)
    phases, sh, Wq = spec.phases, spec.s[0], spec.Wq
    plan = _plan_channel_split(lw.cfg, (N, C, H, W), isz, spec)
    if plan is None:
        return False
    TC, KMAX, NMAX, g, units, blocks = plan.TC, plan.KMAX, plan.NMAX, plan.g, plan.units, plan.blocks
    kind_data, unit_kind, needs_fill = plan.kind_data, plan.unit_kind, plan.needs_fill
    bands, max_xrows, max_qrows = plan.bands, plan.max_xrows, plan.max_qrows
    nph = len(phases)
    ident, _ = consts_2d(lw, [np.eye(TC, dtype=np.float32)], TC, TC, elem)
    sel, scols = consts_2d(lw, plan.s_blocks, NMAX, KMAX, elem)
    fill_elem = elem
    fills, fcols = consts_2d(lw, plan.f_blocks, NMAX, 1, fill_elem)
    ones = fill_row(lw, 1.0, fill_elem, TC)
    xv = lw.view(x, (N, C, H * W))
    Hq = spec.Hq
    out_flat = lw.view(out, (N, C, nph * Hq * Wq))
    k = HbmKernel(lw, what, loc, [xv, ident, sel, fills, ones, out, out_flat])
    kb = k.kb
    xa, oa, oa_flat = k.arg(xv), k.arg(out), k.arg(out_flat)
    xb = kb.alloc([TC, max_xrows * W], elem, tile.SRAM, "x")
    qb = kb.alloc([TC, nph * max_qrows * Wq], elem, tile.SRAM, "phases")
    ib = kb.alloc([TC, TC], elem, tile.SRAM, "identity")
    sb = kb.alloc([KMAX, scols], elem, tile.SRAM, "select")
    fb = kb.alloc([1, fcols], fill_elem, tile.SRAM, "fill")
    ob = kb.alloc([1, TC], fill_elem, tile.SRAM, "ones")
    NS = 4  # buffer sets: units in flight
    tbs = [kb.alloc([KMAX, TC], elem, tile.SRAM, "xT") for _ in range(NS)]
    a1s = [kb.alloc([KMAX, TC], f32, tile.ACC, "acc_t") for _ in range(NS)]
    a2s = [kb.alloc([TC, NMAX], f32, tile.ACC, "acc_s") for _ in range(NS)]
    # loops of NS units in whole rows: each phase's segments of the NS units side by side
    # (one selection matmul per unit and phase), so one copy per phase moves all of them,
    # and the NS transposes copied at once (per unit, four ~64 x 29 copies cost ~190 cycles
    # of fixed overhead each: ResNet-18's 56 x 56 split was vector-bound at ~40,000 cycles)
    gjn = g * Wq
    acc_need = (NS * (partition_bytes(TC, 4) + partition_bytes(NMAX, 4))
                + 2 * (partition_bytes(NS * TC, 4) + partition_bytes(nph * NS * gjn, 4)))
    batched = len(blocks) == 1 and C % TC == 0 and acc_need <= lw.cfg.accumulator.bytes_per_partition
    if batched:  # two sets: one batch's selections while the other's copies run
        tbB = [kb.alloc([KMAX, NS * TC], elem, tile.SRAM, "xT_units") for _ in range(2)]
        a1B = [kb.alloc([KMAX, NS * TC], f32, tile.ACC, "acc_t_units") for _ in range(2)]
        a2B = [kb.alloc([TC, nph * NS * gjn], f32, tile.ACC, "acc_s_units") for _ in range(2)]
    # DMA queues: the constants on the weight queues, the input rows and the phases'
    # stores (short, so mostly fixed latency) side by side on the others (`queue_split`)
    cq, sq = queue_split(lw.cfg)[0], store_queues(lw.cfg)
    kb.add(tile.LoadOp(k.arg(ident), [kb.const(0), kb.const(0)], ib, kb.const(TC), kb.const(TC), 0, 1,
                       queue=cq[0]))
    kb.add(tile.LoadOp(k.arg(sel), [kb.const(0), kb.const(0)], sb, kb.const(KMAX), kb.const(scols), 0, 1,
                       queue=cq[1 % len(cq)]))
    kb.add(tile.LoadOp(k.arg(fills), [kb.const(0), kb.const(0)], fb, kb.const(1), kb.const(fcols), 0, 1,
                       queue=cq[0]))
    kb.add(tile.LoadOp(k.arg(ones), [kb.const(0)], ob, kb.const(1), kb.const(TC), -1, 0, queue=cq[1 % len(cq)]))

    def geom(ui: int | SSAValue, bi: int) -> tuple[int, int, int, SSAValue]:
        gi = (units[0][1] - units[0][0]) if isinstance(ui, SSAValue) else (units[ui][1] - units[ui][0])
        j0, j1 = blocks[bi]
        return gi, j0, j1 - j0, as_index(kb, ui)

    def unit_a(c: SSAValue, ui: int | SSAValue, bi: int, kind: int, bset: int, xh0: int) -> None:
        """Transpose unit `ui` (an index or an affine SSA value) of block `bi` onto partitions."""
        segs, K, _, _ = kind_data[kind]
        gi, j0, jn, ui_v = geom(ui, bi)
        a1, tb = a1s[bset], tbs[bset]
        if not K:
            return
        koff = 0
        for r, nr, cw0, wc in segs:
            # input row (i0 * sh + r) of the band starting at row xh0
            pos = lin(kb, (r - xh0) * W + cw0, (g * sh * W, ui_v))
            m = nr * wc
            kb.add(tile.MatmulOp(
                sub(kb, xb, 0, pos, [TC, m]), ib, sub(kb, a1, koff, 0, [m, TC]),
                kb.const(m), c, c, false_i1(kb),
            ))
            koff += m
        kb.add(tile.UnaryOp("copy", sub(kb, a1, 0, 0, [K, TC]), sub(kb, tb, 0, 0, [K, TC]), kb.const(K), c))

    def unit_b(c: SSAValue, ui: int | SSAValue, bi: int, kind: int, bset: int, qi0: int) -> None:
        """Select unit `ui`'s phase segments and copy them into the phase images."""
        segs, K, _, _ = kind_data[kind]
        gi, j0, jn, ui_v = geom(ui, bi)
        Nn = nph * gi * jn
        a2, tb = a2s[bset], tbs[bset]
        if K:
            kb.add(tile.MatmulOp(
                sub(kb, tb, 0, 0, [K, TC]), sub(kb, sb, 0, kind * NMAX, [K, Nn]), sub(kb, a2, 0, 0, [TC, Nn]),
                c, kb.const(K), kb.const(Nn), false_i1(kb),
            ))
        if needs_fill[kind]:
            kb.add(tile.MatmulOp(
                ob, sub(kb, fb, 0, kind * NMAX, [1, Nn]), sub(kb, a2, 0, 0, [TC, Nn]),
                c, kb.const(1), kb.const(Nn), true_i1(kb) if K else false_i1(kb),
            ))
        for ph in range(nph):
            dst = lin(kb, ph * max_qrows * Wq - qi0 * Wq + j0, (g * Wq, ui_v))
            kb.add(tile.UnaryOp(
                "copy", sub(kb, a2, 0, ph * gi * jn, [TC, gi * jn]), sub(kb, qb, 0, dst, [TC, gi * jn]),
                c, kb.const(gi * jn),
            ))

    def units_a(c: SSAValue, uis: list[SSAValue], kind: int, xh0: int, bs: int) -> None:
        """NS consecutive units of whole rows (`batched`): their transposes into one
        accumulator of set `bs`, one copy."""
        segs, K, _, _ = kind_data[kind]
        if not K:
            return
        for q, ui_v in enumerate(uis):
            koff = 0
            for r, nr, cw0, wc in segs:
                pos = lin(kb, (r - xh0) * W + cw0, (g * sh * W, ui_v))
                m = nr * wc
                kb.add(tile.MatmulOp(
                    sub(kb, xb, 0, pos, [TC, m]), ib, sub(kb, a1B[bs], koff, q * TC, [m, TC]),
                    kb.const(m), c, c, false_i1(kb),
                ))
                koff += m
        kb.add(tile.UnaryOp("copy", sub(kb, a1B[bs], 0, 0, [K, NS * TC]), sub(kb, tbB[bs], 0, 0, [K, NS * TC]),
                            kb.const(K), kb.const(NS * TC)))

    def units_b(c: SSAValue, uis: list[SSAValue], kind: int, qi0: int, bs: int) -> None:
        """Per unit and phase a selection matmul into that phase's run of the set's
        accumulator, then one copy per phase into the phase images."""
        segs, K, _, _ = kind_data[kind]
        for q in range(NS):
            for ph in range(nph):
                dst = sub(kb, a2B[bs], 0, (ph * NS + q) * gjn, [TC, gjn])
                if K:
                    kb.add(tile.MatmulOp(
                        sub(kb, tbB[bs], 0, q * TC, [K, TC]), sub(kb, sb, 0, kind * NMAX + ph * gjn, [K, gjn]), dst,
                        c, kb.const(K), kb.const(gjn), false_i1(kb),
                    ))
                if needs_fill[kind]:
                    kb.add(tile.MatmulOp(
                        ob, sub(kb, fb, 0, kind * NMAX + ph * gjn, [1, gjn]), dst,
                        c, kb.const(1), kb.const(gjn), true_i1(kb) if K else false_i1(kb),
                    ))
        for ph in range(nph):
            dst = lin(kb, ph * max_qrows * Wq - qi0 * Wq, (g * Wq, uis[0]))
            kb.add(tile.UnaryOp(
                "copy", sub(kb, a2B[bs], 0, ph * NS * gjn, [TC, NS * gjn]), sub(kb, qb, 0, dst, [TC, NS * gjn]),
                c, kb.const(NS * gjn),
            ))

    def batches(c: SSAValue, u: int, nbat: int, kind: int, xh0: int, qi0: int) -> None:
        """`nbat` batches of NS units from unit u, software pipelined over two sets: batch
        b + 1's transposes and copy are emitted before batch b's selections and copies."""

        def uis(b0: int, t: SSAValue | None = None) -> list[SSAValue]:
            if t is None:
                return [kb.const(u + b0 * NS + q) for q in range(NS)]
            return [lin(kb, u + b0 * NS + q, (2 * NS, t)) for q in range(NS)]

        units_a(c, uis(0), kind, xh0, 0)
        npair = (nbat - 1) // 2
        if npair:
            with kb.loop(npair) as t:  # batches 2t + 1 (set 1) and 2t + 2 (set 0) transposed
                units_a(c, uis(1, t), kind, xh0, 1)
                units_b(c, uis(0, t), kind, qi0, 0)
                units_a(c, uis(2, t), kind, xh0, 0)
                units_b(c, uis(1, t), kind, qi0, 1)
        last = 2 * npair  # transposed (set 0), not yet selected
        if last + 1 < nbat:
            units_a(c, uis(last + 1), kind, xh0, 1)
            units_b(c, uis(last), kind, qi0, 0)
            units_b(c, uis(last + 1), kind, qi0, 1)
        else:
            units_b(c, uis(last), kind, qi0, 0)

    # software pipelined: a unit's transposes and copy (stage A) are emitted before the
    # previous unit's selection and copies (stage B), so the vector engine copies one
    # unit while the matrix engine selects another (each queue runs in program order)
    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        bset = 0
        pending: list[tuple] = []  # stage B of the unit before

        def flush() -> None:
            while pending:
                unit_b(c, *pending.pop(0))

        for (u0, u1), (xlo, xhi) in zip(bands, plan.band_xrows):
            qi0 = units[u0][0]
            kb.add(tile.LoadOp(xa, [n, c0, kb.const(xlo * W)], sub(kb, xb, 0, 0, [TC, (xhi - xlo + 1) * W]),
                               c, kb.const((xhi - xlo + 1) * W), 1, 2, queue=sq[-1]))
            for bi in range(len(blocks)):
                # runs of consecutive units of one kind: a loop over pairs of units
                # (two buffer sets), the odd one out unrolled
                u = u0
                while u < u1:
                    kind = unit_kind[(u, bi)]
                    v = u
                    while v < u1 and unit_kind[(v, bi)] == kind:
                        v += 1
                    count = v - u
                    if count >= 2 * NS and batched and units[u][1] - units[u][0] == g:
                        flush()
                        batches(c, u, count // NS, kind, xlo, qi0)
                        rest = range(u + count // NS * NS, v)
                    elif count >= 2 * NS:
                        flush()
                        with kb.loop(count // NS) as t:
                            uis = [lin(kb, u + q, (NS, t)) for q in range(NS)]
                            for q in range(NS):
                                unit_a(c, uis[q], bi, kind, q, xlo)
                            for q in range(NS):
                                unit_b(c, uis[q], bi, kind, q, qi0)
                        rest = range(u + count // NS * NS, v)
                    else:
                        rest = range(u, v)
                    for w_ in rest:
                        unit_a(c, w_, bi, kind, bset, xlo)
                        if len(pending) >= NS - 1:
                            unit_b(c, *pending.pop(0))
                        pending.append((w_, bi, kind, bset, qi0))
                        bset = (bset + 1) % NS
                    u = v
            flush()
            rows = units[u1 - 1][1] - qi0
            if qi0 == 0 and rows == Hq == max_qrows:
                # the band holds every phase row: per channel the buffer's phases lie as in
                # HBM (phase after phase), so one store writes them all (a store per phase
                # pays ~3,100 cycles of fixed cost each on `cloud`)
                kb.add(tile.StoreOp(
                    sub(kb, qb, 0, 0, [TC, nph * Hq * Wq]), oa_flat, [n, c0, kb.const(0)], c,
                    kb.const(nph * Hq * Wq), 1, 2, queue=sq[0],
                ))
                continue
            for ph in range(nph):
                kb.add(tile.StoreOp(
                    sub(kb, qb, 0, ph * max_qrows * Wq, [TC, rows * Wq]), oa,
                    [n, c0, kb.const(ph), kb.const(qi0 * Wq)], c, kb.const(rows * Wq), 1, 3,
                    queue=sq[ph % len(sq)],
                ))
    k.launch()
    return True


def _phase_split_rows(
    lw: LoweringContext, what: str, loc: str, x: SSAValue, out: SSAValue, spec: PhaseSpec,
) -> bool:
    """Few channels, zero fill: per channel the image with rows on partitions; the phase
    images come out whole (rows on partitions) and are stored with one DMA each."""
    phases, s, pad, Hq, Wq = spec.phases, spec.s, spec.pad, spec.Hq, spec.Wq
    cfg = lw.cfg
    N, C, H, W = value_shape(x)
    elem = value_elem(x)
    isz = element_size(elem)
    (sh, sw), (pt, pl) = s, pad
    KMAX = min(cfg.matrix.rows, lw.P)
    MMAX = min(cfg.accumulator.partitions, lw.P)
    NMAX = cfg.matrix.cols
    if Hq > min(NMAX, MMAX) or Wq > NMAX:
        return False
    row_res = sorted({a for a, _ in phases})
    col_res = sorted({b for _, b in phases})
    hch = [(h0, min(H, h0 + KMAX)) for h0 in range(0, H, KMAX)]
    wstep = min(KMAX, MMAX)
    wch = [(w0, min(W, w0 + wstep)) for w0 in range(0, W, wstep)]
    # R[a][hc][h, i] = 1 iff row h0 + h is row i of row phase a; Cm[b][wc][w, j] likewise
    rblocks, rkey = [], {}
    for a in row_res:
        for hi, (h0, h1) in enumerate(hch):
            R = np.zeros((h1 - h0, Hq), dtype=np.float32)
            for i in range(Hq):
                h = i * sh + a - pt
                if h0 <= h < h1:
                    R[h - h0, i] = 1.0
            if R.any():
                rkey[(a, hi)] = len(rblocks)
                rblocks.append(R)
    cblocks, ckey = [], {}
    for b in col_res:
        for wi, (w0, w1) in enumerate(wch):
            Cm = np.zeros((w1 - w0, Wq), dtype=np.float32)
            for j in range(Wq):
                w = j * sw + b - pl
                if w0 <= w < w1:
                    Cm[w - w0, j] = 1.0
            if Cm.any():
                ckey[(b, wi)] = len(cblocks)
                cblocks.append(Cm)
    # a phase whose rows or columns are all padding is all zeros
    empty = [not any((a, hi) in rkey for hi in range(len(hch))) or not any((b, wi) in ckey for wi in range(len(wch)))
             for a, b in phases]
    # consecutive phase images are consecutive rows in HBM: up to g of them share a tile
    # (phase after phase on the partitions), one copy and one store
    g = max(1, min(MMAX, lw.P) // Hq)
    groups: list[list[int]] = []
    for ph in range(len(phases)):
        if not empty[ph] and groups and len(groups[-1]) < g and not empty[groups[-1][-1]] and groups[-1][-1] == ph - 1:
            groups[-1].append(ph)
        else:
            groups.append([ph])
    # buffer sets: each channel its own where they fit (channels overlap), else fewer
    # sets taken in turn
    sets = C
    while sets:
        need = (
            sets * len(hch) * partition_bytes(W, isz) + sets * len(row_res) * len(wch) * partition_bytes(Hq, isz)
            + sets * len(groups) * partition_bytes(Wq, isz) + partition_bytes(len(rblocks) * Hq, isz)
            + partition_bytes(len(cblocks) * Wq, isz)
        )
        # aligned as plan-sram places them (a 16-byte accumulator buffer takes 64)
        acc_need = (sets * len(row_res) * len(wch) * partition_bytes(Hq, 4)
                    + sets * len(groups) * partition_bytes(Wq, 4))
        if need <= sram_budget(lw) - 8 * ALIGN and acc_need <= cfg.accumulator.bytes_per_partition:
            break
        sets -= 1
    if not sets:
        return False
    rconst, rcols = consts_2d(lw, rblocks, Hq, KMAX, elem)
    cconst, ccols = consts_2d(lw, cblocks, Wq, KMAX, elem)
    out5 = lw.view(out, (N, C, len(phases) * Hq, Wq))  # rows of the phase images, one after another
    zero = fill_row(lw, 0.0, elem, Wq) if any(empty) else None
    k = HbmKernel(lw, what, loc, [x, rconst, cconst, out5] + ([zero] if zero is not None else []))
    kb = k.kb
    xa, oa = k.arg(x), k.arg(out5)
    rb = kb.alloc([KMAX, rcols], elem, tile.SRAM, "rowsel")
    cb = kb.alloc([KMAX, ccols], elem, tile.SRAM, "colsel")
    kb.add(tile.LoadOp(k.arg(rconst), [kb.const(0), kb.const(0)], rb, kb.const(KMAX), kb.const(rcols), 0, 1))
    kb.add(tile.LoadOp(k.arg(cconst), [kb.const(0), kb.const(0)], cb, kb.const(KMAX), kb.const(ccols), 0, 1))
    zb = None
    if zero is not None:
        zb = kb.alloc([Hq, Wq], elem, tile.SRAM, "zeros")
        kb.add(tile.LoadOp(k.arg(zero), [kb.const(0)], zb, kb.const(Hq), kb.const(Wq), -1, 0))
    pool: dict[tuple[str, int, int], SSAValue] = {}
    stores = QueueModel(cfg)  # the phase images' stores spread over the queues

    def buf(name: str, c: int, i: int, shape: list[int], el: Attribute, space: str) -> SSAValue:
        """Channel c's buffer `name` (i: which of them): shared by the channels of one set."""
        key = (name, c % sets, i)
        if key not in pool:
            pool[key] = kb.alloc(shape, el, space, f"{name}{c % sets}_")
        return pool[key]

    with kb.loop(N) as n:

        def load(c: int) -> None:
            for i, (h0, h1) in enumerate(hch):
                kb.add(tile.LoadOp(xa, [n, kb.const(c), kb.const(h0), kb.const(0)],
                                   buf("x", c, i, [h1 - h0, W], elem, tile.SRAM), kb.const(h1 - h0), kb.const(W), 2, 3))

        # the loads ahead of the stores (the queues run in order): every set's first channel
        # up front, a later channel's once the channel before it in its set has been read
        for c in range(min(sets, C)):
            load(c)
        for c in range(C):  # few channels: each its own buffers (sets permitting), so channels overlap
            xs = [buf("x", c, i, [h1 - h0, W], elem, tile.SRAM) for i, (h0, h1) in enumerate(hch)]
            ta: dict[tuple[int, int], SSAValue] = {}
            for a in row_res:
                for wi, (w0, w1) in enumerate(wch):
                    terms = [hi for hi in range(len(hch)) if (a, hi) in rkey]
                    if not terms:
                        continue
                    acc = buf("acc_r", c, row_res.index(a) * len(wch) + wi, [w1 - w0, Hq], f32, tile.ACC)
                    for t_, hi in enumerate(terms):
                        h0, h1 = hch[hi]
                        kb.add(tile.MatmulOp(
                            sub(kb, xs[hi], 0, w0, [h1 - h0, w1 - w0]),
                            sub(kb, rb, 0, rkey[(a, hi)] * Hq, [h1 - h0, Hq]), acc,
                            kb.const(w1 - w0), kb.const(h1 - h0), kb.const(Hq),
                            true_i1(kb) if t_ else false_i1(kb),
                        ))
                    tbuf = buf("rows", c, row_res.index(a) * len(wch) + wi, [w1 - w0, Hq], elem, tile.SRAM)
                    kb.add(tile.UnaryOp("copy", acc, tbuf, kb.const(w1 - w0), kb.const(Hq)))
                    ta[(a, wi)] = tbuf
            if c + sets < C:
                load(c + sets)
            for gi, grp in enumerate(groups):
                if empty[grp[0]]:
                    zeros = present(zb, "phase split's zeros buffer")
                    kb.add(tile.StoreOp(zeros, oa, [n, kb.const(c), kb.const(grp[0] * Hq), kb.const(0)],
                                        kb.const(Hq), kb.const(Wq), 2, 3))
                    continue
                gr = len(grp) * Hq
                acc = buf("acc_c", c, gi, [gr, Wq], f32, tile.ACC)
                for q, ph in enumerate(grp):
                    a, b = phases[ph]
                    terms = [wi for wi in range(len(wch)) if (b, wi) in ckey]
                    for t_, wi in enumerate(terms):
                        w0, w1 = wch[wi]
                        kb.add(tile.MatmulOp(
                            ta[(a, wi)], sub(kb, cb, 0, ckey[(b, wi)] * Wq, [w1 - w0, Wq]),
                            sub(kb, acc, q * Hq, 0, [Hq, Wq]), kb.const(Hq), kb.const(w1 - w0), kb.const(Wq),
                            true_i1(kb) if t_ else false_i1(kb),
                        ))
                qbuf = buf("phase", c, gi, [gr, Wq], elem, tile.SRAM)
                kb.add(tile.UnaryOp("copy", acc, qbuf, kb.const(gr), kb.const(Wq)))
                kb.add(tile.StoreOp(qbuf, oa, [n, kb.const(c), kb.const(grp[0] * Hq), kb.const(0)],
                                    kb.const(gr), kb.const(Wq), 2, 3, queue=stores.next(gr * Wq * isz, Wq * isz)))
    k.launch()
    return True


