"""Compile a model for a system of chips with tensor parallelism.

    sp = compile_system(model, (x,), load_system("ring:4"), tp=4, sp=False, plan=None, target="tiny")
    sp.graph.stages        # compute segments and the collectives between them
    sp.programs[i]         # segment i's Program: one for every chip (identical streams)
    sp.chip_values[r]      # chip r's weights by graph input name

The model is sharded for each chip (`frontend/tensor_parallel.py`), chip 0's copy is
exported, and its graph is cut at the collectives (`frontend/segments.py`). Each segment
is exported again with its weights as inputs, so the one Program of a segment serves every
chip: the chips differ only in the weights they are given. `export_shards` (sharding, the
export and its inputs sorted by kind) is shared with runtime/tp_pipeline_run.py and
runtime/tp_train.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export.graph_signature import InputKind

from tilecc.errors import TileccError
from tilecc.frontend.export import export_model
from tilecc.frontend.segments import SegmentedGraph, split_at_collectives
from tilecc.frontend.tensor_parallel import ShardingError, auto_plan, shard_module
from tilecc.runtime.cache import compile_cached
from tilecc.runtime.compiler import CompileStats
from tilecc.runtime.program import Program
from tilecc.simulator.interconnect.system import SystemConfig


@dataclass
class SystemProgram:
    system: SystemConfig
    tp: int
    sp: bool
    graph: SegmentedGraph
    programs: list[Program]  # one per segment, in graph.segments order
    chip_values: list[dict[str, torch.Tensor]]  # per chip: weights / buffers / constants by input name
    user_inputs: list[str]  # the graph's user-input names, in the argument order
    compile_seconds: float = 0.0
    plan: dict[str, Any] = field(default_factory=dict)
    model: Any = None  # the nn.Module (a training step shards it again: runtime/tp_train.py)


def compile_system(model: torch.nn.Module, inputs: tuple, system: SystemConfig, *, tp: int, sp: bool = False,
                   plan: dict[str, Any] | None = None, opt_level: int = 2, cache: Any = None) -> SystemProgram:
    import time

    if tp != system.chips:
        raise ShardingError(f"tensor parallelism over {tp} chips on a system of {system.chips} chips "
                            f"({system.topology.spec}): tp must equal the chip count")
    if len(set(system.chip_targets)) > 1:
        raise TileccError("tensor parallelism needs identical chips (system.chip lists different configs)")
    t0 = time.perf_counter()
    model = model.eval()
    plan = auto_plan(model, sp) if plan is None else plan
    sh = export_shards(model, tuple(inputs), plan, tp)
    ep, values, shared, user = sh.ep, sh.values, sh.shared, sh.user
    graph = split_at_collectives(ep, shared, set(values[0]))
    for r in range(tp):  # weights the segments take as W^T, laid out so when loaded
        values[r] = {k: v.mT.contiguous() if k in graph.transposed else v for k, v in values[r].items()}
    cfg = system.chip_config(0)
    programs = []
    for seg in graph.segments:
        seg_ep = export_model(seg.module, tuple(seg.examples))
        programs.append(compile_cached(seg_ep, cfg, cache, stats=CompileStats(), opt_level=opt_level))
    return SystemProgram(system, tp, sp, graph, programs, values, user, time.perf_counter() - t0, plan, model)


@dataclass
class ShardedExport:
    ep: Any  # torch.export of chip 0's copy
    chips: list[torch.nn.Module]  # every chip's copy (`tp_shards`: how its parameters come from the model's)
    values: list[dict[str, torch.Tensor]]  # per chip: its parameters by graph input name
    shared: dict[str, torch.Tensor]  # buffers and constants: alike on every chip
    user: list[str]  # the user inputs' names, in argument order
    fqn: dict[str, str]  # parameter input name -> the copy's parameter FQN


def export_shards(model: torch.nn.Module, inputs: tuple, plan: dict[str, Any], tp: int, *, training: bool = False,
                  mark: Callable[[torch.nn.Module], list[Any]] | None = None) -> ShardedExport:
    """Every chip's sharded copy of `model` (frontend/tensor_parallel.py; `training`: with the
    backward's markers) and the export of chip 0's, its inputs sorted by kind. `mark`: hooks
    placed on chip 0's copy for the export (a pipeline's cut), removed after it."""
    chips = [shard_module(model, plan, tp, r, training=training) for r in range(tp)]
    handles = mark(chips[0]) if mark is not None else []
    try:
        ep = export_model(chips[0], tuple(inputs))
    finally:
        for h in handles:
            h.remove()
    values: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    shared: dict[str, torch.Tensor] = {}
    user: list[str] = []
    fqn: dict[str, str] = {}
    names = [n.name for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    for spec, name in zip(ep.graph_signature.input_specs, names):
        if spec.kind == InputKind.USER_INPUT:
            user.append(name)
        elif spec.kind == InputKind.PARAMETER:
            fqn[name] = str(spec.target)
            for r, chip in enumerate(chips):
                values[r][name] = _state_value(chip, ep, spec.kind, spec.target)
        else:
            shared[name] = _state_value(chips[0], ep, spec.kind, spec.target)
    return ShardedExport(ep, chips, values, shared, user, fqn)


def _state_value(chip: torch.nn.Module, ep: Any, kind: InputKind, target: str | None) -> torch.Tensor:
    assert target is not None
    if kind == InputKind.PARAMETER:
        return chip.get_parameter(target).detach()
    if kind == InputKind.BUFFER:
        return chip.get_buffer(target).detach()
    const = ep.constants[target]
    assert isinstance(const, torch.Tensor)
    return const.detach()

