"""What a simulation measured: `SimResult`, and the counts and totals it is built from.

`counts(prog)` adds up a stream's additive figures (instructions per engine, bytes per
memory level, MACs, vector elements, kernels); `sim_result` joins them with a
`scheduler.Schedule`'s cycles, busy times and stalls into the `SimResult` callers read
(utilisation is busy time over total cycles; the energy model reads the byte and MAC
counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.decode import DecodedProgram, itemsize_lut
from tilecc.simulator.isa import DType, Flag, Mem, Opcode
from tilecc.simulator.scheduler import Schedule

__all__ = ["SimResult", "counts", "sim_result"]


@dataclass
class SimResult:
    """What one simulation measured. Times are in cycles, traffic in bytes.

    `engine_busy[e]` is the number of cycles with at least one of engine e's instructions
    in flight (a pipelined matrix engine overlaps several); `stalls[e]` splits the cycles
    an engine lost into ``semaphore`` (its next instruction could have started but waited
    on a semaphore) and, for DMA queues, ``hbm_bandwidth`` (transfer cycles beyond the
    transfer's own time alone, lost to sharing the DMA engines and HBM with concurrent
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
    macs_int8: int = 0  # the part of `macs` with both operands int8 (the 8-bit rate and energy)
    macs_fp8: int = 0  # ... both operands fp8 e4m3
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
            "macs_int8": int(self.macs_int8),
            "macs_fp8": int(self.macs_fp8),
            "vector_elements": int(self.vector_elements),
            "kernels": int(self.kernels),
            "stalls": {e: {k: float(v) for k, v in d.items()} for e, d in self.stalls.items()},
        }


def counts(prog: DecodedProgram) -> dict[str, int]:
    """Additive per-stream counts: instructions, traffic per memory level, MACs."""
    s = prog.col
    itemsize = itemsize_lut()
    isz_a, isz_b, isz_o = (itemsize[s[f]] for f in ("a_dtype", "b_dtype", "o_dtype"))
    rows, cols, k = prog.rows, prog.cols, prog.k
    load = (prog.op == Opcode.DMA_LOAD) | (prog.op == Opcode.DMA_GATHER)  # HBM -> on chip
    store = (prog.op == Opcode.DMA_STORE) | prog.is_scatter  # on chip -> HBM
    mm, vec = prog.is_mm, prog.is_vec
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
        "macs_int8": int(macs[mm & (s["a_dtype"] == DType.I8) & (s["b_dtype"] == DType.I8)].sum()),
        "macs_fp8": int(macs[mm & (s["a_dtype"] == DType.F8E4M3) & (s["b_dtype"] == DType.F8E4M3)].sum()),
        "vector_elements": int(tile[vec].sum()),
        "kernels": int(np.unique(kernel_of).size),  # each chunk ends at a barrier
    }


def sim_result(
    config: HardwareConfig, names: list[str], sched: Schedule, figures: dict[str, int]
) -> SimResult:
    """The `SimResult` of a schedule (engines `names`) and its stream's `counts`."""
    queues = config.dma.queues
    cycles = float(sched.finish) if figures.get("instructions", 0) else 0.0
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
        instructions=figures.get("instructions", 0),
        instructions_by_engine={
            k: figures.get(k, 0) for k in ("dma", "matrix", "vector", "barrier")
        },
        hbm_bytes_read=figures.get("hbm_bytes_read", 0),
        hbm_bytes_written=figures.get("hbm_bytes_written", 0),
        sram_bytes=figures.get("sram_bytes", 0),
        macs=figures.get("macs", 0),
        macs_fp32=figures.get("macs_fp32", 0),
        macs_int8=figures.get("macs_int8", 0),
        macs_fp8=figures.get("macs_fp8", 0),
        vector_elements=figures.get("vector_elements", 0),
        kernels=figures.get("kernels", 0),
        start=sched.start,
        end=sched.end,
        acc_bytes=figures.get("acc_bytes", 0),
        stalls=stalls,
    )
