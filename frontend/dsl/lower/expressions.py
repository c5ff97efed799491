"""Expressions: numbers and index arithmetic folded at compile time, vector ops on tiles
(with row and column broadcasts), casts, reductions, unary functions and the calls.

    y = exp(x) * 0.5 + bias      ->  tile.unary "exp" %x into %t ...
                                     tile.scalar "mul" %t, 5.0e-01 into %t1 ...
                                     tile.binary "add" %t1, %bias into %y ... mode "tile"
    s = sum(x)                   ->  tile.reduce "sum" %x into %s ...   (a [rows x 1] column)
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import SSAValue

from tilecc.errors import DslError, DslNameError, DslShapeError, DslTypeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower.values import (
    BIN,
    COMMUTATIVE,
    FLIP,
    FLOATS,
    UNARY,
    Const,
    Lazy,
    Product,
    TileVar,
    Value,
    op_symbol,
)
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


class Expressions:
    """Evaluating expressions."""

    def static_int(self: KernelLowering, e: A.Expr, what: str) -> int:
        v = self.ev(e)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int):
            raise self.err(DslTypeError, e.pos, f"{what} must be a number known when the kernel is compiled "
                           "(sizes, constants, or attributes of an enclosing loop that bounds this one)")
        return v

    def ev(self: KernelLowering, e: A.Expr, dest: Value | None = None, hint: str | None = None) -> object:
        if isinstance(e, A.Number):
            return e.value
        if isinstance(e, A.Name):
            return self.lookup(e.id, e.pos)
        if isinstance(e, A.Attr):
            return self.attr(e)
        if isinstance(e, A.Neg):
            v = self.ev(e.value)
            if isinstance(v, (int, float)):
                return -v
            return self.binop("mul", v, -1.0, e.pos, e, dest=dest, hint=hint)
        if isinstance(e, A.BinOp):
            fused = self.scaled_transpose(e, dest)
            if fused is not None:
                return fused
            a, b = self.ev(e.lhs), self.ev(e.rhs)
            return self.binop(BIN[e.op], a, b, e.pos, e, dest=dest, hint=hint)
        if isinstance(e, A.Cast):
            fuse = isinstance(e.value, (A.Call, A.BinOp)) and not (
                isinstance(e.value, A.Call) and e.value.fn in ("load", "matmul", "matmul_t", "zeros", "full", "empty"))
            into = dest if fuse and dest is not None and dest.dtype == e.dtype and e.dtype in FLOATS else None
            v = self.ev(e.value, dest=into, hint=e.dtype if fuse and e.dtype in FLOATS else None)
            if isinstance(v, Value) and v.dtype == e.dtype and fuse:
                return v
            if isinstance(v, (int, float)):
                return float(v) if e.dtype in FLOATS else int(v)
            if isinstance(v, Lazy) and v.dtype == e.dtype:
                return v
            if isinstance(v, Lazy) and v.is_row and v.cast_to is None and e.dtype in FLOATS:
                return dataclasses.replace(v, cast_to=e.dtype, node=e)
            return self.cast(self.materialise(v, e.value), e.dtype, e, dest)
        if isinstance(e, A.Call):
            return self.call(e, dest, hint)
        if isinstance(e, A.Subscript):
            if e.name in self.tensors:
                raise self.err(DslTypeError, e.pos, f"{e.name}[...] is an HBM slice; read it with load({e.name}[...])")
            return self.tile_window(e.name, e.indices, e.pos)
        if isinstance(e, A.TypeExpr):
            raise self.err(DslTypeError, e.pos, "a tile type is only an argument of zeros() or full()")
        if isinstance(e, A.FullSlice):
            raise self.err(DslTypeError, e.pos, "':' is only an index")
        raise AssertionError(e)  # pragma: no cover

    def attr(self: KernelLowering, e: A.Attr) -> object:
        if isinstance(e.value, A.Name) and e.value.id == "target" and not self.is_defined("target"):
            cfg = self.cfg
            table = {"partitions": cfg.sram.partitions, "acc_partitions": cfg.accumulator.partitions,
                     "array_rows": cfg.matrix.rows, "array_cols": cfg.matrix.cols,
                     "sram_bytes": cfg.sram.bytes_per_partition, "acc_bytes": cfg.accumulator.bytes_per_partition}
            if e.attr not in table:
                raise self.err(DslNameError, e.pos, f"target has {', '.join(table)}, not .{e.attr}")
            return table[e.attr]
        v = self.ev(e.value)
        if isinstance(v, TileVar):
            if e.attr == "start":
                return v.start
            if e.attr == "size":
                return v.size
            if e.attr == "end":
                return self.iadd(v.start, v.size)
            if e.attr == "index":
                return v.index
            raise self.err(DslNameError, e.pos, f"a loop tile has .start, .size, .end and .index, not .{e.attr}")
        if isinstance(v, (Value, Lazy)):
            rows, cols = (v.rows, v.cols) if isinstance(v, Value) else v.actual
            if e.attr in ("rows", "cols"):
                return rows if e.attr == "rows" else cols
            raise self.err(DslNameError, e.pos, f"a tile has .rows and .cols, not .{e.attr}")
        raise self.err(DslTypeError, e.pos, f"'.{e.attr}' of something that is not a loop tile or a tile")

    def shift(self: KernelLowering, lv: TileVar, off: object, fn: str, pos: A.Pos) -> TileVar:
        """`m + k`: the tile of loop m moved by index k (a convolution window)."""
        if isinstance(off, float) and off.is_integer():
            off = int(off)
        if not isinstance(off, (int, SSAValue)):
            raise self.err(DslTypeError, pos, "a loop tile moves by an index")
        start = self.iadd(lv.start, off) if fn == "add" else self.isub(lv.start, off)
        sign = 1 if fn == "add" else -1
        extent = lv.extent + sign * off if isinstance(off, int) else lv.extent
        return TileVar(lv.name, start, lv.size, lv.tile, extent, lv.index, lv.pos)

    def scalar_op(self: KernelLowering, fn: str, a: object, b: object, pos: A.Pos) -> object:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            r = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                 "div": lambda: a / b if b != 0 else math.inf, "pow": lambda: a ** b,
                 "floordiv": lambda: a // b if b != 0 else math.inf}.get(fn)
            if r is None:
                raise self.err(DslTypeError, pos, "comparisons of numbers are not supported")
            out = r()
            return out
        # run-time index arithmetic
        if fn not in ("add", "sub", "mul"):
            raise self.err(DslTypeError, pos, f"index arithmetic supports +, - and *, not '{fn}'")
        if isinstance(a, float) or isinstance(b, float):
            raise self.err(DslTypeError, pos, "index arithmetic on a fractional number")
        if fn == "mul" and not (isinstance(a, int) or isinstance(b, int)):
            raise self.err(DslTypeError, pos, "the product of two loop-varying indices is not an affine index")
        return {"add": self.iadd, "sub": self.isub, "mul": self.imul}[fn](a, b)

    def binop(self: KernelLowering, fn: str, a: object, b: object, pos: A.Pos, node: A.Node,
              dest: Value | None = None, hint: str | None = None) -> object:
        if fn in ("add", "sub") and isinstance(a, TileVar) and not isinstance(b, (TileVar, Value, Lazy, Product)):
            return self.shift(a, b, fn, pos)
        if fn == "add" and isinstance(b, TileVar) and not isinstance(a, (TileVar, Value, Lazy, Product)):
            return self.shift(b, a, fn, pos)
        for v in (a, b):
            if isinstance(v, TileVar):
                raise self.err(DslTypeError, pos, f"'{v.name}' is a loop tile; use {v.name}.start, .size, .end or .index")
        if fn == "floordiv" and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
            raise self.err(DslTypeError, pos, "'//' divides numbers known when the kernel is compiled, not tiles "
                           "or run-time indices")
        folded = self.fold(fn, a, b, pos)
        if folded is not None:
            return folded
        if (dest is not None and dest.space == tile.ACC and fn in ("add", "sub") and isinstance(a, Product)
                and isinstance(b, Const) and b.kind == "tile" and b.data.shape == (a.m, a.n) and hint in (None, "f32")):
            return self.product_plus_const(fn, a, b, dest, node, pos)
        if isinstance(a, Const):
            a = self.const_value(a, b, node)
        if isinstance(b, Const):
            b = self.const_value(b, a, node)
        tile_a = isinstance(a, (Value, Lazy, Product))
        tile_b = isinstance(b, (Value, Lazy, Product))
        if not tile_a and not tile_b:
            return self.scalar_op(fn, a, b, pos)
        if not tile_b or not tile_a:
            t, s, swap = (a, b, False) if tile_a else (b, a, True)
            if not isinstance(s, (int, float)):
                raise self.err(DslTypeError, pos, "a tile combines with a constant, not with a run-time index")
            t = self.materialise(t, node)
            out = self.out_buf(node, t.dtype if hint is None or fn in ("eq", "ne", "lt", "le", "gt", "ge") else hint,
                               (t.rows, t.cols), t.shape, dest, pos)
            self.add(tile.ScalarOp(fn, t.buf, float(s), out.buf, self.idx(t.rows), self.idx(t.cols), swap=swap))
            return out
        # two tiles: broadcast lazily loaded rows against the other operand
        if isinstance(a, Lazy) and a.is_row and not (isinstance(b, Lazy) and b.is_row):
            b = self.materialise(b, node)
            a = self.materialise(a, node, bcast=b)
        elif isinstance(b, Lazy) and b.is_row and not (isinstance(a, Lazy) and a.is_row):
            a = self.materialise(a, node)
            b = self.materialise(b, node, bcast=a)
        else:
            a, b = self.materialise(a, node), self.materialise(b, node)
        assert isinstance(a, Value) and isinstance(b, Value)
        if a.dtype != b.dtype:
            raise self.err(DslTypeError, pos, f"dtype mismatch in '{op_symbol(fn)}': {a.describe()} and {b.describe()}; "
                           f"cast one side, e.g. {a.dtype}(...)")
        swap = False
        mode = "tile"
        if (a.rows, a.cols) == (b.rows, b.cols):
            pass
        elif b.cols == 1 and a.rows == b.rows and b.shape[1] == 1:
            mode = "column"
        elif a.cols == 1 and a.rows == b.rows and a.shape[1] == 1:
            a, b, mode, swap = b, a, "column", True
        else:
            raise self.err(DslShapeError, pos, f"shape mismatch in '{op_symbol(fn)}': {a.describe()} and {b.describe()}")
        if swap and fn in COMMUTATIVE:
            swap = False
        elif swap and fn in FLIP:
            fn, swap = FLIP[fn], False
        out_dtype = a.dtype if hint is None else hint
        out = self.out_buf(node, out_dtype, (a.rows, a.cols), a.shape, dest, pos)
        self.add(tile.BinaryOp(fn, a.buf, b.buf, out.buf, self.idx(a.rows), self.idx(a.cols), mode, swap))
        return out

    def fold(self: KernelLowering, fn: str, a: object, b: object, pos: A.Pos) -> object | None:
        """Constant tiles combine at compile time; ``x + 0``, ``x - 0``, ``x * 1`` of an
        all-constant operand are x."""
        num = (int, float)
        if isinstance(a, Const) and isinstance(b, (Const, *num)) or isinstance(b, Const) and isinstance(a, num):
            x = a.data if isinstance(a, Const) else np.float32(a)
            y = b.data if isinstance(b, Const) else np.float32(b)
            ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                   "max": np.maximum, "min": np.minimum, "eq": np.equal, "ne": np.not_equal,
                   "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
            if fn not in ops:
                return None
            out = ops[fn](x, y).astype(np.float32)
            kinds = {c.kind for c in (a, b) if isinstance(c, Const)}
            kind = "tile" if "tile" in kinds or kinds == {"row", "col"} else kinds.pop()
            return Const(out, pos, kind)
        for c, other, ident in ((b, a, True), (a, b, False)):
            if not isinstance(c, Const) or isinstance(other, (Const, *num)):
                continue
            if fn in ("add",) or fn == "sub" and ident:
                if not c.data.any():
                    return other
            if fn == "mul" and np.all(c.data == 1):
                return other
        return None

    def out_buf(self: KernelLowering, node: A.Node, dtype: str, sizes: tuple[int, int], shape: tuple[int, int],
                dest: Value | None, pos: A.Pos, space: str = tile.SRAM) -> Value:
        if dest is not None and dest.dtype in FLOATS and dtype in FLOATS:
            self.check_same(dest, dest.dtype, sizes, pos, "assignment")
            dest.rows, dest.cols, dest.zero = sizes[0], sizes[1], False
            return dest
        if dtype not in FLOATS:
            raise self.err(DslTypeError, pos, f"vector arithmetic on {dtype} tiles is not supported; cast to f32")
        buf = self.buffer(node, shape, dtype, space, self.name_hint)
        return Value(buf, dtype, space, shape, sizes[0], sizes[1], node.pos)

    def cast(self: KernelLowering, v: Value, dtype: str, node: A.Node, dest: Value | None = None) -> Value:
        if dtype not in FLOATS:
            raise self.err(DslTypeError, node.pos, f"casts to {dtype} are not supported (tiles are float)")
        if dest is None:
            out = Value(self.buffer(node, v.shape, dtype, tile.SRAM, f"cast_{dtype}"), dtype, tile.SRAM,
                        v.shape, v.rows, v.cols, node.pos)
        else:
            out = self.out_buf(node, dtype, (v.rows, v.cols), v.shape, dest, node.pos)
        self.add(tile.UnaryOp("copy", v.buf, out.buf, self.idx(v.rows), self.idx(v.cols)))
        return out

    def call(self: KernelLowering, e: A.Call, dest: Value | None, hint: str | None) -> object:
        fn = e.fn
        if fn == "load":
            self.nargs(e, 1)
            sub = e.args[0]
            if not isinstance(sub, A.Subscript):
                raise self.err(DslTypeError, e.pos, "load() takes a slice of an HBM tensor: load(x[m, k])")
            if sub.name not in self.tensors:
                self.lookup(sub.name, sub.pos)
                raise self.err(DslTypeError, sub.pos, f"'{sub.name}' is not an HBM tensor")
            lz = self.slice(sub.name, sub.indices, sub.pos)
            lz.node = e
            if e.kwargs.get("transpose") is not None:
                return self.materialise(lz, e, layout="transposed")
            return lz
        if fn in ("zeros", "full", "empty"):
            return self.fill(e)
        if fn in ("matmul", "matmul_t"):
            return self.matmul(e)
        if fn == "transpose":
            self.nargs(e, 1)
            return self.transpose(self.ev(e.args[0]), e, dest)
        if fn in ("row_ids", "col_ids"):
            return self.ids(e)
        if fn in ("sqrt", "rsqrt", "exp") and len(e.args) == 1:
            v = self.ev(e.args[0])
            if isinstance(v, (int, float)):
                return {"sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x), "exp": math.exp}[fn](v)
            return self.unary(fn, v, e, dest, hint)
        if fn in UNARY:
            self.nargs(e, 1)
            return self.unary(fn, self.ev(e.args[0]), e, dest, hint)
        if fn in ("sum", "max", "min", "mean") and len(e.args) == 1:
            return self.reduce(fn, self.ev(e.args[0]), e, dest, hint)
        if fn in ("max", "min"):
            self.nargs(e, 2)
            return self.binop(fn, self.ev(e.args[0]), self.ev(e.args[1]), e.pos, e, dest, hint)
        raise self.err(DslNameError, e.pos, f"undefined function '{fn}'")

    def nargs(self: KernelLowering, e: A.Call, n: int) -> None:
        if len(e.args) != n:
            raise self.err(DslTypeError, e.pos, f"{e.fn}() takes {n} argument(s), got {len(e.args)}")

    def unary(self: KernelLowering, fn: str, v: object, e: A.Call, dest: Value | None, hint: str | None) -> Value:
        t = self.materialise(v, e.args[0])
        out = self.out_buf(e, hint or t.dtype, (t.rows, t.cols), t.shape, dest, e.pos)
        self.add(tile.UnaryOp(fn, t.buf, out.buf, self.idx(t.rows), self.idx(t.cols)))
        return out

    def reduce(self: KernelLowering, fn: str, v: object, e: A.Call, dest: Value | None, hint: str | None = None) -> Value:
        t = self.materialise(v, e.args[0])
        if t.dtype not in FLOATS:
            raise self.err(DslTypeError, e.pos, f"{fn}() of {t.dtype} tiles is not supported")
        out = self.out_buf(e, hint or t.dtype, (t.rows, 1), (t.shape[0], 1), dest, e.pos)
        self.add(tile.ReduceOp("sum" if fn == "mean" else fn, t.buf, out.buf, self.idx(t.rows), self.idx(t.cols)))
        if fn == "mean":
            self.add(tile.ScalarOp("mul", out.buf, 1.0 / t.cols, out.buf, self.idx(t.rows), self.idx(1)))
        return out

    def is_numeric(self: KernelLowering, x: A.Expr) -> bool:
        """x evaluates to a compile-time number without emitting anything."""
        if isinstance(x, A.Number):
            return True
        if isinstance(x, A.Name):
            try:
                return isinstance(self.lookup(x.id, x.pos), (int, float))
            except DslError:
                return False
        if isinstance(x, A.Neg):
            return self.is_numeric(x.value)
        if isinstance(x, A.BinOp):
            return self.is_numeric(x.lhs) and self.is_numeric(x.rhs)
        if isinstance(x, A.Call):
            return x.fn in ("sqrt", "rsqrt", "exp") and not x.kwargs and all(self.is_numeric(a) for a in x.args)
        return False
