"""The NPU simulator: timing, then functional execution in simulated time order.

`simulate(stream, config, hbm)` runs an instruction stream (`isa.RECORD`) in three steps.

1. **Check** (vectorised over the whole stream): opcodes, engines, DMA queues, element
   types, memories, flags, tile sizes, matmul limits and semaphore ids are valid, and
   every operand lies inside its memory (the sanitiser). Errors name the instruction
   index, its engine and opcode, the memory and the offending range.

2. **Timing**: a discrete-event simulation. Engines are one in-order queue per DMA
   queue (``dma0``, ``dma1``, ...), ``matrix`` and ``vector``; all run in parallel. An
   instruction starts when its engine is free and each of its waits is met (semaphore
   ``wait_sem[i]`` has value ``>= wait_val[i]``); on completion it adds 1 to
   ``signal_sem``. Events (completions, HBM channel requests) are processed in time
   order, so every start time is exact. Durations, in cycles:

   - DMA: ``dma.latency + hbm.latency + rows * dma.per_row`` (fixed part), then the
     transfer ``bytes / hbm.bytes_per_cycle`` on the one HBM channel that all DMAs
     share first come first served (the transfer starts at ``max(start + fixed,
     channel free)``), so HBM throughput never exceeds its peak.
   - MATMUL: ``2R + C - 2 + M * s`` (R x C array, M output rows, ``s =
     matrix.fp32_slowdown`` when an operand is fp32, else 1).
   - VECTOR: ``vector.latency + ceil(rows * cols / lanes) * cost * n_in``; ``cost`` is
     ``vector.transcendental_cost`` for exp, gelu, tanh, sigmoid, sqrt, rsqrt,
     reciprocal, log, silu, erf, div and pow, else 1; ``n_in`` is 2 for a binary op
     with a tile second operand, else 1.

   ``BARRIER`` splits the stream into kernels: it starts and ends when every earlier
   instruction has ended, nothing after it starts earlier, and semaphores reset to 0.
   When no engine can progress, `DeadlockError` lists each blocked engine, its head
   instruction and the semaphores it waits on (awaited and current values).

3. **Functional** (``functional=True``): numpy execution on modelled memories (HBM is
   the caller's byte array, changed in place; SRAM and the accumulator are byte arrays
   of ``partitions x bytes_per_partition``). Each instruction reads its operands at
   its simulated start and writes its result at its simulated end (at equal times,
   writes go first, then program order), so a missing semaphore wait reads stale data
   just as the hardware would. Vector arithmetic runs torch's fp32 kernels (so fp32
   results equal PyTorch eager bit for bit) and rounds once to the output type
   (bf16 round-to-nearest-even); a few torch bf16 kernels round intermediates (rsqrt)
   and can differ from that by one bf16 ulp. MATMUL converts its operands to fp32 and
   multiplies them with numpy (fp32 accumulation; bf16 x bf16 products are exact in
   fp32), and ``ACCUMULATE`` adds the product to the accumulator when it is written.

The checks are strict about the ISA contract: a DMA_LOAD reads HBM (``a_mem``) into
SRAM/ACC (``o_mem``), a DMA_STORE the reverse; MATMUL takes both operands from SRAM
(``a_mem``, ``b_mem``) and writes ACC with ``o_dtype`` f32; tiles are never empty; a
BARRIER neither waits nor signals. On-chip addresses need no alignment, HBM addresses
must be aligned to the element size. `_Program.on_chip_operands` and `hbm_operands`
describe every access an instruction makes, for further sanitiser checks.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tilecc.errors import DeadlockError, MemoryAccessError, SimulatorError
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import (
    ITEMSIZE,
    OPCODE_ENGINE,
    RECORD,
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

__all__ = ["SimResult", "simulate"]

# ----------------------------------------------------------------------------- result


@dataclass
class SimResult:
    """What one simulation measured. Times are in cycles."""

    cycles: float
    engine_busy: dict[str, float]  # dma (mean over queues), dma0.., matrix, vector, hbm
    utilization: dict[str, float]  # engine_busy / cycles
    instructions: int
    instructions_by_engine: dict[str, int]  # dma, matrix, vector, barrier
    hbm_bytes_read: int
    hbm_bytes_written: int
    sram_bytes: int  # on-chip (SRAM and accumulator) bytes read plus written
    macs: int
    macs_fp32: int  # the part of `macs` with an fp32 operand (slower, more energy)
    vector_elements: int
    kernels: int  # barrier-separated kernels holding at least one instruction
    start: np.ndarray  # float64 [n]: start cycle of each instruction
    end: np.ndarray  # float64 [n]: end cycle of each instruction

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (the per-instruction arrays left out)."""
        return {
            "cycles": float(self.cycles),
            "engine_busy": {k: float(v) for k, v in self.engine_busy.items()},
            "utilization": {k: float(v) for k, v in self.utilization.items()},
            "instructions": int(self.instructions),
            "instructions_by_engine": {k: int(v) for k, v in self.instructions_by_engine.items()},
            "hbm_bytes_read": int(self.hbm_bytes_read),
            "hbm_bytes_written": int(self.hbm_bytes_written),
            "sram_bytes": int(self.sram_bytes),
            "macs": int(self.macs),
            "macs_fp32": int(self.macs_fp32),
            "vector_elements": int(self.vector_elements),
            "kernels": int(self.kernels),
        }


def simulate(
    stream: np.ndarray,
    config: HardwareConfig,
    hbm: np.ndarray | None,
    *,
    functional: bool = True,
) -> SimResult:
    """Run `stream` on `config`; with `functional`, execute it on `hbm` (changed in place).

    `hbm` is the whole HBM image, a flat writable uint8 array (ignored in timing-only
    mode, where it may be None and bounds are checked against the configured capacity).
    """
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD or stream.ndim != 1:
        raise SimulatorError("the instruction stream must be a 1-D numpy array of isa.RECORD")
    if functional:
        _check_hbm_image(hbm)
    hbm_size = len(hbm) if hbm is not None else config.hbm.capacity_bytes
    prog = _Program(stream, config)
    prog.check(hbm_size)
    with _gc_paused():  # the scheduler allocates millions of short-lived tuples
        start, end, hbm_busy = _schedule(prog)
    if functional:
        assert hbm is not None
        with _single_threaded_torch():
            _Machine(config, hbm).run(prog, start, end)
    return _result(prog, start, end, hbm_busy)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: its scans of a large heap (torch's objects)
    would otherwise dominate loops that allocate many small containers."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _single_threaded_torch() -> Iterator[None]:
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


def _check_hbm_image(hbm: np.ndarray | None) -> None:
    if hbm is None:
        raise SimulatorError("functional simulation needs an HBM image (a flat uint8 array)")
    if not isinstance(hbm, np.ndarray) or hbm.dtype != np.uint8 or hbm.ndim != 1:
        raise SimulatorError("the HBM image must be a 1-D numpy uint8 array")
    if not (hbm.flags.c_contiguous and hbm.flags.writeable):
        raise SimulatorError("the HBM image must be contiguous and writable")


# ----------------------------------------------------------------------------- program

_VECTOR_OPS = (Opcode.VEC_UNARY, Opcode.VEC_BINARY, Opcode.VEC_REDUCE)
_FUNC_COUNT = MappingProxyType(
    {
        Opcode.VEC_UNARY: len(UnaryFn),
        Opcode.VEC_BINARY: len(BinaryFn),
        Opcode.VEC_REDUCE: len(ReduceFn),
    }
)
_ALLOWED_FLAGS = MappingProxyType(
    {
        Opcode.MATMUL: int(Flag.ACCUMULATE),
        Opcode.VEC_BINARY: int(Flag.B_COLUMN | Flag.B_IMM | Flag.SWAP),
    }
)
_TRANSCENDENTAL_UNARY = tuple(
    int(f)
    for f in (
        UnaryFn.EXP, UnaryFn.GELU, UnaryFn.GELU_TANH, UnaryFn.TANH, UnaryFn.SIGMOID,
        UnaryFn.SQRT, UnaryFn.RSQRT, UnaryFn.RECIPROCAL, UnaryFn.LOG, UnaryFn.SILU,
        UnaryFn.ERF,
    )
)
_TRANSCENDENTAL_BINARY = (int(BinaryFn.DIV), int(BinaryFn.POW))
# operand roles by (opcode, slot) for error messages
_ROLE = MappingProxyType(
    {
        (Opcode.DMA_LOAD, "a"): "source",
        (Opcode.DMA_LOAD, "o"): "destination",
        (Opcode.DMA_STORE, "a"): "source",
        (Opcode.DMA_STORE, "o"): "destination",
        (Opcode.MATMUL, "a"): "lhsT",
        (Opcode.MATMUL, "b"): "rhs",
        (Opcode.MATMUL, "o"): "output",
    }
)


def _lut(mapping: Mapping[int, Any], dtype: Any = np.int64, default: Any = 0) -> np.ndarray:
    """A 256-entry lookup table indexed by a u1 field."""
    table = np.full(256, default, dtype=dtype)
    for k, v in mapping.items():
        table[int(k)] = v
    return table


# (instruction index, exception class, message) of each failed check
_Problems = list[tuple[int, type[SimulatorError], str]]


class _Program:
    """The stream's fields as numpy columns, plus derived per-instruction quantities."""

    def __init__(self, stream: np.ndarray, config: HardwareConfig):
        # contiguous copies: whole-stream passes over a strided record field are slow
        col = self.col = {name: np.ascontiguousarray(stream[name]) for name in RECORD.names}
        self.config = config
        self.n = len(stream)
        self.checked = np.ones(self.n, dtype=bool)  # instructions the next checks look at
        self.op = col["opcode"].astype(np.int64)
        self.flags = col["flags"].astype(np.int64)
        self.rows = col["rows"].astype(np.int64)
        self.cols = col["cols"].astype(np.int64)
        self.k = col["k"].astype(np.int64)
        self.queues = config.dma.queues
        is_dma = (self.op == Opcode.DMA_LOAD) | (self.op == Opcode.DMA_STORE)
        self.is_dma = is_dma
        self.is_vec = np.isin(self.op, _VECTOR_OPS)
        self.is_mm = self.op == Opcode.MATMUL
        self.is_barrier = self.op == Opcode.BARRIER
        # engine index: DMA queue q -> q, matrix -> Q, vector -> Q + 1, barrier -> -1
        eng = np.full(self.n, -1, dtype=np.int64)
        eng[is_dma] = col["queue"][is_dma]
        eng[self.is_mm] = self.queues
        eng[self.is_vec] = self.queues + 1
        self.eng = eng
        self.engine_names = [f"dma{q}" for q in range(self.queues)] + ["matrix", "vector"]
        b_imm = (self.flags & Flag.B_IMM) != 0
        b_col = (self.flags & Flag.B_COLUMN) != 0
        self.b_tile = (self.op == Opcode.VEC_BINARY) & ~b_imm & ~b_col
        self.b_column = (self.op == Opcode.VEC_BINARY) & b_col & ~b_imm
        self.uses_b = self.is_mm | self.b_tile | self.b_column

    # -- messages ---------------------------------------------------------------------

    def where(self, i: int) -> str:
        """'instruction 7 (dma1 DMA_LOAD)'."""
        op = int(self.op[i])
        name = Opcode(op).name if op <= max(Opcode) else f"opcode {op}"
        if self.is_barrier[i]:
            engine = "all"
        elif self.is_dma[i]:
            engine = f"dma{int(self.col['queue'][i])}"
        elif self.is_mm[i]:
            engine = "matrix"
        elif self.is_vec[i]:
            engine = "vector"
        else:
            engine = f"engine {int(self.col['engine'][i])}"
        return f"instruction {i} ({engine} {name})"

    def role(self, i: int, slot: str) -> str:
        default = {"a": "operand a", "b": "operand b", "o": "output"}[slot]
        return _ROLE.get((Opcode(int(self.op[i])), slot), default)

    # -- checks -----------------------------------------------------------------------

    def check(self, hbm_size: int) -> None:
        """Raise the error of the lowest-indexed invalid instruction, if any."""
        problems: _Problems = []
        self._check_structure(problems)
        # bounds only make sense for well-formed instructions: those before the first bad one
        first_bad = min((p[0] for p in problems), default=self.n)
        self.checked = np.arange(self.n) < first_bad
        self._check_on_chip(problems)
        self._check_hbm(problems, hbm_size)
        _raise_first(problems)

    def _fail(
        self,
        problems: _Problems,
        mask: np.ndarray,
        message: Callable[[int], str],
        exc: type[SimulatorError] = SimulatorError,
    ) -> None:
        bad = np.flatnonzero(mask & self.checked)
        if bad.size:
            i = int(bad[0])
            problems.append((i, exc, f"{self.where(i)}: {message(i)}"))

    def _check_structure(self, problems: _Problems) -> None:
        s, op, fail = self.col, self.op, self._fail
        cfg = self.config
        fail(problems, op > max(Opcode), lambda i: f"unknown opcode {op[i]}")
        expected = _lut({o: int(e) for o, e in OPCODE_ENGINE.items()}, default=-1)[op]
        fail(
            problems,
            (op <= max(Opcode)) & (s["engine"] != expected),
            lambda i: f"engine field {s['engine'][i]} does not match the opcode "
            f"(expected {int(expected[i])})",
        )
        fail(
            problems,
            self.is_dma & (s["queue"] >= self.queues),
            lambda i: f"DMA queue {s['queue'][i]} out of range (the target has "
            f"{self.queues} queues: 0..{self.queues - 1})",
        )
        self._check_sync(problems)
        self._check_sizes(problems)
        self._check_dtypes(problems)
        self._check_mems(problems)
        func_count = _lut({o: c for o, c in _FUNC_COUNT.items()})[op]
        fail(
            problems,
            self.is_vec & (s["func"] >= func_count),
            lambda i: f"unknown function {s['func'][i]} for {Opcode(op[i]).name}",
        )
        allowed = _lut(dict(_ALLOWED_FLAGS))[op]
        fail(
            problems,
            (self.flags & ~allowed) != 0,
            lambda i: f"flags {Flag(int(self.flags[i]))!r} not allowed "
            f"(allowed: {Flag(int(allowed[i]))!r})",
        )
        both = Flag.B_COLUMN | Flag.B_IMM
        fail(
            problems,
            (self.flags & both) == both,
            lambda i: "flags B_COLUMN and B_IMM exclude each other",
        )
        mm = self.is_mm
        fail(
            problems,
            mm & (self.k > cfg.matrix.rows),
            lambda i: f"contraction K={self.k[i]} exceeds the array's {cfg.matrix.rows} rows",
        )
        fail(
            problems,
            mm & (self.cols > cfg.matrix.cols),
            lambda i: f"N={self.cols[i]} exceeds the array's {cfg.matrix.cols} columns",
        )
        fail(
            problems,
            mm & (self.rows > cfg.accumulator.partitions),
            lambda i: f"M={self.rows[i]} exceeds the accumulator's "
            f"{cfg.accumulator.partitions} partitions",
        )

    def _check_sync(self, problems: _Problems) -> None:
        s, fail, count = self.col, self._fail, self.config.semaphores
        sig = s["signal_sem"].astype(np.int64)
        waits = s["wait_sem"].astype(np.int64)
        fail(
            problems,
            (sig < -1) | (sig >= count),
            lambda i: f"signal semaphore {sig[i]} out of range (0..{count - 1}, or -1 for none)",
        )
        bad_wait = (waits < -1) | (waits >= count)
        fail(
            problems,
            bad_wait.any(axis=1),
            lambda i: f"wait semaphore {waits[i][bad_wait[i]].tolist()[0]} out of range "
            f"(0..{count - 1}, or -1 for none)",
        )
        fail(
            problems,
            self.is_barrier & ((sig >= 0) | (waits >= 0).any(axis=1)),
            lambda i: "a barrier cannot wait on or signal semaphores",
        )

    def _check_sizes(self, problems: _Problems) -> None:
        fail = self._fail
        work = ~self.is_barrier & (self.op <= max(Opcode))
        fail(
            problems,
            work & ((self.rows == 0) | (self.cols == 0)),
            lambda i: f"empty tile (rows={self.rows[i]}, cols={self.cols[i]})",
        )
        fail(problems, self.is_mm & (self.k == 0), lambda i: "empty contraction (k=0)")

    def _check_dtypes(self, problems: _Problems) -> None:
        s, op, fail = self.col, self.op, self._fail
        work = ~self.is_barrier & (op <= max(Opcode))
        valid = _lut({d: 1 for d in DType}, dtype=bool, default=False)
        float_ = _lut({DType.F32: 1, DType.BF16: 1, DType.F16: 1}, dtype=bool, default=False)
        for field, used in (("a_dtype", work), ("o_dtype", work), ("b_dtype", self.uses_b)):
            fail(
                problems,
                used & ~valid[s[field]],
                lambda i, f=field: f"invalid {f} {s[f][i]}",
            )
        fail(
            problems,
            self.is_dma & (s["a_dtype"] != s["o_dtype"]),
            lambda i: f"a DMA does not convert: a_dtype {s['a_dtype'][i]} != "
            f"o_dtype {s['o_dtype'][i]}",
        )
        fail(
            problems,
            self.is_mm & ~(float_[s["a_dtype"]] & float_[s["b_dtype"]]),
            lambda i: "matmul operands must be f32, bf16 or f16",
        )
        fail(
            problems,
            self.is_mm & (s["o_dtype"] != DType.F32),
            lambda i: f"matmul output is fp32 (o_dtype must be {int(DType.F32)})",
        )

    def _check_mems(self, problems: _Problems) -> None:
        s, op, fail = self.col, self.op, self._fail
        on_chip = _lut({Mem.SRAM: 1, Mem.ACC: 1}, dtype=bool, default=False)
        load, store = op == Opcode.DMA_LOAD, op == Opcode.DMA_STORE
        a_on, b_on, o_on = on_chip[s["a_mem"]], on_chip[s["b_mem"]], on_chip[s["o_mem"]]
        rules = (
            (load & (s["a_mem"] != Mem.HBM), "a DMA_LOAD reads HBM (a_mem must be HBM)"),
            (load & ~o_on, "a DMA_LOAD writes SRAM or ACC (o_mem)"),
            (store & ~a_on, "a DMA_STORE reads SRAM or ACC (a_mem)"),
            (store & (s["o_mem"] != Mem.HBM), "a DMA_STORE writes HBM (o_mem must be HBM)"),
            (self.is_mm & (s["a_mem"] != Mem.SRAM), "matmul lhsT must be in SRAM (a_mem)"),
            (self.is_mm & (s["b_mem"] != Mem.SRAM), "matmul rhs must be in SRAM (b_mem)"),
            (self.is_mm & (s["o_mem"] != Mem.ACC), "matmul output must be in ACC (o_mem)"),
            (self.is_vec & ~a_on, "vector operand a must be in SRAM or ACC (a_mem)"),
            ((self.b_tile | self.b_column) & ~b_on, "vector operand b must be in SRAM or ACC"),
            (self.is_vec & ~o_on, "vector output must be in SRAM or ACC (o_mem)"),
        )
        for mask, text in rules:
            fail(problems, mask, lambda i, t=text: t)

    # -- operand extents (the sanitiser) ------------------------------------------------

    def on_chip_operands(self) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
        """(slot, mask, tile rows, tile cols) of each on-chip operand slot."""
        op, rows, cols, k = self.op, self.rows, self.cols, self.k
        mm, vec = self.is_mm, self.is_vec
        a_mask = (op == Opcode.DMA_STORE) | mm | vec
        a_rows = np.where(mm, k, rows)
        a_cols = np.where(mm, rows, cols)
        b_mask = mm | self.b_tile | self.b_column
        b_rows = np.where(mm, k, rows)
        b_cols = np.where(self.b_column, 1, cols)
        o_mask = (op == Opcode.DMA_LOAD) | mm | vec
        o_cols = np.where(op == Opcode.VEC_REDUCE, 1, cols)
        return [
            ("a", a_mask, a_rows, a_cols),
            ("b", b_mask, b_rows, b_cols),
            ("o", o_mask, rows, o_cols),
        ]

    def _check_on_chip(self, problems: _Problems) -> None:
        s, cfg = self.col, self.config
        itemsize = _lut({d: ITEMSIZE[d] for d in DType})
        for slot, mask, nrows, ncols in self.on_chip_operands():
            is_acc = s[f"{slot}_mem"] == Mem.ACC
            acc, sram = cfg.accumulator, cfg.sram
            parts = np.where(is_acc, acc.partitions, sram.partitions)
            size = np.where(is_acc, acc.bytes_per_partition, sram.bytes_per_partition)
            part = s[f"{slot}_part"].astype(np.int64)
            addr = np.minimum(s[f"{slot}_addr"], np.uint64(1 << 62)).astype(np.int64)
            nbytes = ncols * itemsize[s[f"{slot}_dtype"]]
            for bad, lo, extent, limit, unit in (
                (mask & (part + nrows > parts), s[f"{slot}_part"], nrows, parts, "partitions"),
                (mask & (addr + nbytes > size), s[f"{slot}_addr"], nbytes, size, "bytes"),
            ):
                self._fail(
                    problems,
                    bad,
                    lambda i, slot=slot, lo=lo, extent=extent, limit=limit, unit=unit: (
                        self._on_chip_message(
                            i, slot, int(lo[i]), int(extent[i]), int(limit[i]), unit
                        )
                    ),
                    MemoryAccessError,
                )

    def _on_chip_message(
        self, i: int, slot: str, lo: int, extent: int, limit: int, unit: str
    ) -> str:
        mem = Mem(int(self.col[f"{slot}_mem"][i])).name
        if unit == "partitions":
            return (
                f"{self.role(i, slot)} {mem} partitions [{lo}, {lo + extent}) out of bounds "
                f"({mem} has {limit} partitions)"
            )
        return (
            f"{self.role(i, slot)} {mem} bytes [{lo:#x}, {lo + extent:#x}) out of bounds "
            f"({mem} has {limit:#x} bytes per partition)"
        )

    def hbm_operands(self) -> list[tuple[str, np.ndarray]]:
        """(slot, mask) of the HBM operand: the source of loads, the destination of stores."""
        return [("a", self.op == Opcode.DMA_LOAD), ("o", self.op == Opcode.DMA_STORE)]

    def _check_hbm(self, problems: _Problems, hbm_size: int) -> None:
        s = self.col
        itemsize = _lut({d: ITEMSIZE[d] for d in DType})
        for slot, mask in self.hbm_operands():
            if not mask.any():
                continue
            isz = itemsize[s[f"{slot}_dtype"]]
            addr = s[f"{slot}_addr"]
            misaligned = mask & (addr % np.maximum(isz, 1).astype(np.uint64) != 0)
            self._fail(
                problems,
                misaligned,
                lambda i, slot=slot: f"{self.role(i, slot)} HBM address "
                f"{int(s[f'{slot}_addr'][i]):#x} is not aligned to its "
                f"{int(itemsize[s[f'{slot}_dtype'][i]])}-byte elements",
                MemoryAccessError,
            )
            idx = np.flatnonzero(mask & self.checked)
            ok = _hbm_in_bounds(
                addr[idx], s["hbm_rs"][idx], s["hbm_cs"][idx], self.rows[idx], self.cols[idx],
                isz[idx], hbm_size,
            )
            bad = np.zeros(self.n, dtype=bool)
            bad[idx[~ok]] = True
            self._fail(
                problems,
                bad,
                lambda i, slot=slot: self._hbm_message(i, slot, hbm_size),
                MemoryAccessError,
            )

    def _hbm_message(self, i: int, slot: str, hbm_size: int) -> str:
        s = self.col
        lo, hi = _hbm_extent(
            int(s[f"{slot}_addr"][i]), int(s["hbm_rs"][i]), int(s["hbm_cs"][i]),
            int(self.rows[i]), int(self.cols[i]), ITEMSIZE[DType(int(s[f"{slot}_dtype"][i]))],
        )
        return (
            f"{self.role(i, slot)} HBM bytes [{lo:#x}, {hi:#x}) out of bounds "
            f"(HBM has {hbm_size:#x} bytes; {self.rows[i]} x {self.cols[i]} elements, "
            f"strides {s['hbm_rs'][i]}, {s['hbm_cs'][i]} elements)"
        )


def _raise_first(problems: _Problems) -> None:
    if problems:
        _, exc, message = min(problems, key=lambda p: p[0])
        raise exc(message)


def _hbm_extent(addr: int, rs: int, cs: int, rows: int, cols: int, isz: int) -> tuple[int, int]:
    """Exact byte range [lo, hi) touched by a strided 2-D HBM operand."""
    tr, tc = (rows - 1) * rs * isz, (cols - 1) * cs * isz
    return addr + min(0, tr) + min(0, tc), addr + max(0, tr) + max(0, tc) + isz


def _hbm_in_bounds(
    addr: np.ndarray, rs: np.ndarray, cs: np.ndarray, rows: np.ndarray, cols: np.ndarray,
    isz: np.ndarray, size: int,
) -> np.ndarray:
    """Whether each strided operand lies in [0, size): float64, exact below 2**50."""
    a = addr.astype(np.float64)
    tr = (rows - 1).astype(np.float64) * rs.astype(np.float64) * isz
    tc = (cols - 1).astype(np.float64) * cs.astype(np.float64) * isz
    ok = (a + np.minimum(tr, 0) + np.minimum(tc, 0) >= 0) & (
        a + np.maximum(tr, 0) + np.maximum(tc, 0) + isz <= size
    )
    big = (a >= 2.0**50) | (np.abs(tr) >= 2.0**50) | (np.abs(tc) >= 2.0**50)
    for i in np.flatnonzero(big):  # rare: redo exactly with Python integers
        lo, hi = _hbm_extent(
            int(addr[i]), int(rs[i]), int(cs[i]), int(rows[i]), int(cols[i]), int(isz[i])
        )
        ok[i] = lo >= 0 and hi <= size
    return ok


# ----------------------------------------------------------------------------- timing


def _durations(prog: _Program) -> tuple[np.ndarray, np.ndarray]:
    """(fixed, transfer) cycles per instruction: DMAs add `transfer` on the HBM channel."""
    cfg, s, op = prog.config, prog.col, prog.op
    itemsize = _lut({d: ITEMSIZE[d] for d in DType})
    rows, cols = prog.rows.astype(np.float64), prog.cols.astype(np.float64)
    fixed = np.zeros(prog.n, dtype=np.float64)
    transfer = np.zeros(prog.n, dtype=np.float64)
    dma = prog.is_dma
    latency = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
    fixed[dma] = latency + rows[dma] * cfg.dma.per_row_cycles
    transfer[dma] = rows[dma] * cols[dma] * itemsize[s["a_dtype"][dma]] / cfg.hbm.bytes_per_cycle
    mm = prog.is_mm
    fp32 = (s["a_dtype"] == DType.F32) | (s["b_dtype"] == DType.F32)
    passes = np.where(fp32, cfg.matrix.fp32_slowdown, 1)
    fixed[mm] = (2 * cfg.matrix.rows + cfg.matrix.cols - 2 + rows * passes)[mm]
    vec = prog.is_vec
    func = s["func"]
    transcendental = ((op == Opcode.VEC_UNARY) & np.isin(func, _TRANSCENDENTAL_UNARY)) | (
        (op == Opcode.VEC_BINARY) & np.isin(func, _TRANSCENDENTAL_BINARY)
    )
    cost = np.where(transcendental, cfg.vector.transcendental_cost, 1)
    n_in = np.where(prog.b_tile, 2, 1)
    groups = np.ceil(rows * cols / cfg.vector.lanes)
    fixed[vec] = (cfg.vector.latency_cycles + groups * cost * n_in)[vec]
    return fixed, transfer


def _schedule(prog: _Program) -> tuple[np.ndarray, np.ndarray, float]:
    """Start and end cycle of every instruction, and the HBM channel's busy cycles.

    Events are (time, code) in a heap; code = 2 * index + 1 is a DMA asking for the HBM
    channel (after its fixed part), 2 * index a completion. An engine blocked on a
    semaphore waits in `waiters[sem]` until the value it needs (`need[engine]`) is
    reached, so a signal retries only the engines it can release.
    """
    fixed_arr, transfer_arr = _durations(prog)
    n, n_eng = prog.n, prog.queues + 2
    s = prog.col
    fixed, transfer = fixed_arr.tolist(), transfer_arr.tolist()
    first_event = (2 * np.arange(n) + prog.is_dma).tolist()
    eng = prog.eng.tolist()
    sig = s["signal_sem"].tolist()
    # waits flattened (instruction i's at [i * W, i * W + W)), compacted to the front of
    # each row so the first -1 ends them
    n_waits = s["wait_sem"].shape[1]
    order = np.argsort(s["wait_sem"] < 0, axis=1, kind="stable")
    wait_sem = np.take_along_axis(s["wait_sem"], order, axis=1).ravel().tolist()
    wait_val = np.take_along_axis(s["wait_val"], order, axis=1).ravel().tolist()
    start, end = [0.0] * n, [0.0] * n
    sem = [0] * prog.config.semaphores
    queues_np = [np.flatnonzero(prog.eng == e) for e in range(n_eng)]
    queues = [q.tolist() for q in queues_np]
    barriers = np.flatnonzero(prog.is_barrier).tolist()
    bounds = [0] + [b + 1 for b in barriers]
    limits = barriers + [n]
    heads_by_kernel = [np.searchsorted(q, bounds).tolist() for q in queues_np]
    tails_by_kernel = [np.searchsorted(q, limits).tolist() for q in queues_np]
    heappush, heappop = heapq.heappush, heapq.heappop
    now = 0.0
    hbm_free = 0.0

    for kernel in range(len(bounds)):
        head = [h[kernel] for h in heads_by_kernel]
        tail = [t[kernel] for t in tails_by_kernel]
        heap: list[tuple[float, int]] = []
        waiters: dict[int, list[int]] = {}
        need = [0] * n_eng

        def try_start(e: int, t: float) -> None:
            """Start engine e's head instruction at time t, or park e on a semaphore."""
            i = queues[e][head[e]]
            first = i * n_waits
            if wait_sem[first] >= 0:
                for j in range(first, first + n_waits):
                    w = wait_sem[j]
                    if w < 0:
                        break
                    if sem[w] < wait_val[j]:
                        need[e] = wait_val[j]
                        parked = waiters.get(w)
                        if parked is None:
                            waiters[w] = [e]
                        else:
                            parked.append(e)
                        return
            start[i] = t
            heappush(heap, (t + fixed[i], first_event[i]))

        for e in range(n_eng):
            if head[e] < tail[e]:
                try_start(e, now)
        while heap:
            t, code = heappop(heap)
            i = code >> 1
            if code & 1:  # HBM channel request: first come, first served
                begin = t if t > hbm_free else hbm_free
                hbm_free = begin + transfer[i]
                heappush(heap, (hbm_free, code - 1))
                continue
            end[i] = t
            now = t
            e = eng[i]
            head[e] += 1
            w = sig[i]
            if w >= 0:
                value = sem[w] + 1
                sem[w] = value
                parked = waiters.get(w)
                if parked:
                    released = [b for b in parked if need[b] <= value]
                    if released:
                        waiters[w] = [b for b in parked if need[b] > value]
                        for b in released:
                            try_start(b, t)
            if head[e] < tail[e]:
                try_start(e, t)
        blocked = [e for e in range(n_eng) if head[e] < tail[e]]
        if blocked:
            raise DeadlockError(_deadlock_message(prog, kernel, now, blocked, head, queues, sem))
        if kernel < len(barriers):
            b = barriers[kernel]
            start[b] = end[b] = now
        for w in set(sig[bounds[kernel] : limits[kernel]]):
            if w >= 0:
                sem[w] = 0
    hbm_busy = float(transfer_arr.sum())
    return np.array(start, dtype=np.float64), np.array(end, dtype=np.float64), hbm_busy


def _deadlock_message(
    prog: _Program, kernel: int, now: float, blocked: list[int], head: list[int],
    queues: list[list[int]], sem: list[int],
) -> str:
    s = prog.col
    lines = []
    for e in sorted(blocked):
        i = queues[e][head[e]]
        waits = [
            f"semaphore {int(w)} >= {int(v)} (value {sem[int(w)]})"
            for w, v in zip(s["wait_sem"][i], s["wait_val"][i], strict=True)
            if w >= 0 and sem[int(w)] < v
        ]
        opcode = Opcode(int(s["opcode"][i])).name
        lines.append(
            f"{prog.engine_names[e]} blocked at instruction {i} ({opcode}) "
            f"waiting on {', '.join(waits)}"
        )
    return f"deadlock in kernel {kernel} at cycle {now:g}: " + "; ".join(lines)


# ----------------------------------------------------------------------------- numerics


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
    }
)

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
        return torch.clamp(a, **{clamp_bound: b})
    return fn(a, b)


class _Machine:
    """Modelled memories and the per-opcode read (at start) and write (at end) steps."""

    def __init__(self, config: HardwareConfig, hbm: np.ndarray):
        self.mem = {
            Mem.SRAM: np.zeros((config.sram.partitions, config.sram.bytes_per_partition), np.uint8),
            Mem.ACC: np.zeros(
                (config.accumulator.partitions, config.accumulator.bytes_per_partition), np.uint8
            ),
        }
        self.hbm_elems = {
            d: hbm[: len(hbm) // ITEMSIZE[d] * ITEMSIZE[d]].view(STORAGE[d]) for d in DType
        }

    def run(self, prog: _Program, start: np.ndarray, end: np.ndarray) -> None:
        """Read each instruction's operands at its start, write its result at its end."""
        work = np.flatnonzero(~prog.is_barrier)
        times = np.concatenate([end[work], start[work]])
        is_read = np.concatenate([np.zeros(work.size, np.int8), np.ones(work.size, np.int8)])
        index = np.concatenate([work, work])
        order = np.lexsort((index, is_read, times))  # at equal times: writes, then reads
        fields = {name: prog.col[name].tolist() for name in _EXEC_FIELDS}
        inst = _Fields(fields)
        op = prog.op.tolist()
        read = {
            Opcode.DMA_LOAD: self._read_load,
            Opcode.DMA_STORE: self._read_store,
            Opcode.MATMUL: self._read_matmul,
            Opcode.VEC_UNARY: self._read_vector,
            Opcode.VEC_BINARY: self._read_vector,
            Opcode.VEC_REDUCE: self._read_vector,
        }
        write = {
            Opcode.DMA_LOAD: self._write_tile,
            Opcode.DMA_STORE: self._write_store,
            Opcode.MATMUL: self._write_matmul,
            Opcode.VEC_UNARY: self._write_tile,
            Opcode.VEC_BINARY: self._write_tile,
            Opcode.VEC_REDUCE: self._write_tile,
        }
        pending: dict[int, np.ndarray] = {}
        reads, idx = is_read[order].tolist(), index[order].tolist()
        for r, i in zip(reads, idx, strict=True):
            inst.i = i
            if r:
                pending[i] = read[op[i]](inst)
            else:
                write[op[i]](inst, pending.pop(i))

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


# ----------------------------------------------------------------------------- statistics


def _result(prog: _Program, start: np.ndarray, end: np.ndarray, hbm_busy: float) -> SimResult:
    s = prog.col
    itemsize = _lut({d: ITEMSIZE[d] for d in DType})
    isz_a, isz_b, isz_o = (itemsize[s[f]] for f in ("a_dtype", "b_dtype", "o_dtype"))
    rows, cols, k = prog.rows, prog.cols, prog.k
    cycles = float(end.max()) if prog.n else 0.0
    n_eng = prog.queues + 2
    work = prog.eng >= 0
    busy_by_engine = np.bincount(prog.eng[work], weights=(end - start)[work], minlength=n_eng)
    busy = {name: float(b) for name, b in zip(prog.engine_names, busy_by_engine, strict=True)}
    busy["dma"] = float(busy_by_engine[: prog.queues].sum() / prog.queues)
    busy["hbm"] = hbm_busy
    utilization = {name: (b / cycles if cycles else 0.0) for name, b in busy.items()}

    load, store, mm = prog.op == Opcode.DMA_LOAD, prog.op == Opcode.DMA_STORE, prog.is_mm
    tile = rows * cols
    hbm_read = int((tile * isz_a)[load].sum())
    hbm_written = int((tile * isz_a)[store].sum())
    acc_words = np.where((prog.flags & Flag.ACCUMULATE) != 0, 2, 1) * tile * 4
    mm_bytes = k * rows * isz_a + k * cols * isz_b + acc_words
    b_elems = np.where(prog.b_tile, tile, np.where(prog.b_column, rows, 0))
    o_elems = np.where(prog.op == Opcode.VEC_REDUCE, rows, tile)
    vec_bytes = tile * isz_a + b_elems * isz_b + o_elems * isz_o
    on_chip = (
        hbm_read + hbm_written + int(mm_bytes[mm].sum()) + int(vec_bytes[prog.is_vec].sum())
    )
    macs = tile * k
    fp32 = (s["a_dtype"] == DType.F32) | (s["b_dtype"] == DType.F32)
    return SimResult(
        cycles=cycles,
        engine_busy=busy,
        utilization=utilization,
        instructions=prog.n,
        instructions_by_engine={
            "dma": int(prog.is_dma.sum()),
            "matrix": int(mm.sum()),
            "vector": int(prog.is_vec.sum()),
            "barrier": int(prog.is_barrier.sum()),
        },
        hbm_bytes_read=hbm_read,
        hbm_bytes_written=hbm_written,
        sram_bytes=on_chip,
        macs=int(macs[mm].sum()),
        macs_fp32=int(macs[mm & fp32].sum()),
        vector_elements=int(tile[prog.is_vec].sum()),
        kernels=_count_kernels(prog.is_barrier),
        start=start,
        end=end,
    )


def _count_kernels(is_barrier: np.ndarray) -> int:
    """Barrier-separated segments that hold at least one instruction."""
    kernel_of = np.cumsum(is_barrier)[~is_barrier]
    return int(np.unique(kernel_of).size)
