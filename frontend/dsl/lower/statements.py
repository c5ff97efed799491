"""Statements: assignments, augmented assignments (``+=`` into a tile or window) and stores.

    acc += matmul(a, b)        ->  tile.matmul %aT, %b into %acc ... accumulate(%first)
    out[m, n] = bf16(acc)      ->  tile.unary "copy" %acc into %cast ...
                                   tile.store %cast into %out[%m0, %n0] sizes(...)

An assignment to a name bound outside the loop writes into that tile's buffer (a
loop-carried tile); stores check their shape and the race of a parallel loop writing
the same elements on every iteration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects import arith
from xdsl.dialects.builtin import StringAttr
from xdsl.ir import SSAValue

from tilecc.errors import DslNameError, DslRaceError, DslShapeError, DslTypeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower.analysis import names_in
from tilecc.frontend.dsl.lower.values import BIN, FLOATS, Lazy, Product, Value, stmt_target
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


class Statements:
    """Assignments, updates and stores."""

    def stmts(self: KernelLowering, body: list[A.Stmt]) -> None:
        for i, s in enumerate(body):
            self.loc = self.loc_of(s.pos)
            self.stmt_stack.append((body, i))
            try:
                self.stmt(s)
            finally:
                self.stmt_stack.pop()

    def stmt(self: KernelLowering, s: A.Stmt) -> None:
        self.name_hint = getattr(s, "target", "t")
        if isinstance(s, A.Pass):
            return
        if isinstance(s, A.For):
            self.for_(s)
        elif isinstance(s, A.Assign):
            self.assign(s)
        elif isinstance(s, A.AugAssign):
            self.aug_assign(s)
        elif isinstance(s, A.Store):
            self.store(s)
        elif isinstance(s, A.AugStore):
            self.aug_store(s)
        else:  # pragma: no cover
            raise AssertionError(s)

    def assign(self: KernelLowering, s: A.Assign) -> None:
        if s.target in self.tensors:
            raise self.err(DslNameError, s.pos, f"'{s.target}' is an HBM tensor: store a tile with "
                           f"{s.target}[...] = ..., not {s.target} = ...")
        if isinstance(s.value, A.Call) and s.value.fn == "zeros" and id(s) in self.lazy_zero:
            v = self.ev(s.value)
            assert isinstance(v, Value)
            if v.space == tile.ACC:
                v.zero = True
            self.bind(s, v)
            return
        old = self.defined_outside(s.target)
        if isinstance(old, Value):  # a loop-carried tile: write into its buffer
            dest = old
            v = self.ev(s.value, dest=dest)
            self.write_into(s, dest, v)
            return
        v = self.ev(s.value)
        if isinstance(v, (Lazy, Product)):
            v = self.materialise(v, s.value)
        elif isinstance(v, Value) and isinstance(s.value, A.Name):  # a copy, not an alias
            out = Value(self.buffer(s, v.shape, v.dtype, v.space, s.target), v.dtype, v.space, v.shape,
                        v.rows, v.cols, s.pos)
            self.add(tile.UnaryOp("copy", v.buf, out.buf, self.idx(v.rows), self.idx(v.cols)))
            v = out
        self.scopes[-1][s.target] = v

    def bind(self: KernelLowering, s: A.Assign, v: Value) -> None:
        old = self.defined_outside(s.target)
        if isinstance(old, Value):
            self.write_into(s, old, v)
        else:
            self.scopes[-1][s.target] = v

    def write_into(self: KernelLowering, s: A.Stmt, dest: Value, v: object) -> None:
        """`dest = v` in place (dest outlives the loop)."""
        if isinstance(v, Value) and v.zero:
            dest.zero, dest.zero_loops = True, v.zero_loops
            dest.rows, dest.cols = v.rows, v.cols
            return
        if isinstance(v, Value) and v.buf is dest.buf:
            dest.rows, dest.cols, dest.zero = v.rows, v.cols, v.zero
            return
        if isinstance(v, Product):
            self.check_acc_target(dest, v, s.pos)
            self.emit_matmul(v, dest, accumulate=False)
            return
        if isinstance(v, Lazy):
            self.check_same(dest, v.dtype, v.actual, s.pos, "assignment")
            self.load_into(v, dest.buf, "normal", v.actual)
            dest.rows, dest.cols = v.actual
            return
        if not isinstance(v, Value):
            raise self.err(DslTypeError, s.pos, f"cannot assign a scalar to the tile '{stmt_target(s)}'")
        self.check_same(dest, v.dtype, (v.rows, v.cols), s.pos, "assignment")
        self.add(tile.UnaryOp("copy", v.buf, dest.buf, self.idx(v.rows), self.idx(v.cols)))
        dest.rows, dest.cols, dest.zero = v.rows, v.cols, False

    def check_same(self: KernelLowering, dest: Value, dtype: str, sizes: tuple[int, int], pos: A.Pos, what: str) -> None:
        if dtype != dest.dtype:
            raise self.err(DslTypeError, pos, f"dtype mismatch in {what}: the tile is {dest.dtype} "
                           f"(line {dest.pos.line}), the value {dtype}; cast it with {dest.dtype}(...)")
        if sizes[0] > dest.shape[0] or sizes[1] > dest.shape[1]:
            raise self.err(DslShapeError, pos, f"shape mismatch in {what}: a [{sizes[0]} x {sizes[1]}] value "
                           f"does not fit the tile {dest.dtype}[{dest.shape[0]} x {dest.shape[1]}] (line {dest.pos.line})")

    def aug_assign(self: KernelLowering, s: A.AugAssign) -> None:
        cur = self.lookup(s.target, s.pos)
        if not isinstance(cur, Value):
            if isinstance(cur, (int, float)) and not isinstance(cur, bool):
                rhs = self.ev(s.value)
                self.scopes[-1][s.target] = self.scalar_op(BIN[s.op], cur, rhs, s.pos)
                return
            raise self.err(DslTypeError, s.pos, f"'{s.target}' is not a tile")
        self._aug(s, cur)

    def _aug(self: KernelLowering, s: A.AugAssign | A.AugStore, cur: Value) -> None:
        """``cur op= value`` (cur a tile, or a window of one)."""
        if cur.pending_fill is not None:
            (block, after, loc, in_loop), cur.pending_fill = cur.pending_fill, None
            if s.op == "+" and all(isinstance(lv.index, int) for lv in self.loops[len(cur.zero_loops):]):
                # the first execution of `x += v` on a zeroed tile (only unrolled loops
                # entered since): x = v, written straight into x, and no fill at all
                v = self.ev(s.value, dest=cur)
                if not (isinstance(v, Value) and v.buf is cur.buf):
                    self.write_into(s, cur, v)
                return
            fill = self.fill_op(cur, 0.0, in_loop)  # a loop runs the += more than once: fill where zeros was
            fill.attributes["tilecc.loc"] = StringAttr(loc)
            if after is not None:
                block.insert_op_after(fill, after)
            elif block.first_op is not None:
                block.insert_op_before(fill, block.first_op)
            else:
                block.add_op(fill)
        if s.op == "+" and isinstance(s.value, A.Call) and s.value.fn in ("matmul", "matmul_t"):
            p = self.ev(s.value)
            assert isinstance(p, Product)
            self.check_acc_target(cur, p, s.pos)
            if cur.zero:
                acc = self.first_iteration_flag(cur)
                self.emit_matmul(p, cur, accumulate=acc)
            else:
                self.emit_matmul(p, cur, accumulate=True)
            cur.rows, cur.cols, cur.zero = p.m, p.n, False
            return
        if cur.zero:
            raise self.err(DslTypeError, s.pos, f"'{s.target}' is a lazily zeroed accumulator; only "
                           f"'{s.target} += matmul(...)' may come first")  # pragma: no cover - the pre-pass prevents it
        v = self.binop(BIN[s.op], cur, self.ev(s.value), s.pos, s, dest=cur)
        assert isinstance(v, Value)
        cur.rows, cur.cols = v.rows, v.cols

    def first_iteration_flag(self: KernelLowering, acc: Value) -> SSAValue:
        """The accumulate flag of the first matmul into a zeroed accumulator: off on the
        first iteration of the loops entered since `zeros`."""
        total: SSAValue | int = 0
        for lv in self.loops[len(acc.zero_loops):]:
            total = self.iadd(total, lv.index)
        if isinstance(total, int):
            return self.flag(total != 0)
        return self.add(arith.CmpiOp(total, self.idx(0), "ne")).results[0]

    def aug_store(self: KernelLowering, s: A.AugStore) -> None:
        if s.target in self.tensors:
            raise self.err(DslTypeError, s.pos, f"{s.target}[...] {s.op}= ...: HBM tensors are stored, not updated; "
                           f"load, compute and store")
        self._aug(s, self.tile_window(s.target, s.indices, s.pos))

    def store(self: KernelLowering, s: A.Store) -> None:
        if s.target not in self.tensors:
            if self.is_defined(s.target):
                dest = self.tile_window(s.target, s.indices, s.pos)
                v = self.ev(s.value, dest=dest)
                self.write_into(s, dest, v)
                return
            raise self.err(DslNameError, s.pos, f"undefined name '{s.target}' (store targets are the kernel's "
                           "tensors)")
        tensor, p = self.tensors[s.target]
        sl = self.slice(s.target, s.indices, s.pos)  # undefined index names first
        self.check_race(s)
        dtype = p.type.dtype
        v = self.ev(s.value, hint=dtype)
        if isinstance(v, (int, float)):
            raise self.err(DslTypeError, s.value.pos, "cannot store a scalar; store a tile")
        if isinstance(v, (Lazy, Product)):
            v = self.materialise(v, s.value)
        assert isinstance(v, Value)
        want = sl.actual
        got = (v.rows, v.cols)
        if len(sl.kept) == 1 and got == (want[1], 1):  # a column into a 1-D slice
            want = got
        if got != want:
            raise self.err(DslShapeError, s.pos, f"shape mismatch in store: {s.target}[...] is "
                           f"[{want[0]} x {want[1]}] here, the value is [{got[0]} x {got[1]}]")
        if v.dtype != dtype:
            if (v.dtype in FLOATS) != (dtype in FLOATS):
                raise self.err(DslTypeError, s.pos, f"dtype mismatch in store: {s.target} is {dtype}, the value {v.dtype}")
            v = self.cast(v, dtype, s.value)
        rd, cd = self.store_dims(sl, got)
        self.add(tile.StoreOp(v.buf, tensor, [self.idx(i) for i in sl.indices], self.idx(got[0]),
                              self.idx(got[1]), rd, cd))

    @staticmethod
    def store_dims(sl: Lazy, got: tuple[int, int]) -> tuple[int, int]:
        if len(sl.kept) == 2:
            return sl.kept[0], sl.kept[1]
        if len(sl.kept) == 1:
            return sl.kept[0], sl.kept[0]
        d = len(sl.indices) - 1
        return d, d

    def check_race(self: KernelLowering, s: A.Store) -> None:
        used = set()
        for i in s.indices:
            used |= names_in(i)
        for lv in self.loops:
            if lv.name in used or lv.extent <= 1 and lv.size == lv.extent:
                continue
            raise self.err(DslRaceError, s.pos, f"race: every iteration of the parallel loop '{lv.name}' "
                           f"(line {lv.pos.line}) writes the same elements of {s.target}; index the store by "
                           f"'{lv.name}' or move it out of the loop")
