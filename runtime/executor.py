"""Run a Program on the simulator: lay out HBM, simulate, read the outputs back.

Integer and bool tensors live as int32 on the device: an input whose user-facing dtype
is int64 (token ids) or bool is converted at the boundary (its values must fit int32,
else `InputMismatchError` naming the input), and such outputs convert back.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from tilecc.errors import InputMismatchError, SimulatorError, TimingOnlyError
from tilecc.runtime.program import Program, TensorSpec
from tilecc.runtime.report import Report, make_report
from tilecc.simulator import numerics
from tilecc.simulator.critical_path import critical_path as find_path
from tilecc.simulator.isa import STORAGE, DType, Mem, Opcode
from tilecc.simulator.machine import simulate
from tilecc.simulator.stats import SimResult
from tilecc.simulator.trace import write_trace


def check_inputs(program: Program, inputs: tuple, *, meta_ok: bool = False) -> None:
    if len(inputs) != len(program.inputs):
        raise InputMismatchError(
            f"the program takes {len(program.inputs)} input(s) "
            f"({', '.join(s.name for s in program.inputs)}), got {len(inputs)}"
        )
    for spec, t in zip(program.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"input '{spec.name}' must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != spec.shape:
            raise InputMismatchError(
                f"input '{spec.name}' has shape {tuple(t.shape)}, the program was compiled for {spec.shape}"
            )
        want = user_dtype(spec)
        if t.dtype != want:
            raise InputMismatchError(f"input '{spec.name}' has dtype {t.dtype}, the program expects {want}")
        if t.device.type != "cpu" and not (meta_ok and t.device.type == "meta"):
            raise InputMismatchError(
                f"input '{spec.name}' is on device {t.device}; the simulator takes CPU tensors"
            )


def user_dtype(spec: TensorSpec) -> torch.dtype:
    """The torch dtype a caller passes (or gets back) for this input (output)."""
    if spec.torch_dtype:
        return getattr(torch, spec.torch_dtype)
    return numerics.DTYPE_TO_TORCH[spec.dtype]


def _to_device_dtype(spec: TensorSpec, t: torch.Tensor) -> torch.Tensor:
    """An input converted to its HBM element type (int64 / bool -> int32, range-checked;
    float64 -> fp32, the float64 policy)."""
    if t.dtype == torch.float64:
        return t.to(numerics.DTYPE_TO_TORCH[spec.dtype])
    if spec.dtype != DType.I32 or t.dtype == torch.int32:
        return t
    if t.dtype != torch.bool and t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < numerics.I32_MIN or hi > numerics.I32_MAX:
            bad = lo if lo < numerics.I32_MIN else hi
            raise InputMismatchError(
                f"input '{spec.name}' holds {bad}, outside the int32 range the device "
                f"stores {t.dtype} values in ([{numerics.I32_MIN}, {numerics.I32_MAX}])"
            )
    return t.to(torch.int32)


def _to_user_dtype(spec: TensorSpec, t: torch.Tensor) -> torch.Tensor:
    want = user_dtype(spec)
    if t.dtype == want:
        return t
    if want == torch.bool:
        return t != 0
    return t.to(want)


def time_program(program: Program, inputs: tuple, *, critical_path: bool = False) -> Report:
    """The timing of `program` on `inputs` (shapes and dtypes only: CPU or meta-device
    tensors), simulated with `functional=False`: no values are read or computed, so a
    timing-only program (weights without values, ir/meta_weights.py) runs too. The
    cycles equal a functional run's (timing never depends on values). `critical_path`
    adds the chain of instructions that set the cycles (as `run_program`'s)."""
    check_inputs(program, inputs, meta_ok=True)
    t0 = time.perf_counter()
    sim = simulate(program.stream, program.config, None, functional=False, record=critical_path)
    seconds = time.perf_counter() - t0
    report = make_report(sim, program.work, program.config, seconds, program.meta.get("hbm"),
                         program.meta.get("remarks"), launches=len(program.kernels))
    if critical_path:
        _add_critical_path(report, program, sim)
    return report


def _add_critical_path(report: Report, program: Program, sim: SimResult) -> None:
    if sim.start is None or sim.end is None:
        raise SimulatorError("the simulation kept no per-instruction times to find the critical path in")
    report.critical_path = find_path(program.stream, program.config, sim.start, sim.end, program.kernels).to_dict()


def run_program(
    program: Program,
    inputs: tuple,
    *,
    functional: bool = True,
    sanitize: bool = False,
    trace: str | Path | None = None,
    critical_path: bool = False,
) -> tuple[list[torch.Tensor], Report]:
    """Run `program` on the simulator; `sanitize` checks races, uninitialised reads and
    deadlocks first; `trace` writes a Perfetto timeline there; `critical_path` adds the
    chain of instructions that set the cycles to the report (simulator/critical_path.py)."""
    if program.timing_only and functional:
        raise TimingOnlyError(
            "this program was compiled from a model on the meta device: its weights have no values, so it "
            "computes no outputs; time it with CompiledModel.simulate(*inputs) (or compile the model with "
            "its weights to run it)")
    check_inputs(program, inputs)
    hbm = program.hbm_image()
    for spec, t in zip(program.inputs, inputs):
        data, _ = numerics.torch_to_storage(_to_device_dtype(spec, t))
        raw = data.reshape(-1).view(np.uint8)
        hbm[spec.offset : spec.offset + raw.size] = raw
    t0 = time.perf_counter()
    sim = simulate(program.stream, program.config, hbm, functional=functional, sanitize=sanitize)
    seconds = time.perf_counter() - t0
    outputs = []
    for spec in program.outputs:
        raw = hbm[spec.offset : spec.offset + spec.nbytes].view(STORAGE[spec.dtype]).reshape(spec.shape)
        outputs.append(_to_user_dtype(spec, numerics.storage_to_torch(raw, spec.dtype)))
    if trace is not None:
        if sim.start is None or sim.end is None:  # kept by simulate's default record=True
            raise SimulatorError("the simulation kept no per-instruction times to write the trace from")
        write_trace(trace, program.stream, program.config, sim.start, sim.end, program.kernels)
    report = make_report(sim, program.work, program.config, seconds, program.meta.get("hbm"),
                         program.meta.get("remarks"), launches=len(program.kernels))
    if sim.end is not None:
        report.extra["output_ready_cycles"] = output_ready_cycles(program, sim.end)
    if critical_path:
        _add_critical_path(report, program, sim)
    return outputs, report


def output_ready_cycles(program: Program, end: np.ndarray) -> list[float]:
    """When each output is complete: the end of the last DMA store (or scatter) writing into
    its HBM bytes (an output written by none, e.g. an input passed through: 0)."""
    st = program.stream
    store = ((st["opcode"] == Opcode.DMA_STORE) | (st["opcode"] == Opcode.DMA_SCATTER)) & (st["o_mem"] == Mem.HBM)
    idx = np.flatnonzero(store)
    addr, ends = st["o_addr"][idx].astype(np.int64), np.asarray(end)[idx]
    out = []
    for spec in program.outputs:
        hit = (addr >= spec.offset) & (addr < spec.offset + spec.nbytes)
        out.append(float(ends[hit].max()) if hit.any() else 0.0)
    return out
