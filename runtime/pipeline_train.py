"""Pipeline-parallel training with 1F1B: the model's stages (runtime/pipeline_run.py's cut)
each compiled as a training step (forward and backward graphs, runtime/train_step.py), the
micro-batches run through them, and the step timed by the 1F1B schedule.

    r = pipeline_train_step(model, (ids,), load_system("ring:2;chip=tiny"), pp=2, micro_batches=4)
    r.grads[fqn]        # equal eager's for the mean of the output over the whole batch
    r.step_ns, r.bubble_ns, r.ops   # one_f_one_b.py's timeline of the stages' simulated times

Stage k is segment k of the exported model (cut at `send_recv` markers before the first
layer of each later stage), wrapped as a module whose parameters are the segment's weight
inputs; it takes the values earlier stages made (the activations, and masks or positions)
and returns those later stages use. Functional: every micro-batch's forward runs through
the stages, then its backward back through them (the last stage's loss is the mean of the
model's output, scaled by 1 / M so that the micro-batches' gradients sum to the whole
batch's); each stage's forward and backward are simulated. The order does not change the
values, so the timing comes from the 1F1B schedule of the simulated per-stage times (each
stage's mean over the micro-batches: equal shapes give equal streams), with the activation
sends (and the gradients sent back) each taking the route's latency + bytes / bandwidth
(runtime/group_collective.concurrent_sends, the values of one boundary one after another).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tilecc.frontend.segments import Segment, SegmentedGraph
from tilecc.frontend.tensor_parallel import ShardingError
from tilecc.runtime.data_parallel import Bucket, make_buckets, mean_grads, split_batch
from tilecc.runtime.group_collective import concurrent_sends
from tilecc.runtime.one_f_one_b import PipeOp, one_f_one_b
from tilecc.runtime.parallel_step import ChipGrid, dp_overlap
from tilecc.runtime.pipeline_run import _micro_batches, export_stages
from tilecc.runtime.train_step import TrainStep
from tilecc.simulator.interconnect.system import SystemConfig


class StageModule(nn.Module):
    """Segment `seg` as a module: its weight inputs are parameters, the rest arguments."""

    def __init__(self, seg: Segment, values: dict[str, torch.Tensor], takes: list[str], gives: list[str]):
        super().__init__()
        self.seg_module = seg.module
        self.order = list(seg.inputs)
        self.weights = nn.ParameterDict({n: nn.Parameter(values[n].clone()) for n in seg.inputs if n in values})
        self.takes, self.gives = takes, gives
        self.pos = {n: i for i, n in enumerate(seg.outputs)}

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env = dict(zip(self.takes, args))
        outs = self.seg_module(*[self.weights[n] if n in self.weights else env[n] for n in self.order])
        outs = outs if isinstance(outs, tuple | list) else (outs,)
        return tuple(outs[self.pos[n]] for n in self.gives)


@dataclass
class PipelineTrainResult:
    pp: int
    micro_batches: int
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    fwd_ns: list[float]
    bwd_ns: list[float]
    send_ns: list[float]
    grad_send_ns: list[float]
    step_ns: float
    bubble_ns: float  # the schedule with free sends, less the busiest stage's work
    exposed_comm_ns: float  # what the sends add to the schedule
    ops: list[PipeOp] = field(default_factory=list)
    dp: int = 1
    buckets: list[list[Bucket]] = field(default_factory=list)  # dp > 1: per stage, the gradient all-reduce
    dp_comm_ns: float = 0.0  # the step's last stage's buckets, hidden or not
    dp_exposed_ns: float = 0.0  # what they add after the pipeline

    def __str__(self) -> str:
        dp = (f"; data parallel x{self.dp}: gradient all-reduce {self.dp_comm_ns / 1e3:,.1f} us, "
              f"{self.dp_exposed_ns / 1e3:,.1f} us exposed") if self.dp > 1 else ""
        return (f"pipeline 1F1B: {self.pp} stages x {self.micro_batches} micro-batches: step "
                f"{self.step_ns / 1e3:,.1f} us; per micro-batch forward "
                + ", ".join(f"{t / 1e3:,.1f}" for t in self.fwd_ns) + " us, backward "
                + ", ".join(f"{t / 1e3:,.1f}" for t in self.bwd_ns) + f" us; bubble {self.bubble_ns / 1e3:,.1f} us "
                f"({self.bubble_ns / self.step_ns:.1%}), exposed sends {self.exposed_comm_ns / 1e3:,.1f} us" + dp)


def _producers(graph: SegmentedGraph) -> dict[str, int]:
    prod: dict[str, int] = {}
    for k, seg in enumerate(graph.segments):
        for o in seg.outputs:
            prod[o] = k
    return prod


def pipeline_train_step(model: nn.Module, inputs: tuple, system: SystemConfig, *, pp: int, micro_batches: int,
                        dp: int = 1, mode: str = "contention") -> PipelineTrainResult:
    """`dp` > 1: that many replicas of the pipeline (chip = d x pp + k), each on 1/dp of the
    batch; their gradients averaged by the all-reduce schedule (data_parallel.mean_grads), in
    buckets from each stage's last backward (parallel_step.dp_overlap)."""
    grid = ChipGrid(1, pp, dp)
    grid.check(system)
    shards = split_batch(tuple(inputs), dp)
    micro = [_micro_batches(sh, micro_batches) for sh in shards]
    graph, values, user, fqn, _ = export_stages(model, micro[0][0], pp)
    alias = {c.output: c.input for c in graph.collectives}  # a send_recv marker passes its value on
    prod = _producers(graph)
    segs = graph.segments
    takes = [[n for n in seg.inputs if n not in values] for seg in segs]
    real = [[alias.get(n, n) for n in t] for t in takes]
    used_later = [{n for j in range(k + 1, pp) for n in real[j]} for k in range(pp)]
    gives = [[o for o in seg.outputs if o in used_later[k]] for k, seg in enumerate(segs)]
    gives[-1] = [o for o in graph.outputs]
    stages = [StageModule(seg, values, takes[k], gives[k]) for k, seg in enumerate(segs)]
    chip = system.chip_targets[0]
    steps = [TrainStep(st, target=chip, loss="mean" if k == pp - 1 else None) for k, st in enumerate(stages)]
    fwd: list[list[float]] = [[] for _ in range(pp)]
    bwd: list[list[float]] = [[] for _ in range(pp)]
    losses: list[torch.Tensor] = []
    nbytes: dict[str, int] = {}
    env: dict[str, torch.Tensor] = {}
    rep_grads: list[dict[str, torch.Tensor]] = []
    last_ready: list[dict[str, float]] = [{} for _ in range(pp)]  # per stage: FQN -> ready in its last backward
    for mbs in micro:
        grads: dict[str, torch.Tensor] = {}
        for mb in mbs:
            env = dict(zip(user, mb))
            pend = []
            for k in range(pp):
                args = [env[n] for n in real[k]]
                pend.append(steps[k].forward(*args, input_grad=k > 0))
                out = pend[-1].output
                for n, v in zip(gives[k], out if k < pp - 1 else (out,)):
                    env[n] = v.detach()
                    nbytes[n] = v.numel() * v.element_size()
            gout: dict[str, torch.Tensor] = {}
            for k in reversed(range(pp)):
                go = None if k == pp - 1 else [gout.get(n) for n in gives[k]]
                if go is not None and all(g is None for g in go):
                    raise ShardingError(f"stage {k}: no output of it takes a gradient from the later stages")
                r = steps[k].backward(pend[k], go)
                if k == pp - 1:
                    losses.append(r.output)
                fwd[k].append(r.forward_ns)
                bwd[k].append(r.backward_ns)
                for name, g in r.grads.items():
                    pname = name.split(".", 1)[1]  # "weights.<input name>"
                    g = g.mT if pname in graph.transposed else g
                    key = fqn[pname]
                    grads[key] = grads[key] + g / len(mbs) if key in grads else g / len(mbs)
                    last_ready[k][key] = r.grad_ready_ns[name]
                for n, g in zip(real[k], r.input_grads):
                    if g is not None:
                        gout[n] = gout[n] + g if n in gout else g
        rep_grads.append(grads)
    names = list(rep_grads[0])
    grads = mean_grads(rep_grads, names) if dp > 1 else rep_grads[0]
    f = [sum(x) / len(x) for x in fwd]
    b = [sum(x) / len(x) for x in bwd]
    send, gsend = [], []
    for k in range(pp - 1):
        crossing = [n for n in used_later[k] if prod.get(n, -1) <= k and prod.get(n, -1) >= 0 and
                    any(n in real[j] for j in range(k + 1, pp))]
        pairs = [(grid.chip(d, k, 0), grid.chip(d, k + 1, 0)) for d in range(dp)]  # every replica's at once
        send.append(sum(concurrent_sends(pairs, nbytes[n], system, mode=mode) for n in crossing))
        with_grad = [n for n in crossing if torch.is_floating_point(env[n])]
        back = [(q, p) for p, q in pairs]
        gsend.append(sum(concurrent_sends(back, nbytes[n], system, mode=mode) for n in with_grad))
    ops, total = one_f_one_b(f, b, micro_batches, send, gsend)
    _, free_total = one_f_one_b(f, b, micro_batches)
    busiest = max(micro_batches * (fk + bk) for fk, bk in zip(f, b))
    res = PipelineTrainResult(pp, micro_batches, torch.stack(losses).mean(), grads, f, b, send, gsend, total,
                              free_total - busiest, total - free_total, ops, dp)
    if dp > 1:
        sizes = {k: v.numel() * v.element_size() for k, v in grads.items()}
        stage_buckets = [make_buckets(model, {k: sizes[k] for k in ready}, ready) for ready in last_ready]
        itemsize = next(iter(grads.values())).element_size()
        ends, res.buckets, _ = dp_overlap(stage_buckets, ops, system, grid, mode=mode, itemsize=itemsize)
        crit = max(range(pp), key=lambda k: ends[k])
        res.step_ns = ends[crit]
        res.dp_comm_ns = sum(bk.comm_ns for bk in res.buckets[crit])
        res.dp_exposed_ns = res.step_ns - total
    return res
