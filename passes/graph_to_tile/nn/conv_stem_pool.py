"""The -O2 stem convolution with its 3x3 stride-2 max pool in one kernel.

A max pool 3x3 / 2 / pad 1 after a stem convolution (few input channels, every tap
folded into the contraction, see `conv_stem.py`) reads the convolution's output as four
phase images ``y[2i + a - 1, 2j + b - 1]``. The kernel computes the convolution directly
in that order: output phase (a, b) of a stride-s convolution is a stride-2s convolution,
i.e. a stride-1 one over the 4s^2 phase images of the input, so one contraction of rows
(input channel, phase, row offset, column offset) serves all four output phases (each
with its own permuted weights) and a handful of DMAs load it. Three more rows: two add
-2^100 at the pool's padding (row and column -1, and OH / OW of an odd side), so it
never wins a max, one of ones adds the bias. The pool then runs on the accumulators with six whole-band vector ops
(separable: rows, then columns) before the epilogue: rounding and the fused steps are
monotone (`_monotone`), so ``f(max y) = max f(y)`` exactly, on a quarter of the
positions. Where the channels leave partitions free, bands sit side by side on them
(`StemPoolPlan.stack`), so each op covers several bands.

    %y = graph.conv2d %x, %w {stride 2, padding 3} ; %r = graph.relu %y
    %p = graph.max_pool2d %r kernel 3 stride 2 padding 1
      -> k0_conv2d_pad(%x, %xq)                 the 16 phase images of %x (stride 4)
         k1_conv2d_max_pool2d(%xq, %w, %perm, %masks, ..., %p):
           tile.load %xq[0, off] -> %im2col[r0:r0 + n]   (runs of evenly spaced rows: 13 for ResNet-18)
           tile.matmul %perm, %weights_nat -> %acc_w; copy -> %weights_ab   (per output phase)
           band group:  tile.matmul %weights_ab, %im2col[:, p0 + q] -> %acc_ab[t * 64:]  (four phases, two bands)
                        tile.binary "max" %acc_1b, %acc_0b[+row] -> %v_b; "max" %v_b, %acc_0b -> %v_b
                        tile.binary "max" %v_1, %v_0[+1] -> %u; "max" %u, %v_0 -> %u
                        tile.unary "relu" %u rows -> %out (padded layout); tile.store per band
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float32Type, f32
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph_nn as nn
from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    ALIGN,
    HbmKernel,
    cdiv,
    const_hbm,
    consts_2d,
    false_i1,
    partition_bytes,
    sub,
    true_i1,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.conv_plan import ConvProblem
from tilecc.passes.graph_to_tile.nn.epilogue import Epilogue, Step, epilogue_bytes
from tilecc.passes.graph_to_tile.nn.geometry import PhaseSpec
from tilecc.passes.graph_to_tile.nn.layout import record_layout
from tilecc.passes.graph_to_tile.nn.layout_plan import plan_output_layout, realise_output_layout
from tilecc.passes.graph_to_tile.nn.pad import pad_kernel
from tilecc.passes.graph_to_tile.nn.queues import QueueModel
from tilecc.passes.graph_to_tile.nn.state import PadInfo, padded_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

_PASS = "lower-graph-to-tile"
_BIG = -(2.0 ** 100)  # the pool's padding: exact in bf16 and fp32, below any real value
_EXTRA = 3  # contraction rows besides the image's: the padding row and column (-2^100), the bias
# the epilogue steps that commute with a max (monotone non-decreasing per channel)
_MONOTONE_UNARY = ("relu", "sigmoid", "tanh", "exp")
_MONOTONE_SCALAR = ("add", "max", "min")
Key = tuple[int, int, int, int]  # a contraction row: (input channel, phase, row offset, column offset)


def _pool_after(final: SSAValue) -> nn.MaxPool2dOp | None:
    """The 3x3 / 2 / pad 1 max pool that is the only user of `final`, if any."""
    if not final.has_one_use():
        return None
    user = final.get_user_of_unique_use()
    if not isinstance(user, nn.MaxPool2dOp) or user.input is not final:
        return None
    return user


def _monotone(steps: list[Step]) -> bool:
    """Whether every step is non-decreasing per channel (then it commutes with a max)."""
    for st in steps:
        if st.kind == "unary" and st.fn in _MONOTONE_UNARY:
            continue
        if st.kind == "scalar" and not st.swap and (st.fn in _MONOTONE_SCALAR or (st.fn == "mul" and st.imm > 0)):
            continue
        if st.kind == "column" and st.fn == "add":
            continue
        return False
    return True


@dataclass
class StemPoolPlan:
    """Sizes of the kernel (`_emit`): pooled output OHp x OWp, phase images of the input
    (stride S, Hq4 x Wq4), the contraction rows `keys` (then the _EXTRA rows) in steps of
    <= KMAX, the rows of each output phase, bands of RB pooled rows, `stack` of them
    side by side on the partitions."""

    S: int
    Hq4: int
    Wq4: int
    OHp: int
    OWp: int
    keys: list[Key]  # the image's rows (the _EXTRA rows follow them)
    block_keys: list[dict[int, Key]]  # per output phase (a, b): natural weight row -> its key
    KMAX: int
    RB: int
    stack: int = 1  # bands side by side on the partitions (blocks of the output channels)

    @property
    def K(self) -> int:
        return len(self.keys) + _EXTRA

    @property
    def ksteps(self) -> list[tuple[int, int]]:
        return [(r0, min(self.K, r0 + self.KMAX)) for r0 in range(0, self.K, self.KMAX)]

    @property
    def Lall(self) -> int:
        return (self.OHp + 1) * self.Wq4


def plan_stem_pool(lw: LoweringContext, op: nn.Conv2dOp, prob: ConvProblem, steps: list[Step],
                   pool: nn.MaxPool2dOp) -> StemPoolPlan | str:
    """The plan, or why the pair cannot fuse (a remark)."""
    cfg = lw.cfg
    geo = prob.geo
    if pool.params != ((3, 3), (2, 2), (1, 1), (1, 1), False):
        return "the max pool is not 3x3, stride 2, padding 1"
    if prob.layout != "gihwo" or prob.G != 1 or prob.Ci_g > 8 or len(geo.taps) < 4:
        return "the convolution is not a stem (few input channels, packed weights)"
    if not isinstance(value_elem(op.input), (BFloat16Type, Float32Type)):
        return "the element type is neither bf16 nor fp32"
    if padded_of(lw, op.input) is not None:
        return "the input is stored padded"
    if not _monotone(steps):
        return "an epilogue step does not commute with the max"
    KMAX = min(cfg.matrix.rows, cfg.sram.partitions)
    TCo = min(cfg.accumulator.partitions, cfg.sram.partitions, cfg.matrix.cols)
    if prob.Co_g > TCo:
        return f"more than {TCo} output channels"
    (sh, sw), (dh, dw) = geo.s, geo.d
    if sh != sw:
        return "the convolution's strides differ"
    S = 2 * sh
    KH, KW = geo.k
    OHp, OWp = (geo.OH + 1) // 2, (geo.OW + 1) // 2  # an odd side: the last window has padding below
    keys: list[Key] = []
    index: dict[Key, int] = {}
    block_keys: list[dict[int, Key]] = []
    for a in (0, 1):
        for b in (0, 1):
            bk: dict[int, Key] = {}
            for ci in range(prob.Ci_g):
                for kh in range(KH):
                    for kw in range(KW):
                        u, v = sh * a + kh * dh, sw * b + kw * dw
                        key = (ci, (u % S) * S + v % S, u // S, v // S)
                        bk[(ci * KH + kh) * KW + kw] = key
                        index.setdefault(key, 0)
            block_keys.append(bk)
    # by offset, then channel and phase: the rows of one offset are phase images in turn,
    # evenly spaced in HBM (the runs `_load_im2col` loads with one DMA each)
    keys = sorted(index, key=lambda k_: (k_[2], k_[3], k_[0], k_[1]))
    if cdiv(len(keys) + _EXTRA, KMAX) > 4:
        return "the contraction needs more than four steps"
    mdh = max(k_[2] for k_ in keys)
    # rows of Wq4 positions: column phase b = 0 is read up to column OWp, b = 1 up to
    # OWp - 1, each through its own keys' column offsets (a longer row only wraps junk)
    mdw0 = max(k_[3] for blk in (0, 2) for k_ in block_keys[blk].values())
    mdw1 = max(k_[3] for blk in (1, 3) for k_ in block_keys[blk].values())
    Wq4 = max(OWp + 1 + mdw0, OWp + mdw1)
    Hq4 = OHp + 2 + mdh
    plan = StemPoolPlan(S, Hq4, Wq4, OHp, OWp, keys, block_keys, KMAX, 0)
    isz, osz = prob.isz, prob.osz
    nsteps = len(plan.ksteps)
    nat = prob.Ci_g * KH * KW + _EXTRA
    nch = cdiv(nat, KMAX)
    Co = prob.Co_g
    fixed = (nsteps * partition_bytes(plan.Lall, isz) + 4 * nsteps * partition_bytes(Co, isz)
             + nch * partition_bytes(Co, isz) + partition_bytes(4 * nsteps * nch * KMAX, isz)
             + partition_bytes(prob.columns * 2, 4) + 4 * ALIGN)

    def fits(rb: int) -> bool:
        acc = 2 * (2 * partition_bytes((rb + 1) * Wq4, 4) + 2 * partition_bytes(rb * Wq4, 4))
        acc += partition_bytes(Co, 4) + prob.columns * partition_bytes(1, 4)
        sram = fixed + 3 * partition_bytes(rb * Wq4, 4) + epilogue_bytes(prob.steps, rb * OWp, osz, 2,
                                                                         OWp + 2, OWp)
        return acc <= cfg.accumulator.bytes_per_partition and sram <= cfg.sram.bytes_per_partition - 8 * ALIGN

    # bands side by side on the partitions where the channels leave them free (the ops
    # then run once for all of them; per-channel operands would need copies per block):
    # the most bands side by side (an op's time is its columns, whatever its partitions),
    # then the most rows per group of ops (fewer instructions)
    cap = min(cfg.sram.partitions, cfg.accumulator.partitions) // Co
    if not all(st.kind in ("unary", "scalar") for st in steps):
        cap = 1
    best = (0, 0, 0)
    for rb in range(1, OHp + 1):
        if OHp % rb == 0 and fits(rb):
            t = max(t for t in range(1, cap + 1) if (OHp // rb) % t == 0)
            best = max(best, (t, rb * t, rb))
    if not best[0]:
        return "one band of pooled rows does not fit on chip (SRAM and accumulator)"
    plan.stack, plan.RB = best[0], best[2]
    return plan


def lower_stem_pool(lw: LoweringContext, op: nn.Conv2dOp, prob: ConvProblem, steps: list[Step],
                    fused: list[Operation], final: SSAValue, loc: str) -> bool:
    """Lower `op`, its fused `steps` and the max pool after them as one kernel (True), or
    do nothing (False: no such pool, or a remark says why it does not fuse)."""
    if lw.opt_level < 2:
        return False
    pool = _pool_after(final)
    if pool is None:
        return False
    plan = plan_stem_pool(lw, op, prob, steps, pool)
    if isinstance(plan, str):
        remarks.emit(_PASS, "missed", f"max pool not fused into the stem convolution: {plan}", loc)
        return False
    res = pool.results[0]
    N, Co, OHp, OWp = value_shape(res)
    nonneg = bool(steps) and steps[-1].kind == "unary" and steps[-1].fn == "relu"
    layout = plan_output_layout(lw, res, [], N, Co, OHp, OWp, nonneg=nonneg)
    pad, wanted = realise_output_layout(lw, layout, res, N, Co, OHp, OWp, value_elem(res))
    out = pad.hbm if pad is not None else lw.hbm((N, Co, OHp, OWp), value_elem(res))
    geo = prob.geo
    xq = lw.hbm((N, geo.C, plan.S * plan.S, plan.Hq4 * plan.Wq4), value_elem(op.input))
    phases = [(r, c) for r in range(plan.S) for c in range(plan.S)]
    pad_kernel(lw, "conv2d_pad", loc, lw.view(lw.materialise(op.input), (N, geo.C, geo.H, geo.W)), xq,
               PhaseSpec(phases, (plan.S, plan.S), (geo.p[0] + geo.s[0], geo.p[1] + geo.s[1]), plan.Hq4,
                         plan.Wq4, 0.0))
    _emit(lw, op, prob, plan, steps, xq, out, pad, loc)
    remarks.emit(_PASS, "passed", f"max pool fused into the stem convolution ({plan.K} contraction rows, "
                 f"bands of {plan.RB} pooled rows, {plan.stack} side by side on the partitions)", loc)
    if fused:
        fused[-1].results[0].replace_all_uses_with(op.results[0])
        for u in reversed(fused):
            u.detach()
            u.erase()
    lw.values[res] = out
    record_layout(lw, res, pad, wanted, loc)
    return True


def _emit(lw: LoweringContext, op: nn.Conv2dOp, prob: ConvProblem, plan: StemPoolPlan, steps: list[Step],
          xq: SSAValue, out: SSAValue, pad: PadInfo | None, loc: str) -> None:
    """The kernel: weights permuted per output phase, the contraction rows loaded once,
    then per band the four phases' matmuls, the pool and the epilogue."""
    cfg = lw.cfg
    geo = prob.geo
    N, Co = geo.N, prob.Co_g
    elem, out_elem = value_elem(op.input), value_elem(op.results[0])
    isz = prob.isz
    KMAX, RB, Wq4, OHp, OWp, Lall = plan.KMAX, plan.RB, plan.Wq4, plan.OHp, plan.OWp, plan.Lall
    ksteps = plan.ksteps
    Ks = [r1 - r0 for r0, r1 in ksteps]
    nsteps = len(ksteps)
    KH, KW = geo.k
    nat = prob.Ci_g * KH * KW
    NAT = nat + _EXTRA  # the natural weight rows, the two -2^100 rows and the bias
    nch = cdiv(NAT, KMAX)
    row_of = {key: r for r, key in enumerate(plan.keys)}
    mrow, mcol, ones = len(plan.keys), len(plan.keys) + 1, len(plan.keys) + 2
    # per output phase (a, b): natural rows -> contraction rows
    perm = np.zeros((nch * KMAX, 4 * nsteps * KMAX), dtype=np.float32)
    for blk, bk in enumerate(plan.block_keys):
        rows = [(nr, row_of[key]) for nr, key in bk.items()]
        a, b = divmod(blk, 2)
        if a == 0:
            rows.append((nat, mrow))
        if b == 0:
            rows.append((nat + 1, mcol))
        rows.append((nat + 2, ones))
        for nr, kr in rows:
            perm[nr, (blk * nsteps + kr // KMAX) * KMAX + kr % KMAX] = 1.0
    pconst, pcols = consts_2d(lw, [perm[c * KMAX:(c + 1) * KMAX] for c in range(nch)], 4 * nsteps * KMAX, KMAX,
                              elem)
    masks = np.zeros((_EXTRA, Lall), dtype=np.float32)
    masks[0, :Wq4] = 1.0  # pooled-row phase 0, row 0: the convolution's row -1
    masks[1, ::Wq4] = 1.0  # pooled-column phase 0, column 0: its column -1
    if geo.OH % 2:  # row phase 0, row OHp: the convolution's row OH
        masks[0, OHp * Wq4:] = 1.0
    if geo.OW % 2:  # column phase 0, column OWp: its column OW
        masks[1, OWp::Wq4] = 1.0
    masks[2] = 1.0  # times the bias
    mconst = const_hbm(lw, masks, elem)
    big = const_hbm(lw, np.full((1, Co), _BIG, dtype=np.float32), elem)
    zero = const_hbm(lw, np.zeros((1, Co), dtype=np.float32), elem)
    wnat = lw.view(lw.materialise(op.weight), (nat, Co))
    b_ = op.bias
    bview = lw.view(lw.materialise(b_), (1, Co)) if b_ is not None else None
    T = plan.stack
    TC = T * Co
    # a leading relu runs in the compaction (relu commutes with the rounding; other
    # functions would see the unrounded value)
    first_fn = "copy"
    if steps and steps[0].kind == "unary" and steps[0].fn == "relu":
        first_fn, steps = "relu", steps[1:]
    epi = Epilogue(lw, steps, out, N, Co, OHp, OWp, pad=pad, loc=loc, rb=RB)
    xflat = lw.view(xq, (N, geo.C * plan.S * plan.S * plan.Hq4 * Wq4))
    args = [xflat, wnat, pconst, mconst, big, bview if bview is not None else zero] + epi.hbm_args()
    k = HbmKernel(lw, "conv2d_max_pool2d", loc, args)
    kb = k.kb
    qm = QueueModel(cfg)
    xa = k.arg(xflat)
    slabs = [kb.alloc([K, Lall], elem, tile.SRAM, "im2col") for K in Ks]
    wbufs = [[kb.alloc([K, Co], elem, tile.SRAM, "weights") for K in Ks] for _ in range(4)]
    wstage = [kb.alloc([min(KMAX, NAT - c * KMAX), Co], elem, tile.SRAM, "weights_nat") for c in range(nch)]
    pb = kb.alloc([KMAX, pcols], elem, tile.SRAM, "permute")
    wacc = kb.alloc([KMAX, Co], f32, tile.ACC, "acc_w")
    ncols = [(RB + 1) * Wq4 if blk < 2 else RB * Wq4 for blk in range(4)]  # a = 0 needs one row more
    accs = [[kb.alloc([TC, ncols[blk]], f32, tile.ACC, "acc") for blk in range(4)] for _ in range(2)]
    R = RB * Wq4
    vbufs = [kb.alloc([TC, R], f32, tile.SRAM, f"rows{b}") for b in range(2)]
    ubuf = kb.alloc([TC, R], f32, tile.SRAM, "pooled")
    epi.alloc(kb, TC, RB * OWp, out_elem, col_sets=1, sets=2)
    epi.init(k, qm)
    c_co = kb.const(Co)
    with kb.loop(N) as n:
        epi.preload_columns(k, kb.const(0), Co, queues=qm, count=Co, defer=True)
        wa = k.arg(wnat)
        for c in range(nch):
            r = min(KMAX, nat - c * KMAX)
            if r > 0:
                kb.add(tile.LoadOp(wa, [kb.const(c * KMAX), kb.const(0)], sub(kb, wstage[c], 0, 0, [r, Co]),
                                   kb.const(r), c_co, 0, 1, queue=qm.next(r * Co * isz, Co * isz)))
        for nr, src in ((nat, big), (nat + 1, big), (nat + 2, bview if bview is not None else zero)):
            dst = sub(kb, wstage[nr // KMAX], nr % KMAX, 0, [1, Co])
            kb.add(tile.LoadOp(k.arg(src), [kb.const(0), kb.const(0)], dst, kb.const(1), c_co, 0, 1,
                               queue=qm.next(Co * isz, Co * isz)))
        kb.add(tile.LoadOp(k.arg(pconst), [kb.const(0), kb.const(0)], pb, kb.const(KMAX), kb.const(pcols), 0, 1,
                           queue=qm.next(KMAX * pcols * isz, pcols * isz)))
        _load_im2col(kb, k, qm, plan, xa, n, slabs, mconst, isz)
        # weights: natural rows -> each output phase's contraction rows (exact 0/1 products)
        for blk in range(4):
            for si, K in enumerate(Ks):
                for c in range(nch):
                    r = min(KMAX, NAT - c * KMAX)
                    col = (c * 4 * nsteps + blk * nsteps + si) * KMAX
                    kb.add(tile.MatmulOp(sub(kb, pb, 0, col, [r, K]), wstage[c], sub(kb, wacc, 0, 0, [K, Co]),
                                         kb.const(K), kb.const(r), c_co, true_i1(kb) if c else false_i1(kb)))
                kb.add(tile.UnaryOp("copy", sub(kb, wacc, 0, 0, [K, Co]), wbufs[blk][si], kb.const(K), c_co))
        TP = cfg.matrix.cols
        ngroups = OHp // RB // T  # bands of one group lie on the T partition blocks of Co
        for gi in range(ngroups):
            bset = gi % 2
            for blk in range(4):
                acc = accs[bset][blk]
                for t in range(T):
                    p0 = (t * ngroups + gi) * RB * Wq4
                    for q0 in range(0, ncols[blk], TP):
                        nq = min(TP, ncols[blk] - q0)
                        for si, K in enumerate(Ks):
                            kb.add(tile.MatmulOp(
                                wbufs[blk][si], sub(kb, slabs[si], 0, p0 + q0, [K, nq]),
                                sub(kb, acc, t * Co, q0, [Co, nq]), c_co, kb.const(K), kb.const(nq),
                                true_i1(kb) if si else false_i1(kb),
                            ))
            _pool(kb, accs[bset], vbufs, ubuf, TC, R, Wq4)

            def compact(s_: SSAValue, d_: SSAValue, rows_: SSAValue, cols: int) -> None:
                kb.add(tile.UnaryOp(first_fn, s_, d_, rows_, kb.const(cols)))

            tops = [(t * ngroups + gi) * RB for t in range(T)]
            if T == 1:
                epi.emit(k, ubuf, c_co, n, kb.const(0), kb.const(0), kb.const(gi * RB), RB, Wq4, compact, col_set=0,
                         buf_set=bset, first=gi == 0, last=gi == ngroups - 1, per_row=True)
            else:
                epi.emit(k, ubuf, kb.const(TC), n, kb.const(0), kb.const(0), kb.const(0), RB, Wq4, compact,
                         buf_set=bset, stack=tops, per_row=True)
    k.launch()


def _load_im2col(kb: KernelBuilder, k: HbmKernel, qm: QueueModel, plan: StemPoolPlan, xa: SSAValue, n: SSAValue,
                 slabs: list[SSAValue], mconst: SSAValue, isz: int) -> None:
    """The contraction rows: shifted windows of the phase images (`xa`: all of them, one
    flat row per image), one DMA per run of rows evenly spaced in HBM within one step;
    then the mask and ones rows."""
    Lall, Wq4, KMAX = plan.Lall, plan.Wq4, plan.KMAX
    L4 = plan.Hq4 * Wq4
    nph = plan.S * plan.S
    flat = [(ci * nph + ph) * L4 + dh * Wq4 + dw for ci, ph, dh, dw in plan.keys]
    r = 0
    while r < len(flat):
        e = r + 1
        while e < len(flat) and e % KMAX != 0 and flat[e] - flat[e - 1] == flat[r + 1] - flat[r] > 0:
            e += 1
        cnt = e - r
        kb.add(tile.LoadOp(xa, [n, kb.const(flat[r])], sub(kb, slabs[r // KMAX], r % KMAX, 0, [cnt, Lall]),
                           kb.const(cnt), kb.const(Lall), 1, 1, flat[r + 1] - flat[r] if cnt > 1 else 1, 1,
                           queue=qm.next(cnt * Lall * isz, Lall * isz)))
        r = e
    k0 = len(flat)
    pieces = [(k0, _EXTRA)] if k0 // KMAX == (k0 + _EXTRA - 1) // KMAX else [(k0 + m, 1) for m in range(_EXTRA)]
    for kr, cnt in pieces:
        dst = sub(kb, slabs[kr // KMAX], kr % KMAX, 0, [cnt, Lall])
        kb.add(tile.LoadOp(k.arg(mconst), [kb.const(kr - k0), kb.const(0)], dst, kb.const(cnt), kb.const(Lall), 0, 1,
                           queue=qm.next(cnt * Lall * isz, Lall * isz)))


def _pool(kb: KernelBuilder, accs: list[SSAValue], vbufs: list[SSAValue], ubuf: SSAValue, Co: int, R: int,
          Wq4: int) -> None:
    """The 3x3 / 2 max of a band from the four output phases (acc index 2a + b; rows of
    Wq4): rows first (phase a = 1 row i, phase a = 0 rows i and i + 1), then columns."""
    rows = kb.const(Co)

    def mx(x: SSAValue, xo: int, y: SSAValue, yo: int, d: SSAValue, cols: int) -> None:
        kb.add(tile.BinaryOp("max", sub(kb, x, 0, xo, [Co, cols]), sub(kb, y, 0, yo, [Co, cols]),
                             sub(kb, d, 0, 0, [Co, cols]), rows, kb.const(cols)))

    for b in (0, 1):
        mx(accs[2 + b], 0, accs[b], Wq4, vbufs[b], R)
        mx(vbufs[b], 0, accs[b], 0, vbufs[b], R)
    mx(vbufs[1], 0, vbufs[0], 1, ubuf, R - 1)
    mx(ubuf, 0, vbufs[0], 0, ubuf, R - 1)
