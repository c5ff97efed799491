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
from tilecc.frontend.dsl.lower.values import FLOATS, Const, Lazy, Product, Value
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


class Matmuls:
    """Products and their matmuls."""

    def matmul(self: KernelLowering, e: A.Call) -> Product:
        """The operands on chip, as (lhsT, rhs) parts of at most the array's rows of the
        contraction each (a longer K is split, the parts accumulate)."""
        self.nargs(e, 2)
        first, second = (self.ev(a) for a in e.args)
        R = self.cfg.matrix.rows
        kc = min(R, self.cfg.sram.partitions)
        for v, a in ((first, e.args[0]), (second, e.args[1])):
            if isinstance(v, Lazy) and v.is_row:
                raise self.err(DslMatmulError, a.pos, "matmul operands must be 2-D tiles")
            if not isinstance(v, (Lazy, Value, Const, Product)):
                raise self.err(DslMatmulError, a.pos, "matmul operands must be tiles")
            dt = v.dtype if isinstance(v, (Lazy, Value)) else "f32"
            if dt not in FLOATS:
                raise self.err(DslMatmulError, a.pos, f"the matrix engine takes bf16, f16 or f32 operands, not {dt}")
        if e.fn == "matmul":
            a = self.materialise(first, e.args[0])
            self.engine_operand(a, e.args[0])
            k_total, k_static = a.cols, a.shape[1]
            if k_static <= kc:
                lhs_parts = [self.transpose(a, e.args[0], None)]
            else:
                windows = [self.window(a, c0, min(kc, k_static - c0), min(kc, a.cols - c0))
                           for c0 in range(0, k_static, kc) if c0 < a.cols]
                lhs_parts = self.transpose_blocks(windows, e.args[0], split=True,
                                                  total=-(-k_static // kc) * a.shape[0])
        else:
            aT = self.materialise(first, e.args[0])
            self.engine_operand(aT, e.args[0])
            k_total, k_static = aT.rows, aT.shape[0]
            lhs_parts = [aT]
        if isinstance(second, Lazy) and second.shape[0] > kc and e.fn == "matmul":
            rhs_parts = [self.materialise(self.sub_lazy(second, c0, min(kc, second.shape[0] - c0),
                                                        min(kc, second.actual[0] - c0), i), e.args[1])
                         for i, c0 in enumerate(range(0, second.shape[0], kc)) if c0 < second.actual[0]]
        else:
            rhs_parts = [self.materialise(second, e.args[1])]
        for v in rhs_parts:
            self.engine_operand(v, e.args[1])
        if lhs_parts[0].dtype != rhs_parts[0].dtype:
            raise self.err(DslMatmulError, e.pos, f"matmul operands must have one dtype, got {lhs_parts[0].dtype} and "
                           f"{rhs_parts[0].dtype}; cast one of them")
        m, n = lhs_parts[0].cols, rhs_parts[0].cols
        krhs = sum(v.rows for v in rhs_parts)
        if krhs != k_total or len(rhs_parts) != len(lhs_parts):
            raise self.err(DslMatmulError, e.pos, f"matmul contraction sizes differ: [{m} x {k_total}] @ "
                           f"[{krhs} x {n}]")
        for lt in lhs_parts:
            if self.cfg.matrix.dataflow == "ws" and lt.shape[0] > R:
                raise self.err(DslMatmulError, e.pos, f"the contraction tile K = {lt.shape[0]} exceeds the matrix "
                               f"engine's {R} rows on target '{self.target}'; tile K by {R}")
        accp = self.cfg.accumulator.partitions
        if lhs_parts[0].shape[1] > accp:
            raise self.err(DslMatmulError, e.pos, f"the product has {lhs_parts[0].shape[1]} rows (M) but the "
                           f"accumulator has {accp} partitions on target '{self.target}'; tile M by {accp}")
        del k_static
        return Product(list(zip(lhs_parts, rhs_parts)), m, k_total, n,
                       (lhs_parts[0].shape[1], rhs_parts[0].shape[1]), e.pos)

    def engine_operand(self: KernelLowering, v: Value, a: A.Node) -> None:
        if v.space != tile.SRAM:
            raise self.err(DslMatmulError, a.pos, f"the matrix engine reads its operands from SRAM, this one is "
                           f"{v.describe()}; cast it first, e.g. bf16(...)")

    def emit_matmul(self: KernelLowering, p: Product, acc: Value, accumulate: bool | SSAValue) -> None:
        """acc[:m, :n] (+)= p: one matmul per contraction part and column fold of the
        array's width; parts after the first accumulate."""
        C = self.cfg.matrix.cols if self.cfg.matrix.dataflow == "ws" else p.n
        for i, (lhsT, rhs_v) in enumerate(p.parts):
            flag = accumulate if i == 0 else True
            if isinstance(flag, bool):
                flag = self.flag(flag)
            for c0 in range(0, p.n, C):
                w = min(C, p.n - c0)
                rhs, out = rhs_v.buf, acc.buf
                if p.n > C:
                    rhs = self.add(tile.SubviewOp(rhs_v.buf, self.idx(0), self.idx(c0), [rhs_v.shape[0], w])).results[0]
                    out = self.add(tile.SubviewOp(acc.buf, self.idx(0), self.idx(c0), [acc.shape[0], w])).results[0]
                self.add(tile.MatmulOp(lhsT.buf, rhs, out, self.idx(p.m), self.idx(lhsT.rows), self.idx(w), flag))
        acc.rows, acc.cols = p.m, p.n

    def check_acc_target(self: KernelLowering, dest: Value, p: Product, pos: A.Pos) -> None:
        if dest.space != tile.ACC or dest.dtype != "f32":
            raise self.err(DslMatmulError, pos, f"matmul accumulates into an f32 tile in acc, not into "
                           f"{dest.dtype} in {dest.space} (line {dest.pos.line}); declare it zeros(f32[..], acc)")
        if p.m > dest.shape[0] or p.n > dest.shape[1]:
            raise self.err(DslShapeError, pos, f"shape mismatch: the product [{p.m} x {p.n}] does "
                           f"not fit the accumulator f32[{dest.shape[0]} x {dest.shape[1]}] (line {dest.pos.line})")

    def product_plus_const(self: KernelLowering, fn: str, p: Product, c: Const, dest: Value, node: A.Node, pos: A.Pos) -> Value:
        """``dest = p +/- c`` in place: the product straight into the accumulator tile,
        then the constant added over the columns where it is not zero (a causal mask
        touches only the key tile the diagonal crosses)."""
        self.check_acc_target(dest, p, pos)
        self.emit_matmul(p, dest, accumulate=False)
        dest.zero = False
        nz = np.flatnonzero(c.data.any(axis=0))
        c0, c1 = int(nz[0]), int(nz[-1]) + 1
        win = self.window(dest, c0, c1 - c0, c1 - c0) if (c0, c1) != (0, p.n) else dest
        cv = self.const_value(Const(np.ascontiguousarray(c.data[:, c0:c1]), c.pos, "tile"), win, node)
        self.add(tile.BinaryOp(fn, win.buf, cv.buf, win.buf, self.idx(p.m), self.idx(c1 - c0), "tile", False))
        return dest
