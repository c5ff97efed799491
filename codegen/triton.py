"""Triton source from tile-dialect kernels: one ``@triton.jit`` function per kernel.

    k = emit_kernel(kernel)            # TritonKernel: .source (inspectable), .scratch_elems
    fn = k.compile()                   # the jitted function (TRITON_INTERPRET=1 without a GPU)
    fn[(1,)](*hbm_tensors, scratch)    # scratch: k.scratch_elems float32 elements

The translation keeps the kernel's tiling and fusion: every on-chip buffer
(`tile.alloc`) is a region of a float32 scratch tensor, the stand-in for SRAM and the
accumulators (row-major, its row stride the buffer's columns); `tile.subview` is an
offset into its parent's region with the parent's stride; each tile op loads its
operands' leading ``rows x cols`` corner as a block (padded to powers of two, masked),
computes and stores its output corner, as the NPU's vector and matrix engines do.
`tile.load` / `tile.store` are masked pointer loads and stores at the HBM memref's
row-major strides (steps and a broadcast row dimension included), `tile.matmul` is a
`tl.dot` on the transposed lhs, `scf.for` stays a loop and `arith` index math stays
scalar arithmetic. One program instance runs the kernel's loops in order (grid
``(1,)``), as one NPU core does.

`tile.gather` reads the table rows an on-chip index column selects.

Not translated (a `TritonCodegenError` naming the op): loops with
loop-carried values, HBM layouts with dynamic strides, and any op outside the tile, scf and arith
subsets above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, IntegerType, MemRefType, NoneAttr
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


CMPI = {"eq": "==", "ne": "!=", "slt": "<", "sle": "<=", "sgt": ">", "sge": ">=", "ult": "<", "ule": "<=",
        "ugt": ">", "uge": ">="}


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, math.ceil(math.log2(max(1, n)))))


@dataclass
class _Buf:
    base: str  # scratch offset (elements): an int literal or a scalar variable
    stride: int  # row stride (elements)
    rows: int  # static shape
    cols: int


@dataclass
class TritonKernel:
    name: str
    source: str  # the @triton.jit function (PRELUDE holds the imports and helpers)
    scratch_elems: int  # float32 elements of on-chip scratch the launch passes last

    def compile(self) -> Any:
        """The jitted function; Triton reads the source file back, so it is written to disk."""
        import importlib.util
        import os
        import tempfile

        fd, path = tempfile.mkstemp(prefix=f"tilecc_{self.name}_", suffix=".py")
        with os.fdopen(fd, "w") as f:
            f.write(PRELUDE + "\n\n" + self.source)
        spec = importlib.util.spec_from_file_location(f"tilecc_triton_{self.name}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return getattr(mod, self.name)


class _Emitter:
    def __init__(self, kernel: func.FuncOp):
        self.kernel = kernel
        self.names: dict[SSAValue, str] = {}
        self.bufs: dict[SSAValue, _Buf] = {}
        self.lines: list[str] = []
        self.scratch = 0
        self.tmp = 0

    def name(self, v: SSAValue) -> str:
        if v not in self.names:
            self.names[v] = f"v{len(self.names)}"
        return self.names[v]

    def fresh(self) -> str:
        self.tmp += 1
        return f"t{self.tmp}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def run(self) -> TritonKernel:
        fname = self.kernel.sym_name.data
        args = [self.name(a) for a in self.kernel.body.block.args] + ["scratch"]
        self.emit(0, "@triton.jit")
        self.emit(0, f"def {fname}({', '.join(args)}):")
        self.block(self.kernel.body.block.ops, 1)
        self.emit(1, "return")
        return TritonKernel(fname, "\n".join(self.lines) + "\n", max(1, self.scratch))

    def block(self, ops: Any, depth: int) -> None:
        for op in ops:
            self.op(op, depth)

    def buf(self, v: SSAValue, op: Operation) -> _Buf:
        b = self.bufs.get(v)
        if b is None:
            raise TritonCodegenError(f"{op.name}: operand is no on-chip buffer")
        return b

    # -- blocks of on-chip buffers -------------------------------------------------

    def block_shape(self, op: Operation, *bufs: _Buf, least: int = 1) -> tuple[int, int]:
        return (_pow2(min(b.rows for b in bufs), least), _pow2(min(b.cols for b in bufs), least))

    def ranges(self, d: int, shape: tuple[int, int]) -> tuple[str, str]:
        r, c = self.fresh(), self.fresh()
        self.emit(d, f"{r} = tl.arange(0, {shape[0]})[:, None]")
        self.emit(d, f"{c} = tl.arange(0, {shape[1]})[None, :]")
        return r, c

    def read(self, d: int, b: _Buf, r: str, c: str, mask: str, other: str = "0.0", column: bool = False) -> str:
        x = self.fresh()
        cc = f"{c} * 0" if column else c
        self.emit(d, f"{x} = tl.load(scratch + {b.base} + {r} * {b.stride} + {cc}, mask={mask}, other={other})")
        return x

    def write(self, d: int, b: _Buf, r: str, c: str, mask: str, value: str) -> None:
        self.emit(d, f"tl.store(scratch + {b.base} + {r} * {b.stride} + {c}, {value}, mask={mask})")

    def mask(self, d: int, r: str, c: str, rows: SSAValue, cols: SSAValue | str) -> str:
        m = self.fresh()
        cols_s = cols if isinstance(cols, str) else self.name(cols)
        self.emit(d, f"{m} = ({r} < {self.name(rows)}) & ({c} < {cols_s})")
        return m

    # -- HBM -------------------------------------------------------------------------

    def hbm(self, mem: SSAValue, indices: Any, op: Any, r: str, c: str) -> str:
        t = mem.type
        assert isinstance(t, MemRefType)
        shape = [int(x) for x in t.get_shape()]
        if isinstance(t.layout, NoneAttr):
            strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        else:  # a strided view: the launch passes a pointer that already includes the offset
            try:
                strides = [int(x) for x in tile.layout_of(t)[0]]
            except (TypeError, ValueError):
                raise TritonCodegenError(f"{op.name}: HBM layout {t} has dynamic strides") from None
        base = " + ".join(f"{self.name(i)} * {s}" for i, s in zip(indices, strides)) or "0"
        rd, cd = op.row_dim.value.data, op.col_dim.value.data
        rs = 0 if rd < 0 else strides[rd] * _step(op.row_step)
        cs = 0 if cd < 0 else strides[cd] * _step(op.col_step)
        return f"{self.name(mem)} + ({base}) + {r} * {rs} + {c} * {cs}"

    # -- ops ---------------------------------------------------------------------------

    def op(self, op: Operation, d: int) -> None:  # noqa: C901 (one case per op kind)
        if isinstance(op, arith.ConstantOp):
            v = op.value
            if isinstance(v, IntegerAttr):
                val = v.value.data
                if isinstance(v.type, IntegerType) and v.type.width.data == 1:
                    val = bool(val)
            else:
                raise TritonCodegenError(f"arith.constant {v} is not translated")
            self.emit(d, f"{self.name(op.result)} = {val!r}")
        elif type(op) in ARITH:
            a, b = op.operands
            self.emit(d, f"{self.name(op.results[0])} = {self.name(a)} {ARITH[type(op)]} {self.name(b)}")
        elif isinstance(op, arith.MinUIOp | arith.MinSIOp | arith.MaxUIOp | arith.MaxSIOp):
            a, b = (self.name(x) for x in op.operands)
            lt = "<" if isinstance(op, arith.MinUIOp | arith.MinSIOp) else ">"
            self.emit(d, f"{self.name(op.results[0])} = {a} if {a} {lt} {b} else {b}")
        elif isinstance(op, arith.CmpiOp):
            pred = arith.CMPI_COMPARISON_OPERATIONS[op.predicate.value.data]
            a, b = (self.name(x) for x in op.operands)
            self.emit(d, f"{self.name(op.results[0])} = {a} {CMPI[pred]} {b}")
        elif isinstance(op, arith.SelectOp):
            c, a, b = (self.name(x) for x in op.operands)
            self.emit(d, f"{self.name(op.results[0])} = {a} if {c} else {b}")
        elif isinstance(op, tile.AllocOp):
            t = op.results[0].type
            assert isinstance(t, MemRefType)
            r, c = (int(x) for x in t.get_shape())
            self.bufs[op.results[0]] = _Buf(str(self.scratch), c, r, c)
            self.scratch += r * c
        elif isinstance(op, tile.SubviewOp):
            p = self.buf(op.source, op)
            t = op.result.type
            assert isinstance(t, MemRefType)
            r, c = (int(x) for x in t.get_shape())
            base = self.fresh()
            self.emit(d, f"{base} = {p.base} + {self.name(op.row)} * {p.stride} + {self.name(op.col)}")
            self.bufs[op.result] = _Buf(base, p.stride, r, c)
        elif isinstance(op, tile.LoadOp):
            b = self.buf(op.dst, op)
            r, c = self.ranges(d, self.block_shape(op, b))
            m = self.mask(d, r, c, op.rows, op.cols)
            x = self.fresh()
            self.emit(d, f"{x} = tl.load({self.hbm(op.src, op.indices, op, r, c)}, mask={m}, other=0.0).to(tl.float32)")
            self.write(d, b, r, c, m, x)
        elif isinstance(op, tile.GatherOp):
            idx, b = self.buf(op.index, op), self.buf(op.dst, op)
            r, c = self.ranges(d, self.block_shape(op, b))
            m = self.mask(d, r, c, op.rows, op.cols)
            rows = self.read(d, idx, r, c, m, column=True)  # index[r, 0], exact in fp32 below 2**24
            t = op.table.type
            assert isinstance(t, MemRefType)
            width = int(t.get_shape()[1])
            x = self.fresh()
            self.emit(d, f"{x} = tl.load({self.name(op.table)} + {rows}.to(tl.int32) * {width} + "
                         f"{self.name(op.col)} + {c}, mask={m}, other=0.0).to(tl.float32)")
            self.write(d, b, r, c, m, x)
        elif isinstance(op, tile.StoreOp):
            b = self.buf(op.src, op)
            r, c = self.ranges(d, self.block_shape(op, b))
            m = self.mask(d, r, c, op.rows, op.cols)
            x = self.read(d, b, r, c, m)
            self.emit(d, f"tl.store({self.hbm(op.dst, op.indices, op, r, c)}, {x}, mask={m})")
        elif isinstance(op, tile.UnaryOp):
            i, o = self.buf(op.input, op), self.buf(op.output, op)
            r, c = self.ranges(d, self.block_shape(op, i, o))
            m = self.mask(d, r, c, op.rows, op.cols)
            x = self.read(d, i, r, c, m)
            self.write(d, o, r, c, m, UNARY[op.fn.data].format(x=x))
        elif isinstance(op, tile.BinaryOp | tile.ScalarOp):
            fn = op.fn.data
            if fn not in BINARY:
                raise TritonCodegenError(f'{op.name} "{fn}" is not translated')
            lhs = op.lhs if isinstance(op, tile.BinaryOp) else op.input
            a_buf, o = self.buf(lhs, op), self.buf(op.output, op)
            column = isinstance(op, tile.BinaryOp) and op.rhs_mode.data == "column"
            others = [a_buf, o] + ([self.buf(op.rhs, op)] if isinstance(op, tile.BinaryOp) and not column else [])
            r, c = self.ranges(d, self.block_shape(op, *others))
            m = self.mask(d, r, c, op.rows, op.cols)
            a = self.read(d, a_buf, r, c, m)
            if isinstance(op, tile.BinaryOp):
                b = self.read(d, self.buf(op.rhs, op), r, c, m, column=column)
            else:
                b = repr(float(op.imm.value.data))
            if op.swap is not None:
                a, b = b, a
            self.write(d, o, r, c, m, BINARY[fn].format(a=a, b=b))
        elif isinstance(op, tile.ReduceOp):
            i, o = self.buf(op.input, op), self.buf(op.output, op)
            r, c = self.ranges(d, self.block_shape(op, i))
            m = self.mask(d, r, c, op.rows, op.cols)
            neutral = {"sum": "0.0", "max": "float('-inf')", "min": "float('inf')"}[op.fn.data]
            x = self.read(d, i, r, c, m, other=neutral)
            y = self.fresh()
            self.emit(d, f"{y} = {REDUCE[op.fn.data].format(x=x)}[:, None]")
            one = self.fresh()
            self.emit(d, f"{one} = tl.arange(0, 1)[None, :]")
            self.write(d, o, r, one, f"({r} < {self.name(op.rows)}) & ({one} < 1)", y)
        elif isinstance(op, tile.MatmulOp):
            lt, rh, acc = self.buf(op.lhsT, op), self.buf(op.rhs, op), self.buf(op.acc, op)
            bk = _pow2(min(lt.rows, rh.rows), 16)
            bm = _pow2(min(lt.cols, acc.rows), 16)
            bn = _pow2(min(rh.cols, acc.cols), 16)
            k, m_, n = (self.name(v) for v in (op.k, op.m, op.n))
            rk, cm = self.ranges(d, (bk, bm))
            ma = self.fresh()
            self.emit(d, f"{ma} = ({rk} < {k}) & ({cm} < {m_})")
            a = self.read(d, lt, rk, cm, ma)
            rk2, cn = self.ranges(d, (bk, bn))
            mb = self.fresh()
            self.emit(d, f"{mb} = ({rk2} < {k}) & ({cn} < {n})")
            b = self.read(d, rh, rk2, cn, mb)
            ro, co = self.ranges(d, (bm, bn))
            mo = self.fresh()
            self.emit(d, f"{mo} = ({ro} < {m_}) & ({co} < {n})")
            prev = self.read(d, acc, ro, co, f"{mo} & {self.name(op.accumulate)}")
            prod = f"tl.dot(tl.trans({a}), {b}, input_precision='ieee')"
            self.write(d, acc, ro, co, mo, f"{prev} + {prod}")
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


def _step(attr: Any) -> int:
    return 1 if attr is None else int(attr.value.data)


def emit_kernel(kernel: func.FuncOp) -> TritonKernel:
    """One tile kernel as Triton source (and the scratch it needs)."""
    if tile.KERNEL_ATTR not in kernel.attributes:
        raise TritonCodegenError(f"@{kernel.sym_name.data} is no tile kernel")
    return _Emitter(kernel).run()


def triton_source(kernel: func.FuncOp) -> str:
    """The ``@triton.jit`` source of one tile kernel (without the imports)."""
    return emit_kernel(kernel).source
