"""The public API: `tilecc.compile(model_or_exported_program, example_inputs, target=...)`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import torch
from torch.export import ExportedProgram

from tilecc.errors import TileccError, TimingOnlyError
from tilecc.frontend.torch_export import decompose, export_model, import_exported_program
from tilecc.ir.graph import GraphProgram
from tilecc.passes.schedule.autotune import Autotuner
from tilecc.runtime import specialize
from tilecc.runtime.cache import CompileCache, compile_cached
from tilecc.runtime.compiler import CompileStats, compile_graph  # noqa: F401 (re-exported)
from tilecc.runtime.executor import run_program, time_program
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report
from tilecc.runtime.state import ModelState
from tilecc.simulator.config import HardwareConfig, load_config

if TYPE_CHECKING:
    from tilecc.system_api import SystemModel


class CompiledModel:
    """A model compiled for one target; calling it runs the program on the simulator.

    A model exported with dynamic sizes compiles once per concrete input shape, at call
    time, into a cache (`programs`), so one `tilecc.compile` serves every shape in the
    declared ranges.

    Buffers that forward() updates in place (a static KV cache) live in `state`
    (`state.buffers[name]`): each call reads them and stores their new values, so a
    second call sees what the first wrote, as with the eager module.
    """

    def __init__(
        self,
        program: Program | None,
        stats: CompileStats | None = None,
        *,
        dynamic: tuple[ExportedProgram, HardwareConfig] | None = None,
        opt_level: int = 2,
        autotune: bool | Autotuner = False,
        cache: Any = None,
    ):
        self.cache = cache
        self.opt_level = opt_level
        self.autotune = autotune
        self.program = program
        self.compile_stats = stats
        self.report: Report | None = None
        # check races, uninitialised reads and deadlocks on every run (default: off, or
        # TILECC_SANITIZE=1 in the environment: the test suite turns it on, tests/conftest.py)
        self.sanitize = os.environ.get("TILECC_SANITIZE", "0") == "1"
        self._dynamic = dynamic
        self.programs: dict[tuple, Program] = {}
        # dynamic shapes: the graph IR imported at the example shapes, with the symbolic
        # sizes (sympy) and their ranges as attributes
        self.graph: GraphProgram | None = None
        self.state = ModelState()

    def program_for(self, inputs: tuple) -> Program:
        if self._dynamic is None:
            assert self.program is not None
            return self.program
        core, cfg = self._dynamic
        key = tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t) for t in inputs)
        if key not in self.programs:
            bindings = specialize.bind(core, inputs)
            gp = import_exported_program(core, bindings, decomposed=True, borrow_weights=True)  # compiled, dropped
            self.compile_stats = CompileStats()
            self.programs[key] = compile_cached(gp, cfg, self.cache, stats=self.compile_stats,
                                                opt_level=self.opt_level, autotune=self.autotune)
        self.program = self.programs[key]
        return self.program

    @property
    def timing_only(self) -> bool:
        """Compiled from a model on the meta device (weights without values): it can be
        timed with `simulate`, not called."""
        return self.program is not None and self.program.timing_only

    def simulate(self, *inputs: torch.Tensor, critical_path: bool = False) -> Report:
        """The timing report of one call on inputs of these shapes and dtypes (CPU or
        meta-device tensors; no values are computed: the simulator runs timing-only). Also
        sets `report`. `critical_path` adds the chain of instructions that set the cycles
        (`Report.critical_path`)."""
        program = self.program_for(inputs)
        self.report = time_program(program, self.state.program_inputs(program, inputs), critical_path=critical_path)
        return self.report

    def __call__(self, *inputs: torch.Tensor) -> Any:
        program = self.program_for(inputs)
        if program.timing_only:
            raise TimingOnlyError(
                "this model was compiled on the meta device (its weights have no values), so calling it "
                "cannot compute outputs; use CompiledModel.simulate(*inputs) for its timing report, or "
                "compile the model with its weights")
        args = self.state.program_inputs(program, inputs)
        outputs, self.report = run_program(program, args, sanitize=self.sanitize)
        outputs = self.state.absorb(program, outputs, inputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def share_state(self, other: CompiledModel) -> None:
        """Hold `other`'s state (the same `ModelState`): a buffer either program updates
        is the one the other reads next, as with two methods of one eager module (the
        prefill and decode programs of one KV cache, `tilecc/llm/programs.py`)."""
        self.state = other.state

    def save(self, path: str | Path) -> None:
        if self.program is None:
            raise TileccError("this dynamic-shape model has not been compiled for any shape yet")
        self.program.save(path)

    @staticmethod
    def load(path: str | Path) -> CompiledModel:
        return CompiledModel(Program.load(path))


@overload
def compile(model: torch.nn.Module | torch.export.ExportedProgram, example_inputs: tuple | None = None, *,
            target: str | Path | HardwareConfig = "tiny", dynamic_shapes: Any = None, opt_level: int = 2,
            autotune: bool | Autotuner = False, cache: bool | str | Path | CompileCache | None = None,
            system: None = None, parallel: None = None, tp_plan: None = None) -> CompiledModel: ...


@overload
def compile(model: torch.nn.Module | torch.export.ExportedProgram, example_inputs: tuple | None = None, *,
            target: str | Path | HardwareConfig = "tiny", dynamic_shapes: Any = None, opt_level: int = 2,
            autotune: bool | Autotuner = False, cache: bool | str | Path | CompileCache | None = None,
            system: Any = None, parallel: dict[str, Any] | None = None,
            tp_plan: dict[str, Any] | None = None) -> SystemModel: ...


def compile(
    model: torch.nn.Module | torch.export.ExportedProgram,
    example_inputs: tuple | None = None,
    *,
    target: str | Path | HardwareConfig = "tiny",
    dynamic_shapes: Any = None,
    opt_level: int = 2,
    autotune: bool | Autotuner = False,
    cache: bool | str | Path | CompileCache | None = None,
    system: Any = None,
    parallel: dict[str, Any] | None = None,
    tp_plan: dict[str, Any] | None = None,
) -> CompiledModel | SystemModel:
    """Export (if needed), import, lower and encode `model` for `target`.

    `dynamic_shapes` (torch.export's argument, with `Dim` ranges) or an ExportedProgram
    with symbolic sizes gives a model that compiles per concrete shape at call time.
    `autotune` (True, or an `Autotuner` with its own cache directory) picks each -O2
    matmul kernel's schedule by simulating candidates instead of by the cost model;
    winners are cached on disk (`passes/schedule/autotune.py`), so recompiling skips the search.
    `cache`: the compile cache of whole programs (`runtime/cache.py`): None (default) is
    on unless ``TILECC_COMPILE_CACHE=0``; False off; a directory or a `CompileCache`.
    `system` (``"ring:4"``, a TOML file) with `parallel` ({"tp": 4, "sp": True} or {"pp": 2,
    "micro_batches": 4}) and optionally `tp_plan` compiles for many chips and returns a
    `SystemModel` (tilecc/system_api.py).
    """
    if system is not None or parallel is not None:
        from tilecc.system_api import compile_for_system

        if system is None:
            raise TileccError("tilecc.compile: parallel= needs system= (e.g. system=\"ring:4\")")
        return compile_for_system(model, example_inputs, target=target, system=system, parallel=parallel,
                                  tp_plan=tp_plan, opt_level=opt_level, cache=cache)
    cfg = load_config(target)
    if opt_level not in (0, 2):
        raise TileccError(f"opt_level {opt_level!r}: tilecc has -O0 (baseline) and -O2 (default)")
    if isinstance(model, torch.export.ExportedProgram):
        ep = model
    else:
        if example_inputs is None:
            raise TileccError("tilecc.compile: example_inputs are required to export an nn.Module")
        ep = export_model(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    if specialize.is_dynamic(ep):
        core = decompose(ep)
        cm = CompiledModel(None, dynamic=(core, cfg), opt_level=opt_level, autotune=autotune, cache=cache)
        examples = example_inputs if example_inputs is not None else _example_args(ep)
        if examples is not None:
            # the graph IR at the example shapes, with every symbolic size kept as a sympy
            # expression (`tilecc.symbols`, `tilecc.shape`): unsupported ops and bad
            # shapes are reported now, not at the first call
            cm.graph = import_exported_program(core, specialize.bind(core, tuple(examples)), decomposed=True)
        cm.state = ModelState(source=ep)
        return cm
    stats = CompileStats()
    program = compile_cached(ep, cfg, cache, stats=stats, opt_level=opt_level, autotune=autotune)
    cm = CompiledModel(program, stats, opt_level=opt_level, autotune=autotune, cache=cache)
    cm.state = ModelState(source=ep)
    return cm


def _example_args(ep: torch.export.ExportedProgram) -> tuple | None:
    ex = getattr(ep, "example_inputs", None)
    if not ex:
        return None
    args, kwargs = ex
    return None if kwargs else tuple(args)


def load(path: str | Path) -> CompiledModel:
    return CompiledModel.load(path)
