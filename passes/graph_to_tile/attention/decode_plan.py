"""The decode-attention kernel's problem and schedule: what is computed, and the choices.

A decode step attends a few query rows per sequence (one row, or after
`passes/graph/decode_attention.py` the G query heads of one KV head as G rows) over the
whole KV cache. As a `graph.sdpa` that is P = prod(batch dims) independent *problems*,
each L (<= a few) query rows against S cached keys and values::

    graph.sdpa %q, %k, %v, %mask : tensor<32x8x4x64xbf16>, tensor<32x8x130x64xbf16>, ...,
        tensor<32x1x1x130xbf16> -> tensor<32x8x4x64xbf16>
      -> DecodeProblem(P=256, L=4, S=130, D=64, Dv=64, mask_rows=[0, 0, ..., 31])
      -> DecodeSchedule(T=128, n=32, f=5, m=4, U=4): groups of 32 problems (128 query rows
         on the partitions), the cache read as [P * 26, 5 * 64] (5 positions per partition
         row, 640 contiguous bytes), 4 problems per K / V transfer, 4 groups per loop body

The flash kernel (`kernel.py`) runs such a problem per head: five DMAs (q, k, v, mask,
out) and a latency chain of some 30 instructions for one row. This kernel packs `n`
problems into one *group* whose query rows fill the partitions (n * L <= partitions):
the q rows, the mask rows and the output rows of a group are one DMA each, and every
vector instruction (row max, exp, row sum, normalise) covers the whole group.

The cache is read as the view ``[P * R, f * D]`` of ``[P, S, D]`` (``R = S / f``): a
partition row holds f consecutive positions (``f * D`` contiguous elements, so DMA
packets grow with f), problem p holds view rows ``p R .. p R + R - 1``, and one
transfer of ``m R`` rows brings m problems. Larger f means longer DMA chunks and
fewer transfers, but each of the f *windows* (position ``f r + t`` of row r) is a K
transpose, a score and a P V matmul of its own per transfer, and a query row's score
columns grow to ``m S`` (the other problems of its transfer masked); `decode_cost`
weighs the engines and ranks (n, f, U).

Where the whole cache is more view rows than partitions for every f, or its scores do
not fit the accumulator, the schedule reads it in *blocks* of ``rc`` view rows
(``DecodeSchedule.rc``, m = 1: one problem per transfer) and the kernel keeps a running
max, sum and output per query row (the online softmax of flash decoding)::

      -> DecodeProblem(P=8, L=4, S=4098, ...)
      -> DecodeSchedule(T=128, n=8, f=6, m=1, U=1, rc=128): 683 view rows per problem in
         blocks of 128 (768 positions), the last of 43

Applies (`decode_problem`) to a non-causal sdpa with at most 16 query rows per head, q,
k, v and the output viewable as rows, k and v not broadcast over the batch dims, and a
mask whose row dim is 1 and whose rows follow the same pattern in every group
(`mask_pattern`). Otherwise the flash kernel lowers it, with a remark naming the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import DmaPattern, TimingRules

ALIGN = 64
MAX_F = 16  # positions per partition row at most (windows per problem)
KV_RING = 4  # online: K and K^T block buffers per kernel (transfers in flight under the compute)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class DecodeProblem:
    """P problems of L query rows against S keys (head dims D, Dv); the mask's row of
    each problem (`mask_rows`, into the mask viewed as ``[mask_count, S]``) or None."""

    P: int
    L: int
    S: int
    D: int
    Dv: int
    isz: int
    fp32: bool
    mask_rows: tuple[int, ...] | None
    mask_count: int


@dataclass(frozen=True)
class DecodeSchedule:
    """n problems per group, f positions per partition row (R = S / f rows per
    problem), m problems per K / V transfer; U groups per loop body (each its SRAM
    buffers, two accumulator sets alternating: a group's loads and compute run under
    the previous group's; the engines run a body's instructions in order, so a body
    starts only once the previous one's last instruction on each engine has)."""

    T: int  # partitions / array rows and columns: the tile edge
    n: int
    f: int
    m: int
    U: int
    mask_span: int  # mask rows one group reads (0: no mask)
    mask_step: int  # first mask row of group g: g * mask_step
    rc: int = 0  # view rows per cache block (0: one block, the whole cache; else the online softmax)
    # the mask rows land transposed, window t of mask row b on partition b f + t (one DMA
    # transpose of [f x R] per mask row, `mask_transposed`); else mask row b on partition
    # b, window t at columns t R (f strided DMAs of every f-th position)
    mask_t: bool = False
    # online: K-transpose accumulators (two, alternating by problem, so one problem's
    # transposes run while the previous one's are copied out; one where two do not fit)
    kt_acc: int = 2

    def R(self, p: DecodeProblem) -> int:
        return p.S // self.f

    def mask_cols(self, p: DecodeProblem) -> int:
        """Positions of a window one mask transfer brings: a cache block's rows (online),
        else the whole cache's."""
        return self.rc if self.online else self.R(p)

    def pack(self, p: DecodeProblem) -> int:
        """Windows per K transpose: w windows' D columns side by side transpose to w D
        partitions (one matmul and one copy for w windows; Q^T is replicated w times)."""
        return max(1, min(self.f, self.T // p.D))

    def packs(self, p: DecodeProblem) -> int:
        return -(-self.f // self.pack(p))

    @property
    def online(self) -> bool:
        """The cache in blocks of `rc` view rows with a running max and sum (m = 1)."""
        return self.rc > 0

    def chunks(self, p: DecodeProblem) -> list[tuple[int, int]]:
        """(first view row, view rows) of each cache block of a problem."""
        R = self.R(p)
        step = self.rc if self.online else R
        return [(r0, min(step, R - r0)) for r0 in range(0, R, step)]

    def groups(self, p: DecodeProblem) -> int:
        return p.P // self.n

    def width(self, p: DecodeProblem) -> int:
        """Score columns per query row: the m problems of its transfer side by side
        (``m S``, columns ``(t, problem in the transfer, r)``; the others' are masked);
        online, one cache block's ``f rc`` (columns ``(t, r)``)."""
        return self.f * self.rc if self.online else self.m * p.S

    def blocks(self, p: DecodeProblem) -> int:
        """T-row blocks of P^T (the score columns on partitions)."""
        return -(-self.width(p) // self.T)


def decode_problem(q: Sequence[int], k: Sequence[int], v: Sequence[int], out: Sequence[int],
                   mask: Sequence[int] | None, causal: bool, isz: int, fp32: bool,
                   parts: int) -> tuple[DecodeProblem | None, str]:
    """The decode problem of an sdpa of these shapes, or (None, why it is not one);
    `parts`: the tile edge (partitions, array rows and columns)."""
    L, D = q[-2], q[-1]
    S, Dv = k[-2], v[-1]
    batch = list(out[:-2])
    if not batch:
        return None, "no batch or head dims"
    if L > 16 or L > parts:
        return None, f"{L} query rows per head (decode has a few)"
    if causal and S > 1:
        return None, "a causal mask (top-left aligned: a decode step's mask is an input)"
    if list(q[:-2]) != batch or list(k[:-2]) != batch or list(v[:-2]) != batch:
        return None, "q, k or v broadcast over the batch or head dims"
    if k[-1] != D or v[-2] != S or min(L, S, D, Dv) <= 0:
        return None, "inconsistent q / k / v shapes"
    if D > parts or Dv > parts:
        return None, f"head dims {D} / {Dv} above the array's {parts}"
    P = 1
    for x in batch:
        P *= x
    rows: tuple[int, ...] | None = None
    count = 0
    if mask is not None:
        ms = list(mask)
        full = [1] * (len(batch) + 2 - len(ms)) + ms
        if len(full) != len(batch) + 2 or full[-2] != 1 or full[-1] != S:
            return None, f"mask of shape {list(mask)} (decode takes one mask row per problem)"
        mb = full[:-2]
        if any(m not in (1, b) for m, b in zip(mb, batch)):
            return None, f"mask of shape {list(mask)} does not broadcast"
        strides, acc = [0] * len(mb), 1
        for d in range(len(mb) - 1, -1, -1):
            strides[d] = acc if mb[d] != 1 else 0
            acc *= mb[d]
        count = acc
        out_rows = []
        for p in range(P):
            r, rest = 0, p
            for d in range(len(batch) - 1, -1, -1):
                r += (rest % batch[d]) * strides[d]
                rest //= batch[d]
            out_rows.append(r)
        rows = tuple(out_rows)
    return DecodeProblem(P, L, S, D, Dv, isz, fp32, rows, count), ""


def mask_pattern(p: DecodeProblem, n: int, parts: int) -> tuple[int, int] | None:
    """(rows a group reads, first row of group g = g * step) when every group's problems
    read the same pattern of mask rows from a contiguous range; None otherwise."""
    if p.mask_rows is None:
        return 0, 0
    rows = p.mask_rows
    first = rows[:n]
    lo = min(first)
    span = max(first) - lo + 1
    if lo != 0 or span > parts:
        return None
    step = rows[n] - rows[0] if p.P > n else 0
    for g in range(p.P // n):
        base = g * step
        if any(rows[g * n + j] != base + first[j] for j in range(n)):
            return None
    return span, step


def candidates(p: DecodeProblem, cfg: HardwareConfig) -> list[DecodeSchedule]:
    """Every schedule that fits the target (`fits`): n a divisor of P with n * L <=
    partitions (the largest few), f a divisor of S; the whole cache as one block where
    S / f <= partitions, else (or where that does not fit) blocks of `rc` view rows
    (a few sizes up to the partitions) with the online softmax."""
    parts = min(cfg.sram.partitions, cfg.matrix.rows, cfg.matrix.cols, cfg.accumulator.partitions)
    ns = [n for n in range(1, p.P + 1) if p.P % n == 0 and n * p.L <= parts][-3:]
    fs = [f for f in range(1, min(MAX_F, p.S) + 1) if p.S % f == 0]
    out = []
    for n in ns:
        pat = mask_pattern(p, n, parts)
        if pat is None:
            continue
        groups = p.P // n
        whole = []
        for f in fs:
            R = p.S // f
            if R > parts:
                continue
            m = max(d for d in range(1, n + 1) if n % d == 0 and d * R <= parts)
            for U in (1, 2, 4):
                s = with_mask_layout(p, DecodeSchedule(parts, n, f, m, U, *pat), cfg)
                if groups % U == 0 and fits(p, s, cfg):
                    whole.append(s)
        out += whole
        if whole:
            continue
        for f in fs:
            R = p.S // f
            for rc in sorted({min(R, parts // d) for d in (1, 2, 4)}, reverse=True):
                if rc >= R:  # one block: the exact softmax above (it did not fit)
                    continue
                for kt in (2, 1):
                    s = with_mask_layout(p, DecodeSchedule(parts, n, f, 1, 1, *pat, rc=rc, kt_acc=kt), cfg)
                    if fits(p, s, cfg):
                        out.append(s)
                        break
    return out


def mask_transposed(p: DecodeProblem, s: DecodeSchedule, cfg: HardwareConfig) -> bool:
    """Whether the mask rows load transposed (`DecodeSchedule.mask_t`): a 2-byte mask,
    f > 1 windows, the group's mask rows times f within the partitions, and the DMA
    time of one transpose ``[f x R]`` per mask row (contiguous runs of f positions)
    below that of f strided loads ``[mask rows x R]`` (one element per descriptor: 2
    bytes a packet, ~13,000 cycles for 128 positions on ``cloud``). The selection matmul
    then contracts over the f mask-row windows with a 0/1 constant per window."""
    if not s.mask_span or s.f == 1 or p.isz != 2 or s.mask_span * s.f > s.T:
        return False
    tm, cols = TimingRules(cfg), s.mask_cols(p)
    transposed = s.mask_span * tm.dma_time(s.f, cols, p.isz, DmaPattern.TRANSPOSE)
    return bool(transposed < s.f * tm.dma_time(s.mask_span, cols, p.isz, DmaPattern.STRIDED))


def with_mask_layout(p: DecodeProblem, s: DecodeSchedule, cfg: HardwareConfig) -> DecodeSchedule:
    return replace(s, mask_t=True) if mask_transposed(p, s, cfg) else s


def mask_shape(p: DecodeProblem, s: DecodeSchedule) -> tuple[int, int]:
    """A group's mask buffer (per block, online): ``[rows x f R]`` or, transposed,
    ``[rows f x R]`` (`DecodeSchedule.mask_t`)."""
    cols = s.mask_cols(p)
    return (s.mask_span * s.f, cols) if s.mask_t else (s.mask_span, s.f * cols)


def sel_shape(p: DecodeProblem, s: DecodeSchedule) -> tuple[int, int]:
    """The 0/1 mask-row selection constant: ``[rows x n L]``, or transposed ``[rows f x
    f n L]`` (window t's selection at columns t n L, rows b f + t)."""
    nL = s.n * p.L
    return (s.mask_span * s.f, s.f * nL) if s.mask_t else (s.mask_span, nL)


def sram_bytes(p: DecodeProblem, s: DecodeSchedule) -> int:
    """SRAM bytes per partition (the largest use of any partition, each buffer aligned)."""
    isz, n, L = p.isz, s.n, p.L
    if s.online:
        W = s.width(p)
        mrow = _align(mask_shape(p, s)[1] * isz) if s.mask_span else 0
        sel = _align(sel_shape(p, s)[1] * isz) if s.mask_span else 0
        per_block = (mrow + _align(4 * W) + _align(W * isz)
                     + _align(s.blocks(p) * n * L * isz) + 6 * _align(4) + _align(4 * p.Dv))
        ring = KV_RING * (_align(s.f * p.D * isz) + _align(W * isz)) + 2 * n * _align(s.f * p.Dv * isz)
        consts = _align(s.T * isz) + sel
        return consts + _align(s.pack(p) * p.D * isz) + _align(n * L * isz) + _align(p.Dv * isz) + ring + 2 * per_block
    tiles = n // s.m
    W = s.width(p)
    mrow = _align(mask_shape(p, s)[1] * isz) if s.mask_span else 0
    sel = _align(sel_shape(p, s)[1] * isz) if s.mask_span else 0
    per_set = (_align(s.pack(p) * p.D * isz) + _align(n * L * isz) + mrow
               + tiles * _align(s.f * p.D * isz) + _align(n * p.S * isz) + tiles * _align(s.f * p.Dv * isz)
               + _align(4) + _align(4 * W) + _align(W * isz) + _align(4)
               + _align(s.blocks(p) * n * L * isz) + _align(p.Dv * isz))
    consts = _align(s.T * isz) + sel + (_align(W * isz) if s.m > 1 else 0)
    return consts + s.U * per_set


def acc_bytes(p: DecodeProblem, s: DecodeSchedule) -> int:
    """Accumulator bytes per partition."""
    nL = s.n * p.L
    if s.online:
        W = s.width(p)
        return (_align(4 * nL) + 2 * (_align(4 * W) + _align(4 * s.blocks(p) * nL) + _align(4 * p.Dv))
                + s.kt_acc * _align(4 * s.packs(p) * s.rc))
    per_set = _align(4 * nL) + _align(4 * s.width(p)) + _align(4 * s.blocks(p) * nL) + _align(4 * p.Dv)
    return min(2, s.U) * per_set + 2 * _align(4 * s.m * p.S)


def fits(p: DecodeProblem, s: DecodeSchedule, cfg: HardwareConfig) -> bool:
    return (sram_bytes(p, s) <= cfg.sram.bytes_per_partition
            and acc_bytes(p, s) <= cfg.accumulator.bytes_per_partition)
