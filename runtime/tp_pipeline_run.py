"""Tensor parallelism inside pipeline stages (inference): `parallel={"tp": T, "pp": P}` on
T x P chips, a chip grid (chip = stage x T + rank: a stage's TP ranks are neighbours),
replicated `dp` times for data parallelism (chip = (d x P + stage) x T + rank,
parallel_step.ChipGrid): each replica runs 1/dp of the batch, the outputs concatenated.
With T = 1 it is a pipeline (no plan), with P = 1 tensor parallelism alone.

    tpp = compile_tp_pipeline(model, (ids,), load_system("ring:4"), tp=2, pp=2, micro_batches=2)
    outputs, timeline, report = run_tp_pipeline(tpp, (ids,))    # outputs equal eager's

Every TP rank's copy of the model is sharded (frontend/tensor_parallel.py's plan) and marked
with `send_recv` before the first layer of each later stage (runtime/pipeline_run.py's cut);
rank 0's copy is exported and cut at all its collectives (frontend/segments.py), so a
segment belongs to the stage whose marker came last before it, and compiles once for every
rank (its weights are inputs). Running a micro-batch: each segment on the T chips of its
stage with their own weights; a TP collective moves the real data of the stage's T blocks
through the algorithm's schedule (functional mode) and is timed over that group on the
system (runtime/group_collective.py, contention mode); at a stage boundary the values the
later stages use are sent from each rank to its peer of the next stage (concurrent_sends).
Timing: a stage's time per micro-batch is its segments' simulated times (the slowest rank;
all run the same stream) plus its collectives, bulk-synchronous; micro-batch m enters stage
k when stage k has finished m-1 and m has arrived from stage k-1 (fill and drain, as
pipeline_run.py). Replicas run at the same time: each collective and send is timed with
every replica's peers doing theirs on the same links; the step is the slowest replica's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from tilecc.errors import TileccError
from tilecc.frontend.export import export_model
from tilecc.frontend.segments import Collective, Segment, SegmentedGraph, split_at_collectives
from tilecc.frontend.tensor_parallel import ShardingError, auto_plan
from tilecc.runtime.cache import compile_cached
from tilecc.runtime.compiler import CompileStats
from tilecc.runtime.data_parallel import split_batch
from tilecc.runtime.executor import run_program
from tilecc.runtime.group_collective import all_reduce_blocks, concurrent_sends, group_collective, group_schedule
from tilecc.runtime.parallel_step import ChipGrid
from tilecc.runtime.pipeline_run import _layers, _micro_batches, _send_hook
from tilecc.runtime.program import Program
from tilecc.runtime.report import Report
from tilecc.runtime.system_compile import export_shards
from tilecc.runtime.system_report import SystemReport, system_report
from tilecc.runtime.system_run import Event, SystemTimeline, _link_bytes
from tilecc.simulator.interconnect.routing import route
from tilecc.simulator.interconnect.system import SystemConfig


@dataclass
class TpPipelineProgram:
    system: SystemConfig
    tp: int
    pp: int
    micro_batches: int
    graph: SegmentedGraph
    stage_of: list[int]  # per entry of graph.stages: its pipeline stage
    programs: list[Program]  # per segment, in graph.segments order
    chip_values: list[dict[str, torch.Tensor]]  # per TP rank
    user_inputs: list[str]
    compile_seconds: float = 0.0
    dp: int = 1
    model: Any = None  # the nn.Module (a training step cuts it again)

    @property
    def grid(self) -> ChipGrid:
        return ChipGrid(self.tp, self.pp, self.dp)

    @property
    def report_extra(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "micro_batches": self.micro_batches}


def compile_tp_pipeline(model: torch.nn.Module, inputs: tuple, system: SystemConfig, *, tp: int, pp: int,
                        micro_batches: int = 1, dp: int = 1, opt_level: int = 2,
                        cache: Any = None) -> TpPipelineProgram:
    t0 = time.perf_counter()
    ChipGrid(tp, pp, dp).check(system)
    if len(set(system.chip_targets)) > 1:
        raise TileccError("tensor parallelism needs identical chips (system.chip lists different configs)")
    micro = _micro_batches(split_batch(tuple(inputs), dp)[0], micro_batches)
    model = model.eval()
    plan = auto_plan(model, False) if tp > 1 else {}
    sh = export_shards(model, micro[0], plan, tp, mark=stage_marks(model, pp))
    values, shared, user = sh.values, sh.shared, sh.user
    graph = split_at_collectives(sh.ep, shared, set(values[0]))
    values = [{k: v.mT.contiguous() if k in graph.transposed else v for k, v in vals.items()} for vals in values]
    stage_of = stage_numbers(graph)
    cfg = system.chip_config(0)
    programs = [compile_cached(export_model(seg.module, tuple(seg.examples)), cfg, cache, stats=CompileStats(),
                               opt_level=opt_level) for seg in graph.segments]
    return TpPipelineProgram(system, tp, pp, micro_batches, graph, stage_of, programs, values, user,
                             time.perf_counter() - t0, dp, model)


def stage_marks(model: torch.nn.Module, pp: int) -> Any:
    """The pipeline's cut for export_shards(mark=): `send_recv` before the first layer of each
    later stage (None for one stage)."""
    if pp == 1:
        return None
    name, layers = _layers(model)
    if len(layers) < pp:
        raise ShardingError(f"{name}: {len(layers)} layers cannot make {pp} pipeline stages (one layer at least each)")
    bounds = [(k * len(layers)) // pp for k in range(pp + 1)]

    def mark(chip: torch.nn.Module) -> list[Any]:
        chip_layers = cast(torch.nn.ModuleList, chip.get_submodule(name))
        return [chip_layers[bounds[k]].register_forward_pre_hook(_send_hook(k)) for k in range(1, pp)]

    return mark


def stage_numbers(graph: SegmentedGraph) -> list[int]:
    """Per entry of graph.stages, its pipeline stage: that of the last send_recv before it."""
    stage_of, k = [], 0
    for st in graph.stages:
        if isinstance(st, list) and any(c.op == "send_recv" for c in st):
            k = max(c.group for c in st if c.op == "send_recv")
        stage_of.append(k)
    return stage_of


def _tp_collective(c: Collective, blocks: list[torch.Tensor], tpp: TpPipelineProgram, stage: int, d: int,
                   mode: str) -> tuple[list[torch.Tensor], float, str, np.ndarray]:
    """Replica d's collective at `stage`: its blocks' sum (functional), timed with every
    replica's group of that stage doing the same at once."""
    n = len(blocks)
    topo = tpp.system.topology
    if c.op == "shard":
        return [b.chunk(n, c.dim)[r].contiguous() for r, b in enumerate(blocks)], 0.0, "local", \
            np.zeros(len(topo.link_src))
    if c.op != "all_reduce":
        raise ShardingError(f"tp x pp runs the all-reduce plan (no sequence parallelism); {c.op} of {c.input} "
                            f"is not supported here")
    grid = tpp.grid
    group = np.array([[grid.chip(d, stage, r) for r in range(n)]])
    (outs,), res = all_reduce_blocks([blocks], tpp.system, group, mode=mode)
    if tpp.dp > 1:
        every = [[grid.chip(e, stage, r) for r in range(n)] for e in range(tpp.dp)]
        res = group_collective("all_reduce", blocks[0].numel() * blocks[0].element_size(), tpp.system, every,
                               mode=mode, itemsize=blocks[0].element_size(), algorithm=res.algorithm)
    placed = group_schedule("all_reduce", res.algorithm, group, topo.n_chips, blocks[0].numel())
    return outs, res.time_ns, res.algorithm, _link_bytes(placed, topo, blocks[0].element_size())


def run_tp_pipeline(tpp: TpPipelineProgram, inputs: tuple, *, mode: str = "contention",
                    sanitize: bool = False) -> tuple[list[torch.Tensor], SystemTimeline, SystemReport]:
    if len(inputs) != len(tpp.user_inputs):
        raise TileccError(f"the program takes {len(tpp.user_inputs)} inputs, got {len(inputs)}")
    reports: list[list[Report]] = [[] for _ in range(tpp.system.chips)]
    link_bytes = np.zeros(len(tpp.system.topology.link_src))
    events: list[Event] = []
    outs, total, free_total = [], 0.0, 0.0
    for d, shard in enumerate(split_batch(tuple(inputs), tpp.dp)):
        o, t, ft = _run_replica(tpp, d, shard, mode, sanitize, reports, link_bytes, events)
        outs.append(o)
        total, free_total = max(total, t), max(free_total, ft)
    outputs = [torch.cat([o[i] for o in outs], 0) for i in range(len(tpp.graph.outputs))]
    energy = float(link_bytes.sum()) * tpp.system.link.pj_per_byte * 1e-6
    tl = SystemTimeline(events, reports, link_bytes, energy, total, exposed_comm_ns=total - free_total)
    return outputs, tl, system_report(tpp, tl)


def _run_replica(tpp: TpPipelineProgram, d: int, inputs: tuple, mode: str, sanitize: bool,
                 reports: list[list[Report]], link_bytes: np.ndarray,
                 events: list[Event]) -> tuple[list[torch.Tensor], float, float]:
    """Replica d's micro-batches through its stages: (its outputs, its time, its time without
    communication); its chips' reports, link bytes and events added to those given."""
    tp, pp, grid = tpp.tp, tpp.pp, tpp.grid
    micro = _micro_batches(inputs, tpp.micro_batches)
    stage_ns = np.zeros((len(micro), pp))  # compute + the stage's TP collectives
    comm_ns = np.zeros((len(micro), pp))  # the TP collectives alone
    send_ns = np.zeros((len(micro), pp))
    comms: list[tuple[int, int, str, int, str, str, float]] = []  # (m, stage, op, bytes, algorithm, value, ns)
    envs = []
    for m, mb in enumerate(micro):
        env = [dict(tpp.chip_values[r], **dict(zip(tpp.user_inputs, mb))) for r in range(tp)]
        seg_i, made_in = 0, {}
        for st, k in zip(tpp.graph.stages, tpp.stage_of):
            if isinstance(st, Segment):
                t = 0.0
                for r in range(tp):
                    outs, rep = run_program(tpp.programs[seg_i], tuple(env[r][n] for n in st.inputs), sanitize=sanitize)
                    env[r].update(zip(st.outputs, outs))
                    reports[grid.chip(d, k, r)].append(rep)
                    t = max(t, rep.time_us * 1e3)
                made_in.update(dict.fromkeys(st.outputs, k))
                stage_ns[m, k] += t
                seg_i += 1
                continue
            for c in st:
                if c.op == "send_recv":  # the values later stages use leave stage c.group - 1
                    for r in range(tp):
                        env[r][c.output] = env[r][c.input]
                    made_in[c.output] = c.group
                    later = _used_from(tpp, c.group)
                    nbytes = sum(env[0][v].numel() * env[0][v].element_size() for v in later
                                 if made_in.get(v, -1) == c.group - 1 or v == c.input)
                    pairs = [(grid.chip(e, c.group - 1, r), grid.chip(e, c.group, r)) for e in range(tpp.dp)
                             for r in range(tp)]  # every replica's at once
                    t_send = concurrent_sends(pairs, nbytes, tpp.system, mode=mode)
                    for a, b in pairs[d * tp:(d + 1) * tp]:
                        for lk in route(tpp.system.topology, a, b):
                            link_bytes[lk] += nbytes
                    send_ns[m, c.group] += t_send
                    comms.append((m, c.group, "send_recv", nbytes, f"direct x{tp}", c.input, t_send))
                    continue
                blocks = [env[r][c.input] for r in range(tp)]
                outs, t_ns, algo, lb = _tp_collective(c, blocks, tpp, k, d, mode)
                link_bytes += lb
                for r in range(tp):
                    env[r][c.output] = outs[r]
                made_in[c.output] = k
                stage_ns[m, k] += t_ns
                comm_ns[m, k] += t_ns
                comms.append((m, k, c.op, blocks[0].numel() * blocks[0].element_size(), algo, c.input, t_ns))
        envs.append(env[0])
    done = np.zeros((len(micro), pp))
    free = np.zeros(pp)
    mine: list[Event] = []
    for m in range(len(micro)):
        for k in range(pp):
            ready = max(free[k], done[m, k - 1] + send_ns[m, k] if k else 0.0)
            done[m, k] = free[k] = ready + stage_ns[m, k]
            for r in range(tp):
                mine.append(Event("segment", f"stage {k} micro-batch {m}", grid.chip(d, k, r), ready, done[m, k],
                                  {"trace": None}))
    total = float(free.max())
    free_total = _fill_drain(stage_ns - comm_ns)  # no communication at all: what it adds is exposed
    start = {(e.name, e.chip): e.start_ns for e in mine}
    topo_links = len(tpp.system.topology.link_src)
    # placed at their stage's start (durations are exact); replica 0's stand for every replica's,
    # which run at the same time as one group collective (each timed with all of them)
    for m, k, op, nbytes, algo, value, t_ns in comms if d == 0 else []:
        t0 = start[(f"stage {k} micro-batch {m}", grid.chip(d, k, 0))]
        mine.append(Event("collective", op, -1, t0, t0 + t_ns, {"bytes": nbytes, "algorithm": algo, "value": value,
                                                               "link_bytes": np.zeros(topo_links)}))
    events += mine
    return [torch.cat([env[n] for env in envs], 0) for n in tpp.graph.outputs], total, free_total


def _used_from(tpp: TpPipelineProgram, stage: int) -> set[str]:
    return {n for st, k in zip(tpp.graph.stages, tpp.stage_of) if isinstance(st, Segment) and k >= stage
            for n in st.inputs}


def _fill_drain(stage_ns: np.ndarray) -> float:
    free = np.zeros(stage_ns.shape[1])
    for m in range(stage_ns.shape[0]):
        for k in range(stage_ns.shape[1]):
            free[k] = max(free[k], free[k - 1] if k else 0.0) + stage_ns[m, k]
    return float(free.max())
