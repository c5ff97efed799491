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
from tilecc.frontend.dsl.lower import constants, matmul, statements, tiles, transpose
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


def static_int(lw: KernelLowering, e: A.Expr, what: str) -> int:
    v = ev(lw, e)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int):
        raise lw.err(DslTypeError, e.pos, f"{what} must be a number known when the kernel is compiled "
                     "(sizes, constants, or attributes of an enclosing loop that bounds this one)")
    return v


def ev(lw: KernelLowering, e: A.Expr, dest: Value | None = None, hint: str | None = None) -> object:
    if isinstance(e, A.Number):
        return e.value
    if isinstance(e, A.Name):
        return lw.lookup(e.id, e.pos)
    if isinstance(e, A.Attr):
        return attr(lw, e)
    if isinstance(e, A.Neg):
        v = ev(lw, e.value)
        if isinstance(v, (int, float)):
            return -v
        return binop(lw, "mul", v, -1.0, e.pos, e, dest=dest, hint=hint)
    if isinstance(e, A.BinOp):
        fused = transpose.scaled_transpose(lw, e, dest)
        if fused is not None:
            return fused
        a, b = ev(lw, e.lhs), ev(lw, e.rhs)
        return binop(lw, BIN[e.op], a, b, e.pos, e, dest=dest, hint=hint)
    if isinstance(e, A.Cast):
        fuse = isinstance(e.value, (A.Call, A.BinOp)) and not (
            isinstance(e.value, A.Call) and e.value.fn in ("load", "matmul", "matmul_t", "zeros", "full", "empty"))
        into = dest if fuse and dest is not None and dest.dtype == e.dtype and e.dtype in FLOATS else None
        v = ev(lw, e.value, dest=into, hint=e.dtype if fuse and e.dtype in FLOATS else None)
        if isinstance(v, Value) and v.dtype == e.dtype and fuse:
            return v
        if isinstance(v, (int, float)):
            return float(v) if e.dtype in FLOATS else int(v)
        if isinstance(v, Lazy) and v.dtype == e.dtype:
            return v
        if isinstance(v, Lazy) and v.is_row and v.cast_to is None and e.dtype in FLOATS:
            return dataclasses.replace(v, cast_to=e.dtype, node=e)
        return cast(lw, tiles.materialise(lw, v, e.value), e.dtype, e, dest)
    if isinstance(e, A.Call):
        return call(lw, e, dest, hint)
    if isinstance(e, A.Subscript):
        if e.name in lw.tensors:
            raise lw.err(DslTypeError, e.pos, f"{e.name}[...] is an HBM slice; read it with load({e.name}[...])")
        return tiles.tile_window(lw, e.name, e.indices, e.pos)
    if isinstance(e, A.TypeExpr):
        raise lw.err(DslTypeError, e.pos, "a tile type is only an argument of zeros() or full()")
    if isinstance(e, A.FullSlice):
        raise lw.err(DslTypeError, e.pos, "':' is only an index")
    raise AssertionError(e)  # pragma: no cover


def attr(lw: KernelLowering, e: A.Attr) -> object:
    if isinstance(e.value, A.Name) and e.value.id == "target" and not lw.is_defined("target"):
        cfg = lw.cfg
        table = {"partitions": cfg.sram.partitions, "acc_partitions": cfg.accumulator.partitions,
                 "array_rows": cfg.matrix.rows, "array_cols": cfg.matrix.cols,
                 "sram_bytes": cfg.sram.bytes_per_partition, "acc_bytes": cfg.accumulator.bytes_per_partition}
        if e.attr not in table:
            raise lw.err(DslNameError, e.pos, f"target has {', '.join(table)}, not .{e.attr}")
        return table[e.attr]
    v = ev(lw, e.value)
    if isinstance(v, TileVar):
        if e.attr == "start":
            return v.start
        if e.attr == "size":
            return v.size
        if e.attr == "end":
            return lw.iadd(v.start, v.size)
        if e.attr == "index":
            return v.index
        raise lw.err(DslNameError, e.pos, f"a loop tile has .start, .size, .end and .index, not .{e.attr}")
    if isinstance(v, (Value, Lazy)):
        rows, cols = (v.rows, v.cols) if isinstance(v, Value) else v.actual
        if e.attr in ("rows", "cols"):
            return rows if e.attr == "rows" else cols
        raise lw.err(DslNameError, e.pos, f"a tile has .rows and .cols, not .{e.attr}")
    raise lw.err(DslTypeError, e.pos, f"'.{e.attr}' of something that is not a loop tile or a tile")


def shift(lw: KernelLowering, lv: TileVar, off: object, fn: str, pos: A.Pos) -> TileVar:
    """`m + k`: the tile of loop m moved by index k (a convolution window)."""
    if isinstance(off, float) and off.is_integer():
        off = int(off)
    if not isinstance(off, (int, SSAValue)):
        raise lw.err(DslTypeError, pos, "a loop tile moves by an index")
    start = lw.iadd(lv.start, off) if fn == "add" else lw.isub(lv.start, off)
    sign = 1 if fn == "add" else -1
    extent = lv.extent + sign * off if isinstance(off, int) else lv.extent
    return TileVar(lv.name, start, lv.size, lv.tile, extent, lv.index, lv.pos)


def scalar_op(lw: KernelLowering, fn: str, a: object, b: object, pos: A.Pos) -> object:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        r = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
             "div": lambda: a / b if b != 0 else math.inf, "pow": lambda: a ** b,
             "floordiv": lambda: a // b if b != 0 else math.inf}.get(fn)
        if r is None:
            raise lw.err(DslTypeError, pos, "comparisons of numbers are not supported")
        out = r()
        return out
    # run-time index arithmetic
    if fn not in ("add", "sub", "mul"):
        raise lw.err(DslTypeError, pos, f"index arithmetic supports +, - and *, not '{fn}'")
    if isinstance(a, float) or isinstance(b, float):
        raise lw.err(DslTypeError, pos, "index arithmetic on a fractional number")
    if fn == "mul" and not (isinstance(a, int) or isinstance(b, int)):
        raise lw.err(DslTypeError, pos, "the product of two loop-varying indices is not an affine index")
    if not isinstance(a, (int, SSAValue)) or not isinstance(b, (int, SSAValue)):
        raise lw.err(DslTypeError, pos, "index arithmetic on something that is not an index")
    return {"add": lw.iadd, "sub": lw.isub, "mul": lw.imul}[fn](a, b)


def binop(lw: KernelLowering, fn: str, a: object, b: object, pos: A.Pos, node: A.Node,
          dest: Value | None = None, hint: str | None = None) -> object:
    if fn in ("add", "sub") and isinstance(a, TileVar) and not isinstance(b, (TileVar, Value, Lazy, Product)):
        return shift(lw, a, b, fn, pos)
    if fn == "add" and isinstance(b, TileVar) and not isinstance(a, (TileVar, Value, Lazy, Product)):
        return shift(lw, b, a, fn, pos)
    for v in (a, b):
        if isinstance(v, TileVar):
            raise lw.err(DslTypeError, pos, f"'{v.name}' is a loop tile; use {v.name}.start, .size, .end or .index")
    if fn == "floordiv" and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        raise lw.err(DslTypeError, pos, "'//' divides numbers known when the kernel is compiled, not tiles "
                     "or run-time indices")
    folded = fold(lw, fn, a, b, pos)
    if folded is not None:
        return folded
    count_binary(lw, fn, a, b)
    if (dest is not None and dest.space == tile.ACC and fn in ("add", "sub") and isinstance(a, Product)
            and isinstance(b, Const) and b.kind == "tile" and b.data.shape == (a.m, a.n) and hint in (None, "f32")):
        return matmul.product_plus_const(lw, fn, a, b, dest, node, pos)
    if isinstance(a, Const):
        a = constants.const_value(lw, a, b, node)
    if isinstance(b, Const):
        b = constants.const_value(lw, b, a, node)
    tile_a = isinstance(a, (Value, Lazy, Product))
    tile_b = isinstance(b, (Value, Lazy, Product))
    if not tile_a and not tile_b:
        return scalar_op(lw, fn, a, b, pos)
    if not tile_b or not tile_a:
        t, s, swap = (a, b, False) if tile_a else (b, a, True)
        if not isinstance(s, (int, float)):
            raise lw.err(DslTypeError, pos, "a tile combines with a constant, not with a run-time index")
        t = tiles.materialise(lw, t, node)
        out = out_buf(lw, node, t.dtype if hint is None or fn in ("eq", "ne", "lt", "le", "gt", "ge") else hint,
                      (t.rows, t.cols), t.shape, dest, pos)
        lw.add(tile.ScalarOp(fn, t.buf, float(s), out.buf, lw.idx(t.rows), lw.idx(t.cols), swap=swap))
        return out
    # two tiles: broadcast lazily loaded rows against the other operand
    if isinstance(a, Lazy) and a.is_row and not (isinstance(b, Lazy) and b.is_row):
        b = tiles.materialise(lw, b, node)
        a = tiles.materialise(lw, a, node, bcast=b)
    elif isinstance(b, Lazy) and b.is_row and not (isinstance(a, Lazy) and a.is_row):
        a = tiles.materialise(lw, a, node)
        b = tiles.materialise(lw, b, node, bcast=a)
    else:
        a, b = tiles.materialise(lw, a, node), tiles.materialise(lw, b, node)
    assert isinstance(a, Value) and isinstance(b, Value)
    if a.dtype != b.dtype:
        raise lw.err(DslTypeError, pos, f"dtype mismatch in '{op_symbol(fn)}': {a.describe()} and {b.describe()}; "
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
        raise lw.err(DslShapeError, pos, f"shape mismatch in '{op_symbol(fn)}': {a.describe()} and {b.describe()}")
    if swap and fn in COMMUTATIVE:
        swap = False
    elif swap and fn in FLIP:
        fn, swap = FLIP[fn], False
    out_dtype = a.dtype if hint is None else hint
    out = out_buf(lw, node, out_dtype, (a.rows, a.cols), a.shape, dest, pos)
    lw.add(tile.BinaryOp(fn, a.buf, b.buf, out.buf, lw.idx(a.rows), lw.idx(a.cols), mode, swap))
    return out


def tile_sizes(v: object) -> tuple[int, int] | None:
    """The actual [rows x cols] of a tile operand as written (a row [1 x C], a column
    [R x 1]), None for a number or an index."""
    if isinstance(v, Value):
        return v.rows, v.cols
    if isinstance(v, Lazy):
        return v.actual
    if isinstance(v, Product):
        return v.m, v.n
    if isinstance(v, Const):
        rows, cols = v.data.shape
        return int(rows), int(cols)
    return None


# (identity, on either side) of a vector function: x + 0 = 0 + x = x, x - 0 = x, ...
IDENTITY = {"add": (0.0, True), "sub": (0.0, False), "mul": (1.0, True), "div": (1.0, False)}


def count_binary(lw: KernelLowering, fn: str, a: object, b: object) -> None:
    """Tally `a fn b` (not folded): 2 inputs when both operands are tiles of the
    result's shape, 1 for a number, a column or a broadcast row (`load(w[n])`, even
    against a one-row tile); with a constant tile
    operand, only the elements where it is not fn's identity (frontend/dsl/work.py)."""
    sa, sb = tile_sizes(a), tile_sizes(b)
    if sa is None or sb is None:
        one = sa or sb
        if one is not None:
            lw.tally.binary(fn, one[0] * one[1], 1)
        return
    out = (max(sa[0], sb[0]), max(sa[1], sb[1]))
    elements = out[0] * out[1]
    ident, either_side = IDENTITY.get(fn, (None, False))
    for c in (b, a) if either_side else (b,):
        if ident is not None and isinstance(c, Const):
            elements = int(np.count_nonzero(np.broadcast_to(c.data != ident, out)))
    rows = [isinstance(v, Lazy) and v.is_row or isinstance(v, Const) and v.kind != "tile" for v in (a, b)]
    lw.tally.binary(fn, elements, 2 if sa == sb == out and rows[0] == rows[1] else 1)


def fold(lw: KernelLowering, fn: str, a: object, b: object, pos: A.Pos) -> object | None:
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


def out_buf(lw: KernelLowering, node: A.Node, dtype: str, sizes: tuple[int, int], shape: tuple[int, int],
            dest: Value | None, pos: A.Pos, space: str = tile.SRAM) -> Value:
    if dest is not None and dest.dtype in FLOATS and dtype in FLOATS:
        statements.check_same(lw, dest, dest.dtype, sizes, pos, "assignment")
        dest.rows, dest.cols, dest.zero = sizes[0], sizes[1], False
        return dest
    if dtype not in FLOATS:
        raise lw.err(DslTypeError, pos, f"vector arithmetic on {dtype} tiles is not supported; cast to f32")
    buf = lw.buffer(node, shape, dtype, space, lw.name_hint)
    return Value(buf, dtype, space, shape, sizes[0], sizes[1], node.pos)


def cast(lw: KernelLowering, v: Value, dtype: str, node: A.Node, dest: Value | None = None) -> Value:
    if dtype not in FLOATS:
        raise lw.err(DslTypeError, node.pos, f"casts to {dtype} are not supported (tiles are float)")
    if dest is None:
        out = Value(lw.buffer(node, v.shape, dtype, tile.SRAM, f"cast_{dtype}"), dtype, tile.SRAM,
                    v.shape, v.rows, v.cols, node.pos)
    else:
        out = out_buf(lw, node, dtype, (v.rows, v.cols), v.shape, dest, node.pos)
    lw.add(tile.UnaryOp("copy", v.buf, out.buf, lw.idx(v.rows), lw.idx(v.cols)))
    return out


def call(lw: KernelLowering, e: A.Call, dest: Value | None, hint: str | None) -> object:
    fn = e.fn
    if fn == "load":
        nargs(lw, e, 1)
        sub = e.args[0]
        if not isinstance(sub, A.Subscript):
            raise lw.err(DslTypeError, e.pos, "load() takes a slice of an HBM tensor: load(x[m, k])")
        if sub.name not in lw.tensors:
            lw.lookup(sub.name, sub.pos)
            raise lw.err(DslTypeError, sub.pos, f"'{sub.name}' is not an HBM tensor")
        lz = tiles.slice(lw, sub.name, sub.indices, sub.pos)
        lz.node = e
        if e.kwargs.get("transpose") is not None:
            return tiles.materialise(lw, lz, e, layout="transposed")
        return lz
    if fn in ("zeros", "full", "empty"):
        return constants.fill(lw, e)
    if fn in ("matmul", "matmul_t"):
        return matmul.matmul(lw, e)
    if fn == "transpose":
        nargs(lw, e, 1)
        return transpose.transpose(lw, ev(lw, e.args[0]), e, dest)
    if fn in ("row_ids", "col_ids"):
        return constants.ids(lw, e)
    if fn in ("sqrt", "rsqrt", "exp") and len(e.args) == 1:
        v = ev(lw, e.args[0])
        if isinstance(v, (int, float)):
            return {"sqrt": math.sqrt, "rsqrt": lambda x: 1 / math.sqrt(x), "exp": math.exp}[fn](v)
        return unary(lw, fn, v, e, dest, hint)
    if fn in UNARY:
        nargs(lw, e, 1)
        return unary(lw, fn, ev(lw, e.args[0]), e, dest, hint)
    if fn in ("sum", "max", "min", "mean") and len(e.args) == 1:
        return reduce(lw, fn, ev(lw, e.args[0]), e, dest, hint)
    if fn in ("max", "min"):
        nargs(lw, e, 2)
        return binop(lw, fn, ev(lw, e.args[0]), ev(lw, e.args[1]), e.pos, e, dest, hint)
    raise lw.err(DslNameError, e.pos, f"undefined function '{fn}'")


def nargs(lw: KernelLowering, e: A.Call, n: int) -> None:
    if len(e.args) != n:
        raise lw.err(DslTypeError, e.pos, f"{e.fn}() takes {n} argument(s), got {len(e.args)}")


def unary(lw: KernelLowering, fn: str, v: object, e: A.Call, dest: Value | None, hint: str | None) -> Value:
    t = tiles.materialise(lw, v, e.args[0])
    out = out_buf(lw, e, hint or t.dtype, (t.rows, t.cols), t.shape, dest, e.pos)
    lw.add(tile.UnaryOp(fn, t.buf, out.buf, lw.idx(t.rows), lw.idx(t.cols)))
    lw.tally.unary(fn, t.rows, t.cols)
    return out


def reduce(lw: KernelLowering, fn: str, v: object, e: A.Call, dest: Value | None, hint: str | None = None) -> Value:
    t = tiles.materialise(lw, v, e.args[0])
    if t.dtype not in FLOATS:
        raise lw.err(DslTypeError, e.pos, f"{fn}() of {t.dtype} tiles is not supported")
    out = out_buf(lw, e, hint or t.dtype, (t.rows, 1), (t.shape[0], 1), dest, e.pos)
    lw.add(tile.ReduceOp("sum" if fn == "mean" else fn, t.buf, out.buf, lw.idx(t.rows), lw.idx(t.cols)))
    lw.tally.reduce("sum" if fn == "mean" else fn, t.rows, t.cols)
    if fn == "mean":
        lw.add(tile.ScalarOp("mul", out.buf, 1.0 / t.cols, out.buf, lw.idx(t.rows), lw.idx(1)))
    return out


def is_numeric(lw: KernelLowering, x: A.Expr) -> bool:
    """x evaluates to a compile-time number without emitting anything."""
    if isinstance(x, A.Number):
        return True
    if isinstance(x, A.Name):
        try:
            return isinstance(lw.lookup(x.id, x.pos), (int, float))
        except DslError:
            return False
    if isinstance(x, A.Neg):
        return is_numeric(lw, x.value)
    if isinstance(x, A.BinOp):
        return is_numeric(lw, x.lhs) and is_numeric(lw, x.rhs)
    if isinstance(x, A.Call):
        return x.fn in ("sqrt", "rsqrt", "exp") and not x.kwargs and all(is_numeric(lw, a) for a in x.args)
    return False
