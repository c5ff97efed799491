"""graph.pad of any dimensions in any mode: DMA copies of boxes, no vector work.

Every mode is separable (`graph_pad.source_index`): along each padded dim the output
splits into *runs* whose source indices step by +1 (the interior, a circular wrap),
stay put (a replicated edge) or are the fill value (constant mode). A reflected edge
steps by -1, which neither the tile level's strided views nor the bounds sanitiser
accept, so it is one run per element: p runs of one for a pad of p, cheap for the
small amounts real models use (1 to 3). The product of the runs of every dim is a set
of output *boxes*; each is one loop nest of DMAs (HBM -> SRAM -> HBM, rows along dim -2,
columns along dim -1) from a strided view of the input (a stride 0 repeats the edge)
or of a constant fill row. Adjacent unpadded dims are merged first, so an NCHW image
padded in H and W is a [N*C, H, W] copy, and each box drops its unit dims and merges
dims contiguous on both sides (`coalesce`), so its DMAs walk its two longest runs.

A non-constant pad of the innermost dim (amounts >= 0, a padded row fitting SRAM) is
built on chip instead (`_lower_mirrored`): the boxes are over the outer dims only, each
input row is DMA'd into the middle of a padded row buffer, the edge columns are vector
copies of its columns (one per reflected / replicated column, one per circular run),
and whole padded rows are stored: a reflected column costs a vector copy per tile
rather than a DMA descriptor per element.

    %y = graph.pad %x low [1, 0] high [1, 0] value 0.0 : f64 mode "reflect"
           : tensor<4x8xf32> -> tensor<6x8xf32>
      ->
    func.func @k0_pad_reflect(%b0: memref<1x8xf32, strided<[8, 1], offset: 8>>,  // x[1]
                              %b1: memref<4x8xf32>, %b2: memref<1x8xf32, ...offset: 16>,
                              %out: memref<6x8xf32>)
      tile.load %b0 -> %buf0 ; tile.store %buf0 -> %out[0, 0]
      tile.load %b1 -> %buf1 ; tile.store %buf1 -> %out[1, 0]
      tile.load %b2 -> %buf0 ; tile.store %buf0 -> %out[5, 0]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.ir import Attribute, SSAValue

from tilecc.ir import graph_pad as gp
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    fill_row,
    partition_bytes,
    sram_budget,
    sub,
    tiles,
    value_elem,
    value_shape,
)

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


@dataclass(frozen=True)
class Run:
    """Output indices ``[out0, out0 + n)`` of one dim read source ``src0 + step * k``
    (step 1 or 0), or the fill value (``src0`` None)."""

    out0: int
    n: int
    src0: int | None
    step: int


def runs(mode: str, size: int, low: int, high: int, out_size: int) -> list[Run]:
    """The runs of one dim, in output order."""
    found: list[Run] = []
    for o in range(out_size):
        s = gp.source_index(mode, size, low, high, o)
        if found:
            last = found[-1]
            if s is None and last.src0 is None:
                found[-1] = Run(last.out0, last.n + 1, None, 0)
                continue
            if s is not None and last.src0 is not None:
                step = s - (last.src0 + last.step * (last.n - 1))
                if (last.n == 1 and step in (0, 1)) or (last.n > 1 and step == last.step):
                    found[-1] = Run(last.out0, last.n + 1, last.src0, step)
                    continue
        found.append(Run(o, 1, s, 1))
    return found


def merged_dims(shape: tuple[int, ...], padded: list[bool]) -> list[list[int]]:
    """Groups of dims: each padded dim alone, runs of unpadded dims together."""
    groups: list[list[int]] = []
    for d, p in enumerate(padded):
        if groups and not p and not padded[groups[-1][-1]]:
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def coalesce(
    ext: Sequence[int], dst: Sequence[int], src: Sequence[int] | None,
) -> tuple[list[int], list[int], list[int] | None]:
    """A box's (extents, destination strides, source strides) with unit dims dropped and
    adjacent dims merged where both sides are contiguous across them, at rank >= 2: the
    DMAs then walk the two longest runs the box has (an NHWC window pad copies rows of
    W*C elements; a reflected row of an NCHW image is one [C, W] copy)."""
    keep = [d for d, n in enumerate(ext) if n > 1]
    e, ds = [ext[d] for d in keep], [dst[d] for d in keep]
    ss = None if src is None else [src[d] for d in keep]
    d = len(e) - 2
    while d >= 0:
        if ds[d] == ds[d + 1] * e[d + 1] and (ss is None or ss[d] == ss[d + 1] * e[d + 1]):
            e[d: d + 2] = [e[d] * e[d + 1]]
            ds[d: d + 2] = [ds[d + 1]]
            if ss is not None:
                ss[d: d + 2] = [ss[d + 1]]
        d -= 1
    lead = max(0, 2 - len(e))
    return [1] * lead + e, [0] * lead + ds, None if ss is None else [0] * lead + ss


def lower_pad_boxes(lw: LoweringContext, op: gp.PadOp, loc: str) -> None:
    x, res = op.input, op.results[0]
    shape, oshape = value_shape(x), value_shape(res)
    low = [int(v) for v in op.low.get_values()]
    mode = op.pad_mode
    elem = value_elem(res)
    out = lw.hbm(oshape, elem)
    lw.values[res] = out
    if math.prod(oshape) == 0:
        return
    high = [int(v) for v in op.high.get_values()]
    padded = [bool(lo or hi) for lo, hi in zip(low, high)]
    groups = merged_dims(shape, padded) or [[]]
    ishape = [math.prod(shape[d] for d in grp) for grp in groups]
    mshape = [math.prod(oshape[d] for d in grp) for grp in groups]
    mlow = [low[grp[0]] if len(grp) == 1 and padded[grp[0]] else 0 for grp in groups]
    mhigh = [high[grp[0]] if len(grp) == 1 and padded[grp[0]] else 0 for grp in groups]
    src = lw.view(lw.materialise(x), ishape) if math.prod(ishape) else None
    strides, offset = lw.layout(src) if src is not None else ((), 0)
    ostrides = tile.row_major(mshape)
    per_dim = [runs(mode, n, lo, hi, m) for n, lo, hi, m in zip(ishape, mlow, mhigh, mshape)]
    if src is not None and _mirrors_on_chip(lw, mode, mlow[-1], mhigh[-1], mshape[-1], elem):
        pieces = _edge_pieces(mode, ishape[-1], mlow[-1], mhigh[-1])
        _lower_mirrored(
            lw, loc, mode, src, out, per_dim[:-1], (mlow[-1], pieces), list(strides), offset, ishape, mshape, elem,
        )
        return
    plans: list[tuple[list[int], list[int], int, list[int] | None, int]] = []  # ext, dst, off, src, off
    for combo in itertools.product(*per_dim):
        ext = [r.n for r in combo]
        doff = sum(r.out0 * s for r, s in zip(combo, ostrides))
        if any(r.src0 is None for r in combo):
            e, ds, _ = coalesce(ext, ostrides, None)
            plans.append((e, ds, doff, None, 0))
        elif src is not None:  # (a source index exists only in a non-empty input)
            soff = offset + sum(r.src0 * s for r, s in zip(combo, strides) if r.src0 is not None)
            e, ds, ss = coalesce(ext, ostrides, [s * r.step for r, s in zip(combo, strides)])
            plans.append((e, ds, doff, ss, soff))
    fill_len = max([e[-1] for e, _, _, ss, _ in plans if ss is None], default=0)
    fill = fill_row(lw, float(op.value.value.data), elem, fill_len) if fill_len else None
    boxes: list[tuple[SSAValue, SSAValue]] = []  # (source view, destination view)
    for e, ds, doff, ss, soff in plans:
        if ss is None and fill is not None:
            sv = lw.strided(fill, e, [0] * (len(e) - 1) + [1], 0)
        elif ss is not None and src is not None:
            sv = lw.strided(src, e, ss, soff)
        else:
            continue
        boxes.append((sv, lw.strided(out, e, ds, doff)))
    args = list(dict.fromkeys([v for box in boxes for v in box]))
    kb = KernelBuilder(lw.kernel_name(f"pad_{mode}"), [a.type for a in args], loc)
    _copy_boxes(lw, kb, [(kb.args[args.index(a)], kb.args[args.index(b)]) for a, b in boxes], elem)
    lw.launch(kb, args)


BUFFERS = 4  # boxes in flight: a pad has many small boxes, each a DMA's fixed latency


def _copy_boxes(
    lw: LoweringContext, kb: KernelBuilder, boxes: list[tuple[SSAValue, SSAValue]], elem: Attribute,
) -> None:
    """Each box (kernel arguments of equal shape, source and destination) copied whole,
    through `BUFFERS` SRAM buffers in rotation, so several boxes' loads and stores are in
    flight at once."""
    rows = max(value_shape(b)[-2] for b, _ in boxes)
    cols = max(value_shape(b)[-1] for b, _ in boxes)
    nb = min(BUFFERS, len(boxes))
    TR, TC = min(lw.P, rows), lw.col_tile(cols, nb)
    bufs = [kb.alloc([TR, TC], elem, tile.SRAM, f"box{i}") for i in range(nb)]
    for i, (box, dst) in enumerate(boxes):
        ext = value_shape(box)
        rank = len(ext)
        ivs: list[SSAValue] = []

        def body(box: SSAValue = box, dst: SSAValue = dst, ext: tuple[int, ...] = ext, i: int = i,
                 rank: int = rank) -> None:
            with tiles(kb, ext[-2], TR) as (_, r0, r), tiles(kb, ext[-1], TC) as (_, c0, c):
                idx = [*ivs, r0, c0]
                buf = sub(kb, bufs[i % nb], 0, 0, [TR, TC])
                kb.add(tile.LoadOp(box, idx, buf, r, c, rank - 2, rank - 1))
                kb.add(tile.StoreOp(buf, dst, idx, r, c, rank - 2, rank - 1))

        lw.outer_loops(kb, list(ext[:-2]), ivs, body)


# ---------------------------------------------------------------------------
# The last dim on chip
# ---------------------------------------------------------------------------


def _mirrors_on_chip(lw: LoweringContext, mode: str, lo: int, hi: int, ow: int, elem: Attribute) -> bool:
    """Whether a non-constant pad of the innermost dim (amounts >= 0) is built in SRAM:
    padded rows of `ow` elements, `BUFFERS` of them per partition."""
    if mode == "constant" or lo < 0 or hi < 0 or not (lo or hi):
        return False
    return BUFFERS * partition_bytes(ow, element_size(elem)) <= sram_budget(lw) // 2


def _edge_pieces(mode: str, size: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The edge columns of a padded row as copies (output column, input column, count):
    runs of consecutive columns reading consecutive ones (a circular wrap), else one
    column each (a reflection, a replicated edge)."""
    pieces: list[tuple[int, int, int]] = []
    for o in [*range(lo), *range(lo + size, lo + size + hi)]:
        s = gp.source_index(mode, size, lo, hi, o)
        if s is None:
            continue
        if pieces and pieces[-1][0] + pieces[-1][2] == o and pieces[-1][1] + pieces[-1][2] == s:
            d0, s0, n = pieces[-1]
            pieces[-1] = (d0, s0, n + 1)
        else:
            pieces.append((o, s, 1))
    return pieces


def _lower_mirrored(
    lw: LoweringContext, loc: str, mode: str, src: SSAValue, out: SSAValue, outer: list[list[Run]],
    edge: tuple[int, list[tuple[int, int, int]]], strides: list[int], offset: int, ishape: list[int],
    mshape: list[int], elem: Attribute,
) -> None:
    """Rows of the innermost dim padded on chip: per box of the outer dims, whole input
    rows land in the middle of a padded row buffer (one DMA), the edge columns are
    vector copies of columns of that row (one per reflected / replicated column, one per
    circular run), and whole padded rows are stored (one DMA). A reflected edge then
    costs a few vector copies per tile instead of a DMA element per row."""
    W, OW = ishape[-1], mshape[-1]
    lo, pieces = edge  # the left amount, the edge columns' copies
    ostrides = list(tile.row_major(mshape))
    boxes: list[tuple[SSAValue, SSAValue]] = []
    for combo in itertools.product(*outer):
        ext = [r.n for r in combo]
        doff = sum(r.out0 * st for r, st in zip(combo, ostrides))
        soff = offset + sum((r.src0 or 0) * st for r, st in zip(combo, strides))
        e, ds, ss = coalesce(ext, ostrides[:-1], [st * r.step for r, st in zip(combo, strides)])
        if ss is None:
            continue
        boxes.append((lw.strided(src, [*e, W], [*ss, strides[-1]], soff), lw.strided(out, [*e, OW], [*ds, 1], doff)))
    args = list(dict.fromkeys([v for box in boxes for v in box]))
    kb = KernelBuilder(lw.kernel_name(f"pad_{mode}"), [a.type for a in args], loc)
    rows = max(math.prod(value_shape(b)[-2:-1]) for b, _ in boxes)
    TR = min(lw.P, rows)
    bufs = [kb.alloc([TR, OW], elem, tile.SRAM, f"row{i}") for i in range(BUFFERS)]
    for i, (a, b) in enumerate(boxes):
        sa, sb = kb.args[args.index(a)], kb.args[args.index(b)]
        ext = value_shape(sa)
        rank = len(ext)
        ivs: list[SSAValue] = []
        q = bufs[i % BUFFERS]

        def body(sa: SSAValue = sa, sb: SSAValue = sb, ext: tuple[int, ...] = ext, rank: int = rank,
                 q: SSAValue = q) -> None:
            with tiles(kb, ext[-2], TR) as (_, r0, r):
                zero = kb.const(0)
                mid = sub(kb, q, 0, lo, [TR, W])
                kb.add(tile.LoadOp(sa, [*ivs, r0, zero], mid, r, kb.const(W), rank - 2, rank - 1))
                for d0, s0, n in pieces:
                    kb.add(tile.UnaryOp("copy", sub(kb, q, 0, lo + s0, [TR, n]), sub(kb, q, 0, d0, [TR, n]),
                                        r, kb.const(n)))
                kb.add(tile.StoreOp(q, sb, [*ivs, r0, zero], r, kb.const(OW), rank - 2, rank - 1))

        lw.outer_loops(kb, list(ext[:-2]), ivs, body)
    lw.launch(kb, args)
