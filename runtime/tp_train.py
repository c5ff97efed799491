"""Training with tensor parallelism (Megatron), optionally replicated for data parallelism:
one step's forward and backward on every chip's simulated NPU, the collectives between
them run on real data over the system's links.

    tr = TensorParallelTrainer(model, (ids,), load_system("ring:2;chip=tiny"), tp=2, loss="mean")
    r = tr.step((ids,))     # r.grads[fqn] (gathered from the shards) == eager autograd's; print(r)
    r.step_ns, r.comm_ns, r.exposed_ns, r.collectives

The model is sharded for training (frontend/tensor_parallel.py, `training=True`: every
column-parallel input carries `grad_all_reduce`, Megatron's "f") and chip 0's copy is
exported and cut at its collectives (frontend/segments.py), as inference does
(runtime/system_compile.py). Each segment becomes one training step (runtime/train_step.py:
its forward and backward graphs through the torch.compile path) with its weights as inputs,
so it compiles once for every chip; the last segment's holds the loss.

Forward: every segment on every chip with that chip's weights; a row-parallel output's
`all_reduce` sums the chips' blocks through the ring schedule (functional) and is timed over
the group on the system (runtime/group_collective.all_reduce_blocks); `grad_all_reduce`
passes its value on. Backward, segments in reverse, every chip seeding its (identical) loss
with 1: a replicated value's gradient is then whole on every chip; `all_reduce`'s backward
is the identity (each input's gradient is the output's), `grad_all_reduce`'s sums the chips'
partial gradients of the column-parallel input (the backward's all-reduce, timed as the
forward's). A sharded weight's gradient is the chip's piece (put back together with
`tensor_parallel.unshard`); a replicated weight's is whole on every chip (chip 0's is
taken). Timing is bulk-synchronous, as runtime/system_run.py: a segment takes its slowest
chip, a collective starts when it ends, so all the tensor-parallel communication is exposed.
A weight's gradient is ready at its segment's backward start (in the reversed timeline) plus
its time in that backward (TrainStep's per-input ready times). A model with dropout p > 0
is refused (the segments come from the graph exported without it).

Data parallelism (`dp` > 1, `inputs` split over the replicas, chip = d x tp + t: a replica's
TP ranks are neighbours): the replicas run in lock step (their TP collectives timed all
groups at once); each TP rank's gradient pieces are then averaged across the replicas by the
all-reduce schedule (data_parallel.py's rule), in buckets (one per decoder layer, one per
other module) started as the backward makes them, over the dp groups [t, tp + t, ...] at
once; the step is data_parallel.overlap's, with forward and backward including their TP
communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from tilecc.frontend.segments import Segment, split_at_collectives
from tilecc.frontend.tensor_parallel import ShardingError, ShardSpec, auto_plan, unshard
from tilecc.runtime.data_parallel import Bucket, make_buckets, mean_grads, overlap, split_batch
from tilecc.runtime.group_collective import all_reduce_blocks, group_collective
from tilecc.runtime.system_compile import export_shards
from tilecc.runtime.train_step import Pending, StepResult, TrainStep
from tilecc.simulator.interconnect.system import SystemConfig


class SegmentFn(nn.Module):
    """A segment as a module of its inputs (weights included); `first`: the output returned
    first (the one a loss reads)."""

    def __init__(self, seg: Segment, first: str | None = None):
        super().__init__()
        self.seg_module = seg.module
        order = list(range(len(seg.outputs)))
        if first is not None:
            order.remove(seg.outputs.index(first))
            order.insert(0, seg.outputs.index(first))
        self.order = order

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = self.seg_module(*args)
        outs = outs if isinstance(outs, tuple | list) else (outs,)
        return tuple(outs[i] for i in self.order)


@dataclass
class TpCollective:
    phase: str  # "forward" | "backward"
    op: str
    value: str
    bytes: int  # per chip
    algorithm: str
    time_ns: float


@dataclass
class TensorParallelResult:
    tp: int
    dp: int
    loss: torch.Tensor | None
    grads: dict[str, torch.Tensor]  # the model's FQN -> gradient (the replicas' mean)
    chip_grads: list[dict[str, torch.Tensor]]  # per TP rank: its copy's FQN -> its piece (replicas' mean)
    forward_ns: float  # compute + TP communication
    backward_ns: float
    compute_ns: float
    tp_comm_ns: float
    collectives: list[TpCollective]
    grad_ready_ns: dict[str, float]  # the model's FQN -> from the backward's start
    buckets: list[Bucket] = field(default_factory=list)  # dp > 1: the gradient all-reduce
    step_ns: float = 0.0
    dp_comm_ns: float = 0.0
    dp_exposed_ns: float = 0.0

    @property
    def comm_ns(self) -> float:
        return self.tp_comm_ns + self.dp_comm_ns

    @property
    def exposed_ns(self) -> float:
        """Communication on the step's critical path: every TP collective (bulk-synchronous)
        and what the DP all-reduce adds after the backward."""
        return self.tp_comm_ns + self.dp_exposed_ns

    @property
    def hidden_share(self) -> float:
        return 1.0 - self.exposed_ns / self.comm_ns if self.comm_ns else 1.0

    def __str__(self) -> str:
        n_f = sum(c.phase == "forward" for c in self.collectives)
        n_b = len(self.collectives) - n_f
        lines = [f"tensor parallel x{self.tp}" + (f" x data parallel x{self.dp}" if self.dp > 1 else "") +
                 f": step {self.step_ns / 1e3:,.1f} us = compute {self.compute_ns / 1e3:,.1f} + exposed "
                 f"communication {self.exposed_ns / 1e3:,.1f} us ({self.exposed_ns / self.step_ns:.1%} of the step); "
                 f"TP all-reduces {n_f} forward + {n_b} backward, {self.tp_comm_ns / 1e3:,.1f} us, all exposed"]
        if self.dp > 1:
            lines.append(f"  gradient all-reduce over the replicas {self.dp_comm_ns / 1e3:,.1f} us, "
                         f"{1 - self.dp_exposed_ns / self.dp_comm_ns if self.dp_comm_ns else 1:.1%} hidden under "
                         f"the backward")
        return "\n".join(lines)


class TensorParallelTrainer:
    """The model sharded for training on `tp` chips (x `dp` replicas), cut into segments,
    each a training step compiled on first use; `inputs`: the example a step is exported
    for (the whole batch: each replica takes 1/dp of it)."""

    def __init__(self, model: nn.Module, inputs: tuple, system: SystemConfig, *, tp: int, dp: int = 1,
                 plan: dict[str, Any] | None = None, loss: str = "mean"):
        if tp * dp != system.chips:
            raise ShardingError(f"parallel: tp x dp = {tp} x {dp} = {tp * dp} must equal the system's "
                                f"{system.chips} chips ({system.topology.spec})")
        if len(set(system.chip_targets)) > 1:
            raise ShardingError("tensor parallelism needs identical chips (system.chip lists different configs)")
        drop = [(n, m.p) for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]
        if drop:
            raise ShardingError(f"{drop[0][0]}: dropout p={drop[0][1]}: training with tensor parallelism runs the "
                                f"graph exported without dropout; set p=0 on the model's dropout layers")
        self.model, self.system, self.tp, self.dp, self.loss = model, system, tp, dp, loss
        shard = split_batch(tuple(inputs), dp)[0]
        plan = auto_plan(model.eval(), False) if plan is None else plan
        sh = export_shards(model, shard, plan, tp, training=True)
        self.graph = split_at_collectives(sh.ep, sh.shared, set(sh.values[0]))
        self.values = [{k: v.mT.contiguous() if k in self.graph.transposed else v for k, v in vals.items()}
                       for vals in sh.values]
        self.user, self.fqn = sh.user, sh.fqn
        self.specs: list[dict[str, ShardSpec]] = [chip.tp_shards for chip in sh.chips]
        for c in self.graph.collectives:
            if c.op not in ("all_reduce", "grad_all_reduce"):
                raise ShardingError(f"training with tensor parallelism: the {c.op} of {c.input} is not supported "
                                    f"(Megatron's all-reduce plan only)")
        segs = self.graph.segments
        out0 = self.graph.outputs[0]
        if out0 not in segs[-1].outputs:
            raise ShardingError(f"training with tensor parallelism: the model's output {out0} is not made by the "
                                f"last segment (a collective ends the model); the loss needs it there")
        chip = system.chip_targets[0]
        self.steps = [TrainStep(SegmentFn(s, out0 if k == len(segs) - 1 else None), target=chip,
                                loss=loss if k == len(segs) - 1 else None) for k, s in enumerate(segs)]
        self.tp_groups = np.arange(system.chips).reshape(dp, tp)

    def step(self, inputs: tuple, *, target: torch.Tensor | None = None,
             mode: str = "contention") -> TensorParallelResult:
        if len(inputs) != len(self.user):
            raise ShardingError(f"the training step takes {len(self.user)} inputs, got {len(inputs)}")
        shards = split_batch(tuple(inputs), self.dp)
        tshards = [t[0] for t in split_batch((target,), self.dp)] if target is not None else [None] * self.dp
        reps = [(d, r) for d in range(self.dp) for r in range(self.tp)]
        env = {(d, r): dict(self.values[r], **dict(zip(self.user, shards[d]))) for d, r in reps}
        diff = set(self.values[0])  # values with a gradient: the weights, and what they make
        pend: dict[tuple[int, int, int], Pending] = {}
        colls: list[TpCollective] = []
        compute = fwd = 0.0
        segs = self.graph.segments
        k = 0
        for st in self.graph.stages:
            if isinstance(st, Segment):
                t = 0.0
                for d, r in reps:
                    args = [env[d, r][n] for n in st.inputs]
                    tgt = tshards[d] if k == len(segs) - 1 and target is not None else None
                    p = self.steps[k].forward(*args, target=tgt, input_grad=[n in diff for n in st.inputs])
                    pend[d, r, k] = p
                    t = max(t, sum(run.time_ns for run in p.forward_runs))
                    if self.steps[k].loss is not None:  # the last: its output is the loss
                        continue
                    for i, o in zip(self.steps[k].module.model.order, p.output):
                        env[d, r][st.outputs[i]] = o.detach()
                        if o.requires_grad:
                            diff.add(st.outputs[i])
                compute, fwd, k = compute + t, fwd + t, k + 1
                continue
            for c in st:
                if c.input in diff:
                    diff.add(c.output)
                if c.op == "grad_all_reduce":  # the forward's identity
                    for d, r in reps:
                        env[d, r][c.output] = env[d, r][c.input]
                    continue
                t = self._all_reduce(env, c.input, c.output, mode, colls, "forward", c.op)
                fwd += t
        bwd, ready, grads, loss = self._backward(pend, reps, mode, colls)
        compute += bwd - sum(c.time_ns for c in colls if c.phase == "backward")
        return self._finish(grads, ready, loss, fwd, bwd, compute, colls, mode)

    def _all_reduce(self, env: dict, src: str, dst: str, mode: str, colls: list[TpCollective], phase: str,
                    op: str) -> float:
        blocks = [[env[d, r][src] for r in range(self.tp)] for d in range(self.dp)]
        outs, res = all_reduce_blocks(blocks, self.system, self.tp_groups, mode=mode)
        for d in range(self.dp):
            for r in range(self.tp):
                env[d, r][dst] = env[d, r][dst] + outs[d][r] if phase == "backward" and dst in env[d, r] \
                    else outs[d][r]
        b = blocks[0][0]
        colls.append(TpCollective(phase, op, src, b.numel() * b.element_size(), res.algorithm, res.time_ns))
        return res.time_ns

    def _backward(self, pend: dict, reps: list[tuple[int, int]], mode: str,
                  colls: list[TpCollective]) -> tuple[float, dict[str, float], dict, Any]:
        """Segments in reverse; (backward ns, weight input name -> ready ns, per (d, r) the
        weight gradients by input name, per replica the loss)."""
        g: dict[tuple[int, int], dict[str, torch.Tensor]] = {rep: {} for rep in reps}
        ready: dict[str, float] = {}
        losses: dict[int, torch.Tensor] = {}
        now = 0.0
        segs = self.graph.segments
        k = len(segs)
        for st in reversed(self.graph.stages):
            if isinstance(st, Segment):
                k -= 1
                t = 0.0
                for d, r in reps:
                    res = self._segment_backward(k, pend[d, r, k], g[d, r], st)
                    if res is None:
                        continue
                    if res.loss is not None and r == 0:
                        losses[d] = res.loss
                    for n, gi, rt in zip(st.inputs, res.input_grads, res.input_grad_ready_ns):
                        if gi is None:
                            continue
                        g[d, r][n] = g[d, r][n] + gi if n in g[d, r] else gi
                        if n in self.values[0] and rt is not None:
                            ready[n] = max(ready.get(n, 0.0), now + rt)
                    t = max(t, res.backward_ns)
                now += t
                continue
            for c in st:
                if c.output not in g[reps[0]]:
                    continue
                if c.op == "all_reduce":  # every input's gradient is the output's
                    for rep in reps:
                        gi = g[rep][c.output]
                        g[rep][c.input] = g[rep][c.input] + gi if c.input in g[rep] else gi
                    continue
                now += self._all_reduce(g, c.output, c.input, mode, colls, "backward", "all_reduce")
        weights = {rep: {n: v for n, v in g[rep].items() if n in self.values[0]} for rep in reps}
        loss = torch.stack([losses[d] for d in sorted(losses)]).mean() if losses else None
        return now, ready, weights, loss

    def _segment_backward(self, k: int, p: Pending, g: dict[str, torch.Tensor], seg: Segment) -> StepResult | None:
        step = self.steps[k]
        if step.loss is not None:
            return step.backward(p)
        order = step.module.model.order
        outs = p.output if isinstance(p.output, tuple) else (p.output,)
        go = [g.get(seg.outputs[i]) if o.requires_grad else None for i, o in zip(order, outs)]
        if all(x is None for x in go):  # nothing later takes a gradient from this segment
            return None
        return step.backward(p, go)

    def _finish(self, grads: dict, ready: dict[str, float], loss: Any, fwd: float, bwd: float, compute: float,
                colls: list[TpCollective], mode: str) -> TensorParallelResult:
        chip_grads = []
        for r in range(self.tp):  # each TP rank's pieces, averaged over the replicas
            per_rep = [{self.fqn[n]: v.mT if n in self.graph.transposed else v for n, v in grads[d, r].items()}
                       for d in range(self.dp)]
            names = [n for n in per_rep[0] if self.specs[r][n].source is not None]
            chip_grads.append(mean_grads(per_rep, names) if self.dp > 1 else {n: per_rep[0][n] for n in names})
        src = {n: self.specs[0][n].source or n for n in chip_grads[0]}
        full = {src[n]: unshard([chip_grads[r][n] for r in range(self.tp)], self.specs[0][n]) for n in chip_grads[0]}
        src_ready = {src[self.fqn[n]]: t for n, t in ready.items() if self.fqn[n] in src}
        res = TensorParallelResult(self.tp, self.dp, loss, full, chip_grads, fwd, bwd, compute,
                                   sum(c.time_ns for c in colls), colls, src_ready)
        res.step_ns = fwd + bwd
        if self.dp > 1:
            self._dp_buckets(res, mode)
        return res

    def _dp_buckets(self, res: TensorParallelResult, mode: str) -> None:
        """The replicas' gradient all-reduce, each TP rank's pieces over its dp group, all at once."""
        piece = {self.specs[0][n].source or n: v for n, v in res.chip_grads[0].items()}
        sizes = {k: v.numel() * v.element_size() for k, v in piece.items()}
        buckets = make_buckets(self.model, sizes, {k: res.grad_ready_ns.get(k, res.backward_ns) for k in sizes})
        dp_groups = self.tp_groups.T  # [t, tp + t, ...] per TP rank
        for b in buckets:
            itemsize = piece[b.params[0]].element_size()
            r = group_collective("all_reduce", b.bytes, self.system, dp_groups, mode=mode, itemsize=itemsize)
            b.comm_ns, b.algorithm = r.time_ns, r.algorithm
        res.step_ns, res.dp_comm_ns, res.dp_exposed_ns = overlap(buckets, res.forward_ns, res.backward_ns)
        res.buckets = buckets
