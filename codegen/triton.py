"""Triton source from tile-dialect kernels: one ``@triton.jit`` function per kernel.

    src = triton_source(kernel)        # str: the kernel as Triton Python, inspectable
    fn = triton_kernel(kernel)         # the jitted function (TRITON_INTERPRET=1 without a GPU)
    fn[(1,)](*hbm_tensors)

The translation keeps the kernel's tiling: every on-chip buffer (`tile.alloc`) becomes
a block value padded to powers of two, a tile op writes the leading ``rows x cols``
corner of its output (a `tl.where` on a mask, like the NPU), `tile.load` / `tile.store`
are masked pointer loads and stores at the HBM memref's row-major strides, `scf.for`
stays a loop and `arith` index math stays Python arithmetic. One program instance runs
the kernel's loops in order (grid ``(1,)``), as the NPU core does.

Handled: load / store (with steps), unary, binary (tile and column rhs), scalar, reduce,
matmul (`tl.dot` on the transposed lhs). Anything else (subviews, gathers, strided HBM
layouts) raises `TritonCodegenError` naming the op: such kernels are not emitted.
"""

from __future__ import annotations

import math
from typing import Any

from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import MemRefType, NoneAttr
from xdsl.ir import Operation, SSAValue

from tilecc.errors import TileccError
from tilecc.ir import tile


class TritonCodegenError(TileccError):
    """A tile kernel uses something the Triton emitter does not translate."""


UNARY = {
    "copy": "{x}",
    "relu": "tl.maximum({x}, 0.0)",
    "gelu": "0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))",
    "gelu_tanh": "0.5 * {x} * (1.0 + _tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))",
    "exp": "tl.exp({x})",
    "tanh": "_tanh({x})",
    "sigmoid": "tl.sigmoid({x})",
    "neg": "-{x}",
    "abs": "tl.abs({x})",
    "sqrt": "tl.sqrt({x})",
    "rsqrt": "tl.rsqrt({x})",
    "reciprocal": "1.0 / {x}",
    "log": "tl.log({x})",
    "silu": "{x} * tl.sigmoid({x})",
    "square": "{x} * {x}",
    "erf": "tl.erf({x})",
}
BINARY = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "max": "tl.maximum({a}, {b})", "min": "tl.minimum({a}, {b})",
    "eq": "tl.where({a} == {b}, 1.0, 0.0)", "ne": "tl.where({a} != {b}, 1.0, 0.0)",
    "lt": "tl.where({a} < {b}, 1.0, 0.0)", "le": "tl.where({a} <= {b}, 1.0, 0.0)",
    "gt": "tl.where({a} > {b}, 1.0, 0.0)", "ge": "tl.where({a} >= {b}, 1.0, 0.0)",
}
REDUCE = {"sum": "tl.sum({x}, axis=1)", "max": "tl.max({x}, axis=1)", "min": "tl.min({x}, axis=1)"}
ARITH = {arith.AddiOp: "+", arith.SubiOp: "-", arith.MuliOp: "*", arith.FloorDivSIOp: "//",
         arith.DivUIOp: "//", arith.RemUIOp: "%", arith.RemSIOp: "%"}

PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0
'''


def _pow2(n: int) -> int:
    return max(16, 1 << math.ceil(math.log2(max(1, n))))


class _Emitter:
    def __init__(self, kernel: func.FuncOp):
        self.kernel = kernel
        self.names: dict[SSAValue, str] = {}
        self.buffers: dict[SSAValue, tuple[int, int]] = {}  # padded block shape
        self.lines: list[str] = []
        self.one = arith.ConstantOp.from_int_and_width(1, 64).result  # a reduction's one column

    def name(self, v: SSAValue) -> str:
        if v not in self.names:
            self.names[v] = f"v{len(self.names)}"
        return self.names[v]

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def run(self) -> str:
        args = [self.name(a) for a in self.kernel.body.block.args]
        fname = self.kernel.sym_name.data
        self.emit(0, "@triton.jit")
        self.emit(0, f"def {fname}({', '.join(args)}):")
        self.emit(1, f"{self.name(self.one)} = 1")
        self.block(self.kernel.body.block.ops, 1)
        self.emit(1, "return")
        return "\n".join(self.lines) + "\n"

    def block(self, ops: Any, depth: int) -> None:
        for op in ops:
            self.op(op, depth)

    def mask(self, buf: SSAValue, rows: SSAValue, cols: SSAValue) -> tuple[str, str, str]:
        r, c = self.buffers[buf]
        return (f"tl.arange(0, {r})[:, None]", f"tl.arange(0, {c})[None, :]",
                f"(tl.arange(0, {r})[:, None] < {self.name(rows)}) & (tl.arange(0, {c})[None, :] < {self.name(cols)})")

    def write(self, depth: int, out: SSAValue, rows: SSAValue, cols: SSAValue, value: str) -> None:
        _, _, m = self.mask(out, rows, cols)
        self.emit(depth, f"{self.name(out)} = tl.where({m}, {value}, {self.name(out)})")

    def hbm(self, mem: SSAValue, indices: Any, row_dim: int, col_dim: int, row_step: int, col_step: int,
            rr: str, cc: str, op: Operation) -> str:
        t = mem.type
        assert isinstance(t, MemRefType)
        if not isinstance(t.layout, NoneAttr):
            raise TritonCodegenError(f"{op.name}: strided HBM layout {t} is not translated")
        shape = [int(d) for d in t.get_shape()]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        base = " + ".join(f"{self.name(i)} * {s}" for i, s in zip(indices, strides)) or "0"
        return (f"{self.name(mem)} + ({base}) + {rr} * {strides[row_dim] * row_step} "
                f"+ {cc} * {strides[col_dim] * col_step}")

    def op(self, op: Operation, d: int) -> None:  # noqa: C901 (one case per op kind)
        if isinstance(op, arith.ConstantOp):
            v = op.value
            val = getattr(v, "value", v)
            self.emit(d, f"{self.name(op.result)} = {val.data if hasattr(val, 'data') else val}")
        elif type(op) in ARITH:
            a, b = op.operands
            self.emit(d, f"{self.name(op.results[0])} = {self.name(a)} {ARITH[type(op)]} {self.name(b)}")
        elif isinstance(op, arith.MinUIOp | arith.MinSIOp):
            a, b = op.operands
            self.emit(d, f"{self.name(op.results[0])} = min({self.name(a)}, {self.name(b)})")
        elif isinstance(op, arith.MaxUIOp | arith.MaxSIOp):
            a, b = op.operands
            self.emit(d, f"{self.name(op.results[0])} = max({self.name(a)}, {self.name(b)})")
        elif isinstance(op, tile.AllocOp):
            t = op.results[0].type
            assert isinstance(t, MemRefType)
            r, c = (int(x) for x in t.get_shape())
            self.buffers[op.results[0]] = (_pow2(r), _pow2(c))
            self.emit(d, f"{self.name(op.results[0])} = tl.zeros(({_pow2(r)}, {_pow2(c)}), dtype=tl.float32)")
        elif isinstance(op, tile.LoadOp):
            rr, cc, m = self.mask(op.dst, op.rows, op.cols)
            ptr = self.hbm(op.src, op.indices, op.row_dim.value.data, op.col_dim.value.data,
                           _step(op.row_step), _step(op.col_step), rr, cc, op)
            self.write(d, op.dst, op.rows, op.cols, f"tl.load({ptr}, mask={m}, other=0.0).to(tl.float32)")
        elif isinstance(op, tile.StoreOp):
            rr, cc, m = self.mask(op.src, op.rows, op.cols)
            ptr = self.hbm(op.dst, op.indices, op.row_dim.value.data, op.col_dim.value.data,
                           _step(op.row_step), _step(op.col_step), rr, cc, op)
            self.emit(d, f"tl.store({ptr}, {self.name(op.src)}, mask={m})")
        elif isinstance(op, tile.UnaryOp):
            self.same_block(op, op.input, op.output)
            x = self.name(op.input)
            self.write(d, op.output, op.rows, op.cols, UNARY[op.fn.data].format(x=x))
        elif isinstance(op, tile.BinaryOp):
            fn = op.fn.data
            if fn not in BINARY:
                raise TritonCodegenError(f"tile.binary \"{fn}\" is not translated")
            self.same_block(op, op.lhs, op.output)
            a, b = self.name(op.lhs), self.name(op.rhs)
            if op.rhs_mode.data == "column":
                b = f"tl.sum(tl.where(tl.arange(0, {self.buffers[op.rhs][1]})[None, :] == 0, {b}, 0.0), axis=1)[:, None]"
            else:
                self.same_block(op, op.rhs, op.output)
            if op.swap is not None:
                a, b = b, a
            self.write(d, op.output, op.rows, op.cols, BINARY[fn].format(a=a, b=b))
        elif isinstance(op, tile.ScalarOp):
            fn = op.fn.data
            if fn not in BINARY:
                raise TritonCodegenError(f"tile.scalar \"{fn}\" is not translated")
            self.same_block(op, op.input, op.output)
            a, b = self.name(op.input), repr(float(op.imm.value.data))
            if op.swap is not None:
                a, b = b, a
            self.write(d, op.output, op.rows, op.cols, BINARY[fn].format(a=a, b=b))
        elif isinstance(op, tile.ReduceOp):
            x = self.name(op.input)
            rr, cc, m = self.mask(op.input, op.rows, op.cols)
            neutral = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}[op.fn.data]
            red = REDUCE[op.fn.data].format(x=f"tl.where({m}, {x}, {neutral})")
            one = self.one
            out_r = self.buffers[op.output][0]
            if out_r != self.buffers[op.input][0]:
                raise TritonCodegenError("tile.reduce: input and output rows differ")
            self.write(d, op.output, op.rows, one, f"({red})[:, None]")
        elif isinstance(op, tile.MatmulOp):
            m_, k_, n_ = (self.name(v) for v in (op.m, op.k, op.n))
            lr, lc = self.buffers[op.lhsT]
            rr_, rc = self.buffers[op.rhs]
            ar, ac = self.buffers[op.acc]
            if lr != rr_ or (ar, ac) != (lc, rc):
                raise TritonCodegenError("tile.matmul: buffer blocks do not line up")
            lhs = f"tl.where((tl.arange(0, {lr})[:, None] < {k_}), {self.name(op.lhsT)}, 0.0)"
            rhs = f"tl.where((tl.arange(0, {rr_})[:, None] < {k_}), {self.name(op.rhs)}, 0.0)"
            prod = f"tl.dot(tl.trans({lhs}), {rhs}, input_precision='ieee')"
            acc = self.name(op.acc)
            value = f"tl.where({self.name(op.accumulate)}, {acc} + {prod}, {prod})"
            self.write(d, op.acc, op.m, op.n, value)
            _ = (m_, n_)
        elif isinstance(op, scf.ForOp):
            if op.results:
                raise TritonCodegenError("scf.for with loop-carried values is not translated")
            iv = op.body.block.args[0]
            lb, ub, st = (self.name(v) for v in (op.lb, op.ub, op.step))
            self.emit(d, f"for {self.name(iv)} in range({lb}, {ub}, {st}):")
            self.block(op.body.block.ops, d + 1)
        elif isinstance(op, scf.YieldOp | func.ReturnOp):
            return
        else:
            raise TritonCodegenError(f"{op.name} is not translated to Triton")

    def same_block(self, op: Operation, a: SSAValue, b: SSAValue) -> None:
        if a not in self.buffers or b not in self.buffers:
            raise TritonCodegenError(f"{op.name}: operand is not a tile.alloc buffer (subviews are not translated)")
        if self.buffers[a] != self.buffers[b]:
            raise TritonCodegenError(f"{op.name}: buffers of blocks {self.buffers[a]} and {self.buffers[b]} differ")


def _step(attr: Any) -> int:
    return 1 if attr is None else int(attr.value.data)


def triton_source(kernel: func.FuncOp) -> str:
    """The ``@triton.jit`` source of one tile kernel (without the imports)."""
    if tile.KERNEL_ATTR not in kernel.attributes:
        raise TritonCodegenError(f"@{kernel.sym_name.data} is no tile kernel")
    return _Emitter(kernel).run()


def triton_kernel(kernel: func.FuncOp) -> Any:
    """Compile the source with Triton (`TRITON_INTERPRET=1` runs it on CPU tensors)."""
    import importlib.util
    import os
    import tempfile

    src = PRELUDE + "\n\n" + triton_source(kernel)
    # triton.jit reads the source file back (inspect), so the module lives on disk
    fd, path = tempfile.mkstemp(prefix=f"tilecc_{kernel.sym_name.data}_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"tilecc_triton_{kernel.sym_name.data}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, kernel.sym_name.data)
