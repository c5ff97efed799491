"""lower-graph-to-tile, continued: tile kernels for convolutional-network ops (convolution, pooling, batch norm, resizing, padding).

Each function takes the `GraphToTile` lowering state, the graph op and its source
location, emits kernels with `KernelBuilder` and records the op's HBM result in
`lowering.values`.

Layout of the windowed ops (convolution, pooling): channels on partitions, output
positions along the free dimension. A *phase image* of the (padded) input makes every
window tap a contiguous run of columns:

- a padding kernel writes ``xq[n, c, phase, i * Wq + j] = x[n, c, i*s + a - pad, j*s + b - pad]``
  (the fill value outside ``x``) for each phase ``(a, b)`` of the stride that some tap
  uses (one phase when the stride is 1; no kernel at all without padding and stride);
- output ``(oh, ow)`` is flat position ``p = oh * Wq + ow``; tap ``(kh, kw)`` reads
  ``xq[.., phase(kh, kw), p + off(kh, kw)]``, so a tap is a column offset into one
  on-chip *slab* of the phase image. Positions with ``ow >= OW`` are computed and
  dropped (``Wq - OW`` extra columns per output row).

Convolution (implicit GEMM on the systolic array): for a band of output rows and a
block of output channels, the accumulator holds ``[co x positions]`` tiles;
for every input-channel tile (K) the weights of all taps (one DMA from the packed
``gihwo`` layout) and one slab per phase are loaded, then every tap adds
``W[ci, co]^T @ slab[ci, p + off]`` (M = output channels, N = positions). Weights and
slabs are double buffered over the input-channel tiles (pairs of tiles use two buffer
sets, so one pair's loads overlap the other's matmuls). Variants:

- few output positions (the whole image fits the accumulator's partitions, e.g. the
  last stages of a CNN): positions are M and output channels N, so a matmul streams
  only the real positions; stores walk the channels with the spatial stride;
- few input channels (a stem convolution): F kernel rows are folded into the
  contraction (K = kh x ci), so 3 input channels do not leave 13 of 16 array rows idle.

Depthwise convolutions (one input channel per group) and pooling run on the vector
engine: per tap a per-partition column multiply (depthwise) or a max / add.

The epilogue copies the accumulator row by row into a compact ``[c x rows*OW]`` tile
(adding the bias, rounding to the output type) and applies the elementwise ops that
follow a convolution as its only user (batch-norm scale and shift per channel, a
residual add, relu / clamp / any unary op): they are fused here and never become
kernels of their own. One store per tile writes NCHW rows.

Reductions put the reduced elements along the free dimension (`tile.reduce`) when they
are innermost, and otherwise combine whole tiles with vector ops while walking the
reduced dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects import arith
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    Float32Type,
    MemRefType,
    TensorType,
    f32,
)
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir import graph as g
from tilecc.ir import graph_nn as nn
from tilecc.ir import tile
from tilecc.passes.kernel_builder import KernelBuilder

# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def _shape(v: SSAValue | Attribute) -> tuple[int, ...]:
    t = v.type if isinstance(v, SSAValue) else v
    assert isinstance(t, (TensorType, MemRefType))
    return tuple(t.get_shape())


def _elem(v: SSAValue | Attribute) -> Attribute:
    t = v.type if isinstance(v, SSAValue) else v
    assert isinstance(t, (TensorType, MemRefType))
    return t.element_type


def _isz(elem: Attribute) -> int:
    return 4 if isinstance(elem, Float32Type) else 2


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_ALIGN = 64


def _bytes(cols: int, isz: int) -> int:
    """Bytes per partition of a buffer, with plan-sram's alignment."""
    return _cdiv(cols * isz, _ALIGN) * _ALIGN


def _budget(lw) -> int:
    return lw.cfg.sram.bytes_per_partition


def lin(kb: KernelBuilder, c: int, *terms: tuple[int, SSAValue]) -> SSAValue:
    """The index ``c + sum(k * v)`` (k constant)."""
    acc: SSAValue | None = None
    for k, v in terms:
        if k == 0:
            continue
        t = v if k == 1 else kb.muli(v, kb.const(k))
        acc = t if acc is None else kb.addi(acc, t)
    if acc is None:
        return kb.const(c)
    return acc if c == 0 else kb.addi(acc, kb.const(c))


def _idx(kb: KernelBuilder, v: int | SSAValue) -> SSAValue:
    return kb.const(v) if isinstance(v, int) else v


def sub(kb: KernelBuilder, buf: SSAValue, row: int | SSAValue, col: int | SSAValue, shape: Sequence[int]) -> SSAValue:
    """A window of an on-chip buffer (`tile.subview`); its static shape is clipped to the
    buffer (and to a constant offset), the sizes of the ops using it are the real extents."""
    src = _shape(buf)
    offs = [row if isinstance(row, int) else None, col if isinstance(col, int) else None]
    shape = [max(1, min(s, lim - (o or 0))) for s, lim, o in zip(shape, src, offs)]
    if shape == list(src) and row == 0 and col == 0:
        return buf
    return kb.add(tile.SubviewOp(buf, _idx(kb, row), _idx(kb, col), shape)).results[0]


def true_i1(kb: KernelBuilder) -> SSAValue:
    if 1 not in kb._bool:
        kb._bool[1] = kb._add_entry(arith.ConstantOp.from_int_and_width(1, 1))
    return kb._bool[1]


@contextmanager
def tiles(kb: KernelBuilder, extent: int, size: int) -> Iterator[tuple[SSAValue, SSAValue, SSAValue]]:
    """Loop over `extent` in tiles of `size`: yields (tile index, start, size of this tile)."""
    trip = _cdiv(extent, size)
    with kb.loop(trip) as i:
        start = kb.muli(i, kb.const(size)) if trip > 1 else kb.const(0)
        if extent % size == 0 or trip == 1:
            n = kb.const(min(size, extent))
        else:
            n = kb.mini(kb.const(size), kb.subi(kb.const(extent), start))
        yield i, start, n


def const_hbm(lw, data: np.ndarray | float, elem: Attribute) -> SSAValue:
    """An HBM constant of `data` (cached per value for scalars)."""
    arr = np.asarray(data, dtype=np.float32)
    cache = lw.__dict__.setdefault("_nn_consts", {})
    key = None
    if arr.size == 1:
        key = (arr.reshape(-1)[0].tobytes(), str(elem), arr.shape)
        if key in cache:
            return cache[key]
    shape = list(arr.shape) or [1]
    attr = DenseIntOrFPElementsAttr.from_list(TensorType(elem, shape), arr.reshape(-1).tolist())
    v = lw.hbm(shape, elem, value=attr)
    if key is not None:
        cache[key] = v
    return v


def fill_row(lw, value: float, elem: Attribute, length: int) -> SSAValue:
    """An HBM constant row of at least `length` copies of `value` (shared by kernels)."""
    cache = lw.__dict__.setdefault("_nn_fill_rows", {})
    key = (np.float32(value).tobytes(), str(elem))
    have = cache.get(key)
    if have is None or _shape(have)[0] < length:
        n = max(length, 64)
        data = np.full((n,), value, dtype=np.float32)
        attr = DenseIntOrFPElementsAttr.from_list(TensorType(elem, [n]), data.tolist())
        cache[key] = lw.hbm([n], elem, value=attr)
    return cache[key]


def fill(kb: KernelBuilder, buf: SSAValue, rows: SSAValue, cols: int, row_arg: SSAValue) -> None:
    """``buf[:rows, :cols] = value``: one row-broadcast DMA of the constant row `row_arg`
    (a `fill_row` kernel argument)."""
    kb.add(tile.LoadOp(row_arg, [kb.const(0)], sub(kb, buf, 0, 0, [_shape(buf)[0], cols]), rows,
                       kb.const(cols), -1, 0))


class _Kernel:
    """A kernel under construction whose HBM arguments are collected up front."""

    def __init__(self, lw, what: str, loc: str, args: Sequence[SSAValue]):
        self.lw = lw
        self.hbm_args = list(args)
        self.kb = KernelBuilder(lw.kernel_name(what), [a.type for a in args], loc)

    def arg(self, v: SSAValue) -> SSAValue:
        return self.kb.args[self.hbm_args.index(v)]

    def launch(self) -> None:
        self.lw.launch(self.kb, self.hbm_args)


# ---------------------------------------------------------------------------
# window geometry and the phase image
# ---------------------------------------------------------------------------


@dataclass
class Geometry:
    N: int
    C: int
    H: int
    W: int
    OH: int
    OW: int
    k: tuple[int, int]
    s: tuple[int, int]
    p: tuple[int, int]
    d: tuple[int, int]
    row_res: list[int] = field(default_factory=list)
    col_res: list[int] = field(default_factory=list)
    Hq: int = 0
    Wq: int = 0
    taps: list[tuple[int, int, int, int]] = field(default_factory=list)  # kh, kw, phase, offset
    maxoff: list[int] = field(default_factory=list)  # per phase

    def __post_init__(self) -> None:
        (KH, KW), (sh, sw), (dh, dw) = self.k, self.s, self.d
        self.row_res = sorted({(kh * dh) % sh for kh in range(KH)})
        self.col_res = sorted({(kw * dw) % sw for kw in range(KW)})
        self.Hq = self.OH + ((KH - 1) * dh) // sh
        self.Wq = self.OW + ((KW - 1) * dw) // sw
        nb = len(self.col_res)
        self.maxoff = [0] * (len(self.row_res) * nb)
        for kh in range(KH):
            for kw in range(KW):
                ph = self.row_res.index((kh * dh) % sh) * nb + self.col_res.index((kw * dw) % sw)
                off = ((kh * dh) // sh) * self.Wq + (kw * dw) // sw
                self.taps.append((kh, kw, ph, off))
                self.maxoff[ph] = max(self.maxoff[ph], off)

    @property
    def nph(self) -> int:
        return len(self.row_res) * len(self.col_res)

    @property
    def phases(self) -> list[tuple[int, int]]:
        return [(a, b) for a in self.row_res for b in self.col_res]

    @property
    def direct(self) -> bool:
        """The input itself is the (only) phase image: no padding kernel."""
        return self.s == (1, 1) and self.p == (0, 0) and self.Hq == self.H and self.Wq == self.W

    def lp(self, rb: int) -> int:
        """Flat positions of a band of `rb` output rows."""
        return (rb - 1) * self.Wq + self.OW

    def slab(self, rb: int, ph: int) -> int:
        return self.lp(rb) + self.maxoff[ph]


def phase_image(lw, x: SSAValue, geo: Geometry, fill_value: float, loc: str, what: str) -> SSAValue:
    """HBM ``[N, C, phases, Hq * Wq]``: the phase images of the padded input `x`."""
    src = lw.materialise(x)
    if geo.direct:
        return lw.view(src, (geo.N, geo.C, 1, geo.H * geo.W))
    out = lw.hbm((geo.N, geo.C, geo.nph, geo.Hq * geo.Wq), _elem(src))
    pad_kernel(
        lw, f"{what}_pad", loc, lw.view(src, (geo.N, geo.C, geo.H, geo.W)), out,
        geo.phases, geo.s, geo.p, geo.Hq, geo.Wq, fill_value,
    )
    return out


def pad_kernel(
    lw, what: str, loc: str, x: SSAValue, out: SSAValue, phases: list[tuple[int, int]],
    s: tuple[int, int], pad: tuple[int, int], Hq: int, Wq: int, fill_value: float,
) -> None:
    """``out[n, c, ph, i*Wq + j] = x[n, c, i*sh + a - pt, j*sw + b - pl]`` (or the fill value)
    for each phase ``(a, b)``; `x` is [N, C, H, W], `out` [N, C, len(phases), Hq*Wq]."""
    N, C, H, W = _shape(x)
    elem = _elem(x)
    isz = _isz(elem)
    (sh, sw), (pt, pl) = s, pad
    TC = min(lw.P, C)
    nph = len(phases)
    budget = _budget(lw) - 2 * _ALIGN
    contiguous = sh == 1 and sw == 1
    stage_cols = H * W if contiguous else 0
    whole = nph * _bytes(Hq * Wq, isz) + _bytes(max(stage_cols, 1), isz) <= budget
    if whole:
        CR = Hq
    else:
        CR = budget // ((Wq + (W if contiguous else 0)) * isz)
        if CR < 1:
            raise TensorTooLargeError(
                f"{what} at {loc}: a padded row of {Wq} elements does not fit one SRAM partition"
            )
        CR = min(CR, Hq)
        stage_cols = CR * W if contiguous else 0
    fval = fill_row(lw, fill_value, elem, (Hq if whole else CR) * Wq)
    xflat = lw.view(x, (N, C, H * W))
    k = _Kernel(lw, what, loc, [x, xflat, fval, out])
    kb = k.kb
    xa, xfa, fa, oa = (k.arg(v) for v in (x, xflat, fval, out))
    chunks = [(q0, min(Hq, q0 + CR)) for q0 in range(0, Hq, CR)]

    def interior(a: int, b: int, q0: int, q1: int):
        ilo = max(0, _cdiv(pt - a, sh))
        ihi = min(Hq, (H - 1 + pt - a) // sh + 1)
        jlo = max(0, _cdiv(pl - b, sw))
        jhi = min(Wq, (W - 1 + pl - b) // sw + 1)
        i0, i1 = max(ilo, q0), min(ihi, q1)
        full = i0 == q0 and i1 == q1 and jlo == 0 and jhi == Wq
        return i0, i1, jlo, jhi, full

    qbufs = (
        [kb.alloc([TC, Hq * Wq], elem, tile.SRAM, f"q{i}") for i in range(nph)]
        if whole else [kb.alloc([TC, CR * Wq], elem, tile.SRAM, "q")]
    )
    stage = kb.alloc([TC, stage_cols], elem, tile.SRAM, "stage") if stage_cols else None
    if whole:  # the padding positions are the same for every (n, c): fill once
        for pi, (a, b) in enumerate(phases):
            if not interior(a, b, 0, Hq)[4]:
                fill(kb, qbufs[pi], kb.const(TC), Hq * Wq, fa)
    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        for pi, (a, b) in enumerate(phases):
            for q0, q1 in chunks:
                qb = qbufs[pi] if whole else qbufs[0]
                i0, i1, jlo, jhi, full = interior(a, b, q0, q1)
                if not whole and not full:
                    fill(kb, qb, c, (q1 - q0) * Wq, fa)
                nr, nc = i1 - i0, jhi - jlo
                if nr > 0 and nc > 0:
                    h0 = i0 * sh + a - pt
                    w0 = jlo * sw + b - pl
                    if contiguous and nc == W and Wq == W:
                        dst = sub(kb, qb, 0, (i0 - q0) * Wq, [TC, nr * W])
                        kb.add(tile.LoadOp(xfa, [n, c0, kb.const(h0 * W)], dst, c, kb.const(nr * W), 1, 2))
                    elif contiguous:
                        st = sub(kb, stage, 0, 0, [TC, nr * W])
                        kb.add(tile.LoadOp(xfa, [n, c0, kb.const(h0 * W)], st, c, kb.const(nr * W), 1, 2))
                        with kb.loop(nr) as r:
                            s_ = sub(kb, stage, 0, lin(kb, w0, (W, r)), [TC, nc])
                            d_ = sub(kb, qb, 0, lin(kb, (i0 - q0) * Wq + jlo, (Wq, r)), [TC, nc])
                            kb.add(tile.UnaryOp("copy", s_, d_, c, kb.const(nc)))
                    else:
                        with kb.loop(nr) as r:
                            d_ = sub(kb, qb, 0, lin(kb, (i0 - q0) * Wq + jlo, (Wq, r)), [TC, nc])
                            kb.add(tile.LoadOp(
                                xa, [n, c0, lin(kb, h0, (sh, r)), kb.const(w0)], d_, c, kb.const(nc),
                                1, 3, 1, sw,
                            ))
                rows = q1 - q0
                kb.add(tile.StoreOp(
                    sub(kb, qb, 0, 0, [TC, rows * Wq]), oa, [n, c0, kb.const(pi), kb.const(q0 * Wq)],
                    c, kb.const(rows * Wq), 1, 3,
                ))
    k.launch()


# ---------------------------------------------------------------------------
# epilogue: compaction, fused elementwise ops, store
# ---------------------------------------------------------------------------


@dataclass
class Step:
    kind: str  # "unary" | "scalar" | "column" | "tile"
    fn: str
    imm: float = 0.0
    swap: bool = False
    value: SSAValue | None = None  # HBM operand (column / tile)


def _fusable_fns():
    from tilecc.passes.graph_to_tile import BINARY, UNARY

    binary = dict(BINARY)
    try:
        from tilecc.ir import graph_index as gi

        binary[gi.MinimumOp] = "min"
    except (ImportError, AttributeError):
        pass
    return UNARY, binary


_COMMUTATIVE = ("add", "mul", "max", "min")


def _ready(lw, v: SSAValue, before: Operation) -> bool:
    """Whether `v` is lowered; a later weight / constant is lowered now (the walk of
    lower-graph-to-tile skips ops whose result is already lowered)."""
    if v in lw.values or v in lw.scalars:
        return True
    owner = v.owner
    if isinstance(owner, (g.WeightOp, g.ConstantOp)) and owner.parent_block() is before.parent_block():
        lw.lower(owner)
        return True
    return False


def fuse_epilogue(lw, op: Operation, channels: int) -> tuple[list[Step], list[Operation]]:
    """The chain of elementwise ops that consume `op`'s result as their only user and can
    run in its epilogue (result shape [N, C, OH, OW] with `channels` = C)."""
    unary, binary = _fusable_fns()
    cur = op.results[0]
    N, C, OH, OW = _shape(cur)
    steps: list[Step] = []
    fused: list[Operation] = []
    while True:
        if not cur.has_one_use():
            break
        user = cur.get_user_of_unique_use()
        if user is None or user.parent_block() is not op.parent_block() or not user.results:
            break
        if user.results[0].type != cur.type:
            break
        if type(user) in unary:
            new = [Step("unary", unary[type(user)])]
        elif isinstance(user, g.GeluOp):
            approx = user.properties["approximate"].data
            new = [Step("unary", "gelu" if approx == "none" else "gelu_tanh")]
        elif type(user) in binary:
            fn = binary[type(user)]
            lhs, rhs = user.operands
            if lhs is cur and rhs is cur:
                break
            other, chain_rhs = (rhs, False) if lhs is cur else (lhs, True)
            if not _ready(lw, other, op):
                break
            if other in lw.scalars:
                new = [Step("scalar", fn, imm=lw.scalars[other], swap=chain_rhs)]
            else:
                shp = _shape(other)
                if len(shp) > 4:
                    break
                full = (1,) * (4 - len(shp)) + shp
                if full[0] == 1 and full[2] == 1 and full[3] == 1 and full[1] in (1, C):
                    if chain_rhs and fn not in _COMMUTATIVE:
                        if fn != "sub":
                            break
                        new = [Step("column", "sub", value=lw.materialise(other)), Step("unary", "neg")]
                    else:
                        new = [Step("column", fn, value=lw.materialise(other))]
                elif full[1:] == (C, OH, OW) and full[0] in (1, N):
                    new = [Step("tile", fn, swap=chain_rhs, value=lw.materialise(other))]
                else:
                    break
        else:
            break
        steps.extend(new)
        fused.append(user)
        cur = user.results[0]
    return steps, fused


def finish_fusion(lw, op: Operation, fused: list[Operation], out: SSAValue) -> None:
    """Record `out` as the value of `op` and of its fused users; drop the fused ops."""
    res = op.results[0]
    if fused:
        fused[-1].results[0].replace_all_uses_with(res)
        for u in reversed(fused):
            u.detach()
            u.erase()
    lw.values[res] = out


class Epilogue:
    """Compaction of a ``[channels x positions]`` tile to NCHW rows, the fused steps and
    the store. Channel of partition r: ``(c0 + r) * m + j`` (m: depthwise multiplier)."""

    def __init__(self, lw, steps: list[Step], out: SSAValue, N: int, C: int, OH: int, OW: int, m: int = 1):
        self.lw, self.steps, self.N, self.C, self.OH, self.OW, self.m = lw, steps, N, C, OH, OW, m
        S = OH * OW
        self.out = lw.view(out, (N, C // m, m, S))
        self.views: list[SSAValue] = []
        for st in steps:
            if st.kind == "column":
                shp = _shape(st.value)
                size = math.prod(shp)
                st.value = lw.view(st.value, (C // m, m) if size == C else (1, 1))
                self.views.append(st.value)
            elif st.kind == "tile":
                n0 = math.prod(_shape(st.value)) // (C * S)
                st.value = lw.view(st.value, (n0, C // m, m, S))
                self.views.append(st.value)

    def hbm_args(self) -> list[SSAValue]:
        return [*self.views, self.out]

    def alloc(self, kb: KernelBuilder, TC: int, cols: int, elem: Attribute) -> None:
        self.ob = kb.alloc([TC, cols], elem, tile.SRAM, "out")
        self.bufs: list[SSAValue | None] = []
        for st in self.steps:
            if st.kind == "column":
                self.bufs.append(kb.alloc([TC, 1], _elem(st.value), tile.SRAM, "chan"))
            elif st.kind == "tile":
                self.bufs.append(kb.alloc([TC, cols], _elem(st.value), tile.SRAM, "operand"))
            else:
                self.bufs.append(None)

    def sram_bytes(self, cols: int, out_isz: int) -> int:
        total = _bytes(cols, out_isz)
        for st in self.steps:
            if st.kind == "column":
                total += _ALIGN
            elif st.kind == "tile":
                total += _bytes(cols, out_isz)
        return total

    def emit(
        self, k: _Kernel, src: SSAValue, rows: SSAValue, n: SSAValue, c0: SSAValue, j: SSAValue,
        oh0: SSAValue, rb: int, Wq: int, compact: Callable[..., None], row_aware: bool = False,
    ) -> None:
        """`src`: the band's positions (row r of the band at column r * Wq); `compact(s, d,
        rows, cols)` writes the rounded output of a piece of it."""
        kb = k.kb
        OW = self.OW
        TC = _shape(self.ob)[0]
        cols = rb * OW
        if Wq == OW:
            compact(sub(kb, src, 0, 0, [TC, cols]), sub(kb, self.ob, 0, 0, [TC, cols]), rows, cols)
        else:
            with kb.loop(rb) as r:
                extra = {"r": r} if row_aware else {}
                compact(
                    sub(kb, src, 0, lin(kb, 0, (Wq, r)), [TC, OW]),
                    sub(kb, self.ob, 0, lin(kb, 0, (OW, r)), [TC, OW]), rows, OW, **extra,
                )
        ob = sub(kb, self.ob, 0, 0, [TC, cols])
        cc = kb.const(cols)
        s0 = lin(kb, 0, (OW, oh0))
        for st, buf in zip(self.steps, self.bufs):
            if st.kind == "unary":
                kb.add(tile.UnaryOp(st.fn, ob, ob, rows, cc))
            elif st.kind == "scalar":
                kb.add(tile.ScalarOp(st.fn, ob, st.imm, ob, rows, cc, swap=st.swap))
            elif st.kind == "column":
                v = k.arg(st.value)
                if _shape(st.value) == (1, 1):
                    kb.add(tile.LoadOp(v, [kb.const(0), kb.const(0)], buf, rows, kb.const(1), -1, -1))
                else:
                    kb.add(tile.LoadOp(v, [c0, j], buf, rows, kb.const(1), 0, -1))
                kb.add(tile.BinaryOp(st.fn, ob, buf, ob, rows, cc, "column"))
            else:
                v = k.arg(st.value)
                nn_ = n if _shape(st.value)[0] == self.N else kb.const(0)
                tb = sub(kb, buf, 0, 0, [TC, cols])
                kb.add(tile.LoadOp(v, [nn_, c0, j, s0], tb, rows, cc, 1, 3))
                a, b = (tb, ob) if st.swap else (ob, tb)
                kb.add(tile.BinaryOp(st.fn, a, b, ob, rows, cc))
        kb.add(tile.StoreOp(ob, k.arg(self.out), [n, c0, j, s0], rows, cc, 1, 3))


# ---------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------


def lower_conv2d(lw, op: nn.Conv2dOp, loc: str) -> None:
    (sh, sw), (ph, pw), (dh, dw), G, layout = op.params
    x, w, b = op.input, op.weight, op.bias
    N, C, H, W = _shape(x)
    res = op.results[0]
    _, Co, OH, OW = _shape(res)
    ws = _shape(w)
    KH, KW = (ws[2], ws[3])
    Ci_g, Co_g = C // G, Co // G
    geo = Geometry(N, C, H, W, OH, OW, (KH, KW), (sh, sw), (ph, pw), (dh, dw))
    steps, fused = fuse_epilogue(lw, op, Co)
    out = lw.hbm((N, Co, OH, OW), _elem(res))
    src = phase_image(lw, x, geo, 0.0, loc, "conv2d")
    if Ci_g == 1:
        _conv_vector(lw, op, loc, geo, src, steps, out, G, Co_g, layout)
    elif not _conv_gemm_small(lw, op, loc, geo, src, steps, out, G, Ci_g, Co_g, layout):
        _conv_gemm(lw, op, loc, geo, src, steps, out, G, Ci_g, Co_g, layout)
    finish_fusion(lw, op, fused, out)


def _pick_band(geo: Geometry, fits: Callable[[int], bool]) -> int:
    """The tallest band of output rows that fits and divides OH (so one loop of equal
    bands covers the output: every instruction has a single static copy)."""
    best = 0
    for rb in range(1, geo.OH + 1):
        if geo.OH % rb == 0 and fits(rb):
            best = rb
        elif not fits(rb):
            break
    return best


def _bands(kb: KernelBuilder, OH: int, RB: int, body: Callable[[SSAValue, int], None]) -> None:
    """`body(oh0, RB)` for the OH / RB bands of RB output rows."""
    assert OH % RB == 0
    with kb.loop(OH // RB) as bi:
        body(lin(kb, 0, (RB, bi)), RB)


def _k_tiles(Ci: int, tk: int) -> tuple[int, int]:
    """(tile size, tile count) for the contraction over `Ci` input channels in tiles of at
    most `tk`, preferring an even count (double buffering takes tiles in pairs)."""
    n = _cdiv(Ci, tk)
    if n > 1 and n % 2:
        for m in range(n + 1, 2 * n + 2, 2):
            t = _cdiv(Ci, m)
            if _cdiv(Ci, t) == m:
                return t, m
    return tk, n


def _k_loop(kb: KernelBuilder, Ci: int, TK: int, n: int, double: bool,
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


def _conv_gemm(lw, op, loc, geo: Geometry, src, steps, out, G, Ci_g, Co_g, layout) -> None:
    cfg = lw.cfg
    x, w, b = op.input, op.weight, op.bias
    elem = _elem(x)
    out_elem = _elem(op.results[0])
    isz, osz = _isz(elem), _isz(out_elem)
    T = len(geo.taps)
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Co = G * Co_g
    KMAX = min(cfg.matrix.rows, lw.P)
    TK, nk = _k_tiles(Ci_g, KMAX)
    TCo = min(cfg.accumulator.partitions, lw.P, Co_g)
    TP = min(cfg.matrix.cols, 512)
    A = cfg.accumulator.bytes_per_partition // 4
    epi = Epilogue(lw, steps, out, N, Co, OH, OW)
    budget = _budget(lw)
    co_tiles = _cdiv(Co_g, TCo)
    KH, KW = geo.k
    # few input channels: fold F kernel rows into the contraction (K = kh x ci)
    F = min(KH, KMAX // Ci_g) if KH > 1 else 1
    fold = F >= 2
    ncol = len(geo.col_res)
    (sh, sw), (dh, dw) = geo.s, geo.d
    if fold:
        # kernel rows ordered by stride phase, F per contraction step
        order = sorted(range(KH), key=lambda kh: ((kh * dh) % sh, kh))
        groups = [order[i:i + F] for i in range(0, KH, F)]
        TK, nk = F * Ci_g, len(groups)
        colmax = [max((kw * dw) // sw for kw in range(KW) if (kw * dw) % sw == geo.col_res[bi])
                  for bi in range(ncol)]
    double = nk > 1

    def kbytes(rb: int, bt: int) -> int:
        """SRAM bytes of one buffer set (weights and slabs of one contraction step)."""
        if fold:
            return _bytes(KW * bt * TCo, isz) + sum(_bytes(geo.lp(rb) + colmax[bi], isz) for bi in range(ncol))
        return _bytes(T * bt * TCo, isz) + sum(_bytes(geo.slab(rb, p), isz) for p in range(geo.nph))

    def fits(rb: int, bt: int) -> bool:
        """Band of rb rows, blocks of bt output-channel tiles."""
        lp = geo.lp(rb)
        if bt * lp > A:
            return False
        need = kbytes(rb, bt) * (2 if double else 1)
        need += epi.sram_bytes(rb * OW, osz) + (_ALIGN if b is not None else 0)
        return need <= budget

    # output-channel blocks of BT tiles (BT divides the tile count): prefer all at once
    RB, BT = 0, 0
    for dbl in ((True, False) if double else (False,)):
        double = dbl
        for bt in sorted((d for d in range(1, co_tiles + 1) if co_tiles % d == 0), reverse=True):
            RB = _pick_band(geo, lambda rb, bt=bt: fits(rb, bt))
            if RB:
                BT = bt
                break
        if RB:
            break
    if not RB:
        raise TensorTooLargeError(
            f"graph.conv2d at {loc}: one output row ({OW} positions, {T} taps) does not fit "
            f"the accumulator / SRAM"
        )
    NB = co_tiles // BT
    COB = BT * TCo  # output channels per block (the last block's last tile may be partial)
    whole_w = layout == "gihwo" and NB == 1
    wv = lw.materialise(w)
    if layout == "gihwo":
        wview = lw.view(wv, (G, Ci_g, T, Co_g))
    else:
        wview = lw.view(wv, (Co, Ci_g, T))
    bview = lw.view(lw.materialise(b), (Co, 1)) if b is not None else None
    args = [src, wview] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = _Kernel(lw, "conv2d", loc, args)
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
    bbuf = kb.alloc([TCo, 1], _elem(b), tile.SRAM, "bias") if b is not None else None
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
                    with _co_tiles(kb, BT, TCo, Co_g, cb0) as (j, co0, m), tiles(kb, lp, TP) as (_, q0, nq):
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
                    with _co_tiles(kb, BT, TCo, Co_g, cb0) as (j, co0, m), tiles(kb, lp, TP) as (_, q0, nq):
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
                _k_loop(kb, Ci_g, TK, nk, double, kstep)
            with _co_tiles(kb, BT, TCo, Co_g, cb0) as (j, co0, m):
                c0 = lin(kb, 0, (Co_g, gi), (1, cb0), (1, co0))
                if bbuf is not None:
                    kb.add(tile.LoadOp(ba, [c0, kb.const(0)], bbuf, m, kb.const(1), 0, -1))

                def compact(s_, d_, rows, cols):
                    if bbuf is not None:
                        kb.add(tile.BinaryOp("add", s_, bbuf, d_, rows, kb.const(cols), "column"))
                    else:
                        kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

                accrow = sub(kb, acc, 0, lin(kb, 0, (lp, j)), [TCo, lp])
                epi.emit(k, accrow, m, n, c0, kb.const(0), oh0, rb, Wq, compact)

        _bands(kb, OH, RB, band)
    k.launch()


def _conv_gemm_small(lw, op, loc, geo: Geometry, src, steps, out, G, Ci_g, Co_g, layout) -> bool:
    """Few output positions (the whole image is one accumulator tile): positions on the
    accumulator partitions (M, the streamed dimension) and output channels along the array
    columns (N), so a matmul costs its few positions, not a full channel tile. Stores walk
    channels with the spatial stride. Returns False where the shape does not qualify."""
    cfg = lw.cfg
    x, w, b = op.input, op.weight, op.bias
    elem, out_elem = _elem(x), _elem(op.results[0])
    isz, osz = _isz(elem), _isz(out_elem)
    T = len(geo.taps)
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Co = G * Co_g
    S = OH * OW
    Lp = geo.lp(OH)
    TK, nk = _k_tiles(Ci_g, min(cfg.matrix.rows, lw.P))
    TN = min(cfg.matrix.cols, Co_g)
    if Lp > min(cfg.accumulator.partitions, lw.P) or Co_g > cfg.accumulator.bytes_per_partition // 4:
        return False
    tiles_ = [st for st in steps if st.kind in ("column", "tile")]
    kbytes = _bytes(T * Co_g, isz) + sum(_bytes(geo.slab(OH, p), isz) for p in range(geo.nph))
    rest = _bytes(Co_g, osz) * (1 + len(tiles_) + (b is not None))
    if kbytes + rest > _budget(lw):
        return False
    double = nk > 1 and 2 * kbytes + rest <= _budget(lw)
    wv = lw.materialise(w)
    wview = lw.view(wv, (G, Ci_g, T, Co_g) if layout == "gihwo" else (Co, Ci_g, T))
    oview = lw.view(out, (N, Co, S))
    views: list[SSAValue] = []
    for st in steps:
        if st.kind == "column":
            st.value = lw.view(st.value, (Co,) if math.prod(_shape(st.value)) == Co else (1,))
            views.append(st.value)
        elif st.kind == "tile":
            st.value = lw.view(st.value, (math.prod(_shape(st.value)) // (Co * S), Co, S))
            views.append(st.value)
    bview = lw.view(lw.materialise(b), (Co,)) if b is not None else None
    args = [src, wview] + ([bview] if bview is not None else []) + views + [oview]
    k = _Kernel(lw, "conv2d", loc, args)
    kb = k.kb
    sa, wa = k.arg(src), k.arg(wview)
    nsets = 2 if double else 1
    wbs = [kb.alloc([TK, T * Co_g], elem, tile.SRAM, "weights") for _ in range(nsets)]
    slabsets = [[kb.alloc([TK, geo.slab(OH, p)], elem, tile.SRAM, f"slab{p}") for p in range(geo.nph)]
                for _ in range(nsets)]
    acc = kb.alloc([Lp, Co_g], f32, tile.ACC, "acc")
    ob = kb.alloc([Lp, Co_g], out_elem, tile.SRAM, "out")
    bufs = [kb.alloc([Lp, Co_g], _elem(st.value), tile.SRAM, "operand") if st.kind in ("column", "tile") else None
            for st in steps]
    bbuf = kb.alloc([Lp, Co_g], _elem(b), tile.SRAM, "bias") if b is not None else None
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

        _k_loop(kb, Ci_g, TK, nk, double, kstep)
        # epilogue on [positions x channels]; per-channel operands are row-broadcast tiles
        if bbuf is not None:
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
                v = k.arg(st.value)
                if _shape(st.value) == (1,):
                    kb.add(tile.LoadOp(v, [kb.const(0)], buf, rows, cols, -1, -1))
                else:
                    kb.add(tile.LoadOp(v, [ch0], buf, rows, cols, -1, 0))
                kb.add(tile.BinaryOp(st.fn, ob, buf, ob, rows, cols))
            else:
                v = k.arg(st.value)
                nn_ = n if _shape(st.value)[0] == N else kb.const(0)
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
    return True


@contextmanager
def _co_tiles(kb: KernelBuilder, BT: int, TCo: int, Co_g: int, cb0: SSAValue):
    """The BT output-channel tiles of a block starting at `cb0`: (index in the block,
    offset in the block, size). Only the group's last tile can be partial."""
    with kb.loop(BT) as j:
        co0 = kb.muli(j, kb.const(TCo)) if BT > 1 else kb.const(0)
        if Co_g % TCo == 0:
            m = kb.const(TCo)
        else:
            m = kb.mini(kb.const(TCo), kb.subi(kb.const(Co_g), kb.addi(cb0, co0)))
        yield j, co0, m


def _conv_vector(lw, op, loc, geo: Geometry, src, steps, out, G, mult, layout) -> None:
    """Depthwise (one input channel per group): per tap a per-partition column multiply."""
    x, w, b = op.input, op.weight, op.bias
    elem = _elem(x)
    out_elem = _elem(op.results[0])
    T = len(geo.taps)
    wv = lw.materialise(w)
    # [G, mult * T] in tap-major (gihwo: t * mult + j) or multiplier-major (oihw: j * T + t) order
    wview = lw.view(wv, (G, T * mult))
    if layout == "gihwo":
        def wcol(kb, t, j):
            return lin(kb, t * mult, (1, j))
    else:
        def wcol(kb, t, j):
            return lin(kb, t, (T, j))
    bview = lw.view(lw.materialise(b), (G * mult, 1)) if b is not None else None

    def weights_and_bias(kb, k, c0, c, TC, bufs):
        kb.add(tile.LoadOp(k.arg(wview), [c0, kb.const(0)], bufs["w"], c, kb.const(T * mult), 0, 1))

    def tap_op(kb, t, slab_sub, accv, rows, cols, bufs, j):
        wc = sub(kb, bufs["w"], 0, wcol(kb, t, j), [_shape(bufs["w"])[0], 1])
        if t == 0:
            kb.add(tile.BinaryOp("mul", slab_sub, wc, accv, rows, cols, "column"))
        else:
            tmp = bufs["tmp"]
            kb.add(tile.BinaryOp("mul", slab_sub, wc, tmp, rows, cols, "column"))
            kb.add(tile.BinaryOp("add", accv, tmp, accv, rows, cols))

    def compact_fn(kb, k, bufs, c0, j):
        def compact(s_, d_, rows, cols):
            if b is not None:
                kb.add(tile.LoadOp(k.arg(bview), [lin(kb, 0, (mult, c0), (1, j)), kb.const(0)], bufs["bias"],
                                   rows, kb.const(1), 0, -1, mult, 1))
                kb.add(tile.BinaryOp("add", s_, bufs["bias"], d_, rows, kb.const(cols), "column"))
            else:
                kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))
        return compact

    extra = [wview] + ([bview] if bview is not None else [])
    window_kernel(
        lw, loc, "conv2d_dw", geo, src, out, steps, mult, elem, out_elem, extra,
        weights_and_bias, tap_op, compact_fn,
        extra_bufs=lambda kb, TC, Lmax: {
            "w": kb.alloc([TC, T * mult], elem, tile.SRAM, "w"),
            "tmp": kb.alloc([TC, Lmax], f32, tile.SRAM, "tmp"),
            **({"bias": kb.alloc([TC, 1], _elem(b), tile.SRAM, "bias")} if b is not None else {}),
        },
        extra_bytes=lambda rb: _bytes(T * mult, _isz(elem)) + _bytes(geo.lp(rb), 4) + _ALIGN,
    )


def window_kernel(
    lw, loc, what, geo: Geometry, src, out, steps, mult, elem, out_elem, extra_args,
    per_tile, tap_op, compact_fn, extra_bufs, extra_bytes, row_aware: bool = False,
) -> None:
    """A vector-engine window op: channels (of the input) on partitions; for each band,
    per phase slab, `tap_op` per tap into an fp32 accumulator, then the epilogue."""
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Cp = geo.C  # partition channels (groups for depthwise)
    TC = min(lw.P, Cp)
    isz, osz = _isz(elem), _isz(out_elem)
    epi = Epilogue(lw, steps, out, N, Cp * mult, OH, OW, mult)
    budget = _budget(lw)

    def fits(rb: int) -> bool:
        need = sum(_bytes(geo.slab(rb, p), isz) for p in range(geo.nph)) + _bytes(geo.lp(rb), 4)
        need += epi.sram_bytes(rb * OW, osz) + extra_bytes(rb)
        return need <= budget

    RB = _pick_band(geo, fits)
    if not RB:
        raise TensorTooLargeError(f"{what} at {loc}: one output row of {OW} positions does not fit SRAM")
    k = _Kernel(lw, what, loc, [src, *extra_args, *epi.hbm_args()])
    kb = k.kb
    sa = k.arg(src)
    Lmax = geo.lp(RB)
    slabs = [kb.alloc([TC, geo.slab(RB, p)], elem, tile.SRAM, f"slab{p}") for p in range(geo.nph)]
    accb = kb.alloc([TC, Lmax], f32, tile.SRAM, "acc")
    epi.alloc(kb, TC, RB * OW, out_elem)
    bufs = extra_bufs(kb, TC, Lmax)
    with kb.loop(N) as n, tiles(kb, Cp, TC) as (_, c0, c):
        per_tile(kb, k, c0, c, TC, bufs)

        def band(oh0: SSAValue, rb: int) -> None:
            lp = geo.lp(rb)
            p0 = lin(kb, 0, (Wq, oh0))
            for p in range(geo.nph):
                L = geo.slab(rb, p)
                kb.add(tile.LoadOp(sa, [n, c0, kb.const(p), p0], sub(kb, slabs[p], 0, 0, [TC, L]),
                                   c, kb.const(L), 1, 3))
            accv = sub(kb, accb, 0, 0, [TC, lp])
            with kb.loop(mult) as j:  # depthwise channel multiplier (1 for pooling)
                for t, (_, _, p, off) in enumerate(geo.taps):
                    tap_op(kb, t, sub(kb, slabs[p], 0, off, [TC, lp]), accv, c, kb.const(lp), bufs, j)
                bufs["oh0"] = oh0
                epi.emit(k, accv, c, n, c0, j, oh0, rb, Wq, compact_fn(kb, k, bufs, c0, j), row_aware)

        _bands(kb, OH, RB, band)
    k.launch()


# ---------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------


def _no_bufs(kb, TC, Lmax):
    return {}


def _nothing(*args):
    return None


def lower_max_pool(lw, op: nn.MaxPool2dOp, loc: str) -> None:
    kernel, stride, padding, dilation, _ = op.params
    x, res = op.input, op.results[0]
    N, C, H, W = _shape(x)
    _, _, OH, OW = _shape(res)
    geo = Geometry(N, C, H, W, OH, OW, kernel, stride, padding, dilation)
    src = phase_image(lw, x, geo, float("-inf"), loc, "max_pool2d")
    out = lw.hbm((N, C, OH, OW), _elem(res))
    ntaps = len(geo.taps)

    def tap_op(kb, t, slab_sub, accv, rows, cols, bufs, j):
        if ntaps == 1:
            kb.add(tile.UnaryOp("copy", slab_sub, accv, rows, cols))
        elif t == 1:
            kb.add(tile.BinaryOp("max", bufs["first"], slab_sub, accv, rows, cols))
        elif t > 1:
            kb.add(tile.BinaryOp("max", accv, slab_sub, accv, rows, cols))
        else:
            bufs["first"] = slab_sub

    def compact_fn(kb, k, bufs, c0, j):
        return lambda s_, d_, rows, cols: kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

    window_kernel(
        lw, loc, "max_pool2d", geo, src, out, [], 1, _elem(x), _elem(res), [],
        _nothing, tap_op, compact_fn, _no_bufs, lambda rb: 0,
    )
    lw.values[res] = out


def lower_avg_pool(lw, op: nn.AvgPool2dOp, loc: str) -> None:
    kernel, stride, padding, ceil_mode, cip, divisor = op.params
    x, res = op.input, op.results[0]
    N, C, H, W = _shape(x)
    _, _, OH, OW = _shape(res)
    geo = Geometry(N, C, H, W, OH, OW, kernel, stride, padding, (1, 1))
    div = nn.avg_pool_divisors(H, W, OH, OW, kernel, stride, padding, cip, divisor)
    src = phase_image(lw, x, geo, 0.0, loc, "avg_pool2d")
    out = lw.hbm((N, C, OH, OW), _elem(res))
    _avg_window(lw, loc, "avg_pool2d", geo, src, out, div, _elem(x), _elem(res))
    lw.values[res] = out


def _avg_window(lw, loc, what, geo, src, out, div: np.ndarray, elem, out_elem) -> None:
    """Sum of the taps, divided by `div` ([OH, OW] divisors; one immediate when uniform)."""
    ntaps = len(geo.taps)

    def tap_op(kb, t, slab_sub, accv, rows, cols, bufs, j):
        if ntaps == 1:
            kb.add(tile.UnaryOp("copy", slab_sub, accv, rows, cols))
        elif t == 1:
            kb.add(tile.BinaryOp("add", bufs["first"], slab_sub, accv, rows, cols))
        elif t > 1:
            kb.add(tile.BinaryOp("add", accv, slab_sub, accv, rows, cols))
        else:
            bufs["first"] = slab_sub

    if np.all(div == div.flat[0]):
        dval = float(div.flat[0])

        def compact_fn(kb, k, bufs, c0, j):
            return lambda s_, d_, rows, cols: kb.add(tile.ScalarOp("div", s_, dval, d_, rows, kb.const(cols)))

        window_kernel(
            lw, loc, what, geo, src, out, [], 1, elem, out_elem, [],
            _nothing, tap_op, compact_fn, _no_bufs, lambda rb: 0,
        )
        return
    dview = const_hbm(lw, div.astype(np.float32).reshape(-1), f32)

    def compact_fn_rows(kb, k, bufs, c0, j):
        # divisors of the band, loaded once per band as a row-broadcast tile
        def compact(s_, d_, rows, cols, r=None):
            off = [(OW, bufs["oh0"])] + ([(OW, r)] if r is not None else [])
            dv = sub(kb, bufs["div"], 0, 0, [_shape(bufs["div"])[0], cols])
            kb.add(tile.LoadOp(k.arg(dview), [lin(kb, 0, *off)], dv, rows, kb.const(cols), -1, 0))
            kb.add(tile.BinaryOp("div", s_, dv, d_, rows, kb.const(cols)))
        return compact

    OW = geo.OW  # noqa: F841 (used by compact_fn_rows)
    window_kernel(
        lw, loc, what, geo, src, out, [], 1, elem, out_elem, [dview],
        _nothing, tap_op, compact_fn_rows,
        extra_bufs=lambda kb, TC, Lmax: {"div": kb.alloc([TC, Lmax], f32, tile.SRAM, "div")},
        extra_bytes=lambda rb: _bytes(geo.lp(rb), 4), row_aware=True,
    )


# ---------------------------------------------------------------------------
# adaptive average pooling
# ---------------------------------------------------------------------------


def lower_adaptive_avg_pool(lw, op: nn.AdaptiveAvgPool2dOp, loc: str) -> None:
    """Separable window sums on the vector engine: per channel tile the image is on chip;
    width windows are reduced row by row, then height windows, then divided by the counts."""
    x, res = op.input, op.results[0]
    N, C, H, W = _shape(x)
    _, _, OH, OW = _shape(res)
    elem, out_elem = _elem(x), _elem(res)
    rh, rw = nn.adaptive_windows(H, OH), nn.adaptive_windows(W, OW)
    counts = np.array([[(he - hs) * (we - ws) for ws, we in rw] for hs, he in rh], dtype=np.float32)
    TC = min(lw.P, C)
    S, OS = H * W, OH * OW
    need = _bytes(S, _isz(elem)) + _bytes(OW * H, 4) + 2 * _bytes(OS, 4) + _bytes(OS, _isz(out_elem))
    if need > _budget(lw):
        raise TensorTooLargeError(
            f"graph.adaptive_avg_pool2d at {loc}: a {H}x{W} image does not fit one SRAM partition"
        )
    xv = lw.view(lw.materialise(x), (N, C, S))
    out = lw.hbm((N, C, OH, OW), out_elem)
    ov = lw.view(out, (N, C, OS))
    uniform = bool(np.all(counts == counts.flat[0]))
    cv = None if uniform else const_hbm(lw, counts.reshape(-1), f32)
    k = _Kernel(lw, "adaptive_avg_pool2d", loc, [xv, ov] + ([cv] if cv is not None else []))
    kb = k.kb
    xb = kb.alloc([TC, S], elem, tile.SRAM, "x")
    t1 = kb.alloc([TC, OW * H], f32, tile.SRAM, "rows")
    ob32 = kb.alloc([TC, OS], f32, tile.SRAM, "sums")
    ob = kb.alloc([TC, OS], out_elem, tile.SRAM, "out")
    db = None
    if cv is not None:
        db = kb.alloc([TC, OS], f32, tile.SRAM, "counts")
        kb.add(tile.LoadOp(k.arg(cv), [kb.const(0)], db, kb.const(TC), kb.const(OS), -1, 0))

    def red(src, col, n_, dst, dcol, rows):
        kb.add(tile.ReduceOp("sum", sub(kb, src, 0, col, [TC, n_]), sub(kb, dst, 0, dcol, [TC, 1]),
                             rows, kb.const(n_)))

    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        kb.add(tile.LoadOp(k.arg(xv), [n, c0, kb.const(0)], xb, c, kb.const(S), 1, 2))
        if OS == 1:
            red(xb, 0, S, ob32, 0, c)
        else:
            # width windows: t1[:, ow * H + h] = sum_w x[h, w in window(ow)]
            if W % OW == 0:
                f = W // OW
                with kb.loop(OW) as o, kb.loop(H) as h:
                    red(xb, lin(kb, 0, (W, h), (f, o)), f, t1, lin(kb, 0, (H, o), (1, h)), c)
            else:
                for o, (ws, we) in enumerate(rw):
                    with kb.loop(H) as h:
                        red(xb, lin(kb, ws, (W, h)), we - ws, t1, lin(kb, o * H, (1, h)), c)
            # height windows: sums[:, oh * OW + ow] = sum_h t1[:, ow * H + h in window(oh)]
            if H % OH == 0:
                f = H // OH
                with kb.loop(OH) as o, kb.loop(OW) as w_:
                    red(t1, lin(kb, 0, (H, w_), (f, o)), f, ob32, lin(kb, 0, (OW, o), (1, w_)), c)
            else:
                for o, (hs, he) in enumerate(rh):
                    with kb.loop(OW) as w_:
                        red(t1, lin(kb, hs, (H, w_)), he - hs, ob32, lin(kb, o * OW, (1, w_)), c)
        if db is None:
            kb.add(tile.ScalarOp("div", ob32, float(counts.flat[0]), ob, c, kb.const(OS)))
        else:
            kb.add(tile.BinaryOp("div", ob32, db, ob, c, kb.const(OS)))
        kb.add(tile.StoreOp(ob, k.arg(ov), [n, c0, kb.const(0)], c, kb.const(OS), 1, 2))
    k.launch()
    lw.values[res] = out


# ---------------------------------------------------------------------------
# nearest resizing
# ---------------------------------------------------------------------------


def _runs(index: np.ndarray) -> list[tuple[int, int, int]]:
    """(source, first output, length) of the runs of equal source indices."""
    out: list[tuple[int, int, int]] = []
    for o, src in enumerate(index.tolist()):
        if out and out[-1][0] == src and out[-1][1] + out[-1][2] == o:
            out[-1] = (src, out[-1][1], out[-1][2] + 1)
        else:
            out.append((src, o, 1))
    return out


def _regular(runs: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """(source step, run length) when run i is (i * step, i * length, length)."""
    if not runs:
        return None
    L = runs[0][2]
    a = runs[1][0] if len(runs) > 1 else 1
    if all(r == (i * a, i * L, L) for i, r in enumerate(runs)):
        return a, L
    return None


_MAX_UNROLLED = 256


def lower_upsample(lw, op: nn.UpsampleNearest2dOp, loc: str) -> None:
    """Per channel tile: the image on chip; each output row is built from its source row
    with one column-broadcast op per run of equal source columns, repeated rows are copies."""
    x, res = op.input, op.results[0]
    N, C, H, W = _shape(x)
    _, _, OH, OW = _shape(res)
    elem = _elem(x)
    rmap, cmap = op.index_maps()
    rruns, cruns = _runs(rmap), _runs(cmap)
    rreg, creg = _regular(rruns), _regular(cruns)
    if (rreg is None and len(rruns) > _MAX_UNROLLED) or (creg is None and len(cruns) * (
        1 if rreg else len(rruns)
    ) > _MAX_UNROLLED):
        raise CompileError(
            f"graph.upsample_nearest2d at {loc}: a {H}x{W} -> {OH}x{OW} resize with a non-integer "
            "scale is too irregular to unroll"
        )
    TC = min(lw.P, C)
    maxl = max(r[2] for r in cruns)
    isz = _isz(elem)
    if _bytes(H * W, isz) + _bytes(OH * OW, isz) + _bytes(maxl, isz) > _budget(lw):
        raise TensorTooLargeError(
            f"graph.upsample_nearest2d at {loc}: a {OH}x{OW} output image does not fit one SRAM partition"
        )
    xv = lw.view(lw.materialise(x), (N, C, H * W))
    out = lw.hbm((N, C, OH, OW), elem)
    ov = lw.view(out, (N, C, OH * OW))
    zero = fill_row(lw, -0.0, elem, maxl)
    k = _Kernel(lw, "upsample_nearest2d", loc, [xv, ov, zero])
    kb = k.kb
    xb = kb.alloc([TC, H * W], elem, tile.SRAM, "x")
    ob = kb.alloc([TC, OH * OW], elem, tile.SRAM, "out")
    zb = kb.alloc([TC, maxl], elem, tile.SRAM, "zero")
    fill(kb, zb, kb.const(TC), maxl, k.arg(zero))  # x + (-0.0) == x, bit for bit

    def expand_row(c: SSAValue, src_row: SSAValue, dst_row: SSAValue) -> None:
        def put(scol, ocol, length):
            kb.add(tile.BinaryOp(
                "add", sub(kb, zb, 0, 0, [TC, length]), sub(kb, xb, 0, scol, [TC, 1]),
                sub(kb, ob, 0, ocol, [TC, length]), c, kb.const(length), "column",
            ))

        if creg is not None:
            a, L = creg
            with kb.loop(len(cruns)) as i:
                put(lin(kb, 0, (W, src_row), (a, i)), lin(kb, 0, (OW, dst_row), (L, i)), L)
        else:
            for w0, o0, L in cruns:
                put(lin(kb, w0, (W, src_row)), lin(kb, o0, (OW, dst_row)), L)

    def repeat_row(c: SSAValue, dst_row: SSAValue, times: int) -> None:
        for t in range(1, times):
            kb.add(tile.UnaryOp(
                "copy", sub(kb, ob, 0, lin(kb, 0, (OW, dst_row)), [TC, OW]),
                sub(kb, ob, 0, lin(kb, t * OW, (OW, dst_row)), [TC, OW]), c, kb.const(OW),
            ))

    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        kb.add(tile.LoadOp(k.arg(xv), [n, c0, kb.const(0)], xb, c, kb.const(H * W), 1, 2))
        if rreg is not None:
            a, L = rreg
            with kb.loop(len(rruns)) as i:
                dst = lin(kb, 0, (L, i))
                expand_row(c, lin(kb, 0, (a, i)), dst)
                repeat_row(c, dst, L)
        else:
            for h0, o0, L in rruns:
                expand_row(c, kb.const(h0), kb.const(o0))
                repeat_row(c, kb.const(o0), L)
        kb.add(tile.StoreOp(ob, k.arg(ov), [n, c0, kb.const(0)], c, kb.const(OH * OW), 1, 2))
    k.launch()
    lw.values[res] = out


# ---------------------------------------------------------------------------
# constant padding
# ---------------------------------------------------------------------------


def lower_pad(lw, op: nn.PadOp, loc: str) -> None:
    x, res = op.input, op.results[0]
    shape, oshape = _shape(x), _shape(res)
    low, high = nn._ints(op.low), nn._ints(op.high)
    r = len(shape)
    if any(low[d] or high[d] for d in range(max(0, r - 2))):
        raise CompileError(
            f"graph.pad at {loc}: only the last two dims can be padded on the NPU, got low "
            f"{list(low)} high {list(high)}"
        )
    H, W = (shape[-2] if r >= 2 else 1), (shape[-1] if r >= 1 else 1)
    OH, OW = (oshape[-2] if r >= 2 else 1), (oshape[-1] if r >= 1 else 1)
    pt, pl = (low[-2] if r >= 2 else 0), (low[-1] if r >= 1 else 0)
    lead = math.prod(shape[:-2]) if r > 2 else 1
    out = lw.hbm(oshape, _elem(res))
    if lead * OH * OW:
        x4 = lw.view(lw.materialise(x), (1, lead, H, W))
        pad_kernel(
            lw, "pad", loc, x4, lw.view(out, (1, lead, 1, OH * OW)), [(0, 0)], (1, 1), (pt, pl),
            OH, OW, float(op.value.value.data),
        )
    lw.values[res] = out


# ---------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------


def lower_reduce(lw, op: nn.ReduceOp, loc: str) -> None:
    """One kernel per run of adjacent reduced dims (innermost first); each reduces the
    middle dim of an ``[A, B, C]`` view."""
    x, res = op.input, op.results[0]
    shape = _shape(x)
    axes = set(op.axes)
    fn = op.FN
    # dims of size 1 do not matter; merge neighbours with the same role
    blocks: list[list[int]] = []  # [size, reduced]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        red = d in axes
        if blocks and blocks[-1][1] == red:
            blocks[-1][0] *= size
        else:
            blocks.append([size, red])
    cur = lw.materialise(x)
    out_elem = _elem(res)
    nred = sum(1 for b in blocks if b[1])
    if nred == 0:
        if _elem(cur) == out_elem:
            lw.values[res] = lw.view(cur, _shape(res))
            return
    done = 0
    while True:
        idx = max((i for i, b in enumerate(blocks) if b[1]), default=None)
        if idx is None:
            # nothing (left) to reduce: a rounding copy, for a dtype change only
            n = math.prod(_shape(cur))
            outv = lw.hbm((1, n), out_elem)
            _reduce_kernel(lw, loc, "copy", lw.view(cur, (1, 1, n)), outv, 1, 1, n, 1)
            cur = outv
            break
        A = math.prod(b[0] for b in blocks[:idx])
        B = blocks[idx][0]
        Cc = math.prod(b[0] for b in blocks[idx + 1:])
        done += 1
        last = done == nred
        outv = lw.hbm((A, Cc), out_elem if last else f32)
        _reduce_kernel(lw, loc, fn, lw.view(cur, (A, B, Cc)), outv, A, B, Cc, B if fn == "mean" else 1)
        cur = outv
        del blocks[idx]
        # merge the now-adjacent kept blocks
        merged: list[list[int]] = []
        for b in blocks:
            if merged and merged[-1][1] == b[1]:
                merged[-1][0] *= b[0]
            else:
                merged.append(list(b))
        blocks = merged
        if last:
            break
    lw.values[res] = lw.view(cur, _shape(res))


def _reduce_kernel(lw, loc, fn: str, x: SSAValue, out: SSAValue, A: int, B: int, Cc: int, div: int) -> None:
    """``out[a, c] = fn_b x[a, b, c]`` (`x` viewed [A, B, Cc], `out` [A, Cc]); mean divides by `div`."""
    elem, out_elem = _elem(x), _elem(out)
    combine = {"sum": "add", "mean": "add", "max": "max", "min": "min", "copy": "add"}[fn]
    rfn = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "copy": "sum"}[fn]
    budget = _budget(lw) // 2
    P = lw.P
    if Cc == 1:
        # the reduced elements along the free dimension, in chunks of BC
        TR = min(P, A)
        BC = max(1, min(B, budget // (_isz(elem) * 2)))
        nchunks = _cdiv(B, BC)
        xv = lw.view(x, (A, B))
        ov = lw.view(out, (A, 1))
        k = _Kernel(lw, f"reduce_{fn}", loc, [xv, ov])
        kb = k.kb
        xb = kb.alloc([TR, BC], elem, tile.SRAM, "x")
        accb = kb.alloc([TR, 1], f32, tile.SRAM, "acc")
        part = kb.alloc([TR, 1], f32, tile.SRAM, "part") if nchunks > 1 else None
        ob = kb.alloc([TR, 1], out_elem, tile.SRAM, "out")
        one = kb.const(1)
        with tiles(kb, A, TR) as (_, a0, r):
            first = kb.const(min(BC, B))
            kb.add(tile.LoadOp(k.arg(xv), [a0, kb.const(0)], xb, r, first, 0, 1))
            kb.add(tile.ReduceOp(rfn, xb, accb, r, first))
            if nchunks > 1:
                with kb.loop(nchunks - 1) as i:
                    b0 = lin(kb, BC, (BC, i))
                    bc = kb.const(BC) if B % BC == 0 else kb.mini(kb.const(BC), kb.subi(kb.const(B), b0))
                    kb.add(tile.LoadOp(k.arg(xv), [a0, b0], xb, r, bc, 0, 1))
                    kb.add(tile.ReduceOp(rfn, xb, part, r, bc))
                    kb.add(tile.BinaryOp(combine, accb, part, accb, r, one))
            _finish(kb, fn, accb, ob, r, one, div)
            kb.add(tile.StoreOp(ob, k.arg(ov), [a0, kb.const(0)], r, one, 0, 1))
        k.launch()
        return
    # whole tiles combined while walking the reduced dim
    xv, ov = x, out
    if A == 1 and Cc >= 2 * P:
        # spread the kept elements over the partitions: x [B, Cp, Cf], out [Cp, Cf]
        Cp = max(d for d in range(1, P + 1) if Cc % d == 0)
        if Cp > 1:
            xv, ov = lw.view(x, (B, Cp, Cc // Cp)), lw.view(out, (Cp, Cc // Cp))
            A, Cc = Cp, Cc // Cp
            rows_dim, red_dim = 1, 0
        else:
            rows_dim, red_dim = 0, 1
    else:
        rows_dim, red_dim = 0, 1
    TR = min(P, A)
    TCc = max(1, min(Cc, budget // (4 * 3)))
    k = _Kernel(lw, f"reduce_{fn}", loc, [xv, ov])
    kb = k.kb
    xb = kb.alloc([TR, TCc], elem, tile.SRAM, "x")
    accb = kb.alloc([TR, TCc], f32, tile.SRAM, "acc")
    ob = kb.alloc([TR, TCc], out_elem, tile.SRAM, "out")
    with tiles(kb, A, TR) as (_, a0, r), tiles(kb, Cc, TCc) as (_, c0, cc):
        def idx(b):
            ind = [None, None, c0]
            ind[rows_dim], ind[red_dim] = a0, b
            return ind

        kb.add(tile.LoadOp(k.arg(xv), idx(kb.const(0)), accb if elem == f32 else xb, r, cc, rows_dim, 2))
        if elem != f32:
            kb.add(tile.UnaryOp("copy", xb, accb, r, cc))
        if B > 1:
            with kb.loop(B - 1) as b:
                kb.add(tile.LoadOp(k.arg(xv), idx(lin(kb, 1, (1, b))), xb, r, cc, rows_dim, 2))
                kb.add(tile.BinaryOp(combine, accb, xb, accb, r, cc))
        _finish(kb, fn, accb, ob, r, cc, div)
        kb.add(tile.StoreOp(ob, k.arg(ov), [a0, c0], r, cc, 0, 1))
    k.launch()


def _finish(kb, fn, accb, ob, rows, cols, div) -> None:
    if fn == "mean" and div != 1:
        kb.add(tile.ScalarOp("div", accb, float(div), ob, rows, cols))
    else:
        kb.add(tile.UnaryOp("copy", accb, ob, rows, cols))


# ---------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------

LOWERINGS: dict[type, Callable[[Any, Any, str], None]] = {
    nn.Conv2dOp: lower_conv2d,
    nn.MaxPool2dOp: lower_max_pool,
    nn.AvgPool2dOp: lower_avg_pool,
    nn.AdaptiveAvgPool2dOp: lower_adaptive_avg_pool,
    nn.UpsampleNearest2dOp: lower_upsample,
    nn.PadOp: lower_pad,
    **{cls: lower_reduce for cls in nn.REDUCE_OPS},
}
