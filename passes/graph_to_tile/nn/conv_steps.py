"""The contraction of a convolution on the matrix engine: input-channel tiles, kernel
rows folded into K, fully folded (stem) blocks.

The implicit GEMM adds ``W[ci, co]^T @ slab[ci, p + off]`` per tap; its contraction (K,
on partitions) is a tile of input channels (every tap a column offset into the same
slab), or with few input channels several kernel rows stacked (K = rows x ci), or for a
stem every tap (K = ci x kh x kw):

    contraction_steps(geo(3x3, s1), Ci_g=256, KMAX=128, rb=4)
        -> [KStep(K=128, slabs=[3 * Wq + OW + 2 * Wq + 2], taps=[(0, 0, 0), (1, 0, 1), ...]), KStep(K=128, ...)]
    contraction_steps(geo(7x7, s2), Ci_g=3, KMAX=128, rb=4)   -> 1 step, K = 7 x 3, folded
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecc.passes.graph_to_tile.nn.common import cdiv
from tilecc.passes.graph_to_tile.nn.geometry import Geometry


def k_tiles(Ci: int, tk: int) -> tuple[int, int]:
    """(tile size, tile count) for the contraction over `Ci` input channels in tiles of at
    most `tk`, preferring an even count (double buffering takes tiles in pairs)."""
    n = cdiv(Ci, tk)
    if n > 1 and n % 2:
        for m in range(n + 1, 2 * n + 2, 2):
            t = cdiv(Ci, m)
            if cdiv(Ci, t) == m:
                return t, m
    return tk, n


@dataclass
class KStep:
    """One contraction step of the implicit GEMM: K rows on partitions, filled by `loads`
    (row offset, phase image, first input channel (group-relative), channels, position
    offset), one slab buffer per entry of `slabs` (its length); `taps` are (weight column
    block, slab index, column offset) and `wloads` the weight DMAs (row offset, channels,
    first tap, taps, first column block)."""
    K: int
    slabs: list[int]
    loads: list[list[tuple[int, int, int, int, int]]]
    taps: list[tuple[int, int, int]]
    wloads: list[tuple[int, int, int, int, int]]
    folded: bool = False


def contraction_steps(geo: Geometry, Ci_g: int, KMAX: int, rb: int) -> list[KStep]:
    """The contraction steps of a band of `rb` rows: input-channel tiles with every tap
    as a column offset, or (few input channels) groups of kernel rows folded into K."""
    KH, KW = geo.k
    (sh, sw), (dh, dw) = geo.s, geo.d
    lp = geo.lp(rb)
    ncol = len(geo.col_res)
    F = min(KH, KMAX // Ci_g) if KH > 1 else 1
    out: list[KStep] = []
    if F < 2:
        TK, nk = k_tiles(Ci_g, KMAX)
        for i in range(nk):
            ci0, kk = i * TK, min(TK, Ci_g - i * TK)
            slabs = [geo.slab(rb, p) for p in range(geo.nph)]
            loads = [[(0, p, ci0, kk, 0)] for p in range(geo.nph)]
            taps = [(t, p, off) for t, (_, _, p, off) in enumerate(geo.taps)]
            out.append(KStep(kk, slabs, loads, taps, [(0, kk, 0, len(geo.taps), 0)]))
        return out
    order = sorted(range(KH), key=lambda kh: ((kh * dh) % sh, kh))
    colmax = [max((kw * dw) // sw for kw in range(KW) if (kw * dw) % sw == geo.col_res[bi]) for bi in range(ncol)]
    for g0 in range(0, KH, F):
        khs = order[g0:g0 + F]
        K = len(khs) * Ci_g
        slabs = [lp + colmax[bi] for bi in range(ncol)]
        loads: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(ncol)]
        wloads: list[tuple[int, int, int, int, int]] = []
        for r, kh in enumerate(khs):
            a_idx = geo.row_res.index((kh * dh) % sh)
            off = ((kh * dh) // sh) * geo.Wq
            for bi in range(ncol):
                loads[bi].append((r * Ci_g, a_idx * ncol + bi, 0, Ci_g, off))
            wloads.append((r * Ci_g, Ci_g, kh * KW, KW, 0))
        taps = [(kw, geo.col_res.index((kw * dw) % sw), (kw * dw) // sw) for kw in range(KW)]
        out.append(KStep(K, slabs, loads, taps, wloads, True))
    return out


def stem_blocks(geo: Geometry, Ci: int) -> list[tuple[int, int, int, int, int, list[int]]]:
    """The contraction rows of a fully folded convolution (every tap in K): blocks of
    (kernel row, input channel, phase image, position offset, offset step, taps), each
    block a run of taps of one column phase whose offsets step evenly (one DMA reads the
    block's rows as shifted windows of one phase image)."""
    KH, KW = geo.k
    (sh, sw), (dh, dw) = geo.s, geo.d
    ncol = len(geo.col_res)
    out: list[tuple[int, int, int, int, int, list[int]]] = []
    for kh in range(KH):
        a_idx = geo.row_res.index((kh * dh) % sh)
        roff = ((kh * dh) // sh) * geo.Wq
        for ci in range(Ci):
            for bi, b in enumerate(geo.col_res):
                kws = [kw for kw in range(KW) if (kw * dw) % sw == b]
                offs = [(kw * dw) // sw for kw in kws]
                run: list[int] = []
                for kw, o in zip(kws, offs):
                    if len(run) >= 2 and o - (run[-1] * dw) // sw != ((run[1] - run[0]) * dw) // sw:
                        out.append((kh, ci, a_idx * ncol + bi, roff + (run[0] * dw) // sw,
                                    ((run[1] - run[0]) * dw) // sw if len(run) > 1 else 1, run))
                        run = []
                    run.append(kw)
                if run:
                    out.append((kh, ci, a_idx * ncol + bi, roff + (run[0] * dw) // sw,
                                ((run[1] - run[0]) * dw) // sw if len(run) > 1 else 1, run))
    return out

