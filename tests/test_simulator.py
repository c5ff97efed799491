"""The simulator: DMA, matmul and vector numerics against numpy/torch, the timing model's
closed forms, semaphores and barriers, deadlocks and the bounds sanitiser."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tilecc.errors import DeadlockError, MemoryAccessError, SimulatorError
from tilecc.simulator import isa
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.isa import BinaryFn, DType, Flag, Mem, Opcode, ReduceFn, UnaryFn
from tilecc.simulator.machine import SimResult, simulate
from tilecc.simulator.numerics import storage_to_torch, torch_to_storage

TINY = load_config("tiny")
HBM_BYTES = 1 << 20

# ----------------------------------------------------------------------------- helpers


def program(*instrs: dict[str, Any]) -> np.ndarray:
    """A stream from dicts of fields; `wait=[(sem, value)]`, `signal=sem`; engine derived."""
    s = isa.empty_stream(len(instrs))
    for i, fields in enumerate(instrs):
        fields = dict(fields)
        op = fields.pop("opcode")
        s[i]["opcode"] = op
        s[i]["engine"] = isa.OPCODE_ENGINE.get(op, 0)
        for j, (sem, val) in enumerate(fields.pop("wait", [])):
            s[i]["wait_sem"][j] = sem
            s[i]["wait_val"][j] = val
        s[i]["signal_sem"] = fields.pop("signal", -1)
        for key, value in fields.items():
            s[i][key] = value
    return s


def load(hbm_addr, rows, cols, dtype=DType.F32, *, part=0, addr=0, mem=Mem.SRAM, rs=None, cs=1,
         queue=0, **kw):
    return dict(
        opcode=Opcode.DMA_LOAD, a_mem=Mem.HBM, a_addr=hbm_addr, a_dtype=dtype, o_dtype=dtype,
        o_mem=mem, o_part=part, o_addr=addr, rows=rows, cols=cols,
        hbm_rs=cols if rs is None else rs, hbm_cs=cs, queue=queue, **kw,
    )


def store(hbm_addr, rows, cols, dtype=DType.F32, *, part=0, addr=0, mem=Mem.SRAM, rs=None, cs=1,
          queue=0, **kw):
    return dict(
        opcode=Opcode.DMA_STORE, a_mem=mem, a_part=part, a_addr=addr, a_dtype=dtype, o_dtype=dtype,
        o_mem=Mem.HBM, o_addr=hbm_addr, rows=rows, cols=cols,
        hbm_rs=cols if rs is None else rs, hbm_cs=cs, queue=queue, **kw,
    )


def matmul(m, k, n, dtype=DType.F32, *, a=(0, 0), b=(0, 0), o=(0, 0), accumulate=False,
           b_dtype=None, **kw):
    return dict(
        opcode=Opcode.MATMUL, rows=m, cols=n, k=k, a_mem=Mem.SRAM, a_part=a[0], a_addr=a[1],
        a_dtype=dtype, b_mem=Mem.SRAM, b_part=b[0], b_addr=b[1], b_dtype=b_dtype or dtype,
        o_mem=Mem.ACC, o_part=o[0], o_addr=o[1], o_dtype=DType.F32,
        flags=Flag.ACCUMULATE if accumulate else 0, **kw,
    )


def vector(opcode, func, rows, cols, *, a=(Mem.SRAM, 0, 0), a_dtype=DType.F32, b=(Mem.SRAM, 0, 0),
           b_dtype=DType.F32, o=(Mem.SRAM, 0, 0), o_dtype=DType.F32, flags=0, imm=0.0, **kw):
    return dict(
        opcode=opcode, func=func, rows=rows, cols=cols, a_mem=a[0], a_part=a[1], a_addr=a[2],
        a_dtype=a_dtype, b_mem=b[0], b_part=b[1], b_addr=b[2], b_dtype=b_dtype, o_mem=o[0],
        o_part=o[1], o_addr=o[2], o_dtype=o_dtype, flags=flags, imm=imm, **kw,
    )


def barrier() -> dict[str, Any]:
    return dict(opcode=Opcode.BARRIER)


class Hbm:
    """An HBM image with tensors placed at 64-byte aligned addresses."""

    def __init__(self, size: int = HBM_BYTES):
        self.bytes = np.zeros(size, np.uint8)
        self.top = 0

    def put(self, t: torch.Tensor) -> int:
        data, _ = torch_to_storage(t)
        raw = data.reshape(-1).view(np.uint8)
        addr = self.alloc(raw.size)
        self.bytes[addr : addr + raw.size] = raw
        return addr

    def alloc(self, nbytes: int) -> int:
        addr = self.top
        self.top = (addr + nbytes + 63) // 64 * 64
        return addr

    def get(self, addr: int, shape: tuple[int, ...], dtype: DType) -> torch.Tensor:
        count = math.prod(shape)
        raw = self.bytes[addr : addr + count * isa.ITEMSIZE[dtype]].view(isa.STORAGE[dtype])
        return storage_to_torch(raw.reshape(shape), dtype)


def run(stream: np.ndarray, hbm: Hbm, config: HardwareConfig = TINY) -> SimResult:
    return simulate(stream, config, hbm.bytes)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs of any payload equal)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    a32, b32 = a.float(), b.float()
    both_nan = torch.isnan(a32) & torch.isnan(b32)
    return bool(((a32 == b32) | both_nan).all()) and bool(
        (torch.signbit(a32) == torch.signbit(b32))[~both_nan].all()
    )


TORCH_DTYPE = {DType.F32: torch.float32, DType.BF16: torch.bfloat16}

# ----------------------------------------------------------------------------- DMA


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 16), cols=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_dma_load_store_round_trip(dtype, rows, cols, seed):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(TORCH_DTYPE[dtype])
    hbm = Hbm()
    src, dst = hbm.put(x), hbm.alloc(x.numel() * 4)
    stream = program(
        load(src, rows, cols, dtype, signal=0),
        store(dst, rows, cols, dtype, wait=[(0, 1)], queue=1),
    )
    run(stream, hbm)
    assert bits_equal(hbm.get(dst, (rows, cols), dtype), x)


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
def test_dma_transposed_load(dtype):
    x = torch.randn(5, 7).to(TORCH_DTYPE[dtype])
    hbm = Hbm()
    src, dst = hbm.put(x), hbm.alloc(x.numel() * 4)
    # tile (r, c) = x[c, r]: row stride 1 element, column stride 7 elements
    stream = program(load(src, 7, 5, dtype, rs=1, cs=7), store(dst, 7, 5, dtype))
    run(stream, hbm)
    assert bits_equal(hbm.get(dst, (7, 5), dtype), x.T.contiguous())


def test_dma_strided_store_into_a_larger_tensor():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    hbm = Hbm()
    src = hbm.put(x)
    big = hbm.put(torch.zeros(6, 10))
    # store into rows 1,3,5 and columns 2,4,6,8 of a 6 x 10 tensor
    run(program(load(src, 3, 4), store(big + (10 + 2) * 4, 3, 4, rs=20, cs=2)), hbm)
    want = torch.zeros(6, 10)
    want[1::2, 2::2] = x
    assert torch.equal(hbm.get(big, (6, 10), DType.F32), want)


def test_dma_broadcast_rows_and_negative_stride():
    x = torch.randn(6)
    hbm = Hbm()
    src, dst, rev = hbm.put(x), hbm.alloc(4 * 6 * 4), hbm.alloc(6 * 4)
    stream = program(
        load(src, 4, 6, rs=0),  # every partition gets x
        store(dst, 4, 6),
        load(src + 5 * 4, 1, 6, part=8, cs=-1),  # x reversed
        store(rev, 1, 6, part=8),
    )
    run(stream, hbm)
    assert torch.equal(hbm.get(dst, (4, 6), DType.F32), x.expand(4, 6))
    assert torch.equal(hbm.get(rev, (6,), DType.F32), x.flip(0))


def test_dma_to_and_from_the_accumulator():
    x = torch.randn(3, 5)
    hbm = Hbm()
    src, dst = hbm.put(x), hbm.alloc(60)
    stream = program(
        load(src, 3, 5, mem=Mem.ACC, part=2, addr=16),
        store(dst, 3, 5, mem=Mem.ACC, part=2, addr=16),
    )
    run(stream, hbm)
    assert torch.equal(hbm.get(dst, (3, 5), DType.F32), x)


# ----------------------------------------------------------------------------- matmul


def matmul_program(hbm: Hbm, a: torch.Tensor, b: torch.Tensor, dtype: DType, out_dtype=DType.F32):
    """out = a @ b: load a^T (K x M) and b (K x N), matmul, (convert,) store."""
    m, k = a.shape
    n = b.shape[1]
    isz = isa.ITEMSIZE[dtype]
    a_addr, b_addr = hbm.put(a.to(TORCH_DTYPE[dtype])), hbm.put(b.to(TORCH_DTYPE[dtype]))
    out = hbm.alloc(m * n * 4)
    instrs = [
        load(a_addr, k, m, dtype, rs=1, cs=k, signal=0),  # a^T via strides
        load(b_addr, k, n, dtype, addr=m * isz, queue=1, signal=0),
        matmul(m, k, n, dtype, a=(0, 0), b=(0, m * isz), wait=[(0, 2)], signal=1),
    ]
    if out_dtype == DType.F32:
        instrs.append(store(out, m, n, mem=Mem.ACC, wait=[(1, 1)]))
    else:
        instrs += [
            vector(Opcode.VEC_UNARY, UnaryFn.COPY, m, n, a=(Mem.ACC, 0, 0), o=(Mem.SRAM, 0, 512),
                   o_dtype=out_dtype, wait=[(1, 1)], signal=2),
            store(out, m, n, out_dtype, addr=512, wait=[(2, 1)]),
        ]
    return program(*instrs), out


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 16), k=st.integers(1, 16), n=st.integers(1, 16), seed=st.integers(0, 2**16))
def test_matmul_f32_matches_numpy(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    hbm = Hbm()
    stream, out = matmul_program(hbm, a, b, DType.F32)
    run(stream, hbm)
    got = hbm.get(out, (m, n), DType.F32)
    # fp32 accumulation; torch's BLAS kernel may sum in another order, so the two differ
    # by at most twice the summation error bound k u sum|a_i b_j| (u = 2^-24; k = 11
    # gave 1.06e-6, past a flat 1e-6); numpy's order is matched exactly below
    bound = 2 * k * 2.0**-24 * (a.abs() @ b.abs())
    assert ((got - a @ b).abs() <= bound).all()
    assert np.array_equal(got.numpy(), np.matmul(a.T.contiguous().numpy().T, b.numpy()))


def test_matmul_f32_exact_on_integers():
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-64, 64, (16, 16), generator=g).float()
    b = torch.randint(-64, 64, (16, 16), generator=g).float()
    hbm = Hbm()
    stream, out = matmul_program(hbm, a, b, DType.F32)
    run(stream, hbm)
    assert torch.equal(hbm.get(out, (16, 16), DType.F32), a @ b)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 16), k=st.integers(1, 16), n=st.integers(1, 16), seed=st.integers(0, 2**16))
def test_matmul_bf16_equals_torch_bf16(m, k, n, seed):
    """fp32 accumulation of bf16 products, rounded once to bf16 (the bf16 products are exact
    in fp32). Compared with torch's fp32 matmul of the same values rounded once: torch's
    own CPU bf16 matmul is not always that (m=6, k=14, n=14, seed 14 differs in one
    element from both the fp32 and the fp64 sum rounded once)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    hbm = Hbm()
    stream, out = matmul_program(hbm, a, b, DType.BF16, out_dtype=DType.BF16)
    run(stream, hbm)
    assert bits_equal(hbm.get(out, (m, n), DType.BF16), torch.matmul(a.float(), b.float()).bfloat16())


def test_matmul_bf16_accumulates_in_fp32():
    # 1 + 2^-9 * 16 in fp32 is exact; a bf16 accumulator would lose every 2^-9
    k = 16
    a = torch.full((1, k), 2.0**-9, dtype=torch.bfloat16)
    a[0, 0] = 1.0
    b = torch.ones(k, 1, dtype=torch.bfloat16)
    hbm = Hbm()
    stream, out = matmul_program(hbm, a, b, DType.BF16)
    run(stream, hbm)
    assert hbm.get(out, (1, 1), DType.F32).item() == 1.0 + 15 * 2.0**-9


def test_matmul_mixed_f32_bf16_operands():
    a, b = torch.randn(4, 8), torch.randn(8, 3).bfloat16()
    hbm = Hbm()
    a_addr, b_addr, out = hbm.put(a.T.contiguous()), hbm.put(b), hbm.alloc(48)
    stream = program(
        load(a_addr, 8, 4, signal=0),
        load(b_addr, 8, 3, DType.BF16, addr=64, signal=0, queue=1),
        matmul(4, 8, 3, DType.F32, b_dtype=DType.BF16, b=(0, 64), wait=[(0, 2)], signal=1),
        store(out, 4, 3, mem=Mem.ACC, wait=[(1, 1)]),
    )
    run(stream, hbm)
    want = np.matmul(a.numpy(), b.float().numpy())
    assert np.array_equal(hbm.get(out, (4, 3), DType.F32).numpy(), want)


def test_matmul_accumulate_flag():
    g = torch.Generator().manual_seed(0)
    a1, a2, b1, b2 = (torch.randn(8, 8, generator=g) for _ in range(4))
    hbm = Hbm()
    addrs = [hbm.put(t) for t in (a1.T.contiguous(), b1, a2.T.contiguous(), b2)]
    out = hbm.alloc(256)
    stream = program(
        load(addrs[0], 8, 8, addr=0, signal=0),
        load(addrs[1], 8, 8, addr=32, signal=0),
        load(addrs[2], 8, 8, addr=64, signal=0),
        load(addrs[3], 8, 8, addr=96, signal=0),
        matmul(8, 8, 8, a=(0, 0), b=(0, 32), o=(4, 64), wait=[(0, 4)]),
        matmul(8, 8, 8, a=(0, 64), b=(0, 96), o=(4, 64), accumulate=True, signal=1),
        store(out, 8, 8, mem=Mem.ACC, part=4, addr=64, wait=[(1, 1)]),
    )
    run(stream, hbm)
    first = np.matmul(a1.numpy(), b1.numpy())
    want = first + np.matmul(a2.numpy(), b2.numpy())  # fp32 add of two fp32 products
    assert np.array_equal(hbm.get(out, (8, 8), DType.F32).numpy(), want)


# ----------------------------------------------------------------------------- vector

UNARY_TORCH = {
    UnaryFn.COPY: lambda x: x.clone(),
    UnaryFn.RELU: torch.relu,
    UnaryFn.GELU: F.gelu,
    UnaryFn.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
    UnaryFn.EXP: torch.exp,
    UnaryFn.TANH: torch.tanh,
    UnaryFn.SIGMOID: torch.sigmoid,
    UnaryFn.NEG: torch.neg,
    UnaryFn.ABS: torch.abs,
    UnaryFn.SQRT: torch.sqrt,
    UnaryFn.RSQRT: torch.rsqrt,
    UnaryFn.RECIPROCAL: torch.reciprocal,
    UnaryFn.LOG: torch.log,
    UnaryFn.SILU: F.silu,
    UnaryFn.SQUARE: torch.square,
    UnaryFn.ERF: torch.erf,
}
BINARY_TORCH = {
    BinaryFn.ADD: torch.add,
    BinaryFn.SUB: torch.sub,
    BinaryFn.MUL: torch.mul,
    BinaryFn.DIV: torch.div,
    BinaryFn.MAX: torch.maximum,
    BinaryFn.MIN: torch.minimum,
    BinaryFn.POW: torch.pow,
    BinaryFn.EQ: lambda a, b: torch.eq(a, b).to(torch.promote_types(a.dtype, b.dtype)),
    BinaryFn.NE: lambda a, b: torch.ne(a, b).to(torch.promote_types(a.dtype, b.dtype)),
    BinaryFn.LT: lambda a, b: torch.lt(a, b).to(torch.promote_types(a.dtype, b.dtype)),
    BinaryFn.LE: lambda a, b: torch.le(a, b).to(torch.promote_types(a.dtype, b.dtype)),
    BinaryFn.GT: lambda a, b: torch.gt(a, b).to(torch.promote_types(a.dtype, b.dtype)),
    BinaryFn.GE: lambda a, b: torch.ge(a, b).to(torch.promote_types(a.dtype, b.dtype)),
    BinaryFn.MASK: lambda a, b: torch.where(b != 0, a, torch.zeros((), dtype=a.dtype)).to(
        torch.promote_types(a.dtype, b.dtype)
    ),
}
REDUCE_TORCH = {
    ReduceFn.SUM: lambda x: x.sum(dim=1, keepdim=True),
    ReduceFn.MAX: lambda x: x.amax(dim=1, keepdim=True),
    ReduceFn.MIN: lambda x: x.amin(dim=1, keepdim=True),
}


def vector_inputs(rows: int, cols: int, seed: int, positive: bool = False) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3
    if positive:
        x = x.abs() + 0.01
    return x


def run_vector(op: dict[str, Any], inputs: list[torch.Tensor], out_shape, out_dtype: DType):
    """Load each input i at SRAM byte 1024 * i, run `op`, store its output (at 8192)."""
    hbm = Hbm()
    instrs = []
    for i, t in enumerate(inputs):
        dtype = isa.DType.BF16 if t.dtype == torch.bfloat16 else DType.F32
        rows, cols = t.shape
        instrs.append(load(hbm.put(t), rows, cols, dtype, addr=1024 * i, signal=0, queue=i % 2))
    out = hbm.alloc(math.prod(out_shape) * 4)
    instrs.append(dict(op, wait=[(0, len(inputs))], signal=1))
    instrs.append(store(out, out_shape[0], out_shape[1], out_dtype, addr=8192, wait=[(1, 1)]))
    run(program(*instrs), hbm)
    return hbm.get(out, out_shape, out_dtype)


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
@pytest.mark.parametrize("fn", list(UnaryFn))
def test_unary_matches_torch(fn, dtype):
    positive = fn in (UnaryFn.SQRT, UnaryFn.RSQRT, UnaryFn.LOG)
    x = vector_inputs(16, 37, int(fn), positive).to(TORCH_DTYPE[dtype])
    op = vector(Opcode.VEC_UNARY, fn, 16, 37, a_dtype=dtype, o=(Mem.SRAM, 0, 8192), o_dtype=dtype)
    got = run_vector(op, [x], (16, 37), dtype)
    # the ISA computes in fp32 and rounds once; torch's bf16 kernels mostly do the same
    assert bits_equal(got, UNARY_TORCH[fn](x.float()).to(x.dtype))
    torch.testing.assert_close(got, UNARY_TORCH[fn](x), rtol=2**-7, atol=1e-30)


def test_unary_converts_between_types():
    x = vector_inputs(4, 9, 1)
    op = vector(Opcode.VEC_UNARY, UnaryFn.EXP, 4, 9, o=(Mem.SRAM, 0, 8192), o_dtype=DType.BF16)
    assert bits_equal(run_vector(op, [x], (4, 9), DType.BF16), torch.exp(x).bfloat16())


def test_unary_special_values_match_torch():
    x = torch.tensor([[0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e30, 88.8]])
    for fn in UnaryFn:
        op = vector(Opcode.VEC_UNARY, fn, 1, 8, o=(Mem.SRAM, 0, 8192))
        assert bits_equal(run_vector(op, [x], (1, 8), DType.F32), UNARY_TORCH[fn](x)), fn.name


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
@pytest.mark.parametrize("fn", list(BinaryFn))
@pytest.mark.parametrize("form", ["tile", "column", "imm"])
@pytest.mark.parametrize("swap", [False, True])
def test_binary_matches_torch(fn, dtype, form, swap):
    tdt = TORCH_DTYPE[dtype]
    positive = fn == BinaryFn.POW  # real powers of positive bases
    a = vector_inputs(8, 21, 2, positive).to(tdt)
    flags = Flag.SWAP if swap else Flag.NONE
    imm = 1.75
    if form == "tile":
        b = vector_inputs(8, 21, 3, positive).to(tdt)
        inputs, b_ref = [a, b], b
    elif form == "column":
        b = vector_inputs(8, 1, 4, positive).to(tdt)
        inputs, b_ref, flags = [a, b], b, flags | Flag.B_COLUMN
    else:
        inputs, b_ref, flags = [a], torch.tensor(imm, dtype=tdt), flags | Flag.B_IMM
    op = vector(Opcode.VEC_BINARY, fn, 8, 21, a_dtype=dtype, b=(Mem.SRAM, 0, 1024), b_dtype=dtype,
                o=(Mem.SRAM, 0, 8192), o_dtype=dtype, flags=flags, imm=imm)
    got = run_vector(op, inputs, (8, 21), dtype)
    lhs, rhs = (b_ref, a) if swap else (a, b_ref)
    want = BINARY_TORCH[fn](lhs, rhs)
    if want.shape != (8, 21):
        want = want.expand(8, 21)
    assert bits_equal(got, want)


def test_binary_immediate_matches_python_scalar_semantics():
    """`x ** 2`, `x * 0.5`, `1 - x` as torch eager computes them with a Python scalar."""
    x = vector_inputs(4, 16, 5)
    cases = [(BinaryFn.POW, 2.0, False, lambda t: t**2), (BinaryFn.MUL, 0.5, False, lambda t: t * 0.5),
             (BinaryFn.SUB, 1.0, True, lambda t: 1 - t), (BinaryFn.DIV, 3.0, False, lambda t: t / 3.0)]
    for fn, imm, swap, ref in cases:
        flags = Flag.B_IMM | (Flag.SWAP if swap else 0)
        op = vector(Opcode.VEC_BINARY, fn, 4, 16, o=(Mem.SRAM, 0, 8192), flags=flags, imm=imm)
        assert bits_equal(run_vector(op, [x], (4, 16), DType.F32), ref(x)), fn.name


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16])
@pytest.mark.parametrize("fn", list(ReduceFn))
def test_reduce_matches_torch(fn, dtype):
    x = vector_inputs(16, 300, 7).to(TORCH_DTYPE[dtype])
    op = vector(Opcode.VEC_REDUCE, fn, 16, 300, a_dtype=dtype, o=(Mem.SRAM, 0, 8192), o_dtype=DType.F32)
    got = run_vector(op, [x], (16, 1), DType.F32)
    want = REDUCE_TORCH[fn](x.float())  # reductions accumulate in fp32
    if fn == ReduceFn.SUM:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    else:
        assert bits_equal(got, want)
    if dtype == DType.BF16:
        op = dict(op, o_dtype=DType.BF16)
        assert bits_equal(run_vector(op, [x], (16, 1), DType.BF16), REDUCE_TORCH[fn](x))


def test_vector_reads_the_accumulator_and_writes_in_place():
    x = vector_inputs(4, 8, 9)
    hbm = Hbm()
    src, out = hbm.put(x), hbm.alloc(128)
    stream = program(
        load(src, 4, 8, mem=Mem.ACC, part=3, addr=40, signal=0),
        vector(Opcode.VEC_UNARY, UnaryFn.RELU, 4, 8, a=(Mem.ACC, 3, 40), o=(Mem.ACC, 3, 40),
               wait=[(0, 1)], signal=1),
        store(out, 4, 8, mem=Mem.ACC, part=3, addr=40, wait=[(1, 1)]),
    )
    run(stream, hbm)
    assert torch.equal(hbm.get(out, (4, 8), DType.F32), torch.relu(x))


# ----------------------------------------------------------------------------- timing


def dma_rate(cfg: HardwareConfig, rows: int, chunk: float) -> float:
    """Bytes per cycle of a DMA alone spanning `rows` partitions with `chunk` contiguous
    bytes per partition: its engines, each moving a packet of `chunk` bytes in
    ``packet_overhead_cycles + chunk / engine_bytes_per_cycle``, at most HBM's."""
    engines = min(cfg.dma.engines, rows)
    packet = cfg.dma.packet_overhead_cycles + chunk / cfg.dma.engine_bytes_per_cycle
    return min(cfg.hbm.bytes_per_cycle, engines * chunk / packet)


def dma_cycles(cfg: HardwareConfig, rows: int, cols: int, itemsize: int) -> float:
    """A contiguous-row DMA alone: fixed part, one descriptor per row, then the bytes at
    the rate its rows and row length reach (tests/test_timing.py covers the rest)."""
    return (cfg.dma.latency_cycles + cfg.hbm.latency_cycles
            + rows * cfg.dma.per_descriptor_cycles
            + rows * cols * itemsize / dma_rate(cfg, rows, cols * itemsize))


def timing(stream: np.ndarray, cfg: HardwareConfig = TINY) -> SimResult:
    return simulate(stream, cfg, None, functional=False)


@pytest.mark.parametrize("preset", ["tiny", "edge", "cloud"])
def test_single_instruction_durations(preset):
    cfg = load_config(preset)
    R, C, P = cfg.matrix.rows, cfg.matrix.cols, cfg.sram.partitions
    lanes = cfg.vector.lanes
    # each engine's cycles in core cycles (the time base): matrix mc, vector vc per cycle
    mc, vc = cfg.clock_ghz / cfg.matrix.clock_ghz, cfg.clock_ghz / cfg.vector.clock_ghz
    lat = (cfg.vector.latency_cycles + cfg.vector.access_cycles) * vc
    unary, binary, reduce = (getattr(cfg.vector.op_cost, k) for k in ("unary", "binary", "reduce"))

    def vec(rows, cols, cost):  # the lane rule: one lane per partition
        return lat + math.ceil(rows / lanes) * cols * cost * vc

    cases = [
        (load(0, P, 100), dma_cycles(cfg, P, 100, 4)),
        (store(0, 3, 50, DType.BF16), dma_cycles(cfg, 3, 50, 2)),
        (matmul(7, R, C, DType.BF16), (2 * R + C - 2 + 7) * mc),
        (matmul(7, R, C, DType.F32), (2 * R + C - 2 + 7 * cfg.matrix.fp32_slowdown) * mc),
        (matmul(1, 1, 1, DType.BF16), (2 * R + C - 2 + 1) * mc),
        (vector(Opcode.VEC_UNARY, UnaryFn.RELU, P, 33), vec(P, 33, unary["relu"])),
        (vector(Opcode.VEC_UNARY, UnaryFn.EXP, P, 33), vec(P, 33, unary["exp"])),
        (vector(Opcode.VEC_BINARY, BinaryFn.ADD, P, 33, b=(Mem.SRAM, 0, 256)), vec(P, 33, 2 * binary["add"])),
        (vector(Opcode.VEC_BINARY, BinaryFn.DIV, P, 33, b=(Mem.SRAM, 0, 256)), vec(P, 33, 2 * binary["div"])),
        (vector(Opcode.VEC_BINARY, BinaryFn.MUL, 3, 5, flags=Flag.B_COLUMN, b=(Mem.SRAM, 0, 256)),
         vec(3, 5, binary["mul"])),
        (vector(Opcode.VEC_BINARY, BinaryFn.POW, 3, 5, flags=Flag.B_IMM, imm=2.0), vec(3, 5, binary["pow"])),
        (vector(Opcode.VEC_REDUCE, ReduceFn.SUM, P, 64), vec(P, 64, reduce["sum"])),
    ]
    for instr, cycles in cases:
        r = timing(program(instr), cfg)
        assert r.cycles == pytest.approx(cycles), instr
        assert r.start[0] == 0 and r.end[0] == pytest.approx(cycles)


def test_independent_engines_overlap():
    mm = matmul(16, 16, 16)
    vec = vector(Opcode.VEC_UNARY, UnaryFn.EXP, 16, 64, o=(Mem.SRAM, 0, 4096))
    ld = load(0, 16, 64, addr=8192, queue=1)
    alone = [timing(program(x)).cycles for x in (mm, vec, ld)]
    r = timing(program(mm, vec, ld))
    assert r.cycles == max(alone)
    assert list(r.start) == [0, 0, 0]
    assert r.utilization["matrix"] == pytest.approx(alone[0] / max(alone))


def test_semaphore_serialises_engines():
    mm = matmul(16, 16, 16, signal=3)
    vec = vector(Opcode.VEC_UNARY, UnaryFn.EXP, 16, 64, a=(Mem.ACC, 0, 0), o=(Mem.SRAM, 0, 4096))
    a, b = timing(program(mm)).cycles, timing(program(vec)).cycles
    r = timing(program(mm, dict(vec, wait=[(3, 1)])))
    assert r.cycles == a + b
    assert r.start[1] == r.end[0]


def test_same_engine_runs_in_order():
    ops = [vector(Opcode.VEC_UNARY, UnaryFn.RELU, 16, 16 * i) for i in (1, 2, 3)]
    r = timing(program(*ops))
    assert list(r.start[1:]) == list(r.end[:-1])


def test_semaphore_value_is_reached_at_the_nth_signal():
    slow, fast = load(0, 16, 1000, queue=0, signal=0), load(0, 1, 4, queue=1, signal=0)
    first = matmul(1, 1, 1, wait=[(0, 1)])
    second = matmul(1, 1, 1, wait=[(0, 2)])
    r = timing(program(slow, fast, first, second))
    assert r.end[1] < r.end[0]
    assert r.start[2] == r.end[1]  # value 1 at the earliest completion
    assert r.start[3] == r.end[0]  # value 2 at the later one


def test_two_waits_take_the_later():
    a = load(0, 16, 100, queue=0, signal=1)
    b = vector(Opcode.VEC_UNARY, UnaryFn.EXP, 16, 200, signal=2)
    c = matmul(1, 1, 1, wait=[(1, 1), (2, 1)])
    r = timing(program(a, b, c))
    assert r.start[2] == max(r.end[0], r.end[1])


def test_dma_transfers_share_the_hbm_channel():
    cfg = TINY
    fixed = cfg.dma.latency_cycles + cfg.hbm.latency_cycles + 16 * cfg.dma.per_descriptor_cycles
    transfer = 16 * 1024 * 4 / cfg.hbm.bytes_per_cycle
    r = timing(program(load(0, 16, 1024, queue=0), load(1 << 17, 16, 1024, queue=1)))
    assert list(r.start) == [0, 0]
    # processor sharing: each at half the bandwidth, both finish together
    assert r.end[0] == r.end[1] == pytest.approx(fixed + 2 * transfer)
    assert r.engine_busy["hbm"] == pytest.approx(2 * transfer)
    assert r.stalls["dma0"]["hbm_bandwidth"] == pytest.approx(transfer)
    # never above peak bandwidth
    assert r.hbm_bytes_read / r.cycles <= cfg.hbm.bytes_per_cycle


def test_hbm_sharing_recomputes_finish_times():
    # queue 1's load joins first (fewer rows), runs alone until the big one joins, then
    # both share; when it leaves, the big one speeds up again
    big = load(0, 16, 1024, queue=0)
    small = load(1 << 17, 1, 1024, queue=1)
    r = timing(program(big, small))
    cfg = TINY
    lat = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
    join_small, join_big = lat + cfg.dma.per_descriptor_cycles, lat + 16 * cfg.dma.per_descriptor_cycles
    # the 1-row load runs on one engine: one 4096 B packet in 0.6666 + 4096 / 19.2 = 214.0
    # cycles (19.14 B/cycle, 0.598 of HBM); the big one at the HBM peak on both engines:
    # together sum(rates)/HBM = 1.598 > sum(engines)/engines = 1.5, so each progresses at
    # 1/1.598 of its alone rate
    w_small, w_big = 0.6666 + 4096 / 19.2, 16 * 4096 / cfg.hbm.bytes_per_cycle
    slow = 1 + 4096 / w_small / cfg.hbm.bytes_per_cycle
    alone = join_big - join_small
    end_small = join_big + slow * (w_small - alone)
    assert r.end[1] == pytest.approx(end_small) == pytest.approx(598.028, abs=1e-3)
    assert r.end[0] == pytest.approx(end_small + w_big - (end_small - join_big) / slow)
    assert r.end[0] == pytest.approx(2447.028, abs=1e-3)


def test_barrier_drains_and_resets_semaphores():
    a = vector(Opcode.VEC_UNARY, UnaryFn.EXP, 16, 512, signal=0)
    b = load(0, 4, 4, queue=1)
    c = matmul(1, 1, 1)
    r = timing(program(a, b, barrier(), c))
    assert r.start[3] == r.end[2] == r.start[2] == max(r.end[0], r.end[1])
    assert r.kernels == 2
    # sem 0 was signalled in kernel 0, but reads 0 again after the barrier
    with pytest.raises(DeadlockError, match="semaphore 0 >= 1 \\(value 0\\)"):
        timing(program(a, barrier(), dict(c, wait=[(0, 1)])))
    # a signal inside the second kernel counts from zero
    r = timing(program(a, barrier(), dict(a, signal=0), dict(c, wait=[(0, 1)])))
    assert r.start[3] == r.end[2] > r.end[0]


@st.composite
def synchronised_programs(draw):
    """Random deadlock-free programs: every wait needs at most the number of signals that
    instructions earlier in program order (same kernel) send, so program order is a
    valid execution order."""
    instrs, signalled = [], {}
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["load", "store", "matmul", "unary", "binary", "reduce", "barrier"]))
        if kind == "barrier":
            instrs.append(barrier())
            signalled = {}
            continue
        rows, cols = draw(st.integers(1, 16)), draw(st.integers(1, 16))
        dtype = draw(st.sampled_from([DType.F32, DType.BF16]))
        if kind == "load":
            instr = load(0, rows, cols, dtype, queue=draw(st.integers(0, 1)))
        elif kind == "store":
            instr = store(0, rows, cols, dtype, queue=draw(st.integers(0, 1)))
        elif kind == "matmul":
            instr = matmul(rows, draw(st.integers(1, 16)), cols, dtype)
        elif kind == "unary":
            instr = vector(Opcode.VEC_UNARY, draw(st.sampled_from(list(UnaryFn))), rows, cols)
        elif kind == "binary":
            flags = draw(st.sampled_from([0, Flag.B_COLUMN, Flag.B_IMM]))
            func = draw(st.sampled_from(list(BinaryFn)))
            instr = vector(Opcode.VEC_BINARY, func, rows, cols, flags=flags)
        else:
            instr = vector(Opcode.VEC_REDUCE, draw(st.sampled_from(list(ReduceFn))), rows, cols)
        sems = sorted(signalled)
        waits = draw(st.lists(st.sampled_from(sems), max_size=isa.MAX_WAITS, unique=True)) if sems else []
        instr["wait"] = [(w, draw(st.integers(1, signalled[w]))) for w in waits]
        sig = draw(st.integers(-1, 3))
        if sig >= 0:
            instr["signal"] = sig
            signalled[sig] = signalled.get(sig, 0) + 1
        instrs.append(instr)
    return program(*instrs)


def dma_pattern(rec) -> str:
    isz = isa.ITEMSIZE[DType(int(rec["a_dtype"]))]
    if int(rec["hbm_cs"]) == 1:
        return "contiguous"
    return "transpose" if int(rec["hbm_rs"]) == 1 and isz == 2 else "strided"


def closed_form(cfg: HardwareConfig, rec) -> tuple[float, float, float]:
    """The timing model's closed forms (simulator/machine.py docstring): a DMA's fixed
    part and its transfer time alone; a matmul's (preload L, streaming S, fill/drain D);
    a vector instruction's duration."""
    op, rows, cols, k = (int(rec[f]) for f in ("opcode", "rows", "cols", "k"))
    if op in (Opcode.DMA_LOAD, Opcode.DMA_STORE):
        isz = isa.ITEMSIZE[DType(int(rec["a_dtype"]))]
        descriptors, chunk = {"contiguous": (rows, cols * isz), "transpose": (cols, rows * isz),
                              "strided": (rows * cols, isz)}[dma_pattern(rec)]
        fixed = cfg.dma.latency_cycles + cfg.hbm.latency_cycles + descriptors * cfg.dma.per_descriptor_cycles
        return fixed, rows * cols * isz / dma_rate(cfg, rows, chunk), 0.0
    if op == Opcode.MATMUL:
        R, C = cfg.matrix.rows, cfg.matrix.cols
        slow = cfg.matrix.fp32_slowdown if DType.F32 in (rec["a_dtype"], rec["b_dtype"]) else 1
        t = {"ws": rows, "os": k, "is": cols}[cfg.matrix.dataflow]
        mc = cfg.clock_ghz / cfg.matrix.clock_ghz  # core cycles per matrix cycle
        return (R if cfg.matrix.dataflow != "os" else 0) * mc, t * slow * mc, (R + C - 2) * mc
    func, flags = int(rec["func"]), int(rec["flags"])
    kind = {Opcode.VEC_UNARY: ("unary", UnaryFn), Opcode.VEC_BINARY: ("binary", BinaryFn),
            Opcode.VEC_REDUCE: ("reduce", ReduceFn)}[Opcode(op)]
    cost = getattr(cfg.vector.op_cost, kind[0])[kind[1](func).name.lower()]
    n_in = 2 if op == Opcode.VEC_BINARY and not flags & (Flag.B_COLUMN | Flag.B_IMM) else 1
    vc = cfg.clock_ghz / cfg.vector.clock_ghz  # core cycles per vector cycle
    return (cfg.vector.latency_cycles + cfg.vector.access_cycles
            + math.ceil(rows / cfg.vector.lanes) * cols * cost * n_in) * vc, 0.0, 0.0


def processor_sharing(
    joins: list[tuple[float, int, float]], cfg: HardwareConfig | None = None,
    rates: dict[int, tuple[float, int]] | None = None,
) -> dict[int, float]:
    """End time of each transfer (join time, index, time alone) on the shared engines
    and HBM: at every join and finish, every transfer in flight progresses at 1/n of its
    alone rate, ``n = max(1, sum of rates / HBM peak, sum of engines / dma.engines)``
    (`rates`: index -> (rate alone, engines); without them, n = transfers in flight)."""
    pending, active, t, ends = sorted(joins), {}, 0.0, {}
    while pending or active:
        n = len(active)
        if rates is not None and cfg is not None and active:
            n = max(1.0, sum(rates[i][0] for i in active) / cfg.hbm.bytes_per_cycle,
                    sum(rates[i][1] for i in active) / cfg.dma.engines)
        first = min(active, key=lambda i: (active[i], i)) if active else None
        t_finish = t + active[first] * n if active else math.inf
        t_join = pending[0][0] if pending else math.inf
        t_next = min(t_join, t_finish)
        for i in active:
            active[i] -= (t_next - t) / n
        t = t_next
        if t_join < t_finish:
            _, i, alone = pending.pop(0)
            active[i] = alone
        else:
            ends[first] = t
            del active[first]
    return ends


@pytest.mark.parametrize("mode", ["pipelined", "compatible"])
@settings(max_examples=60, deadline=None)
@given(stream=synchronised_programs())
def test_schedule_satisfies_the_timing_equations(mode, stream):
    """Every start is the earliest the model allows: max(kernel start, engine free, the
    time each wait's semaphore reached its value); ends follow the closed forms, a
    pipelined matrix engine frees at its matmul's streaming start, DMA transfers share
    HBM by processor sharing."""
    cfg = dataclasses.replace(TINY, matrix=dataclasses.replace(TINY.matrix, mode=mode))
    r = timing(stream, cfg)
    start, end = r.start, r.end
    kernel = np.cumsum(stream["opcode"] == Opcode.BARRIER)
    signals: dict[tuple[int, int], list[float]] = {}  # (kernel, sem) -> completion times
    for i in np.flatnonzero(stream["signal_sem"] >= 0):
        signals.setdefault((kernel[i], int(stream["signal_sem"][i])), []).append(end[i])
    kernel_start, engine_free, joins, stream_end, rates = 0.0, {}, [], 0.0, {}
    for i, rec in enumerate(stream):
        op = Opcode(int(rec["opcode"]))
        if op == Opcode.BARRIER:
            kernel_start = max([kernel_start] + list(end[:i]))
            assert start[i] == end[i] == kernel_start
            engine_free, stream_end = {}, kernel_start
            continue
        is_dma = op in (Opcode.DMA_LOAD, Opcode.DMA_STORE)
        engine = (int(rec["engine"]), int(rec["queue"]) if is_dma else 0)
        ready = max(kernel_start, engine_free.get(engine, kernel_start))
        for w, v in zip(rec["wait_sem"], rec["wait_val"]):
            if w >= 0:
                ready = max(ready, sorted(signals[kernel[i], int(w)])[int(v) - 1])
        assert start[i] == ready, i
        first, second, third = closed_form(cfg, rec)
        engine_free[engine] = end[i]
        if is_dma:
            joins.append((start[i] + first, i, second))
            rows, isz = int(rec["rows"]), isa.ITEMSIZE[DType(int(rec["a_dtype"]))]
            rates[i] = (rows * int(rec["cols"]) * isz / second, min(cfg.dma.engines, rows))
        elif op == Opcode.MATMUL and mode == "pipelined":
            streaming = max(start[i] + first, stream_end)
            stream_end = streaming + max(second, cfg.matrix.min_interval_cycles)
            assert end[i] == pytest.approx(streaming + second + third)
            engine_free[engine] = streaming
        else:
            assert end[i] == pytest.approx(start[i] + first + second + third)
    for i, t in processor_sharing(joins, cfg, rates).items():
        assert end[i] == pytest.approx(t), i
    assert r.cycles == (end.max() if len(stream) else 0)


def test_deadlock_names_engine_instruction_and_semaphore():
    stream = program(
        load(0, 4, 4, signal=1, wait=[(2, 1)]),
        matmul(4, 4, 4, wait=[(1, 1)], signal=2),
        vector(Opcode.VEC_UNARY, UnaryFn.RELU, 4, 4),
    )
    with pytest.raises(DeadlockError) as info:
        timing(stream)
    msg = str(info.value)
    assert "dma0 blocked at instruction 0 (DMA_LOAD) waiting on semaphore 2 >= 1 (value 0)" in msg
    assert "matrix blocked at instruction 1 (MATMUL) waiting on semaphore 1 >= 1 (value 0)" in msg
    assert "vector" not in msg


def test_deadlock_on_a_value_never_reached():
    stream = program(load(0, 4, 4, signal=5), load(0, 4, 4, signal=5), matmul(4, 4, 4, wait=[(5, 3)]))
    with pytest.raises(DeadlockError, match="semaphore 5 >= 3 \\(value 2\\)"):
        timing(stream)


def test_functional_order_follows_timing():
    """A load->matmul program is right with its wait, wrong without: the matmul reads
    SRAM at its start, before the load's data lands."""
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    hbm = Hbm()
    stream, out = matmul_program(hbm, a, b, DType.F32)
    run(stream, hbm)
    right = hbm.get(out, (8, 8), DType.F32)
    assert torch.equal(right, torch.from_numpy(np.matmul(a.numpy(), b.numpy())))
    racy = stream.copy()
    racy[2]["wait_sem"] = -1
    hbm.bytes[out : out + 256] = 0
    r = run(racy, hbm)
    assert r.start[2] < r.end[0]
    assert torch.equal(hbm.get(out, (8, 8), DType.F32), torch.zeros(8, 8))  # read zeros


def test_write_lands_at_the_end():
    """A store that starts while a vector op that writes its source runs reads old data."""
    x = torch.ones(2, 4)
    hbm = Hbm()
    src, out1, out2 = hbm.put(x), hbm.alloc(32), hbm.alloc(32)
    stream = program(
        load(src, 2, 4, signal=0),
        vector(Opcode.VEC_UNARY, UnaryFn.NEG, 2, 4, wait=[(0, 1)], signal=1),
        store(out1, 2, 4, wait=[(0, 1)], queue=1),  # races with the NEG: sees ones
        store(out2, 2, 4, wait=[(1, 1)], queue=1),  # ordered after it: sees -1
    )
    r = run(stream, hbm)
    assert r.start[2] < r.end[1]
    assert torch.equal(hbm.get(out1, (2, 4), DType.F32), x)
    assert torch.equal(hbm.get(out2, (2, 4), DType.F32), -x)


# ----------------------------------------------------------------------------- sanitiser


@pytest.mark.parametrize(
    "bad, match",
    [
        (load(0, 4, 4, part=14),
         r"instruction 1 \(dma0 DMA_LOAD\): destination SRAM partitions \[14, 18\) out of bounds"),
        (load(0, 2, 16, addr=65536 - 32),
         r"instruction 1 \(dma0 DMA_LOAD\): destination SRAM bytes \[0xffe0, 0x10020\)"),
        (load(HBM_BYTES - 32, 2, 16),
         r"instruction 1 \(dma0 DMA_LOAD\): source HBM bytes \[0xfffe0, 0x100060\)"),
        (load(64, 2, 4, rs=-32), r"source HBM bytes \[-0x40, 0x50\) out of bounds"),
        (load(2, 2, 4), r"source HBM address 0x2 is not aligned to its 4-byte elements"),
        (store(HBM_BYTES, 1, 1, queue=1), r"instruction 1 \(dma1 DMA_STORE\): destination HBM bytes"),
        (store(0, 1, 1, mem=Mem.ACC, addr=4094), r"source ACC bytes \[0xffe, 0x1002\)"),
        (matmul(4, 4, 4, a=(13, 0)), r"instruction 1 \(matrix MATMUL\): lhsT SRAM partitions \[13, 17\)"),
        (matmul(4, 4, 4, o=(0, 4096 - 8)), r"output ACC bytes \[0xff8, 0x1008\)"),
        (vector(Opcode.VEC_BINARY, BinaryFn.ADD, 4, 4, b=(Mem.ACC, 15, 0)),
         r"instruction 1 \(vector VEC_BINARY\): operand b ACC partitions \[15, 19\)"),
        (vector(Opcode.VEC_REDUCE, ReduceFn.SUM, 4, 4, o=(Mem.SRAM, 0, 65534)),
         r"output SRAM bytes \[0xfffe, 0x10002\)"),
    ],
)
def test_out_of_bounds_names_the_instruction(bad, match):
    ok = vector(Opcode.VEC_UNARY, UnaryFn.RELU, 4, 4)
    with pytest.raises(MemoryAccessError, match=match):
        run(program(ok, bad, ok), Hbm())


def test_timing_only_checks_against_capacity():
    big = load(TINY.hbm.capacity_bytes - 64, 1, 16)
    timing(program(big))
    with pytest.raises(MemoryAccessError, match="source HBM bytes"):
        timing(program(dict(big, a_addr=TINY.hbm.capacity_bytes - 32)))


def test_huge_addresses_and_strides_are_out_of_bounds():
    huge = (load(2**63, 1, 1), load(0, 2, 1, rs=2**61), load(0, 1, 2, cs=-(2**60)),
            load(2**64 - 4, 1, 1))
    for bad in huge:
        with pytest.raises(MemoryAccessError, match="instruction 0"):
            run(program(bad), Hbm())


@pytest.mark.parametrize(
    "bad, match",
    [
        (load(0, 1, 1, queue=2), r"instruction 0 \(dma2 DMA_LOAD\): DMA queue 2 out of range"),
        (load(0, 1, 1, signal=256), r"signal semaphore 256 out of range"),
        (matmul(1, 1, 1, wait=[(300, 1)]), r"wait semaphore 300 out of range"),
        (matmul(1, 17, 1), r"instruction 0 \(matrix MATMUL\): contraction K=17 exceeds"),
        (matmul(1, 1, 17), r"N=17 exceeds the array's 16 columns"),
        (matmul(17, 1, 1), r"M=17 exceeds the accumulator's 16 partitions"),
        (matmul(1, 1, 1, DType.I32), r"matmul operands must be"),
        (dict(matmul(1, 1, 1), o_mem=Mem.SRAM), r"matmul output must be in ACC"),
        (dict(load(0, 1, 1), o_dtype=DType.BF16), r"a DMA does not convert"),
        (dict(load(0, 1, 1), engine=isa.Engine.VECTOR), r"engine field 2 does not match"),
        (dict(load(0, 1, 1), rows=0), r"empty tile"),
        (dict(opcode=11), r"unknown opcode 11"),
        (vector(Opcode.VEC_UNARY, 16, 1, 1), r"unknown function 16 for VEC_UNARY"),
        (vector(Opcode.VEC_UNARY, 0, 1, 1, a=(Mem.HBM, 0, 0)), r"vector operand a must be in SRAM or ACC"),
        (vector(Opcode.VEC_BINARY, 0, 1, 1, flags=Flag.B_IMM | Flag.B_COLUMN), r"exclude each other"),
        (vector(Opcode.VEC_UNARY, 0, 1, 1, flags=Flag.SWAP), r"flags .* not allowed"),
        (dict(barrier(), signal=1), r"a barrier cannot wait on or signal"),
    ],
)
def test_invalid_instructions(bad, match):
    with pytest.raises(SimulatorError, match=match):
        timing(program(bad))


def test_lowest_index_error_wins():
    stream = program(matmul(1, 1, 1), load(0, 1, 1, part=16), matmul(1, 17, 1))
    with pytest.raises(MemoryAccessError, match="instruction 1"):
        timing(stream)


def test_functional_needs_an_hbm_image():
    with pytest.raises(SimulatorError, match="HBM image"):
        simulate(program(load(0, 1, 1)), TINY, None)
    with pytest.raises(SimulatorError, match="uint8"):
        simulate(program(load(0, 1, 1)), TINY, np.zeros(16, np.float32))


# ----------------------------------------------------------------------------- result


def test_result_statistics():
    hbm = Hbm()
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    stream, _ = matmul_program(hbm, a, b, DType.BF16, out_dtype=DType.BF16)
    r = run(stream, hbm)
    assert r.instructions == 5
    assert r.instructions_by_engine == {"dma": 3, "matrix": 1, "vector": 1, "barrier": 0}
    assert r.hbm_bytes_read == (16 * 8 + 16 * 4) * 2
    assert r.hbm_bytes_written == 8 * 4 * 2
    assert r.macs == 8 * 16 * 4 and r.macs_fp32 == 0
    assert r.vector_elements == 32
    mm_bytes = (16 * 8 + 16 * 4) * 2 + 8 * 4 * 4
    vec_bytes = 32 * 4 + 32 * 2
    assert r.sram_bytes == r.hbm_bytes_read + r.hbm_bytes_written + mm_bytes + vec_bytes
    assert r.cycles == r.end.max() and r.start.dtype == np.float64 and r.end.shape == (5,)
    for name, busy in r.engine_busy.items():
        assert r.utilization[name] == pytest.approx(busy / r.cycles)
    assert r.engine_busy["dma"] == pytest.approx((r.engine_busy["dma0"] + r.engine_busy["dma1"]) / 2)
    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert "start" not in d and d["cycles"] == r.cycles


def test_process_state_is_restored():
    threads, gc_on = torch.get_num_threads(), gc.isenabled()
    hbm = Hbm()
    stream, _ = matmul_program(hbm, torch.randn(4, 4), torch.randn(4, 4), DType.F32)
    run(stream, hbm)
    with pytest.raises(DeadlockError):
        timing(program(matmul(1, 1, 1, wait=[(0, 1)])))
    assert torch.get_num_threads() == threads and gc.isenabled() == gc_on


def test_empty_stream():
    r = simulate(isa.empty_stream(0), TINY, np.zeros(16, np.uint8))
    assert r.cycles == 0 and r.instructions == 0 and r.kernels == 0


def test_timing_only_equals_functional_timing():
    hbm = Hbm()
    stream, _ = matmul_program(hbm, torch.randn(8, 8), torch.randn(8, 8), DType.F32)
    functional = run(stream, hbm)
    timed = timing(stream)
    assert np.array_equal(functional.start, timed.start) and np.array_equal(functional.end, timed.end)
    assert functional.to_dict() == timed.to_dict()


def _bf16_bits_reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even of the fp32 bit pattern: (bits + 0x7FFF + lsb) >> 16."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    out = ((bits + ((bits >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16)
    out[np.isnan(x)] = 0x7FC0
    return out


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
@settings(max_examples=200, deadline=None)
def test_f32_to_bf16_bits_rounds_every_bit_pattern_to_nearest_even(words):
    """The packager's threaded conversion equals the bit formula on any fp32 pattern
    (denormals, infinities, overflow to inf, ties, every NaN as the canonical 0x7FC0)."""
    from tilecc.simulator.numerics import f32_to_bf16_bits

    x = np.array(words, dtype=np.uint32).view(np.float32)
    ties = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00000001, 0x80000000], dtype=np.uint32).view(np.float32)
    for v in (x, ties, x.reshape(-1, 1)[::2]):
        np.testing.assert_array_equal(f32_to_bf16_bits(v), _bf16_bits_reference(v).reshape(np.shape(v)))
    assert f32_to_bf16_bits(np.float32(1.0)).shape == ()


@pytest.mark.parametrize("dtype", [DType.I8, DType.F8E4M3])
def test_both_operands_8_bit_run_at_the_8_bit_rate_and_energy(dtype):
    """matrix.int8_speedup / fp8_speedup: a matmul with BOTH operands int8 (or fp8) streams
    that many times faster, its MACs are counted apart and charged pj_per_mac_int8 / _fp8;
    one 8-bit operand against a bf16 one stays at the 16-bit rate (weight-only quantisation)."""
    from tilecc.simulator.energy import from_result
    from tilecc.simulator.numerics import torch_to_storage
    from tilecc.simulator.roofline import roofline
    from tilecc.simulator.timing import TimingRules

    m, k, n = TINY.accumulator.partitions, TINY.matrix.rows, 16
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-8, 8, (m, k), generator=g).float()
    b = torch.randint(-8, 8, (k, n), generator=g).float()
    tdt = torch.int8 if dtype == DType.I8 else torch.float8_e4m3fn

    def run_with(speedup: float, b_dtype: DType):
        cfg = dataclasses.replace(TINY, matrix=dataclasses.replace(TINY.matrix, int8_speedup=speedup,
                                                                    fp8_speedup=speedup))
        hbm = Hbm()
        at, bt = a.T.contiguous().to(tdt), (b.to(tdt) if b_dtype == dtype else b.bfloat16())
        a_addr = hbm.alloc(at.numel())
        hbm.bytes[a_addr:a_addr + at.numel()] = torch_to_storage(at)[0].reshape(-1).view(np.uint8)
        b_bits = torch_to_storage(bt)[0].reshape(-1).view(np.uint8)
        b_addr = hbm.alloc(b_bits.size)
        hbm.bytes[b_addr:b_addr + b_bits.size] = b_bits
        out = hbm.alloc(m * n * 4)
        stream = program(
            load(a_addr, k, m, dtype, signal=0),
            load(b_addr, k, n, b_dtype, addr=1024, queue=1, signal=0),
            matmul(m, k, n, dtype, b_dtype=b_dtype, a=(0, 0), b=(0, 1024), wait=[(0, 2)], signal=1),
            store(out, m, n, mem=Mem.ACC, wait=[(1, 1)]),
        )
        sim = simulate(stream, cfg, hbm.bytes)
        np.testing.assert_array_equal(hbm.get(out, (m, n), DType.F32).numpy(), (a @ b).numpy())
        return sim, cfg, float(sim.end[2] - sim.start[2])

    slow, _, t1 = run_with(1.0, dtype)
    fast, cfg, t2 = run_with(2.0, dtype)
    s1 = TimingRules(TINY).matmul_stream(m, k, n, False)
    assert t1 - t2 == pytest.approx(s1 / 2)  # the streaming part halves, preload and drain stay
    key = "macs_int8" if dtype == DType.I8 else "macs_fp8"
    assert getattr(fast, key) == m * k * n and fast.macs == m * k * n
    e = from_result(fast, cfg)
    pj = cfg.energy.pj_per_mac_int8 if dtype == DType.I8 else cfg.energy.pj_per_mac_fp8
    assert pj is not None and e.mac_pj == pytest.approx(m * k * n * pj)
    bound = roofline({"macs_16": 0.0, "macs_fp32": 0.0, key: float(m * k * n), "vector_element_cycles": 0.0,
                      "compulsory_hbm_bytes": 0.0}, cfg)["matrix"]
    assert bound == pytest.approx(m * k * n / 2 / (cfg.matrix.rows * cfg.matrix.cols)
                                  * cfg.clock_ghz / cfg.matrix.clock_ghz)
    mixed, _, t3 = run_with(2.0, DType.BF16)  # one 8-bit operand: the bf16 rate and energy
    assert t3 == pytest.approx(t1) and getattr(mixed, key) == 0
