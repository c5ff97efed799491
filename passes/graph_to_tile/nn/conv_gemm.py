"""The -O0 implicit GEMM convolution (and the fallback for any shape at -O2).

Per block of output channels and band of output rows, each contraction step loads
the weights of every tap and one slab per phase image, then every tap adds
``W[ci, co]^T @ slab[ci, p + off]`` into the ``[co x positions]`` accumulator; with few
input channels, several kernel rows are folded into the contraction (K = rows x ci).

    k2_conv2d(%xq [1, 37, 1, 110], %w [1, 37, 9, 19], ..., %out):
      scf.for %n, %g, %block:  scf.for %band:
        scf.for %kt (pairs of input-channel tiles, two buffer sets):
          tile.load %w[g, ci0, 0, 0] -> %weights;  tile.load %xq[n, ci, 0, p0] -> %slab0
          tile.matmul %weights[:, t * 19 + co0], %slab0[:, off_t + q0] -> %acc   (9 taps)
        epilogue (bias, steps) -> tile.store %out[n, c0, 0, oh0 * OW]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32
from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    band_loop,
    lin,
    sub,
    tiles,
    true_i1,
    value_elem,
)
from tilecc.passes.graph_to_tile.nn.conv_plan import ConvIO, ConvProblem, GemmPlan
from tilecc.passes.graph_to_tile.nn.epilogue import Epilogue

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def k_loop(kb: KernelBuilder, Ci: int, TK: int, n: int, double: bool,
            body: Callable[[SSAValue, SSAValue, SSAValue, int], None]) -> None:
    """`body(first, ci0, size, buffer set)` per contraction tile; `first` (i1) is false
    for the first tile only. With `double`, tiles go in pairs to buffer sets 0 and 1, so
    the loads of one overlap the matmuls of the other."""
    if not double:
        with tiles(kb, Ci, TK) as (i, ci0, kk):
            body(kb.ne_zero(i), ci0, kk, 0)
        return
    with kb.loop(n // 2) as i:
        for half in (0, 1):
            ci0 = lin(kb, half * TK, (2 * TK, i))
            if Ci % TK == 0 or half == 0:
                kk = kb.const(TK)
            else:
                kk = kb.mini(kb.const(TK), kb.subi(kb.const(Ci), ci0))
            body(kb.ne_zero(i) if half == 0 else true_i1(kb), ci0, kk, half)


def emit_conv_gemm(lw: LoweringContext, prob: ConvProblem, plan: GemmPlan, io: ConvIO) -> None:
    """The -O0 implicit GEMM: per block of output channels and band of output rows, the
    contraction steps (input-channel tiles, or folded kernel rows) accumulate every tap
    into ``[co x positions]`` tiles, then the epilogue stores NCHW rows."""
    op, loc, src, steps, out = io.op, io.loc, io.src, io.steps, io.out
    geo, G, Ci_g, Co_g, layout = prob.geo, prob.G, prob.Ci_g, prob.Co_g, prob.layout
    w, b = op.weight, op.bias
    elem, out_elem = value_elem(op.input), value_elem(op.results[0])
    T = len(geo.taps)
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Co = G * Co_g
    TK, nk, TCo, TP, double = plan.TK, plan.nk, plan.TCo, plan.TP, plan.double
    RB, BT, NB, COB, whole_w = plan.RB, plan.BT, plan.NB, plan.COB, plan.whole_w
    groups, colmax = plan.groups or [], plan.colmax
    fold = plan.groups is not None
    KW = geo.k[1]
    ncol = len(geo.col_res)
    (sh, sw), (dh, dw) = geo.s, geo.d
    epi = Epilogue(lw, steps, out, N, Co, OH, OW)
    wv = lw.materialise(w)
    if layout == "gihwo":
        wview = lw.view(wv, (G, Ci_g, T, Co_g))
    else:
        wview = lw.view(wv, (Co, Ci_g, T))
    bview = lw.view(lw.materialise(b), (Co, 1)) if b is not None else None
    args = [src, wview] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = HbmKernel(lw, "conv2d", loc, args)
    kb = k.kb
    sa, wa = k.arg(src), k.arg(wview)
    ba = k.arg(bview) if bview is not None else None
    Lmax = geo.lp(RB)
    ntaps = KW if fold else T  # taps per contraction step
    wcols = ntaps * Co_g if whole_w else ntaps * COB
    nsets = 2 if double else 1
    wbs = [kb.alloc([TK, wcols], elem, tile.SRAM, "weights") for _ in range(nsets)]
    if fold:
        slabsets = [[kb.alloc([TK, geo.lp(RB) + colmax[bi]], elem, tile.SRAM, f"slab{bi}") for bi in range(ncol)]
                    for _ in range(nsets)]
    else:
        slabsets = [[kb.alloc([TK, geo.slab(RB, p)], elem, tile.SRAM, f"slab{p}") for p in range(geo.nph)]
                    for _ in range(nsets)]
    acc = kb.alloc([TCo, BT * Lmax], f32, tile.ACC, "acc")
    epi.alloc(kb, TCo, RB * OW, out_elem)
    bbuf = kb.alloc([TCo, 1], value_elem(b), tile.SRAM, "bias") if b is not None else None
    wstride = Co_g if whole_w else COB  # columns per tap in the weight buffer
    lp = geo.lp(RB)

    with kb.loop(N) as n, kb.loop(G) as gi, kb.loop(NB) as bi:
        cb0 = lin(kb, 0, (COB, bi))  # first output channel of the block (within the group)
        if NB == 1:
            cob = kb.const(Co_g)
        else:
            cob = kb.mini(kb.const(COB), kb.subi(kb.const(Co_g), cb0))

        def band(oh0: SSAValue, rb: int) -> None:
            def kstep(first: SSAValue, ci0: SSAValue, kk: SSAValue, bset: int) -> None:
                wb, slabs = wbs[bset], slabsets[bset]
                ci = lin(kb, 0, (Ci_g, gi), (1, ci0))
                if whole_w:
                    kb.add(tile.LoadOp(wa, [gi, ci0, kb.const(0), kb.const(0)], wb, kk,
                                       kb.const(T * Co_g), 1, 3))
                else:
                    with kb.loop(T) as t:
                        dst = sub(kb, wb, 0, lin(kb, 0, (COB, t)), [TK, COB])
                        if layout == "gihwo":
                            kb.add(tile.LoadOp(wa, [gi, ci0, t, cb0], dst, kk, cob, 1, 3))
                        else:
                            co = lin(kb, 0, (Co_g, gi), (1, cb0))
                            kb.add(tile.LoadOp(wa, [co, ci0, t], dst, kk, cob, 1, 0))
                p0 = lin(kb, 0, (Wq, oh0))
                for p in range(geo.nph):
                    L = geo.slab(rb, p)
                    kb.add(tile.LoadOp(sa, [n, ci, kb.const(p), p0], sub(kb, slabs[p], 0, 0, [TK, L]),
                                       kk, kb.const(L), 1, 3))
                for t, (_, _, p, off) in enumerate(geo.taps):
                    flag = first if t == 0 else true_i1(kb)
                    with co_tiles(kb, BT, TCo, Co_g, cb0) as (j, co0, m), tiles(kb, lp, TP) as (_, q0, nq):
                        kb.add(tile.MatmulOp(
                            sub(kb, wb, 0, lin(kb, t * wstride, (1, co0)), [TK, TCo]),
                            sub(kb, slabs[p], 0, lin(kb, off, (1, q0)), [TK, TP]),
                            sub(kb, acc, 0, lin(kb, 0, (lp, j), (1, q0)), [TCo, TP]),
                            m, kk, nq, flag,
                        ))

            def fold_step(gidx: int, khs: list[int]) -> None:
                """Kernel rows `khs` on the contraction (rows r * Ci_g + ci, r = position in
                khs); each run of one stride phase is a loop, so one static load per buffer."""
                wb, slabs = wbs[gidx % nsets], slabsets[gidx % nsets]
                fg = len(khs)
                ci = lin(kb, 0, (Ci_g, gi))
                kk = kb.const(fg * Ci_g)
                cik = kb.const(Ci_g)
                p0 = lin(kb, 0, (Wq, oh0))
                runs: list[list[int]] = []
                for kh in khs:
                    r = runs[-1] if runs else None
                    if r and (r[0] * dh) % sh == (kh * dh) % sh and (len(r) < 2 or kh - r[-1] == r[1] - r[0]):
                        r.append(kh)
                    else:
                        runs.append([kh])
                row = 0
                for r in runs:
                    kh0, cnt = r[0], len(r)
                    step = r[1] - r[0] if cnt > 1 else 1
                    a_idx = geo.row_res.index((kh0 * dh) % sh)
                    qh0, dq = (kh0 * dh) // sh, (step * dh) // sh
                    with kb.loop(cnt) as jj:
                        prow = lin(kb, row, (Ci_g, jj))
                        rows_w = sub(kb, wb, prow, 0, [Ci_g, KW * wstride])
                        kh_t = lin(kb, kh0 * KW, (step * KW, jj))  # first tap of this kernel row
                        if whole_w:
                            kb.add(tile.LoadOp(wa, [gi, kb.const(0), kh_t, kb.const(0)], rows_w, cik,
                                               kb.const(KW * Co_g), 1, 3))
                        else:
                            with kb.loop(KW) as kw:
                                dst = sub(kb, rows_w, 0, lin(kb, 0, (COB, kw)), [Ci_g, COB])
                                tap = kb.addi(kh_t, kw)
                                if layout == "gihwo":
                                    kb.add(tile.LoadOp(wa, [gi, kb.const(0), tap, cb0], dst, cik, cob, 1, 3))
                                else:
                                    co = lin(kb, 0, (Co_g, gi), (1, cb0))
                                    kb.add(tile.LoadOp(wa, [co, kb.const(0), tap], dst, cik, cob, 1, 0))
                        for bi in range(ncol):
                            L = geo.lp(rb) + colmax[bi]
                            kb.add(tile.LoadOp(
                                sa, [n, ci, kb.const(a_idx * ncol + bi), lin(kb, qh0 * Wq, (1, p0), (dq * Wq, jj))],
                                sub(kb, slabs[bi], prow, 0, [Ci_g, L]), cik, kb.const(L), 1, 3,
                            ))
                    row += cnt * Ci_g
                for kw in range(KW):
                    bi = geo.col_res.index((kw * dw) % sw)
                    off = (kw * dw) // sw
                    flag = true_i1(kb) if gidx or kw else kb.ne_zero(kb.const(0))
                    with co_tiles(kb, BT, TCo, Co_g, cb0) as (j, co0, m), tiles(kb, lp, TP) as (_, q0, nq):
                        kb.add(tile.MatmulOp(
                            sub(kb, wb, 0, lin(kb, kw * wstride, (1, co0)), [TK, TCo]),
                            sub(kb, slabs[bi], 0, lin(kb, off, (1, q0)), [TK, TP]),
                            sub(kb, acc, 0, lin(kb, 0, (lp, j), (1, q0)), [TCo, TP]),
                            m, kk, nq, flag,
                        ))

            if fold:
                for gidx, khs in enumerate(groups):
                    fold_step(gidx, khs)
            else:
                k_loop(kb, Ci_g, TK, nk, double, kstep)
            with co_tiles(kb, BT, TCo, Co_g, cb0) as (j, co0, m):
                c0 = lin(kb, 0, (Co_g, gi), (1, cb0), (1, co0))
                if bbuf is not None and ba is not None:
                    kb.add(tile.LoadOp(ba, [c0, kb.const(0)], bbuf, m, kb.const(1), 0, -1))

                def compact(s_: SSAValue, d_: SSAValue, rows: SSAValue, cols: int) -> None:
                    if bbuf is not None:
                        kb.add(tile.BinaryOp("add", s_, bbuf, d_, rows, kb.const(cols), "column"))
                    else:
                        kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

                accrow = sub(kb, acc, 0, lin(kb, 0, (lp, j)), [TCo, lp])
                epi.emit(k, accrow, m, n, c0, kb.const(0), oh0, rb, Wq, compact)

        band_loop(kb, OH, RB, band)
    k.launch()


@contextmanager
def co_tiles(kb: KernelBuilder, BT: int, TCo: int, Co_g: int, cb0: SSAValue,
             ) -> Iterator[tuple[SSAValue, SSAValue, SSAValue]]:
    """The BT output-channel tiles of a block starting at `cb0`: (index in the block,
    offset in the block, size). Only the group's last tile can be partial."""
    with kb.loop(BT) as j:
        co0 = kb.muli(j, kb.const(TCo)) if BT > 1 else kb.const(0)
        if Co_g % TCo == 0:
            m = kb.const(TCo)
        else:
            m = kb.mini(kb.const(TCo), kb.subi(kb.const(Co_g), kb.addi(cb0, co0)))
        yield j, co0, m

