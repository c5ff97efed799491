"""Pipeline parallelism: a model's layers cut into stages, one chip each, micro-batches
flowing through them (inference, GPipe's fill and drain).

    pp = compile_pipeline(model, (ids,), load_system("ring:2"), pp=2, micro_batches=4)
    outputs, timeline, report = run_pipeline(pp, (ids,))

The decoder layers (the model's largest `nn.ModuleList`) are cut into `pp` contiguous runs
of near-equal length; a `tilecc.send_recv` marker (frontend/collective_ops.py) on the first
layer of each later stage cuts the exported graph there (frontend/segments.py): segment k
is stage k's program (the embedding goes with the first stage, the final norm with the
last), compiled for one micro-batch, with its weights as inputs. Stage k runs on chip k.

Timing: stage k starts micro-batch m when it has finished m-1 and every value m needs has
arrived; a value made on chip p and used on chip k != p is sent when it is made, and takes
the route's latency plus bytes / bandwidth (`LinkConfig.path_latency_ns`, routing.py; the
transfers of a pipeline are few and small, and the model does not share a link between
two of them). Functional: real data; the outputs are the micro-batches' concatenated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.export.graph_signature import InputKind

from tilecc.errors import TileccError
from tilecc.frontend import collective_ops  # noqa: F401 (registers torch.ops.tilecc.*)
from tilecc.frontend.export import export_model
from tilecc.frontend.segments import Segment, SegmentedGraph, split_at_collectives
from tilecc.frontend.tensor_parallel import ShardingError
from tilecc.runtime.cache import compile_cached
from tilecc.runtime.compiler import CompileStats
from tilecc.runtime.executor import run_program
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report
from tilecc.runtime.system_report import SystemReport, system_report
from tilecc.runtime.system_run import Event, SystemTimeline
from tilecc.simulator.interconnect.routing import path_stats, route
from tilecc.simulator.interconnect.system import SystemConfig


@dataclass
class PipelineProgram:
    system: SystemConfig
    pp: int
    micro_batches: int
    graph: SegmentedGraph
    programs: list[Program]  # stage k's program: graph.segments[k]
    values: dict[str, torch.Tensor]  # weights by graph input name (each stage reads its own)
    user_inputs: list[str]
    stage_layers: list[tuple[int, int]]  # [first, last) decoder layer of each stage
    compile_seconds: float = 0.0
    report_extra: dict[str, Any] = field(default_factory=dict)
    model: Any = None  # the nn.Module (a training step re-cuts it: runtime/pipeline_train.py)


def _layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        raise ShardingError(f"{type(model).__name__}: pipeline parallelism cuts the model between layers of an "
                            f"nn.ModuleList (a decoder's `layers`); none found")
    return max(lists, key=lambda x: len(x[1]))


def compile_pipeline(model: nn.Module, inputs: tuple, system: SystemConfig, *, pp: int, micro_batches: int = 1,
                     opt_level: int = 2, cache: Any = None) -> PipelineProgram:
    t0 = time.perf_counter()
    if pp != system.chips:
        raise ShardingError(f"pipeline of {pp} stages on a system of {system.chips} chips: pp must equal the "
                            f"chip count")
    micro = _micro_batches(inputs, micro_batches)
    graph, values, user, _, bounds = export_stages(model, micro[0], pp)
    cfg = system.chip_config(0)
    programs = []
    for k, seg in enumerate(graph.segments):
        programs.append(compile_cached(export_model(seg.module, tuple(seg.examples)), system.chip_config(k)
                                       if len(system.chip_targets) > 1 else cfg, cache, stats=CompileStats(),
                                       opt_level=opt_level))
    return PipelineProgram(system, pp, micro_batches, graph, programs, values, user,
                           list(zip(bounds, bounds[1:])), time.perf_counter() - t0,
                           {"pp": pp, "micro_batches": micro_batches}, model)


def export_stages(model: nn.Module, inputs: tuple, pp: int) -> tuple[SegmentedGraph, dict[str, torch.Tensor],
                                                                    list[str], dict[str, str], list[int]]:
    """The model exported on `inputs` (one micro-batch) and cut into `pp` stage segments:
    (graph, weights by input name (W^T where graph.transposed), user-input names, parameter
    FQN by input name, layer bounds)."""
    name, layers = _layers(model)
    if len(layers) < pp:
        raise ShardingError(f"{name}: {len(layers)} layers cannot make {pp} pipeline stages (one layer at least each)")
    bounds = [(k * len(layers)) // pp for k in range(pp + 1)]
    handles = []
    for k in range(1, pp):
        handles.append(layers[bounds[k]].register_forward_pre_hook(_send_hook(k)))
    try:
        ep = export_model(model.eval(), inputs)
    finally:
        for h in handles:
            h.remove()
    values: dict[str, torch.Tensor] = {}
    shared: dict[str, torch.Tensor] = {}
    user: list[str] = []
    fqn: dict[str, str] = {}
    names = [n.name for n in ep.graph_module.graph.nodes if n.op == "placeholder"]
    for spec, pname in zip(ep.graph_signature.input_specs, names):
        if spec.kind == InputKind.USER_INPUT:
            user.append(pname)
        elif spec.kind == InputKind.PARAMETER:
            assert spec.target is not None
            values[pname] = model.get_parameter(spec.target).detach()
            fqn[pname] = spec.target
        elif spec.kind == InputKind.BUFFER:
            assert spec.target is not None
            shared[pname] = model.get_buffer(spec.target).detach()
        else:
            assert spec.target is not None
            const = ep.constants[spec.target]
            assert isinstance(const, torch.Tensor)
            shared[pname] = const.detach()
    graph = split_at_collectives(ep, shared, set(values))
    values = {k: v.mT.contiguous() if k in graph.transposed else v for k, v in values.items()}
    if len(graph.segments) != pp:
        raise ShardingError(f"the pipeline cut gives {len(graph.segments)} stage programs for {pp} stages")
    return graph, values, user, fqn, bounds


def _send_hook(k: int) -> Any:
    return lambda m, args: (torch.ops.tilecc.send_recv(args[0], k - 1, k), *args[1:])


def _micro_batches(inputs: tuple, m: int) -> list[tuple]:
    if m < 1:
        raise ShardingError(f"micro_batches must be >= 1, got {m}")
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % m:
            size = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else "no batch dim"
            raise ShardingError(f"input {i}: batch {size} cannot be cut into {m} micro-batches")
    return [tuple(x.chunk(m, 0)[j] for x in inputs) for j in range(m)]


def run_pipeline(pp: PipelineProgram, inputs: tuple, *, mode: str = "contention", sanitize: bool = False,
                 trace_dir: str | Path | None = None) -> tuple[list[torch.Tensor], SystemTimeline, SystemReport]:
    if len(inputs) != len(pp.user_inputs):
        raise TileccError(f"the pipeline program takes {len(pp.user_inputs)} inputs, got {len(inputs)}")
    topo, link = pp.system.topology, pp.system.link
    micro = _micro_batches(inputs, pp.micro_batches)
    segs = pp.graph.segments
    reports: list[list[Report]] = [[] for _ in range(pp.pp)]
    seg_ns = np.zeros((pp.micro_batches, pp.pp))
    envs: list[dict[str, torch.Tensor]] = []
    seg_events: list[tuple[int, int, str | None]] = []
    for m, mb in enumerate(micro):  # functional: every stage on every micro-batch
        env = dict(pp.values)
        env.update(zip(pp.user_inputs, mb))
        for k, seg in enumerate(segs):
            args = tuple(env[n] for n in seg.inputs)
            trace = None if trace_dir is None else Path(trace_dir) / f"chip{k}_mb{m}.json"
            outs, rep = run_program(pp.programs[k], args, sanitize=sanitize, trace=trace)
            env.update(zip(seg.outputs, outs))
            for c in pp.graph.collectives:  # a marker: the value it crosses with
                if c.input in env:
                    env[c.output] = env[c.input]
            reports[k].append(rep)
            seg_ns[m, k] = rep.time_us * 1e3
            seg_events.append((m, k, str(trace) if trace else None))
        envs.append(env)
    producer = _producers(segs, pp.graph)
    sends = _sends(segs, producer, envs[0])
    total, events, link_bytes = _schedule(pp, seg_ns, sends, topo, link, seg_events)
    free_total, _, _ = _schedule(pp, seg_ns, sends, topo, link, seg_events, free_transfers=True)
    outputs = [torch.cat([env[n] for env in envs], 0) for n in pp.graph.outputs]
    tl = SystemTimeline(events, reports, link_bytes, float(link_bytes.sum()) * link.pj_per_byte * 1e-6, total,
                        exposed_comm_ns=total - free_total)
    return outputs, tl, system_report(pp, tl)


def _producers(segs: list[Segment], graph: SegmentedGraph) -> dict[str, int]:
    producer: dict[str, int] = {}
    for k, seg in enumerate(segs):
        for o in seg.outputs:
            producer[o] = k
    for c in graph.collectives:
        if c.input in producer:
            producer[c.output] = producer[c.input]
    return producer


def _sends(segs: list[Segment], producer: dict[str, int],
           env: dict[str, torch.Tensor]) -> list[tuple[str, int, int, int]]:
    """(value, from stage, to stage, bytes) of every value a stage uses from another."""
    out = []
    for k, seg in enumerate(segs):
        for name in seg.inputs:
            p = producer.get(name)
            if p is not None and p != k:
                out.append((name, p, k, env[name].numel() * env[name].element_size()))
    return out


def _schedule(pp: PipelineProgram, seg_ns: np.ndarray, sends: list, topo: Any, link: Any,
              seg_events: list, free_transfers: bool = False) -> tuple[float, list[Event], np.ndarray]:
    """The pipeline's timeline; `free_transfers`: the same dependences with transfers taking
    no time (the exposed communication is the difference)."""
    link_bytes = np.zeros(len(topo.link_src))
    events: list[Event] = []
    free = np.zeros(pp.pp)
    done: dict[tuple[int, int], float] = {}
    by_dst: dict[int, list] = {}
    for s in sends:
        by_dst.setdefault(s[2], []).append(s)
    traces = {(m, k): t for m, k, t in seg_events}
    for m in range(pp.micro_batches):
        for k in range(pp.pp):
            ready = free[k]
            for name, src, dst, nbytes in by_dst.get(k, []):
                hops, switches, scale = path_stats(topo, np.array([src]), np.array([dst]))
                t_ns = 0.0 if free_transfers else \
                    float(link.path_latency_ns(hops, switches)[0]) + nbytes / (link.bandwidth_gbs * float(scale[0]))
                start = done[(m, src)]
                lb = np.zeros(len(topo.link_src))
                for lk in route(topo, src, dst):
                    lb[lk] += nbytes
                link_bytes += lb
                events.append(Event("collective", "send_recv", -1, start, start + t_ns,
                                    {"bytes": nbytes, "algorithm": f"direct {src}->{dst}", "value": name,
                                     "link_bytes": lb, "micro_batch": m}))
                ready = max(ready, start + t_ns)
            end = ready + seg_ns[m, k]
            events.append(Event("segment", f"stage {k} micro-batch {m}", k, ready, end, {"trace": traces[(m, k)]}))
            done[(m, k)] = free[k] = end
    return float(free.max()), events, link_bytes
