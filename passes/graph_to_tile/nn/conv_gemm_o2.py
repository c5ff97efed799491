"""The -O2 implicit GEMM convolution for images larger than one accumulator tile.

Every weight of the group stays resident, loaded once in pieces over the DMA queues;
the output rows go in bands, each with its own slabs, accumulators and epilogue buffers
out of alternating sets, so one band's loads and matmuls overlap the previous band's
epilogue and store:

    k4_conv2d(%xq [1, 64, 1, 3364], %w [1, 64, 9, 64], %scale, %shift, %out, ...):
      tile.load %w[0, 0, t0, 0] -> %weights_piece   (pieces over the weight queues)
      tile.load %scale, %shift (rows -> columns by 1x1 matmuls);  tile.load %xq band 0 -> %slab (set 0)
      band b:  tile.matmul %weights[:, tap], %slab[:, off + q] -> %acc[b % 2][tile]   (every tap)
               epilogue(%acc) -> tile.store %out[...];  tile.load %xq band b + nsl -> %slab (its set)

With few output channels (`GemmO2Plan.stack`) a group of bands shares one accumulator
tile, band s on partitions s * Co; with floor rows (`GemmO2Plan.pad_at`) one step's slab
and weights have two more rows, so the epilogue needs neither the bias pass nor the mask
(ResNet-18 layer1, 64 channels, 56 x 56, padded output, relu):

      tile.load %floor_rows -> %slab[K:K + 2]   (once per slab set: -2^100 at padding columns; ones)
      tile.load %ones, %bias -> %weights[K:K + 2, tap 0]
      group g:  tile.matmul %weights[:K + 2], %slab[:K + 2, s * RB * Wq + q] -> %acc[s * 64:]   (tap 0)
                tile.matmul %weights[:K], %slab[:K, ...] -> %acc[s * 64:]                       (other taps)
                tile.unary "relu" %acc -> %out (128 partitions); tile.store %out[s * 64:] per band
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    const_hbm,
    false_i1,
    fill_row,
    lin,
    present,
    sub,
    tiles,
    true_i1,
    value_elem,
)
from tilecc.passes.graph_to_tile.nn.conv_plan import ConvIO, ConvProblem, GemmO2Plan
from tilecc.passes.graph_to_tile.nn.epilogue import Epilogue
from tilecc.passes.graph_to_tile.nn.queues import QueueModel
from tilecc.passes.graph_to_tile.nn.state import PadInfo
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

_FLOOR = -(2.0 ** 100)  # exact in bf16 and fp32; any finite sum with it stays far below 0
_PASS = "lower-graph-to-tile"


def _remark(cfg: HardwareConfig, prob: ConvProblem, plan: GemmO2Plan, pad: PadInfo | None, loc: str) -> None:
    """The layouts this kernel uses or misses: stacked bands (few output channels) and
    the floor rows (a padded output whose steps floor -2^100 to 0)."""
    AP = min(cfg.accumulator.partitions, cfg.sram.partitions)
    if plan.stack > 1:
        remarks.emit(_PASS, "passed", f"convolution bands stacked: {plan.stack} bands of {plan.RB} rows side by "
                     f"side on {plan.stack * prob.Co_g} accumulator partitions", loc)
    elif plan.ntile == 1 and 2 * prob.Co_g <= AP:
        remarks.emit(_PASS, "missed", f"convolution bands not stacked ({prob.Co_g} output channels): "
                     f"{prob.geo.OH} rows do not split into groups of bands that fit (one band per tile)", loc)
    if plan.pad_at is not None:
        remarks.emit(_PASS, "passed", "padded output floored by a contraction row (no mask; the bias in the "
                     "contraction)", loc)
    elif prob.floor and pad is not None:
        remarks.emit(_PASS, "missed", "padded output masked on the vector engine: no contraction step has room "
                     "for the floor rows or its rows are not the padded rows (Wq != Wp)", loc)


def emit_conv_gemm_o2(lw: LoweringContext, prob: ConvProblem, plan: GemmO2Plan, io: ConvIO) -> None:
    """-O2 implicit GEMM for images larger than one accumulator tile.

    Every weight of the group stays resident (loaded once, in pieces spread over the
    queues; `weight_pieces`), the output rows go in bands (at least two when the image
    allows) and each band has its own slab, accumulator and epilogue buffers out of two
    sets, so one band's loads and matmuls overlap the previous band's epilogue and
    store. Each output-channel tile of a band has its own accumulator, so its epilogue
    starts while the next tile's matmuls run. Per-channel operands (bias, batch-norm
    scale and shift) are loaded once per group (`conv_plan.plan_gemm_o2` decides the bands,
    the slab sets and the weight pieces)."""
    cfg = lw.cfg
    op, loc, src, steps, out, pad = io.op, io.loc, io.src, io.steps, io.out, io.pad
    geo, G, Ci_g, Co_g = prob.geo, prob.G, prob.Ci_g, prob.Co_g
    w, b = op.weight, op.bias
    elem, out_elem = value_elem(op.input), value_elem(op.results[0])
    isz = prob.isz
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Co = G * Co_g
    TCo, ntile, RB, ks = plan.TCo, plan.ntile, plan.RB, plan.steps
    TP = cfg.matrix.cols
    S = plan.stack
    nb = OH // (RB * S)  # bands (S > 1: groups of S bands side by side on the partitions)
    _remark(cfg, prob, plan, pad, loc)
    lp = geo.lp(RB)
    nsl, unroll = plan.slab_sets, plan.unroll
    epi = Epilogue(lw, steps, out, N, Co, OH, OW, pad=pad, loc=loc, rb=RB)
    T = len(geo.taps)
    wv = lw.materialise(w)
    wview = lw.view(wv, (G, Ci_g, T, Co_g))
    bview = lw.view(lw.materialise(b), (Co, 1)) if b is not None and plan.pad_at is None else None
    frows = ones = brow = None
    if plan.pad_at is not None:  # the floor and ones rows of the slab (`floor_loads`)
        fst = plan.steps[plan.pad_at[0]]
        _, fsl, foff = fst.taps[plan.pad_at[1]]
        q = np.arange(fst.slabs[fsl]) - foff  # the accumulator position a slab column serves
        rows = np.ones((plan.extra, fst.slabs[fsl]), dtype=np.float32)
        rows[0] = np.where((q >= 0) & (q % Wq >= OW), _FLOOR, 0.0)
        frows = const_hbm(lw, rows, elem)
        ones = fill_row(lw, 1.0, elem, Co_g)
        brow = lw.view(lw.materialise(b), (1, Co)) if b is not None else None
        bview = None
    args = [src, wview] + ([bview] if bview is not None else []) + epi.hbm_args()
    args += [a for a in (frows, ones, brow) if a is not None]
    k = HbmKernel(lw, "conv2d", loc, args)
    kb = k.kb
    # weights and activations on their own DMA queues, more of them for the larger
    slab_bytes = nb * sum(st.K * L for st in ks for L in st.slabs) * isz
    qm = QueueModel(cfg, split=True, light_weights=slab_bytes > Ci_g * T * Co_g * isz)
    sa, wa = k.arg(src), k.arg(wview)
    pad_at, extra = plan.pad_at, plan.extra
    # the floor / bias rows (`GemmO2Plan.pad_at`): below the K rows of that step's slab
    # (the one its tap reads) and of its weights (read by that tap alone)
    pslab = ks[pad_at[0]].taps[pad_at[1]][1] if pad_at is not None else -1

    def rows_of(si: int, sl: int | None = None) -> int:
        """Partitions of step si's weights (sl None) or of its slab sl."""
        if pad_at is None or si != pad_at[0] or sl not in (None, pslab):
            return ks[si].K
        return ks[si].K + extra

    # weight buffers: per step, one per weight DMA piece (tap range) of that step
    wpieces: list[list[tuple[int, int, SSAValue]]] = []  # per step: (first tap index, taps, buffer)
    for si, (st, pieces) in enumerate(zip(ks, plan.pieces)):
        if pieces is not None:  # channel tile: its taps in pieces over the queues
            wpieces.append([(t0, nt, kb.alloc([rows_of(si), nt * Co_g], elem, tile.SRAM, "weights"))
                            for t0, nt in pieces])
        else:  # folded kernel rows: one buffer, its row blocks on one queue
            wpieces.append([(0, len(st.taps), kb.alloc([rows_of(si), len(st.taps) * Co_g], elem, tile.SRAM,
                                                       "weights"))])
    # one band over a strided window: a channel tile's phase slabs are its whole phase
    # images, side by side in one buffer that one DMA fills (a DMA per phase paid ~3,100
    # cycles of fixed cost each, two rounds on the activation queues)
    HW = geo.Hq * Wq
    whole = [nb == 1 and S == 1 and not st.folded and geo.nph > 1 and len(st.slabs) == geo.nph for st in ks]
    bigs: dict[tuple[int, int], SSAValue] = {}

    def slab_set(sset: int) -> list[list[SSAValue]]:
        out: list[list[SSAValue]] = []
        for si, st in enumerate(ks):
            if whole[si]:
                rows = max(rows_of(si, i) for i in range(len(st.slabs)))
                big = bigs[(sset, si)] = kb.alloc([rows, geo.nph * HW], elem, tile.SRAM, "slabs")
                out.append([sub(kb, big, 0, i * HW, [rows_of(si, i), L]) for i, L in enumerate(st.slabs)])
            else:
                out.append([kb.alloc([rows_of(si, i), L], elem, tile.SRAM, f"slab{i}") for i, L in enumerate(st.slabs)])
        return out

    slabsets = [slab_set(sset) for sset in range(nsl if unroll else 2)]
    accs = [[kb.alloc([S * TCo, lp], f32, tile.ACC, "acc") for _ in range(ntile)] for _ in range(2)]
    epi.alloc(kb, S * TCo, RB * OW, out_elem, col_sets=ntile, sets=2)
    epi.floored = pad_at is not None
    # the mask and zeros after the weights on their queues (once: before the loops
    # where these run more than once)
    once = N * G == 1
    contiguous = pad is not None and Wq == pad.Wp  # the compaction writes each band's rows as one run
    if not once:
        epi.init(k, qm, contiguous)
    bbuf = None
    if b is not None and bview is not None and pad_at is None:
        bbuf = kb.alloc([S * TCo, ntile], value_elem(b), tile.SRAM, "bias")
        epi.extra_columns = [(bview, bbuf)]

    def tap_rows(si: int, ti: int) -> int:
        return ks[si].K + (extra if (si, ti) == pad_at else 0)

    def tap_weight(si: int, ti: int, co0: SSAValue) -> SSAValue:
        for t0, nt, buf in wpieces[si]:
            if t0 <= ti < t0 + nt:
                return sub(kb, buf, 0, lin(kb, (ti - t0) * Co_g, (1, co0)), [tap_rows(si, ti), TCo])
        raise AssertionError("tap without weights")

    def floor_loads() -> None:
        """The floor (-2^100 at the padding columns of the tap's positions) and ones rows
        of every slab set, and their weights (ones; the bias) in the tap's columns."""
        if pad_at is None:
            return
        si, ti = pad_at
        st = ks[si]
        L = st.slabs[pslab]
        sl = pslab
        ca = k.arg(present(frows, "floor rows"))
        for sset in slabsets:
            kb.add(tile.LoadOp(ca, [kb.const(0), kb.const(0)], sub(kb, sset[si][sl], st.K, 0, [extra, L]),
                               kb.const(extra), kb.const(L), 0, 1, queue=qm.next(extra * L * isz, L * isz, const=True)))
        for t0, nt, buf in wpieces[si]:
            if not t0 <= ti < t0 + nt:
                continue
            c = (ti - t0) * Co_g
            one = k.arg(present(ones, "ones row"))
            kb.add(tile.LoadOp(one, [kb.const(0)], sub(kb, buf, st.K, c, [1, Co_g]), kb.const(1),
                               kb.const(Co_g), -1, 0, queue=qm.next(Co_g * isz, Co_g * isz, const=True)))
            if b is not None and brow is not None:
                kb.add(tile.LoadOp(k.arg(brow), [kb.const(0), ch0], sub(kb, buf, st.K + 1, c, [1, Co_g]),
                                   kb.const(1), kb.const(Co_g), 0, 1,
                                   queue=qm.next(Co_g * isz, Co_g * isz, const=True)))

    with kb.loop(N) as n, kb.loop(G) as gi:
        ch0 = lin(kb, 0, (Co_g, gi))

        def weight_loads() -> None:
            """The weights of this group, resident for all bands."""
            for si, st in enumerate(ks):
                for t0, nt, buf in wpieces[si]:
                    if not st.folded:
                        kk, ci0 = st.wloads[0][1], st.loads[0][0][2]
                        kb.add(tile.LoadOp(wa, [gi, kb.const(ci0), kb.const(t0), kb.const(0)], buf, kb.const(kk),
                                           kb.const(nt * Co_g), 1, 3,
                                           queue=qm.next(kk * nt * Co_g * isz, nt * Co_g * isz, const=True)))
                    else:  # row blocks of one buffer: disjoint partitions, any queues
                        for r0, kk, tap0, ntp, _ in st.wloads:
                            kb.add(tile.LoadOp(wa, [gi, kb.const(0), kb.const(tap0), kb.const(0)],
                                               sub(kb, buf, r0, 0, [kk, ntp * Co_g]), kb.const(kk),
                                               kb.const(ntp * Co_g), 1, 3,
                                               queue=qm.next(kk * ntp * Co_g * isz, ntp * Co_g * isz, const=True)))

        def band_loads(bidx: SSAValue, sset: int, among_stores: bool = True) -> None:
            p0 = lin(kb, 0, (S * RB * Wq, bidx))
            slabs = slabsets[sset]
            for si, st in enumerate(ks):
                if whole[si]:  # every phase image at once
                    _, _, ci0, kk, _ = st.loads[0][0]
                    cols = geo.nph * HW
                    kb.add(tile.LoadOp(sa, [n, lin(kb, ci0, (Ci_g, gi)), kb.const(0), kb.const(0)],
                                       sub(kb, bigs[(sset, si)], 0, 0, [kk, cols]), kb.const(kk), kb.const(cols), 1, 3,
                                       queue=qm.next(kk * cols * isz, cols * isz, among_stores=among_stores)))
                    continue
                for li, (L, lds) in enumerate(zip(st.slabs, st.loads)):
                    for r0, ph_, ci0, kk, off in lds:  # disjoint row blocks: any queues
                        ci = lin(kb, ci0, (Ci_g, gi))
                        kb.add(tile.LoadOp(sa, [n, ci, kb.const(ph_), kb.addi(p0, kb.const(off)) if off else p0],
                                           sub(kb, slabs[si][li], r0, 0, [kk, L]), kb.const(kk), kb.const(L), 1, 3,
                                           queue=qm.next(kk * L * isz, L * isz, among_stores=among_stores)))

        def band(bidx: SSAValue, bset: int, sset: int, last: bool = False, group: int | None = None) -> None:
            """Band `bidx`'s matmuls and epilogue (S > 1: group `group` of S bands, band s at
            slab column s * RB * Wq and on accumulator partitions s * TCo; one epilogue)."""
            slabs = slabsets[sset]
            for j in range(ntile):
                co0 = kb.const(j * TCo)
                m = kb.const(min(TCo, Co_g - j * TCo))
                acc = accs[bset][j]
                for s_ in range(S):
                    init = True
                    with tiles(kb, lp, TP) as (_, q0, nq):
                        for si, st in enumerate(ks):
                            for ti, (_, sl, off) in enumerate(st.taps):
                                flag = false_i1(kb) if init else true_i1(kb)
                                init = False
                                kr = tap_rows(si, ti)
                                kb.add(tile.MatmulOp(
                                    tap_weight(si, ti, co0),
                                    sub(kb, slabs[si][sl], 0, lin(kb, off + s_ * RB * Wq, (1, q0)), [kr, TP]),
                                    sub(kb, acc, s_ * TCo, q0, [TCo, TP]),
                                    m, kb.const(kr), nq, flag,
                                ))
                c0 = lin(kb, j * TCo, (Co_g, gi))

                def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int, j: int = j) -> None:
                    if bbuf is not None:
                        kb.add(tile.BinaryOp("add", s_, sub(kb, bbuf, 0, j, [S * TCo, 1]), d_, rows, kb.const(cols),
                                             "column"))
                    else:
                        kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

                oh0 = lin(kb, 0, (RB, bidx))
                # (the padded output is allocated zeroed: the ring above the first band needs no
                # store, except from a single band: its buffer then holds the whole padded
                # channel tile as the next kernel loads it, so that kernel can read it in place,
                # passes/tile/forward_activations.py)
                epi.emit(k, acc, m if group is None else kb.const(S * TCo), n, c0, kb.const(0), oh0, RB, Wq,
                         compact if pad_at is None else None, col_set=j, buf_set=(bset + j) % 2, last=last,
                         first=nb == 1 and group is None,
                         stack=None if group is None else [(group * S + s_) * RB for s_ in range(S)])

        # issue order: the weights, then the epilogue's constants and per-channel operands
        # (small; turned into columns just before the first epilogue) on the weight
        # queues; the bands' slabs on the activation queues (`queue_split`)
        weight_loads()
        floor_loads()
        if once:
            epi.init(k, qm, contiguous)
        epi.preload_columns(k, ch0, S * TCo if S > 1 else TCo, queues=qm, count=Co_g, defer=True, repeat=S)
        if unroll and S == 1:
            # the residuals of the first two (band, channel tile) epilogues (their buffer
            # sets' first use) ahead of the slabs, on the activation queues (off the store
            # queue): they wait for no store of the kernel before (ResNet-18 224: -3,200
            # cycles; on the weight queues +2,000, see below)
            uses = [(bi, j) for bi in range(nb) for j in range(ntile)][:2]
            for bi, j in uses:
                epi.prefetch(k, n, lin(kb, j * TCo, (Co_g, gi)), kb.const(0), min(TCo, Co_g - j * TCo), [bi * RB],
                             RB, (bi % 2 + j) % 2, const=False)
        band_loads(kb.const(0), 0, among_stores=False)
        if unroll and S > 1:
            # a stack's residual pieces for the first two groups (their buffer sets' first
            # use) ahead, on the weight queues: behind the slabs and stores they held up
            # each group's epilogue (ResNet-18 224: -17,000 cycles; for unstacked bands it
            # measured 2,000 cycles worse, the weight queues then carry less of the next
            # kernels' weights)
            for bi in range(min(2, nb)):
                tops = [(bi * S + s_) * RB for s_ in range(S)]
                epi.prefetch(k, n, lin(kb, 0, (Co_g, gi)), kb.const(0), S * Co_g, tops, RB, bi % 2)
        if unroll:
            # each band's loads one band ahead of its matmuls while it has a set of its
            # own, so the epilogue's tile operands (a residual; loaded in `band`) do not
            # queue behind every band's slabs; later bands' when their set frees
            for bi in range(nb):
                if 0 < bi + 1 < nsl:
                    band_loads(kb.const(bi + 1), bi + 1)
                band(kb.const(bi), bi % 2, bi % nsl, last=bi == nb - 1, group=bi if S > 1 else None)
                if bi + nsl < nb:
                    band_loads(kb.const(bi + nsl), (bi + nsl) % nsl)
        else:
            # the first and last bands once each (their stores cover the padding ring),
            # the ones between in pairs: (2i + 1, set 1), (2i + 2, set 0)
            band(kb.const(0), 0, 0)
            mid = nb - 2
            if mid >= 2:
                with kb.loop(mid // 2) as bi2:
                    for half in (1, 0):
                        bidx = lin(kb, 1 + (1 - half), (2, bi2))
                        band_loads(bidx, half)
                        band(bidx, half, half)
            if mid % 2:
                band_loads(kb.const(nb - 2), (nb - 2) % 2)
                band(kb.const(nb - 2), (nb - 2) % 2, (nb - 2) % 2)
            band_loads(kb.const(nb - 1), (nb - 1) % 2)
            band(kb.const(nb - 1), (nb - 1) % 2, (nb - 1) % 2, last=True)
    k.launch()


