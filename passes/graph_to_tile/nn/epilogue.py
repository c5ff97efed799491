"""Convolution and pooling epilogues: the elementwise ops fused after a window op, and
the code that compacts, finishes and stores its ``[channels x positions]`` tiles.

`fuse_epilogue` walks the single-use chain after a convolution (batch-norm scale and
shift per channel, a residual add, relu / clamp / any core unary op) into `Step`s; the
kernel's `Epilogue` applies them to every accumulator tile on its way out, so the chain
never becomes kernels of its own:

    %y = graph.conv2d(%x, %w)  %s = graph.mul %y, %scale  %t = graph.add %s, %res  %r = graph.relu %t
      -> steps [column mul %scale, tile add %res, unary relu]; %y, %s, %t, %r: one kernel
    per band:  tile.binary "add" %acc, %bias -> %out   (compact: bias, rounding)
               tile.binary "mul" %out, %scale {column}; tile.load %res; tile.binary "add";
               tile.unary "relu"; tile.store %out -> %r[n, c0, 0, oh0 * OW]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    ALIGN,
    HbmKernel,
    const_hbm,
    false_i1,
    fill_row,
    lin,
    partition_bytes,
    present,
    sub,
    value_elem,
    value_shape,
)
from tilecc.passes.graph_to_tile.nn.layout import natural_of_info
from tilecc.passes.graph_to_tile.nn.queues import QueueModel
from tilecc.passes.graph_to_tile.nn.state import PadInfo, padded_hbm, padded_of
from tilecc.passes.vector_fns import BINARY, COMMUTATIVE, UNARY, gelu_fn

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


@dataclass
class Step:
    """One fused op of an epilogue: a unary function, a binary one with an immediate
    (`scalar`), a per-channel operand (`column`) or a whole operand tile (`tile`, a
    residual); `swap`: the chain's value is the right operand."""

    kind: str  # "unary" | "scalar" | "column" | "tile"
    fn: str
    imm: float = 0.0
    swap: bool = False
    value: SSAValue | None = None  # HBM operand (column / tile)

    def operand(self) -> SSAValue:
        """The HBM operand of a column / tile step."""
        return present(self.value, f"operand of the {self.kind} step {self.fn}")


_EPILOGUE_UNARY = ("relu", "exp", "tanh", "sigmoid", "neg", "rsqrt", "sqrt", "silu")
_EPILOGUE_BINARY = ("add", "sub", "mul", "div", "max", "min")
# the unary and binary ops a convolution epilogue absorbs (a subset of the one table,
# `passes/vector_fns.py`: the core activations and arithmetic, and min)
_UNARY = {t: f for t, f in UNARY.items() if f in _EPILOGUE_UNARY}
_BINARY = {t: f for t, f in BINARY.items() if f in _EPILOGUE_BINARY}


def _ready(lw: LoweringContext, v: SSAValue, before: Operation) -> bool:
    """Whether `v` is lowered; a later weight / constant is lowered now (the walk of
    lower-graph-to-tile skips ops whose result is already lowered)."""
    if v in lw.values or v in lw.scalars:
        return True
    owner = v.owner
    if isinstance(owner, (g.WeightOp, g.ConstantOp)) and owner.parent_block() is before.parent_block():
        from tilecc.passes.graph_to_tile.conversion import (
            lower_op,  # the conversion imports the families
        )

        lower_op(lw, owner)
        return True
    return False


def fuse_epilogue(lw: LoweringContext, op: Operation, channels: int) -> tuple[list[Step], list[Operation]]:
    """The chain of elementwise ops that consume `op`'s result as their only user and can
    run in its epilogue (result shape [N, C, OH, OW] with `channels` = C)."""
    cur = op.results[0]
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
        if type(user) in _UNARY:
            new = [Step("unary", _UNARY[type(user)])]
        elif isinstance(user, g.GeluOp):
            new = [Step("unary", gelu_fn(user))]
        elif type(user) in _BINARY:
            new = _binary_steps(lw, op, user, cur)
            if new is None:
                break
        else:
            break
        steps.extend(new)
        fused.append(user)
        cur = user.results[0]
    return steps, fused


def _binary_steps(lw: LoweringContext, op: Operation, user: Operation, cur: SSAValue) -> list[Step] | None:
    """The steps of binary op `user` applied to the chain's value `cur` (None: it does
    not fuse): an immediate, a per-channel column or an operand tile of the output's shape."""
    N, C, OH, OW = value_shape(cur)
    fn = _BINARY[type(user)]
    lhs, rhs = user.operands
    if lhs is cur and rhs is cur:
        return None
    other, chain_rhs = (rhs, False) if lhs is cur else (lhs, True)
    if not _ready(lw, other, op):
        return None
    if other in lw.scalars:
        return [Step("scalar", fn, imm=lw.scalars[other], swap=chain_rhs)]
    shp = value_shape(other)
    if len(shp) > 4:
        return None
    full = (1,) * (4 - len(shp)) + shp
    if padded_of(lw, other) is not None:  # an activation, stored padded
        if full[1:] != (C, OH, OW) or full[0] not in (1, N):
            return None
        return [Step("tile", fn, swap=chain_rhs, value=lw.materialise(other))]
    if full[0] == 1 and full[2] == 1 and full[3] == 1 and full[1] in (1, C):
        if chain_rhs and fn not in COMMUTATIVE:
            if fn != "sub":
                return None
            return [Step("column", "sub", value=lw.materialise(other)), Step("unary", "neg")]
        return [Step("column", fn, value=lw.materialise(other))]
    if full[1:] == (C, OH, OW) and full[0] in (1, N):
        return [Step("tile", fn, swap=chain_rhs, value=lw.materialise(other))]
    return None


def _keeps_zero(st: Step) -> bool:
    """Whether step `st` maps 0 to 0 (a tile operand: padded, zero where the output is)."""
    if st.kind == "unary":
        return st.fn == "relu"
    if st.kind == "scalar" and st.fn in ("min", "max"):  # min(0, c) = 0 for c >= 0, max(0, c) = 0 for c <= 0
        return st.imm >= 0 if st.fn == "min" else st.imm <= 0
    if st.kind in ("scalar", "column"):
        return st.fn == "mul" and not st.swap
    return st.fn in ("add", "mul")


def zero_floor(steps: Sequence[Step]) -> bool:
    """Whether `steps` send a value near -2^100 to exactly 0: finite additions (a padded
    residual, per-channel or immediate shifts) up to a relu (or a max with 0), then only
    steps that keep zeros. A kernel whose contraction adds -2^100 at the padding columns
    of a padded output (`conv_gemm_o2`'s pad row) then needs no 0/1 mask there."""
    for i, st in enumerate(steps):
        if (st.kind == "unary" and st.fn == "relu") or (st.kind == "scalar" and st.fn == "max" and st.imm == 0.0):
            return all(_keeps_zero(s) for s in steps[i + 1:])
        if st.fn == "add" or (st.fn == "sub" and not st.swap):
            if st.kind == "scalar" and not abs(st.imm) < 2.0 ** 64:
                return False
            continue
        return False
    return False


def finish_fusion(lw: LoweringContext, op: Operation, fused: list[Operation], out: SSAValue) -> None:
    """Record `out` as the value of `op` and of its fused users; drop the fused ops."""
    res = op.results[0]
    if fused:
        fused[-1].results[0].replace_all_uses_with(res)
        for u in reversed(fused):
            u.detach()
            u.erase()
    lw.values[res] = out


def _pick(queues: QueueModel | None, nbytes: int, chunk: int, const: bool = False) -> int | None:
    """A DMA queue hint from `queues` (none without a model); `const`: the load reads
    data no earlier kernel writes (`QueueModel.next`)."""
    return None if queues is None else queues.next(nbytes, chunk, const)


def epilogue_bytes(kinds: Sequence[str], cols: int, out_isz: int, sets: int = 1, Wp: int | None = None,
                   OW: int = 1) -> int:
    """SRAM bytes per partition of an epilogue with steps of `kinds` over bands of `cols`
    (rb * OW) positions, `sets` buffer sets; `Wp`: the output is stored padded with rows
    of Wp (bands of Wp-wide rows and the ring, a mask and the ring's zeros)."""
    if Wp is not None:
        cols = max(1, cols // OW) * Wp + 2 * (Wp + 1)
    total = sets * partition_bytes(cols, out_isz)
    if Wp is not None:
        total += partition_bytes(cols, out_isz) + partition_bytes(2 * Wp, out_isz)
    for kind in kinds:
        if kind == "column":
            total += ALIGN
        elif kind == "tile":
            total += sets * partition_bytes(cols, out_isz)
    return total


class Epilogue:
    """Compaction of a ``[channels x positions]`` tile to NCHW rows, the fused steps and
    the store. Channel of partition r: ``(c0 + r) * m + j`` (m: depthwise multiplier).

    With `pad` (a `PadInfo`) the output is stored padded: a band of rb rows is written
    whole (rb * Wp positions from row oh0 + pt), its padding columns zeroed by a 0/1
    mask; the top and bottom of the padding ring are stored once per channel tile
    (`emit_ring`). Tile operands (a residual) are then read in the same layout."""

    def __init__(self, lw: LoweringContext, steps: list[Step], out: SSAValue, N: int, C: int, OH: int, OW: int,
                 m: int = 1, pad: PadInfo | None = None, loc: str = "", rb: int | None = None) -> None:
        self.lw, self.steps, self.N, self.C, self.OH, self.OW, self.m = lw, steps, N, C, OH, OW, m
        self.pad = pad
        # padded output: the ring's positions above the first row (top, lead) and below the last
        self.top = self.lead = self.bottom = 0
        self.rb = rb or OH
        # per-channel operands loaded besides the steps' (a bias: `preload_columns`)
        self.extra_columns: list[tuple[SSAValue, SSAValue]] = []
        # preloaded rows waiting for their row-to-column matmuls (`columns_ready`)
        self.pending: list[tuple[SSAValue, SSAValue, SSAValue, SSAValue, list[int]]] = []
        # on-chip buffers (`alloc`)
        self.TC = 0
        self.col_sets = 0
        self.obs: list[SSAValue] = []
        self.bufs: list[SSAValue | None] = []
        self.tile_bufs: list[list[SSAValue] | None] = []
        self.maskb: SSAValue | None = None
        self.zerob: SSAValue | None = None
        # the kernel's DMA queue model (`init`): tile operands load on its activation queues
        self.queues: QueueModel | None = None
        # padded output: the accumulator holds -2^100 at the padding columns and the steps
        # send it to 0 (`zero_floor`; set by a kernel whose contraction adds it), so no mask
        self.floored = False
        # (buffer set, step) of tile operands loaded ahead (`prefetch`)
        self.prefetched: set[tuple[int, int]] = set()
        # constants some epilogues use (the 1x1 one of `preload_columns`; mask and zeros)
        self.extra: list[SSAValue] = [fill_row(lw, 1.0, f32, 1)]
        S = OH * OW
        elem = value_elem(out)
        if pad is not None:
            self.out = lw.view(pad.hbm, (N, C // m, m, pad.L))
            # a band's buffer: `lead` positions (the ring above the first row when it is
            # the first band), rb rows of Wp, `bottom` positions (the ring below the last)
            self.top = self.lead = pad.pt * pad.Wp + pad.pl
            self.bottom = pad.L - ((OH + pad.pt) * pad.Wp + pad.pl)
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
                shp = value_shape(st.operand())
                size = math.prod(shp)
                st.value = lw.view(st.operand(), (C // m, m) if size == C else (1, 1))
                self.views.append(st.value)
            elif st.kind == "tile":
                info = padded_hbm(lw, st.value)
                if pad is not None:
                    assert info is not None and (info.Wp, info.pt, info.pl) == (pad.Wp, pad.pt, pad.pl)
                    st.value = lw.view(info.hbm, (info.N, C // m, m, info.L))
                else:
                    if info is not None:
                        st.value = natural_of_info(lw, info, loc)
                    n0 = math.prod(value_shape(st.operand())) // (C * S)
                    st.value = lw.view(st.operand(), (n0, C // m, m, S))
                self.views.append(st.value)

    def hbm_args(self) -> list[SSAValue]:
        """The kernel arguments the epilogue reads and writes (operands, output, constants)."""
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
        self.col_sets = col_sets
        self.bufs, self.tile_bufs = [], []
        for st in self.steps:
            if st.kind == "column":
                self.bufs.append(kb.alloc([TC, max(1, col_sets)], value_elem(st.operand()), tile.SRAM, "chan"))
                self.tile_bufs.append(None)
            elif st.kind == "tile":
                tcols = rb * self.pad.Wp if self.pad is not None else cols
                tb = [kb.alloc([TC, tcols], value_elem(st.operand()), tile.SRAM, "operand") for _ in range(sets)]
                self.bufs.append(tb[0])
                self.tile_bufs.append(tb)
            else:
                self.bufs.append(None)
                self.tile_bufs.append(None)
        if self.pad is not None:
            self.maskb = kb.alloc([TC, cols], elem, tile.SRAM, "mask")
            self.zerob = kb.alloc([TC, max(self.top, self.bottom, 1)], elem, tile.SRAM, "zeros")

    def _pad_bufs(self) -> tuple[SSAValue, SSAValue]:
        """The mask and zeros buffers of a padded epilogue (`alloc`)."""
        return present(self.maskb, "padded epilogue's mask buffer"), present(self.zerob, "padded epilogue's zeros")

    def init(self, k: HbmKernel, queues: QueueModel | None = None, rows_contiguous: bool = False) -> None:
        """Kernel-start setup of a padded epilogue: the mask, zeroed output buffers (their
        padding columns are read by the mask before anything writes them) and the zeros
        of the padding ring. `rows_contiguous`: every band's compaction writes its rows
        as one run (`emit` with ``Wq == Wp``), so only the columns before and after that
        run are zeroed (a vector pass over the whole buffer per set, ~5,000 cycles per
        kernel on `cloud` at 56 x 56, otherwise)."""
        self.queues = queues
        if self.pad is None:
            return
        kb = k.kb
        maskb, zerob = self._pad_bufs()
        cols = value_shape(maskb)[1]
        TC = self.TC
        kb.add(tile.LoadOp(k.arg(self.mask), [kb.const(0)], maskb, kb.const(TC), kb.const(cols), -1, 0,
                           queue=_pick(queues, cols * 2, cols * 2, True)))
        zl = value_shape(zerob)[1]
        kb.add(tile.LoadOp(k.arg(self.zero), [kb.const(0)], zerob, kb.const(TC), kb.const(zl), -1, 0,
                           queue=_pick(queues, zl * 2, zl * 2, True)))
        spans = [(0, cols)]
        if rows_contiguous:
            written = self.lead + (self.rb - 1) * self.pad.Wp + self.OW
            spans = [(lo, hi) for lo, hi in ((0, self.lead), (written, cols)) if hi > lo]
        for ob in self.obs:  # zeros (mask * 0: the mask is the only initialised source this wide)
            for lo, hi in spans:
                kb.add(tile.ScalarOp("mul", sub(kb, maskb, 0, lo, [TC, hi - lo]), 0.0,
                                     sub(kb, ob, 0, lo, [TC, hi - lo]),
                                     kb.const(TC), kb.const(hi - lo)))

    def emit_ring(self, k: HbmKernel, n: SSAValue, c0: SSAValue, j: SSAValue, rows: SSAValue) -> None:
        """Store the zeros above the first and below the last output row (padded output)."""
        if self.pad is None:
            return
        kb = k.kb
        outa = k.arg(self.out)
        TC = self.TC
        _, zerob = self._pad_bufs()
        if self.top:
            kb.add(tile.StoreOp(sub(kb, zerob, 0, 0, [TC, self.top]), outa, [n, c0, j, kb.const(0)], rows,
                                kb.const(self.top), 1, 3))
        if self.bottom:
            kb.add(tile.StoreOp(sub(kb, zerob, 0, 0, [TC, self.bottom]), outa,
                                [n, c0, j, kb.const(self.pad.L - self.bottom)], rows, kb.const(self.bottom), 1, 3))

    def sram_bytes(self, cols: int, out_isz: int) -> int:
        return epilogue_bytes([st.kind for st in self.steps], cols, out_isz,
                              Wp=self.pad.Wp if self.pad is not None else None, OW=self.OW)

    def preload_columns(
        self, k: HbmKernel, c_first: SSAValue, TC: int, queues: QueueModel | None = None, count: int | None = None,
        defer: bool = False, repeat: int = 1,
    ) -> None:
        """Load the column operands of `col_sets` chunks of TC channels from `c_first`
        (chunk j in column j of the operand's buffer). A column is one element per
        partition, which a DMA moves element by element (short chunks waste HBM
        bandwidth); instead each operand's channels load as one contiguous row and tiny
        matmuls with a 1x1 one (``acc[c, 0] = row[0, c] * 1``, exact) turn each chunk of
        the row into a column. `repeat`: the `count` channels repeated that many times
        down one chunk (bands side by side on the partitions: `emit`'s `stack`)."""
        kb = k.kb
        cols = [(st.operand(), present(buf, "column buffer"))
                for st, buf in zip(self.steps, self.bufs) if st.kind == "column"]
        cols += self.extra_columns
        if not cols:
            return
        n = max(1, self.col_sets)
        count = n * TC if count is None else count  # channels from c_first
        sizes = [min(TC, count - j * TC) for j in range(n)]
        if repeat > 1:
            assert n == 1 and repeat * count <= TC, "repeated columns: one chunk"
            sizes = [repeat * count]
        one_b = kb.alloc([1, 1], f32, tile.SRAM, "one")
        one_v = self.extra[0]
        kb.add(tile.LoadOp(k.arg(one_v), [kb.const(0)], one_b, kb.const(1), kb.const(1), -1, 0,
                           queue=_pick(queues, 4, 4, True)))
        for value, buf in cols:
            v = k.arg(value)
            elem = value_elem(value)
            if value_shape(value) == (1, 1):
                kb.add(tile.LoadOp(v, [kb.const(0), kb.const(0)], buf, kb.const(TC), kb.const(n), -1, -1,
                                   queue=_pick(queues, TC * n * 2, 2, True)))
                continue
            row = kb.alloc([1, n * TC], elem, tile.SRAM, "chan_row")
            one = one_b
            if elem != f32:
                one = kb.alloc([1, 1], elem, tile.SRAM, "one")
                kb.add(tile.UnaryOp("copy", one_b, one, kb.const(1), kb.const(1)))
            # the operand viewed (C, 1): `count` consecutive channels along the columns
            for r in range(repeat):
                kb.add(tile.LoadOp(v, [c_first, kb.const(0)], sub(kb, row, 0, r * count, [1, count]), kb.const(1),
                                   kb.const(count), 1, 0,
                                   queue=_pick(queues, count * element_size(elem), count * element_size(elem), True)))
            acc = kb.alloc([TC, n], f32, tile.ACC, "acc_chan")
            self.pending.append((row, one, acc, buf, sizes))
        if not defer:
            self.columns_ready(k)

    def columns_ready(self, k: HbmKernel) -> None:
        """The matmuls that turn the preloaded rows into columns (emitted where the
        matrix engine's in-order queue should take them: before the first epilogue, not
        ahead of matmuls that do not wait for these loads)."""
        kb = k.kb
        pending, self.pending = self.pending, []
        for row, one, acc, buf, sizes in pending:
            TC = value_shape(buf)[0]
            n = len(sizes)
            for j, m in enumerate(sizes):
                kb.add(tile.MatmulOp(sub(kb, row, 0, j * TC, [1, TC]), one, sub(kb, acc, 0, j, [TC, 1]),
                                     kb.const(m), kb.const(1), kb.const(1), false_i1(kb)))
            if sizes[-1] == TC:
                kb.add(tile.UnaryOp("copy", acc, buf, kb.const(TC), kb.const(n)))
            else:
                for j, m in enumerate(sizes):
                    kb.add(tile.UnaryOp("copy", sub(kb, acc, 0, j, [TC, 1]), sub(kb, buf, 0, j, [TC, 1]),
                                        kb.const(m), kb.const(1)))

    def emit(
        self, k: HbmKernel, src: SSAValue, rows: SSAValue, n: SSAValue, c0: SSAValue, j: SSAValue,
        oh0: SSAValue, rb: int, Wq: int, compact: Callable[..., None] | None, row_aware: bool = False,
        col_set: int | None = None, buf_set: int = 0, first: bool = False, last: bool = False,
        stack: list[int] | None = None, per_row: bool = False,
    ) -> None:
        """`src`: the band's positions (row r of the band at column r * Wq); `compact(s, d,
        rows, cols)` writes the rounded output of a piece of it (None: the first step reads
        `src` itself, so the compaction is that step; a band whose rows are one run, Wq
        equal to the output's row length). `col_set`: the preloaded column operands' chunk
        (see `alloc`). `stack`: the tile's partitions hold len(stack) bands of the same
        channels (piece s: partitions s * rows / len(stack) on, its first output row
        stack[s]); the ops run once over all of them, a tile operand loads and each piece
        is stored on its own (`oh0`, `first` and `last` then follow from stack; column
        operands must be loaded repeated: `preload_columns`' `repeat`)."""
        kb = k.kb
        if self.pending:
            self.columns_ready(k)
        OW = self.OW
        obuf = self.obs[buf_set]
        TC = value_shape(obuf)[0]
        if self.pad is not None:
            self._emit_padded(k, src, rows, n, c0, j, oh0, rb, Wq, compact, row_aware, col_set, buf_set, first, last,
                              stack, per_row)
            return
        cols = rb * OW
        fsrc = None
        if compact is None:
            assert Wq == OW, "a fused first step reads the band as one run"
            fsrc = sub(kb, src, 0, 0, [TC, cols])
        elif Wq == OW:
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
        tcs = TC // len(stack) if stack is not None else TC
        pieces = None if stack is None else [(p * tcs, tcs, kb.const(OW * oh)) for p, oh in enumerate(stack)]
        self._steps(k, ob, rows, cc, n, c0, j, s0, col_set, buf_set, TC, cols, fsrc, pieces)
        if pieces is None:
            kb.add(tile.StoreOp(ob, k.arg(self.out), [n, c0, j, s0], rows, cc, 1, 3))
            return
        nq = self.lw.cfg.dma.queues
        for p, (r0, _, s0_) in enumerate(pieces):
            kb.add(tile.StoreOp(sub(kb, obuf, r0, 0, [tcs, cols]), k.arg(self.out), [n, c0, j, s0_],
                                kb.const(tcs), cc, 1, 3, queue=(nq - 1 - p) % nq))

    def _steps(
        self, k: HbmKernel, ob: SSAValue, rows: SSAValue, cc: SSAValue, n: SSAValue, c0: SSAValue, j: SSAValue,
        s0: SSAValue, col_set: int | None, buf_set: int, TC: int, cols: int, src: SSAValue | None = None,
        pieces: list[tuple[int, int, SSAValue]] | None = None,
    ) -> None:
        """The fused steps on output tile `ob` ([rows x cols]; its first output position s0).
        `src`: the first step reads it instead of `ob` (the accumulator: the step is the
        compaction; copied where there is no step). `pieces`: (first partition,
        partitions, first output position) of a stack's bands: a tile operand loads per piece."""
        kb = k.kb
        a_in = ob if src is None else src
        if src is not None and not self.steps:
            kb.add(tile.UnaryOp("copy", src, ob, rows, cc))
        for si, (st, buf, tbufs) in enumerate(zip(self.steps, self.bufs, self.tile_bufs)):
            if tbufs is not None:
                buf = tbufs[buf_set]
            if st.kind == "unary":
                kb.add(tile.UnaryOp(st.fn, a_in, ob, rows, cc))
            elif st.kind == "scalar":
                kb.add(tile.ScalarOp(st.fn, a_in, st.imm, ob, rows, cc, swap=st.swap))
            elif st.kind == "column":
                buf = present(buf, "column buffer")
                if col_set is not None:
                    buf = sub(kb, buf, 0, col_set, [TC, 1])
                else:
                    assert pieces is None, "a stack's columns are preloaded"
                    v = k.arg(st.operand())
                    if value_shape(st.operand()) == (1, 1):
                        kb.add(tile.LoadOp(v, [kb.const(0), kb.const(0)], buf, rows, kb.const(1), -1, -1))
                    else:
                        kb.add(tile.LoadOp(v, [c0, j], buf, rows, kb.const(1), 0, -1))
                kb.add(tile.BinaryOp(st.fn, a_in, buf, ob, rows, cc, "column"))
            else:
                tbuf = present(buf, "tile operand buffer")
                tb = sub(kb, tbuf, 0, 0, [TC, cols])
                if (buf_set, si) in self.prefetched:
                    self.prefetched.discard((buf_set, si))
                else:
                    self._load_tile(k, st, tbuf, n, c0, j, pieces or [(0, TC, s0)], rows, cols, pieces is None)
                a, b = (tb, a_in) if st.swap else (a_in, tb)
                kb.add(tile.BinaryOp(st.fn, a, b, ob, rows, cc))
            a_in = ob

    def _load_tile(
        self, k: HbmKernel, st: Step, tbuf: SSAValue, n: SSAValue, c0: SSAValue, j: SSAValue,
        pieces: list[tuple[int, int, SSAValue]], rows: SSAValue, cols: int, whole: bool, const: bool = False,
    ) -> None:
        """Load tile operand `st` for (first partition, partitions, first position) `pieces`
        of `tbuf` (`whole`: one piece of `rows` partitions); `const`: on the queues of
        data the kernel before does not write (`prefetch`)."""
        kb = k.kb
        v = k.arg(st.operand())
        nn_ = n if value_shape(st.operand())[0] == self.N else kb.const(0)
        esz = element_size(value_elem(st.operand()))
        for r0, tcs, s0_ in pieces:
            kb.add(tile.LoadOp(v, [nn_, c0, j, s0_], sub(kb, tbuf, r0, 0, [tcs, cols]),
                               rows if whole else kb.const(tcs), kb.const(cols), 1, 3,
                               queue=None if self.queues is None else self.queues.next(
                                   tcs * cols * esz, cols * esz, const=const, among_stores=not const)))

    def prefetch(self, k: HbmKernel, n: SSAValue, c0: SSAValue, j: SSAValue, rows: int, tops: list[int], rb: int,
                 buf_set: int, const: bool = True) -> None:
        """Load the tile operands (a residual) of the band(s) whose first output rows are
        `tops` (one band, or a stack's) into buffer set `buf_set` now (`const`: on the
        queues of data the kernel before does not write, else on the activation queues
        other than the store queue): a residual is written two or more kernels back, so
        issued ahead of the slabs it loads while the kernel before runs instead of
        queueing behind this kernel's slabs and stores. Only for a set's first use
        (nothing reads it before); `emit` then skips the load."""
        kb = k.kb
        OW = self.OW
        if self.pad is not None:
            cols, base, step = (rb - 1) * self.pad.Wp + OW, self.lead, self.pad.Wp
        else:
            cols, base, step = rb * OW, 0, OW
        tcs = rows // len(tops)
        pieces = [(p * tcs, tcs, kb.const(base + step * oh)) for p, oh in enumerate(tops)]
        for si, (st, tbufs) in enumerate(zip(self.steps, self.tile_bufs)):
            if st.kind != "tile" or tbufs is None:
                continue
            # (where the kernel before writes it after all, linking orders the load after
            # that kernel's store: slower, never wrong)
            self._load_tile(k, st, tbufs[buf_set], n, c0, j, pieces, kb.const(rows), cols, len(tops) == 1, const)
            self.prefetched.add((buf_set, si))

    def _emit_padded(
        self, k: HbmKernel, src: SSAValue, rows: SSAValue, n: SSAValue, c0: SSAValue, j: SSAValue,
        oh0: SSAValue, rb: int, Wq: int, compact: Callable[..., None] | None, row_aware: bool,
        col_set: int | None, buf_set: int, first: bool, last: bool, stack: list[int] | None = None,
        per_row: bool = False,
    ) -> None:
        """Buffer position lead + r * Wp + ow is padded index (oh0 + r + pt) * Wp + ow + pl.
        The first band's store also covers the ring above it, the last band's the ring
        below (`first` / `last`: bands emitted once each; bands in a loop rely on
        `emit_ring` instead). `stack`: see `emit`; `per_row`: compact row by row even where
        Wq == Wp (the padding columns are then never written, so steps that keep zeros
        need no mask)."""
        kb = k.kb
        pad, OW = self.pad, self.OW
        assert pad is not None and self.maskb is not None
        Wp, lead = pad.Wp, self.lead
        obuf = self.obs[buf_set]
        TC = value_shape(obuf)[0]
        valid = (rb - 1) * Wp + OW  # through the last valid position
        whole = Wq == Wp and not per_row
        fsrc = None
        if compact is None:
            assert whole, "a fused first step reads the band as one run"
            fsrc = sub(kb, src, 0, 0, [TC, valid])
        elif whole:
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
        pieces = [(0, TC, rows, first, last, s0)] if stack is None else [
            (p * (TC // len(stack)), TC // len(stack), kb.const(TC // len(stack)), oh == 0, oh + rb == self.OH,
             kb.const(lead + Wp * oh)) for p, oh in enumerate(stack)]
        self._steps(k, ob, rows, kb.const(valid), n, c0, j, s0, col_set, buf_set, TC, valid, fsrc,
                    None if stack is None else [(r0, tcs, s0_) for r0, tcs, _, _, _, s0_ in pieces])
        # after `init` zeroed the buffer only [lead, lead + valid) is ever written (by the
        # compaction and the steps): the mask zeroes its padding columns, the rest stays 0;
        # compacted row by row, the padding columns stay 0 unless a step changes zeros;
        # floored (-2^100 there, sent to 0 by the steps) they are 0 already
        if not self.floored and (whole or not all(_keeps_zero(st) for st in self.steps)):
            kb.add(tile.BinaryOp("mul", ob, sub(kb, self.maskb, 0, lead, [TC, valid]), ob, rows, kb.const(valid)))
        nq = self.lw.cfg.dma.queues
        for p, (r0, tcs, rows_, first_, last_, s0_) in enumerate(pieces):
            lo = 0 if first_ else lead
            hi = lead + rb * Wp + (self.bottom if last_ else 0)
            dst = kb.const(0) if first_ else s0_
            # a stack's pieces on queues of their own, from the last (a store's default) down
            kb.add(tile.StoreOp(sub(kb, obuf, r0, lo, [tcs, hi - lo]), k.arg(self.out), [n, c0, j, dst], rows_,
                                kb.const(hi - lo), 1, 3, queue=None if stack is None else (nq - 1 - p) % nq))
