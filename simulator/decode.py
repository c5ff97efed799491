"""The decoded stream: an instruction stream's fields as numpy columns, and its checks.

`DecodedProgram(stream, config)` holds every record field as a contiguous numpy column
plus the derived per-instruction quantities the other parts of the simulator read
(engine index, instruction kinds, which operands are used). `check(hbm_size)` validates
the whole stream at once (the static sanitiser): opcodes, engines, DMA queues, element
types, memories, flags, tile sizes, matmul limits and semaphore ids are valid, and
every operand lies inside its memory. Errors name the instruction index, its engine
and opcode, the memory and the offending range, and the lowest-indexed invalid
instruction is reported.

The checks are strict about the ISA contract: a DMA_LOAD reads HBM (``a_mem``) into
SRAM/ACC (``o_mem``), a DMA_STORE the reverse; MATMUL takes both operands from SRAM
(``a_mem``, ``b_mem``) and writes ACC with ``o_dtype`` f32; tiles are never empty; a
BARRIER neither waits nor signals. On-chip addresses need no alignment, HBM addresses
must be aligned to the element size. `DecodedProgram.on_chip_operands` and
`hbm_operands` describe every access an instruction makes, for the sanitisers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from tilecc.errors import MemoryAccessError, SimulatorError
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import (
    ITEMSIZE,
    MAX_LINK_QUEUES,
    OPCODE_ENGINE,
    RECORD,
    RECORD_NAMES,
    BinaryFn,
    DType,
    Flag,
    Mem,
    Opcode,
    ReduceFn,
    UnaryFn,
)
from tilecc.simulator.timing import matmul_mapping

__all__ = ["DecodedProgram", "itemsize_lut", "lut"]

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
        Opcode.LINK_RECV: int(Flag.REDUCE),
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
        (Opcode.DMA_SCATTER, "a"): "source",
        (Opcode.DMA_SCATTER, "b"): "index column",
        (Opcode.DMA_SCATTER, "o"): "table",
        (Opcode.MATMUL, "a"): "lhsT",
        (Opcode.MATMUL, "b"): "rhs",
        (Opcode.MATMUL, "o"): "output",
        (Opcode.LINK_SEND, "a"): "source",
        (Opcode.LINK_RECV, "a"): "addend",
        (Opcode.LINK_RECV, "o"): "destination",
    }
)


def lut(mapping: Mapping[int, Any] | Mapping[Opcode, Any], dtype: Any = np.int64, default: Any = 0) -> np.ndarray:
    """A 256-entry lookup table indexed by a u1 field."""
    table = np.full(256, default, dtype=dtype)
    for k, v in mapping.items():
        table[int(k)] = v
    return table


def itemsize_lut() -> np.ndarray:
    """Bytes per element, indexed by a dtype field."""
    return lut({d: ITEMSIZE[d] for d in DType})


# (instruction index, exception class, message) of each failed check
_Problems = list[tuple[int, type[SimulatorError], str]]


class DecodedProgram:
    """The stream's fields as numpy columns, plus derived per-instruction quantities."""

    def __init__(self, stream: np.ndarray, config: HardwareConfig, *, offset: int = 0):
        self.offset = offset  # index of stream[0] in the whole stream (for messages)
        # contiguous copies: whole-stream passes over a strided record field are slow
        col = self.col = {name: np.ascontiguousarray(stream[name]) for name in RECORD_NAMES}
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
        self.is_scatter = self.op == Opcode.DMA_SCATTER
        # indirect DMAs: an HBM table of k rows and an on-chip i32 index column (b)
        self.is_indirect = self.is_gather | self.is_scatter
        is_dma = (self.op == Opcode.DMA_LOAD) | (self.op == Opcode.DMA_STORE) | self.is_indirect
        self.is_dma = is_dma
        self.is_vec = np.isin(self.op, _VECTOR_OPS)
        self.is_mm = self.op == Opcode.MATMUL
        self.is_barrier = self.op == Opcode.BARRIER
        self.is_send = self.op == Opcode.LINK_SEND
        self.is_recv = self.op == Opcode.LINK_RECV
        self.is_link = self.is_send | self.is_recv
        self.is_reduce_recv = self.is_recv & ((self.flags & Flag.REDUCE) != 0)
        # link queues: as many as the stream uses (none in a single-chip program)
        link_q = np.minimum(col["queue"][self.is_link].astype(np.int64), MAX_LINK_QUEUES - 1)
        self.links = int(link_q.max()) + 1 if link_q.size else 0
        # engine index: DMA queue q -> q, matrix -> Q, vector -> Q + 1, link queue l ->
        # Q + 2 + l, barrier -> -1
        eng = np.full(self.n, -1, dtype=np.int64)
        eng[is_dma] = col["queue"][is_dma]
        eng[self.is_mm] = self.queues
        eng[self.is_vec] = self.queues + 1
        eng[self.is_link] = self.queues + 2 + link_q
        self.eng = eng
        self.engine_names = ([f"dma{q}" for q in range(self.queues)] + ["matrix", "vector"]
                             + [f"link{q}" for q in range(self.links)])
        b_imm = (self.flags & Flag.B_IMM) != 0
        b_col = (self.flags & Flag.B_COLUMN) != 0
        self.b_tile = (self.op == Opcode.VEC_BINARY) & ~b_imm & ~b_col
        self.b_column = (self.op == Opcode.VEC_BINARY) & b_col & ~b_imm
        self.uses_b = self.is_mm | self.b_tile | self.b_column | self.is_indirect
        self.stream_records: np.ndarray | None = None  # the records, for messages

    def records(self) -> np.ndarray:
        """The stream as records (for messages): the one given, else rebuilt from the
        columns once."""
        if self.stream_records is None:
            rec = np.empty(self.n, dtype=RECORD)
            for name in RECORD_NAMES:
                rec[name] = self.col[name]
            self.stream_records = rec
        return self.stream_records

    # -- messages ---------------------------------------------------------------------

    def where(self, i: int) -> str:
        """'instruction 7 (dma1 DMA_LOAD)'."""
        op = int(self.op[i])
        name = Opcode(op).name if op <= max(Opcode) else f"opcode {op}"
        if self.is_barrier[i]:
            engine = "all"
        elif self.is_dma[i]:
            engine = f"dma{int(self.col['queue'][i])}"
        elif self.is_link[i]:
            engine = f"link{int(self.col['queue'][i])}"
        elif self.is_mm[i]:
            engine = "matrix"
        elif self.is_vec[i]:
            engine = "vector"
        else:
            engine = f"engine {int(self.col['engine'][i])}"
        return f"instruction {i + self.offset} ({engine} {name})"

    def _indirect_name(self, i: int) -> str:
        return "scatter" if self.is_scatter[i] else "gather"

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
        expected = lut({o: int(e) for o, e in OPCODE_ENGINE.items()}, default=-1)[op]
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
        fail(
            problems,
            self.is_link & (s["queue"] >= MAX_LINK_QUEUES),
            lambda i: f"link queue {s['queue'][i]} out of range (0..{MAX_LINK_QUEUES - 1})",
        )
        self._check_sync(problems)
        self._check_sizes(problems)
        self._check_dtypes(problems)
        self._check_mems(problems)
        func_count = lut({o: c for o, c in _FUNC_COUNT.items()})[op]
        fail(
            problems,
            self.is_vec & (s["func"] >= func_count),
            lambda i: f"unknown function {s['func'][i]} for {Opcode(op[i]).name}",
        )
        allowed = lut(dict(_ALLOWED_FLAGS))[op]
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
            np.asarray(bad_wait.any(axis=1)),
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
            self.is_indirect & (self.k == 0),
            lambda i: f"empty {self._indirect_name(i)} table (k=0: the table has no rows to index)",
        )

    def _check_dtypes(self, problems: _Problems) -> None:
        s, op, fail = self.col, self.op, self._fail
        work = ~self.is_barrier & (op <= max(Opcode))
        valid = lut({d: 1 for d in DType}, dtype=bool, default=False)
        mm_inputs = (DType.F32, DType.BF16, DType.F16, DType.I8, DType.F8E4M3)  # mixed allowed
        float_ = lut(dict.fromkeys(mm_inputs, 1), dtype=bool, default=False)
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
            self.is_indirect & (s["b_dtype"] != DType.I32),
            lambda i: f"{self._indirect_name(i)} indices are i32 (b_dtype must be {int(DType.I32)})",
        )
        fail(
            problems,
            self.is_mm & ~(float_[s["a_dtype"]] & float_[s["b_dtype"]]),
            lambda i: "matmul operands must be f32, bf16, f16, i8 or f8e4m3",
        )
        fail(
            problems,
            self.is_mm & (s["o_dtype"] != DType.F32),
            lambda i: f"matmul output is fp32 (o_dtype must be {int(DType.F32)})",
        )

    def _check_mems(self, problems: _Problems) -> None:
        s, op, fail = self.col, self.op, self._fail
        on_chip = lut({Mem.SRAM: 1, Mem.ACC: 1}, dtype=bool, default=False)
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
            (self.is_scatter & ~a_on, "a DMA_SCATTER reads SRAM or ACC (a_mem)"),
            (self.is_scatter & ~b_on, "a DMA_SCATTER's indices are in SRAM or ACC (b_mem)"),
            (self.is_scatter & (s["o_mem"] != Mem.HBM), "a DMA_SCATTER writes an HBM table (o_mem)"),
            (self.is_mm & (s["a_mem"] != Mem.SRAM), "matmul lhsT must be in SRAM (a_mem)"),
            (self.is_mm & (s["b_mem"] != Mem.SRAM), "matmul rhs must be in SRAM (b_mem)"),
            (self.is_mm & (s["o_mem"] != Mem.ACC), "matmul output must be in ACC (o_mem)"),
            (self.is_vec & ~a_on, "vector operand a must be in SRAM or ACC (a_mem)"),
            ((self.b_tile | self.b_column) & ~b_on, "vector operand b must be in SRAM or ACC"),
            (self.is_vec & ~o_on, "vector output must be in SRAM or ACC (o_mem)"),
            ((self.is_send | self.is_reduce_recv) & (s["a_mem"] != Mem.HBM),
             "a link transfer reads HBM (a_mem must be HBM)"),
            (self.is_recv & (s["o_mem"] != Mem.HBM), "a LINK_RECV writes HBM (o_mem must be HBM)"),
            (self.is_link & (s["a_dtype"] != s["o_dtype"]), "a link transfer does not convert "
             "(a_dtype must equal o_dtype)"),
        )
        for mask, text in rules:
            fail(problems, mask, lambda i, t=text: t)

    # -- operand extents (the sanitiser) ------------------------------------------------

    def on_chip_operands(self) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
        """(slot, mask, tile rows, tile cols) of each on-chip operand slot."""
        op, rows, cols, k = self.op, self.rows, self.cols, self.k
        mm, vec = self.is_mm, self.is_vec
        a_mask = (op == Opcode.DMA_STORE) | mm | vec | self.is_scatter
        a_rows = np.where(mm, k, rows)
        a_cols = np.where(mm, rows, cols)
        b_mask = mm | self.b_tile | self.b_column | self.is_indirect  # indirect: index column
        b_rows = np.where(mm, k, rows)
        b_cols = np.where(self.b_column | self.is_indirect, 1, cols)
        o_mask = (op == Opcode.DMA_LOAD) | mm | vec | self.is_gather
        o_cols = np.where(op == Opcode.VEC_REDUCE, 1, cols)
        return [
            ("a", a_mask, a_rows, a_cols),
            ("b", b_mask, b_rows, b_cols),
            ("o", o_mask, rows, o_cols),
        ]

    def _check_on_chip(self, problems: _Problems) -> None:
        s, cfg = self.col, self.config
        itemsize = itemsize_lut()
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
        (An indirect DMA's HBM rows depend on its indices: `_check_gather_tables` checks its
        whole table statically, the functional run each index.)"""
        return [("a", (self.op == Opcode.DMA_LOAD) | self.is_send | self.is_reduce_recv),
                ("o", (self.op == Opcode.DMA_STORE) | self.is_recv)]

    @property
    def n_engines(self) -> int:
        """DMA queues, matrix, vector, then the link queues the stream uses."""
        return self.queues + 2 + self.links

    def table_addr(self) -> np.ndarray:
        """The HBM table address of each indirect DMA (a gather's a_addr, a scatter's o_addr)."""
        return np.where(self.is_scatter, self.col["o_addr"], self.col["a_addr"])

    def _check_gather_tables(self, problems: _Problems, hbm_size: int) -> None:
        """An indirect DMA's table (k rows of `cols` contiguous elements) lies inside HBM,
        aligned."""
        idx = np.flatnonzero(self.is_indirect & self.checked & (self.k > 0))
        if not idx.size:
            return
        s = self.col
        isz = itemsize_lut()[s["a_dtype"][idx]]
        addr = self.table_addr()[idx]
        misaligned = addr % np.maximum(isz, 1).astype(np.uint64) != 0
        ok = _hbm_in_bounds(
            addr, s["hbm_rs"][idx], np.ones(idx.size, np.int64), self.k[idx], self.cols[idx],
            isz, hbm_size,
        )
        for bad, message in (
            (misaligned, lambda i: f"table HBM address {int(self.table_addr()[i]):#x} is not aligned "
             f"to its {ITEMSIZE[DType(int(s['a_dtype'][i]))]}-byte elements"),
            (~ok, lambda i: self._gather_table_message(i, hbm_size)),
        ):
            mask = np.zeros(self.n, dtype=bool)
            mask[idx[bad]] = True
            self._fail(problems, mask, message, MemoryAccessError)

    def _gather_table_message(self, i: int, hbm_size: int) -> str:
        s = self.col
        lo, hi = _hbm_extent(
            int(self.table_addr()[i]), int(s["hbm_rs"][i]), 1, int(self.k[i]), int(self.cols[i]),
            ITEMSIZE[DType(int(s["a_dtype"][i]))],
        )
        return (
            f"table HBM bytes [{lo:#x}, {hi:#x}) out of bounds (HBM has {hbm_size:#x} bytes; "
            f"{self.k[i]} rows x {self.cols[i]} elements, row stride {s['hbm_rs'][i]})"
        )

    def _check_hbm(self, problems: _Problems, hbm_size: int) -> None:
        s = self.col
        itemsize = itemsize_lut()
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


