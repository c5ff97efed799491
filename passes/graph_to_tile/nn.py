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
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.conversion import lower_op

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
    """An HBM constant of `data`, one per distinct value (kernels share identity,
    selection and mask matrices of the same shape)."""
    arr = np.asarray(data, dtype=np.float32)
    cache = lw.__dict__.setdefault("_nn_consts", {})
    key = (arr.tobytes(), str(elem), arr.shape)
    if key in cache:
        return cache[key]
    shape = list(arr.shape) or [1]
    attr = DenseIntOrFPElementsAttr.from_list(TensorType(elem, shape), arr.reshape(-1).tolist())
    v = lw.hbm(shape, elem, value=attr)
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


@dataclass
class PadInfo:
    """An activation stored zero-padded: ``hbm[n, c, (h + pt) * Wp + w + pl] = x[n, c, h, w]``,
    zeros elsewhere (``[N, C, Hp * Wp]``). A stride-1 3x3 convolution with padding 1
    reads it as its phase image directly (no padding kernel), its accumulator rows have
    the same width Wp, so a producer writes whole bands with the padding columns zeroed
    by a mask instead of compacting row by row, and a residual operand in this layout
    lines up with the accumulator. `nonneg`: every value is >= 0 (after a relu), so a
    max pool may read the zeros as its padding."""
    hbm: SSAValue
    N: int
    C: int
    H: int
    W: int
    pt: int
    pl: int
    Hp: int
    Wp: int
    nonneg: bool

    @property
    def L(self) -> int:
        return self.Hp * self.Wp


def padded_of(lw, v: SSAValue) -> PadInfo | None:
    """The padded layout of graph value `v`, if it is stored padded."""
    return lw.__dict__.get("_nn_padded", {}).get(v)


def _padded_hbm(lw, hbm: SSAValue) -> PadInfo | None:
    return lw.__dict__.get("_nn_padded_hbm", {}).get(hbm)


def _new_padded(lw, N: int, C: int, H: int, W: int, elem: Attribute, nonneg: bool, pad: int = 1,
                Wp: int | None = None) -> PadInfo:
    Hp, Wp = H + 2 * pad, Wp or W + 2 * pad
    info = PadInfo(lw.hbm((N, C, Hp * Wp), elem, zeroed=True), N, C, H, W, pad, pad, Hp, Wp, nonneg)
    lw.__dict__.setdefault("_nn_padded_hbm", {})[info.hbm] = info
    return info


def _set_padded(lw, v: SSAValue, info: PadInfo) -> None:
    lw.__dict__.setdefault("_nn_padded", {})[v] = info


def _conv_reads_padded(op: Operation) -> bool:
    """Whether a convolution / pooling consumer can take its input padded: a stride-1 3x3
    window with padding 1 reads it directly; a strided one builds its phase images from
    it (the padding ring is part of the image)."""
    if isinstance(op, nn.Conv2dOp):
        (sh, sw), (ph, pw), (dh, dw), G, layout = op.params
        ws = _shape(op.weight)
        k = (ws[2], ws[3])
    elif isinstance(op, (nn.MaxPool2dOp, nn.AvgPool2dOp)):
        prm = op.params
        k, (sh, sw), (ph, pw) = prm[0], prm[1], prm[2]
        dh, dw = prm[3] if isinstance(op, nn.MaxPool2dOp) else (1, 1)
        if isinstance(op, nn.AvgPool2dOp) and prm[3]:  # ceil_mode: windows past the edge
            return False
    else:
        return False
    if (sh, sw) == (1, 1):
        return (ph, pw) == (1, 1) and (dh, dw) == (1, 1) and tuple(k) == (3, 3)
    return True


def _conv_absorbing(lw, add: Operation, v: SSAValue) -> Operation | None:
    """The convolution, not lowered yet, whose epilogue will fuse `add` (a residual add of
    `v`): the add's other operand comes from it through single-use per-channel affine
    ops (a batch norm), the way `fuse_epilogue` walks."""
    lhs, rhs = add.operands
    o = rhs if lhs is v else lhs
    if o is v:
        return None
    while True:
        if not o.has_one_use():
            return None
        owner = o.owner
        if isinstance(owner, nn.Conv2dOp):
            return owner if o not in lw.values else None
        if isinstance(owner, (g.MulOp, g.AddOp)):
            a, b = owner.operands
            const = [u for u in (a, b) if isinstance(u.owner, (g.WeightOp, g.ConstantOp))]
            if len(const) != 1:
                return None
            o = b if const[0] is a else a
            continue
        return None


def _wants_padded(lw, v: SSAValue, N: int, C: int, H: int, W: int, nonneg: bool,
                  absorbed: list | None = None, strict: list | None = None) -> bool:
    """Whether every user of `v` takes it in the padded layout (-O2 only); residual adds
    expected in a later convolution's epilogue are appended to `absorbed` as (add, conv);
    `strict` gets True when some user needs rows of exactly W + 2 (a stride-1 window
    reading it directly, or an epilogue adding it), else the row width is free."""
    if lw.opt_level < 2 or not v.uses:
        return False
    for use in v.uses:
        u = use.operation
        if isinstance(u, (nn.Conv2dOp, nn.MaxPool2dOp, nn.AvgPool2dOp)) and u.operands[0] is v:
            if not _conv_reads_padded(u) or (isinstance(u, nn.MaxPool2dOp) and not nonneg):
                return False
            stride = u.params[0] if isinstance(u, nn.Conv2dOp) else u.params[1]
            if strict is not None and tuple(stride) == (1, 1):  # reads it as its phase image
                strict.append(True)
        elif isinstance(u, g.AddOp):
            conv = _conv_absorbing(lw, u, v)
            if conv is None or tuple(_shape(conv.results[0])) != (N, C, H, W) or not _o2_feasible(lw, conv):
                return False
            if absorbed is not None:
                absorbed.append((u, conv))
            if strict is not None:
                strict.append(True)
        elif isinstance(u, (nn.SumOp, nn.MeanOp)) and len(_shape(v)) == 4 and set(u.axes) == {2, 3}:
            pass
        else:
            return False
    return True


def _conv_geometry(op: nn.Conv2dOp) -> tuple[Geometry, int, int, int, str]:
    (sh, sw), (ph, pw), (dh, dw), G, layout = op.params
    N, C, H, W = _shape(op.input)
    _, Co, OH, OW = _shape(op.results[0])
    ws = _shape(op.weight)
    geo = Geometry(N, C, H, W, OH, OW, (ws[2], ws[3]), (sh, sw), (ph, pw), (dh, dw))
    return geo, G, C // G, Co // G, layout


def _o2_feasible(lw, op: nn.Conv2dOp) -> bool:
    """Whether a later convolution will run an -O2 kernel with a padded epilogue (so a
    residual operand it fuses can be stored padded)."""
    geo, G, Ci_g, Co_g, layout = _conv_geometry(op)
    if Ci_g == 1:
        return False
    steps, _ = fuse_epilogue(lw, op, G * Co_g)
    for st in steps:  # not lowered yet: the probe only needs the kinds
        if st.kind == "tile":
            st.value = None
    N, Co, OH, OW = _shape(op.results[0])
    probe = PadInfo(None, N, Co, OH, OW, 1, 1, OH + 2, OW + 2, False)
    return bool(
        _conv_gemm_small_o2(lw, op, "", geo, None, steps, None, G, Ci_g, Co_g, layout, probe, plan_only=True)
        or _conv_gemm_o2(lw, op, "", geo, None, steps, None, G, Ci_g, Co_g, layout, probe, plan_only=True)
    )


def _check_absorbed(lw, conv: Operation, fused: list[Operation], loc: str) -> None:
    """A padded value whose residual add was expected in `conv`'s epilogue but was not
    fused gets its natural copy, for the add kernel that reads it."""
    for add, v in lw.__dict__.get("_nn_absorb", {}).pop(conv, []):
        if add not in fused:
            info = padded_of(lw, v)
            if info is not None:
                lw.values[v] = _natural_of_info(lw, info, loc)


def phase_image(lw, x: SSAValue, geo: Geometry, fill_value: float, loc: str, what: str) -> SSAValue:
    """HBM ``[N, C, phases, Hq * Wq]``: the phase images of the padded input `x`. An input
    stored padded (`PadInfo`) is its own phase image for a stride-1 window with the same
    padding; otherwise the phases are built from it (its padding ring included)."""
    info = padded_of(lw, x)
    if info is not None:
        if geo.s == (1, 1) and geo.p == (info.pt, info.pl) and geo.Wq == info.Wp and geo.Hq <= info.Hp:
            return lw.view(info.hbm, (geo.N, geo.C, 1, info.L))
        out = lw.hbm((geo.N, geo.C, geo.nph, geo.Hq * geo.Wq), _elem(info.hbm))
        pad_kernel(
            lw, f"{what}_pad", loc, lw.view(info.hbm, (geo.N, geo.C, info.Hp, info.Wp)), out,
            geo.phases, geo.s, (geo.p[0] - info.pt, geo.p[1] - info.pl), geo.Hq, geo.Wq,
            0.0 if info.nonneg else fill_value,
        )
        return out
    return _phase_image_natural(lw, x, geo, fill_value, loc, what)


def natural_of(lw, v: SSAValue, loc: str) -> SSAValue:
    """`v` in its natural layout (a cropping copy of a padded value, made once)."""
    info = padded_of(lw, v)
    if info is None:
        return lw.materialise(v)
    return _natural_of_info(lw, info, loc)


def _phase_image_natural(lw, x: SSAValue, geo: Geometry, fill_value: float, loc: str, what: str) -> SSAValue:
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
    for each phase ``(a, b)``; `x` is [N, C, H, W], `out` [N, C, len(phases), Hq*Wq].

    With a stride the phases take every other element of a row, which a DMA can only
    read element by element (one descriptor and one short chunk per element). At -O2
    the phases are instead picked out on the matrix engine (`_phase_split_*`); -O0
    keeps the strided DMAs."""
    if s != (1, 1) and lw.opt_level >= 2:
        if _phase_split(lw, what, loc, x, out, phases, s, pad, Hq, Wq, fill_value):
            return
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
# phase images on the matrix engine
# ---------------------------------------------------------------------------
#
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


def _false_i1(kb: KernelBuilder) -> SSAValue:
    return kb.ne_zero(kb.const(0))


def _phase_split(lw, what, loc, x, out, phases, s, pad, Hq, Wq, fill_value) -> bool:
    C = _shape(x)[1]
    if C <= _FEW_CHANNELS and fill_value == 0.0:
        if _phase_split_rows(lw, what, loc, x, out, phases, s, pad, Hq, Wq):
            return True
    return _phase_split_channels(lw, what, loc, x, out, phases, s, pad, Hq, Wq, fill_value)


def _consts_2d(lw, blocks: list[np.ndarray], width: int, height: int, elem: Attribute) -> tuple[SSAValue, int]:
    """One HBM constant [height, len(blocks) * width] holding the blocks side by side
    (each zero-padded to height x width); returns it and its column count."""
    data = np.zeros((height, max(1, len(blocks)) * width), dtype=np.float32)
    for i, blk in enumerate(blocks):
        data[: blk.shape[0], i * width: i * width + blk.shape[1]] = blk
    return const_hbm(lw, data, elem), data.shape[1]


def _phase_split_channels(lw, what, loc, x, out, phases, s, pad, Hq, Wq, fill_value) -> bool:
    cfg = lw.cfg
    N, C, H, W = _shape(x)
    elem = _elem(x)
    isz = _isz(elem)
    (sh, sw), (pt, pl) = s, pad
    nph = len(phases)
    row_res = sorted({a for a, _ in phases})
    col_res = sorted({b for _, b in phases})
    KMAX = min(cfg.matrix.rows, lw.P, cfg.accumulator.partitions)
    NMAX = cfg.matrix.cols
    TC = min(lw.P, C, cfg.accumulator.partitions, cfg.matrix.cols, cfg.matrix.rows)
    nrow_i = len(row_res)  # input rows per output row
    cspan = col_res[-1] - col_res[0]
    contiguous_rows = row_res == list(range(sh))  # an output row's input rows are adjacent

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
            return False
    full = jl == Wq
    blocks = [(j0, min(Wq, j0 + jl)) for j0 in range(0, Wq, jl)]
    units = [(i0, min(Hq, i0 + g)) for i0 in range(0, Hq, g)]

    def block_cols(j0: int, j1: int) -> tuple[int, int]:
        lo = max(0, j0 * sw + col_res[0] - pl)
        hi = min(W - 1, (j1 - 1) * sw + col_res[-1] - pl)
        return lo, hi

    # the layout of one unit's contraction: segments (first input row relative to the
    # unit's base row i0*sh, rows, first column, columns), in order
    def layout(i0: int, i1: int, j0: int, j1: int):
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

    def matrices(i0: int, i1: int, j0: int, j1: int):
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
    kinds: dict[tuple, int] = {}
    kind_data: list[tuple] = []
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
    budget = _budget(lw) - 4 * _ALIGN
    fixed = (
        4 * _bytes(TC, isz)  # T, four sets
        + _bytes(TC, isz)  # identity
        + _bytes(len(kind_data) * NMAX, isz)  # selections
        + _bytes(len(kind_data) * NMAX, isz)  # fills
        + _bytes(TC, isz)  # ones
    )

    def band_rows(u0: int, u1: int) -> tuple[int, int]:
        i0, i1 = units[u0][0], units[u1 - 1][1]
        hs = [i * sh + a - pt for i in range(i0, i1) for a in row_res]
        lo, hi = max(0, min(hs)), min(H - 1, max(hs))
        return lo, max(lo, hi)

    def band_bytes(u0: int, u1: int) -> int:
        lo, hi = band_rows(u0, u1)
        nrows = units[u1 - 1][1] - units[u0][0]
        return _bytes((hi - lo + 1) * W, isz) + _bytes(nph * nrows * Wq, isz)

    UB = len(units)
    while UB > 1 and max(band_bytes(u, min(len(units), u + UB)) for u in range(0, len(units), UB)) + fixed > budget:
        UB = _cdiv(UB, 2)
    if band_bytes(0, 1) + fixed > budget:
        return False
    bands = [(u, min(len(units), u + UB)) for u in range(0, len(units), UB)]
    max_xrows = max(band_rows(u0, u1)[1] - band_rows(u0, u1)[0] + 1 for u0, u1 in bands)
    max_qrows = max(units[u1 - 1][1] - units[u0][0] for u0, u1 in bands)

    ident, _ = _consts_2d(lw, [np.eye(TC, dtype=np.float32)], TC, TC, elem)
    sel, scols = _consts_2d(lw, s_blocks, NMAX, KMAX, elem)
    fill_elem = elem
    fills, fcols = _consts_2d(lw, f_blocks, NMAX, 1, fill_elem)
    ones = fill_row(lw, 1.0, fill_elem, TC)
    xv = lw.view(x, (N, C, H * W))
    k = _Kernel(lw, what, loc, [xv, ident, sel, fills, ones, out])
    kb = k.kb
    xa, oa = k.arg(xv), k.arg(out)
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
    kb.add(tile.LoadOp(k.arg(ident), [kb.const(0), kb.const(0)], ib, kb.const(TC), kb.const(TC), 0, 1))
    kb.add(tile.LoadOp(k.arg(sel), [kb.const(0), kb.const(0)], sb, kb.const(KMAX), kb.const(scols), 0, 1))
    kb.add(tile.LoadOp(k.arg(fills), [kb.const(0), kb.const(0)], fb, kb.const(1), kb.const(fcols), 0, 1))
    kb.add(tile.LoadOp(k.arg(ones), [kb.const(0)], ob, kb.const(1), kb.const(TC), -1, 0))

    def geom(ui, bi: int):
        gi = (units[0][1] - units[0][0]) if isinstance(ui, SSAValue) else (units[ui][1] - units[ui][0])
        j0, j1 = blocks[bi]
        return gi, j0, j1 - j0, _idx(kb, ui)

    def unit_a(c, ui, bi: int, kind: int, bset: int, xh0: int) -> None:
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
                kb.const(m), c, c, _false_i1(kb),
            ))
            koff += m
        kb.add(tile.UnaryOp("copy", sub(kb, a1, 0, 0, [K, TC]), sub(kb, tb, 0, 0, [K, TC]), kb.const(K), c))

    def unit_b(c, ui, bi: int, kind: int, bset: int, qi0: int) -> None:
        """Select unit `ui`'s phase segments and copy them into the phase images."""
        segs, K, _, _ = kind_data[kind]
        gi, j0, jn, ui_v = geom(ui, bi)
        Nn = nph * gi * jn
        a2, tb = a2s[bset], tbs[bset]
        if K:
            kb.add(tile.MatmulOp(
                sub(kb, tb, 0, 0, [K, TC]), sub(kb, sb, 0, kind * NMAX, [K, Nn]), sub(kb, a2, 0, 0, [TC, Nn]),
                c, kb.const(K), kb.const(Nn), _false_i1(kb),
            ))
        if needs_fill[kind]:
            kb.add(tile.MatmulOp(
                ob, sub(kb, fb, 0, kind * NMAX, [1, Nn]), sub(kb, a2, 0, 0, [TC, Nn]),
                c, kb.const(1), kb.const(Nn), true_i1(kb) if K else _false_i1(kb),
            ))
        for ph in range(nph):
            dst = lin(kb, ph * max_qrows * Wq - qi0 * Wq + j0, (g * Wq, ui_v))
            kb.add(tile.UnaryOp(
                "copy", sub(kb, a2, 0, ph * gi * jn, [TC, gi * jn]), sub(kb, qb, 0, dst, [TC, gi * jn]),
                c, kb.const(gi * jn),
            ))

    # software pipelined: a unit's transposes and copy (stage A) are emitted before the
    # previous unit's selection and copies (stage B), so the vector engine copies one
    # unit while the matrix engine selects another (each queue runs in program order)
    with kb.loop(N) as n, tiles(kb, C, TC) as (_, c0, c):
        bset = 0
        pending: list[tuple] = []  # stage B of the unit before

        def flush() -> None:
            while pending:
                unit_b(c, *pending.pop(0))

        for u0, u1 in bands:
            xlo, xhi = band_rows(u0, u1)
            qi0 = units[u0][0]
            kb.add(tile.LoadOp(xa, [n, c0, kb.const(xlo * W)], sub(kb, xb, 0, 0, [TC, (xhi - xlo + 1) * W]),
                               c, kb.const((xhi - xlo + 1) * W), 1, 2))
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
                    if count >= 2 * NS:
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
            for ph in range(nph):
                kb.add(tile.StoreOp(
                    sub(kb, qb, 0, ph * max_qrows * Wq, [TC, rows * Wq]), oa,
                    [n, c0, kb.const(ph), kb.const(qi0 * Wq)], c, kb.const(rows * Wq), 1, 3,
                ))
    k.launch()
    return True


def _phase_split_rows(lw, what, loc, x, out, phases, s, pad, Hq, Wq) -> bool:
    """Few channels, zero fill: per channel the image with rows on partitions; the phase
    images come out whole (rows on partitions) and are stored with one DMA each."""
    cfg = lw.cfg
    N, C, H, W = _shape(x)
    elem = _elem(x)
    isz = _isz(elem)
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
    need = (
        C * len(hch) * _bytes(W, isz) + C * len(row_res) * len(wch) * _bytes(Hq, isz)
        + C * len(phases) * _bytes(Wq, isz) + _bytes(len(rblocks) * Hq, isz) + _bytes(len(cblocks) * Wq, isz)
    )
    acc_need = C * len(row_res) * len(wch) * Hq * 4 + C * len(phases) * Wq * 4
    if need > _budget(lw) - 8 * _ALIGN or acc_need > cfg.accumulator.bytes_per_partition:
        return False
    rconst, rcols = _consts_2d(lw, rblocks, Hq, KMAX, elem)
    cconst, ccols = _consts_2d(lw, cblocks, Wq, KMAX, elem)
    out5 = lw.view(out, (N, C, len(phases), Hq, Wq))
    # a phase whose rows or columns are all padding is all zeros
    empty = [not any((a, hi) in rkey for hi in range(len(hch))) or not any((b, wi) in ckey for wi in range(len(wch)))
             for a, b in phases]
    zero = fill_row(lw, 0.0, elem, Wq) if any(empty) else None
    k = _Kernel(lw, what, loc, [x, rconst, cconst, out5] + ([zero] if zero is not None else []))
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
    with kb.loop(N) as n:
        for c in range(C):  # few channels: each its own buffers, so channels overlap
            xs = [kb.alloc([h1 - h0, W], elem, tile.SRAM, f"x{c}_") for h0, h1 in hch]
            for (h0, h1), xbuf in zip(hch, xs):
                kb.add(tile.LoadOp(xa, [n, kb.const(c), kb.const(h0), kb.const(0)], xbuf,
                                   kb.const(h1 - h0), kb.const(W), 2, 3))
            ta: dict[tuple[int, int], SSAValue] = {}
            for a in row_res:
                for wi, (w0, w1) in enumerate(wch):
                    terms = [hi for hi in range(len(hch)) if (a, hi) in rkey]
                    if not terms:
                        continue
                    acc = kb.alloc([w1 - w0, Hq], f32, tile.ACC, f"acc_r{c}_")
                    for t_, hi in enumerate(terms):
                        h0, h1 = hch[hi]
                        kb.add(tile.MatmulOp(
                            sub(kb, xs[hi], 0, w0, [h1 - h0, w1 - w0]),
                            sub(kb, rb, 0, rkey[(a, hi)] * Hq, [h1 - h0, Hq]), acc,
                            kb.const(w1 - w0), kb.const(h1 - h0), kb.const(Hq),
                            true_i1(kb) if t_ else _false_i1(kb),
                        ))
                    tbuf = kb.alloc([w1 - w0, Hq], elem, tile.SRAM, f"rows{c}_")
                    kb.add(tile.UnaryOp("copy", acc, tbuf, kb.const(w1 - w0), kb.const(Hq)))
                    ta[(a, wi)] = tbuf
            for ph, (a, b) in enumerate(phases):
                if empty[ph]:
                    kb.add(tile.StoreOp(zb, oa, [n, kb.const(c), kb.const(ph), kb.const(0), kb.const(0)],
                                        kb.const(Hq), kb.const(Wq), 3, 4))
                    continue
                acc = kb.alloc([Hq, Wq], f32, tile.ACC, f"acc_c{c}_")
                terms = [wi for wi in range(len(wch)) if (b, wi) in ckey]
                for t_, wi in enumerate(terms):
                    w0, w1 = wch[wi]
                    kb.add(tile.MatmulOp(
                        ta[(a, wi)], sub(kb, cb, 0, ckey[(b, wi)] * Wq, [w1 - w0, Wq]), acc,
                        kb.const(Hq), kb.const(w1 - w0), kb.const(Wq), true_i1(kb) if t_ else _false_i1(kb),
                    ))
                qbuf = kb.alloc([Hq, Wq], elem, tile.SRAM, f"phase{c}_")
                kb.add(tile.UnaryOp("copy", acc, qbuf, kb.const(Hq), kb.const(Wq)))
                kb.add(tile.StoreOp(qbuf, oa, [n, kb.const(c), kb.const(ph), kb.const(0), kb.const(0)],
                                    kb.const(Hq), kb.const(Wq), 3, 4))
    k.launch()
    return True


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


def _fusable_fns() -> tuple[dict, dict]:
    """The unary and binary ops a convolution epilogue absorbs (a subset of the one table,
    `passes/vector_fns.py`: the core activations and arithmetic, and min)."""
    from tilecc.passes.vector_fns import BINARY, UNARY

    unary = {t: f for t, f in UNARY.items() if f in _EPILOGUE_UNARY}
    binary = {t: f for t, f in BINARY.items() if f in _EPILOGUE_BINARY}
    return unary, binary


_EPILOGUE_UNARY = ("relu", "exp", "tanh", "sigmoid", "neg", "rsqrt", "sqrt", "silu")
_EPILOGUE_BINARY = ("add", "sub", "mul", "div", "max", "min")
_COMMUTATIVE = ("add", "mul", "max", "min")


def _ready(lw, v: SSAValue, before: Operation) -> bool:
    """Whether `v` is lowered; a later weight / constant is lowered now (the walk of
    lower-graph-to-tile skips ops whose result is already lowered)."""
    if v in lw.values or v in lw.scalars:
        return True
    owner = v.owner
    if isinstance(owner, (g.WeightOp, g.ConstantOp)) and owner.parent_block() is before.parent_block():
        lower_op(lw, owner)
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
                if padded_of(lw, other) is not None:  # an activation, stored padded
                    if full[1:] != (C, OH, OW) or full[0] not in (1, N):
                        break
                    new = [Step("tile", fn, swap=chain_rhs, value=lw.materialise(other))]
                elif full[0] == 1 and full[2] == 1 and full[3] == 1 and full[1] in (1, C):
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


def _pick(queues, nbytes: int, chunk: int) -> int | None:
    if queues is None:
        return None
    if isinstance(queues, _QueueModel):
        return queues.next(nbytes, chunk)
    return queues.next()


class Epilogue:
    """Compaction of a ``[channels x positions]`` tile to NCHW rows, the fused steps and
    the store. Channel of partition r: ``(c0 + r) * m + j`` (m: depthwise multiplier).

    With `pad` (a `PadInfo`) the output is stored padded: a band of rb rows is written
    whole (rb * Wp positions from row oh0 + pt), its padding columns zeroed by a 0/1
    mask; the top and bottom of the padding ring are stored once per channel tile
    (`emit_ring`). Tile operands (a residual) are then read in the same layout."""

    def __init__(self, lw, steps: list[Step], out: SSAValue, N: int, C: int, OH: int, OW: int, m: int = 1,
                 pad: PadInfo | None = None, loc: str = "", rb: int | None = None):
        self.lw, self.steps, self.N, self.C, self.OH, self.OW, self.m = lw, steps, N, C, OH, OW, m
        self.pad = pad
        # constants some epilogues use (the 1x1 one of `preload_columns`; mask and zeros)
        self.extra: list[SSAValue] = [fill_row(lw, 1.0, f32, 1)]
        S = OH * OW
        elem = _elem(out)
        if pad is not None:
            self.out = lw.view(pad.hbm, (N, C // m, m, pad.L))
            # a band's buffer: `lead` positions (the ring above the first row when it is
            # the first band), rb rows of Wp, `bottom` positions (the ring below the last)
            self.top = self.lead = pad.pt * pad.Wp + pad.pl
            self.bottom = pad.L - ((OH + pad.pt) * pad.Wp + pad.pl)
            self.rb = rb or OH
            span = self.rb * pad.Wp
            maskv = np.zeros(self.lead + span + self.bottom, dtype=np.float32)
            maskv[self.lead: self.lead + span] = [1.0 if t % pad.Wp < OW else 0.0 for t in range(span)]
            self.mask = const_hbm(lw, maskv, elem)
            self.zero = fill_row(lw, 0.0, elem, max(self.top, self.bottom, 1))
            self.extra += [self.mask, self.zero]
        else:
            self.out = lw.view(out, (N, C // m, m, S))
        self.views: list[SSAValue] = []
        for st in steps:
            if st.kind == "column":
                shp = _shape(st.value)
                size = math.prod(shp)
                st.value = lw.view(st.value, (C // m, m) if size == C else (1, 1))
                self.views.append(st.value)
            elif st.kind == "tile":
                info = _padded_hbm(lw, st.value)
                if pad is not None:
                    assert info is not None and (info.Wp, info.pt, info.pl) == (pad.Wp, pad.pt, pad.pl)
                    st.value = lw.view(info.hbm, (info.N, C // m, m, info.L))
                else:
                    if info is not None:
                        st.value = _natural_of_info(lw, info, loc)
                    n0 = math.prod(_shape(st.value)) // (C * S)
                    st.value = lw.view(st.value, (n0, C // m, m, S))
                self.views.append(st.value)

    def hbm_args(self) -> list[SSAValue]:
        return [*self.views, self.out, *self.extra]

    def band_cols(self, rb: int) -> int:
        """Positions of a band's output buffer."""
        if self.pad is not None:
            return self.lead + rb * self.pad.Wp + self.bottom
        return rb * self.OW

    def alloc(
        self, kb: KernelBuilder, TC: int, cols: int, elem: Attribute, col_sets: int = 0, sets: int = 1,
    ) -> None:
        """Buffers for bands of `cols` (rb * OW) positions; with `col_sets`, the column
        operands of that many consecutive channel chunks of TC are loaded once
        (`preload_columns`); `sets` output (and tile operand) buffers alternate
        (`emit(..., buf_set=)`), so one chunk's store overlaps the next chunk's epilogue."""
        rb = max(1, cols // self.OW)
        cols = self.band_cols(rb)
        self.TC = TC
        self.obs = [kb.alloc([TC, cols], elem, tile.SRAM, "out") for _ in range(sets)]
        self.ob = self.obs[0]
        self.col_sets = col_sets
        self.bufs: list[SSAValue | None] = []
        self.tile_bufs: list[list[SSAValue] | None] = []
        for st in self.steps:
            if st.kind == "column":
                self.bufs.append(kb.alloc([TC, max(1, col_sets)], _elem(st.value), tile.SRAM, "chan"))
                self.tile_bufs.append(None)
            elif st.kind == "tile":
                tcols = rb * self.pad.Wp if self.pad is not None else cols
                tb = [kb.alloc([TC, tcols], _elem(st.value), tile.SRAM, "operand") for _ in range(sets)]
                self.bufs.append(tb[0])
                self.tile_bufs.append(tb)
            else:
                self.bufs.append(None)
                self.tile_bufs.append(None)
        if self.pad is not None:
            self.maskb = kb.alloc([TC, cols], elem, tile.SRAM, "mask")
            self.zerob = kb.alloc([TC, max(self.top, self.bottom, 1)], elem, tile.SRAM, "zeros")

    def init(self, k: _Kernel, queues=None) -> None:
        """Kernel-start setup of a padded epilogue: the mask, zeroed output buffers (their
        padding columns are read by the mask before anything writes them) and the zeros
        of the padding ring."""
        if self.pad is None:
            return
        kb = k.kb
        cols = _shape(self.maskb)[1]
        TC = self.TC
        kb.add(tile.LoadOp(k.arg(self.mask), [kb.const(0)], self.maskb, kb.const(TC), kb.const(cols), -1, 0,
                           queue=_pick(queues, cols * 2, cols * 2)))
        zl = _shape(self.zerob)[1]
        kb.add(tile.LoadOp(k.arg(self.zero), [kb.const(0)], self.zerob, kb.const(TC), kb.const(zl), -1, 0,
                           queue=_pick(queues, zl * 2, zl * 2)))
        for ob in self.obs:  # zeros (mask * 0: the mask is the only initialised source this wide)
            kb.add(tile.ScalarOp("mul", self.maskb, 0.0, ob, kb.const(TC), kb.const(cols)))

    def emit_ring(self, k: _Kernel, n: SSAValue, c0: SSAValue, j: SSAValue, rows: SSAValue) -> None:
        """Store the zeros above the first and below the last output row (padded output)."""
        if self.pad is None:
            return
        kb = k.kb
        outa = k.arg(self.out)
        TC = self.TC
        if self.top:
            kb.add(tile.StoreOp(sub(kb, self.zerob, 0, 0, [TC, self.top]), outa, [n, c0, j, kb.const(0)], rows,
                                kb.const(self.top), 1, 3))
        if self.bottom:
            kb.add(tile.StoreOp(sub(kb, self.zerob, 0, 0, [TC, self.bottom]), outa,
                                [n, c0, j, kb.const(self.pad.L - self.bottom)], rows, kb.const(self.bottom), 1, 3))

    def sram_bytes(self, cols: int, out_isz: int) -> int:
        return Epilogue.bytes_for(self.steps, cols, out_isz, pad=self.pad, OW=self.OW)

    def preload_columns(
        self, k: _Kernel, c_first: SSAValue, TC: int, queues=None, count: int | None = None, defer: bool = False,
    ) -> None:
        """Load the column operands of `col_sets` chunks of TC channels from `c_first`
        (chunk j in column j of the operand's buffer). A column is one element per
        partition, which a DMA moves element by element (short chunks waste HBM
        bandwidth); instead each operand's channels load as one contiguous row and tiny
        matmuls with a 1x1 one (``acc[c, 0] = row[0, c] * 1``, exact) turn each chunk of
        the row into a column."""
        kb = k.kb
        self.pending = getattr(self, "pending", [])
        cols = [(st.value, buf) for st, buf in zip(self.steps, self.bufs) if st.kind == "column"]
        cols += getattr(self, "extra_columns", [])
        if not cols:
            return
        n = max(1, self.col_sets)
        count = n * TC if count is None else count  # channels from c_first
        sizes = [min(TC, count - j * TC) for j in range(n)]
        one_b = kb.alloc([1, 1], f32, tile.SRAM, "one")
        one_v = self.extra[0]
        kb.add(tile.LoadOp(k.arg(one_v), [kb.const(0)], one_b, kb.const(1), kb.const(1), -1, 0,
                           queue=_pick(queues, 4, 4)))
        for value, buf in cols:
            v = k.arg(value)
            elem = _elem(value)
            if _shape(value) == (1, 1):
                kb.add(tile.LoadOp(v, [kb.const(0), kb.const(0)], buf, kb.const(TC), kb.const(n), -1, -1,
                                   queue=_pick(queues, TC * n * 2, 2)))
                continue
            row = kb.alloc([1, n * TC], elem, tile.SRAM, "chan_row")
            one = one_b
            if elem != f32:
                one = kb.alloc([1, 1], elem, tile.SRAM, "one")
                kb.add(tile.UnaryOp("copy", one_b, one, kb.const(1), kb.const(1)))
            # the operand viewed (C, 1): `count` consecutive channels along the columns
            kb.add(tile.LoadOp(v, [c_first, kb.const(0)], row, kb.const(1), kb.const(count), 1, 0,
                               queue=_pick(queues, count * _isz(elem), count * _isz(elem))))
            acc = kb.alloc([TC, n], f32, tile.ACC, "acc_chan")
            self.pending.append((row, one, acc, buf, sizes))
        if not defer:
            self.columns_ready(k)

    def columns_ready(self, k: _Kernel) -> None:
        """The matmuls that turn the preloaded rows into columns (emitted where the
        matrix engine's in-order queue should take them: before the first epilogue, not
        ahead of matmuls that do not wait for these loads)."""
        kb = k.kb
        pending, self.pending = self.pending, []
        for row, one, acc, buf, sizes in pending:
            TC = _shape(buf)[0]
            n = len(sizes)
            for j, m in enumerate(sizes):
                kb.add(tile.MatmulOp(sub(kb, row, 0, j * TC, [1, TC]), one, sub(kb, acc, 0, j, [TC, 1]),
                                     kb.const(m), kb.const(1), kb.const(1), _false_i1(kb)))
            if sizes[-1] == TC:
                kb.add(tile.UnaryOp("copy", acc, buf, kb.const(TC), kb.const(n)))
            else:
                for j, m in enumerate(sizes):
                    kb.add(tile.UnaryOp("copy", sub(kb, acc, 0, j, [TC, 1]), sub(kb, buf, 0, j, [TC, 1]),
                                        kb.const(m), kb.const(1)))

    @staticmethod
    def bytes_for(steps: list[Step], cols: int, out_isz: int, sets: int = 1, pad: PadInfo | None = None,
                  OW: int = 1) -> int:
        if pad is not None:  # bands of Wp-wide rows and the ring, a mask and the ring's zeros
            cols = max(1, cols // OW) * pad.Wp + 2 * (pad.Wp + 1)
        total = sets * _bytes(cols, out_isz)
        if pad is not None:
            total += _bytes(cols, out_isz) + _bytes(2 * pad.Wp, out_isz)
        for st in steps:
            if st.kind == "column":
                total += _ALIGN
            elif st.kind == "tile":
                total += sets * _bytes(cols, out_isz)
        return total

    def emit(
        self, k: _Kernel, src: SSAValue, rows: SSAValue, n: SSAValue, c0: SSAValue, j: SSAValue,
        oh0: SSAValue, rb: int, Wq: int, compact: Callable[..., None], row_aware: bool = False,
        col_set: int | None = None, buf_set: int = 0, first: bool = False, last: bool = False,
    ) -> None:
        """`src`: the band's positions (row r of the band at column r * Wq); `compact(s, d,
        rows, cols)` writes the rounded output of a piece of it. `col_set`: the preloaded
        column operands' chunk (see `alloc`)."""
        kb = k.kb
        if getattr(self, "pending", None):
            self.columns_ready(k)
        OW = self.OW
        obuf = self.obs[buf_set]
        TC = _shape(obuf)[0]
        if self.pad is not None:
            self._emit_padded(k, src, rows, n, c0, j, oh0, rb, Wq, compact, row_aware, col_set, buf_set, first, last)
            return
        cols = rb * OW
        if Wq == OW:
            compact(sub(kb, src, 0, 0, [TC, cols]), sub(kb, obuf, 0, 0, [TC, cols]), rows, cols)
        else:
            with kb.loop(rb) as r:
                extra = {"r": r} if row_aware else {}
                compact(
                    sub(kb, src, 0, lin(kb, 0, (Wq, r)), [TC, OW]),
                    sub(kb, obuf, 0, lin(kb, 0, (OW, r)), [TC, OW]), rows, OW, **extra,
                )
        ob = sub(kb, obuf, 0, 0, [TC, cols])
        cc = kb.const(cols)
        s0 = lin(kb, 0, (OW, oh0))
        for st, buf, tbufs in zip(self.steps, self.bufs, self.tile_bufs):
            if tbufs is not None:
                buf = tbufs[buf_set]
            if st.kind == "unary":
                kb.add(tile.UnaryOp(st.fn, ob, ob, rows, cc))
            elif st.kind == "scalar":
                kb.add(tile.ScalarOp(st.fn, ob, st.imm, ob, rows, cc, swap=st.swap))
            elif st.kind == "column":
                if col_set is not None:
                    buf = sub(kb, buf, 0, col_set, [TC, 1])
                else:
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

    def _steps(self, k, ob, rows, cc, n, c0, j, s0, col_set, buf_set, TC, cols) -> None:
        kb = k.kb
        for st, buf, tbufs in zip(self.steps, self.bufs, self.tile_bufs):
            if tbufs is not None:
                buf = tbufs[buf_set]
            if st.kind == "unary":
                kb.add(tile.UnaryOp(st.fn, ob, ob, rows, cc))
            elif st.kind == "scalar":
                kb.add(tile.ScalarOp(st.fn, ob, st.imm, ob, rows, cc, swap=st.swap))
            elif st.kind == "column":
                if col_set is not None:
                    buf = sub(kb, buf, 0, col_set, [TC, 1])
                else:
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

    def _emit_padded(self, k, src, rows, n, c0, j, oh0, rb, Wq, compact, row_aware, col_set, buf_set,
                     first: bool, last: bool) -> None:
        """Buffer position lead + r * Wp + ow is padded index (oh0 + r + pt) * Wp + ow + pl.
        The first band's store also covers the ring above it, the last band's the ring
        below (`first` / `last`: bands emitted once each; bands in a loop rely on
        `emit_ring` instead)."""
        kb = k.kb
        pad, OW = self.pad, self.OW
        Wp, lead = pad.Wp, self.lead
        obuf = self.obs[buf_set]
        TC = _shape(obuf)[0]
        valid = (rb - 1) * Wp + OW  # through the last valid position
        if Wq == Wp:
            compact(sub(kb, src, 0, 0, [TC, valid]), sub(kb, obuf, 0, lead, [TC, valid]), rows, valid)
        else:
            with kb.loop(rb) as r:
                extra = {"r": r} if row_aware else {}
                compact(
                    sub(kb, src, 0, lin(kb, 0, (Wq, r)), [TC, OW]),
                    sub(kb, obuf, 0, lin(kb, lead, (Wp, r)), [TC, OW]), rows, OW, **extra,
                )
        ob = sub(kb, obuf, 0, lead, [TC, valid])
        s0 = lin(kb, lead, (Wp, oh0))
        self._steps(k, ob, rows, kb.const(valid), n, c0, j, s0, col_set, buf_set, TC, valid)
        lo = 0 if first else lead
        hi = lead + rb * Wp + (self.bottom if last else 0)
        span = _shape(self.maskb)[1]
        obf = sub(kb, obuf, 0, 0, [TC, span])
        kb.add(tile.BinaryOp("mul", obf, self.maskb, obf, rows, kb.const(span)))
        dst = kb.const(0) if first else s0
        kb.add(tile.StoreOp(sub(kb, obuf, 0, lo, [TC, hi - lo]), k.arg(self.out), [n, c0, j, dst], rows,
                            kb.const(hi - lo), 1, 3))


def _natural_of_info(lw, info: PadInfo, loc: str) -> SSAValue:
    """A natural-layout copy of a padded activation (made once)."""
    cache = lw.__dict__.setdefault("_nn_natural_hbm", {})
    if info.hbm not in cache:
        out = lw.hbm((info.N, info.C, info.H, info.W), _elem(info.hbm))
        pad_kernel(
            lw, "unpad", loc, lw.view(info.hbm, (info.N, info.C, info.Hp, info.Wp)),
            lw.view(out, (info.N, info.C, 1, info.H * info.W)), [(0, 0)], (1, 1), (-info.pt, -info.pl),
            info.H, info.W, 0.0,
        )
        cache[info.hbm] = out
    return cache[info.hbm]


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
    _check_absorbed(lw, op, fused, loc)
    final = fused[-1].results[0] if fused else res
    # which kernel: the -O2 ones write the padded layout, so plan them first (with the
    # padded epilogue's buffers when that layout is wanted)
    kernel = "vector" if Ci_g == 1 else None
    probe = _output_layout(lw, final, steps, N, Co, OH, OW, _elem(res), key=res, probe=True, wq=geo.Wq)[0]
    if kernel is None and lw.opt_level >= 2:
        for pd in ([probe, None] if probe is not None else [None]):
            if _conv_gemm_small_o2(lw, op, loc, geo, None, steps, None, G, Ci_g, Co_g, layout, pd, plan_only=True):
                kernel = "small"
            elif _conv_stem_o2(lw, op, loc, geo, None, steps, None, G, Ci_g, Co_g, layout, pd, plan_only=True):
                kernel = "stem"
            elif _conv_gemm_o2(lw, op, loc, geo, None, steps, None, G, Ci_g, Co_g, layout, pd, plan_only=True):
                kernel = "gemm"
            if kernel is not None:
                if pd is None:
                    probe = None
                break
    if kernel is None:
        probe = None
    pad, wanted = (_output_layout(lw, final, steps, N, Co, OH, OW, _elem(res), key=res, wq=geo.Wq)
                   if probe is not None else (None, False))
    out = pad.hbm if pad is not None else lw.hbm((N, Co, OH, OW), _elem(res))
    src = phase_image(lw, x, geo, 0.0, loc, "conv2d")
    if kernel == "vector":
        _conv_vector(lw, op, loc, geo, src, steps, out, G, Co_g, layout, pad)
    else:
        o2 = {"small": _conv_gemm_small_o2, "stem": _conv_stem_o2, "gemm": _conv_gemm_o2}
        done = kernel is not None and bool(o2[kernel](lw, op, loc, geo, src, steps, out, G, Ci_g, Co_g, layout, pad))
        if not done:
            # the -O0 kernels read and store natural rows (padded ones are padded after)
            for st in steps:
                if st.kind == "tile" and _padded_hbm(lw, st.value) is not None:
                    st.value = _natural_of_info(lw, _padded_hbm(lw, st.value), loc)
            target = out if pad is None else lw.hbm((N, Co, OH, OW), _elem(res))
            if not _conv_gemm_small(lw, op, loc, geo, src, steps, target, G, Ci_g, Co_g, layout):
                _conv_gemm(lw, op, loc, geo, src, steps, target, G, Ci_g, Co_g, layout)
            if pad is not None:
                _pad_into(lw, target, pad, loc)
    finish_fusion(lw, op, fused, out)
    _record_layout(lw, res, pad, wanted, loc)


def _output_layout(lw, final: SSAValue, steps: list[Step], N: int, C: int, OH: int, OW: int,
                   elem: Attribute, nonneg: bool | None = None, key: SSAValue | None = None,
                   probe: bool = False, wq: int = 0) -> tuple[PadInfo | None, bool]:
    """The layout of a window op's output: padded (a new `PadInfo`) when every user takes
    it padded, or when a fused residual operand is padded (the epilogue reads operands in
    its own layout); natural otherwise (padded operands are then read through a
    natural copy). Also returns whether the users asked for it."""
    if lw.opt_level < 2:
        return None, False
    if nonneg is None:
        nonneg = bool(steps) and steps[-1].kind == "unary" and steps[-1].fn == "relu"
    absorbed: list = []
    strict: list = []
    wanted = _wants_padded(lw, final, N, C, OH, OW, nonneg, absorbed, strict)
    infos = [_padded_hbm(lw, st.value) for st in steps if st.kind == "tile"]
    if infos and not all(i is not None and (i.H, i.W, i.pt, i.pl, i.Wp) == (OH, OW, 1, 1, OW + 2) for i in infos):
        return None, False
    # rows as wide as the producer's accumulator rows where no user needs W + 2 (the
    # epilogue then writes whole bands without compacting rows)
    Wp = wq if (not strict and not infos and wq >= OW + 2) else OW + 2
    if (wanted or infos) and probe:
        return PadInfo(None, N, C, OH, OW, 1, 1, OH + 2, Wp, nonneg), wanted
    if wanted or infos:
        for add, conv in absorbed:
            lw.__dict__.setdefault("_nn_absorb", {}).setdefault(conv, []).append((add, key or final))
        return _new_padded(lw, N, C, OH, OW, elem, nonneg, Wp=Wp), wanted
    return None, False


def _record_layout(lw, res: SSAValue, pad: PadInfo | None, wanted: bool, loc: str) -> None:
    """After lowering: a padded result is recorded; if its users did not all ask for the
    padded layout (it was forced by a padded residual operand), the natural copy is what
    the others read."""
    if pad is None:
        return
    _set_padded(lw, res, pad)
    if not wanted:
        lw.values[res] = _natural_of_info(lw, pad, loc)


def _pad_into(lw, natural: SSAValue, pad: PadInfo, loc: str) -> None:
    """Copy a natural [N, C, H, W] tensor into the padded layout `pad` (a stride-1 padding
    kernel: the -O0 kernels' outputs where the layout was decided padded)."""
    pad_kernel(lw, "pad", loc, natural, lw.view(pad.hbm, (pad.N, pad.C, 1, pad.L)), [(0, 0)], (1, 1),
               (pad.pt, pad.pl), pad.Hp, pad.Wp, 0.0)


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


@dataclass
class _KStep:
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


def _ksteps(geo: Geometry, Ci_g: int, KMAX: int, rb: int) -> list[_KStep]:
    """The contraction steps of a band of `rb` rows: input-channel tiles with every tap
    as a column offset, or (few input channels) groups of kernel rows folded into K."""
    KH, KW = geo.k
    (sh, sw), (dh, dw) = geo.s, geo.d
    lp = geo.lp(rb)
    ncol = len(geo.col_res)
    F = min(KH, KMAX // Ci_g) if KH > 1 else 1
    out: list[_KStep] = []
    if F < 2:
        TK, nk = _k_tiles(Ci_g, KMAX)
        for i in range(nk):
            ci0, kk = i * TK, min(TK, Ci_g - i * TK)
            slabs = [geo.slab(rb, p) for p in range(geo.nph)]
            loads = [[(0, p, ci0, kk, 0)] for p in range(geo.nph)]
            taps = [(t, p, off) for t, (_, _, p, off) in enumerate(geo.taps)]
            out.append(_KStep(kk, slabs, loads, taps, [(0, kk, 0, len(geo.taps), 0)]))
        return out
    order = sorted(range(KH), key=lambda kh: ((kh * dh) % sh, kh))
    colmax = [max((kw * dw) // sw for kw in range(KW) if (kw * dw) % sw == geo.col_res[bi]) for bi in range(ncol)]
    for g0 in range(0, KH, F):
        khs = order[g0:g0 + F]
        K = len(khs) * Ci_g
        slabs = [lp + colmax[bi] for bi in range(ncol)]
        loads: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(ncol)]
        wloads = []
        for r, kh in enumerate(khs):
            a_idx = geo.row_res.index((kh * dh) % sh)
            off = ((kh * dh) // sh) * geo.Wq
            for bi in range(ncol):
                loads[bi].append((r * Ci_g, a_idx * ncol + bi, 0, Ci_g, off))
            wloads.append((r * Ci_g, Ci_g, kh * KW, KW, 0))
        taps = [(kw, geo.col_res.index((kw * dw) % sw), (kw * dw) // sw) for kw in range(KW)]
        out.append(_KStep(K, slabs, loads, taps, wloads, True))
    return out


def _conv_gemm_o2(lw, op, loc, geo: Geometry, src, steps, out, G, Ci_g, Co_g, layout, pad=None,
                  plan_only: bool = False) -> bool:
    """-O2 implicit GEMM for images larger than one accumulator tile.

    Every weight of the group stays resident (loaded once, in pieces spread over the
    queues; `_weight_pieces`), the output rows go in bands (at least two when the image
    allows) and each band has its own slab, accumulator and epilogue buffers out of two
    sets, so one band's loads and matmuls overlap the previous band's epilogue and
    store. Each output-channel tile of a band has its own accumulator, so its epilogue
    starts while the next tile's matmuls run. Per-channel operands (bias, batch-norm
    scale and shift) are loaded once per group. Returns False where it does not apply
    (the weights do not fit SRAM, or the weights are not packed ``gihwo``)."""
    if layout != "gihwo":
        return False
    cfg = lw.cfg
    x, w, b = op.input, op.weight, op.bias
    elem, out_elem = _elem(x), _elem(op.results[0])
    isz, osz = _isz(elem), _isz(out_elem)
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Co = G * Co_g
    KMAX = min(cfg.matrix.rows, lw.P)
    AP = min(cfg.accumulator.partitions, lw.P)
    TCo = min(AP, Co_g)
    ntile = _cdiv(Co_g, TCo)
    TP = cfg.matrix.cols
    A = cfg.accumulator.bytes_per_partition
    budget = _budget(lw) - 8 * _ALIGN
    ks1 = _ksteps(geo, Ci_g, KMAX, 1)
    wbytes = sum(_bytes(len(st.taps) * Co_g, isz) for st in ks1) + 4 * _ALIGN
    ncolumns = sum(1 for st in steps if st.kind == "column") + (b is not None)
    fixed = wbytes + ncolumns * (_bytes(ntile, 4) + _bytes(ntile * TCo, 4)) + _ALIGN

    def need(rb: int) -> int:
        ks = _ksteps(geo, Ci_g, KMAX, rb)
        slabs = sum(_bytes(L, isz) for st in ks for L in st.slabs)
        return fixed + 2 * slabs + Epilogue.bytes_for(steps, rb * OW, osz, 2, pad, OW)

    acc_cols = ncolumns * _bytes(ntile, 4)  # the per-channel operands' column accumulators

    def fits(rb: int) -> bool:
        return 2 * ntile * geo.lp(rb) * 4 + acc_cols <= A and need(rb) <= budget

    # bands: the tallest that fits, but at least two (three or four when the image has
    # the rows for it) so the stages overlap, and not so short that the DMAs get small
    RB = _pick_band(geo, fits)
    if not RB:
        return False
    want = 4 if OH >= 16 else (2 if OH >= 2 else 1)
    for cand in range(RB, 0, -1):
        if OH % cand == 0 and OH // cand >= want and fits(cand) and geo.lp(cand) >= min(geo.lp(RB), 256):
            RB = cand
            break
    if plan_only:
        return True
    nb = OH // RB
    ks = _ksteps(geo, Ci_g, KMAX, RB)
    lp = geo.lp(RB)
    # slab sets: one per band where SRAM allows (every band's loads issue up front),
    # else two; accumulators and epilogue buffers alternate between two sets
    slab_bytes = sum(_bytes(L, isz) for st in ks for L in st.slabs)
    nsl = max(2, min(nb, (budget - need(RB) + 2 * slab_bytes) // max(slab_bytes, 1)))
    nsl = min(nsl, nb) if nb > 1 else 1
    unroll = nb <= 8
    epi = Epilogue(lw, steps, out, N, Co, OH, OW, pad=pad, loc=loc, rb=RB)
    T = len(geo.taps)
    wv = lw.materialise(w)
    wview = lw.view(wv, (G, Ci_g, T, Co_g))
    bview = lw.view(lw.materialise(b), (Co, 1)) if b is not None else None
    args = [src, wview] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = _Kernel(lw, "conv2d", loc, args)
    kb = k.kb
    qm = _QueueModel(lw)
    sa, wa = k.arg(src), k.arg(wview)
    ba = k.arg(bview) if bview is not None else None
    # weight buffers: per step, one per weight DMA piece (tap range) of that step
    wpieces: list[list[tuple[int, int, SSAValue]]] = []  # per step: (first tap index, taps, buffer)
    tap_bytes = [st.K * Co_g * isz for st in ks]
    for si, st in enumerate(ks):
        ntaps = len(st.taps)
        if not st.folded:  # channel tile: split its taps into pieces over the queues
            pieces = _weight_pieces(lw, 1, ntaps, tap_bytes[si])
            wpieces.append([(t0, nt, kb.alloc([st.K, nt * Co_g], elem, tile.SRAM, "weights"))
                            for _, t0, nt in pieces])
        else:  # folded kernel rows: one buffer, its row blocks on one queue
            wpieces.append([(0, ntaps, kb.alloc([st.K, ntaps * Co_g], elem, tile.SRAM, "weights"))])
    slabsets = [[[kb.alloc([st.K, L], elem, tile.SRAM, f"slab{i}") for i, L in enumerate(st.slabs)] for st in ks]
                for _ in range(nsl if unroll else 2)]
    accs = [[kb.alloc([TCo, lp], f32, tile.ACC, "acc") for _ in range(ntile)] for _ in range(2)]
    epi.alloc(kb, TCo, RB * OW, out_elem, col_sets=ntile, sets=2)
    epi.init(k, qm)
    bbuf = None
    if b is not None:
        bbuf = kb.alloc([TCo, ntile], _elem(b), tile.SRAM, "bias")
        epi.extra_columns = [(bview, bbuf)]

    def tap_weight(si: int, ti: int, co0: SSAValue) -> SSAValue:
        for t0, nt, buf in wpieces[si]:
            if t0 <= ti < t0 + nt:
                return sub(kb, buf, 0, lin(kb, (ti - t0) * Co_g, (1, co0)), [ks[si].K, TCo])
        raise AssertionError("tap without weights")

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
                                           queue=qm.next(kk * nt * Co_g * isz, nt * Co_g * isz)))
                    else:  # row blocks of one buffer: disjoint partitions, any queues
                        for r0, kk, tap0, ntp, _ in st.wloads:
                            kb.add(tile.LoadOp(wa, [gi, kb.const(0), kb.const(tap0), kb.const(0)],
                                               sub(kb, buf, r0, 0, [kk, ntp * Co_g]), kb.const(kk),
                                               kb.const(ntp * Co_g), 1, 3,
                                               queue=qm.next(kk * ntp * Co_g * isz, ntp * Co_g * isz)))

        def band_loads(bidx: SSAValue, sset: int) -> None:
            p0 = lin(kb, 0, (RB * Wq, bidx))
            slabs = slabsets[sset]
            for si, st in enumerate(ks):
                for li, (L, lds) in enumerate(zip(st.slabs, st.loads)):
                    for r0, ph_, ci0, kk, off in lds:  # disjoint row blocks: any queues
                        ci = lin(kb, ci0, (Ci_g, gi))
                        kb.add(tile.LoadOp(sa, [n, ci, kb.const(ph_), kb.addi(p0, kb.const(off)) if off else p0],
                                           sub(kb, slabs[si][li], r0, 0, [kk, L]), kb.const(kk), kb.const(L), 1, 3,
                                           queue=qm.next(kk * L * isz, L * isz)))

        def band(bidx: SSAValue, bset: int, sset: int, first: bool = False, last: bool = False) -> None:
            slabs = slabsets[sset]
            for j in range(ntile):
                co0 = kb.const(j * TCo)
                m = kb.const(min(TCo, Co_g - j * TCo))
                acc = accs[bset][j]
                first = True
                with tiles(kb, lp, TP) as (_, q0, nq):
                    for si, st in enumerate(ks):
                        for ti, (_, sl, off) in enumerate(st.taps):
                            flag = _false_i1(kb) if first else true_i1(kb)
                            first = False
                            kb.add(tile.MatmulOp(
                                tap_weight(si, ti, co0),
                                sub(kb, slabs[si][sl], 0, lin(kb, off, (1, q0)), [st.K, TP]),
                                sub(kb, acc, 0, q0, [TCo, TP]),
                                m, kb.const(st.K), nq, flag,
                            ))
                c0 = lin(kb, j * TCo, (Co_g, gi))

                def compact(s_, d_, rows, cols, j=j):
                    if bbuf is not None:
                        kb.add(tile.BinaryOp("add", s_, sub(kb, bbuf, 0, j, [TCo, 1]), d_, rows, kb.const(cols),
                                             "column"))
                    else:
                        kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

                oh0 = lin(kb, 0, (RB, bidx))
                epi.emit(k, acc, m, n, c0, kb.const(0), oh0, RB, Wq, compact, col_set=j, buf_set=(bset + j) % 2,
                         first=first, last=last)

        # issue order: the per-channel operands (small; turned into columns just before
        # the first epilogue), the first band's slabs, the weights, the other bands' slabs
        epi.preload_columns(k, ch0, TCo, queues=qm, count=Co_g, defer=True)
        band_loads(kb.const(0), 0)
        weight_loads()
        if unroll:
            # the first `nsl` bands' loads up front, each later band's when its set frees
            for bi in range(1, min(nsl, nb)):
                band_loads(kb.const(bi), bi)
            for bi in range(nb):
                band(kb.const(bi), bi % 2, bi % nsl, first=bi == 0, last=bi == nb - 1)
                if bi + nsl < nb:
                    band_loads(kb.const(bi + nsl), (bi + nsl) % nsl)
        else:
            # the first and last bands once each (their stores cover the padding ring),
            # the ones between in pairs: (2i + 1, set 1), (2i + 2, set 0)
            band(kb.const(0), 0, 0, first=True)
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
    return True


def _stem_blocks(geo: Geometry, Ci: int) -> list[tuple[int, int, int, int, int, list[int]]]:
    """The contraction rows of a fully folded convolution (every tap in K): blocks of
    (kernel row, input channel, phase image, position offset, offset step, taps), each
    block a run of taps of one column phase whose offsets step evenly (one DMA reads the
    block's rows as shifted windows of one phase image)."""
    KH, KW = geo.k
    (sh, sw), (dh, dw) = geo.s, geo.d
    ncol = len(geo.col_res)
    out = []
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


def _conv_stem_o2(lw, op, loc, geo: Geometry, src, steps, out, G, Ci_g, Co_g, layout, pad=None,
                  plan_only: bool = False) -> bool:
    """Few input channels (an image stem, e.g. 7x7 over RGB): every tap folded into the
    contraction, so K = Ci * KH * KW rows (in steps of <= R) instead of Ci * KH and a
    matmul per kernel column. The rows are shifted windows of the phase images, loaded
    once for the whole image (one DMA per run of taps; a band would need them all again)
    and kept resident while bands of output rows go through double-buffered
    accumulators and the epilogue. The weights load in their natural row order and a
    0/1 matmul permutes them to the contraction's row order (exact)."""
    cfg = lw.cfg
    if layout != "gihwo" or G != 1 or Ci_g > 8 or len(geo.taps) < 4:
        return False
    x, w, b = op.input, op.weight, op.bias
    elem, out_elem = _elem(x), _elem(op.results[0])
    isz, osz = _isz(elem), _isz(out_elem)
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    T = len(geo.taps)
    KMAX = min(cfg.matrix.rows, lw.P)
    AP = min(cfg.accumulator.partitions, lw.P)
    TCo = min(AP, Co_g, cfg.matrix.cols)
    ntile = _cdiv(Co_g, TCo)
    TP = cfg.matrix.cols
    A = cfg.accumulator.bytes_per_partition
    blocks = _stem_blocks(geo, Ci_g)
    # k-steps: blocks packed in order into <= KMAX rows
    ksteps: list[list[tuple[int, tuple]]] = [[]]  # (row offset, block)
    rows = 0
    for blk in blocks:
        n_ = len(blk[5])
        if rows + n_ > KMAX:
            ksteps.append([])
            rows = 0
        ksteps[-1].append((rows, blk))
        rows += n_
    Ks = [sum(len(blk[5]) for _, blk in st) for st in ksteps]
    Lall = geo.lp(OH)
    nat = Ci_g * T  # natural weight rows (ci, kh, kw)
    nch = _cdiv(nat, KMAX)
    budget = _budget(lw) - 8 * _ALIGN
    ncolumns = sum(1 for st in steps if st.kind == "column") + (b is not None)
    fixed = (len(ksteps) * (_bytes(Lall, isz) + _bytes(Co_g, isz)) + nch * _bytes(Co_g, isz)
             + _bytes(len(ksteps) * nch * KMAX, isz) + ncolumns * 2 * _bytes(ntile * TCo, 4) + _ALIGN)

    acc_cols = ncolumns * _bytes(ntile, 4)  # the per-channel operands' column accumulators

    def fits(rb: int) -> bool:
        return (2 * ntile * geo.lp(rb) * 4 + acc_cols <= A
                and fixed + Epilogue.bytes_for(steps, rb * OW, osz, 2, pad, OW) <= budget)

    if max(Ks) * 0 + len(ksteps) > 4 or not fits(1):
        return False
    RB = _pick_band(geo, fits)
    if not RB:
        return False
    if plan_only:
        return True
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
    pconst, pcols = _consts_2d(lw, pblocks, len(ksteps) * KMAX, KMAX, elem)
    wv = lw.materialise(w)
    wnat = lw.view(wv, (nat, Co_g))
    bview = lw.view(lw.materialise(b), (Co_g, 1)) if b is not None else None
    args = [src, wnat, pconst] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = _Kernel(lw, "conv2d", loc, args)
    kb = k.kb
    qm = _QueueModel(lw)
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
    if b is not None:
        bbuf = kb.alloc([TCo, ntile], _elem(b), tile.SRAM, "bias")
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
            for r0, (kh, ci, ph_, off, step, kws) in st:
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
                                         kb.const(K), kb.const(r), kb.const(nc_), true_i1(kb) if c else _false_i1(kb)))
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
                            true_i1(kb) if si else _false_i1(kb),
                        ))

                def compact(s_, d_, rows_, cols, j=j):
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
    return True


def _conv_gemm_small(lw, op, loc, geo: Geometry, src, steps, out, G, Ci_g, Co_g, layout) -> bool:
    """Few output positions (the whole image is one accumulator tile): positions on the
    accumulator partitions (M, the streamed dimension) and output channels along the array
    columns (N), so a matmul costs its few positions, not a full channel tile. Returns
    False where the shape does not qualify.

    -O2 (`_conv_gemm_small_o2`) keeps every contraction tile's weights resident (loaded
    in a few large DMAs spread over the queues, all issued up front) and turns the
    ``[positions x channels]`` result back to ``[channels x positions]`` with one fp32
    selection matmul per channel tile (dropping the padding columns), so the epilogue
    and the store are the contiguous ones of the large-image kernel. -O0 stores with the
    spatial stride (one DMA element per output)."""
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


class _Queues:
    """Round-robin DMA queue hints for loads issued in a chosen order."""

    def __init__(self, lw, start: int = 0):
        self.n = lw.cfg.dma.queues
        self.i = start

    def next(self) -> int:
        q = self.i % self.n
        self.i += 1
        return q


class _QueueModel:
    """Queue hints by earliest estimated finish: each DMA goes to the queue expected to be
    free first, charged its fixed latency and its bytes at a share of the bandwidth
    (`share` transfers in flight). Used for loads issued up front, so queues that carry
    a slow (short-chunk) load get fewer of the large ones."""

    def __init__(self, lw, share: float = 2.0):
        cfg = lw.cfg
        self.free = [0.0] * cfg.dma.queues
        self.lat = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
        self.bw = cfg.hbm.bytes_per_cycle / share
        self.eff = cfg.dma.efficient_chunk_bytes

    def next(self, nbytes: int = 0, chunk: int | None = None) -> int:
        q = min(range(len(self.free)), key=lambda i: (self.free[i], i))
        eff = 1.0 if chunk is None else min(1.0, chunk / self.eff)
        self.free[q] += self.lat + nbytes / (self.bw * eff)
        return q


class _Staggered:
    """Queue hints for the small loads issued before a stream of large ones: queue q gets
    about q of them (queue Q-1 the most), so the large DMAs that follow round-robin start
    at staggered times. Queues that start together stay in step, all paying their fixed
    latency at once while HBM idles; staggered, one queue's latency overlaps the others'
    transfers."""

    def __init__(self, lw):
        n = lw.cfg.dma.queues
        self.pattern = [q for q in range(n - 1, 0, -1) for _ in range(q)] or [0]
        self.i = 0

    def next(self) -> int:
        q = self.pattern[self.i % len(self.pattern)]
        self.i += 1
        return q


def _weight_pieces(lw, nk: int, T: int, tap_bytes: int) -> list[tuple[int, int, int]]:
    """The weight DMAs of `nk` contraction tiles of `T` taps (`tap_bytes` each), in issue
    order: (tile, first tap, taps), contiguous in the ``gihwo`` layout.

    Queues that start together stay in step (processor sharing lets a queue that fell
    behind catch up), so they pay their fixed latency at the same moments, while HBM
    idles: fewer, larger DMAs waste less. But the matmuls on the last bytes wait for
    them, so the rounds shrink: each round gives every queue a piece, about 45%, 33% and
    22% of every tile's taps (pieces at least ``latency * bandwidth`` bytes), so the
    matmuls on rounds 1 and 2 overlap the transfers of the rounds after them."""
    cfg = lw.cfg
    Q = cfg.dma.queues
    lat = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
    min_bytes = lat * cfg.hbm.bytes_per_cycle
    total = nk * T * tap_bytes
    nrounds = max(1, min(3, round(total / (Q * min_bytes))))
    fracs = {1: [1.0], 2: [0.6, 1.0], 3: [0.45, 0.78, 1.0]}[nrounds]
    out: list[tuple[int, int, int]] = []
    if T == 1:  # whole tiles per round
        cuts = sorted({0, nk} | {max(1, min(nk, round(f * nk))) for f in fracs})
        for lo, hi in zip(cuts, cuts[1:]):
            out += [(t, 0, 1) for t in range(lo, hi)]
        return out
    cuts = sorted({0, T} | {max(1, min(T, round(f * T))) for f in fracs})
    for lo, hi in zip(cuts, cuts[1:]):
        pieces = [(t, lo, hi - lo) for t in range(nk)]
        while len(pieces) < Q and any(n > 1 for _, _, n in pieces):
            i = max(range(len(pieces)), key=lambda i: (pieces[i][2], -i))
            t, t0, n = pieces[i]
            pieces[i: i + 1] = [(t, t0, n // 2), (t, t0 + n // 2, n - n // 2)]
        out += pieces
    return out


def _conv_gemm_small_o2(lw, op, loc, geo: Geometry, src, steps, out, G, Ci_g, Co_g, layout, pad=None,
                        plan_only: bool = False) -> bool | None:
    """See `_conv_gemm_small`; None where the -O2 kernel does not apply (the -O0 one may)."""
    cfg = lw.cfg
    x, w, b = op.input, op.weight, op.bias
    elem, out_elem = _elem(x), _elem(op.results[0])
    isz, osz = _isz(elem), _isz(out_elem)
    T = len(geo.taps)
    N, OH, OW = geo.N, geo.OH, geo.OW
    Co = G * Co_g
    S = OH * OW
    Lp = geo.lp(OH)
    AP = min(cfg.accumulator.partitions, lw.P)
    if Lp > min(AP, cfg.matrix.rows) or S > cfg.matrix.cols or Co_g > cfg.accumulator.bytes_per_partition // 4:
        return False
    if layout != "gihwo":
        return None
    TK, nk = _k_tiles(Ci_g, min(cfg.matrix.rows, lw.P))
    TN = min(cfg.matrix.cols, Co_g)
    TCo = min(AP, lw.P, Co_g)  # output channels per transposed chunk
    nchunks = _cdiv(Co_g, TCo)
    HW = geo.Hq * geo.Wq  # one buffer holds every phase image (one DMA per contraction tile)
    kbytes = _bytes(T * Co_g, isz) + _bytes(geo.nph * HW, isz)
    ncols = sum(1 for st in steps if st.kind == "column") + (b is not None)
    rest = (
        2 * _bytes(TCo, 4) + _bytes(S, 4) + Epilogue.bytes_for(steps, S, osz, 2, pad, OW) + ncols * _bytes(nchunks, 4)
    )
    acc_bytes = Co_g * 4 + 2 * S * 4
    if acc_bytes > cfg.accumulator.bytes_per_partition or nk * kbytes + 2 * _ALIGN * T + rest > _budget(lw):
        return None
    if plan_only:
        return True
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
    args = [src, wview, sel] + ([bview] if bview is not None else []) + epi.hbm_args()
    k = _Kernel(lw, "conv2d", loc, args)
    kb = k.kb
    sa, wa = k.arg(src), k.arg(wview)
    ba = k.arg(bview) if bview is not None else None
    ktiles = [(i * TK, min(TK, Ci_g - i * TK)) for i in range(nk)]
    pieces = _weight_pieces(lw, nk, T, TK * Co_g * isz)
    # one buffer per weight DMA, so DMAs on different queues do not wait for each other
    wbufs = {piece: kb.alloc([TK, piece[2] * Co_g], elem, tile.SRAM, "weights") for piece in pieces}
    tap_buf = {}
    for (t, t0, nt), buf in wbufs.items():
        for tt in range(t0, t0 + nt):
            tap_buf[(t, tt)] = (buf, tt - t0)
    slabsets = [kb.alloc([TK, geo.nph * HW], elem, tile.SRAM, "slab") for _ in range(nk)]
    acc = kb.alloc([Lp, Co_g], f32, tile.ACC, "acc")
    selb = kb.alloc([Lp, S], f32, tile.SRAM, "select")
    yts = [kb.alloc([Lp, TCo], f32, tile.SRAM, "acc_copy") for _ in range(2)]
    acc2s = [kb.alloc([TCo, S], f32, tile.ACC, "acc_t") for _ in range(2)]
    epi.alloc(kb, TCo, S, out_elem, col_sets=nchunks, sets=2)
    bbuf = None
    if b is not None:
        bbuf = kb.alloc([TCo, nchunks], _elem(b), tile.SRAM, "bias")
        epi.extra_columns = [(bview, bbuf)]
    qm = _QueueModel(lw)
    epi.init(k, qm)
    with kb.loop(N) as n, kb.loop(G) as gi:
        ch0 = lin(kb, 0, (Co_g, gi))
        # the small loads first (slabs, selection, per-channel operands), then the weights
        for (ci0, kk), slab in zip(ktiles, slabsets):
            ci = lin(kb, ci0, (Ci_g, gi))
            L = geo.nph * HW  # the phases of a channel are contiguous
            kb.add(tile.LoadOp(sa, [n, ci, kb.const(0), kb.const(0)], slab, kb.const(kk),
                               kb.const(L), 1, 3, queue=qm.next(kk * L * isz, L * isz)))
        kb.add(tile.LoadOp(k.arg(sel), [kb.const(0), kb.const(0)], selb, kb.const(Lp), kb.const(S), 0, 1,
                           queue=qm.next(Lp * S * 4, S * 4)))
        epi.preload_columns(k, ch0, TCo, queues=qm, count=Co_g)
        for piece in pieces:
            t, t0, nt = piece
            kb.add(tile.LoadOp(wa, [gi, kb.const(ktiles[t][0]), kb.const(t0), kb.const(0)], wbufs[piece],
                               kb.const(ktiles[t][1]), kb.const(nt * Co_g), 1, 3,
                               queue=qm.next(ktiles[t][1] * nt * Co_g * isz, nt * Co_g * isz)))
        first = True
        for rnd in [pieces]:
            for t, t0, nt in rnd:
                kk = ktiles[t][1]
                slab = slabsets[t]
                for tt in range(t0, t0 + nt):
                    _, _, p, off = geo.taps[tt]
                    wgb, col = tap_buf[(t, tt)]
                    flag = _false_i1(kb) if first else true_i1(kb)
                    first = False
                    with tiles(kb, Co_g, TN) as (_, co0, nn_):
                        kb.add(tile.MatmulOp(
                            sub(kb, slab, 0, p * HW + off, [TK, Lp]),
                            sub(kb, wgb, 0, lin(kb, col * Co_g, (1, co0)), [TK, TN]),
                            sub(kb, acc, 0, co0, [Lp, TN]),
                            kb.const(Lp), kb.const(kk), nn_, flag,
                        ))
        for j in range(nchunks):
            co0 = j * TCo
            m = min(TCo, Co_g - co0)
            yt, acc2 = yts[j % 2], acc2s[j % 2]
            kb.add(tile.UnaryOp("copy", sub(kb, acc, 0, co0, [Lp, TCo]), sub(kb, yt, 0, 0, [Lp, TCo]),
                                kb.const(Lp), kb.const(m)))
            kb.add(tile.MatmulOp(sub(kb, yt, 0, 0, [Lp, TCo]), selb, acc2, kb.const(m), kb.const(Lp),
                                 kb.const(S), _false_i1(kb)))
            c0 = lin(kb, co0, (Co_g, gi))
            mm = kb.const(m)

            def compact(s_, d_, rows, cols, j=j):
                if bbuf is not None:
                    kb.add(tile.BinaryOp("add", s_, sub(kb, bbuf, 0, j, [TCo, 1]), d_, rows, kb.const(cols), "column"))
                else:
                    kb.add(tile.UnaryOp("copy", s_, d_, rows, kb.const(cols)))

            epi.emit(k, acc2, mm, n, c0, kb.const(0), kb.const(0), OH, OW, compact, col_set=j, buf_set=j % 2,
                     first=True, last=True)
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


def _conv_vector(lw, op, loc, geo: Geometry, src, steps, out, G, mult, layout, pad=None) -> None:
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
        extra_bytes=lambda rb: _bytes(T * mult, _isz(elem)) + _bytes(geo.lp(rb), 4) + _ALIGN, pad=pad,
    )


def window_kernel(
    lw, loc, what, geo: Geometry, src, out, steps, mult, elem, out_elem, extra_args,
    per_tile, tap_op, compact_fn, extra_bufs, extra_bytes, row_aware: bool = False, pad=None,
) -> None:
    """A vector-engine window op: channels (of the input) on partitions; for each band,
    per phase slab, `tap_op` per tap into an fp32 accumulator, then the epilogue."""
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Cp = geo.C  # partition channels (groups for depthwise)
    TC = min(lw.P, Cp)
    isz, osz = _isz(elem), _isz(out_elem)
    budget = _budget(lw)

    def fits(rb: int) -> bool:
        need = sum(_bytes(geo.slab(rb, p), isz) for p in range(geo.nph)) + _bytes(geo.lp(rb), 4)
        need += Epilogue.bytes_for(steps, rb * OW, osz, 1, pad, OW) + extra_bytes(rb)
        return need <= budget

    RB = _pick_band(geo, fits)
    if not RB:
        raise TensorTooLargeError(f"{what} at {loc}: one output row of {OW} positions does not fit SRAM")
    single = OH // RB == 1
    epi = Epilogue(lw, steps, out, N, Cp * mult, OH, OW, mult, pad=pad, loc=loc, rb=RB)
    k = _Kernel(lw, what, loc, [src, *extra_args, *epi.hbm_args()])
    kb = k.kb
    sa = k.arg(src)
    Lmax = geo.lp(RB)
    slabs = [kb.alloc([TC, geo.slab(RB, p)], elem, tile.SRAM, f"slab{p}") for p in range(geo.nph)]
    accb = kb.alloc([TC, Lmax], f32, tile.SRAM, "acc")
    epi.alloc(kb, TC, RB * OW, out_elem)
    epi.init(k)
    bufs = extra_bufs(kb, TC, Lmax)
    with kb.loop(N) as n, tiles(kb, Cp, TC) as (_, c0, c):
        per_tile(kb, k, c0, c, TC, bufs)
        if pad is not None and not single:  # a single band's store covers the ring
            with kb.loop(mult) as j:
                epi.emit_ring(k, n, c0, j, c)

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
                epi.emit(k, accv, c, n, c0, j, oh0, rb, Wq, compact_fn(kb, k, bufs, c0, j), row_aware,
                         first=single, last=single)

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
    xinfo = padded_of(lw, x)
    pad, wanted = _output_layout(lw, res, [], N, C, OH, OW, _elem(res),
                                 nonneg=xinfo is not None and xinfo.nonneg)
    out = pad.hbm if pad is not None else lw.hbm((N, C, OH, OW), _elem(res))
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
        _nothing, tap_op, compact_fn, _no_bufs, lambda rb: 0, pad=pad,
    )
    lw.values[res] = out
    _record_layout(lw, res, pad, wanted, loc)


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
    info = padded_of(lw, x)
    if info is not None:
        if fn in ("sum", "mean") and axes == {2, 3} and len(shape) == 4:
            # the zeros of the padding add nothing; a mean divides by H * W
            A = info.N * info.C
            outv = lw.hbm((A, 1), _elem(res))
            _reduce_kernel(lw, loc, fn, lw.view(info.hbm, (A, info.L, 1)), outv, A, info.L, 1,
                           info.H * info.W if fn == "mean" else 1)
            lw.values[res] = lw.view(outv, _shape(res))
            return
        x_nat = _natural_of_info(lw, info, loc)
        lw.values[x] = x_nat
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
