"""The public API: `tilecc.compile(model_or_exported_program, example_inputs, target=...)`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tilecc.errors import TileccError
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.runtime.compiler import CompileStats, compile_graph
from tilecc.runtime.executor import run_program
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report
from tilecc.simulator.config import HardwareConfig, load_config


class CompiledModel:
    """A model compiled for one target; calling it runs the program on the simulator."""

    def __init__(self, program: Program, stats: CompileStats | None = None):
        self.program = program
        self.compile_stats = stats
        self.report: Report | None = None

    def __call__(self, *inputs: torch.Tensor) -> Any:
        outputs, self.report = run_program(self.program, inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def save(self, path: str | Path) -> None:
        self.program.save(path)

    @staticmethod
    def load(path: str | Path) -> CompiledModel:
        return CompiledModel(Program.load(path))


def compile(
    model: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: tuple | None = None,
    *,
    target: str | Path | HardwareConfig = "tiny",
) -> CompiledModel:
    """Export (if needed), import, lower and encode `model` for `target`."""
    cfg = load_config(target)
    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    else:
        if example_inputs is None:
            raise TileccError("tilecc.compile: example_inputs are required to export an nn.Module")
        ep = export_model(model, tuple(example_inputs))
    gp = import_exported_program(ep)
    stats = CompileStats()
    program = compile_graph(gp, cfg, stats=stats)
    return CompiledModel(program, stats)


def load(path: str | Path) -> CompiledModel:
    return CompiledModel.load(path)
