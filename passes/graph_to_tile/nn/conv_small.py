"""Convolutions of small images (the whole image is one accumulator tile, e.g. the last
stages of a CNN): positions on the accumulator partitions (M), output channels along
the array's columns (N), so a matmul streams only the real positions.

    k9_conv2d(%xq [1, 256, 1, 16], %w [1, 256, 9, 512], %select, ..., %out [1, 512, 1, 4]):
      tile.load %xq[0, ci0, 0, 0] -> %slab (every phase, one DMA per contraction tile)
      tile.load %w pieces -> %weights (resident, over the queues)
      tile.matmul %slab[:, off_t], %weights[:, t * 512 + co0] -> %acc [positions x channels]
      per chunk of channels: tile.matmul %acc_copy, %select -> %acc_t [channels x positions]
                             epilogue -> tile.store %out[0, c0, 0, 0]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    const_hbm,
    false_i1,
    lin,
    present,
    sub,
    tiles,
    true_i1,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.conv_gemm import k_loop
from tilecc.passes.graph_to_tile.nn.conv_plan import (
    ConvIO,
    ConvProblem,
    SmallO2Plan,
    SmallPlan,
)
from tilecc.passes.graph_to_tile.nn.epilogue import Epilogue
from tilecc.passes.graph_to_tile.nn.queues import QueueModel

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def emit_conv_small(lw: LoweringContext, prob: ConvProblem, plan: SmallPlan, io: ConvIO) -> None:
    """Few output positions (the whole image is one accumulator tile): positions on the
    accumulator partitions (M, the streamed dimension) and output channels along the array
    columns (N), so a matmul costs its few positions, not a full channel tile
    (`conv_plan.plan_small` says where the shape qualifies).

    -O2 (`emit_conv_small_o2`) keeps every contraction tile's weights resident (loaded
    in a few large DMAs spread over the queues, all issued up front) and turns the
    ``[positions x channels]`` result back to ``[channels x positions]`` with one fp32
    selection matmul per channel tile (dropping the padding columns), so the epilogue
    and the store are the contiguous ones of the large-image kernel. -O0 stores with the
    spatial stride (one DMA element per output)."""
    op, loc, src, steps, out = io.op, io.loc, io.src, io.steps, io.out
    geo, G, Ci_g, Co_g, layout = prob.geo, prob.G, prob.Ci_g, prob.Co_g, prob.layout
    w, b = op.weight, op.bias
    elem, out_elem = value_elem(op.input), value_elem(op.results[0])
    T = len(geo.taps)
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Co = G * Co_g
    S = OH * OW
    Lp = geo.lp(OH)
    TK, nk, TN, double = plan.TK, plan.nk, plan.TN, plan.double
    wv = lw.materialise(w)
    wview = lw.view(wv, (G, Ci_g, T, Co_g) if layout == "gihwo" else (Co, Ci_g, T))
    oview = lw.view(out, (N, Co, S))
    views: list[SSAValue] = []
    for st in steps:
        if st.kind == "column":
            st.value = lw.view(st.operand(), (Co,) if math.prod(value_shape(st.operand())) == Co else (1,))
            views.append(st.value)
        elif st.kind == "tile":
            st.value = lw.view(st.operand(), (math.prod(value_shape(st.operand())) // (Co * S), Co, S))
            views.append(st.value)
    bview = lw.view(lw.materialise(b), (Co,)) if b is not None else None
    args = [src, wview] + ([bview] if bview is not None else []) + views + [oview]
    k = HbmKernel(lw, "conv2d", loc, args)
    kb = k.kb
    sa, wa = k.arg(src), k.arg(wview)
    nsets = 2 if double else 1
    wbs = [kb.alloc([TK, T * Co_g], elem, tile.SRAM, "weights") for _ in range(nsets)]
    slabsets = [[kb.alloc([TK, geo.slab(OH, p)], elem, tile.SRAM, f"slab{p}") for p in range(geo.nph)]
                for _ in range(nsets)]
    acc = kb.alloc([Lp, Co_g], f32, tile.ACC, "acc")
    ob = kb.alloc([Lp, Co_g], out_elem, tile.SRAM, "out")
    bufs = [kb.alloc([Lp, Co_g], value_elem(st.operand()), tile.SRAM, "operand")
            if st.kind in ("column", "tile") else None for st in steps]
    bbuf = kb.alloc([Lp, Co_g], value_elem(b), tile.SRAM, "bias") if b is not None else None
    rows, cols = kb.const(Lp), kb.const(Co_g)
    with kb.loop(N) as n, kb.loop(G) as gi:
        ch0 = lin(kb, 0, (Co_g, gi))
        def kstep(first: SSAValue, ci0: SSAValue, kk: SSAValue, bset: int) -> None:
            wb, slabs = wbs[bset], slabsets[bset]
            ci = lin(kb, 0, (Ci_g, gi), (1, ci0))
            if layout == "gihwo":
                kb.add(tile.LoadOp(wa, [gi, ci0, kb.const(0), kb.const(0)], wb, kk, kb.const(T * Co_g), 1, 3))
            else:
                with kb.loop(T) as t:
                    kb.add(tile.LoadOp(wa, [ch0, ci0, t], sub(kb, wb, 0, lin(kb, 0, (Co_g, t)), [TK, Co_g]),
                                       kk, kb.const(Co_g), 1, 0))
            for p in range(geo.nph):
                L = geo.slab(OH, p)
                kb.add(tile.LoadOp(sa, [n, ci, kb.const(p), kb.const(0)], slabs[p], kk, kb.const(L), 1, 3))
            for t, (_, _, p, off) in enumerate(geo.taps):
                flag = first if t == 0 else true_i1(kb)
                with tiles(kb, Co_g, TN) as (_, co0, nn_):
                    kb.add(tile.MatmulOp(
                        sub(kb, slabs[p], 0, off, [TK, Lp]),
                        sub(kb, wb, 0, lin(kb, t * Co_g, (1, co0)), [TK, TN]),
                        sub(kb, acc, 0, co0, [Lp, TN]),
                        rows, kk, nn_, flag,
                    ))

        k_loop(kb, Ci_g, TK, nk, double, kstep)
        # epilogue on [positions x channels]; per-channel operands are row-broadcast tiles
        if bbuf is not None and bview is not None:
            kb.add(tile.LoadOp(k.arg(bview), [ch0], bbuf, rows, cols, -1, 0))
            kb.add(tile.BinaryOp("add", acc, bbuf, ob, rows, cols))
        else:
            kb.add(tile.UnaryOp("copy", acc, ob, rows, cols))
        for st, buf in zip(steps, bufs):
            if st.kind == "unary":
                kb.add(tile.UnaryOp(st.fn, ob, ob, rows, cols))
            elif st.kind == "scalar":
                kb.add(tile.ScalarOp(st.fn, ob, st.imm, ob, rows, cols, swap=st.swap))
            elif st.kind == "column":
                buf = present(buf, "column buffer")
                v = k.arg(st.operand())
                if value_shape(st.operand()) == (1,):
                    kb.add(tile.LoadOp(v, [kb.const(0)], buf, rows, cols, -1, -1))
                else:
                    kb.add(tile.LoadOp(v, [ch0], buf, rows, cols, -1, 0))
                kb.add(tile.BinaryOp(st.fn, ob, buf, ob, rows, cols))
            else:
                buf = present(buf, "tile operand buffer")
                v = k.arg(st.operand())
                nn_ = n if value_shape(st.operand())[0] == N else kb.const(0)
                # only the rows of real positions (ow < OW) hold operand data
                with kb.loop(OH) as oh:
                    r0 = lin(kb, 0, (Wq, oh))
                    bv, ov = sub(kb, buf, r0, 0, [OW, Co_g]), sub(kb, ob, r0, 0, [OW, Co_g])
                    kb.add(tile.LoadOp(v, [nn_, ch0, lin(kb, 0, (OW, oh))], bv, kb.const(OW), cols, 2, 1))
                    a_, b_ = (bv, ov) if st.swap else (ov, bv)
                    kb.add(tile.BinaryOp(st.fn, a_, b_, ov, kb.const(OW), cols))
        with kb.loop(OH) as oh:
            kb.add(tile.StoreOp(sub(kb, ob, lin(kb, 0, (Wq, oh)), 0, [OW, Co_g]), k.arg(oview),
                                [n, ch0, lin(kb, 0, (OW, oh))], kb.const(OW), cols, 2, 1))
    k.launch()


def emit_conv_small_o2(lw: LoweringContext, prob: ConvProblem, plan: SmallO2Plan, io: ConvIO) -> None:
    """See `emit_conv_small` (`conv_plan.plan_small_o2` says where the -O2 kernel applies)."""
    cfg = lw.cfg
    op, loc, src, steps, out, pad = io.op, io.loc, io.src, io.steps, io.out, io.pad
    geo, G, Ci_g, Co_g = prob.geo, prob.G, prob.Ci_g, prob.Co_g
    w, b = op.weight, op.bias
    elem, out_elem = value_elem(op.input), value_elem(op.results[0])
    isz = prob.isz
    T = len(geo.taps)
    N, OH, OW = geo.N, geo.OH, geo.OW
    Co = G * Co_g
    S = OH * OW
    Lp = geo.lp(OH)
    TK, nk, TN, TCo, nchunks, pieces = plan.TK, plan.nk, plan.TN, plan.TCo, plan.nchunks, plan.pieces
    HW = geo.Hq * geo.Wq  # one buffer holds every phase image (one DMA per contraction tile)
    epi = Epilogue(lw, steps, out, N, Co, OH, OW, pad=pad, loc=loc)
    wv = lw.materialise(w)
    wview = lw.view(wv, (G, Ci_g, T, Co_g))
    bview = lw.view(lw.materialise(b), (Co, 1)) if b is not None else None
    # selection: accumulator row p = oh * Wq + ow holds output q = oh * OW + ow
    selm = np.zeros((Lp, S), dtype=np.float32)
    for oh in range(OH):
        for ow in range(OW):
            selm[oh * geo.Wq + ow, oh * OW + ow] = 1.0
    sel = const_hbm(lw, selm, f32)
    # several contraction tiles: tile t takes channels p * nk + t (partition p), so every
    # partition reads nk consecutive channels and one DMA loads all tiles' slabs (one DMA
    # per tile paid ~3,100 cycles of fixed cost each, in rounds over the activation queues);
    # the weights' rows follow with a row stride of nk channels
    inter = nk > 1 and TK * nk == Ci_g
    L = geo.nph * HW  # the phases of a channel are contiguous
    if inter:
        src_i = lw.view(src, (N, G * TK, nk * L))
        wview = lw.view(wv, (G, TK, nk, T * Co_g))
    args = [src_i if inter else src, wview, sel] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = HbmKernel(lw, "conv2d", loc, args)
    kb = k.kb
    sa, wa = k.arg(src_i if inter else src), k.arg(wview)
    ktiles = [(i * TK, min(TK, Ci_g - i * TK)) for i in range(nk)]
    # one buffer per weight DMA, so DMAs on different queues do not wait for each other
    wbufs = {piece: kb.alloc([TK, piece[2] * Co_g], elem, tile.SRAM, "weights") for piece in pieces}
    tap_buf: dict[tuple[int, int], tuple[SSAValue, int]] = {}
    for (t, t0, nt), buf in wbufs.items():
        for tt in range(t0, t0 + nt):
            tap_buf[(t, tt)] = (buf, tt - t0)
    if inter:
        slab_all = kb.alloc([TK, nk * L], elem, tile.SRAM, "slabs")
        slabsets = [sub(kb, slab_all, 0, t * L, [TK, L]) for t in range(nk)]
    else:
        slabsets = [kb.alloc([TK, L], elem, tile.SRAM, "slab") for _ in range(nk)]
    acc = kb.alloc([Lp, Co_g], f32, tile.ACC, "acc")
    selb = kb.alloc([Lp, S], f32, tile.SRAM, "select")
    yts = [kb.alloc([Lp, TCo], f32, tile.SRAM, "acc_copy") for _ in range(2)]
    acc2s = [kb.alloc([TCo, S], f32, tile.ACC, "acc_t") for _ in range(2)]
    epi.alloc(kb, TCo, S, out_elem, col_sets=nchunks, sets=2)
    bbuf = None
    if b is not None and bview is not None:
        bbuf = kb.alloc([TCo, nchunks], value_elem(b), tile.SRAM, "bias")
        epi.extra_columns = [(bview, bbuf)]
    # weights and activations on their own DMA queues, more of them for the larger
    qm = QueueModel(cfg, split=True, light_weights=geo.nph * HW > T * Co_g)
    once = N * G == 1  # the mask and zeros after the weights, where they load once
    if not once:
        epi.init(k, qm)
    with kb.loop(N) as n, kb.loop(G) as gi:
        ch0 = lin(kb, 0, (Co_g, gi))
        # the weights first, then the constants (selection, mask, per-channel operands) on
        # the weight queues; the slabs on the activation queues (`queue_split`)
        for piece in pieces:
            t, t0, nt = piece
            windex = ([gi, kb.const(0), kb.const(t), kb.const(t0 * Co_g)] if inter
                      else [gi, kb.const(ktiles[t][0]), kb.const(t0), kb.const(0)])
            kb.add(tile.LoadOp(wa, windex, wbufs[piece], kb.const(ktiles[t][1]), kb.const(nt * Co_g), 1, 3,
                               queue=qm.next(ktiles[t][1] * nt * Co_g * isz, nt * Co_g * isz, const=True)))
        if inter:
            kb.add(tile.LoadOp(sa, [n, lin(kb, 0, (TK, gi)), kb.const(0)], slab_all, kb.const(TK),
                               kb.const(nk * L), 1, 2, queue=qm.next(TK * nk * L * isz, nk * L * isz)))
        for (ci0, kk), slab in zip(ktiles, slabsets) if not inter else []:
            ci = lin(kb, ci0, (Ci_g, gi))
            kb.add(tile.LoadOp(sa, [n, ci, kb.const(0), kb.const(0)], slab, kb.const(kk),
                               kb.const(L), 1, 3, queue=qm.next(kk * L * isz, L * isz)))
        if once:
            epi.init(k, qm)
        kb.add(tile.LoadOp(k.arg(sel), [kb.const(0), kb.const(0)], selb, kb.const(Lp), kb.const(S), 0, 1,
                           queue=qm.next(Lp * S * 4, S * 4, const=True)))
        epi.preload_columns(k, ch0, TCo, queues=qm, count=Co_g)
        # output-channel chunk by chunk, so a chunk's epilogue and store overlap the next
        # chunk's matmuls; its transposing matmul goes after the next chunk's matmuls (the
        # matrix engine runs in order: it would otherwise wait for the vector copy)

        def matmuls(j: int) -> None:
            cb = j * TCo
            first = True
            for t, t0, nt in pieces:
                kk = ktiles[t][1]
                slab = slabsets[t]
                for tt in range(t0, t0 + nt):
                    _, _, p, off = geo.taps[tt]
                    wgb, col = tap_buf[(t, tt)]
                    flag = false_i1(kb) if first else true_i1(kb)
                    first = False
                    with tiles(kb, min(TCo, Co_g - cb), TN) as (_, co1, nn_):
                        kb.add(tile.MatmulOp(
                            sub(kb, slab, 0, p * HW + off, [TK, Lp]),
                            sub(kb, wgb, 0, lin(kb, col * Co_g + cb, (1, co1)), [TK, TN]),
                            sub(kb, acc, 0, lin(kb, cb, (1, co1)), [Lp, TN]),
                            kb.const(Lp), kb.const(kk), nn_, flag,
                        ))
            m = min(TCo, Co_g - cb)
            kb.add(tile.UnaryOp("copy", sub(kb, acc, 0, cb, [Lp, TCo]), sub(kb, yts[j % 2], 0, 0, [Lp, TCo]),
                                kb.const(Lp), kb.const(m)))

        def finish(j: int) -> None:
            co0 = j * TCo
            m = min(TCo, Co_g - co0)
            yt, acc2 = yts[j % 2], acc2s[j % 2]
            kb.add(tile.MatmulOp(sub(kb, yt, 0, 0, [Lp, TCo]), selb, acc2, kb.const(m), kb.const(Lp),
                                 kb.const(S), false_i1(kb)))
            c0 = lin(kb, co0, (Co_g, gi))
            mm = kb.const(m)

            def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int, j: int = j) -> None:
                if bbuf is not None:
                    kb.add(tile.BinaryOp("add", s_, sub(kb, bbuf, 0, j, [TCo, 1]), d_, rows, kb.const(cols), "column"))
                else:
                    kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

            epi.emit(k, acc2, mm, n, c0, kb.const(0), kb.const(0), OH, OW, compact, col_set=j, buf_set=j % 2,
                     first=True, last=True)

        for j in range(nchunks):
            matmuls(j)
            if j:
                finish(j - 1)
        finish(nchunks - 1)
    k.launch()


