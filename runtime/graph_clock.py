"""The simulated time of a graph that `runtime/partition.py` split into NPU programs and
fallback ops, run node by node: the clock of a training step's forward and backward.

    clock = GraphClock()                       # the torch.compile backend's option "clock"
    run = clock.wrap("backward", plan, gm)     # frontend/dynamo.py wraps each graph it compiles
    run(*args); (r,) = clock.take()            # r.time_ns, r.output_ready_ns[i], r.reports

The graph's nodes run in order on one chip (the rule): an NPU partition takes its simulated
time (`Report.time_us`), and each of its outputs is ready when the last DMA store writing
it ends (`executor.output_ready_cycles`, the per-instruction timeline), so a gradient made
early in a backward partition is ready before the partition ends; a fallback op takes its
modelled time on the fallback device (`partition.fallback_seconds`) plus the transfers of
its inputs made on the NPU (`partition.transfer_seconds`), after the NPU work before it (no
overlap of fallback and NPU: an assumption that errs long); views take no time.

`timing_only=True` (a model on the meta device): no data moves; each NPU partition's
program is timed with `executor.time_program` and its outputs are the region's ops run on
the meta device (shapes only); the per-output ready times are then the partition's end.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from tilecc.runtime.executor import time_program
from tilecc.runtime.partition import VIEW_OPS, CostOptions, NpuPartition, Plan, fallback_seconds, transfer_seconds
from tilecc.runtime.report import Report


@dataclass
class GraphRun:
    """One call of one compiled graph."""

    kind: str  # "forward", "backward" or "inference" (AOTAutograd's graph kinds)
    time_ns: float
    npu_ns: float
    fallback_ns: float
    output_ready_ns: list[float]  # per graph output, from the call's start
    outputs: list[Any]  # the values returned (a training step matches gradients to parameters by them)
    reports: list[Report] = field(default_factory=list)  # each NPU partition's run, in order


class GraphClock:
    """Collects a `GraphRun` per call of every graph it wraps (in call order)."""

    def __init__(self, cost: CostOptions | None = None, timing_only: bool = False):
        self.cost = cost or CostOptions()
        self.timing_only = timing_only
        self.runs: list[GraphRun] = []

    def wrap(self, kind: str, plan: Plan, gm: GraphModule) -> Any:
        def run(*args: Any) -> Any:
            timed = _Timed(gm, self)
            out = timed.run(*args)
            self.runs.append(GraphRun(kind, timed.now, timed.npu_ns, timed.fallback_ns, timed.out_ready,
                                      list(out) if isinstance(out, list | tuple) else [out], timed.reports))
            return out

        return run

    def take(self) -> list[GraphRun]:
        runs, self.runs = self.runs, []
        return runs


def _nbytes(v: Any) -> int:
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


class _Timed(Interpreter):
    def __init__(self, gm: GraphModule, clock: GraphClock):
        super().__init__(gm)
        self.clock = clock
        self.now = self.npu_ns = self.fallback_ns = 0.0
        self.ready: dict[Node, Any] = {}  # node -> ns (a partition's call: a list, one per output)
        self.on_npu: set[Node] = set()
        self.out_ready: list[float] = []
        self.reports: list[Report] = []

    def _ready_of(self, a: Node) -> float:
        r = self.ready.get(a, 0.0)
        return max(r) if isinstance(r, list) else float(r)

    def run_node(self, n: Node) -> Any:
        if n.op == "call_module":
            sub = self.fetch_attr(str(n.target))
            if isinstance(sub, NpuPartition):
                return self._partition(n, sub)
        result = super().run_node(n)
        if n.op == "output":
            outs = n.args[0] if isinstance(n.args[0], list | tuple) else [n.args[0]]
            self.out_ready = [self._ready_of(a) if isinstance(a, Node) else 0.0 for a in outs]
        elif n.op == "call_function" and n.target is operator.getitem and isinstance(n.args[0], Node) \
                and isinstance(self.ready.get(n.args[0]), list):
            src = n.args[0]
            assert isinstance(n.args[1], int)
            self.ready[n] = self.ready[src][n.args[1]]
            if src in self.on_npu:
                self.on_npu.add(n)
        elif n.op == "call_function" and n.target not in VIEW_OPS:
            moved = sum(transfer_seconds(_nbytes(self.env.get(a)), self.clock.cost)
                        for a in n.all_input_nodes if a in self.on_npu)
            t = (fallback_seconds(n, self.clock.cost, {}) + moved) * 1e9
            start = max([self.now] + [self._ready_of(a) for a in n.all_input_nodes])
            self.now = start + t
            self.fallback_ns += t
            self.ready[n] = self.now
        elif n.op == "call_function":  # a view: ready with its inputs
            self.ready[n] = max([0.0] + [self._ready_of(a) for a in n.all_input_nodes])
            if any(a in self.on_npu for a in n.all_input_nodes):
                self.on_npu.add(n)
        return result

    def _partition(self, n: Node, sub: NpuPartition) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        start = max([self.now] + [self._ready_of(a) for a in n.all_input_nodes])
        report: Report | None = None
        if self.clock.timing_only:
            program = sub.program_for(args)
            out = sub.sub(*args, **kwargs)
            if program is not None:
                tensors = tuple(a for a, t in zip(args, sub.is_tensor) if t)
                report = time_program(program, tensors)
        else:
            before = sub.part.runs
            out = sub(*args, **kwargs)
            report = sub.last_report if sub.part.runs > before else None
        if report is None:  # the region could not compile and ran eagerly: its modelled time
            t = sub.part.fallback_seconds * 1e9
            self.fallback_ns += t
            ready = [start + t] * len(out)
        else:
            t = report.time_us * 1e3
            self.npu_ns += t
            self.reports.append(report)
            cyc = report.extra.get("output_ready_cycles")
            scale = t / report.cycles if report.cycles else 0.0
            ready = [start + c * scale for c in cyc] if cyc and len(cyc) == len(out) else [start + t] * len(out)
            self.on_npu.add(n)
        self.now = start + t
        self.ready[n] = ready
        return out
