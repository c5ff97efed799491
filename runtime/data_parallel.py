"""Data parallelism: the batch split over `dp` replicas, each chip running the training
step on its shard, the gradients all-reduced in buckets overlapped with the backward.

    r = data_parallel_step(TrainStep(model, target="tiny", loss="mean"), (ids,), system, dp=2)
    r.grads[fqn]            # the replicas' mean (DDP's rule): eager's for a mean loss
    r.step_ns, r.hidden_share, r.buckets

Buckets: one per decoder layer (the parameters under one index of the model's largest
`nn.ModuleList`), one per other module; a bucket is ready when the backward has made its
last gradient (`TrainStep`'s per-output ready times, from the simulated per-instruction
timeline), and the buckets are all-reduced in the order they become ready, one at a time
(one communication stream, as DDP), each as soon as it is ready and the previous one is
done: start_i = max(forward + ready_i, end_{i-1}), end_i = start_i + t_i, with t_i the
all-reduce of the bucket's bytes over the replicas' group on the system's interconnect
(runtime/group_collective.py, contention mode). The step ends at max(forward + backward,
end of the last bucket); the exposed communication is that minus forward + backward, and
the hidden share 1 - exposed / sum(t_i). No optimizer step is modelled.

Functional: every replica is simulated (their data differ); the gradients are averaged by
running the all-reduce schedule on them (simulator/interconnect/functional.py) and dividing
by dp. Every replica runs the same stream on the same config, so their times are equal
(the replay rule of runtime/system_run.py); the step uses the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from tilecc.frontend.tensor_parallel import ShardingError
from tilecc.runtime.group_collective import group_collective, group_schedule
from tilecc.runtime.train_step import StepResult, TrainStep
from tilecc.simulator.interconnect.functional import run as run_schedule
from tilecc.simulator.interconnect.system import SystemConfig


@dataclass
class Bucket:
    name: str
    params: list[str]
    bytes: int
    ready_ns: float  # from the backward's start
    comm_ns: float = 0.0
    start_ns: float = 0.0  # from the step's start
    end_ns: float = 0.0
    algorithm: str = ""


@dataclass
class DataParallelResult:
    dp: int
    loss: torch.Tensor | None
    grads: dict[str, torch.Tensor]
    forward_ns: float
    backward_ns: float
    buckets: list[Bucket]
    step_ns: float
    comm_ns: float
    exposed_ns: float
    replicas: list[StepResult] = field(default_factory=list)

    @property
    def hidden_share(self) -> float:
        return 1.0 - self.exposed_ns / self.comm_ns if self.comm_ns else 1.0

    def __str__(self) -> str:
        lines = [f"data parallel x{self.dp}: step {self.step_ns / 1e3:,.1f} us = forward {self.forward_ns / 1e3:,.1f} "
                 f"+ backward {self.backward_ns / 1e3:,.1f} + exposed communication {self.exposed_ns / 1e3:,.1f} us; "
                 f"gradient all-reduce {self.comm_ns / 1e3:,.1f} us, {self.hidden_share:.1%} hidden under the backward"]
        for b in self.buckets:
            lines.append(f"  {b.name:<28} {b.bytes:>12,} B  ready {b.ready_ns / 1e3:9.1f} us  all-reduce "
                         f"{b.start_ns / 1e3:9.1f} -> {b.end_ns / 1e3:9.1f} us ({b.algorithm})")
        return "\n".join(lines)


def layer_key(model: nn.Module, name: str) -> str:
    """The bucket of parameter `name`: `<layers list>.<i>` for a decoder layer's, else its module."""
    lists = [n for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    for ln in sorted(lists, key=len, reverse=True):
        if name.startswith(ln + "."):
            return ln + "." + name[len(ln) + 1:].split(".")[0]
    return name.rsplit(".", 1)[0] if "." in name else name


def make_buckets(model: nn.Module, sizes: dict[str, int], ready: dict[str, float]) -> list[Bucket]:
    groups: dict[str, list[str]] = {}
    for name in sizes:
        groups.setdefault(layer_key(model, name), []).append(name)
    out = [Bucket(k, v, sum(sizes[p] for p in v), max(ready[p] for p in v)) for k, v in groups.items()]
    return sorted(out, key=lambda b: b.ready_ns)


def overlap(buckets: list[Bucket], forward_ns: float, backward_ns: float) -> tuple[float, float, float]:
    """Fill each bucket's start / end (one communication stream); (step, comm, exposed) ns."""
    free = 0.0
    for b in buckets:
        b.start_ns = max(forward_ns + b.ready_ns, free)
        b.end_ns = free = b.start_ns + b.comm_ns
    compute = forward_ns + backward_ns
    step = max(compute, free)
    return step, sum(b.comm_ns for b in buckets), step - compute


def split_batch(inputs: tuple, dp: int) -> list[tuple]:
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % dp:
            size = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else "no batch dim"
            raise ShardingError(f"parallel: 'dp' = {dp} must divide the batch; input {i} has batch {size}")
    return [tuple(x.chunk(dp, 0)[r] for x in inputs) for r in range(dp)]


def data_parallel_step(step: TrainStep, inputs: tuple, system: SystemConfig, dp: int, *,
                       target: torch.Tensor | None = None, groups: Any = None,
                       mode: str = "contention") -> DataParallelResult:
    """`groups`: the chips of each data-parallel group (default: the whole system, one group)."""
    if groups is None:
        if dp != system.chips:
            raise ShardingError(f"parallel: 'dp' = {dp} must equal the system's {system.chips} chips "
                                f"({system.topology.spec}) without tp or pp")
        groups = [list(range(dp))]
    shards = split_batch(inputs, dp)
    tshards = split_batch((target,), dp) if target is not None else [(None,)] * dp
    reps = [step.run(*s, target=t[0]) for s, t in zip(shards, tshards)]
    names = list(reps[0].grads)
    sizes = {k: reps[0].grads[k].numel() * reps[0].grads[k].element_size() for k in names}
    grads = mean_grads([r.grads for r in reps], names)
    fwd = max(r.forward_ns for r in reps)
    bwd = max(r.backward_ns for r in reps)
    ready = {k: max(r.grad_ready_ns[k] for r in reps) for k in names}
    buckets = make_buckets(step.model, sizes, ready)
    for b in buckets:
        itemsize = reps[0].grads[b.params[0]].element_size()
        res = group_collective("all_reduce", b.bytes, system, groups, mode=mode, itemsize=itemsize)
        b.comm_ns, b.algorithm = res.time_ns, res.algorithm
    total, comm, exposed = overlap(buckets, fwd, bwd)
    loss = None if reps[0].loss is None else torch.stack([r.loss for r in reps if r.loss is not None]).mean()
    return DataParallelResult(dp, loss, grads, fwd, bwd, buckets, total, comm, exposed, reps)


def mean_grads(grads: list[dict[str, torch.Tensor]], names: list[str]) -> dict[str, torch.Tensor]:
    """The replicas' gradients (one dict each) summed by the all-reduce schedule itself, then
    divided by the replicas."""
    dp = len(grads)
    flat = [np.concatenate([r[k].detach().float().reshape(-1).numpy() for k in names]) for r in grads]
    sched = group_schedule("all_reduce", "ring", np.arange(dp)[None, :], dp, len(flat[0]))
    summed = run_schedule(sched, flat)[0] / dp
    out, off = {}, 0
    for k in names:
        g = grads[0][k]
        out[k] = torch.from_numpy(summed[off:off + g.numel()].copy()).reshape(g.shape).to(g.dtype)
        off += g.numel()
    return out


class DataParallelProgram:
    """`tilecc.compile(model, inputs, system=..., parallel={"dp": N})`: the model and the
    system; each loss's training step compiles on first use (one program for every replica)."""

    def __init__(self, model: nn.Module, system: SystemConfig, dp: int):
        self.model, self.system, self.dp = model, system, dp
        self.steps: dict[str, TrainStep] = {}

    def step(self, inputs: tuple, *, loss: str = "mean", target: torch.Tensor | None = None,
             mode: str = "contention") -> DataParallelResult:
        if loss not in self.steps:
            self.steps[loss] = TrainStep(self.model, target=self.system.chip_targets[0], loss=loss)
        return data_parallel_step(self.steps[loss], inputs, self.system, self.dp, target=target, mode=mode)
