"""The matrix engine: ``matmul(a, b)`` (a^T taken on chip) and ``matmul_t(aT, b)`` become
products (`Product`) that are emitted into an accumulator tile, a contraction longer
than the array's rows split in parts that accumulate, and columns folded by the array's
width.

    acc += matmul(load(a[m, k]), load(b[k, n]))
    -->
    tile.matmul %aT, %b into %acc sizes(%m, %k, %n) accumulate(%not_first)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import SSAValue

from tilecc.errors import DslMatmulError, DslShapeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import constants, expressions, tiles, transpose
from tilecc.frontend.dsl.lower.values import FLOATS, Const, Lazy, Product, Value
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


def matmul(lw: KernelLowering, e: A.Call) -> Product:
    """The operands on chip, as (lhsT, rhs) parts of at most the array's rows of the
    contraction each (a longer K is split, the parts accumulate)."""
    expressions.nargs(lw, e, 2)
    first, second = (expressions.ev(lw, a) for a in e.args)
    R = lw.cfg.matrix.rows
    kc = min(R, lw.cfg.sram.partitions)
    for v, a in ((first, e.args[0]), (second, e.args[1])):
        if isinstance(v, Lazy) and v.is_row:
            raise lw.err(DslMatmulError, a.pos, "matmul operands must be 2-D tiles")
        if not isinstance(v, (Lazy, Value, Const, Product)):
            raise lw.err(DslMatmulError, a.pos, "matmul operands must be tiles")
        dt = v.dtype if isinstance(v, (Lazy, Value)) else "f32"
        if dt not in FLOATS:
            raise lw.err(DslMatmulError, a.pos, f"the matrix engine takes bf16, f16 or f32 operands, not {dt}")
    if e.fn == "matmul":
        a = tiles.materialise(lw, first, e.args[0])
        engine_operand(lw, a, e.args[0])
        k_total, k_static = a.cols, a.shape[1]
        if k_static <= kc:
            lhs_parts = [transpose.transpose(lw, a, e.args[0], None)]
        else:
            windows = [tiles.window(lw, a, c0, min(kc, k_static - c0), min(kc, a.cols - c0))
                       for c0 in range(0, k_static, kc) if c0 < a.cols]
            lhs_parts = transpose.transpose_blocks(lw, windows, e.args[0], split=True,
                                                   total=-(-k_static // kc) * a.shape[0])
    else:
        aT = tiles.materialise(lw, first, e.args[0])
        engine_operand(lw, aT, e.args[0])
        k_total, k_static = aT.rows, aT.shape[0]
        lhs_parts = [aT]
    if isinstance(second, Lazy) and second.shape[0] > kc and e.fn == "matmul":
        rhs_parts = [tiles.materialise(lw, tiles.sub_lazy(lw, second, c0, min(kc, second.shape[0] - c0),
                                                          min(kc, second.actual[0] - c0), i), e.args[1])
                     for i, c0 in enumerate(range(0, second.shape[0], kc)) if c0 < second.actual[0]]
    else:
        rhs_parts = [tiles.materialise(lw, second, e.args[1])]
    for v in rhs_parts:
        engine_operand(lw, v, e.args[1])
    if lhs_parts[0].dtype != rhs_parts[0].dtype:
        raise lw.err(DslMatmulError, e.pos, f"matmul operands must have one dtype, got {lhs_parts[0].dtype} and "
                     f"{rhs_parts[0].dtype}; cast one of them")
    m, n = lhs_parts[0].cols, rhs_parts[0].cols
    krhs = sum(v.rows for v in rhs_parts)
    if krhs != k_total or len(rhs_parts) != len(lhs_parts):
        raise lw.err(DslMatmulError, e.pos, f"matmul contraction sizes differ: [{m} x {k_total}] @ "
                     f"[{krhs} x {n}]")
    for lt in lhs_parts:
        if lw.cfg.matrix.dataflow == "ws" and lt.shape[0] > R:
            raise lw.err(DslMatmulError, e.pos, f"the contraction tile K = {lt.shape[0]} exceeds the matrix "
                         f"engine's {R} rows on target '{lw.target}'; tile K by {R}")
    accp = lw.cfg.accumulator.partitions
    if lhs_parts[0].shape[1] > accp:
        raise lw.err(DslMatmulError, e.pos, f"the product has {lhs_parts[0].shape[1]} rows (M) but the "
                     f"accumulator has {accp} partitions on target '{lw.target}'; tile M by {accp}")
    del k_static
    lw.tally.matmul(m, k_total, n, lhs_parts[0].dtype)
    return Product(list(zip(lhs_parts, rhs_parts)), m, k_total, n,
                   (lhs_parts[0].shape[1], rhs_parts[0].shape[1]), e.pos)


def engine_operand(lw: KernelLowering, v: Value, a: A.Node) -> None:
    if v.space != tile.SRAM:
        raise lw.err(DslMatmulError, a.pos, f"the matrix engine reads its operands from SRAM, this one is "
                     f"{v.describe()}; cast it first, e.g. bf16(...)")


def emit_matmul(lw: KernelLowering, p: Product, acc: Value, accumulate: bool | SSAValue) -> None:
    """acc[:m, :n] (+)= p: one matmul per contraction part and column fold of the
    array's width; parts after the first accumulate."""
    C = lw.cfg.matrix.cols if lw.cfg.matrix.dataflow == "ws" else p.n
    for i, (lhsT, rhs_v) in enumerate(p.parts):
        flag = accumulate if i == 0 else True
        if isinstance(flag, bool):
            flag = lw.flag(flag)
        for c0 in range(0, p.n, C):
            w = min(C, p.n - c0)
            rhs, out = rhs_v.buf, acc.buf
            if p.n > C:
                rhs = lw.add(tile.SubviewOp(rhs_v.buf, lw.idx(0), lw.idx(c0), [rhs_v.shape[0], w])).results[0]
                out = lw.add(tile.SubviewOp(acc.buf, lw.idx(0), lw.idx(c0), [acc.shape[0], w])).results[0]
            lw.add(tile.MatmulOp(lhsT.buf, rhs, out, lw.idx(p.m), lw.idx(lhsT.rows), lw.idx(w), flag))
    acc.rows, acc.cols = p.m, p.n


def check_acc_target(lw: KernelLowering, dest: Value, p: Product, pos: A.Pos) -> None:
    if dest.space != tile.ACC or dest.dtype != "f32":
        raise lw.err(DslMatmulError, pos, f"matmul accumulates into an f32 tile in acc, not into "
                     f"{dest.dtype} in {dest.space} (line {dest.pos.line}); declare it zeros(f32[..], acc)")
    if p.m > dest.shape[0] or p.n > dest.shape[1]:
        raise lw.err(DslShapeError, pos, f"shape mismatch: the product [{p.m} x {p.n}] does "
                     f"not fit the accumulator f32[{dest.shape[0]} x {dest.shape[1]}] (line {dest.pos.line})")


def product_plus_const(lw: KernelLowering, fn: str, p: Product, c: Const, dest: Value, node: A.Node,
                       pos: A.Pos) -> Value:
    """``dest = p +/- c`` in place: the product straight into the accumulator tile,
    then the constant added over the columns where it is not zero (a causal mask
    touches only the key tile the diagonal crosses)."""
    check_acc_target(lw, dest, p, pos)
    emit_matmul(lw, p, dest, accumulate=False)
    dest.zero = False
    nz = np.flatnonzero(c.data.any(axis=0))
    c0, c1 = int(nz[0]), int(nz[-1]) + 1
    win = tiles.window(lw, dest, c0, c1 - c0, c1 - c0) if (c0, c1) != (0, p.n) else dest
    cv = constants.const_value(lw, Const(np.ascontiguousarray(c.data[:, c0:c1]), c.pos, "tile"), win, node)
    lw.add(tile.BinaryOp(fn, win.buf, cv.buf, win.buf, lw.idx(p.m), lw.idx(c1 - c0), "tile", False))
    return dest
