"""Rotary embeddings applied where the projection's accumulator tiles are evacuated.

The q / k projection (merged q/k/v linear: passes/graph/merge_linears.py) writes its
``[S, N]`` rows; each rotary embedding reads a column range of them as heads::

    %p = graph.fused "matmul"(...)                     : ... -> tensor<512x3072xbf16>
    %q = graph.slice %p dim 1 start 0 end 2048 step 1  : ... -> tensor<512x2048xbf16>
    %q4 = graph.reshape %q  -> tensor<1x512x32x64xbf16>
    %qt = graph.permute %q4 [0, 2, 1, 3] -> tensor<1x32x512x64xbf16>
    %qr = graph.rope %qt, %cos, %sin                   (cos, sin tensor<1x1x512x64xbf16>)

Lowered on their own the ropes are kernels of their own after the projection, bound by
the vector engine (four or fewer instructions a head per tile of positions: rope/kernel.py),
while the projection's vector engine idles through most of its steps. Here the
projection's kernel (`RopeMatmulKernel`) rotates each output tile as it evacuates it:
the tile is copied from the accumulator (rounded to the projection's type, as eager
rounds q), its roped heads get ``y = x * cos + rotate_half(x) * sin`` in SRAM with the
rope kernel's instructions (cos replicated for `rep` heads, the rotation two
instructions a head, one add) and cos / sin rows of the tile's positions, and the tile
is stored as before: the q and k columns of the output hold the rotated values, and
each rope's result is the transposed view of its columns. The ropes' own lowering then
finds their results bound and emits nothing.

Applies (`find`) when the group yields its product alone (no epilogue), every user of
the product is a last-dim slice, and the slices a rope reads through
``reshape [.., S, H, D] -> permute [.., H, S, D]`` are read by nothing else; cos / sin
are ``[S, D]`` rows (leading unit dims), one pair for every rope. Otherwise (remark) the
ropes stay kernels of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import tile
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.graph_rope import RopeOp
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.fused_matmul import FusedMatmulKernel
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

REP = 4  # heads of cos side by side (x * cos over REP heads an instruction)
OVERHEAD_PER_HEAD = 2.0 + 1.0 / REP  # vector instructions a head (the rotation, x * cos)


@dataclass
class RopeRange:
    """A rope over output columns ``c0 .. c0 + H * D`` (heads of D columns)."""

    c0: int
    H: int
    rope: RopeOp


@dataclass
class RopeEpilogue:
    ranges: list[RopeRange]
    D: int
    cos: SSAValue
    sin: SSAValue

    def roped(self, n0: int, ns: int) -> list[tuple[int, int]]:
        """(first column within the tile, heads) of the roped head runs of output
        columns n0 .. n0+ns (whole heads: a chunk is a multiple of 128 columns)."""
        out = []
        for r in self.ranges:
            lo, hi = max(n0, r.c0), min(n0 + ns, r.c0 + r.H * self.D)
            if hi > lo:
                out.append((lo - n0, (hi - lo) // self.D))
        return out

    def fields(self, cfg: HardwareConfig, M: int, N: int) -> dict[str, Any]:
        """`MatmulProblem` fields: the evacuation's vector work (the copy, and on the
        roped fraction f of the columns x * cos, the rotation and the add, two-input
        ops, with their per-head instruction overheads spread per column) and SRAM."""
        f = sum(r.H for r in self.ranges) * self.D / N
        mul = cfg.vector.op_cost.binary["mul"]
        overhead = float(cfg.vector.latency_cycles + cfg.vector.access_cycles)
        per_col = f * (3 * 2 * mul + OVERHEAD_PER_HEAD * overhead / self.D)
        isz = 2
        return dict(evac_cost=cfg.vector.op_cost.unary["copy"] + per_col, evac_ops=6,
                    fused_sram_per_col=isz + 1,
                    fused_sram=2 * REP * self.D * isz + self.D * isz + 2 * -(-M // 128) * 128 * isz + 8 * 64)


def find(lw: LoweringContext, group: FusedOp, mm: Operation, tn: int, loc: str) -> RopeEpilogue | None:
    """The ropes of the group's product's columns (module docstring), or None (with a
    `missed` remark where ropes read the product but cannot run in its evacuations); a
    head must not straddle two accumulator blocks of `tn` columns (chunks are made of them)."""
    y = group.block.last_op
    assert isinstance(y, YieldOp)
    if list(y.values) != [mm.results[0]]:
        return None
    res = group.results[0]
    M, N = shape_of(res.type) if len(shape_of(res.type)) == 2 else (0, 0)
    ranges: list[RopeRange] = []
    plain: list[tuple[int, int]] = []
    tables: set[tuple[SSAValue, SSAValue]] = set()
    D = 0
    why = ""
    for use in res.uses:
        s = use.operation
        if not isinstance(s, gi.SliceOp) or int(s.dim.value.data) not in (1, -1) or int(s.step.value.data) != 1:
            why = why or f"{s.name} reads the product (only last-dim slices may)"
            continue
        c0, c1 = int(s.start.value.data), min(int(s.end.value.data), N)
        got = _rope_of(s.results[0], M)
        if got is None:
            plain.append((c0, c1))
            continue
        rope, H, d = got
        if D not in (0, d) or H * d != c1 - c0 or c0 % d or elem_of(rope.result.type) != elem_of(res.type):
            why = why or "the ropes' heads differ in size, or a slice is not whole heads of the product's type"
        D = d
        ranges.append(RopeRange(c0, H, rope))
        tables.add((rope.cos, rope.sin))
    if not ranges:
        return None
    cos, sin = next(iter(tables))
    if len(tables) != 1:
        why = why or "the ropes read different cos / sin"
    elif D % 2 or tn % D:
        why = why or f"a head of {D} columns does not divide the accumulator's {tn}-column blocks"
    elif any(a < r.c0 + r.H * D and r.c0 < b for a, b in plain for r in ranges):
        why = why or "another reader of the rotated columns would see them rotated"
    elif not all(_available(lw, t) for t in (cos, sin)):
        why = why or "cos / sin are computed later in the program"
    elif any(tuple(d for d in shape_of(t.type) if d != 1) != (M, D) or list(shape_of(t.type))[-2:] != [M, D]
             for t in (cos, sin)):
        why = why or f"cos / sin are not [{M}, {D}] rows of the product's positions"
    if why:
        remarks.emit("lower-graph-to-tile", "missed",
                     f"rotary embeddings of the projection's columns stay kernels of their own: {why}", loc)
        return None
    ranges.sort(key=lambda r: r.c0)
    return RopeEpilogue(ranges, D, cos, sin)


def _available(lw: LoweringContext, v: SSAValue) -> bool:
    """Whether `v` is lowered, or a weight / constant (or a reshape of one of those) that
    can be lowered ahead of its place (`args`)."""
    while v not in lw.values and isinstance(v.owner, g.ReshapeOp):
        v = v.owner.operands[0]
    return v in lw.values or isinstance(v.owner, (g.WeightOp, g.ConstantOp))


def _lower_ahead(lw: LoweringContext, v: SSAValue) -> None:
    from tilecc.passes.graph_to_tile.conversion import lower_op

    if v in lw.values or not isinstance(v.owner, Operation):
        return
    if isinstance(v.owner, g.ReshapeOp):
        _lower_ahead(lw, v.owner.operands[0])
    lower_op(lw, v.owner)


def _rope_of(v: SSAValue, M: int) -> tuple[RopeOp, int, int] | None:
    """(rope, heads, D) when slice result `v` ``[M, H*D]`` is read only through
    ``reshape [1?, M, H, D] -> permute [.., H, M, D]`` by one rope as its x."""
    if not v.has_one_use():
        return None
    r = v.get_user_of_unique_use()
    if not isinstance(r, g.ReshapeOp) or not r.results[0].has_one_use():
        return None
    shape = list(shape_of(r.results[0].type))
    if len(shape) not in (3, 4) or (len(shape) == 4 and shape[0] != 1) or shape[-3] != M:
        return None
    p = r.results[0].get_user_of_unique_use()
    lead = len(shape) - 3
    want = tuple(range(lead)) + (lead + 1, lead, lead + 2)
    if not isinstance(p, g.PermuteOp) or tuple(p.permutation) != want or not p.results[0].has_one_use():
        return None
    rope = p.results[0].get_user_of_unique_use()
    if not isinstance(rope, RopeOp) or rope.x is not p.results[0]:
        return None
    return rope, shape[-2], shape[-1]


def bind(lw: LoweringContext, ep: RopeEpilogue, out: SSAValue, loc: str) -> None:
    """Each rope's result: the transposed view ``[.., H, M, D]`` of its columns of `out`
    (``[M, N]``)."""
    (sm, sn), off = lw.layout(out)
    M = shape_of(out.type)[0]
    for r in ep.ranges:
        shape = list(shape_of(r.rope.result.type))
        strides = [M * sm, ep.D * sn, sm, sn][4 - len(shape):]
        lw.values[r.rope.result] = lw.strided(out, shape, strides, off + r.c0 * sn)
    remarks.emit("lower-graph-to-tile", "passed", lambda: (
        "rotary embedding of " + ", ".join(f"{r.H} heads (columns {r.c0}..{r.c0 + r.H * ep.D})" for r in ep.ranges)
        + " applied as the projection's accumulator tiles are evacuated (no rope kernels)"), loc)


def args(lw: LoweringContext, ep: RopeEpilogue, M: int) -> list[SSAValue]:
    """The kernel's extra arguments: cos and sin as ``[M, D]`` rows (weights later in
    the program lowered now)."""
    for t in (ep.cos, ep.sin):
        _lower_ahead(lw, t)
    return [lw.view(lw.materialise(t), (M, ep.D)) for t in (ep.cos, ep.sin)]


class RopeMatmulKernel(FusedMatmulKernel):
    """The fused matmul whose evacuations rotate the roped heads (module docstring).
    Chunks are emitted one by one (their columns static), so each evacuation knows
    which of its columns are heads of which rope."""

    def __init__(self, *a: Any, rope: RopeEpilogue, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.rope = rope
        kb, p, D = self.kb, self.p, rope.D
        self.cos_arg, self.sin_arg = kb.args[-2:]
        TM, elem = p.TM, self.eo
        # cos / sin of every position, loaded once: m-tile u's rows at columns u*TM ..
        # (an evacuation's window starts at its first row's index, m0)
        self.cos_all = kb.alloc([TM, p.n_mtiles * TM], elem, tile.SRAM, "rope_cos_rows")
        self.sin_all = kb.alloc([TM, p.n_mtiles * TM], elem, tile.SRAM, "rope_sin_rows")
        for u in range(p.n_mtiles):
            ms = min(TM, p.M - u * TM)
            for arg, buf in ((self.cos_arg, self.cos_all), (self.sin_arg, self.sin_all)):
                kb.add(tile.LoadOp(arg, [self.c(u * TM), self.c(0)], self.sub(buf, u * TM, TM, D), self.c(ms),
                                   self.c(D), 0, 1, queue=self.hoist_q))
        self.crep = [kb.alloc([TM, REP * D], elem, tile.SRAM, "rope_cos") for _ in range(2)]
        self.nsin = kb.alloc([TM, D // 2], elem, tile.SRAM, "rope_nsin")
        self.t = kb.alloc([TM, self.TNL], elem, tile.SRAM, "rope_t")

    def block(self, b: Any, plan: Any) -> None:
        from tilecc.passes.graph_to_tile.matmul import _Aff, _pos_static

        for item in plan.prologue:
            self.prep_only(b, item)
        n = 0
        for c in range(self.nch):
            items = plan.chunk_items[c] if c < len(plan.chunk_items) else ()
            first = b.i.is_const and b.off == 0 and self.s.stagger and c == 0
            self.chunk(b, plan, _pos_static(c), _Aff(n), self.widths[c], items, first)
            n += self.widths[c]

    def sub(self, buf: SSAValue, col: int, rows: int, cols: int) -> SSAValue:
        return self.kb.add(tile.SubviewOp(buf, self.c(0), self.c(col), [rows, cols])).results[0]

    def evacuate(self, acc: SSAValue, parity: int, m0: SSAValue, n0: SSAValue, ms: int, ns: int) -> None:
        kb, D, half = self.kb, self.rope.D, self.rope.D // 2
        col0 = tile.const_index(n0)
        assert col0 is not None, "RopeMatmulKernel emits its chunks with static columns"
        out = self.obuf[parity]
        r = self.c(ms)
        kb.add(tile.UnaryOp("copy", acc, out, r, self.c(ns)))
        runs = self.rope.roped(col0, ns)
        if runs:
            crep, TM = self.crep[parity], self.p.TM
            cos = kb.add(tile.SubviewOp(self.cos_all, self.c(0), m0, [TM, D])).results[0]
            sin_lo = kb.add(tile.SubviewOp(self.sin_all, self.c(0), m0, [TM, half])).results[0]
            sin_hi = kb.add(tile.SubviewOp(self.sin_all, self.c(0), kb.addi(m0, self.c(half)), [TM, half])).results[0]
            kb.add(tile.UnaryOp("copy", cos, self.sub(crep, 0, TM, D), r, self.c(D)))
            kb.add(tile.UnaryOp("neg", sin_lo, self.nsin, r, self.c(half)))
            w = D
            while w < REP * D:  # cos for REP heads side by side
                n = min(w, REP * D - w)
                kb.add(tile.UnaryOp("copy", self.sub(crep, 0, TM, n), self.sub(crep, w, TM, n), r, self.c(n)))
                w += n
            for lc, heads in runs:
                for j in range(heads):  # t = rotate_half(x) * sin, head by head
                    c = lc + j * D
                    kb.add(tile.BinaryOp("mul", self.sub(out, c + half, TM, half), self.nsin,
                                         self.sub(self.t, c, TM, half), r, self.c(half)))
                    kb.add(tile.BinaryOp("mul", self.sub(out, c, TM, half), sin_hi,
                                         self.sub(self.t, c + half, TM, half), r, self.c(half)))
                for g0 in range(0, heads, REP):  # x = x * cos, REP heads at a time
                    n = min(REP, heads - g0) * D
                    x = self.sub(out, lc + g0 * D, TM, n)
                    kb.add(tile.BinaryOp("mul", x, self.sub(crep, 0, TM, n), x, r, self.c(n)))
                y = self.sub(out, lc, TM, heads * D)
                kb.add(tile.BinaryOp("add", y, self.sub(self.t, lc, TM, heads * D), y, r, self.c(heads * D)))
        kb.add(tile.StoreOp(out, self.argO, [*self.ivs, m0, n0], r, self.c(ns), self.rank - 2, self.rank - 1))

