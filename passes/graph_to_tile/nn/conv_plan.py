"""Convolution planning: which kernel runs a graph.conv2d and its tiling, decided before
any IR is built (problem -> plan -> emitter, as the matmul family does).

A `ConvProblem` is what the kernels' sizes depend on (the window, the groups, element
sizes, the bias and the kinds of the fused epilogue steps); each `plan_*` function is
pure (the hardware config and the problem in, a plan or None out) and mirrors one
emitter in `conv_*.py`, which takes the plan and only builds IR. `plan_conv` picks the
first kernel that fits, in order: depthwise (vector engine); at -O2 the small-image,
stem and banded kernels, first with the padded output layout when that is wanted,
then without; else the -O0 small-image or banded kernel.

    graph.conv2d %x [1, 64, 56, 56], %w [1, 64, 9, 64] (gihwo), s1 p1, bf16 -> relu
      plan_conv(cloud, 2, problem, Wp=58)
        -> ConvPlan(kernel="gemm_o2", padded=True,
                    schedule=GemmO2Plan(RB=14, steps=[KStep(K=128, folded), KStep(K=64, folded)],
                                        slab_sets=4, unroll=True, ...))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import BFloat16Type, Float32Type
from xdsl.ir import SSAValue

from tilecc.errors import TensorTooLargeError
from tilecc.ir import graph_nn as nn
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.nn.common import (
    ALIGN,
    cdiv,
    partition_bytes,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.conv_steps import (
    KStep,
    contraction_steps,
    k_tiles,
    stem_blocks,
)
from tilecc.passes.graph_to_tile.nn.epilogue import Step, epilogue_bytes, fuse_epilogue, zero_floor
from tilecc.passes.graph_to_tile.nn.geometry import Geometry, pick_band
from tilecc.passes.graph_to_tile.nn.queues import weight_pieces
from tilecc.passes.graph_to_tile.nn.state import PadInfo
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


@dataclass(frozen=True)
class ConvProblem:
    """What a convolution kernel's sizes depend on."""

    geo: Geometry
    G: int  # groups
    Ci_g: int  # input channels per group
    Co_g: int  # output channels per group
    layout: str  # of the weights: "gihwo" (packed) or "oihw"
    isz: int  # bytes of an input element
    osz: int  # bytes of an output element
    bias: bool
    steps: tuple[str, ...]  # the kinds of the fused epilogue steps
    # the steps send -2^100 to 0 (`epilogue.zero_floor`), the elements are floats and a
    # bias has the input's type: a contraction row can floor a padded output's padding
    # columns and another add the bias (`GemmO2Plan.pad_at`)
    floor: bool = False

    @property
    def columns(self) -> int:
        """Per-channel operands of the epilogue (column steps and the bias)."""
        return sum(1 for k in self.steps if k == "column") + self.bias


def conv_geometry(op: nn.Conv2dOp) -> tuple[Geometry, int, int, int, str]:
    """(geometry, groups, input and output channels per group, weight layout) of `op`."""
    (sh, sw), (ph, pw), (dh, dw), G, layout = op.params
    N, C, H, W = value_shape(op.input)
    _, Co, OH, OW = value_shape(op.results[0])
    ws = value_shape(op.weight)
    geo = Geometry(N, C, H, W, OH, OW, (ws[2], ws[3]), (sh, sw), (ph, pw), (dh, dw))
    return geo, G, C // G, Co // G, layout


def conv_problem(op: nn.Conv2dOp, steps: list[Step]) -> ConvProblem:
    geo, G, Ci_g, Co_g, layout = conv_geometry(op)
    elem = value_elem(op.input)
    floor = (zero_floor(steps) and isinstance(elem, (BFloat16Type, Float32Type))
             and value_elem(op.weight) == elem and (op.bias is None or value_elem(op.bias) == elem))
    return ConvProblem(
        geo, G, Ci_g, Co_g, layout, element_size(elem), element_size(value_elem(op.results[0])),
        op.bias is not None, tuple(st.kind for st in steps), floor,
    )


# ---- -O2 kernels ---------------------------------------------------------------


@dataclass(frozen=True)
class SmallO2Plan:
    """`conv_small.emit_conv_small_o2`: the whole image on the accumulator's partitions."""

    TK: int  # input channels per contraction tile
    nk: int  # contraction tiles
    TN: int  # output channels per matmul
    TCo: int  # output channels per transposed chunk
    nchunks: int
    pieces: list[tuple[int, int, int]]  # weight DMAs: (contraction tile, first tap, taps)


def plan_small_o2(cfg: HardwareConfig, prob: ConvProblem, Wp: int | None) -> SmallO2Plan | None:
    """Few output positions: positions on the accumulator partitions (M), output channels
    along the array's columns (N), every contraction tile's weights resident. `Wp`: the
    output is stored padded with rows of Wp."""
    geo, Co_g, Ci_g = prob.geo, prob.Co_g, prob.Ci_g
    P = cfg.sram.partitions
    T = len(geo.taps)
    OH, OW = geo.OH, geo.OW
    S = OH * OW
    Lp = geo.lp(OH)
    AP = min(cfg.accumulator.partitions, P)
    if Lp > min(AP, cfg.matrix.rows) or S > cfg.matrix.cols or Co_g > cfg.accumulator.bytes_per_partition // 4:
        return None
    if prob.layout != "gihwo":
        return None
    TK, nk = k_tiles(Ci_g, min(cfg.matrix.rows, P))
    TN = min(cfg.matrix.cols, Co_g)
    TCo = min(AP, P, Co_g)
    nchunks = cdiv(Co_g, TCo)
    HW = geo.Hq * geo.Wq  # one buffer holds every phase image (one DMA per contraction tile)
    isz, osz = prob.isz, prob.osz
    kbytes = partition_bytes(T * Co_g, isz) + partition_bytes(geo.nph * HW, isz)
    rest = (
        2 * partition_bytes(TCo, 4) + partition_bytes(S, 4) + epilogue_bytes(prob.steps, S, osz, 2, Wp, OW)
        + prob.columns * partition_bytes(nchunks, 4)
    )
    acc_bytes = partition_bytes(Co_g, 4) + 2 * partition_bytes(S, 4)  # plan-sram aligns each buffer
    if (acc_bytes > cfg.accumulator.bytes_per_partition
            or nk * kbytes + 2 * ALIGN * T + rest > cfg.sram.bytes_per_partition):
        return None
    return SmallO2Plan(TK, nk, TN, TCo, nchunks, weight_pieces(cfg, nk, T))


@dataclass(frozen=True)
class StemO2Plan:
    """`conv_stem.emit_conv_stem_o2`: every tap folded into the contraction."""

    KMAX: int  # contraction rows per step
    TCo: int  # output channels per accumulator tile
    ntile: int
    ksteps: list[list[tuple[int, tuple[int, int, int, int, int, list[int]]]]]  # (row offset, stem block)
    Ks: list[int]  # rows of each step
    RB: int  # output rows per band
    nat: int  # natural weight rows (ci, kh, kw)
    nch: int  # chunks of KMAX natural rows


def plan_stem_o2(cfg: HardwareConfig, prob: ConvProblem, Wp: int | None) -> StemO2Plan | None:
    """Few input channels (an image stem): K = Ci x KH x KW rows in at most four steps,
    the rows loaded once for the whole image, bands of output rows through
    double-buffered accumulators."""
    geo, G, Ci_g, Co_g = prob.geo, prob.G, prob.Ci_g, prob.Co_g
    if prob.layout != "gihwo" or G != 1 or Ci_g > 8 or len(geo.taps) < 4:
        return None
    P = cfg.sram.partitions
    isz, osz = prob.isz, prob.osz
    OH, OW = geo.OH, geo.OW
    T = len(geo.taps)
    KMAX = min(cfg.matrix.rows, P)
    AP = min(cfg.accumulator.partitions, P)
    TCo = min(AP, Co_g, cfg.matrix.cols)
    ntile = cdiv(Co_g, TCo)
    A = cfg.accumulator.bytes_per_partition
    blocks = stem_blocks(geo, Ci_g)
    # k-steps: blocks packed in order into <= KMAX rows
    ksteps: list[list[tuple[int, tuple[int, int, int, int, int, list[int]]]]] = [[]]
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
    nat = Ci_g * T
    nch = cdiv(nat, KMAX)
    budget = cfg.sram.bytes_per_partition - 8 * ALIGN
    ncolumns = prob.columns
    fixed = (len(ksteps) * (partition_bytes(Lall, isz) + partition_bytes(Co_g, isz)) + nch * partition_bytes(Co_g, isz)
             + partition_bytes(len(ksteps) * nch * KMAX, isz) + ncolumns * 2 * partition_bytes(ntile * TCo, 4) + ALIGN)
    acc_cols = ncolumns * partition_bytes(ntile, 4)  # the per-channel operands' column accumulators

    def fits(rb: int) -> bool:
        return (2 * ntile * partition_bytes(geo.lp(rb), 4) + acc_cols <= A
                and fixed + epilogue_bytes(prob.steps, rb * OW, osz, 2, Wp, OW) <= budget)

    if len(ksteps) > 4 or not fits(1):
        return None
    RB = pick_band(geo, fits)
    if not RB:
        return None
    return StemO2Plan(KMAX, TCo, ntile, ksteps, Ks, RB, nat, nch)


@dataclass(frozen=True)
class GemmO2Plan:
    """`conv_gemm_o2.emit_conv_gemm_o2`: resident weights, bands with their own buffers."""

    KMAX: int
    TCo: int  # output channels per accumulator tile
    ntile: int
    RB: int  # output rows per band
    steps: list[KStep]  # the contraction of a band
    # per step, its weight DMAs over the queues as (first tap, taps); None: one buffer
    # whose row blocks (folded kernel rows) load on any queue
    pieces: list[list[tuple[int, int]] | None]
    slab_sets: int  # slab buffer sets (one per band where SRAM allows)
    unroll: bool  # the bands unrolled (else the middle ones in a loop of pairs)
    # bands side by side on the accumulator's partitions (few output channels): each
    # vector op of the epilogue covers `stack` bands
    stack: int = 1
    # (step, tap) whose contraction has `extra` more rows: a -2^100 row at the padded
    # output's padding columns (the steps floor it to 0: no mask) and a ones row whose
    # weights are the bias (no bias pass); None: the bias and the mask on the vector engine
    pad_at: tuple[int, int] | None = None
    extra: int = 0


def plan_gemm_o2(cfg: HardwareConfig, prob: ConvProblem, Wp: int | None) -> GemmO2Plan | None:
    """-O2 implicit GEMM for images larger than one accumulator tile: None where the
    weights do not fit SRAM or are not packed ``gihwo``."""
    if prob.layout != "gihwo":
        return None
    geo, Ci_g, Co_g = prob.geo, prob.Ci_g, prob.Co_g
    P = cfg.sram.partitions
    isz, osz = prob.isz, prob.osz
    OH, OW = geo.OH, geo.OW
    KMAX = min(cfg.matrix.rows, P)
    AP = min(cfg.accumulator.partitions, P)
    TCo = min(AP, Co_g)
    ntile = cdiv(Co_g, TCo)
    A = cfg.accumulator.bytes_per_partition
    budget = cfg.sram.bytes_per_partition - 8 * ALIGN
    ks1 = contraction_steps(geo, Ci_g, KMAX, 1)
    wbytes = sum(partition_bytes(len(st.taps) * Co_g, isz) for st in ks1) + 4 * ALIGN
    ncolumns = prob.columns
    fixed = wbytes + ncolumns * (partition_bytes(ntile, 4) + partition_bytes(ntile * TCo, 4)) + ALIGN

    def need(rb: int) -> int:
        ks = contraction_steps(geo, Ci_g, KMAX, rb)
        slabs = sum(partition_bytes(L, isz) for st in ks for L in st.slabs)
        return fixed + 2 * slabs + epilogue_bytes(prob.steps, rb * OW, osz, 2, Wp, OW)

    acc_cols = ncolumns * partition_bytes(ntile, 4)  # the per-channel operands' column accumulators

    def fits(rb: int) -> bool:
        return 2 * ntile * partition_bytes(geo.lp(rb), 4) + acc_cols <= A and need(rb) <= budget

    # bands: the tallest that fits, but at least two (three or four when the image has
    # the rows for it) so the stages overlap, and not so short that the DMAs get small
    RB = pick_band(geo, fits)
    if not RB:
        return None
    # (four bands where they are not that short, else two: a single band runs its load,
    # matmuls, epilogue and store one after the other)
    wants = (4, 2) if OH >= 16 else ((2,) if OH >= 2 else (1,))
    for want in wants:
        cand = next((c for c in range(RB, 0, -1) if OH % c == 0 and OH // c >= want and fits(c)
                     and geo.lp(c) >= min(geo.lp(RB), 256)), 0)
        if cand:
            RB = cand
            break
    # few output channels: bands side by side on the accumulator partitions, as many
    # groups of them as there were bands (the epilogue's vector ops cover a group)
    # groups of `stack` bands of RB rows (one band of stack * RB rows as far as its loads
    # go), at least two groups where there were that many bands (each group moves one
    # DMA per slab, a tile operand and a store per band, ~3,100 cycles of fixed cost
    # each on `cloud`: ResNet-18's 56 x 56 layers run best as two groups of 2 x 14 rows)
    stack = min(AP, cfg.matrix.cols) // Co_g if ntile == 1 and Co_g <= AP // 2 else 1
    while stack > 1:
        cand = next((c for c in range(RB, 0, -1) if OH % (c * stack) == 0
                     and OH // (c * stack) >= min(OH // RB, 2) and OH // (c * stack) <= 8
                     and fits(c) and need(c * stack) <= budget), 0)
        if cand:
            RB = cand
            break
        stack -= 1
    nb = OH // (RB * stack)  # bands (groups of `stack` bands)
    ks = contraction_steps(geo, Ci_g, KMAX, RB * stack)
    # slab sets: one per band where SRAM allows (every band's loads issue up front),
    # else two; accumulators and epilogue buffers alternate between two sets
    slab_bytes = sum(partition_bytes(L, isz) for st in ks for L in st.slabs)
    nsl = max(2, min(nb, (budget - need(RB * stack) + 2 * slab_bytes) // max(slab_bytes, 1)))
    nsl = min(nsl, nb) if nb > 1 else 1
    pieces: list[list[tuple[int, int]] | None] = []
    for st in ks:
        if st.folded:
            pieces.append(None)
        else:  # a channel tile: its taps split into pieces over the queues
            pieces.append([(t0, nt) for _, t0, nt in weight_pieces(cfg, 1, len(st.taps))])
    # the floor and bias rows: in the step with the most room (its first tap: the
    # smallest column offset), where the output is padded and compacted whole
    pad_at, extra = None, 1 + prob.bias
    if prob.floor and Wp is not None and geo.Wq == Wp:
        si = min(range(len(ks)), key=lambda i: (ks[i].K, -i))
        if ks[si].K + extra <= KMAX:
            ti = min(range(len(ks[si].taps)), key=lambda t: ks[si].taps[t][2])
            pad_at = (si, ti)
        elif need(RB * stack) + 2 * partition_bytes(geo.lp(RB * stack), isz) + ALIGN <= budget:
            # every step full: a step of the floor / bias rows alone (one more matmul per
            # tile, against the bias pass and the mask's two-input pass per band)
            ks = ks + [KStep(0, [geo.lp(RB * stack)], [[]], [(0, 0, 0)], [], True)]
            pieces = pieces + [None]
            pad_at = (len(ks) - 1, 0)
    return GemmO2Plan(KMAX, TCo, ntile, RB, ks, pieces, nsl, nb <= 8, stack, pad_at,
                      extra if pad_at is not None else 0)


# ---- -O0 kernels ---------------------------------------------------------------


@dataclass(frozen=True)
class SmallPlan:
    """`conv_small.emit_conv_small`: the -O0 small-image kernel."""

    TK: int
    nk: int
    TN: int
    double: bool  # two buffer sets over the contraction tiles


def plan_small(cfg: HardwareConfig, prob: ConvProblem) -> SmallPlan | None:
    """Few output positions (the whole image is one accumulator tile), -O0."""
    geo, Co_g = prob.geo, prob.Co_g
    P = cfg.sram.partitions
    T = len(geo.taps)
    Lp = geo.lp(geo.OH)
    TK, nk = k_tiles(prob.Ci_g, min(cfg.matrix.rows, P))
    TN = min(cfg.matrix.cols, Co_g)
    if Lp > min(cfg.accumulator.partitions, P) or Co_g > cfg.accumulator.bytes_per_partition // 4:
        return None
    budget = cfg.sram.bytes_per_partition
    operands = sum(1 for k in prob.steps if k in ("column", "tile"))
    kbytes = partition_bytes(T * Co_g, prob.isz) + sum(partition_bytes(geo.slab(geo.OH, p), prob.isz)
                                                       for p in range(geo.nph))
    rest = partition_bytes(Co_g, prob.osz) * (1 + operands + prob.bias)
    if kbytes + rest > budget:
        return None
    return SmallPlan(TK, nk, TN, nk > 1 and 2 * kbytes + rest <= budget)


@dataclass(frozen=True)
class GemmPlan:
    """`conv_gemm.emit_conv_gemm`: the -O0 implicit GEMM (any shape that fits a row)."""

    TK: int  # contraction rows per step
    nk: int  # contraction steps
    TCo: int  # output channels per accumulator tile
    TP: int  # positions per matmul
    groups: list[list[int]] | None  # folded kernel rows per step (few input channels), else None
    colmax: list[int]  # folded: the largest column offset of each column phase
    double: bool  # two buffer sets over the contraction steps
    RB: int  # output rows per band
    BT: int  # output-channel tiles per block
    NB: int  # blocks
    COB: int  # output channels per block
    whole_w: bool  # a block's weights in one DMA (packed layout, one block)


def plan_gemm(cfg: HardwareConfig, prob: ConvProblem, loc: str) -> GemmPlan:
    """The band of output rows and blocks of output-channel tiles that fit (raises
    TensorTooLargeError when not even one output row does)."""
    geo, Ci_g, Co_g = prob.geo, prob.Ci_g, prob.Co_g
    P = cfg.sram.partitions
    isz, osz = prob.isz, prob.osz
    T = len(geo.taps)
    OW = geo.OW
    KMAX = min(cfg.matrix.rows, P)
    TK, nk = k_tiles(Ci_g, KMAX)
    TCo = min(cfg.accumulator.partitions, P, Co_g)
    TP = min(cfg.matrix.cols, 512)
    A = cfg.accumulator.bytes_per_partition // 4
    budget = cfg.sram.bytes_per_partition
    co_tiles = cdiv(Co_g, TCo)
    KH, KW = geo.k
    # few input channels: fold F kernel rows into the contraction (K = kh x ci)
    F = min(KH, KMAX // Ci_g) if KH > 1 else 1
    fold = F >= 2
    ncol = len(geo.col_res)
    (sh, sw), (dh, dw) = geo.s, geo.d
    groups: list[list[int]] | None = None
    colmax: list[int] = []
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
            return partition_bytes(KW * bt * TCo, isz) + sum(partition_bytes(geo.lp(rb) + colmax[bi], isz)
                                                             for bi in range(ncol))
        return partition_bytes(T * bt * TCo, isz) + sum(partition_bytes(geo.slab(rb, p), isz)
                                                        for p in range(geo.nph))

    def fits(rb: int, bt: int) -> bool:
        """Band of rb rows, blocks of bt output-channel tiles."""
        lp = geo.lp(rb)
        if bt * lp > A:
            return False
        need = kbytes(rb, bt) * (2 if double else 1)
        need += epilogue_bytes(prob.steps, rb * OW, osz, OW=OW) + (ALIGN if prob.bias else 0)
        return need <= budget

    # output-channel blocks of BT tiles (BT divides the tile count): prefer all at once
    RB, BT = 0, 0
    for dbl in ((True, False) if double else (False,)):
        double = dbl
        for bt in sorted((d for d in range(1, co_tiles + 1) if co_tiles % d == 0), reverse=True):
            RB = pick_band(geo, lambda rb, bt=bt: fits(rb, bt))
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
    return GemmPlan(TK, nk, TCo, TP, groups, colmax, double, RB, BT, NB, BT * TCo,
                    prob.layout == "gihwo" and NB == 1)


# ---- the choice ----------------------------------------------------------------

ConvSchedule = SmallO2Plan | StemO2Plan | GemmO2Plan | SmallPlan | GemmPlan | None


@dataclass(frozen=True)
class ConvPlan:
    """The kernel of a convolution ("depthwise", "small_o2", "stem_o2", "gemm_o2",
    "small", "gemm"), its schedule and whether it stores the output padded."""

    kernel: str
    schedule: ConvSchedule
    padded: bool


def plan_conv(cfg: HardwareConfig, opt_level: int, prob: ConvProblem, Wp: int | None, loc: str) -> ConvPlan:
    """The kernel of `prob` (`Wp`: rows of the padded output its users want, None for
    the natural layout): the -O2 kernels write the padded layout, so they are planned
    with it first, then without."""
    if prob.Ci_g == 1:
        return ConvPlan("depthwise", None, Wp is not None)
    if opt_level >= 2:
        for wp in ([Wp, None] if Wp is not None else [None]):
            for kernel, planner in (("small_o2", plan_small_o2), ("stem_o2", plan_stem_o2), ("gemm_o2", plan_gemm_o2)):
                schedule = planner(cfg, prob, wp)
                if schedule is not None:
                    return ConvPlan(kernel, schedule, wp is not None)
    small = plan_small(cfg, prob)
    if small is not None:
        return ConvPlan("small", small, False)
    return ConvPlan("gemm", plan_gemm(cfg, prob, loc), False)


def o2_feasible(lw: LoweringContext, op: nn.Conv2dOp) -> bool:
    """Whether a later convolution will run an -O2 kernel with a padded epilogue (so a
    residual operand it fuses can be stored padded). Plans its epilogue, which lowers
    the weights and constants the epilogue reads."""
    geo, G, Ci_g, Co_g, _ = conv_geometry(op)
    if Ci_g == 1:
        return False
    steps, _ = fuse_epilogue(lw, op, G * Co_g)
    prob = conv_problem(op, steps)
    Wp = geo.OW + 2
    return plan_small_o2(lw.cfg, prob, Wp) is not None or plan_gemm_o2(lw.cfg, prob, Wp) is not None


@dataclass
class ConvIO:
    """What a convolution emitter reads and writes: the op (its weight and bias), the
    phase images of its input (`src`), the fused steps and the output tensor (`out`, or
    the padded one `pad`)."""

    op: nn.Conv2dOp
    loc: str
    src: SSAValue
    steps: list[Step]
    out: SSAValue
    pad: PadInfo | None = None
