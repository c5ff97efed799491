"""The -O2 stem convolution: few input channels (e.g. 7x7 over RGB), every tap folded
into the contraction.

K = Ci x KH x KW rows (in steps of at most the array's rows) instead of a matmul per
tap; the rows are shifted windows of the phase images, loaded once for the whole image
(one DMA per run of taps) and kept resident while bands of output rows go through
double-buffered accumulators and the epilogue. The weights load in their natural row
order and a 0/1 matmul permutes them into the contraction's row order (exact):

    k1_conv2d(%xq [1, 3, 4, 13225], %w [147, 64], %perm, ..., %out):
      tile.load %w -> %weights_nat;  tile.load %xq[0, ci, ph, off] -> %im2col[r0:r0 + n]  (per run of taps)
      tile.matmul %perm, %weights_nat -> %acc_w;  tile.unary "copy" %acc_w -> %weights
      band b:  tile.matmul %weights[:, co0], %im2col[:, p0 + q] -> %acc;  epilogue -> tile.store
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    consts_2d,
    false_i1,
    lin,
    sub,
    tiles,
    true_i1,
    value_elem,
)
from tilecc.passes.graph_to_tile.nn.conv_plan import ConvIO, ConvProblem, StemO2Plan
from tilecc.passes.graph_to_tile.nn.epilogue import Epilogue
from tilecc.passes.graph_to_tile.nn.queues import QueueModel

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def emit_conv_stem_o2(lw: LoweringContext, prob: ConvProblem, plan: StemO2Plan, io: ConvIO) -> None:
    """Few input channels (an image stem, e.g. 7x7 over RGB): every tap folded into the
    contraction, so K = Ci * KH * KW rows (in steps of <= R) instead of Ci * KH and a
    matmul per kernel column. The rows are shifted windows of the phase images, loaded
    once for the whole image (one DMA per run of taps; a band would need them all again)
    and kept resident while bands of output rows go through double-buffered
    accumulators and the epilogue. The weights load in their natural row order and a
    0/1 matmul permutes them to the contraction's row order (exact)."""
    cfg = lw.cfg
    op, loc, src, steps, out, pad = io.op, io.loc, io.src, io.steps, io.out, io.pad
    geo, G, Co_g = prob.geo, prob.G, prob.Co_g
    w, b = op.weight, op.bias
    elem, out_elem = value_elem(op.input), value_elem(op.results[0])
    isz = prob.isz
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    KMAX, TCo, ntile, ksteps, Ks, RB = plan.KMAX, plan.TCo, plan.ntile, plan.ksteps, plan.Ks, plan.RB
    nat, nch = plan.nat, plan.nch
    TP = cfg.matrix.cols
    Lall = geo.lp(OH)
    nb = OH // RB
    lp = geo.lp(RB)
    epi = Epilogue(lw, steps, out, N, G * Co_g, OH, OW, pad=pad, loc=loc, rb=RB)
    # the permutation from natural weight rows to each step's rows
    perm = np.zeros((nch * KMAX, len(ksteps) * KMAX), dtype=np.float32)
    for si, st in enumerate(ksteps):
        for r0, (kh, ci, _, _, _, kws) in st:
            for i, kw in enumerate(kws):
                perm[(ci * geo.k[0] + kh) * geo.k[1] + kw, si * KMAX + r0 + i] = 1.0
    pblocks = [perm[c * KMAX:(c + 1) * KMAX] for c in range(nch)]
    pconst, pcols = consts_2d(lw, pblocks, len(ksteps) * KMAX, KMAX, elem)
    wv = lw.materialise(w)
    wnat = lw.view(wv, (nat, Co_g))
    bview = lw.view(lw.materialise(b), (Co_g, 1)) if b is not None else None
    args = [src, wnat, pconst] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = HbmKernel(lw, "conv2d", loc, args)
    kb = k.kb
    qm = QueueModel(cfg)
    sa, wa = k.arg(src), k.arg(wnat)
    slabs = [kb.alloc([K, Lall], elem, tile.SRAM, "im2col") for K in Ks]
    wbufs = [kb.alloc([K, Co_g], elem, tile.SRAM, "weights") for K in Ks]
    wstage = [kb.alloc([min(KMAX, nat - c * KMAX), Co_g], elem, tile.SRAM, "weights_nat") for c in range(nch)]
    pb = kb.alloc([KMAX, pcols], elem, tile.SRAM, "permute")
    wacc = kb.alloc([KMAX, Co_g], f32, tile.ACC, "acc_w")
    accs = [[kb.alloc([TCo, lp], f32, tile.ACC, "acc") for _ in range(ntile)] for _ in range(2)]
    epi.alloc(kb, TCo, RB * OW, out_elem, col_sets=ntile, sets=2)
    epi.init(k, qm)
    bbuf = None
    if b is not None and bview is not None:
        bbuf = kb.alloc([TCo, ntile], value_elem(b), tile.SRAM, "bias")
        epi.extra_columns = [(bview, bbuf)]
    with kb.loop(N) as n:
        epi.preload_columns(k, kb.const(0), TCo, queues=qm, count=Co_g, defer=True)
        for c in range(nch):
            r = min(KMAX, nat - c * KMAX)
            kb.add(tile.LoadOp(wa, [kb.const(c * KMAX), kb.const(0)], wstage[c], kb.const(r), kb.const(Co_g), 0, 1,
                               queue=qm.next(r * Co_g * isz, Co_g * isz)))
        kb.add(tile.LoadOp(k.arg(pconst), [kb.const(0), kb.const(0)], pb, kb.const(KMAX), kb.const(pcols), 0, 1,
                           queue=qm.next(KMAX * pcols * isz, pcols * isz)))
        for si, st in enumerate(ksteps):
            for r0, (_kh, ci, ph_, off, step, kws) in st:
                kb.add(tile.LoadOp(sa, [n, kb.const(ci), kb.const(ph_), kb.const(off)],
                                   sub(kb, slabs[si], r0, 0, [len(kws), Lall]), kb.const(len(kws)), kb.const(Lall),
                                   3, 3, step, 1, queue=qm.next(len(kws) * Lall * isz, Lall * isz)))
        # weights: natural rows -> each step's row order (acc[r, co] = sum_k perm[k, r] w[k, co])
        NC = cfg.matrix.cols
        for si, K in enumerate(Ks):
            for c0 in range(0, Co_g, NC):  # output channels in chunks of the array's columns
                nc_ = min(NC, Co_g - c0)
                for c in range(nch):
                    r = min(KMAX, nat - c * KMAX)
                    kb.add(tile.MatmulOp(sub(kb, pb, 0, si * KMAX + c * len(ksteps) * KMAX, [r, K]),
                                         sub(kb, wstage[c], 0, c0, [r, nc_]), sub(kb, wacc, 0, c0, [K, nc_]),
                                         kb.const(K), kb.const(r), kb.const(nc_), true_i1(kb) if c else false_i1(kb)))
            kb.add(tile.UnaryOp("copy", sub(kb, wacc, 0, 0, [K, Co_g]), wbufs[si], kb.const(K), kb.const(Co_g)))

        def band(bi: int) -> None:
            bset = bi % 2
            p0 = bi * RB * Wq
            for j in range(ntile):
                co0 = j * TCo
                m = kb.const(min(TCo, Co_g - co0))
                acc = accs[bset][j]
                with tiles(kb, lp, TP) as (_, q0, nq):
                    for si, K in enumerate(Ks):
                        kb.add(tile.MatmulOp(
                            sub(kb, wbufs[si], 0, co0, [K, TCo]),
                            sub(kb, slabs[si], 0, lin(kb, p0, (1, q0)), [K, TP]),
                            sub(kb, acc, 0, q0, [TCo, TP]), m, kb.const(K), nq,
                            true_i1(kb) if si else false_i1(kb),
                        ))

                def compact(s_: SSAValue, d_: SSAValue, rows_: SSAValue, cols: int, j: int = j) -> None:
                    if bbuf is not None:
                        kb.add(tile.BinaryOp("add", s_, sub(kb, bbuf, 0, j, [TCo, 1]), d_, rows_, kb.const(cols),
                                             "column"))
                    else:
                        kb.add(tile.UnaryOp("copy", s_, d_, rows_, kb.const(cols)))

                epi.emit(k, acc, m, n, kb.const(co0), kb.const(0), kb.const(bi * RB), RB, Wq, compact, col_set=j,
                         buf_set=(bset + j) % 2, first=bi == 0, last=bi == nb - 1)

        for bi in range(nb):
            band(bi)
    k.launch()

