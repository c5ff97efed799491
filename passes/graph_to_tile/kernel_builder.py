"""A small builder for tile-dialect kernels: index constants, loops over tiles, tile ops.

Used by the graph lowering (and later the tile-DSL front end) so kernels are written as
straight-line Python:

    kb = KernelBuilder("k0_relu", [x_type, out_type])
    with kb.tiles(rows, 16) as (r0, r):          # r0 = first row of the tile, r = its size
        buf = kb.alloc([16, 64], f32, "sram", "x")
        kb.add(tile.LoadOp(kb.args[0], [r0, kb.const(0)], buf, r, kb.const(53), 0, 1))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IndexType, UnitAttr
from xdsl.ir import Attribute, Block, Operation, SSAValue

from tilecc.ir import tile


class KernelBuilder:
    def __init__(self, name: str, arg_types: Sequence[Attribute], loc: str | None = None):
        self.func = func.FuncOp(name, (list(arg_types), []))
        self.func.attributes[tile.KERNEL_ATTR] = UnitAttr()
        self.entry = self.func.body.block
        self.block = self.entry
        self.loc = loc
        self._consts: dict[int, SSAValue] = {}
        self._bool: dict[int, SSAValue] = {}  # i1 constants at the entry (bool_const)
        self._names: dict[str, int] = {}

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return self.entry.args

    def add(self, op: Operation) -> Operation:
        if self.loc:
            op.attributes["tilecc.loc"] = _str_attr(self.loc)
        self.block.add_op(op)
        return op

    def add_entry(self, op: Operation) -> SSAValue:
        """Add `op` at the kernel's entry (before its loops: constants, resident buffers)."""
        first = self.entry.first_op
        if first is None:
            self.entry.add_op(op)
        else:
            self.entry.insert_op_before(op, first)
        return op.results[0]

    def bool_const(self, value: bool) -> SSAValue:
        """The i1 constant `value` (one per kernel, at its entry)."""
        key = int(value)
        if key not in self._bool:
            self._bool[key] = self.add_entry(arith.ConstantOp.from_int_and_width(key, 1))
        return self._bool[key]

    def const(self, value: int) -> SSAValue:
        if value not in self._consts:
            self._consts[value] = self.add_entry(
                arith.ConstantOp.from_int_and_width(value, IndexType())
            )
        return self._consts[value]

    def alloc(self, shape: Sequence[int], element_type: Attribute, space: str, name: str) -> SSAValue:
        n = self._names.get(name, 0)
        self._names[name] = n + 1
        unique = name if n == 0 else f"{name}{n}"
        op = tile.AllocOp(tile.onchip_type(shape, element_type, space), unique)
        return self.add(op).results[0]

    def addi(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(arith.AddiOp(a, b)).results[0]

    def subi(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(arith.SubiOp(a, b)).results[0]

    def muli(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(arith.MuliOp(a, b)).results[0]

    def mini(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(arith.MinSIOp(a, b)).results[0]

    def ne_zero(self, a: SSAValue) -> SSAValue:
        return self.add(arith.CmpiOp(a, self.const(0), "ne")).results[0]

    @contextmanager
    def loop(self, trip: int) -> Iterator[SSAValue]:
        """`scf.for %i = 0 to trip step 1`; yields the induction variable (no loop for trip 1)."""
        if trip == 1:
            yield self.const(0)
            return
        body = Block(arg_types=[IndexType()])
        outer = self.block
        op = scf.ForOp(self.const(0), self.const(trip), self.const(1), [], body)
        outer.add_op(op)
        self.block = body
        try:
            yield body.args[0]
        finally:
            body.add_op(scf.YieldOp())
            self.block = outer

    @contextmanager
    def tiles(self, extent: int, tile_size: int) -> Iterator[tuple[SSAValue, SSAValue]]:
        """Loop over `extent` in tiles of `tile_size`: yields (start, size of this tile)."""
        trip = -(-extent // tile_size)
        with self.loop(trip) as i:
            start = self.muli(i, self.const(tile_size)) if trip > 1 else self.const(0)
            if extent % tile_size == 0 or trip == 1:
                size = self.const(min(tile_size, extent))
            else:
                size = self.mini(self.const(tile_size), self.subi(self.const(extent), start))
            yield start, size

    def finish(self) -> func.FuncOp:
        """The kernel; ops built without a location (index constants, loops, buffers)
        and the kernel itself get the kernel's (terminators excepted), so every op leads back to user code."""
        self.entry.add_op(func.ReturnOp())
        if self.loc:
            loc = _str_attr(self.loc)
            for op in self.func.walk():
                if "tilecc.loc" not in op.attributes and not isinstance(op, (func.ReturnOp, scf.YieldOp)):
                    op.attributes["tilecc.loc"] = loc
        return self.func


def _str_attr(s: str) -> Attribute:
    from xdsl.dialects.builtin import StringAttr

    return StringAttr(s)
