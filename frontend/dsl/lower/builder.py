"""Building blocks of the lowering: ops in the current block or the prologue, index
arithmetic folded where static, on-chip buffers hoisted per multi-buffering copy, HBM
constants as extra kernel arguments, and the scopes names are looked up in.

    self.iadd(%m, 16)      ->  %1 = arith.addi %m, %c16 : index      (3 + 4 -> 7, no op)
    self.buffer(node, (128, 64), "bf16", "sram", "a")
                           ->  %a = tile.alloc {buffer = "a"} : memref<128x64xbf16, #tile.space<"sram">>
                               (in the prologue; one per node and buffering copy)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects import arith
from xdsl.dialects.builtin import IndexType, MemRefType, StringAttr, i1
from xdsl.ir import Operation, SSAValue

from tilecc.errors import DslNameError, DslShapeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower.values import DTYPES
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


class Builder:
    """Ops, indices, buffers, constants and scopes."""

    def add(self: KernelLowering, op: Operation) -> Operation:
        op.attributes["tilecc.loc"] = StringAttr(self.loc)
        self.block.add_op(op)
        return op

    def to_prologue(self: KernelLowering, op: Operation) -> SSAValue:
        op.attributes["tilecc.loc"] = StringAttr(self.loc)
        self.entry.add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def idx(self: KernelLowering, v: SSAValue | int) -> SSAValue:
        if not isinstance(v, int):
            return v
        if v not in self.index_consts:
            self.index_consts[v] = self.to_prologue(arith.ConstantOp.from_int_and_width(v, IndexType()))
        return self.index_consts[v]

    def flag(self: KernelLowering, v: bool) -> SSAValue:
        key = -1 - int(v)  # beside the index constants
        if key not in self.index_consts:
            self.index_consts[key] = self.to_prologue(arith.ConstantOp.from_int_and_width(int(v), i1))
        return self.index_consts[key]

    def iadd(self: KernelLowering, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if b == 0:
            return a
        if a == 0:
            return b
        return self.add(arith.AddiOp(self.idx(a), self.idx(b))).results[0]

    def isub(self: KernelLowering, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a - b
        if b == 0:
            return a
        return self.add(arith.SubiOp(self.idx(a), self.idx(b))).results[0]

    def imul(self: KernelLowering, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if b == 1:
            return a
        if a == 1:
            return b
        return self.add(arith.MuliOp(self.idx(a), self.idx(b))).results[0]

    def buffer(self: KernelLowering, node: A.Node, shape: tuple[int, int], dtype: str, space: str, name: str) -> SSAValue:
        """The on-chip buffer of `node` in this multi-buffering copy (hoisted to the entry)."""
        rows, cols = shape
        parts = self.cfg.sram.partitions if space == tile.SRAM else self.cfg.accumulator.partitions
        if rows > parts:
            raise self.err(DslShapeError, node.pos, f"partition dimension too large: the tile {name} "
                           f"{dtype}[{rows} x {cols}] has {rows} rows but {space} on target '{self.target}' "
                           f"has {parts} partitions")
        key = (id(node), self.slot, shape, dtype, space, name)
        if key not in self.allocs:
            n = self.buffer_names.get(name, 0)
            self.buffer_names[name] = n + 1
            unique = name if n == 0 else f"{name}{n}"
            op = tile.AllocOp(tile.onchip_type([rows, max(cols, 1)], DTYPES[dtype], space), unique)
            self.allocs[key] = (self.to_prologue(op), node.pos, unique)
        return self.allocs[key][0]

    def const_tensor(self: KernelLowering, data: np.ndarray, dtype: str) -> SSAValue:
        """An HBM constant, passed to the kernel as an extra argument."""
        key = (dtype, data.shape, data.tobytes())
        if key not in self.const_args:
            t = MemRefType(DTYPES[dtype], list(data.shape))
            self.const_args[key] = self.entry.insert_arg(t, len(self.entry.args))
            self.consts.append((data, dtype))
        return self.const_args[key]

    def lookup(self: KernelLowering, name: str, pos: A.Pos) -> object:
        if name in ("True", "False") and not self.is_defined(name):
            return int(name == "True")
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.symbols:
            return self.symbols[name]
        if name in self.tensors:
            raise self.err(DslNameError, pos, f"'{name}' is an HBM tensor; read a tile of it with load({name}[...])")
        raise self.err(DslNameError, pos, f"undefined name '{name}'")

    def defined_outside(self: KernelLowering, name: str) -> object | None:
        for scope in reversed(self.scopes[:-1]):
            if name in scope:
                return scope[name]
        return None

    @contextmanager
    def scope(self: KernelLowering) -> Iterator[None]:
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()

    def is_defined(self: KernelLowering, name: str) -> bool:
        return any(name in sc for sc in self.scopes)
