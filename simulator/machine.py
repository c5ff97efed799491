"""The NPU simulator: timing, then functional execution in simulated time order.

`simulate(stream, config, hbm)` runs an instruction stream (`isa.RECORD`) in three steps.

1. **Check** (vectorised over the whole stream): opcodes, engines, DMA queues, element
   types, memories, flags, tile sizes, matmul limits and semaphore ids are valid, and
   every operand lies inside its memory (the sanitiser). Errors name the instruction
   index, its engine and opcode, the memory and the offending range.

2. **Timing**: a discrete-event simulation. Engines are one in-order queue per DMA
   queue (``dma0``, ``dma1``, ...), ``matrix`` and ``vector``; all run in parallel. An
   instruction starts when its engine is free and each of its waits is met (semaphore
   ``wait_sem[i]`` has value ``>= wait_val[i]``); on completion (its result is ready)
   it adds 1 to ``signal_sem``. Events are processed in time order, so every start
   time is exact. Every constant below is a config key. Durations, in cycles:

   - DMA: ``dma.latency_cycles + hbm.latency_cycles + descriptors *
     dma.per_descriptor_cycles`` (fixed part), then the transfer of ``bytes`` at the
     effective bandwidth ``hbm.bytes_per_cycle * min(1, chunk /
     dma.efficient_chunk_bytes)``. A contiguous chunk is a row (``cols * itemsize``
     bytes, one descriptor per row) when ``hbm_cs == 1``, else one element (``itemsize``
     bytes, ``rows * cols`` descriptors: strided and transposed accesses are slow).
     Transfers in flight share HBM by processor sharing: each of ``n`` concurrent
     transfers progresses at ``1/n`` of its alone rate, every finish time recomputed
     whenever a transfer starts or ends, so HBM throughput never exceeds its peak.
     (A short-chunk transfer occupies HBM for the bandwidth it wastes.)
   - MATMUL ``[M x K] @ [K x N]``: the dataflow (``matrix.dataflow``) lays (Sr, Sc) on
     the R x C array and streams T: WS (K, N, M), OS (M, N, K), IS (K, M, N); one
     instruction is one fold (Sr <= R, Sc <= C, checked). With ``p =
     matrix.fp32_slowdown`` when an operand is fp32 (else 1): preload ``L = R`` (WS,
     IS: the stationary operand shifts in; OS: ``L = 0``), streaming ``S = T * p``,
     fill/drain ``D = R + C - 2``.
     ``matrix.mode = "compatible"`` (SCALE-Sim): the instruction occupies the engine
     ``L + S + D`` cycles (``2R + C + T - 2`` for WS/IS, ``R + C + T - 2`` for OS);
     folds do not overlap. ``"pipelined"``: the stationary operand is double-buffered
     and the array streams one matmul while the next preloads. A matmul that starts
     (its waits met, the engine free) at ``t`` preloads until ``t + L``, streams over
     ``[s, s + S')`` with ``s = max(t + L, end of the previous matmul's streaming)`` and
     ``S' = max(S, matrix.min_interval_cycles)``, frees the engine for the next matmul
     at ``s`` (its preload may start) and has its result ready at ``s + S + D``, when it
     signals (alone: ``L + S + D``, the compatible figure). Back-to-back matmuls thus
     issue every ``max(S'_i, L)`` cycles and pay ``L`` and ``D`` once per chain; the
     streaming intervals never overlap, so the engine never exceeds R*C MACs per cycle
     (R*C/p with fp32 operands), and results come in order.
   - VECTOR: ``vector.latency_cycles + vector.access_cycles + ceil(rows * cols /
     lanes) * cost * n_in``, ``cost`` from ``[vector.op_cost.<unary|binary|reduce>]``
     by function name; ``n_in`` is 2 for a binary op with a tile second operand, else 1.

   ``BARRIER`` splits the stream into kernels: it starts and ends when every earlier
   instruction has ended, nothing after it starts earlier, and semaphores reset to 0.
   When no engine can progress, `DeadlockError` lists each blocked engine, its head
   instruction and the semaphores it waits on (awaited and current values). The
   schedule also measures each engine's busy cycles and its stalls (cycles its next
   instruction waited on semaphores; for DMA queues, transfer cycles lost to sharing
   HBM). With ``record=False`` start/end times are not kept and a timing-only run
   proceeds a chunk of whole kernels at a time.

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
   i32 operands are read as fp32 (exact below 2**24) and i32 outputs truncate toward
   zero, saturating. DMA_GATHER reads its index column at its start; an index outside
   ``[0, k)`` raises `MemoryAccessError` naming the instruction, the index and its row.

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
from dataclasses import dataclass, field
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
    """What one simulation measured. Times are in cycles, traffic in bytes.

    `engine_busy[e]` is the number of cycles with at least one of engine e's instructions
    in flight (a pipelined matrix engine overlaps several); `stalls[e]` splits the cycles
    an engine lost into ``semaphore`` (its next instruction could have started but waited
    on a semaphore) and, for DMA queues, ``hbm_bandwidth`` (transfer cycles beyond the
    transfer's own time at its effective bandwidth, lost to sharing HBM with concurrent
    transfers). ``start``/``end`` are None when the run was made with ``record=False``.
    """

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
    start: np.ndarray | None  # float64 [n]: start cycle of each instruction
    end: np.ndarray | None  # float64 [n]: end cycle of each instruction (result ready)
    acc_bytes: int = 0  # the accumulator's part of `sram_bytes`
    stalls: dict[str, dict[str, float]] = field(default_factory=dict)

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
            "acc_bytes": int(self.acc_bytes),
            "macs": int(self.macs),
            "macs_fp32": int(self.macs_fp32),
            "vector_elements": int(self.vector_elements),
            "kernels": int(self.kernels),
            "stalls": {e: {k: float(v) for k, v in d.items()} for e, d in self.stalls.items()},
        }


# record=False schedules the stream in chunks of whole kernels of about this many
# instructions, so the per-instruction working set does not grow with the stream
_CHUNK = 1 << 14


def simulate(
    stream: np.ndarray,
    config: HardwareConfig,
    hbm: np.ndarray | None,
    *,
    functional: bool = True,
    record: bool = True,
    sanitize: bool = False,
) -> SimResult:
    """Run `stream` on `config`; with `functional`, execute it on `hbm` (changed in place).

    `hbm` is the whole HBM image, a flat writable uint8 array (ignored in timing-only
    mode, where it may be None and bounds are checked against the configured capacity).
    With ``record=False`` the per-instruction start/end times are not kept (the result's
    `start`/`end` are None) and a timing-only run checks and schedules the stream a
    chunk of whole kernels at a time, so its memory does not grow with the stream.
    With ``sanitize`` the sanitisers (`simulator.sanitizers`: races, reads of
    never-written memory, deadlocks) check the scheduled program before it executes.
    """
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD or stream.ndim != 1:
        raise SimulatorError("the instruction stream must be a 1-D numpy array of isa.RECORD")
    if functional:
        _check_hbm_image(hbm)
    hbm_size = len(hbm) if hbm is not None else config.hbm.capacity_bytes
    if functional or record or sanitize:
        prog = _Program(stream, config)
        prog.check(hbm_size)
        with _gc_paused():  # the scheduler allocates millions of short-lived tuples
            sched = _schedule(prog, record=True)
        if sanitize:
            from tilecc.simulator.sanitizers import sanitize as run_sanitizers

            run_sanitizers(stream, config, sched.start, sched.end, hbm_size=hbm_size)
        if functional:
            assert hbm is not None and sched.start is not None and sched.end is not None
            with _single_threaded_torch():
                _Machine(config, hbm).run(prog, sched.start, sched.end)
        counts = _counts(prog)
        if not record:
            sched.start = sched.end = None
        return _result(config, prog.engine_names, sched, counts)
    totals: _Schedule | None = None
    counts = {}
    names: list[str] = []
    t, kernel = 0.0, 0
    for lo, hi in _chunks(stream):
        prog = _Program(stream[lo:hi], config, offset=lo)
        prog.check(hbm_size)
        with _gc_paused():
            sched = _schedule(prog, t, kernel, record=False)
        # a chunk ends with a barrier (except the last): the next kernel numbers on
        kernel += sched.kernels - 1
        t = sched.finish
        part = _counts(prog)
        counts = {k: counts.get(k, 0) + v for k, v in part.items()}
        names = prog.engine_names
        totals = sched if totals is None else _add_schedules(totals, sched)
        del prog
    assert totals is not None
    return _result(config, names, totals, counts)


def _chunks(stream: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) slices of about `_CHUNK` instructions that end just after a barrier."""
    n = len(stream)
    if n <= _CHUNK:
        return [(0, n)]
    cuts = np.flatnonzero(stream["opcode"] == Opcode.BARRIER) + 1
    spans, lo = [], 0
    while lo < n:
        k = np.searchsorted(cuts, lo + _CHUNK, side="right")  # cuts <= lo + _CHUNK
        hi = int(cuts[k - 1]) if k > 0 and cuts[k - 1] > lo else None
        if hi is None:  # one kernel longer than a chunk: up to its barrier, or the end
            later = cuts[cuts > lo]
            hi = int(later[0]) if later.size else n
        spans.append((lo, hi))
        lo = hi
    return spans


def _add_schedules(a: _Schedule, b: _Schedule) -> _Schedule:
    return _Schedule(
        start=None,
        end=None,
        finish=b.finish,
        kernels=a.kernels + b.kernels - 1,
        busy=[x + y for x, y in zip(a.busy, b.busy, strict=True)],
        semaphore_stall=[x + y for x, y in zip(a.semaphore_stall, b.semaphore_stall, strict=True)],
        hbm_stall=[x + y for x, y in zip(a.hbm_stall, b.hbm_stall, strict=True)],
        hbm_busy=a.hbm_busy + b.hbm_busy,
    )


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
# operand roles by (opcode, slot) for error messages
_ROLE = MappingProxyType(
    {
        (Opcode.DMA_LOAD, "a"): "source",
        (Opcode.DMA_LOAD, "o"): "destination",
        (Opcode.DMA_STORE, "a"): "source",
        (Opcode.DMA_STORE, "o"): "destination",
        (Opcode.DMA_GATHER, "a"): "table",
        (Opcode.DMA_GATHER, "b"): "index column",
        (Opcode.DMA_GATHER, "o"): "destination",
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

    def __init__(self, stream: np.ndarray, config: HardwareConfig, *, offset: int = 0):
        self.offset = offset  # index of stream[0] in the whole stream (for messages)
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
        self.is_gather = self.op == Opcode.DMA_GATHER
        is_dma = (self.op == Opcode.DMA_LOAD) | (self.op == Opcode.DMA_STORE) | self.is_gather
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
        self.uses_b = self.is_mm | self.b_tile | self.b_column | self.is_gather

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
        return f"instruction {i + self.offset} ({engine} {name})"

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
        self._check_gather_tables(problems, hbm_size)
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
        # one matmul is one fold of the array: the dimensions the dataflow lays on the
        # array's rows and columns must fit (WS: K x N, OS: M x N, IS: K x M)
        names = {"ws": ("contraction K", "N"), "os": ("M", "N"), "is": ("contraction K", "M")}
        on_rows, on_cols = names[cfg.matrix.dataflow]
        sr, sc, _ = matmul_mapping(cfg, self.rows, self.k, self.cols)
        flow = "" if cfg.matrix.dataflow == "ws" else f" ({cfg.matrix.dataflow} dataflow)"
        fail(
            problems,
            mm & (sr > cfg.matrix.rows),
            lambda i: f"{on_rows}={sr[i]} exceeds the array's {cfg.matrix.rows} rows{flow}",
        )
        fail(
            problems,
            mm & (sc > cfg.matrix.cols),
            lambda i: f"{on_cols}={sc[i]} exceeds the array's {cfg.matrix.cols} columns{flow}",
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
        fail(
            problems,
            self.is_gather & (self.k == 0),
            lambda i: "empty gather table (k=0: the table has no rows to index)",
        )

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
            self.is_gather & (s["b_dtype"] != DType.I32),
            lambda i: f"gather indices are i32 (b_dtype must be {int(DType.I32)})",
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
            (self.is_gather & (s["a_mem"] != Mem.HBM), "a DMA_GATHER reads an HBM table (a_mem)"),
            (self.is_gather & ~b_on, "a DMA_GATHER's indices are in SRAM or ACC (b_mem)"),
            (self.is_gather & ~o_on, "a DMA_GATHER writes SRAM or ACC (o_mem)"),
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
        b_mask = mm | self.b_tile | self.b_column | self.is_gather  # gather: index column
        b_rows = np.where(mm, k, rows)
        b_cols = np.where(self.b_column | self.is_gather, 1, cols)
        o_mask = (op == Opcode.DMA_LOAD) | mm | vec | self.is_gather
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
        """(slot, mask) of the HBM operand: the source of loads, the destination of stores.
        (A DMA_GATHER's HBM rows depend on its indices: `_check_gather_tables` checks its
        whole table statically, the functional run each index.)"""
        return [("a", self.op == Opcode.DMA_LOAD), ("o", self.op == Opcode.DMA_STORE)]

    def _check_gather_tables(self, problems: _Problems, hbm_size: int) -> None:
        """A gather's table (k rows of `cols` contiguous elements) lies inside HBM, aligned."""
        idx = np.flatnonzero(self.is_gather & self.checked & (self.k > 0))
        if not idx.size:
            return
        s = self.col
        isz = _lut({d: ITEMSIZE[d] for d in DType})[s["a_dtype"][idx]]
        addr = s["a_addr"][idx]
        misaligned = addr % np.maximum(isz, 1).astype(np.uint64) != 0
        ok = _hbm_in_bounds(
            addr, s["hbm_rs"][idx], np.ones(idx.size, np.int64), self.k[idx], self.cols[idx],
            isz, hbm_size,
        )
        for bad, message in (
            (misaligned, lambda i: f"table HBM address {int(s['a_addr'][i]):#x} is not aligned "
             f"to its {ITEMSIZE[DType(int(s['a_dtype'][i]))]}-byte elements"),
            (~ok, lambda i: self._gather_table_message(i, hbm_size)),
        ):
            mask = np.zeros(self.n, dtype=bool)
            mask[idx[bad]] = True
            self._fail(problems, mask, message, MemoryAccessError)

    def _gather_table_message(self, i: int, hbm_size: int) -> str:
        s = self.col
        lo, hi = _hbm_extent(
            int(s["a_addr"][i]), int(s["hbm_rs"][i]), 1, int(self.k[i]), int(self.cols[i]),
            ITEMSIZE[DType(int(s["a_dtype"][i]))],
        )
        return (
            f"table HBM bytes [{lo:#x}, {hi:#x}) out of bounds (HBM has {hbm_size:#x} bytes; "
            f"{self.k[i]} rows x {self.cols[i]} elements, row stride {s['hbm_rs'][i]})"
        )

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


def matmul_mapping(config: HardwareConfig, m: Any, k: Any, n: Any) -> tuple[Any, Any, Any]:
    """(Sr, Sc, T) of a matmul ``[M x K] @ [K x N]`` under the configured dataflow: the
    operand dimensions laid on the array's rows and columns, and the one streamed in time
    (SCALE-Sim's mapping: WS (K, N, M), OS (M, N, K), IS (K, M, N))."""
    flow = config.matrix.dataflow
    if flow == "ws":
        return k, n, m
    if flow == "os":
        return m, n, k
    return k, m, n


def vector_cost_factors(
    config: HardwareConfig, opcode: np.ndarray, func: np.ndarray, flags: np.ndarray
) -> np.ndarray:
    """``cost * n_inputs`` of each instruction (0 for non-vector ones): cycles per group of
    `lanes` elements, from ``[vector.op_cost]``; a binary op with a tile second operand
    reads two inputs, one with a column or immediate operand reads one."""
    table = config.vector.op_cost
    factor = np.zeros(len(opcode), dtype=np.float64)
    for op, enum, costs in (
        (Opcode.VEC_UNARY, UnaryFn, table.unary),
        (Opcode.VEC_BINARY, BinaryFn, table.binary),
        (Opcode.VEC_REDUCE, ReduceFn, table.reduce),
    ):
        lut = np.zeros(256, dtype=np.float64)
        for f in enum:
            lut[int(f)] = costs[f.name.lower()]
        sel = opcode == op
        factor[sel] = lut[func[sel]]
    two = (opcode == Opcode.VEC_BINARY) & ((flags & (Flag.B_IMM | Flag.B_COLUMN)) == 0)
    factor[two] *= 2
    return factor


_DMA_GATHER = int(getattr(Opcode, "DMA_GATHER", -1))


@dataclass
class _Durations:
    """Per-instruction timing parameters, in cycles (see `_durations`)."""

    first: np.ndarray  # DMA: fixed part; pipelined matmul: preload; other: whole duration
    second: np.ndarray  # DMA: transfer time alone at its effective bandwidth; pipelined
    #                     matmul: streaming occupancy S' = max(S, min interval); other: 0
    third: np.ndarray  # pipelined matmul: streaming start to result ready (S + D); else 0


def _durations(prog: _Program) -> _Durations:
    """The closed forms of the timing model (module docstring), vectorised."""
    cfg, s, op = prog.config, prog.col, prog.op
    itemsize = _lut({d: ITEMSIZE[d] for d in DType})
    rows, cols = prog.rows.astype(np.float64), prog.cols.astype(np.float64)
    first = np.zeros(prog.n, dtype=np.float64)
    second = np.zeros(prog.n, dtype=np.float64)
    third = np.zeros(prog.n, dtype=np.float64)

    dma = prog.is_dma
    if dma.any():
        isz = itemsize[s["a_dtype"][dma]].astype(np.float64)
        r, c = rows[dma], cols[dma]
        # a gather copies `cols` contiguous elements per indexed row
        contiguous = (s["hbm_cs"][dma] == 1) | (op[dma] == _DMA_GATHER)
        chunk = np.where(contiguous, c * isz, isz)
        descriptors = np.where(contiguous, r, r * c)
        efficiency = np.minimum(1.0, chunk / cfg.dma.efficient_chunk_bytes)
        first[dma] = (
            cfg.dma.latency_cycles + cfg.hbm.latency_cycles
            + descriptors * cfg.dma.per_descriptor_cycles
        )
        second[dma] = r * c * isz / (cfg.hbm.bytes_per_cycle * efficiency)

    mm = prog.is_mm
    mx = cfg.matrix
    R, C = mx.rows, mx.cols
    drain = float(R + C - 2)
    if mm.any():
        fp32 = (s["a_dtype"][mm] == DType.F32) | (s["b_dtype"][mm] == DType.F32)
        passes = np.where(fp32, mx.fp32_slowdown, 1)
        _, _, t = matmul_mapping(cfg, prog.rows[mm], prog.k[mm], prog.cols[mm])
        stream = (t * passes).astype(np.float64)
        preload = float(R) if mx.dataflow in ("ws", "is") else 0.0
        if mx.mode == "compatible":
            first[mm] = preload + stream + drain
        else:
            first[mm] = preload
            second[mm] = np.maximum(stream, mx.min_interval_cycles)
            third[mm] = stream + drain

    vec = prog.is_vec
    if vec.any():
        factor = vector_cost_factors(cfg, op[vec], s["func"][vec], prog.flags[vec])
        groups = np.ceil(rows[vec] * cols[vec] / cfg.vector.lanes)
        first[vec] = cfg.vector.latency_cycles + cfg.vector.access_cycles + groups * factor
    return _Durations(first, second, third)


@dataclass
class _Schedule:
    """What `_schedule` measured on one stream (or chunk of kernels)."""

    start: np.ndarray | None  # float64 [n], or None when not recorded
    end: np.ndarray | None
    finish: float  # end of the last kernel
    kernels: int  # kernels scheduled (barrier-separated segments, empty ones included)
    busy: list[float]  # per engine: cycles with at least one of its instructions in flight
    semaphore_stall: list[float]  # per engine: cycles its head instruction waited on semaphores
    hbm_stall: list[float]  # per DMA queue: transfer cycles lost to sharing HBM bandwidth
    hbm_busy: float  # cycles with at least one transfer on HBM


# event kinds of the general scheduler, in the low two bits of an event code
# (code = 4 * index + kind)
_DONE, _JOIN, _FREE = 0, 1, 2


def _schedule(
    prog: _Program, t0: float = 0.0, kernel0: int = 0, *, record: bool = True,
    general: bool = False,
) -> _Schedule:
    """Start and end cycle of every instruction, exactly, kernel after kernel from `t0`.

    Two algorithms give the same times (bit for bit; `general=True` forces the second):

    - **dataflow** (a kernel where every awaited semaphore is signalled from one engine
      queue, as compiled code always is): engines complete in order, so a wait
      ``sem >= v`` is met exactly when the v-th signaller in program order completes;
      `_producers` finds that instruction for every wait, vectorised. The matrix and
      vector engines then run ahead without an event queue (start = max(engine free,
      ends of the producers)); only DMA transfers, which share HBM, go through time
      order: the earliest of the pending joins and the next finish is processed, after
      every engine has advanced as far as known ends allow (whatever is still unknown
      starts no earlier than that event).
    - **general**: a discrete-event simulation. Events are (time, code) in a heap:
      `_DONE` (an instruction completes: its signal counts, its engine takes the next
      instruction unless it is a pipelined matrix engine), `_JOIN` (a DMA's fixed part
      is over: its transfer joins HBM), `_FREE` (a pipelined matmul starts streaming:
      the engine may preload the next one). An engine blocked on a semaphore waits in
      `waiters[sem]` until the value it needs is reached.

    HBM processor sharing runs in virtual time: with `n` transfers in flight each
    progresses at 1/n of its alone rate, so a transfer that joins at virtual time V
    finishes when virtual time reaches ``V + alone time``; the next finish is at real
    time ``t + (tag - V) * n``, recomputed whenever a transfer joins or leaves.
    """
    sch = _Scheduler(prog, t0, kernel0)
    if general:
        for kernel in range(len(sch.bounds)):
            sch.run_general(kernel)
    else:
        sch.run_dataflow()
    return sch.result(record)


def _producers(
    prog: _Program, wait_sem: np.ndarray, wait_val: np.ndarray, kernel_of: np.ndarray,
    n_kernels: int,
) -> tuple[np.ndarray, np.ndarray]:
    """[n x width] int64: each instruction's producers from column 0 on, then -1s (at
    least one, a sentinel). The producer of a wait ``sem >= v`` (v > 0) is the
    instruction whose completion meets it if its engine completes in order: the v-th
    signaller of ``sem`` in program order within the kernel. And per kernel whether that
    rule is exact: every awaited semaphore signalled from one engine queue, every wait
    reachable, no wait on a later instruction of its own queue."""
    n = len(wait_sem)
    n_sem = prog.config.semaphores
    sig = prog.col["signal_sem"]
    signallers = np.flatnonzero((sig >= 0) & ~prog.is_barrier)
    keys = kernel_of[signallers] * n_sem + sig[signallers]
    order = np.argsort(keys, kind="stable")  # by (kernel, sem), then program order
    keys, signallers = keys[order], signallers[order]
    # groups of signallers of one semaphore in one kernel: key, first position, size
    first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else keys
    group_key = keys[first]
    size = np.diff(np.r_[first, len(keys)])
    used = wait_sem >= 0
    who = np.nonzero(used)[0]
    wkey = kernel_of[who] * n_sem + wait_sem[used]
    value = wait_val[used].astype(np.int64)
    g = np.minimum(np.searchsorted(group_key, wkey), max(len(group_key) - 1, 0))
    if len(group_key):
        hit = group_key[g] == wkey
        reachable = value <= np.where(hit, size[g], 0)
        pick = signallers[np.minimum(first[g] + value - 1, len(keys) - 1)]
    else:
        reachable = value <= 0
        pick = value
    found = np.where(reachable & (value > 0), pick, -1)
    exact = np.ones(n_kernels, dtype=bool)
    exact[kernel_of[who[~reachable]]] = False
    if len(keys):
        eng = prog.eng[signallers]
        mixed = np.minimum.reduceat(eng, first) != np.maximum.reduceat(eng, first)
        if mixed.any():
            exact[kernel_of[who[np.isin(wkey, group_key[mixed])]]] = False
    found_eng = np.where(found >= 0, prog.eng[np.maximum(found, 0)], -1)
    own_later = (found_eng == prog.eng[who]) & (found > who)
    exact[kernel_of[who[own_later]]] = False
    # each row's producers from column 0, then -1s (at least one: a sentinel)
    keep = found >= 0
    rows, found = who[keep], found[keep]
    run_start = np.r_[True, rows[1:] != rows[:-1]] if len(rows) else np.zeros(0, bool)
    column = np.arange(len(rows)) - np.maximum.accumulate(
        np.where(run_start, np.arange(len(rows)), 0)
    )
    width = int(column.max(initial=-1)) + 2
    prod = np.full((n, width), -1, dtype=np.int64)
    prod[rows, column] = found
    return prod, exact


class _Scheduler:
    """The per-chunk state of `_schedule`: instruction lists, then measured totals.

    The schedulers only compute each instruction's `start`, `end` and `join` (a DMA's
    HBM join time; a pipelined matmul's streaming start); `result` derives busy cycles
    and stalls from them with numpy, the same way for both algorithms."""

    def __init__(self, prog: _Program, t0: float, kernel0: int):
        self.prog = prog
        self.kernel0 = kernel0
        self.t0 = t0
        self.dur = dur = _durations(prog)
        n, n_queues = prog.n, prog.queues
        self.n_queues = n_queues
        self.n_eng = n_queues + 2
        self.pipelined = prog.config.matrix.mode == "pipelined"
        s = prog.col
        self.first, self.second, self.third = (
            dur.first.tolist(), dur.second.tolist(), dur.third.tolist()
        )
        self.eng = prog.eng.tolist()
        self._waits = s["wait_sem"], s["wait_val"]
        barriers_np = np.flatnonzero(prog.is_barrier)
        kernel_of = np.cumsum(prog.is_barrier) - prog.is_barrier
        n_kernels = len(barriers_np) + 1
        prod, self.simple = _producers(prog, *self._waits, kernel_of, n_kernels)
        self.prod_stride = prod.shape[1]
        self.prod = prod.ravel().tolist()
        del prod, kernel_of
        self._general_ready = False
        self.start, self.end = [0.0] * n, [-1.0] * n
        self.join = [0.0] * n
        self.queues_np = [np.flatnonzero(prog.eng == e) for e in range(self.n_eng)]
        self.queues = [q.tolist() for q in self.queues_np]
        self.barriers = barriers_np.tolist()
        self.bounds = [0] + [b + 1 for b in self.barriers]
        self.limits = self.barriers + [n]
        self.heads = [np.searchsorted(q, self.bounds).tolist() for q in self.queues_np]
        self.tails = [np.searchsorted(q, self.limits).tolist() for q in self.queues_np]
        self.now = t0

    def result(self, record: bool) -> _Schedule:
        """Busy cycles, stalls and HBM busy time from the start/end/join lists."""
        prog, n_queues = self.prog, self.n_queues
        start = np.array(self.start, dtype=np.float64)
        end = np.array(self.end, dtype=np.float64)
        join = np.array(self.join, dtype=np.float64)
        # when each kernel started: t0, then each barrier's time
        kernel_start = np.r_[self.t0, end[prog.is_barrier]]
        kernel_of = np.cumsum(prog.is_barrier) - prog.is_barrier
        busy, sem_stall, hbm_stall = [], [], []
        for e, q in enumerate(self.queues_np):
            if not len(q):
                busy.append(0.0)
                sem_stall.append(0.0)
                hbm_stall.append(0.0)
                continue
            s, t = start[q], end[q]
            # the engine could start an instruction once the previous one on it (same
            # kernel) freed it: at its end, or a pipelined matmul's streaming start
            freed = join[q] if (e == n_queues and self.pipelined) else t
            same_kernel = np.r_[False, kernel_of[q][1:] == kernel_of[q][:-1]]
            ready = np.where(same_kernel, np.r_[0.0, freed[:-1]], kernel_start[kernel_of[q]])
            sem_stall.append(float((s - ready).sum()))
            # cycles with at least one of its instructions in flight (union of intervals)
            before = np.maximum.accumulate(np.r_[-np.inf, t[:-1]])
            busy.append(float(np.maximum(t - np.maximum(s, before), 0.0).sum()))
            # DMA: transfer time beyond its time alone at its effective bandwidth
            lost = (t - join[q] - self.dur.second[q]).sum() if e < n_queues else 0.0
            hbm_stall.append(float(lost))
        # HBM busy: union of the transfer intervals [join, end) of all DMAs
        dma = np.flatnonzero(prog.is_dma)
        order = np.argsort(join[dma], kind="stable")
        j, t = join[dma][order], end[dma][order]
        before = np.maximum.accumulate(np.r_[-np.inf, t[:-1]]) if len(t) else t
        hbm_busy = float(np.maximum(t - np.maximum(j, before), 0.0).sum()) if len(t) else 0.0
        return _Schedule(
            start=start if record else None,
            end=end if record else None,
            finish=self.now,
            kernels=len(self.bounds),
            busy=busy,
            semaphore_stall=sem_stall,
            hbm_stall=hbm_stall[:n_queues],
            hbm_busy=hbm_busy,
        )

    def _close_kernel(self, kernel: int, now: float) -> None:
        self.now = now
        if kernel < len(self.barriers):
            b = self.barriers[kernel]
            self.start[b] = self.end[b] = now

    # -- dataflow ---------------------------------------------------------------------

    def run_dataflow(self) -> None:
        """Schedule every kernel, by dataflow where `_producers` found every wait's
        producer, else (or when the kernel deadlocks) by `run_general`."""
        start, end, join, first, second = self.start, self.end, self.join, self.first, self.second
        prod, stride, queues, eng = self.prod, self.prod_stride, self.queues, self.eng
        n_queues, third, n_eng = self.n_queues, self.third, self.n_eng
        matrix, vector = n_queues, n_queues + 1
        pipelined = self.pipelined
        heappush, heappop = heapq.heappush, heapq.heappop
        heads_np = np.array(self.heads, dtype=np.int64).T  # [kernel, engine]
        tails_np = np.array(self.tails, dtype=np.int64).T
        heads, tails = heads_np.tolist(), tails_np.tolist()
        # per kernel: the matrix/vector engines with work, the DMA queues with work
        has_work = (heads_np < tails_np).tolist()
        del heads_np, tails_np
        compute_engines = (vector, matrix)
        dma_engines = range(n_queues)
        barriers, n_barriers = self.barriers, len(self.barriers)
        simple = self.simple.tolist()
        blocked_on = [-1] * n_eng  # the producer an engine's head waits for
        now = self.now
        for kernel in range(len(tails)):
            if not simple[kernel]:
                self.now = now
                self.run_general(kernel)
                now = self.now
                continue
            head, tail = heads[kernel], tails[kernel]
            free = [now] * n_eng  # when each engine can start its next instruction
            kernel_end = now
            stream_free = now  # pipelined matrix: when the array stops streaming
            work = has_work[kernel]
            active = [e for e in compute_engines if work[e]]
            dma_idle = [e for e in dma_engines if work[e]]  # queues to start
            pending: list[tuple[float, int]] = []  # heap of transfers to join: (time, index)
            flying: list[tuple[float, int]] = []  # heap of transfers on HBM: (virtual tag, index)
            v_now = t_ps = 0.0  # HBM virtual time, and the real time it was last brought to
            resolved = True  # an end became known: engines may advance
            while True:
                progress = resolved
                while progress:
                    progress = False
                    for e in active:
                        h, tl = head[e], tail[e]
                        if h == tl:
                            continue
                        b = blocked_on[e]
                        if b >= 0 and end[b] < 0.0:
                            continue
                        q, f = queues[e], free[e]
                        streams = e == matrix and pipelined
                        while h < tl:
                            i = q[h]
                            t = f
                            j = i * stride
                            p = prod[j]
                            while p >= 0:
                                x = end[p]
                                if x < 0.0:
                                    break
                                if x > t:
                                    t = x
                                j += 1
                                p = prod[j]
                            if p >= 0:
                                blocked_on[e] = p
                                break
                            start[i] = t
                            if streams:
                                f = t + first[i]  # preload done
                                if f < stream_free:
                                    f = stream_free
                                stream_free = f + second[i]
                                join[i] = f
                                end[i] = f + third[i]
                            else:
                                end[i] = f = t + first[i]
                            h += 1
                        if h != head[e]:
                            progress = True
                            head[e], free[e] = h, f
                            x = end[q[h - 1]]  # ends come in order
                            if x > kernel_end:
                                kernel_end = x
                    if dma_idle:
                        still = []
                        for e in dma_idle:
                            i = queues[e][head[e]]
                            t = free[e]
                            j = i * stride
                            p = prod[j]
                            while p >= 0:
                                x = end[p]
                                if x < 0.0:
                                    break
                                if x > t:
                                    t = x
                                j += 1
                                p = prod[j]
                            if p >= 0:
                                still.append(e)
                                continue
                            start[i] = t
                            heappush(pending, (t + first[i], i))
                        dma_idle = still
                resolved = False
                # the next HBM event: a transfer joins, or one finishes
                if flying:
                    tag, i = flying[0]
                    t = t_ps + (tag - v_now) * len(flying)
                    if pending and pending[0][0] < t:
                        t, i = heappop(pending)
                        v_now += (t - t_ps) / len(flying)
                        t_ps = join[i] = t
                        heappush(flying, (v_now + second[i], i))
                        continue
                    heappop(flying)
                    v_now, t_ps = (tag, t) if flying else (0.0, t)
                elif pending:
                    jt, i = heappop(pending)
                    t = jt + second[i]
                    join[i] = jt
                    if pending and pending[0][0] < t:  # another joins before it ends
                        t_ps = jt
                        flying.append((second[i], i))
                        continue
                    # alone on HBM from join to end (the arithmetic of the general case)
                else:
                    break
                # DMA i completes at t
                e = eng[i]
                end[i] = free[e] = t
                if t > kernel_end:
                    kernel_end = t
                h = head[e] = head[e] + 1
                if h < tail[e]:
                    dma_idle.append(e)
                resolved = True
            if head != tail:  # a deadlock: undo, and let the general scheduler report it
                for i in range(self.bounds[kernel], self.limits[kernel]):
                    end[i] = -1.0
                self.now = now
                self.run_general(kernel)
                continue
            now = kernel_end
            if kernel < n_barriers:
                b = barriers[kernel]
                start[b] = end[b] = now
        self.now = now

    # -- general ----------------------------------------------------------------------

    def _prepare_general(self) -> None:
        """The lists only the general scheduler reads, made on first use."""
        # waits compacted to the front of each row, so the first -1 ends them
        wait_sem, wait_val = self._waits
        order = np.argsort(wait_sem < 0, axis=1, kind="stable")
        wait_sem = np.take_along_axis(wait_sem, order, axis=1)
        wait_val = np.take_along_axis(wait_val, order, axis=1)
        self.n_waits = wait_sem.shape[1]
        self.wait_sem = wait_sem.ravel().tolist()
        self.wait_val = wait_val.ravel().tolist()
        self.sig = self.prog.col["signal_sem"].tolist()
        self.sem = [0] * self.prog.config.semaphores
        self.waiters: list[list[int] | None] = [None] * self.prog.config.semaphores
        self._general_ready = True

    def run_general(self, kernel: int) -> None:
        """Schedule one kernel by discrete-event simulation (any semaphore pattern)."""
        if not self._general_ready:
            self._prepare_general()
        start, end, join, first, second = self.start, self.end, self.join, self.first, self.second
        eng, sig, queues = self.eng, self.sig, self.queues
        wait_sem, wait_val, n_waits = self.wait_sem, self.wait_val, self.n_waits
        sem, waiters = self.sem, self.waiters
        n_queues, n_eng, third = self.n_queues, self.n_eng, self.third
        matrix = n_queues
        pipelined = self.pipelined
        heappush, heappop = heapq.heappush, heapq.heappop
        now = self.now
        head = [h[kernel] for h in self.heads]
        tail = [t[kernel] for t in self.tails]
        heap: list[tuple[float, int]] = []
        need = [0] * n_eng
        stream_free = now  # pipelined matrix engine: when the array stops streaming
        ps: list[tuple[float, int]] = []  # transfers in flight: (virtual finish tag, index)
        v_now = 0.0  # HBM virtual time
        t_ps = now  # real time at which v_now was last brought up to date

        def try_start(e: int, t: float) -> None:
            """Start engine e's head instruction at time t, or park e on a semaphore."""
            nonlocal stream_free
            i = queues[e][head[e]]
            j = i * n_waits
            if wait_sem[j] >= 0:
                for j in range(j, j + n_waits):
                    w = wait_sem[j]
                    if w < 0:
                        break
                    if sem[w] < wait_val[j]:
                        need[e] = wait_val[j]
                        parked = waiters[w]
                        if parked is None:
                            waiters[w] = [e]
                        else:
                            parked.append(e)
                        return
            start[i] = t
            if e < n_queues:
                heappush(heap, (t + first[i], 4 * i + _JOIN))
            elif e == matrix and pipelined:
                streaming = t + first[i]  # preload done
                if streaming < stream_free:
                    streaming = stream_free
                stream_free = streaming + second[i]
                join[i] = streaming
                heappush(heap, (streaming, 4 * i + _FREE))
                heappush(heap, (streaming + third[i], 4 * i + _DONE))
            else:
                heappush(heap, (t + first[i], 4 * i + _DONE))

        for e in range(n_eng):
            if head[e] < tail[e]:
                try_start(e, now)
        while True:
            if ps:
                t = t_ps + (ps[0][0] - v_now) * len(ps)
                if heap and heap[0][0] < t:
                    t, code = heappop(heap)
                else:  # a transfer finishes: the others speed up
                    v_now, i = heappop(ps)
                    t_ps = t
                    code = 4 * i + _DONE
                    if not ps:
                        v_now = 0.0
            elif heap:
                t, code = heappop(heap)
            else:
                break
            i = code >> 2
            kind = code & 3
            e = eng[i]
            if kind == _JOIN:
                if ps:
                    v_now += (t - t_ps) / len(ps)
                t_ps = join[i] = t
                heappush(ps, (v_now + second[i], i))
                continue
            if kind == _DONE:
                end[i] = t
                now = t
                w = sig[i]
                if w >= 0:
                    value = sem[w] + 1
                    sem[w] = value
                    parked = waiters[w]
                    if parked:
                        released = [x for x in parked if need[x] <= value]
                        if released:
                            waiters[w] = [x for x in parked if need[x] > value]
                            for x in released:
                                try_start(x, t)
                if e == matrix and pipelined:
                    continue
            # the engine takes its next instruction
            head[e] += 1
            if head[e] < tail[e]:
                try_start(e, t)
        blocked = [e for e in range(n_eng) if head[e] < tail[e]]
        if blocked:
            raise DeadlockError(
                _deadlock_message(
                    self.prog, self.kernel0 + kernel, now, blocked, head, queues, sem
                )
            )
        for w in set(sig[self.bounds[kernel] : self.limits[kernel]]):
            if w >= 0:
                sem[w] = 0
                waiters[w] = None
        self._close_kernel(kernel, now)


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
            f"{prog.engine_names[e]} blocked at instruction {i + prog.offset} ({opcode}) "
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
        self.prog = prog  # names instructions in run-time errors (gather indices)
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
            Opcode.DMA_GATHER: self._read_gather,
        }
        write = {
            Opcode.DMA_LOAD: self._write_tile,
            Opcode.DMA_STORE: self._write_store,
            Opcode.MATMUL: self._write_matmul,
            Opcode.VEC_UNARY: self._write_tile,
            Opcode.VEC_BINARY: self._write_tile,
            Opcode.VEC_REDUCE: self._write_tile,
            Opcode.DMA_GATHER: self._write_tile,
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

    def _read_gather(self, f: _Fields) -> np.ndarray:
        """Rows index[r] of the table; an index outside [0, k) is a MemoryAccessError."""
        index = self.tile(f.b_mem, f.b_part, f.b_addr, f.rows, 1, DType.I32)[:, 0].astype(np.int64)
        bad = np.flatnonzero((index < 0) | (index >= f.k))
        if bad.size:
            r = int(bad[0])
            raise MemoryAccessError(
                f"{self.prog.where(f.i)}: gather index {int(index[r])} (row {r} of the index "
                f"column) out of range for a table of {f.k} rows"
            )
        table = self.hbm_view(f.a_addr, f.k, f.cols, f.hbm_rs, 1, f.a_dtype)
        return table[index]

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


def _counts(prog: _Program) -> dict[str, int]:
    """Additive per-stream counts: instructions, traffic per memory level, MACs."""
    s = prog.col
    itemsize = _lut({d: ITEMSIZE[d] for d in DType})
    isz_a, isz_b, isz_o = (itemsize[s[f]] for f in ("a_dtype", "b_dtype", "o_dtype"))
    rows, cols, k = prog.rows, prog.cols, prog.k
    load = (prog.op == Opcode.DMA_LOAD) | (prog.op == _DMA_GATHER)  # HBM -> on chip
    store, mm, vec = prog.op == Opcode.DMA_STORE, prog.is_mm, prog.is_vec
    tile = rows * cols
    # bytes each operand slot moves, and the memory it is in (HBM, SRAM, ACC)
    a_bytes = np.where(mm, k * rows * isz_a, tile * isz_a)
    b_bytes = np.where(mm, k * cols * isz_b, np.where(prog.b_tile, tile, rows) * isz_b)
    acc_words = np.where((prog.flags & Flag.ACCUMULATE) != 0, 2, 1) * tile * 4
    o_elems = np.where(prog.op == Opcode.VEC_REDUCE, rows, tile)
    o_bytes = np.where(mm, acc_words, np.where(load, tile * isz_a, o_elems * isz_o))
    work = ~prog.is_barrier
    traffic = {Mem.HBM: 0, Mem.SRAM: 0, Mem.ACC: 0}
    for used, mem, nbytes in (
        (work, s["a_mem"], a_bytes),
        (prog.uses_b & work, s["b_mem"], b_bytes),
        (work, s["o_mem"], o_bytes),
    ):
        for m in traffic:
            traffic[m] += int(nbytes[used & (mem == m)].sum())
    macs = tile * k
    fp32 = (s["a_dtype"] == DType.F32) | (s["b_dtype"] == DType.F32)
    kernel_of = np.cumsum(prog.is_barrier)[work]
    return {
        "instructions": prog.n,
        "dma": int(prog.is_dma.sum()),
        "matrix": int(mm.sum()),
        "vector": int(vec.sum()),
        "barrier": int(prog.is_barrier.sum()),
        "hbm_bytes_read": int((tile * isz_a)[load].sum()),
        "hbm_bytes_written": int((tile * isz_a)[store].sum()),
        "sram_bytes": traffic[Mem.SRAM] + traffic[Mem.ACC],
        "acc_bytes": traffic[Mem.ACC],
        "macs": int(macs[mm].sum()),
        "macs_fp32": int(macs[mm & fp32].sum()),
        "vector_elements": int(tile[vec].sum()),
        "kernels": int(np.unique(kernel_of).size),  # each chunk ends at a barrier
    }


def _result(
    config: HardwareConfig, names: list[str], sched: _Schedule, counts: dict[str, int]
) -> SimResult:
    queues = config.dma.queues
    cycles = float(sched.finish) if counts.get("instructions", 0) else 0.0
    busy = {name: float(b) for name, b in zip(names, sched.busy, strict=True)}
    busy["dma"] = float(sum(sched.busy[:queues]) / queues)
    busy["hbm"] = float(sched.hbm_busy)
    utilization = {name: (b / cycles if cycles else 0.0) for name, b in busy.items()}
    stalls: dict[str, dict[str, float]] = {}
    for e, name in enumerate(names):
        stalls[name] = {"semaphore": float(sched.semaphore_stall[e])}
        if e < queues:
            stalls[name]["hbm_bandwidth"] = max(0.0, float(sched.hbm_stall[e]))
    return SimResult(
        cycles=cycles,
        engine_busy=busy,
        utilization=utilization,
        instructions=counts.get("instructions", 0),
        instructions_by_engine={
            k: counts.get(k, 0) for k in ("dma", "matrix", "vector", "barrier")
        },
        hbm_bytes_read=counts.get("hbm_bytes_read", 0),
        hbm_bytes_written=counts.get("hbm_bytes_written", 0),
        sram_bytes=counts.get("sram_bytes", 0),
        macs=counts.get("macs", 0),
        macs_fp32=counts.get("macs_fp32", 0),
        vector_elements=counts.get("vector_elements", 0),
        kernels=counts.get("kernels", 0),
        start=sched.start,
        end=sched.end,
        acc_bytes=counts.get("acc_bytes", 0),
        stalls=stalls,
    )
