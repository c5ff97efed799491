"""Run a compiled system: every chip's segments on the simulator, the collectives between
them on the interconnect model, with real data.

    outputs, report = run_system(sp, (x,))          # outputs: chip 0's (every chip holds the same)

Each segment runs on every chip (its own simulated NPU, its own weights); a collective
takes every chip's block, moves the real data through the algorithm's schedule
(`simulator/interconnect/functional.py`) and is timed by the contention model
(`contention.py`: bandwidth shared among the transfers crossing a link). The timeline is
bulk-synchronous: a collective starts when the last chip of the group has finished the
segment before it, and the next segment starts when it ends (collectives are not yet in
the instruction streams, so nothing overlaps them). `runtime/system_report.py` sums it up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilecc.errors import TileccError
from tilecc.frontend.segments import Collective, Segment
from tilecc.runtime.executor import run_program
from tilecc.runtime.report import Report
from tilecc.runtime.system_compile import SystemProgram
from tilecc.simulator.interconnect.collective import make_schedule, run_collective
from tilecc.simulator.interconnect.functional import run as run_schedule
from tilecc.simulator.interconnect.routing import route
from tilecc.simulator.interconnect.schedule import Schedule

SCHEDULE_OP = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather"}


@dataclass
class Event:
    kind: str  # "segment" | "collective"
    name: str  # segment index or collective op and value
    chip: int  # -1 for a collective (every chip of the group)
    start_ns: float
    end_ns: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class SystemTimeline:
    events: list[Event]
    chip_reports: list[list[Report]]  # [chip][segment]
    link_bytes: np.ndarray  # per directed link of the topology
    link_energy_uj: float
    total_ns: float
    exposed_comm_ns: float | None = None  # None: every collective's time is exposed


def run_system(sp: SystemProgram, inputs: tuple, *, mode: str = "contention", sanitize: bool = False,
               trace_dir: str | Path | None = None,
               functional: bool = True) -> tuple[list[torch.Tensor], SystemTimeline]:
    """`trace_dir`: each chip's segment traces are written there (runtime/system_trace.py
    merges them). `functional=False` (timing only): chips that run the same program are
    simulated once and replayed. The rule: the simulator's timing depends on the
    instruction stream and the config, never on the data, and every chip of a
    tensor-parallel group runs the same stream on the same config (identical chips are
    required), so chip 0's times are every chip's; collectives are timed without moving
    data. The outputs are then chip 0's timing-only values (not meaningful)."""
    n = sp.tp
    if len(inputs) != len(sp.user_inputs):
        raise TileccError(f"the system program takes {len(sp.user_inputs)} inputs, got {len(inputs)}")
    envs = [dict(sp.chip_values[r]) for r in range(n)]
    for env in envs:
        env.update(zip(sp.user_inputs, inputs))
    topo = sp.system.topology
    events: list[Event] = []
    reports: list[list[Report]] = [[] for _ in range(n)]
    link_bytes = np.zeros(len(topo.link_src))
    link_energy = 0.0
    now = 0.0
    seg_i = 0
    for stage in sp.graph.stages:
        if isinstance(stage, Segment):
            ends = []
            outs: list[torch.Tensor] = []
            t_ns = 0.0
            for r in range(n):
                if not functional and r > 0:  # replay chip 0 (see the rule above)
                    reports[r].append(reports[0][-1])
                    envs[r].update(zip(stage.outputs, outs))
                    events.append(Event("segment", f"segment {seg_i}", r, now, now + t_ns, {"trace": None,
                                                                                           "replayed": True}))
                    ends.append(now + t_ns)
                    continue
                args = tuple(envs[r][name] for name in stage.inputs)
                trace = None if trace_dir is None else Path(trace_dir) / f"chip{r}_segment{seg_i}.json"
                outs, rep = run_program(sp.programs[seg_i], args, sanitize=sanitize and functional, trace=trace,
                                        functional=functional)
                t_ns = rep.time_us * 1e3
                reports[r].append(rep)
                envs[r].update(zip(stage.outputs, outs))
                events.append(Event("segment", f"segment {seg_i}", r, now, now + t_ns,
                                    {"trace": str(trace) if trace is not None else None}))
                ends.append(now + t_ns)
            now = max(ends)
            seg_i += 1
            continue
        for c in stage:
            blocks = [envs[r][c.input] for r in range(n)]
            outs, t_ns, lb, e_uj, algo = _collective(c, blocks, sp, mode, functional)
            link_bytes += lb
            link_energy += e_uj
            for r in range(n):
                envs[r][c.output] = outs[r]
            nbytes = blocks[0].numel() * blocks[0].element_size()
            events.append(Event("collective", c.op, -1, now, now + t_ns,
                                {"bytes": nbytes, "algorithm": algo, "value": c.input, "link_bytes": lb}))
            now += t_ns
    outputs = [envs[0][name] for name in sp.graph.outputs]
    return outputs, SystemTimeline(events, reports, link_bytes, link_energy, now)


def _collective(c: Collective, blocks: list[torch.Tensor], sp: SystemProgram, mode: str,
                functional: bool = True) -> tuple[list[torch.Tensor], float, np.ndarray, float, str]:
    n = len(blocks)
    topo, link = sp.system.topology, sp.system.link
    if c.op == "shard":  # a local cut of a replicated value: no traffic
        cut = [b.chunk(n, c.dim)[r].contiguous() for r, b in enumerate(blocks)]
        return cut, 0.0, np.zeros(len(topo.link_src)), 0.0, "local"
    dtype = blocks[0].dtype
    flat = [b.movedim(c.dim, 0).contiguous().reshape(-1).float().numpy() for b in blocks]
    if c.op == "reduce_scatter" and blocks[0].shape[c.dim] % n:
        raise TileccError(f"{c.op} of {c.input}: size {blocks[0].shape[c.dim]} along dim {c.dim} is not a "
                          f"multiple of the {n} chips")
    itemsize = blocks[0].element_size()
    elements = len(flat[0]) * (n if c.op == "all_gather" else 1)
    res = run_collective(c.op, elements * itemsize, topo, link, mode=mode, itemsize=itemsize)
    sched = make_schedule(c.op, res.algorithm, topo, link, elements, itemsize)
    outs_np = run_schedule(sched, flat) if functional else [np.zeros(sched.elements, np.float32)] * n
    if not functional and c.op == "reduce_scatter":
        outs_np = [o[: sched.elements // n] for o in outs_np]
    moved = list(blocks[0].movedim(c.dim, 0).shape)
    moved[0] = moved[0] * n if c.op == "all_gather" else moved[0] // n if c.op == "reduce_scatter" else moved[0]
    outs = [torch.from_numpy(o).to(dtype).reshape(moved).movedim(0, c.dim).contiguous() for o in outs_np]
    return outs, res.time_ns, _link_bytes(sched, topo, itemsize), res.link_energy_uj, res.algorithm


def _link_bytes(sched: Schedule, topo: Any, itemsize: int) -> np.ndarray:
    out = np.zeros(len(topo.link_src))
    for step in sched.steps:
        for s, d, cnt in zip(step.src, step.dst, step.count):
            for lk in route(topo, int(s), int(d)):
                out[lk] += int(cnt) * itemsize
    return out
