"""Run a Program on the simulator: lay out HBM, simulate, read the outputs back."""

from __future__ import annotations

import time

import numpy as np
import torch

from tilecc.errors import InputMismatchError
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report, make_report
from tilecc.simulator import numerics
from tilecc.simulator.isa import STORAGE
from tilecc.simulator.machine import simulate


def check_inputs(program: Program, inputs: tuple) -> None:
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
        want = numerics.DTYPE_TO_TORCH[spec.dtype]
        if t.dtype != want:
            raise InputMismatchError(f"input '{spec.name}' has dtype {t.dtype}, the program expects {want}")
        if t.device.type != "cpu":
            raise InputMismatchError(
                f"input '{spec.name}' is on device {t.device}; the simulator takes CPU tensors"
            )


def run_program(program: Program, inputs: tuple, *, functional: bool = True) -> tuple[list[torch.Tensor], Report]:
    check_inputs(program, inputs)
    hbm = program.hbm_image()
    for spec, t in zip(program.inputs, inputs):
        data, _ = numerics.torch_to_storage(t)
        raw = data.reshape(-1).view(np.uint8)
        hbm[spec.offset : spec.offset + raw.size] = raw
    t0 = time.perf_counter()
    sim = simulate(program.stream, program.config, hbm, functional=functional)
    seconds = time.perf_counter() - t0
    outputs = []
    for spec in program.outputs:
        raw = hbm[spec.offset : spec.offset + spec.nbytes].view(STORAGE[spec.dtype]).reshape(spec.shape)
        outputs.append(numerics.storage_to_torch(raw, spec.dtype))
    return outputs, make_report(sim, program.work, program.config, seconds)
