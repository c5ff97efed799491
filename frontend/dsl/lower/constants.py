"""Tiles known when the kernel is compiled: fills, row and column ids, constant tiles, and
resident buffers (identity and selection matrices, fill values, small masks) that are
loaded once in the prologue and shared by every copy of the body.

    m_i = full(f32[128, 1], -1e30)     ->  (prologue) tile.load %c_fill[%c0] into %const_fill ...
    (inside a loop)                        tile.unary "copy" %const_fill into %m_i ...
    z = zeros(f32[128, 64], acc)       ->  nothing when its first use is z += matmul(...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import Operation, SSAValue

from tilecc.errors import DslNameError, DslTypeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import expressions, tiles
from tilecc.frontend.dsl.lower.values import (
    RESIDENT_CONST_FRACTION,
    SMALL_FILL_COLS,
    Const,
    Lazy,
    Product,
    TileVar,
    Value,
)
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


def const_value(lw: KernelLowering, c: Const, other: object, node: A.Node) -> Value:
    """A constant tile on chip, broadcast to `other`'s shape where it is a row."""
    data = c.data
    if c.kind == "row" and isinstance(other, (Value, Lazy, Product)):
        rows = other.rows if isinstance(other, Value) else (other.actual[0] if isinstance(other, Lazy) else other.m)
        data = np.broadcast_to(data, (rows, data.shape[1]))
    data = np.ascontiguousarray(data, dtype=np.float32)
    src = lw.const_tensor(data, "f32")
    if data.shape[1] * 4 <= lw.cfg.sram.bytes_per_partition // RESIDENT_CONST_FRACTION:
        # small: one buffer per distinct constant, loaded once in the prologue (a causal
        # mask's diagonal tile is the same in every query tile: no DMA per use)
        buf = resident(lw, ("const", data.shape, data.tobytes()), src, [0, 0], data.shape, "f32", "const",
                       (0, 1))
        return Value(buf, "f32", tile.SRAM, data.shape, data.shape[0], data.shape[1], c.pos)
    buf = lw.buffer(node, data.shape, "f32", tile.SRAM, "const")
    lw.add(tile.LoadOp(src, [lw.idx(0), lw.idx(0)], buf, lw.idx(data.shape[0]),
                       lw.idx(data.shape[1]), 0, 1))
    return Value(buf, "f32", tile.SRAM, data.shape, data.shape[0], data.shape[1], c.pos)


def fill(lw: KernelLowering, e: A.Call) -> Value:
    if not e.args:
        raise lw.err(DslTypeError, e.pos, f"{e.fn}() takes a tile type")
    dtype, shape, actual = tiles.tile_type(lw, e.args[0], e.fn)
    rest = e.args[1:]
    value = 0.0
    if e.fn == "full":
        if not rest:
            raise lw.err(DslTypeError, e.pos, "full() takes a tile type and a value: full(f32[128, 1], -1e30)")
        v = expressions.ev(lw, rest[0])
        if not isinstance(v, (int, float)):
            raise lw.err(DslTypeError, rest[0].pos, "full()'s value must be a constant")
        value, rest = float(v), rest[1:]
    space = tile.SRAM
    if rest:
        sp = rest[0]
        if not (isinstance(sp, A.Name) and sp.id in (tile.SRAM, tile.ACC)):
            raise lw.err(DslNameError, sp.pos, "memory space must be sram or acc")
        space = sp.id
    if space == tile.ACC and dtype != "f32":
        raise lw.err(DslTypeError, e.pos, f"the accumulator holds f32 tiles, not {dtype}")
    if e.fn == "empty":  # uninitialised: the sanitiser reports a read before a write
        buf = lw.buffer(e, shape, dtype, space, lw.name_hint)
        return Value(buf, dtype, space, shape, actual[0], actual[1], e.pos)
    buf = lw.buffer(e, shape, dtype, space, "acc" if space == tile.ACC else "fill")
    v = Value(buf, dtype, space, shape, actual[0], actual[1], e.pos, zero_loops=list(lw.loops))
    return fill_value(lw, v, value, e)


def fill_value(lw: KernelLowering, v: Value, value: float, e: A.Call) -> Value:
    """Write `value` everywhere in `v` (a DMA from a one-row HBM constant, broadcast
    over the partitions), unless the caller keeps it lazily zero."""
    if value == 0.0 and v.space == tile.ACC and lazily_zeroed(lw, e):
        return v
    if value == 0.0 and v.space == tile.SRAM and lazily_zeroed(lw, e):
        v.pending_fill = (lw.block, lw.block.last_op, lw.loc, bool(lw.loops))
        return v
    lw.add(fill_op(lw, v, value))
    return v


def fill_op(lw: KernelLowering, v: Value, value: float, in_loop: bool | None = None) -> Operation:
    """The op that fills `v` (not yet in a block; a resident constant goes to the prologue)."""
    row = np.full((v.shape[1],), value, dtype=np.float32)
    src = lw.const_tensor(row, v.dtype)
    if (bool(lw.loops) if in_loop is None else in_loop) and v.shape[1] <= SMALL_FILL_COLS:
        # a small tile filled in a loop (running maxima, sums): a vector copy from a
        # resident constant tile (one DMA in the prologue) keeps the DMA's fixed
        # latency off the loop's critical path
        cbuf = resident(lw, ("fill", value, v.shape, v.dtype), src, [0], v.shape, v.dtype, "const_fill", (-1, 0))
        return tile.UnaryOp("copy", cbuf, v.buf, lw.idx(v.rows), lw.idx(v.cols))
    return tile.LoadOp(src, [lw.idx(0)], v.buf, lw.idx(v.rows), lw.idx(v.cols), -1, 0)


def lazily_zeroed(lw: KernelLowering, e: A.Call) -> bool:
    return id(e) in lw.lazy_zero_calls


def ids(lw: KernelLowering, e: A.Call) -> Value | Lazy | Const:
    """row_ids(m): a column [m.size x 1] of m.start + r; col_ids(n): a row of n.start + c
    (from an HBM arange, f32)."""
    expressions.nargs(lw, e, 1)
    lv = expressions.ev(lw, e.args[0])
    if not isinstance(lv, TileVar):
        raise lw.err(DslTypeError, e.pos, f"{e.fn}() takes a loop tile")
    if isinstance(lv.start, int):
        ids = np.arange(lv.start, lv.start + lv.size, dtype=np.float32)
        if e.fn == "col_ids":
            return Const(ids.reshape(1, -1), e.pos, "row")
        return Const(ids.reshape(-1, 1), e.pos, "col")
    ar = lw.const_tensor(np.arange(lv.extent, dtype=np.float32), "f32")
    if e.fn == "col_ids":
        return Lazy("ids", ar, "f32", [lv.start], [0], [lv.size], [lv.tile], e.pos, e)
    buf = lw.buffer(e, (lv.tile, 1), "f32", tile.SRAM, "row_ids")
    lw.add(tile.LoadOp(ar, [lw.idx(lv.start)], buf, lw.idx(lv.size), lw.idx(1), 0, -1))
    return Value(buf, "f32", tile.SRAM, (lv.tile, 1), lv.size, 1, e.pos)


def identity(lw: KernelLowering, n: int, dtype: str) -> SSAValue:
    eye = lw.const_tensor(np.eye(n, dtype=np.float32), dtype)
    return resident(lw, ("identity", n, dtype), eye, [0, 0], (n, n), dtype, "identity", (0, 1))


def resident(lw: KernelLowering, key: tuple, src: SSAValue, index: list[int], shape: tuple[int, int], dtype: str,
             name: str, steps: tuple[int, int]) -> SSAValue:
    """An SRAM buffer of its own per `key`, loaded from the HBM constant `src` once, in
    the prologue, and shared by every copy of the body (identities, fill values)."""
    saved, lw.slot = lw.slot, ()
    buf = lw.buffer(tiles.cse_node(lw, ("resident",) + key, lw.k.pos), shape, dtype, tile.SRAM, name)
    lw.slot = saved
    if key not in lw.resident_loaded:
        lw.to_prologue(tile.LoadOp(src, [lw.idx(i) for i in index], buf, lw.idx(shape[0]), lw.idx(shape[1]),
                                   *steps))
        lw.resident_loaded.add(key)
    return buf
