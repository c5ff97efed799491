"""The lowering's context and driver: a tile-DSL kernel, for concrete shapes, to a
tile-dialect module.

`KernelLowering` holds the state of one kernel's lowering (declared in `__init__`) and
its building blocks: ops in the current block or the prologue, index arithmetic folded
where static, on-chip buffers hoisted per multi-buffering copy, HBM constants as extra
kernel arguments, the scopes names are looked up in, and errors at a DSL position. The
concepts are functions of the sibling modules that take it as `lw` (`statements`,
`loops`, `expressions`, `tiles`, `constants`, `matmul`, `transpose`). `run` walks the
body once (checking and emitting together), hoists every buffer and constant to the
kernel's entry, checks that the buffers fit on chip and list-schedules each block
(`frontend/dsl/schedule.py`); `build_module` adds the ``@main`` that allocates the
tensors and calls the kernel:

    kernel add1(x: f32[R, C]) -> f32[R, C]:
        out[:, :] = load(x[:, :]) + 1.0
    -->
    func.func @add1(%x: memref<16x8xf32>, %out: memref<16x8xf32>) attributes {tile.kernel} {
      %c0 = arith.constant 0 : index
      %x_s = tile.alloc {buffer = "x"} : memref<16x8xf32, #tile.space<"sram">>
      tile.load %x[%c0, %c0] into %x_s sizes(%c16, %c8) ...
      tile.scalar "add" %x_s, 1.0 into %t sizes(%c16, %c8) ...
      tile.store %t into %out[%c0, %c0] sizes(%c16, %c8) ...
    }
    func.func @main() -> memref<16x8xf32> {
      %0 = tile.hbm_alloc {input = 0} : memref<16x8xf32>
      %1 = tile.hbm_alloc : memref<16x8xf32>
      func.call @add1(%0, %1)
      func.return %1
    }
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import numpy as np
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import (
    AnyFloat,
    DenseIntOrFPElementsAttr,
    FunctionType,
    IndexType,
    MemRefType,
    ModuleOp,
    StringAttr,
    TensorType,
    UnitAttr,
    i1,
)
from xdsl.ir import Block, Operation, SSAValue

from tilecc.errors import DslError, DslMemoryError, DslNameError, DslShapeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import expressions, statements
from tilecc.frontend.dsl.lower.analysis import lazy_zero_assigns, loops_bounding_inner
from tilecc.frontend.dsl.lower.values import DTYPES, ITEM, TileVar, Value, fmt_dims
from tilecc.frontend.dsl.parser import excerpt
from tilecc.frontend.dsl.work import WorkTally, compulsory_bytes
from tilecc.ir import tile
from tilecc.ir.buffers import align_up
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.roofline import IntrinsicWork


class KernelLowering:
    """One kernel's lowering at one set of shapes: its state and building blocks; `run`
    builds its `func.func`."""

    def __init__(self, kernel: A.Kernel, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig,
                 target: str = "", schedule: bool = True) -> None:
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
        self.resident_loaded: set = set()
        self.evac_scale: tuple[str, float] | None = None  # the scale of a transpose's copy back
        self.cse = True  # loads at static indices of read-only tensors are shared
        self.cse_values: dict[tuple, Value] = {}
        self.cse_node_of: dict[tuple, A.Node] = {}
        self.unroll_depth = 0  # inside an unrolled loop (where shared loads pay off)
        self.scratch_turn = 0  # shared transpose scratch (alternating) for shared tiles
        self.scratch_buffers = 2
        self.tensors = {p.name: (a, p) for p, a in zip(params, self.entry.args)}
        self.outputs = {p.name for p in kernel.results}
        self.consts: list[tuple[np.ndarray, str]] = []
        self.const_args: dict[tuple, SSAValue] = {}
        self.index_consts: dict[int, SSAValue] = {}
        self.allocs: dict[tuple, tuple[SSAValue, A.Pos, str]] = {}
        self.stmt_stack: list[tuple[list[A.Stmt], int]] = []  # (body, index) of each statement being lowered
        self.buffer_names: dict[str, int] = {}
        self.slot: tuple[tuple[int, int], ...] = ()  # the multi-buffering copy we are in: (loop id, copy) per loop
        self.loops: list[TileVar] = []
        self.loc = ""
        self.name_hint = "t"  # temporaries are named after the variable being assigned
        self.unrolled = loops_bounding_inner(kernel.body)
        self.lazy_zero = lazy_zero_assigns(kernel.body)
        self.lazy_zero_calls = set(self.lazy_zero.values())
        self.written: dict[str, list] = {}
        self.tally = WorkTally(cfg)  # the intrinsic work of the statements lowered (frontend/dsl/work.py)

    def err(self, cls: type[DslError], pos: A.Pos, msg: str) -> DslError:
        where = (self.k.filename, pos.line, pos.col)
        return cls(f"{self.k.filename}:{pos.line}:{pos.col}: {msg}", where,
                   excerpt(self.k.source, pos.line, pos.col))

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
                               f"{fmt_dims(dims)}, got an array of shape {tuple(shape)}")
            for d, n in zip(dims, shape):
                want = d if isinstance(d, int) else self.symbols.get(d)
                if want is not None and want != n:
                    what = f"{d} = {want} (bound earlier)" if isinstance(d, str) else str(d)
                    raise self.err(DslShapeError, p.pos, f"shape mismatch: '{p.name}' has shape {tuple(shape)} "
                                   f"but its type {p.type.dtype}{fmt_dims(dims)} needs {what}")
                if isinstance(d, str):
                    self.symbols[d] = int(n)
        self.result_dims: dict[str, tuple[int, ...]] = {}
        for p in k.results:
            out = []
            for d in p.type.dims:
                if isinstance(d, str) and d not in self.symbols:
                    raise self.err(DslNameError, p.type.pos, f"undefined size '{d}' in the result type "
                                   "(every result size must be an input's size or a number)")
                if isinstance(d, int):
                    n = d
                else:
                    n = self.symbols[d] if isinstance(d, str) else expressions.static_int(self, d, "a result size")
                if n < 0:
                    raise self.err(DslShapeError, p.type.pos, f"result '{p.name}' would have a negative size {n}")
                out.append(n)
            self.result_dims[p.name] = tuple(out)

    def dims(self, p: A.Param) -> tuple[int, ...]:
        if p.name in self.result_dims:
            return self.result_dims[p.name]
        return tuple(d if isinstance(d, int) else self.symbols[d] for d in p.type.dims)

    def run(self) -> func.FuncOp:
        statements.stmts(self, self.k.body)
        self.loc = self.loc_of(self.k.pos)
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

    def work(self) -> IntrinsicWork:
        """The intrinsic work of the kernel lowered by `run` (frontend/dsl/work.py)."""
        params = self.k.params + self.k.results
        return self.tally.work(compulsory_bytes(self.k, [self.dims(p) for p in params]))

    def loc_of(self, pos: A.Pos) -> str:
        return f"{self.k.filename}:{pos.line}:{pos.col}"

    def check_memory(self) -> None:
        """All buffers of a kernel live for the whole kernel (plan-sram): they must fit."""
        for space, cap in ((tile.SRAM, self.cfg.sram.bytes_per_partition),
                           (tile.ACC, self.cfg.accumulator.bytes_per_partition)):
            bufs = []
            for (_, _, shape, dtype, sp, _), (_, pos, name) in self.allocs.items():
                if sp == space:
                    bufs.append((align_up(shape[1] * ITEM[dtype]), name, pos, dtype, shape))
            total = sum(b[0] for b in bufs)
            if total <= cap:
                continue
            bufs.sort(key=lambda b: -b[0])
            listing = ", ".join(f"{n} {d}[{s[0]} x {s[1]}] ({b} B, line {p.line})" for b, n, p, d, s in bufs[:8])
            more = f" and {len(bufs) - 8} more" if len(bufs) > 8 else ""
            worst = bufs[0][2]
            raise self.err(DslMemoryError, worst, f"on-chip buffers do not fit: {space} needs {total} bytes per "
                           f"partition, target '{self.target}' has {cap}; live at the peak: {listing}{more}")

    def add(self, op: Operation) -> Operation:
        op.attributes["tilecc.loc"] = StringAttr(self.loc)
        self.block.add_op(op)
        return op

    def to_prologue(self, op: Operation) -> SSAValue:
        op.attributes["tilecc.loc"] = StringAttr(self.loc)
        self.entry.add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def idx(self, v: SSAValue | int) -> SSAValue:
        if not isinstance(v, int):
            return v
        if v not in self.index_consts:
            self.index_consts[v] = self.to_prologue(arith.ConstantOp.from_int_and_width(v, IndexType()))
        return self.index_consts[v]

    def flag(self, v: bool) -> SSAValue:
        key = -1 - int(v)  # beside the index constants
        if key not in self.index_consts:
            self.index_consts[key] = self.to_prologue(arith.ConstantOp.from_int_and_width(int(v), i1))
        return self.index_consts[key]

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
        if key not in self.allocs:
            n = self.buffer_names.get(name, 0)
            self.buffer_names[name] = n + 1
            unique = name if n == 0 else f"{name}{n}"
            op = tile.AllocOp(tile.onchip_type([rows, max(cols, 1)], DTYPES[dtype], space), unique)
            self.allocs[key] = (self.to_prologue(op), node.pos, unique)
        return self.allocs[key][0]

    def const_tensor(self, data: np.ndarray, dtype: str) -> SSAValue:
        """An HBM constant, passed to the kernel as an extra argument."""
        key = (dtype, data.shape, data.tobytes())
        if key not in self.const_args:
            t = MemRefType(DTYPES[dtype], list(data.shape))
            self.const_args[key] = self.entry.insert_arg(t, len(self.entry.args))
            self.consts.append((data, dtype))
        return self.const_args[key]

    def lookup(self, name: str, pos: A.Pos) -> object:
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

    def is_defined(self, name: str) -> bool:
        return any(name in sc for sc in self.scopes)


def build_module(kernel: A.Kernel, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig,
                 target: str = "", schedule: bool = True) -> ModuleOp:
    """The tile-dialect module of `kernel` at `shapes`: the kernel and an ``@main``
    that allocates the inputs, outputs and constants and calls it (the kernel
    list-scheduled unless `schedule` is off: frontend/dsl/schedule.py)."""
    kl = KernelLowering(kernel, shapes, cfg, target, schedule=schedule)
    return kernel_module(kl, kl.run())


def kernel_module(kl: KernelLowering, kfunc: func.FuncOp) -> ModuleOp:
    """The module of a lowered kernel (`kfunc = kl.run()`) and its ``@main``."""
    kernel = kl.k
    main_ops: list[Operation] = []
    args: list[SSAValue] = []
    loc = StringAttr(kl.loc_of(kernel.pos))
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
        t = cast(TensorType[AnyFloat], TensorType(elem, list(data.shape)))  # float data; from_list converts to elem
        attr = DenseIntOrFPElementsAttr.from_list(t, data.reshape(-1).tolist())
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


__all__ = ["build_module", "kernel_module", "KernelLowering", "DTYPES"]
