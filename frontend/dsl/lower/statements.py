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
from tilecc.frontend.dsl.lower import constants, expressions, loops, matmul, tiles
from tilecc.frontend.dsl.lower.analysis import names_in
from tilecc.frontend.dsl.lower.values import BIN, FLOATS, Lazy, Product, Value, stmt_target
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


def stmts(lw: KernelLowering, body: list[A.Stmt]) -> None:
    for i, s in enumerate(body):
        lw.loc = lw.loc_of(s.pos)
        lw.stmt_stack.append((body, i))
        try:
            stmt(lw, s)
        finally:
            lw.stmt_stack.pop()


def stmt(lw: KernelLowering, s: A.Stmt) -> None:
    lw.name_hint = getattr(s, "target", "t")
    if isinstance(s, A.Pass):
        return
    if isinstance(s, A.For):
        loops.for_(lw, s)
    elif isinstance(s, A.Assign):
        assign(lw, s)
    elif isinstance(s, A.AugAssign):
        aug_assign(lw, s)
    elif isinstance(s, A.Store):
        store(lw, s)
    elif isinstance(s, A.AugStore):
        aug_store(lw, s)
    else:  # pragma: no cover
        raise AssertionError(s)


def assign(lw: KernelLowering, s: A.Assign) -> None:
    if s.target in lw.tensors:
        raise lw.err(DslNameError, s.pos, f"'{s.target}' is an HBM tensor: store a tile with "
                     f"{s.target}[...] = ..., not {s.target} = ...")
    if isinstance(s.value, A.Call) and s.value.fn == "zeros" and id(s) in lw.lazy_zero:
        v = expressions.ev(lw, s.value)
        assert isinstance(v, Value)
        if v.space == tile.ACC:
            v.zero = True
        bind(lw, s, v)
        return
    old = lw.defined_outside(s.target)
    if isinstance(old, Value):  # a loop-carried tile: write into its buffer
        dest = old
        v = expressions.ev(lw, s.value, dest=dest)
        write_into(lw, s, dest, v)
        return
    v = expressions.ev(lw, s.value)
    if isinstance(v, (Lazy, Product)):
        v = tiles.materialise(lw, v, s.value)
    elif isinstance(v, Value) and isinstance(s.value, A.Name):  # a copy, not an alias
        out = Value(lw.buffer(s, v.shape, v.dtype, v.space, s.target), v.dtype, v.space, v.shape,
                    v.rows, v.cols, s.pos)
        lw.add(tile.UnaryOp("copy", v.buf, out.buf, lw.idx(v.rows), lw.idx(v.cols)))
        v = out
    lw.scopes[-1][s.target] = v


def bind(lw: KernelLowering, s: A.Assign, v: Value) -> None:
    old = lw.defined_outside(s.target)
    if isinstance(old, Value):
        write_into(lw, s, old, v)
    else:
        lw.scopes[-1][s.target] = v


def write_into(lw: KernelLowering, s: A.Stmt, dest: Value, v: object) -> None:
    """`dest = v` in place (dest outlives the loop)."""
    if isinstance(v, Value) and v.zero:
        dest.zero, dest.zero_loops = True, v.zero_loops
        dest.rows, dest.cols = v.rows, v.cols
        return
    if isinstance(v, Value) and v.buf is dest.buf:
        dest.rows, dest.cols, dest.zero = v.rows, v.cols, v.zero
        return
    if isinstance(v, Product):
        matmul.check_acc_target(lw, dest, v, s.pos)
        matmul.emit_matmul(lw, v, dest, accumulate=False)
        return
    if isinstance(v, Lazy):
        check_same(lw, dest, v.dtype, v.actual, s.pos, "assignment")
        tiles.load_into(lw, v, dest.buf, "normal", v.actual)
        dest.rows, dest.cols = v.actual
        return
    if not isinstance(v, Value):
        raise lw.err(DslTypeError, s.pos, f"cannot assign a scalar to the tile '{stmt_target(s)}'")
    check_same(lw, dest, v.dtype, (v.rows, v.cols), s.pos, "assignment")
    lw.add(tile.UnaryOp("copy", v.buf, dest.buf, lw.idx(v.rows), lw.idx(v.cols)))
    dest.rows, dest.cols, dest.zero = v.rows, v.cols, False


def check_same(lw: KernelLowering, dest: Value, dtype: str, sizes: tuple[int, int], pos: A.Pos, what: str) -> None:
    if dtype != dest.dtype:
        raise lw.err(DslTypeError, pos, f"dtype mismatch in {what}: the tile is {dest.dtype} "
                     f"(line {dest.pos.line}), the value {dtype}; cast it with {dest.dtype}(...)")
    if sizes[0] > dest.shape[0] or sizes[1] > dest.shape[1]:
        raise lw.err(DslShapeError, pos, f"shape mismatch in {what}: a [{sizes[0]} x {sizes[1]}] value "
                     f"does not fit the tile {dest.dtype}[{dest.shape[0]} x {dest.shape[1]}] (line {dest.pos.line})")


def aug_assign(lw: KernelLowering, s: A.AugAssign) -> None:
    cur = lw.lookup(s.target, s.pos)
    if not isinstance(cur, Value):
        if isinstance(cur, (int, float)) and not isinstance(cur, bool):
            rhs = expressions.ev(lw, s.value)
            lw.scopes[-1][s.target] = expressions.scalar_op(lw, BIN[s.op], cur, rhs, s.pos)
            return
        raise lw.err(DslTypeError, s.pos, f"'{s.target}' is not a tile")
    update(lw, s, cur)


def update(lw: KernelLowering, s: A.AugAssign | A.AugStore, cur: Value) -> None:
    """``cur op= value`` (cur a tile, or a window of one)."""
    if cur.pending_fill is not None:
        (block, after, loc, in_loop), cur.pending_fill = cur.pending_fill, None
        if s.op == "+" and all(isinstance(lv.index, int) for lv in lw.loops[len(cur.zero_loops):]):
            # the first execution of `x += v` on a zeroed tile (only unrolled loops
            # entered since): x = v, written straight into x, and no fill at all
            x_sizes = (cur.rows, cur.cols)
            v = expressions.ev(lw, s.value, dest=cur)
            v_sizes = expressions.tile_sizes(v)  # as written, x = x + v (frontend/dsl/work.py)
            lw.tally.binary("add", x_sizes[0] * x_sizes[1], 2 if v_sizes == x_sizes else 1)
            if not (isinstance(v, Value) and v.buf is cur.buf):
                write_into(lw, s, cur, v)
            return
        fill = constants.fill_op(lw, cur, 0.0, in_loop)  # a loop runs the += more than once: fill where zeros was
        fill.attributes["tilecc.loc"] = StringAttr(loc)
        if after is not None:
            block.insert_op_after(fill, after)
        elif block.first_op is not None:
            block.insert_op_before(fill, block.first_op)
        else:
            block.add_op(fill)
    if s.op == "+" and isinstance(s.value, A.Call) and s.value.fn in ("matmul", "matmul_t"):
        p = expressions.ev(lw, s.value)
        assert isinstance(p, Product)
        matmul.check_acc_target(lw, cur, p, s.pos)
        if cur.zero:
            acc = first_iteration_flag(lw, cur)
            matmul.emit_matmul(lw, p, cur, accumulate=acc)
        else:
            matmul.emit_matmul(lw, p, cur, accumulate=True)
        cur.rows, cur.cols, cur.zero = p.m, p.n, False
        return
    if cur.zero:
        raise lw.err(DslTypeError, s.pos, f"'{s.target}' is a lazily zeroed accumulator; only "
                     f"'{s.target} += matmul(...)' may come first")  # pragma: no cover - the pre-pass prevents it
    v = expressions.binop(lw, BIN[s.op], cur, expressions.ev(lw, s.value), s.pos, s, dest=cur)
    assert isinstance(v, Value)
    cur.rows, cur.cols = v.rows, v.cols


def first_iteration_flag(lw: KernelLowering, acc: Value) -> SSAValue:
    """The accumulate flag of the first matmul into a zeroed accumulator: off on the
    first iteration of the loops entered since `zeros`."""
    total: SSAValue | int = 0
    for lv in lw.loops[len(acc.zero_loops):]:
        total = lw.iadd(total, lv.index)
    if isinstance(total, int):
        return lw.flag(total != 0)
    return lw.add(arith.CmpiOp(total, lw.idx(0), "ne")).results[0]


def aug_store(lw: KernelLowering, s: A.AugStore) -> None:
    if s.target in lw.tensors:
        raise lw.err(DslTypeError, s.pos, f"{s.target}[...] {s.op}= ...: HBM tensors are stored, not updated; "
                     f"load, compute and store")
    update(lw, s, tiles.tile_window(lw, s.target, s.indices, s.pos))


def store(lw: KernelLowering, s: A.Store) -> None:
    if s.target not in lw.tensors:
        if lw.is_defined(s.target):
            dest = tiles.tile_window(lw, s.target, s.indices, s.pos)
            v = expressions.ev(lw, s.value, dest=dest)
            write_into(lw, s, dest, v)
            return
        raise lw.err(DslNameError, s.pos, f"undefined name '{s.target}' (store targets are the kernel's "
                     "tensors)")
    tensor, p = lw.tensors[s.target]
    sl = tiles.slice(lw, s.target, s.indices, s.pos)  # undefined index names first
    check_race(lw, s)
    dtype = p.type.dtype
    v = expressions.ev(lw, s.value, hint=dtype)
    if isinstance(v, (int, float)):
        raise lw.err(DslTypeError, s.value.pos, "cannot store a scalar; store a tile")
    if isinstance(v, (Lazy, Product)):
        v = tiles.materialise(lw, v, s.value)
    assert isinstance(v, Value)
    want = sl.actual
    got = (v.rows, v.cols)
    if len(sl.kept) == 1 and got == (want[1], 1):  # a column into a 1-D slice
        want = got
    if got != want:
        raise lw.err(DslShapeError, s.pos, f"shape mismatch in store: {s.target}[...] is "
                     f"[{want[0]} x {want[1]}] here, the value is [{got[0]} x {got[1]}]")
    if v.dtype != dtype:
        if (v.dtype in FLOATS) != (dtype in FLOATS):
            raise lw.err(DslTypeError, s.pos, f"dtype mismatch in store: {s.target} is {dtype}, the value {v.dtype}")
        v = expressions.cast(lw, v, dtype, s.value)
    rd, cd = store_dims(sl, got)
    lw.add(tile.StoreOp(v.buf, tensor, [lw.idx(i) for i in sl.indices], lw.idx(got[0]),
                        lw.idx(got[1]), rd, cd))


def store_dims(sl: Lazy, got: tuple[int, int]) -> tuple[int, int]:
    if len(sl.kept) == 2:
        return sl.kept[0], sl.kept[1]
    if len(sl.kept) == 1:
        return sl.kept[0], sl.kept[0]
    d = len(sl.indices) - 1
    return d, d


def check_race(lw: KernelLowering, s: A.Store) -> None:
    used = set()
    for i in s.indices:
        used |= names_in(i)
    for lv in lw.loops:
        if lv.name in used or lv.extent <= 1 and lv.size == lv.extent:
            continue
        raise lw.err(DslRaceError, s.pos, f"race: every iteration of the parallel loop '{lv.name}' "
                     f"(line {lv.pos.line}) writes the same elements of {s.target}; index the store by "
                     f"'{lv.name}' or move it out of the loop")
