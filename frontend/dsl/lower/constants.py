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


class Constants:
    """Fills, ids and resident constants."""

    def const_value(self: KernelLowering, c: Const, other: object, node: A.Node) -> Value:
        """A constant tile on chip, broadcast to `other`'s shape where it is a row."""
        data = c.data
        if c.kind == "row" and isinstance(other, (Value, Lazy, Product)):
            rows = other.rows if isinstance(other, Value) else (other.actual[0] if isinstance(other, Lazy) else other.m)
            data = np.broadcast_to(data, (rows, data.shape[1]))
        data = np.ascontiguousarray(data, dtype=np.float32)
        src = self.const_tensor(data, "f32")
        if data.shape[1] * 4 <= self.cfg.sram.bytes_per_partition // RESIDENT_CONST_FRACTION:
            # small: one buffer per distinct constant, loaded once in the prologue (a causal
            # mask's diagonal tile is the same in every query tile: no DMA per use)
            buf = self.resident(("const", data.shape, data.tobytes()), src, [0, 0], data.shape, "f32", "const",
                                (0, 1))
            return Value(buf, "f32", tile.SRAM, data.shape, data.shape[0], data.shape[1], c.pos)
        buf = self.buffer(node, data.shape, "f32", tile.SRAM, "const")
        self.add(tile.LoadOp(src, [self.idx(0), self.idx(0)], buf, self.idx(data.shape[0]),
                             self.idx(data.shape[1]), 0, 1))
        return Value(buf, "f32", tile.SRAM, data.shape, data.shape[0], data.shape[1], c.pos)

    def fill(self: KernelLowering, e: A.Call) -> Value:
        if not e.args:
            raise self.err(DslTypeError, e.pos, f"{e.fn}() takes a tile type")
        dtype, shape, actual = self.tile_type(e.args[0], e.fn)
        rest = e.args[1:]
        value = 0.0
        if e.fn == "full":
            if not rest:
                raise self.err(DslTypeError, e.pos, "full() takes a tile type and a value: full(f32[128, 1], -1e30)")
            v = self.ev(rest[0])
            if not isinstance(v, (int, float)):
                raise self.err(DslTypeError, rest[0].pos, "full()'s value must be a constant")
            value, rest = float(v), rest[1:]
        space = tile.SRAM
        if rest:
            sp = rest[0]
            if not (isinstance(sp, A.Name) and sp.id in (tile.SRAM, tile.ACC)):
                raise self.err(DslNameError, sp.pos, "memory space must be sram or acc")
            space = sp.id
        if space == tile.ACC and dtype != "f32":
            raise self.err(DslTypeError, e.pos, f"the accumulator holds f32 tiles, not {dtype}")
        if e.fn == "empty":  # uninitialised: the sanitiser reports a read before a write
            buf = self.buffer(e, shape, dtype, space, self.name_hint)
            return Value(buf, dtype, space, shape, actual[0], actual[1], e.pos)
        buf = self.buffer(e, shape, dtype, space, "acc" if space == tile.ACC else "fill")
        v = Value(buf, dtype, space, shape, actual[0], actual[1], e.pos, zero_loops=list(self.loops))
        return self._fill(v, value, e)

    def _fill(self: KernelLowering, v: Value, value: float, e: A.Call) -> Value:
        """Write `value` everywhere in `v` (a DMA from a one-row HBM constant, broadcast
        over the partitions), unless the caller keeps it lazily zero."""
        if value == 0.0 and v.space == tile.ACC and self._lazy_here(e):
            return v
        if value == 0.0 and v.space == tile.SRAM and self._lazy_here(e):
            v.pending_fill = (self.block, self.block.last_op, self.loc, bool(self.loops))
            return v
        self.add(self.fill_op(v, value))
        return v

    def fill_op(self: KernelLowering, v: Value, value: float, in_loop: bool | None = None) -> Operation:
        """The op that fills `v` (not yet in a block; a resident constant goes to the prologue)."""
        row = np.full((v.shape[1],), value, dtype=np.float32)
        src = self.const_tensor(row, v.dtype)
        if (bool(self.loops) if in_loop is None else in_loop) and v.shape[1] <= SMALL_FILL_COLS:
            # a small tile filled in a loop (running maxima, sums): a vector copy from a
            # resident constant tile (one DMA in the prologue) keeps the DMA's fixed
            # latency off the loop's critical path
            cbuf = self.resident(("fill", value, v.shape, v.dtype), src, [0], v.shape, v.dtype, "const_fill", (-1, 0))
            return tile.UnaryOp("copy", cbuf, v.buf, self.idx(v.rows), self.idx(v.cols))
        return tile.LoadOp(src, [self.idx(0)], v.buf, self.idx(v.rows), self.idx(v.cols), -1, 0)

    def _lazy_here(self: KernelLowering, e: A.Call) -> bool:
        return id(e) in self.lazy_zero_calls

    def ids(self: KernelLowering, e: A.Call) -> Value | Lazy:
        """row_ids(m): a column [m.size x 1] of m.start + r; col_ids(n): a row of n.start + c
        (from an HBM arange, f32)."""
        self.nargs(e, 1)
        lv = self.ev(e.args[0])
        if not isinstance(lv, TileVar):
            raise self.err(DslTypeError, e.pos, f"{e.fn}() takes a loop tile")
        if isinstance(lv.start, int):
            ids = np.arange(lv.start, lv.start + lv.size, dtype=np.float32)
            if e.fn == "col_ids":
                return Const(ids.reshape(1, -1), e.pos, "row")
            return Const(ids.reshape(-1, 1), e.pos, "col")
        ar = self.const_tensor(np.arange(lv.extent, dtype=np.float32), "f32")
        if e.fn == "col_ids":
            return Lazy("ids", ar, "f32", [lv.start], [0], [lv.size], [lv.tile], e.pos, e)
        buf = self.buffer(e, (lv.tile, 1), "f32", tile.SRAM, "row_ids")
        self.add(tile.LoadOp(ar, [self.idx(lv.start)], buf, self.idx(lv.size), self.idx(1), 0, -1))
        return Value(buf, "f32", tile.SRAM, (lv.tile, 1), lv.size, 1, e.pos)

    def identity(self: KernelLowering, n: int, dtype: str) -> SSAValue:
        eye = self.const_tensor(np.eye(n, dtype=np.float32), dtype)
        return self.resident(("identity", n, dtype), eye, [0, 0], (n, n), dtype, "identity", (0, 1))

    def resident(self: KernelLowering, key: tuple, src: SSAValue, index: list[int], shape: tuple[int, int], dtype: str,
                 name: str, steps: tuple[int, int]) -> SSAValue:
        """An SRAM buffer of its own per `key`, loaded from the HBM constant `src` once, in
        the prologue, and shared by every copy of the body (identities, fill values)."""
        saved, self.slot = self.slot, ()
        buf = self.buffer(self.cse_node(("resident",) + key, self.k.pos), shape, dtype, tile.SRAM, name)
        self.slot = saved
        if key not in self.resident_loaded:
            self.to_prologue(tile.LoadOp(src, [self.idx(i) for i in index], buf, self.idx(shape[0]), self.idx(shape[1]),
                                    *steps))
            self.resident_loaded.add(key)
        return buf
