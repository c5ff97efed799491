"""lower-tile-to-npu: instruction selection, one `npu.kernel` per distinct kernel.

Before (tile; after plan-sram and plan-hbm)::

    func.func @k0_relu(%x: memref<37x53xf32>, %o: memref<37x53xf32>) attributes {tile.kernel} {
      scf.for %i = %c0 to %c3 step %c1 {
        %r0 = arith.muli %i, %c16 : index
        %r = arith.minsi %c16, %rem : index
        %in = tile.alloc {buffer = "in0", offset = 0 : i64} : memref<16x64xf32, ...>
        tile.load %x[%r0, %c0] into %in sizes(%r, %c53) {row_dim = 0, col_dim = 1} ...
        ...
    func.func @main() ... { func.call @k0_relu(%x, %y) ... }

After (npu; addresses physical, loop-varying fields as `ir.affine` expressions)::

    npu.kernel "k0_relu" {
      npu.loop attributes {trip = 3 : i64} {
        npu.dma_load {fields = {queue = 0, a_addr = "3392*i0", hbm_rs = 53, hbm_cs = 1,
                      o_mem = 1, o_addr = 0, rows = "min(16, 37 - 16*i0)", cols = 53, ...},
                      writes = ["in0"], ...}
        npu.vec_unary {fields = {func = 1, ...}, reads = ["in0"], writes = ["out"], ...}
        npu.dma_store {...}
      }
    }

Index arithmetic (`arith.constant/addi/subi/muli/minsi/cmpi ne`) over `scf.for` induction
variables (lower bound 0, step 1) folds into affine expressions; anything else is a
CompileError naming the op. Loads alternate over the DMA queues; stores use the last one.
Semaphores come from the separate `npu-insert-sync` pass.

A kernel called again (`passes/graph_to_tile/sharing.py`: identical layers) is lowered
once; each further call becomes ``npu.launch "k0_relu" {deltas = [4096, 4096]}``, the
byte address delta of each argument from the first call, and every DMA records the
argument its HBM address is relative to (`hbm_arg`), so codegen relocates the body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float8E4M3FNType,
    Float16Type,
    Float32Type,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    NoneAttr,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.passes import ModulePass

from tilecc.errors import CompileError
from tilecc.ir import npu, tile
from tilecc.ir.affine import Affine, Expr, Min, Ne
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.isa import ITEMSIZE, BinaryFn, DType, Flag, Mem, ReduceFn, UnaryFn


def dtype_of(elem: Attribute) -> DType:
    if isinstance(elem, Float32Type):
        return DType.F32
    if isinstance(elem, BFloat16Type):
        return DType.BF16
    if isinstance(elem, Float16Type):
        return DType.F16
    if isinstance(elem, IntegerType) and elem.width.data == 32:
        return DType.I32
    if isinstance(elem, IntegerType) and elem.width.data == 8:
        return DType.I8
    if isinstance(elem, Float8E4M3FNType):
        return DType.F8E4M3
    raise CompileError(f"element type {elem} has no NPU data type")


@dataclass(frozen=True)
class HbmTensor:
    """An HBM tensor as kernels see it: the root allocation's byte address, the shape,
    and where its elements lie (element strides and offset from the root; row-major and
    0 for a tensor of its own)."""

    base: int
    shape: tuple[int, ...]
    dtype: DType
    elem_strides: tuple[int, ...] | None = None
    offset: int = 0

    def strides(self) -> list[int]:
        if self.elem_strides is not None:
            return list(self.elem_strides)
        return list(tile.row_major(self.shape))

    @property
    def addr(self) -> int:
        """Byte address of element 0."""
        return self.base + self.offset * element_size_of(self.dtype)

    @property
    def contiguous(self) -> bool:
        rm = tile.row_major(self.shape)
        return 0 in self.shape or all(n == 1 or s == r for n, s, r in zip(self.shape, self.strides(), rm))


@dataclass(frozen=True)
class Buffer:
    name: str
    mem: Mem
    offset: int | Affine  # bytes within each partition (affine for a moving tile.subview)
    dtype: DType
    part: int | Affine = 0  # first partition


def _field(e: Expr | int) -> int | str:
    if isinstance(e, int):
        return e
    if isinstance(e, Affine) and e.is_const:
        return e.const
    return str(e)


class KernelLowering:
    def __init__(self, cfg: HardwareConfig, name: str):
        self.cfg = cfg
        self.name = name
        self.env: dict[SSAValue, object] = {}
        self.arg_index: dict[SSAValue, int] = {}
        self.n_loads = 0

    def lower(self, kernel: func.FuncOp, args: list[HbmTensor]) -> npu.KernelOp:
        for i, (a, t) in enumerate(zip(kernel.body.block.args, args, strict=True)):
            self.env[a] = t
            self.arg_index[a] = i
        out = npu.KernelOp(self.name)
        _copy_loc(kernel, out)
        self.block(kernel.body.block, out.body.block, 0)
        return out

    def block(self, src: Block, dst: Block, depth: int) -> None:
        for op in src.ops:
            self.op(op, dst, depth)

    def expr(self, v: SSAValue) -> Expr:
        e = self.env.get(v)
        if e is None:
            owner = v.owner
            raise CompileError(
                f"{self.name}: index value defined by {getattr(owner, 'name', owner)} "
                "is not an affine function of loop indices"
            )
        assert isinstance(e, (Affine, Min, Ne))
        return e

    def affine(self, v: SSAValue) -> Affine:
        e = self.expr(v)
        if not isinstance(e, Affine):
            raise CompileError(f"{self.name}: expected an affine index, got {e}")
        return e

    def op(self, op: Operation, dst: Block, depth: int) -> None:
        if isinstance(op, (func.ReturnOp, scf.YieldOp)):
            return
        if isinstance(op, arith.ConstantOp):
            val = op.value
            assert isinstance(val, IntegerAttr)
            v = int(val.value.data)
            is_bool = isinstance(val.type, IntegerType) and val.type.width.data == 1
            self.env[op.result] = Affine(int(v != 0) if is_bool else v)
            return
        if isinstance(op, (arith.AddiOp, arith.SubiOp)):
            a, b = self.affine(op.lhs), self.affine(op.rhs)
            self.env[op.result] = a + b if isinstance(op, arith.AddiOp) else a - b
            return
        if isinstance(op, arith.MuliOp):
            a, b = self.affine(op.lhs), self.affine(op.rhs)
            if not (a.is_const or b.is_const):
                raise CompileError(f"{self.name}: product of two loop-varying indices")
            self.env[op.result] = a.scale(b.const) if b.is_const else b.scale(a.const)
            return
        if isinstance(op, arith.MinSIOp):
            a, b = self.expr(op.lhs), self.expr(op.rhs)
            if isinstance(a, Affine) and isinstance(b, Affine) and a.is_const and b.is_const:
                self.env[op.result] = Affine(min(a.const, b.const))
            else:
                self.env[op.result] = Min((a, b))
            return
        if isinstance(op, arith.CmpiOp):
            if op.predicate.value.data != 1:  # ne
                raise CompileError(f"{self.name}: only 'ne' comparisons are supported")
            diff = self.affine(op.lhs) - self.affine(op.rhs)
            self.env[op.result] = Affine(int(diff.const != 0)) if diff.is_const else Ne(diff)
            return
        if isinstance(op, scf.ForOp):
            lb, ub, step = (self.affine(v) for v in (op.lb, op.ub, op.step))
            if not (lb.is_const and ub.is_const and step.is_const) or lb.const != 0 or step.const != 1:
                raise CompileError(f"{self.name}: scf.for must run from 0 to a constant with step 1")
            loop = npu.LoopOp(ub.const)
            _copy_loc(op, loop)
            self.env[op.body.block.args[0]] = Affine.iv(depth)
            self.block(op.body.block, loop.body.block, depth + 1)
            dst.add_op(loop)
            return
        if isinstance(op, tile.AllocOp):
            t = op.result.type
            assert isinstance(t, MemRefType)
            if op.offset is None:
                raise CompileError(f"{self.name}: buffer '{op.buffer.data}' has no offset (run plan-sram first)")
            mem = Mem.SRAM if tile.space_of(t) == tile.SRAM else Mem.ACC
            self.env[op.result] = Buffer(op.buffer.data, mem, op.offset.value.data, dtype_of(t.element_type))
            return
        if isinstance(op, tile.SubviewOp):
            src = self.buf(op.source)
            isz = element_size_of(src.dtype)
            row, col = self.affine(op.row), self.affine(op.col)
            self.env[op.result] = Buffer(
                src.name, src.mem, _simplify(Affine(0) + col.scale(isz) + _as_affine(src.offset)),
                src.dtype, _simplify(row + _as_affine(src.part)),
            )
            return
        handler = _HANDLERS.get(type(op))
        if handler is None:
            raise CompileError(f"{self.name}: no instruction selection for {op.name}")
        dst.add_op(_copy_loc(op, handler(self, op)))

    def hbm_arg(self, v: SSAValue) -> int:
        """The kernel argument HBM tensor `v` is (its DMAs are relocated by it)."""
        i = self.arg_index.get(v)
        if i is None:
            raise CompileError(f"{self.name}: an HBM tensor that is not a kernel argument")
        return i

    def buf(self, v: SSAValue) -> Buffer:
        b = self.env[v]
        assert isinstance(b, Buffer)
        return b

    def operand(self, prefix: str, b: Buffer) -> dict[str, int | str]:
        return {
            f"{prefix}_mem": int(b.mem),
            f"{prefix}_part": _field(b.part),
            f"{prefix}_addr": _field(b.offset),
            f"{prefix}_dtype": int(b.dtype),
        }

    def hbm_access(
        self, t: HbmTensor, indices: Sequence[SSAValue], row_dim: int, col_dim: int,
        row_step: int = 1, col_step: int = 1,
    ) -> dict[str, int | str]:
        strides = t.strides()
        addr = Affine(t.addr)
        size = int(element_size_of(t.dtype))
        for idx, st in zip(indices, strides, strict=True):
            addr = addr + self.affine(idx).scale(st * size)
        return {
            "hbm_rs": strides[row_dim] * row_step if row_dim >= 0 else 0,
            "hbm_cs": strides[col_dim] * col_step if col_dim >= 0 else 0,
            "_addr": _field(addr),
        }

    def sizes(self, rows: SSAValue, cols: SSAValue) -> dict[str, int | str]:
        return {"rows": _field(self.expr(rows)), "cols": _field(self.expr(cols))}


def _copy_loc(src: Operation, dst: Operation) -> Operation:
    """The source location (``tilecc.loc``) of the tile op travels to its instruction."""
    loc = src.attributes.get("tilecc.loc")
    if loc is not None:
        dst.attributes["tilecc.loc"] = loc
    return dst


def _as_affine(v: int | Affine) -> Affine:
    return v if isinstance(v, Affine) else Affine(int(v))


def _simplify(a: Affine) -> int | Affine:
    return a.const if a.is_const else a


def element_size_of(d: DType) -> int:
    return ITEMSIZE[d]


def _load(kl: KernelLowering, op: tile.LoadOp) -> npu.InstructionOp:
    t = kl.env[op.src]
    assert isinstance(t, HbmTensor)
    dst = kl.buf(op.dst)
    if dst.dtype != t.dtype:
        raise CompileError(f"{kl.name}: tile.load converts {t.dtype.name} to {dst.dtype.name}; DMA cannot")
    acc = kl.hbm_access(
        t, op.indices, op.row_dim.value.data, op.col_dim.value.data,
        op.step("row_step"), op.step("col_step"),
    )
    if op.queue is not None:
        queue = op.queue.value.data % kl.cfg.dma.queues
    else:
        queue = kl.n_loads % kl.cfg.dma.queues
        kl.n_loads += 1
    fields = {
        "queue": queue,
        "a_addr": acc.pop("_addr"),
        "a_dtype": int(t.dtype),
        **acc,
        **kl.operand("o", dst),
        **kl.sizes(op.rows, op.cols),
    }
    return npu.DmaLoadOp(fields, reads=[], writes=[dst.name], hbm_arg=kl.hbm_arg(op.src))


def _store(kl: KernelLowering, op: tile.StoreOp) -> npu.InstructionOp:
    t = kl.env[op.dst]
    assert isinstance(t, HbmTensor)
    src = kl.buf(op.src)
    if src.dtype != t.dtype:
        raise CompileError(f"{kl.name}: tile.store converts {src.dtype.name} to {t.dtype.name}; DMA cannot")
    acc = kl.hbm_access(
        t, op.indices, op.row_dim.value.data, op.col_dim.value.data,
        op.step("row_step"), op.step("col_step"),
    )
    queue = kl.cfg.dma.queues - 1 if op.queue is None else op.queue.value.data % kl.cfg.dma.queues
    fields = {
        "queue": queue,
        **kl.operand("a", src),
        "o_addr": acc.pop("_addr"),
        "o_dtype": int(t.dtype),
        **acc,
        **kl.sizes(op.rows, op.cols),
    }
    return npu.DmaStoreOp(fields, reads=[src.name], writes=[], hbm_arg=kl.hbm_arg(op.dst))


def _gather(kl: KernelLowering, op: tile.GatherOp) -> npu.InstructionOp:
    t = kl.env[op.table]
    assert isinstance(t, HbmTensor)
    index, dst = kl.buf(op.index), kl.buf(op.dst)
    if dst.dtype != t.dtype:
        raise CompileError(f"{kl.name}: tile.gather converts {t.dtype.name} to {dst.dtype.name}; DMA cannot")
    rows_in_table, (row_stride, col_stride) = t.shape[0], t.strides()
    if col_stride != 1:
        raise CompileError(f"{kl.name}: tile.gather needs a table with contiguous rows")
    addr = Affine(t.addr) + kl.affine(op.col).scale(element_size_of(t.dtype))
    if op.queue is not None:
        queue = op.queue.value.data % kl.cfg.dma.queues
    else:
        queue = kl.n_loads % kl.cfg.dma.queues
        kl.n_loads += 1
    fields = {
        "queue": queue,
        "a_addr": _field(addr),
        "a_dtype": int(t.dtype),
        "hbm_rs": row_stride,
        "k": rows_in_table,
        **kl.operand("b", index),
        **kl.operand("o", dst),
        **kl.sizes(op.rows, op.cols),
    }
    return npu.DmaGatherOp(fields, reads=[index.name], writes=[dst.name], hbm_arg=kl.hbm_arg(op.table))


def _scatter(kl: KernelLowering, op: tile.ScatterOp) -> npu.InstructionOp:
    t = kl.env[op.table]
    assert isinstance(t, HbmTensor)
    src, index = kl.buf(op.src), kl.buf(op.index)
    if src.dtype != t.dtype:
        raise CompileError(f"{kl.name}: tile.scatter converts {src.dtype.name} to {t.dtype.name}; DMA cannot")
    strides = t.strides()
    if strides[-1] != 1:
        raise CompileError(f"{kl.name}: tile.scatter needs a table with contiguous rows")
    size = element_size_of(t.dtype)
    addr = Affine(t.addr)
    for idx, st in zip(op.indices, [*strides[:-2], 1], strict=True):
        addr = addr + kl.affine(idx).scale(st * size)
    queue = kl.cfg.dma.queues - 1 if op.queue is None else op.queue.value.data % kl.cfg.dma.queues
    fields = {
        "queue": queue,
        **kl.operand("a", src),
        **kl.operand("b", index),
        "o_addr": _field(addr),
        "o_dtype": int(t.dtype),
        "hbm_rs": strides[-2],
        "k": t.shape[-2],
        **kl.sizes(op.rows, op.cols),
    }
    return npu.DmaScatterOp(fields, reads=[src.name, index.name], writes=[], hbm_arg=kl.hbm_arg(op.table))


def _matmul(kl: KernelLowering, op: tile.MatmulOp) -> npu.InstructionOp:
    a, b, o = kl.buf(op.lhsT), kl.buf(op.rhs), kl.buf(op.acc)
    fields: dict[str, npu.FieldValue] = {
        **kl.operand("a", a),
        **kl.operand("b", b),
        **kl.operand("o", o),
        "rows": _field(kl.expr(op.m)),
        "k": _field(kl.expr(op.k)),
        "cols": _field(kl.expr(op.n)),
        "flags": _field(kl.expr(op.accumulate)),  # Flag.ACCUMULATE == 1
    }
    return npu.MatmulOp(fields, reads=[a.name, b.name, o.name], writes=[o.name])


def _unary(kl: KernelLowering, op: tile.UnaryOp) -> npu.InstructionOp:
    a, o = kl.buf(op.input), kl.buf(op.output)
    fields = {
        "func": int(UnaryFn[op.fn.data.upper()]),
        **kl.operand("a", a),
        **kl.operand("o", o),
        **kl.sizes(op.rows, op.cols),
    }
    return npu.VecUnaryOp(fields, reads=[a.name], writes=[o.name])


def _binary(kl: KernelLowering, op: tile.BinaryOp) -> npu.InstructionOp:
    a, b, o = kl.buf(op.lhs), kl.buf(op.rhs), kl.buf(op.output)
    flags = Flag.B_COLUMN if op.rhs_mode.data == "column" else Flag.NONE
    if op.swap is not None:
        flags |= Flag.SWAP
    fields = {
        "func": int(BinaryFn[op.fn.data.upper()]),
        "flags": int(flags),
        **kl.operand("a", a),
        **kl.operand("b", b),
        **kl.operand("o", o),
        **kl.sizes(op.rows, op.cols),
    }
    return npu.VecBinaryOp(fields, reads=[a.name, b.name], writes=[o.name])


def _scalar(kl: KernelLowering, op: tile.ScalarOp) -> npu.InstructionOp:
    a, o = kl.buf(op.input), kl.buf(op.output)
    flags = Flag.B_IMM | (Flag.SWAP if op.swap is not None else Flag.NONE)
    fields = {
        "func": int(BinaryFn[op.fn.data.upper()]),
        "flags": int(flags),
        "imm": float(op.imm.value.data),
        **kl.operand("a", a),
        **kl.operand("o", o),
        **kl.sizes(op.rows, op.cols),
    }
    return npu.VecBinaryOp(fields, reads=[a.name], writes=[o.name])


def _reduce(kl: KernelLowering, op: tile.ReduceOp) -> npu.InstructionOp:
    a, o = kl.buf(op.input), kl.buf(op.output)
    fields = {
        "func": int(ReduceFn[op.fn.data.upper()]),
        **kl.operand("a", a),
        **kl.operand("o", o),
        **kl.sizes(op.rows, op.cols),
    }
    return npu.VecReduceOp(fields, reads=[a.name], writes=[o.name])


_HANDLERS = {
    tile.LoadOp: _load,
    tile.StoreOp: _store,
    tile.GatherOp: _gather,
    tile.ScatterOp: _scatter,
    tile.MatmulOp: _matmul,
    tile.UnaryOp: _unary,
    tile.BinaryOp: _binary,
    tile.ScalarOp: _scalar,
    tile.ReduceOp: _reduce,
}


def hbm_bindings(main: func.FuncOp) -> dict[SSAValue, HbmTensor]:
    """HBM tensor of every memref value in @main (views alias their source)."""
    out: dict[SSAValue, HbmTensor] = {}
    for op in main.body.block.ops:
        if isinstance(op, tile.HbmAllocOp):
            if op.offset is None:
                raise CompileError("lower-tile-to-npu: run plan-hbm first (tile.hbm_alloc has no offset)")
            t = op.result.type
            assert isinstance(t, MemRefType)
            out[op.result] = HbmTensor(op.offset.value.data, t.get_shape(), dtype_of(t.element_type))
        elif isinstance(op, tile.ViewOp):
            src = out[op.source]
            t = op.result.type
            assert isinstance(t, MemRefType)
            shape = tuple(t.get_shape())
            if isinstance(t.layout, NoneAttr):  # the source's bytes, row-major
                if not src.contiguous:
                    raise CompileError(f"lower-tile-to-npu: {t} reshapes a non-contiguous view")
                out[op.result] = HbmTensor(src.base, shape, src.dtype, None, src.offset)
            else:
                strides, offset = tile.layout_of(t)
                out[op.result] = HbmTensor(src.base, shape, src.dtype, strides, offset)
    return out


def _deltas(name: str, first: list[HbmTensor], args: list[HbmTensor]) -> list[int]:
    """Per argument, the bytes from the kernel's first call's tensor to this call's: the
    same shape, dtype and strides (the kernel's argument types), another address."""
    for a, f in zip(args, first, strict=True):
        if (a.shape, a.dtype, a.strides()) != (f.shape, f.dtype, f.strides()):
            raise CompileError(f"lower-tile-to-npu: {name} is called on {a.shape} {a.dtype.name} tensors of "
                               f"other strides than its first call's ({f.shape}); it cannot be relocated")
    return [a.addr - f.addr for a, f in zip(args, first, strict=True)]


@dataclass(frozen=True)
class LowerTileToNpuPass(ModulePass):
    name = "lower-tile-to-npu"
    target: str = "tiny"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_tile_to_npu(op, load_config(self.target))


def lower_tile_to_npu(op: ModuleOp, cfg: HardwareConfig) -> None:
    funcs = {f.sym_name.data: f for f in op.ops if isinstance(f, func.FuncOp)}
    main = funcs.get("main")
    if main is None:
        raise CompileError("lower-tile-to-npu: the module has no func.func @main")
    bound = hbm_bindings(main)
    kernels: list[npu.KernelOp | npu.LaunchOp] = []
    first: dict[str, list[HbmTensor]] = {}  # kernel -> the arguments of its first call
    for call in main.body.block.ops:
        if not isinstance(call, func.CallOp):
            continue
        name = call.callee.root_reference.data
        args = [bound[a] for a in call.arguments]
        if name in first:
            kernels.append(_copy_loc(call, npu.LaunchOp(name, _deltas(name, first[name], args))))  # pyright: ignore[reportArgumentType]
            continue
        first[name] = args
        kernels.append(KernelLowering(cfg, name).lower(funcs[name], args))
    for f in funcs.values():
        f.detach()
        f.erase()
    for k in kernels:
        op.body.block.add_op(k)
