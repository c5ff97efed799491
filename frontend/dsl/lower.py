"""Check a tile-DSL kernel and lower it to the tile dialect, for concrete shapes.

The symbolic sizes of the kernel's parameters are bound from the arrays it is called
with, so every loop trip count and every tile size is known here. A loop
``for m in tiles(M, 128)`` becomes an ``scf.for`` over the full tiles plus a peeled copy
of the body for the partial last tile (so every tile op has static sizes and edges need
no masks); ``buffers=b`` unrolls the loop body b times, each copy with buffers of its
own, so one copy's loads run while another computes (multi-buffering). A loop whose
variable bounds an inner loop (``tiles(m.end, 128)``, a causal triangle) is unrolled.

Values: a ``load(x[...])`` is lazy until its use says how to DMA it (transposed for a
matmul's left operand, broadcast over rows next to a wider tile); ``matmul`` is a
pending product until it is accumulated into (or materialised in) the accumulator; a
``zeros(..., acc)`` whose first use is ``acc += matmul(...)`` costs nothing: the
matmul's accumulate flag is off on the first iteration. Every other expression writes
a fresh on-chip buffer (hoisted to the kernel's entry; plan-sram gives each its bytes),
or the buffer of the variable it is assigned to when that variable outlives the loop.

Every op built carries ``tilecc.loc = "file:line:col"`` of the DSL construct it came
from (the attribute the graph lowering uses for torch source locations).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    FunctionType,
    IndexType,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    TensorType,
    UnitAttr,
    i1,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue

from tilecc.errors import (
    DslError,
    DslMatmulError,
    DslMemoryError,
    DslNameError,
    DslRaceError,
    DslShapeError,
    DslTypeError,
)
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.parser import excerpt
from tilecc.ir import tile
from tilecc.passes.tile.plan_sram import ALIGN
from tilecc.simulator.config import HardwareConfig

DTYPES: dict[str, Attribute] = {
    "f32": Float32Type(), "bf16": BFloat16Type(), "f16": Float16Type(), "i32": IntegerType(32),
}
ITEM = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4}
FLOATS = ("f32", "bf16", "f16")
UNARY = set(tile.UNARY_FNS) - {"copy"}
BIN = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "**": "pow", "==": "eq", "!=": "ne",
       "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
COMMUTATIVE = {"add", "mul", "max", "min", "eq", "ne"}
FLIP = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}
RESIDENT_CONST_FRACTION = 32  # constant tiles up to 1/32 of an SRAM partition per row: loaded once, kept
INTERLEAVE_MAX = 4  # a transposed slice of up to this many array heights is loaded by one DMA (interleaved)
SMALL_FILL_COLS = 64  # tiles filled in a loop up to this many columns: a vector copy, not a DMA


# ---- values ------------------------------------------------------------------------
@dataclass
class TileVar:
    """A loop variable: the tile starting at `start` (an index value or an int) of
    `size` elements (static in each copy of the body), `tile` at most."""

    name: str
    start: SSAValue | int
    size: int
    tile: int
    extent: int
    index: SSAValue | int  # the iteration number
    pos: A.Pos
    is_range: bool = False


@dataclass
class Value:
    """An on-chip tile: the leading `rows x cols` of buffer `buf` (static shape `shape`)."""

    buf: SSAValue
    dtype: str
    space: str
    shape: tuple[int, int]
    rows: int
    cols: int
    pos: A.Pos
    zero: bool = False  # still all zeros (nothing written yet; `zeros` in acc before a matmul)
    zero_loops: list = field(default_factory=list)  # loops entered since (their iteration numbers)
    # a `zeros` in SRAM whose first use is `x += ...`, not filled yet: (block, the op to
    # fill after, loc, inside a loop); that use writes its value straight into x when it is the first
    # execution, else emits the fill there (aug_assign)
    pending_fill: tuple | None = None

    def describe(self) -> str:
        return f"{self.dtype}[{self.rows} x {self.cols}] in {self.space}"


@dataclass
class Lazy:
    """`load(x[...])`: the HBM slice, DMA'd when its use is known."""

    param: str
    tensor: SSAValue
    dtype: str
    indices: list[SSAValue | int]  # start per HBM dim
    kept: list[int]  # HBM dims of the tile (0, 1 or 2 of them)
    sizes: list[int]  # actual size per kept dim
    tiles: list[int]  # static size per kept dim
    pos: A.Pos
    node: A.Node | None = None  # the load() call (keys its buffers)
    cast_to: str | None = None  # a cast applied after the DMA (a lazily broadcast row)

    @property
    def shape(self) -> tuple[int, int]:
        return _two(self.tiles)

    @property
    def actual(self) -> tuple[int, int]:
        return _two(self.sizes)

    @property
    def is_row(self) -> bool:
        return len(self.kept) <= 1


def _two(v: Sequence[int]) -> tuple[int, int]:
    return (1, 1) if not v else ((1, v[0]) if len(v) == 1 else (v[0], v[1]))


@dataclass
class Product:
    """A pending ``sum_i lhsT_i^T @ rhs_i``: operands already on chip, the contraction in
    parts of at most the array's rows."""

    parts: list[tuple[Value, Value]]
    m: int
    k: int
    n: int
    shape: tuple[int, int]
    pos: A.Pos


@dataclass
class Const:
    """A tile known at compile time (index ids of static loop tiles, and arithmetic on
    them): folded until used, then a DMA from an HBM constant."""

    data: np.ndarray  # f32, [rows x cols]; a row [1 x C] or column [R x 1] broadcasts
    pos: A.Pos
    kind: str = "tile"  # "row" (broadcast over rows), "col" or "tile"


Scalar = int | float  # compile-time numbers
Idx = SSAValue  # a run-time index (loop arithmetic)


# ---- the lowering ------------------------------------------------------------------
class KernelLowering:
    def __init__(self, kernel: A.Kernel, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig,
                 target: str = "", schedule: bool = True):
        self.k = kernel
        self.cfg = cfg
        self.target = target or cfg.name
        self.schedule = schedule  # list-schedule each block for the engines (schedule.py)
        self.symbols: dict[str, int] = {}
        self.scopes: list[dict[str, object]] = [{}]
        self.tensors: dict = {}
        self._bind(shapes)
        params = kernel.params + kernel.results
        types = [MemRefType(DTYPES[p.type.dtype], list(self.dims(p))) for p in params]
        self.func = func.FuncOp(kernel.name, (types, []))
        self.func.attributes[tile.KERNEL_ATTR] = UnitAttr()
        self.entry = self.func.body.block  # the prologue: hoisted buffers and constants
        self.block = self.top = Block()  # the body, appended to the prologue at the end
        self._idx_loaded: set = set()
        self._evac: tuple[str, float] | None = None  # the scale of a transpose's copy back
        self.cse = True  # loads at static indices of read-only tensors are shared
        self._cse: dict[tuple, Value] = {}
        self._cse_nodes: dict[tuple, A.Node] = {}
        self.unroll_depth = 0  # inside an unrolled loop (where shared loads pay off)
        self._scratch_turn = 0  # shared transpose scratch (alternating) for shared tiles
        self.scratch_buffers = 2
        self.tensors = {p.name: (a, p) for p, a in zip(params, self.entry.args)}
        self.outputs = {p.name for p in kernel.results}
        self.consts: list[tuple[np.ndarray, str]] = []
        self._const_args: dict[tuple, SSAValue] = {}
        self._idx: dict[int, SSAValue] = {}
        self._bufs: dict[tuple, tuple[SSAValue, A.Pos, str]] = {}
        self.stmt_stack: list[tuple[list[A.Stmt], int]] = []  # (body, index) of each statement being lowered
        self._names: dict[str, int] = {}
        self.slot: tuple[int, ...] = ()  # the multi-buffering copy we are in
        self.loops: list[TileVar] = []
        self.loc = ""
        self.name_hint = "t"  # temporaries are named after the variable being assigned
        self.unrolled = _loops_bounding_inner(kernel.body)
        self.lazy_zero = _lazy_zero_assigns(kernel.body)
        self.lazy_zero_calls = set(self.lazy_zero.values())
        self.written: dict[str, list] = {}

    # ---- errors ----------------------------------------------------------------
    def err(self, cls: type[DslError], pos: A.Pos, msg: str) -> DslError:
        where = (self.k.filename, pos.line, pos.col)
        return cls(f"{self.k.filename}:{pos.line}:{pos.col}: {msg}", where,
                   excerpt(self.k.source, pos.line, pos.col))

    # ---- shapes ----------------------------------------------------------------
    def _bind(self, shapes: Sequence[tuple[int, ...]]) -> None:
        k = self.k
        if len(shapes) != len(k.params):
            raise self.err(DslShapeError, k.pos, f"kernel {k.name} takes {len(k.params)} tensor(s) "
                           f"({', '.join(p.name for p in k.params)}), got {len(shapes)}")
        for p, shape in zip(k.params, shapes):
            dims = p.type.dims
            for d in dims:
                if isinstance(d, A.Expr):
                    raise self.err(DslShapeError, d.pos, f"the sizes of parameter '{p.name}' must be names or "
                                   "numbers (expressions are for result sizes)")
            if len(shape) != len(dims):
                raise self.err(DslShapeError, p.pos, f"'{p.name}' is declared with {len(dims)} dimension(s) "
                               f"{_fmt_dims(dims)}, got an array of shape {tuple(shape)}")
            for d, n in zip(dims, shape):
                want = d if isinstance(d, int) else self.symbols.get(d)
                if want is not None and want != n:
                    what = f"{d} = {want} (bound earlier)" if isinstance(d, str) else str(d)
                    raise self.err(DslShapeError, p.pos, f"shape mismatch: '{p.name}' has shape {tuple(shape)} "
                                   f"but its type {p.type.dtype}{_fmt_dims(dims)} needs {what}")
                if isinstance(d, str):
                    self.symbols[d] = int(n)
        self.result_dims: dict[str, tuple[int, ...]] = {}
        for p in k.results:
            out = []
            for d in p.type.dims:
                if isinstance(d, str) and d not in self.symbols:
                    raise self.err(DslNameError, p.type.pos, f"undefined size '{d}' in the result type "
                                   "(every result size must be an input's size or a number)")
                n = d if isinstance(d, int) else self.symbols[d] if isinstance(d, str) else self.static_int(d, "a result size")
                if n < 0:
                    raise self.err(DslShapeError, p.type.pos, f"result '{p.name}' would have a negative size {n}")
                out.append(n)
            self.result_dims[p.name] = tuple(out)

    def dims(self, p: A.Param) -> tuple[int, ...]:
        if p.name in self.result_dims:
            return self.result_dims[p.name]
        return tuple(d if isinstance(d, int) else self.symbols[d] for d in p.type.dims)

    # ---- building --------------------------------------------------------------
    def add(self, op: Operation) -> Operation:
        op.attributes["tilecc.loc"] = StringAttr(self.loc)
        self.block.add_op(op)
        return op

    def _entry(self, op: Operation) -> SSAValue:
        op.attributes["tilecc.loc"] = StringAttr(self.loc)
        self.entry.add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def idx(self, v: SSAValue | int) -> SSAValue:
        if not isinstance(v, int):
            return v
        if v not in self._idx:
            self._idx[v] = self._entry(arith.ConstantOp.from_int_and_width(v, IndexType()))
        return self._idx[v]

    def flag(self, v: bool) -> SSAValue:
        key = -1 - int(v)  # beside the index constants
        if key not in self._idx:
            self._idx[key] = self._entry(arith.ConstantOp.from_int_and_width(int(v), i1))
        return self._idx[key]

    def iadd(self, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if b == 0:
            return a
        if a == 0:
            return b
        return self.add(arith.AddiOp(self.idx(a), self.idx(b))).results[0]

    def isub(self, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a - b
        if b == 0:
            return a
        return self.add(arith.SubiOp(self.idx(a), self.idx(b))).results[0]

    def imul(self, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if b == 1:
            return a
        if a == 1:
            return b
        return self.add(arith.MuliOp(self.idx(a), self.idx(b))).results[0]

    def buffer(self, node: A.Node, shape: tuple[int, int], dtype: str, space: str, name: str) -> SSAValue:
        """The on-chip buffer of `node` in this multi-buffering copy (hoisted to the entry)."""
        rows, cols = shape
        parts = self.cfg.sram.partitions if space == tile.SRAM else self.cfg.accumulator.partitions
        if rows > parts:
            raise self.err(DslShapeError, node.pos, f"partition dimension too large: the tile {name} "
                           f"{dtype}[{rows} x {cols}] has {rows} rows but {space} on target '{self.target}' "
                           f"has {parts} partitions")
        key = (id(node), self.slot, shape, dtype, space, name)
        if key not in self._bufs:
            n = self._names.get(name, 0)
            self._names[name] = n + 1
            unique = name if n == 0 else f"{name}{n}"
            op = tile.AllocOp(tile.onchip_type([rows, max(cols, 1)], DTYPES[dtype], space), unique)
            self._bufs[key] = (self._entry(op), node.pos, unique)
        return self._bufs[key][0]

    def const_tensor(self, data: np.ndarray, dtype: str) -> SSAValue:
        """An HBM constant, passed to the kernel as an extra argument."""
        key = (dtype, data.shape, data.tobytes())
        if key not in self._const_args:
            t = MemRefType(DTYPES[dtype], list(data.shape))
            self._const_args[key] = self.entry.insert_arg(t, len(self.entry.args))
            self.consts.append((data, dtype))
        return self._const_args[key]

    # ---- scopes ----------------------------------------------------------------
    def lookup(self, name: str, pos: A.Pos) -> object:
        if name in ("True", "False") and not self._is_defined(name):
            return int(name == "True")
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.symbols:
            return self.symbols[name]
        if name in self.tensors:
            raise self.err(DslNameError, pos, f"'{name}' is an HBM tensor; read a tile of it with load({name}[...])")
        raise self.err(DslNameError, pos, f"undefined name '{name}'")

    def defined_outside(self, name: str) -> object | None:
        for scope in reversed(self.scopes[:-1]):
            if name in scope:
                return scope[name]
        return None

    @contextmanager
    def scope(self) -> Iterator[None]:
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()

    # ---- the kernel ------------------------------------------------------------
    def run(self) -> func.FuncOp:
        self.stmts(self.k.body)
        self.loc = self._loc(self.k.pos)
        for op in list(self.top.ops):
            op.detach()
            self.entry.add_op(op)
        self.entry.add_op(func.ReturnOp())
        self.func.function_type = FunctionType.from_lists([a.type for a in self.entry.args], [])
        self.check_memory()
        if self.schedule:
            from tilecc.frontend.dsl.schedule import schedule_kernel

            schedule_kernel(self.func, self.cfg)
        return self.func

    def _loc(self, pos: A.Pos) -> str:
        return f"{self.k.filename}:{pos.line}:{pos.col}"

    def check_memory(self) -> None:
        """All buffers of a kernel live for the whole kernel (plan-sram): they must fit."""
        for space, cap in ((tile.SRAM, self.cfg.sram.bytes_per_partition),
                           (tile.ACC, self.cfg.accumulator.bytes_per_partition)):
            bufs = []
            for (_, _, shape, dtype, sp, _), (_, pos, name) in self._bufs.items():
                if sp == space:
                    bufs.append((-(-shape[1] * ITEM[dtype] // ALIGN) * ALIGN, name, pos, dtype, shape))
            total = sum(b[0] for b in bufs)
            if total <= cap:
                continue
            bufs.sort(key=lambda b: -b[0])
            listing = ", ".join(f"{n} {d}[{s[0]} x {s[1]}] ({b} B, line {p.line})" for b, n, p, d, s in bufs[:8])
            more = f" and {len(bufs) - 8} more" if len(bufs) > 8 else ""
            worst = bufs[0][2]
            raise self.err(DslMemoryError, worst, f"on-chip buffers do not fit: {space} needs {total} bytes per "
                           f"partition, target '{self.target}' has {cap}; live at the peak: {listing}{more}")

    # ---- statements ------------------------------------------------------------
    def stmts(self, body: list[A.Stmt]) -> None:
        for i, s in enumerate(body):
            self.loc = self._loc(s.pos)
            self.stmt_stack.append((body, i))
            try:
                self.stmt(s)
            finally:
                self.stmt_stack.pop()

    def dead_acc_tile(self, shape: tuple[int, int]) -> Value | None:
        """An f32 accumulator tile of at least static `shape` (its leading window when
        larger), bound to a name in scope, whose value is dead here: the current statement
        does not read it and no later statement does before overwriting it
        (`_dead_after`). Transposes use it as their scratch, so a kernel's score tile
        doubles as the scratch of P's transposes (and of K's). Preferred: a tile the
        statement does not itself assign (using that one would make the transposes wait
        for its last reader), then one of exactly `shape`."""
        body, i = self.stmt_stack[-1]
        cur = body[i]
        reads = _reads(cur)
        visible: dict[str, object] = {}
        for scope in self.scopes:  # inner bindings shadow outer ones
            visible.update(scope)
        best: tuple[tuple[bool, bool], Value] | None = None
        for name, v in visible.items():
            if not (isinstance(v, Value) and v.space == tile.ACC and v.dtype == "f32"
                    and v.shape[0] >= shape[0] and v.shape[1] >= shape[1]):
                continue
            if v.zero or name in reads:
                continue
            target = isinstance(cur, A.Assign) and cur.target == name
            # this statement overwrites it (after its operands, scratch included), or
            # nothing reads it again before it is overwritten
            if not (target or _dead_after(name, self.stmt_stack)):
                continue
            rank = (target, v.shape != shape)
            if best is None or rank < best[0]:
                best = (rank, v)
        if best is None:
            return None
        v = best[1]
        if v.shape == shape:
            return v
        sub = self.add(tile.SubviewOp(v.buf, self.idx(0), self.idx(0), list(shape))).results[0]
        return Value(sub, v.dtype, v.space, shape, shape[0], shape[1], v.pos)

    def stmt(self, s: A.Stmt) -> None:
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

    def assign(self, s: A.Assign) -> None:
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

    def bind(self, s: A.Assign, v: Value) -> None:
        old = self.defined_outside(s.target)
        if isinstance(old, Value):
            self.write_into(s, old, v)
        else:
            self.scopes[-1][s.target] = v

    def write_into(self, s: A.Stmt, dest: Value, v: object) -> None:
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
            raise self.err(DslTypeError, s.pos, f"cannot assign a scalar to the tile '{_target(s)}'")
        self.check_same(dest, v.dtype, (v.rows, v.cols), s.pos, "assignment")
        self.add(tile.UnaryOp("copy", v.buf, dest.buf, self.idx(v.rows), self.idx(v.cols)))
        dest.rows, dest.cols, dest.zero = v.rows, v.cols, False

    def check_same(self, dest: Value, dtype: str, sizes: tuple[int, int], pos: A.Pos, what: str) -> None:
        if dtype != dest.dtype:
            raise self.err(DslTypeError, pos, f"dtype mismatch in {what}: the tile is {dest.dtype} "
                           f"(line {dest.pos.line}), the value {dtype}; cast it with {dest.dtype}(...)")
        if sizes[0] > dest.shape[0] or sizes[1] > dest.shape[1]:
            raise self.err(DslShapeError, pos, f"shape mismatch in {what}: a [{sizes[0]} x {sizes[1]}] value "
                           f"does not fit the tile {dest.dtype}[{dest.shape[0]} x {dest.shape[1]}] (line {dest.pos.line})")

    def aug_assign(self, s: A.AugAssign) -> None:
        cur = self.lookup(s.target, s.pos)
        if not isinstance(cur, Value):
            if isinstance(cur, (int, float)) and not isinstance(cur, bool):
                rhs = self.ev(s.value)
                self.scopes[-1][s.target] = self.scalar_op(BIN[s.op], cur, rhs, s.pos)
                return
            raise self.err(DslTypeError, s.pos, f"'{s.target}' is not a tile")
        self._aug(s, cur)

    def _aug(self, s: A.AugAssign | A.AugStore, cur: Value) -> None:
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
            fill = self._fill_op(cur, 0.0, in_loop)  # a loop runs the += more than once: fill where zeros was
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

    def first_iteration_flag(self, acc: Value) -> SSAValue:
        """The accumulate flag of the first matmul into a zeroed accumulator: off on the
        first iteration of the loops entered since `zeros`."""
        total: SSAValue | int = 0
        for lv in self.loops[len(acc.zero_loops):]:
            total = self.iadd(total, lv.index)
        if isinstance(total, int):
            return self.flag(total != 0)
        return self.add(arith.CmpiOp(total, self.idx(0), "ne")).results[0]

    def check_acc_target(self, dest: Value, p: Product, pos: A.Pos) -> None:
        if dest.space != tile.ACC or dest.dtype != "f32":
            raise self.err(DslMatmulError, pos, f"matmul accumulates into an f32 tile in acc, not into "
                           f"{dest.dtype} in {dest.space} (line {dest.pos.line}); declare it zeros(f32[..], acc)")
        if p.m > dest.shape[0] or p.n > dest.shape[1]:
            raise self.err(DslShapeError, pos, f"shape mismatch: the product [{p.m} x {p.n}] does "
                           f"not fit the accumulator f32[{dest.shape[0]} x {dest.shape[1]}] (line {dest.pos.line})")

    def tile_window(self, name: str, indices: list[A.Expr], pos: A.Pos) -> Value:
        """``x[:, a:b]``: columns [a, b) of the on-chip tile x (a, b known when the kernel
        is compiled), a view of x's buffer."""
        v = self.lookup(name, pos)
        if not isinstance(v, Value):
            raise self.err(DslTypeError, pos, f"'{name}' cannot be indexed (only HBM tensors and on-chip tiles can)")
        if len(indices) != 2 or not isinstance(indices[0], A.FullSlice):
            raise self.err(DslShapeError, pos, f"an on-chip tile is windowed by columns: {name}[:, a:b] "
                           f"(the rows stay whole)")
        ix = indices[1]
        if isinstance(ix, A.FullSlice):
            return v
        if not isinstance(ix, A.RangeSlice):
            raise self.err(DslShapeError, ix.pos, f"a window of {name} is a column range a:b, not a single column")
        lo = self.static_int(ix.lo, "a window bound")
        hi = self.static_int(ix.hi, "a window bound")
        limit = v.shape[1]
        if not 0 <= lo < hi <= limit:
            raise self.err(DslShapeError, ix.pos, f"window {lo}:{hi} is outside the columns 0:{limit} of "
                           f"{name} {v.describe()} (line {v.pos.line})")
        return self.window(v, lo, hi - lo, hi - lo)

    def aug_store(self, s: A.AugStore) -> None:
        if s.target in self.tensors:
            raise self.err(DslTypeError, s.pos, f"{s.target}[...] {s.op}= ...: HBM tensors are stored, not updated; "
                           f"load, compute and store")
        self._aug(s, self.tile_window(s.target, s.indices, s.pos))

    def store(self, s: A.Store) -> None:
        if s.target not in self.tensors:
            if self._is_defined(s.target):
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

    def _is_defined(self, name: str) -> bool:
        return any(name in sc for sc in self.scopes)

    @staticmethod
    def store_dims(sl: Lazy, got: tuple[int, int]) -> tuple[int, int]:
        if len(sl.kept) == 2:
            return sl.kept[0], sl.kept[1]
        if len(sl.kept) == 1:
            return sl.kept[0], sl.kept[0]
        d = len(sl.indices) - 1
        return d, d

    def check_race(self, s: A.Store) -> None:
        used = set()
        for i in s.indices:
            used |= _names_in(i)
        for lv in self.loops:
            if lv.name in used or lv.extent <= 1 and lv.size == lv.extent:
                continue
            raise self.err(DslRaceError, s.pos, f"race: every iteration of the parallel loop '{lv.name}' "
                           f"(line {lv.pos.line}) writes the same elements of {s.target}; index the store by "
                           f"'{lv.name}' or move it out of the loop")

    # ---- loops -----------------------------------------------------------------
    def for_(self, s: A.For) -> None:
        it = s.iter
        if it.fn not in ("tiles", "range"):
            raise self.err(DslNameError, it.pos, f"unknown iterator '{it.fn}' (loops run over tiles(extent, size) "
                           "or range(n))")
        is_range = it.fn == "range"
        want = (1,) if is_range else (2, 3)
        if len(it.args) not in want:
            raise self.err(DslTypeError, it.pos, f"{it.fn}() takes {' or '.join(map(str, want))} arguments, "
                           f"got {len(it.args)}")
        lo = 0
        if len(it.args) == 3:  # tiles(start, stop, size)
            lo = self.static_int(it.args[0], "a loop start")
            it = A.Call(it.pos, it.fn, it.args[1:], it.kwargs)
        for kw in it.kwargs:
            if kw not in ("buffers", "unroll", "reverse"):
                raise self.err(DslNameError, it.pos, f"unknown argument '{kw}' of {it.fn}() (allowed: buffers, "
                               f"unroll, reverse)")
        extent = self.static_int(it.args[0], "a loop extent") - lo
        size = 1 if is_range else self.static_int(it.args[1], "a tile size")
        bufs = self.static_int(it.kwargs["buffers"], "a buffer count") if "buffers" in it.kwargs else 1
        if size < 1 or bufs < 1 or extent < 0:
            raise self.err(DslShapeError, it.pos, f"{it.fn}(): sizes must be positive, got extent {extent}, "
                           f"size {size}, buffers {bufs}")
        full, rem = divmod(extent, size)

        def body(start, n, index, slot):
            lv = TileVar(s.var, self.iadd(start, lo), n, size, extent + lo, index, s.pos, is_range)
            saved = self.slot
            self.slot = saved + ((id(s), slot),)
            self.loops.append(lv)
            with self.scope():
                self.scopes[-1][s.var] = lv.start if is_range else lv
                self.stmts(s.body)
            self.loops.pop()
            self.slot = saved
            self.loc = self._loc(s.pos)

        unroll = "unroll" in it.kwargs and bool(self.static_int(it.kwargs["unroll"], "unroll"))
        reverse = "reverse" in it.kwargs and bool(self.static_int(it.kwargs["reverse"], "reverse"))
        if id(s) in self.unrolled or unroll or reverse:
            # unrolled; `reverse` runs the tiles last to first (the heaviest first in a
            # causal triangle, as FlashAttention-2 orders its query blocks)
            self.unroll_depth += 1
            order = range(full + (rem > 0))
            for n, i in enumerate(reversed(order) if reverse else order):
                body(i * size, min(size, extent - i * size), i, n % bufs)
            self.unroll_depth -= 1
            return
        trip, left = divmod(full, bufs)
        if trip == 1:
            for u in range(bufs):
                body(u * size, size, u, u)
        elif trip > 1:
            with self.loop(trip) as iv:
                for u in range(bufs):
                    index = self.iadd(self.imul(iv, bufs), u)
                    body(self.imul(index, size), size, index, u)
        for u in range(left):
            i = trip * bufs + u
            body(i * size, size, i, u)
        if rem:
            body(full * size, rem, full, full % bufs)

    @contextmanager
    def loop(self, trip: int) -> Iterator[SSAValue]:
        blk = Block(arg_types=[IndexType()])
        outer = self.block
        self.add(scf.ForOp(self.idx(0), self.idx(trip), self.idx(1), [], blk))
        self.block = blk
        try:
            yield blk.args[0]
        finally:
            blk.add_op(scf.YieldOp())
            self.block = outer

    def static_int(self, e: A.Expr, what: str) -> int:
        v = self.ev(e)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int):
            raise self.err(DslTypeError, e.pos, f"{what} must be a number known when the kernel is compiled "
                           "(sizes, constants, or attributes of an enclosing loop that bounds this one)")
        return v

    # ---- expressions -----------------------------------------------------------
    def ev(self, e: A.Expr, dest: Value | None = None, hint: str | None = None) -> object:
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

    def attr(self, e: A.Attr) -> object:
        if isinstance(e.value, A.Name) and e.value.id == "target" and not self._is_defined("target"):
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

    def shift(self, lv: TileVar, off: object, fn: str, pos: A.Pos) -> TileVar:
        """`m + k`: the tile of loop m moved by index k (a convolution window)."""
        if isinstance(off, float) and off.is_integer():
            off = int(off)
        if not isinstance(off, (int, SSAValue)):
            raise self.err(DslTypeError, pos, "a loop tile moves by an index")
        start = self.iadd(lv.start, off) if fn == "add" else self.isub(lv.start, off)
        sign = 1 if fn == "add" else -1
        extent = lv.extent + sign * off if isinstance(off, int) else lv.extent
        return TileVar(lv.name, start, lv.size, lv.tile, extent, lv.index, lv.pos)

    def scalar_op(self, fn: str, a: object, b: object, pos: A.Pos) -> object:
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

    def binop(self, fn: str, a: object, b: object, pos: A.Pos, node: A.Node,
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
            raise self.err(DslTypeError, pos, f"dtype mismatch in '{_sym(fn)}': {a.describe()} and {b.describe()}; "
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
            raise self.err(DslShapeError, pos, f"shape mismatch in '{_sym(fn)}': {a.describe()} and {b.describe()}")
        if swap and fn in COMMUTATIVE:
            swap = False
        elif swap and fn in FLIP:
            fn, swap = FLIP[fn], False
        out_dtype = a.dtype if hint is None else hint
        out = self.out_buf(node, out_dtype, (a.rows, a.cols), a.shape, dest, pos)
        self.add(tile.BinaryOp(fn, a.buf, b.buf, out.buf, self.idx(a.rows), self.idx(a.cols), mode, swap))
        return out

    def product_plus_const(self, fn: str, p: Product, c: Const, dest: Value, node: A.Node, pos: A.Pos) -> Value:
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

    def fold(self, fn: str, a: object, b: object, pos: A.Pos) -> object | None:
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

    def const_value(self, c: Const, other: object, node: A.Node) -> Value:
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

    def out_buf(self, node: A.Node, dtype: str, sizes: tuple[int, int], shape: tuple[int, int],
                dest: Value | None, pos: A.Pos, space: str = tile.SRAM) -> Value:
        if dest is not None and dest.dtype in FLOATS and dtype in FLOATS:
            self.check_same(dest, dest.dtype, sizes, pos, "assignment")
            dest.rows, dest.cols, dest.zero = sizes[0], sizes[1], False
            return dest
        if dtype not in FLOATS:
            raise self.err(DslTypeError, pos, f"vector arithmetic on {dtype} tiles is not supported; cast to f32")
        buf = self.buffer(node, shape, dtype, space, self.name_hint)
        return Value(buf, dtype, space, shape, sizes[0], sizes[1], node.pos)

    def cast(self, v: Value, dtype: str, node: A.Node, dest: Value | None = None) -> Value:
        if dtype not in FLOATS:
            raise self.err(DslTypeError, node.pos, f"casts to {dtype} are not supported (tiles are float)")
        if dest is None:
            out = Value(self.buffer(node, v.shape, dtype, tile.SRAM, f"cast_{dtype}"), dtype, tile.SRAM,
                        v.shape, v.rows, v.cols, node.pos)
        else:
            out = self.out_buf(node, dtype, (v.rows, v.cols), v.shape, dest, node.pos)
        self.add(tile.UnaryOp("copy", v.buf, out.buf, self.idx(v.rows), self.idx(v.cols)))
        return out

    # ---- tiles in and out --------------------------------------------------------
    def slice(self, name: str, indices: list[A.Expr], pos: A.Pos) -> Lazy:
        tensor, p = self.tensors[name]
        shape = self.dims(p)
        if len(indices) != len(shape):
            raise self.err(DslShapeError, pos, f"'{name}' has {len(shape)} dimension(s), indexed with {len(indices)}")
        starts: list[SSAValue | int] = []
        kept, sizes, tiles = [], [], []
        for d, (ix, n) in enumerate(zip(indices, shape)):
            if isinstance(ix, A.FullSlice):
                starts.append(0)
                kept.append(d)
                sizes.append(n)
                tiles.append(n)
                continue
            if isinstance(ix, A.RangeSlice):
                raise self.err(DslShapeError, ix.pos, f"HBM tensors are sliced by tiles: index '{name}' with a "
                               f"tiles() loop variable, ':' or a scalar index")
            v = self.ev(ix)
            if isinstance(v, TileVar):
                if v.extent > n:
                    raise self.err(DslShapeError, ix.pos, f"shape mismatch: '{v.name}' runs over {v.extent} elements "
                                   f"but dimension {d} of '{name}' has {n}")
                starts.append(v.start)
                kept.append(d)
                sizes.append(v.size)
                tiles.append(v.tile)
                continue
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, int):
                if not 0 <= v < n:
                    raise self.err(DslShapeError, ix.pos, f"index {v} out of range for dimension {d} of '{name}' (size {n})")
            elif not isinstance(v, SSAValue):
                raise self.err(DslTypeError, ix.pos, f"an index of '{name}' must be a loop tile, an index or ':'")
            starts.append(v)
        if len(kept) > 2:
            raise self.err(DslShapeError, pos, f"a tile has at most 2 dimensions; {name}[...] keeps {len(kept)} "
                           "(index the others with a number or a loop index)")
        return Lazy(name, tensor, p.type.dtype, starts, kept, sizes, tiles, pos)

    def load_into(self, lz: Lazy, buf: SSAValue, layout: str, sizes: tuple[int, int],
                  bcast_rows: int | None = None) -> None:
        idx = [self.idx(i) for i in lz.indices]
        kept = lz.kept
        if len(kept) == 2:
            rd, cd = (kept[0], kept[1]) if layout == "normal" else (kept[1], kept[0])
        elif len(kept) == 1:
            rd, cd = (-1 if bcast_rows is not None else kept[0]), kept[0]
        else:
            rd, cd = (-1 if bcast_rows is not None else len(idx) - 1), len(idx) - 1
        self.add(tile.LoadOp(lz.tensor, idx, buf, self.idx(sizes[0]), self.idx(sizes[1]), rd, cd))

    def cse_key(self, v: Lazy, layout: str, bcast: Value | None) -> tuple | None:
        """Loads of tensors the kernel never writes are loaded once per execution of the
        innermost scf.for body (unrolled loops reading the same tile share it; indices
        are static or values fixed in that body, such as a head loop's index)."""
        # an index may be a run-time value (a `range` loop's index): it is the same
        # throughout one execution of the block the key names
        if not self.cse or not self.unroll_depth or v.param in self.outputs:
            return None
        if v.tensor not in {a for a, _ in self.tensors.values()}:
            return None
        # valid within the innermost scf.for body (a loop body reloads on every iteration)
        return (id(self.block), v.param, tuple(v.indices), tuple(v.kept), tuple(v.sizes), tuple(v.tiles),
                layout, v.cast_to, None if bcast is None else bcast.rows)

    def cse_node(self, key: tuple, pos: A.Pos) -> A.Node:
        if key not in self._cse_nodes:
            self._cse_nodes[key] = A.Node(pos)
        return self._cse_nodes[key]

    def materialise(self, v: object, node: A.Node, bcast: Value | None = None, layout: str = "normal",
                    cse: bool = True) -> Value:
        if isinstance(v, Value):
            return v
        if isinstance(v, Product):
            buf = self.buffer(node, v.shape, "f32", tile.ACC, "prod")
            out = Value(buf, "f32", tile.ACC, v.shape, v.m, v.n, node.pos)
            self.emit_matmul(v, out, accumulate=False)
            return out
        if isinstance(v, Lazy) and cse and self.cse_key(v, layout, bcast) is not None:
            key = self.cse_key(v, layout, bcast)
            if key not in self._cse:
                saved, self.slot = self.slot, ()
                self._cse[key] = self.materialise(dataclasses.replace(v, node=self.cse_node(key, v.pos)), node, bcast, layout,
                                                  cse=False)
                self.slot = saved
            return self._cse[key]
        if isinstance(v, Lazy):
            if v.dtype not in FLOATS:
                raise self.err(DslTypeError, v.pos, f"tiles of {v.dtype} tensors are not supported")
            if bcast is not None:
                shape, sizes = (bcast.shape[0], v.shape[1]), (bcast.rows, v.actual[1])
                buf = self.buffer(node, shape, v.dtype, tile.SRAM, v.param)
                self.load_into(v, buf, "normal", sizes, bcast_rows=bcast.rows)
                out = Value(buf, v.dtype, tile.SRAM, shape, sizes[0], sizes[1], v.pos)
                return out if v.cast_to is None else self.cast(out, v.cast_to, v.node or node)
            shape, sizes = v.shape, v.actual
            if layout == "transposed":
                shape, sizes = shape[::-1], sizes[::-1]
            buf = self.buffer(v.node or node, shape, v.dtype, tile.SRAM, v.param + ("T" if layout == "transposed" else ""))
            self.load_into(v, buf, layout, sizes)
            out = Value(buf, v.dtype, tile.SRAM, shape, sizes[0], sizes[1], v.pos)
            return out if v.cast_to is None else self.cast(out, v.cast_to, v.node or node)
        if isinstance(v, Const):
            return self.const_value(v, bcast, node)
        if isinstance(v, TileVar):
            raise self.err(DslTypeError, node.pos, f"'{v.name}' is a loop tile, not a tile of data")
        raise self.err(DslTypeError, node.pos, "expected a tile, got a number or an index")

    # ---- calls -------------------------------------------------------------------
    def call(self, e: A.Call, dest: Value | None, hint: str | None) -> object:
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

    def nargs(self, e: A.Call, n: int) -> None:
        if len(e.args) != n:
            raise self.err(DslTypeError, e.pos, f"{e.fn}() takes {n} argument(s), got {len(e.args)}")

    def unary(self, fn: str, v: object, e: A.Call, dest: Value | None, hint: str | None) -> Value:
        t = self.materialise(v, e.args[0])
        out = self.out_buf(e, hint or t.dtype, (t.rows, t.cols), t.shape, dest, e.pos)
        self.add(tile.UnaryOp(fn, t.buf, out.buf, self.idx(t.rows), self.idx(t.cols)))
        return out

    def reduce(self, fn: str, v: object, e: A.Call, dest: Value | None, hint: str | None = None) -> Value:
        t = self.materialise(v, e.args[0])
        if t.dtype not in FLOATS:
            raise self.err(DslTypeError, e.pos, f"{fn}() of {t.dtype} tiles is not supported")
        out = self.out_buf(e, hint or t.dtype, (t.rows, 1), (t.shape[0], 1), dest, e.pos)
        self.add(tile.ReduceOp("sum" if fn == "mean" else fn, t.buf, out.buf, self.idx(t.rows), self.idx(t.cols)))
        if fn == "mean":
            self.add(tile.ScalarOp("mul", out.buf, 1.0 / t.cols, out.buf, self.idx(t.rows), self.idx(1)))
        return out

    def tile_type(self, e: A.Expr, fn: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
        """(dtype, static shape, actual sizes): a size ``m.size`` is m's tile size, with
        the partial size of this copy as the actual one."""
        if not isinstance(e, A.TypeExpr):
            raise self.err(DslTypeError, e.pos, f"{fn}() takes a tile type first, e.g. {fn}(f32[128, 512])")
        dims, actual = [], []
        for d in e.dims:
            lv = self.ev(d.value) if isinstance(d, A.Attr) and d.attr == "size" else None
            if isinstance(lv, TileVar):
                dims.append(lv.tile)
                actual.append(lv.size)
                continue
            dims.append(self.static_int(d, "a tile size"))
            actual.append(dims[-1])
        if len(dims) not in (1, 2):
            raise self.err(DslShapeError, e.pos, f"a tile has 1 or 2 dimensions, got {len(dims)}")
        if e.dtype not in FLOATS:
            raise self.err(DslTypeError, e.pos, f"tiles of {e.dtype} are not supported")
        return (e.dtype, (dims[0], dims[1] if len(dims) == 2 else 1),
                (actual[0], actual[1] if len(actual) == 2 else 1))

    def fill(self, e: A.Call) -> Value:
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

    def _fill(self, v: Value, value: float, e: A.Call) -> Value:
        """Write `value` everywhere in `v` (a DMA from a one-row HBM constant, broadcast
        over the partitions), unless the caller keeps it lazily zero."""
        if value == 0.0 and v.space == tile.ACC and self._lazy_here(e):
            return v
        if value == 0.0 and v.space == tile.SRAM and self._lazy_here(e):
            v.pending_fill = (self.block, self.block.last_op, self.loc, bool(self.loops))
            return v
        self.add(self._fill_op(v, value))
        return v

    def _fill_op(self, v: Value, value: float, in_loop: bool | None = None) -> Operation:
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

    def _lazy_here(self, e: A.Call) -> bool:
        return id(e) in self.lazy_zero_calls

    def ids(self, e: A.Call) -> Value | Lazy:
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

    # ---- the matrix engine -------------------------------------------------------
    def matmul(self, e: A.Call) -> Product:
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

    def engine_operand(self, v: Value, a: A.Node) -> None:
        if v.space != tile.SRAM:
            raise self.err(DslMatmulError, a.pos, f"the matrix engine reads its operands from SRAM, this one is "
                           f"{v.describe()}; cast it first, e.g. bf16(...)")

    def window(self, v: Value, c0: int, width: int, actual: int) -> Value:
        """Columns [c0, c0 + width) of an on-chip tile (a tile.subview)."""
        sub = self.add(tile.SubviewOp(v.buf, self.idx(0), self.idx(c0), [v.shape[0], width])).results[0]
        return Value(sub, v.dtype, v.space, (v.shape[0], width), v.rows, actual, v.pos)

    def sub_lazy(self, lz: Lazy, r0: int, static: int, actual: int, i: int) -> Lazy:
        """Rows [r0, r0 + static) of a lazily loaded 2-D slice."""
        idx = list(lz.indices)
        idx[lz.kept[0]] = self.iadd(idx[lz.kept[0]], r0)
        return dataclasses.replace(lz, indices=idx, sizes=[actual, lz.sizes[1]], tiles=[static, lz.tiles[1]],
                                   param=f"{lz.param}_{i}")

    def emit_matmul(self, p: Product, acc: Value, accumulate: bool | SSAValue) -> None:
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

    def identity(self, n: int, dtype: str) -> SSAValue:
        eye = self.const_tensor(np.eye(n, dtype=np.float32), dtype)
        return self.resident(("identity", n, dtype), eye, [0, 0], (n, n), dtype, "identity", (0, 1))

    def resident(self, key: tuple, src: SSAValue, index: list[int], shape: tuple[int, int], dtype: str,
                 name: str, steps: tuple[int, int]) -> SSAValue:
        """An SRAM buffer of its own per `key`, loaded from the HBM constant `src` once, in
        the prologue, and shared by every copy of the body (identities, fill values)."""
        saved, self.slot = self.slot, ()
        buf = self.buffer(self.cse_node(("resident",) + key, self.k.pos), shape, dtype, tile.SRAM, name)
        self.slot = saved
        if key not in self._idx_loaded:
            self._entry(tile.LoadOp(src, [self.idx(i) for i in index], buf, self.idx(shape[0]), self.idx(shape[1]),
                                    *steps))
            self._idx_loaded.add(key)
        return buf

    def scaled_transpose(self, e: A.BinOp, dest: Value | None) -> Value | None:
        """``transpose(x) * c`` (or ``/ c``, c a number): the copy that brings the
        transpose back from the accumulator scales it on the way (one vector op, not two).
        A shared transpose (a static slice in an unrolled loop) is shared with its scale."""
        fn = BIN.get(e.op)
        if fn not in ("mul", "div"):
            return None
        def is_t(x: A.Expr) -> bool:
            return isinstance(x, A.Call) and x.fn == "transpose" and len(x.args) == 1 and not x.kwargs
        if is_t(e.lhs):
            t, other = e.lhs, e.rhs
        elif fn == "mul" and is_t(e.rhs):
            t, other = e.rhs, e.lhs
        else:
            return None
        if not self._numeric(other):
            return None
        c = self.ev(other)
        if not isinstance(c, (int, float)) or isinstance(c, bool):
            return None
        v = self.ev(t.args[0])
        if dest is not None:
            return self.binop(fn, self.transpose(v, t, None), c, e.pos, e, dest=dest)
        self._evac = (fn, float(c))
        try:
            return self.transpose(v, t, None)
        finally:
            self._evac = None

    def _numeric(self, x: A.Expr) -> bool:
        """x evaluates to a compile-time number without emitting anything."""
        if isinstance(x, A.Number):
            return True
        if isinstance(x, A.Name):
            try:
                return isinstance(self.lookup(x.id, x.pos), (int, float))
            except DslError:
                return False
        if isinstance(x, A.Neg):
            return self._numeric(x.value)
        if isinstance(x, A.BinOp):
            return self._numeric(x.lhs) and self._numeric(x.rhs)
        if isinstance(x, A.Call):
            return x.fn in ("sqrt", "rsqrt", "exp") and not x.kwargs and all(self._numeric(a) for a in x.args)
        return False

    def cse_prefix(self, key: tuple, v: Lazy) -> Value | None:
        """The transpose of a slice that starts where an already transposed, longer slice
        of the same tensor starts: the leading columns of that one (a causal key block
        cut at the diagonal reuses the whole block's K^T)."""
        rows, cols = key[4]
        for k, val in self._cse.items():
            if (len(k) == len(key) and k[:4] == key[:4] and k[6:] == key[6:] and k[4][1] == cols
                    and k[4][0] > rows and val.cols == k[4][0]):
                return Value(val.buf, val.dtype, val.space, val.shape, val.rows, rows, v.pos)
        return None

    def transpose(self, v: object, node: A.Node, dest: Value | None) -> Value:
        """x^T on the matrix engine (``x^T @ I`` into the accumulator, then a copy back to
        SRAM in x's dtype); a lazily loaded slice taller than the array is loaded and
        transposed in blocks of the array's size, side by side."""
        n0 = min(self.cfg.matrix.rows, self.cfg.matrix.cols, self.cfg.sram.partitions)
        key = self.cse_key(v, "T", None) if isinstance(v, Lazy) and dest is None else None
        if key is not None and self._evac is not None:
            key += (self._evac,)
        if key is not None and key not in self._cse:
            prefix = self.cse_prefix(key, v)
            if prefix is not None:
                return prefix
        if key is not None:
            if key not in self._cse:
                saved, self.slot = self.slot, ()
                self.cse, was = False, self.cse
                try:
                    self._scratch_turn = (self._scratch_turn + 1) % self.scratch_buffers
                    self._cse[key] = self.transpose(v, self.cse_node(key, v.pos), None)
                finally:
                    self.cse, self.slot = was, saved
            return self._cse[key]
        if isinstance(v, Lazy) and not v.is_row and v.shape[0] > n0:
            fast = self.interleaved_transpose(v, node, n0)
            if fast is not None:
                return fast
            blocks = [self.materialise(self.sub_lazy(v, r0, min(n0, v.shape[0] - r0), min(n0, v.actual[0] - r0), i),
                                       node)
                      for i, r0 in enumerate(range(0, v.shape[0], n0)) if r0 < v.actual[0]]
            return self.transpose_blocks(blocks, node, total=v.shape[0])[0]
        x = self.materialise(v, node)
        if x.space == tile.ACC:
            x = self.cast(x, "bf16", node)
        return self.transpose_blocks([x], node, dest=dest)[0]

    def interleaved_transpose(self, v: Lazy, node: A.Node, n0: int) -> Value | None:
        """The transpose of a tall slice of whole rows ([c*g*n0 x D]) with one DMA per g*n0
        rows: partition p receives rows g*p .. g*p + g-1 (g*D contiguous elements: long
        DMA chunks, one transfer instead of g), and the transposing matmuls undo the
        interleave: fold f of x^T is sum_i L[f*n0/g .., i*D ..]^T @ E_i, with E_i the
        [n0/g x n0] selection E_i[q, c] = (c == g*q + i), so g matmuls of n0/g contraction
        rows per fold instead of one of n0 (the matrix engine's extra work buys the DMAs).
        g is the smallest that makes a chunk at least the DMA's efficient size."""
        if len(v.kept) != 2 or v.cast_to is not None or not isinstance(v.indices[v.kept[0]], int):
            return None
        if v.param not in self.tensors or v.dtype not in FLOATS:
            return None
        dims = self.dims(self.tensors[v.param][1])
        rd, cd = v.kept
        R, D = v.shape
        if (rd, cd) != (len(dims) - 2, len(dims) - 1) or v.sizes != [R, D] or D != dims[cd] or D > n0 or R % n0:
            return None
        row_bytes = D * ITEM[v.dtype]
        g = min(R // n0, INTERLEAVE_MAX, -(-self.cfg.dma.efficient_chunk_bytes // row_bytes))
        if g < 2 or n0 % g or (R // n0) % g:
            return None
        dtype, kq, chunks = v.dtype, n0 // g, R // (g * n0)
        raws = []  # a buffer per DMA: the transfers do not wait for each other
        for ch in range(chunks):
            idx = list(v.indices)
            idx[rd] += ch * g * n0
            raws.append(self.buffer(self.cse_node(("interleaved", id(node), ch), node.pos), (n0, g * D), dtype,
                                    tile.SRAM, v.param))
            self.add(tile.LoadOp(v.tensor, [self.idx(i) for i in idx], raws[-1], self.idx(n0), self.idx(g * D),
                                 rd, cd, row_step=g))
        sel = np.zeros((kq, g * n0), dtype=np.float32)
        for i in range(g):
            sel[np.arange(kq), i * n0 + g * np.arange(kq) + i] = 1.0
        sbuf = self.resident(("select", g, n0, dtype), self.const_tensor(sel, dtype), [0, 0], sel.shape, dtype,
                             "select", (0, 1))
        tbuf = self.transpose_scratch(node, (D, R))
        for f in range(R // n0):
            ch, fl = divmod(f, g)
            out = self.add(tile.SubviewOp(tbuf, self.idx(0), self.idx(f * n0), [D, n0])).results[0]
            for i in range(g):
                lhsT = self.add(tile.SubviewOp(raws[ch], self.idx(fl * kq), self.idx(i * D), [kq, D])).results[0]
                rhs = self.add(tile.SubviewOp(sbuf, self.idx(0), self.idx(i * n0), [kq, n0])).results[0]
                self.add(tile.MatmulOp(lhsT, rhs, out, self.idx(D), self.idx(kq), self.idx(n0), self.flag(i > 0)))
        res = Value(self.buffer(node, (D, R), dtype, tile.SRAM, "xT"), dtype, tile.SRAM, (D, R), D, R, node.pos)
        self.copy_back(tbuf, res.buf, D, R)
        return res

    def transpose_scratch(self, node: A.Node, shape: tuple[int, int]) -> SSAValue:
        """The accumulator scratch of a transpose: a dead acc tile (`dead_acc_tile`), else a
        buffer of the transpose's own (shared transposes share alternating scratch)."""
        dead = self.dead_acc_tile(shape) if self.stmt_stack else None
        if dead is not None:
            return dead.buf
        scratch = node
        if not self.cse and node in self._cse_nodes.values():  # a shared tile: shared scratch
            scratch = self.cse_node(("scratch", self._scratch_turn), node.pos)
        return self.buffer(scratch, shape, "f32", tile.ACC, "tr")

    def copy_back(self, src: SSAValue, dst: SSAValue, rows: int, cols: int) -> None:
        """A transpose's copy from the accumulator to SRAM; `transpose(x) * c` scales it on
        the way (`_evac`)."""
        if self._evac is not None:
            self.add(tile.ScalarOp(self._evac[0], src, self._evac[1], dst, self.idx(rows), self.idx(cols)))
        else:
            self.add(tile.UnaryOp("copy", src, dst, self.idx(rows), self.idx(cols)))

    def transpose_blocks(self, blocks: list[Value], node: A.Node, split: bool = False,
                         dest: Value | None = None, total: int | None = None) -> list[Value]:
        """Blocks [r_b x c] -> one SRAM tile [c x sum r_b] holding each block's transpose
        side by side: ``[that tile]`` or, with `split`, the block transposes (windows)."""
        R, C = self.cfg.matrix.rows, self.cfg.matrix.cols
        accp = self.cfg.accumulator.partitions
        dtype = blocks[0].dtype
        c_static = max(b.shape[1] for b in blocks)
        for b in blocks:
            if b.shape[0] > min(R, C) or b.shape[1] > accp or b.dtype not in FLOATS:
                raise self.err(DslMatmulError, node.pos, f"transpose of a [{b.shape[0]} x {b.shape[1]}] tile needs at "
                               f"most {min(R, C)} rows and {accp} columns on target '{self.target}'")
        total = max(total or 0, sum(b.shape[0] for b in blocks))  # static: the same buffer at every edge
        tbuf = self.transpose_scratch(node, (c_static, total))
        offs, off = [], 0
        for b in blocks:
            ibuf = self.identity(b.shape[0], dtype)
            out = tbuf
            if len(blocks) > 1:
                out = self.add(tile.SubviewOp(tbuf, self.idx(0), self.idx(off), [c_static, b.shape[0]])).results[0]
            self.add(tile.MatmulOp(b.buf, ibuf, out, self.idx(b.cols), self.idx(b.rows), self.idx(b.rows),
                                   self.flag(False)))
            offs.append(off)
            off += b.shape[0]
        width = offs[-1] + blocks[-1].rows
        shape = (c_static, total)
        if dest is not None:
            res = self.out_buf(node, dtype, (blocks[0].cols, width), shape, dest, node.pos)
        else:
            res = Value(self.buffer(node, shape, dtype, tile.SRAM, "xT"), dtype, tile.SRAM, shape,
                        blocks[0].cols, width, node.pos)
        # one copy per contiguous run of blocks with the same row count
        groups: list[list[int]] = []
        for i, b in enumerate(blocks):
            prev = blocks[groups[-1][-1]] if groups else None
            # a run is contiguous: every block before the last fills its static width
            if prev is not None and blocks[groups[-1][0]].cols == b.cols and prev.rows == prev.shape[0]:
                groups[-1].append(i)
            else:
                groups.append([i])
        for grp in groups:
            c0, rows = offs[grp[0]], blocks[grp[0]].cols
            w = offs[grp[-1]] + blocks[grp[-1]].rows - c0
            src, dst = tbuf, res.buf
            if len(groups) > 1:
                src = self.add(tile.SubviewOp(tbuf, self.idx(0), self.idx(c0), [c_static, w])).results[0]
                dst = self.add(tile.SubviewOp(res.buf, self.idx(0), self.idx(c0), [c_static, w])).results[0]
            self.copy_back(src, dst, rows, w)
        if not split:
            return [res]
        return [Value(self.add(tile.SubviewOp(res.buf, self.idx(0), self.idx(o), [c_static, b.shape[0]])).results[0],
                      dtype, tile.SRAM, (c_static, b.shape[0]), b.cols, b.rows, node.pos)
                for o, b in zip(offs, blocks)]


def _sym(fn: str) -> str:
    inv = {v: k for k, v in BIN.items()}
    return inv.get(fn, fn)


def _fmt_dims(dims: Sequence[str | int]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _target(s: A.Stmt) -> str:
    return getattr(s, "target", "?")


def _names_in(e: A.Node) -> set[str]:
    out: set[str] = set()
    stack: list[object] = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, A.Name):
            out.add(x.id)
        elif isinstance(x, A.Node):
            stack.extend(v for v in vars(x).values() if isinstance(v, (A.Node, list, dict)))
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return out


def _reads(s: A.Stmt) -> set[str]:
    """The names statement `s` reads (an augmented assignment reads its target)."""
    names = _names_in(s)
    if isinstance(s, (A.AugAssign, A.AugStore)):
        names.add(s.target)
    return names


def _first_use(stmts: Sequence[A.Stmt], name: str) -> str | None:
    """"read" if `name` may be read in `stmts` before it is overwritten, "killed" if it
    is certainly overwritten first, None if neither (not mentioned, or overwritten only
    inside loops, which may run no iteration)."""
    for s in stmts:
        if isinstance(s, A.For):
            if name in _names_in(s.iter) or _first_use(s.body, name) == "read":
                return "read"
            continue
        if name in _reads(s):
            return "read"
        if isinstance(s, A.Assign) and s.target == name:
            return "killed"
    return None


def _dead_after(name: str, stack: Sequence[tuple[list[A.Stmt], int]]) -> bool:
    """Whether `name`'s value is dead after the statement at the top of `stack` (a
    (body, index) per enclosing statement, the kernel's body first): on every path it is
    overwritten or never read again. A loop body may run again, so the statements before
    the current one count too."""
    for level in range(len(stack) - 1, -1, -1):
        body, i = stack[level]
        use = _first_use(body[i + 1:], name)
        if use == "read":
            return False
        if use == "killed":
            return True
        if level > 0 and isinstance(stack[level - 1][0][stack[level - 1][1]], A.For):
            if _first_use(body[: i + 1], name) == "read":  # the next iteration
                return False
    return True


def _walk_stmts(body: list[A.Stmt]) -> Iterator[A.Stmt]:
    for s in body:
        yield s
        if isinstance(s, A.For):
            yield from _walk_stmts(s.body)


def _loops_bounding_inner(body: list[A.Stmt]) -> set[int]:
    """Loops whose variable appears in the extent of a loop nested in them (unrolled)."""
    out: set[int] = set()
    for s in _walk_stmts(body):
        if not isinstance(s, A.For):
            continue
        for inner in _walk_stmts(s.body):
            if isinstance(inner, A.For) and s.var in _names_in(inner.iter):
                out.add(id(s))
    return out


def _lazy_zero_assigns(body: list[A.Stmt]) -> dict[int, int]:
    """`x = zeros(...)` statements whose next mention of x is ``x += ...`` (for a zeros
    in acc: ``x += matmul(...)``), x not read on the right: statement id -> zeros call id.
    In acc the first matmul's accumulate flag replaces the fill; in SRAM the first
    execution of the ``+=`` writes its value into x instead (`aug_assign`)."""
    out: dict[int, int] = {}

    def scan(block: list[A.Stmt]) -> None:
        for i, s in enumerate(block):
            if isinstance(s, A.For):
                scan(s.body)
                continue
            if not (isinstance(s, A.Assign) and isinstance(s.value, A.Call) and s.value.fn == "zeros"):
                continue
            nxt = _first_mention(block[i + 1:], s.target)
            if not (isinstance(nxt, A.AugAssign) and nxt.op == "+" and s.target not in _names_in(nxt.value)):
                continue
            in_acc = any(isinstance(a, A.Name) and a.id == tile.ACC for a in s.value.args[1:])
            if not in_acc or (isinstance(nxt.value, A.Call) and nxt.value.fn in ("matmul", "matmul_t")):
                out[id(s)] = id(s.value)

    scan(body)
    return out


def _first_mention(block: list[A.Stmt], name: str) -> A.Stmt | None:
    for s in _walk_stmts(block):
        if isinstance(s, A.For):
            if name in _names_in(s.iter):
                return s
            continue
        if name in _names_in(s) or getattr(s, "target", None) == name:
            return s
    return None


# ---- the program -------------------------------------------------------------------
def build_module(kernel: A.Kernel, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig,
                 target: str = "", schedule: bool = True) -> ModuleOp:
    """The tile-dialect module of `kernel` at `shapes`: the kernel and an ``@main``
    that allocates the inputs, outputs and constants and calls it (the kernel
    list-scheduled unless `schedule` is off: frontend/dsl/schedule.py)."""
    kl = KernelLowering(kernel, shapes, cfg, target, schedule=schedule)
    kfunc = kl.run()
    main_ops: list[Operation] = []
    args: list[SSAValue] = []
    loc = StringAttr(kl._loc(kernel.pos))
    for i, p in enumerate(kernel.params):
        op = tile.HbmAllocOp(MemRefType(DTYPES[p.type.dtype], list(kl.dims(p))), input=i)
        main_ops.append(op)
        args.append(op.result)
    outs = []
    for p in kernel.results:
        op = tile.HbmAllocOp(MemRefType(DTYPES[p.type.dtype], list(kl.dims(p))))
        main_ops.append(op)
        args.append(op.result)
        outs.append(op.result)
    for data, dtype in kl.consts:
        elem = DTYPES[dtype]
        attr = DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(data.shape)), data.reshape(-1).tolist())
        op = tile.HbmAllocOp(MemRefType(elem, list(data.shape)), value=attr)
        main_ops.append(op)
        args.append(op.result)
    main_ops.append(func.CallOp(kernel.name, args, []))
    for op in main_ops:
        op.attributes["tilecc.loc"] = loc
    main = func.FuncOp("main", ([], [v.type for v in outs]))
    for op in main_ops:
        main.body.block.add_op(op)
    main.body.block.add_op(func.ReturnOp(*outs))
    return ModuleOp([kfunc, main])


__all__ = ["build_module", "KernelLowering", "DTYPES"]
