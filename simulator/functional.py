"""Functional execution: numpy/torch execution of a scheduled stream on modelled memories.

HBM is the caller's byte array, changed in place; SRAM and the accumulator are byte
arrays of ``partitions x bytes_per_partition``. Each instruction reads its operands at
its simulated start and writes its result at its simulated end (at equal times, writes
go first, then program order), so a missing semaphore wait reads stale data just as
the hardware would. Vector arithmetic runs torch's fp32 kernels (so fp32 results equal
PyTorch eager bit for bit) and rounds once to the output type (bf16 round-to-nearest-
even); a few torch bf16 kernels round intermediates (rsqrt) and can differ from that by
one bf16 ulp. MATMUL converts its operands to fp32 and multiplies them with numpy (fp32
accumulation; bf16 x bf16 products are exact in fp32), and ``ACCUMULATE`` adds the
product to the accumulator when it is written. i32 operands are read as fp32 (exact
below 2**24) and i32 outputs truncate toward zero, saturating. DMA_GATHER reads its
index column at its start; an index outside ``[0, k)`` raises `MemoryAccessError`
naming the instruction, the index and its row. DMA_SCATTER reads its source tile and
index column at its start (same check) and writes the rows at its end, in row order
(of duplicate indices the last row wins).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tilecc.errors import MemoryAccessError
from tilecc.simulator import progress
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.isa import (
    ITEMSIZE,
    STORAGE,
    BinaryFn,
    DType,
    Flag,
    Mem,
    Opcode,
    ReduceFn,
    UnaryFn,
)
from tilecc.simulator.numerics import from_storage, to_storage

__all__ = ["FunctionalMachine", "single_threaded_torch"]

_PROGRESS_STEP = 1 << 13  # reads and writes executed between two progress reports


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_UNARY: Mapping[int, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType(
    {
        UnaryFn.COPY: lambda x: x,
        UnaryFn.RELU: torch.relu,
        UnaryFn.GELU: F.gelu,
        UnaryFn.GELU_TANH: _gelu_tanh,
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
        UnaryFn.ERF: torch.special.erf,
    }
)

# b may be a tensor (tile or column, broadcast) or a Python float (immediate)
_BINARY: Mapping[int, Callable[[Any, Any], torch.Tensor]] = MappingProxyType(
    {
        BinaryFn.ADD: lambda a, b: a + b,
        BinaryFn.SUB: lambda a, b: a - b,
        BinaryFn.MUL: lambda a, b: a * b,
        BinaryFn.DIV: lambda a, b: a / b,
        BinaryFn.MAX: lambda a, b: _extremum(a, b, torch.maximum, "min"),
        BinaryFn.MIN: lambda a, b: _extremum(a, b, torch.minimum, "max"),
        BinaryFn.POW: lambda a, b: a**b,
        # comparisons give 1.0 / 0.0 (IEEE: NaN compares unequal); MASK keeps a where b != 0
        BinaryFn.EQ: lambda a, b: _compare(torch.eq, a, b),
        BinaryFn.NE: lambda a, b: _compare(torch.ne, a, b),
        BinaryFn.LT: lambda a, b: _compare(torch.lt, a, b),
        BinaryFn.LE: lambda a, b: _compare(torch.le, a, b),
        BinaryFn.GT: lambda a, b: _compare(torch.gt, a, b),
        BinaryFn.GE: lambda a, b: _compare(torch.ge, a, b),
        BinaryFn.MASK: lambda a, b: _mask(a, b),
    }
)


def _compare(fn: Callable[..., torch.Tensor], a: Any, b: Any) -> torch.Tensor:
    return fn(a, b).to(torch.float32)


def _mask(a: Any, b: Any) -> torch.Tensor:
    """a where b != 0, else +0.0 (a swapped immediate `a` is a 0-d tensor)."""
    if isinstance(b, float):
        return a.clone() if b != 0.0 else torch.zeros_like(a)
    return torch.where(b != 0, a, torch.zeros((), dtype=torch.float32))

_REDUCE: Mapping[int, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType(
    {
        ReduceFn.SUM: lambda x: torch.sum(x, dim=1, keepdim=True),
        ReduceFn.MAX: lambda x: torch.amax(x, dim=1, keepdim=True),
        ReduceFn.MIN: lambda x: torch.amin(x, dim=1, keepdim=True),
    }
)


def _extremum(
    a: torch.Tensor, b: Any, fn: Callable[..., torch.Tensor], clamp_bound: str
) -> torch.Tensor:
    """maximum/minimum where `b` may be a Python float (then a NaN-propagating clamp)."""
    if isinstance(b, float):
        return torch.clamp(a, min=b) if clamp_bound == "min" else torch.clamp(a, max=b)
    return fn(a, b)


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """Run torch's kernels on one thread: tiles are small, and a parallel region costs
    far more than the work (F.gelu on 2048 elements: ~15 us on one thread, ~15 ms on
    two busy cores)."""
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


class FunctionalMachine:
    """Modelled memories and the per-opcode read (at start) and write (at end) steps."""

    def __init__(self, config: HardwareConfig, hbm: np.ndarray):
        self.mem: dict[int, np.ndarray] = {
            Mem.SRAM: np.zeros((config.sram.partitions, config.sram.bytes_per_partition), np.uint8),
            Mem.ACC: np.zeros(
                (config.accumulator.partitions, config.accumulator.bytes_per_partition), np.uint8
            ),
        }
        self.hbm_elems = {
            d: hbm[: len(hbm) // ITEMSIZE[d] * ITEMSIZE[d]].view(STORAGE[d]) for d in DType
        }

    def run(self, prog: DecodedProgram, start: np.ndarray, end: np.ndarray) -> None:
        """Read each instruction's operands at its start, write its result at its end."""
        self.prog = prog  # names instructions in run-time errors (gather indices)
        work = np.flatnonzero(~prog.is_barrier)
        times = np.concatenate([end[work], start[work]])
        is_read = np.concatenate([np.zeros(work.size, np.int8), np.ones(work.size, np.int8)])
        index = np.concatenate([work, work])
        order = np.lexsort((index, is_read, times))  # at equal times: writes, then reads
        fields = {name: prog.col[name].tolist() for name in _EXEC_FIELDS}
        inst = _Fields(fields)
        op = prog.op.tolist()
        read, write = self.handlers()
        pending: dict[int, Any] = {}
        reads, idx = is_read[order].tolist(), index[order].tolist()
        events, n = zip(reads, idx, strict=True), len(idx)
        for lo in range(0, n, _PROGRESS_STEP):  # the simulated fraction, for a listener
            for r, i in itertools.islice(events, _PROGRESS_STEP):
                inst.i = i
                if r:
                    pending[i] = read[op[i]](inst)
                else:
                    write[op[i]](inst, pending.pop(i))
            progress.report("simulate", min(lo + _PROGRESS_STEP, n) // 2, n // 2, unit="instruction")

    def handlers(self) -> tuple[dict[int, Callable[..., Any]], dict[int, Callable[..., Any]]]:
        """Per opcode: the read step (at the start: operands -> value) and the write step
        (at the end: value -> memory), each taking the instruction's `_Fields`."""
        read: dict[int, Callable[..., Any]] = {
            Opcode.DMA_LOAD: self._read_load,
            Opcode.DMA_STORE: self._read_store,
            Opcode.MATMUL: self._read_matmul,
            Opcode.VEC_UNARY: self._read_vector,
            Opcode.VEC_BINARY: self._read_vector,
            Opcode.VEC_REDUCE: self._read_vector,
            Opcode.DMA_GATHER: self._read_gather,
            Opcode.DMA_SCATTER: self._read_scatter,
        }
        write: dict[int, Callable[..., Any]] = {
            Opcode.DMA_LOAD: self._write_tile,
            Opcode.DMA_STORE: self._write_store,
            Opcode.MATMUL: self._write_matmul,
            Opcode.VEC_UNARY: self._write_tile,
            Opcode.VEC_BINARY: self._write_tile,
            Opcode.VEC_REDUCE: self._write_tile,
            Opcode.DMA_GATHER: self._write_tile,
            Opcode.DMA_SCATTER: self._write_scatter,
        }
        return read, write

    # -- memory views -----------------------------------------------------------------

    def tile(self, mem: int, part: int, addr: int, rows: int, cols: int, dtype: int) -> np.ndarray:
        d = DType(dtype)
        return self.mem[mem][part : part + rows, addr : addr + cols * ITEMSIZE[d]].view(STORAGE[d])

    def hbm_view(self, addr: int, rows: int, cols: int, rs: int, cs: int, dtype: int) -> np.ndarray:
        d = DType(dtype)
        isz = ITEMSIZE[d]
        base = self.hbm_elems[d][addr // isz :]
        strides = (rs * isz, cs * isz)
        return np.lib.stride_tricks.as_strided(base, shape=(rows, cols), strides=strides)

    # -- DMA ----------------------------------------------------------------------------

    def _read_load(self, f: _Fields) -> np.ndarray:
        return np.array(self.hbm_view(f.a_addr, f.rows, f.cols, f.hbm_rs, f.hbm_cs, f.a_dtype))

    def _index_column(self, f: _Fields, what: str) -> np.ndarray:
        """The indirect DMA's index column; an index outside [0, k) is a MemoryAccessError."""
        index = self.tile(f.b_mem, f.b_part, f.b_addr, f.rows, 1, DType.I32)[:, 0].astype(np.int64)
        bad = np.flatnonzero((index < 0) | (index >= f.k))
        if bad.size:
            r = int(bad[0])
            raise MemoryAccessError(
                f"{self.prog.where(f.i)}: {what} index {int(index[r])} (row {r} of the index "
                f"column) out of range for a table of {f.k} rows"
            )
        return index

    def _read_gather(self, f: _Fields) -> np.ndarray:
        """Rows index[r] of the table."""
        index = self._index_column(f, "gather")
        table = self.hbm_view(f.a_addr, f.k, f.cols, f.hbm_rs, 1, f.a_dtype)
        return table[index]

    def _read_scatter(self, f: _Fields) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct target rows, the source row written to each: the last of equals)."""
        index = self._index_column(f, "scatter")
        data = self.tile(f.a_mem, f.a_part, f.a_addr, f.rows, f.cols, f.a_dtype)
        rows, last = np.unique(index[::-1], return_index=True)
        return rows, data[len(index) - 1 - last].copy()

    def _write_scatter(self, f: _Fields, data: tuple[np.ndarray, np.ndarray]) -> None:
        rows, values = data
        self.hbm_view(f.o_addr, f.k, f.cols, f.hbm_rs, 1, f.o_dtype)[rows] = values

    def _read_store(self, f: _Fields) -> np.ndarray:
        return self.tile(f.a_mem, f.a_part, f.a_addr, f.rows, f.cols, f.a_dtype).copy()

    def _write_store(self, f: _Fields, data: np.ndarray) -> None:
        self.hbm_view(f.o_addr, f.rows, f.cols, f.hbm_rs, f.hbm_cs, f.o_dtype)[...] = data

    def _write_tile(self, f: _Fields, data: np.ndarray) -> None:
        self.tile(f.o_mem, f.o_part, f.o_addr, f.rows, data.shape[1], f.o_dtype)[...] = data

    # -- matrix -------------------------------------------------------------------------

    def _read_matmul(self, f: _Fields) -> np.ndarray:
        lhs_t = self._values(Mem.SRAM, f.a_part, f.a_addr, f.k, f.rows, f.a_dtype)
        rhs = self._values(Mem.SRAM, f.b_part, f.b_addr, f.k, f.cols, f.b_dtype)
        return np.matmul(lhs_t.T, rhs, dtype=np.float32)

    def _write_matmul(self, f: _Fields, product: np.ndarray) -> None:
        out = self.tile(Mem.ACC, f.o_part, f.o_addr, f.rows, f.cols, DType.F32)
        if f.flags & Flag.ACCUMULATE:
            out += product
        else:
            out[...] = product

    # -- vector -------------------------------------------------------------------------

    def _values(
        self, mem: int, part: int, addr: int, rows: int, cols: int, dtype: int
    ) -> np.ndarray:
        """A tile's elements as fp32 (a fresh array)."""
        return from_storage(self.tile(mem, part, addr, rows, cols, dtype), DType(dtype))

    def _operand(self, *tile: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self._values(*tile)))

    def _read_vector(self, f: _Fields) -> np.ndarray:
        a = self._operand(f.a_mem, f.a_part, f.a_addr, f.rows, f.cols, f.a_dtype)
        if f.opcode == Opcode.VEC_UNARY:
            result = _UNARY[f.func](a)
        elif f.opcode == Opcode.VEC_REDUCE:
            result = _REDUCE[f.func](a)
        else:
            result = _BINARY[f.func](*self._binary_operands(f, a))
        return to_storage(result.numpy(), DType(f.o_dtype))

    def _binary_operands(self, f: _Fields, a: torch.Tensor) -> tuple[Any, Any]:
        """(lhs, rhs). An immediate rhs is a Python float, as in ``x ** 2`` or ``x / 3``
        (torch's scalar kernels, e.g. pow(x, 2) = x * x); a swapped immediate is a 0-d
        fp32 tensor, so ``imm / x`` is a true division (not torch's reciprocal * imm)."""
        if f.flags & Flag.B_IMM:
            imm = float(np.float32(f.imm))
            if f.flags & Flag.SWAP:
                return torch.tensor(imm, dtype=torch.float32), a
            return a, imm
        b_cols = 1 if f.flags & Flag.B_COLUMN else f.cols
        b = self._operand(f.b_mem, f.b_part, f.b_addr, f.rows, b_cols, f.b_dtype)
        return (b, a) if f.flags & Flag.SWAP else (a, b)


_EXEC_FIELDS = (
    "opcode", "func", "flags", "a_dtype", "b_dtype", "o_dtype", "a_mem", "b_mem", "o_mem",
    "a_part", "b_part", "o_part", "rows", "cols", "k", "imm", "a_addr", "b_addr", "o_addr",
    "hbm_rs", "hbm_cs",
)


class _Fields:
    """Attribute access to the fields of instruction `i` (columns held as Python lists)."""

    __slots__ = ("_cols", "i")

    def __init__(self, cols: dict[str, list[Any]]):
        self._cols = cols
        self.i = 0

    def __getattr__(self, name: str) -> Any:
        return self._cols[name][self.i]


