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

Pipeline stages (`pp` > 1, `micro_batches` M; chip = (d x pp + stage) x tp + rank,
parallel_step.ChipGrid): chip 0's copy is also cut at `send_recv` markers before the first
layer of each later stage (tp_pipeline_run.stage_marks), so every segment and TP collective
belongs to a stage; a stage's TP all-reduces run over its own groups. Each micro-batch (per
replica, its own) runs forward and backward through all stages as above (`send_recv` is the
identity both ways); the gradients are the micro-batches' mean (each loss a micro-batch's
mean). Timing: each stage's mean forward and backward per micro-batch (compute + its TP
all-reduces, bulk-synchronous) through the 1F1B schedule (one_f_one_b.py), the values that
cross a stage boundary (made at or before it, used after it) sent by every replica's TP
ranks at once, their gradients sent back; dp > 1: each stage's buckets of TP pieces
all-reduced over the replicas from its last backward (parallel_step.dp_overlap), as
pipeline_train.py. `exposed_ns` is then what all communication adds to the 1F1B schedule
of the compute alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from tilecc.frontend.segments import Segment, split_at_collectives
from tilecc.frontend.tensor_parallel import ShardingError, ShardSpec, auto_plan, shard_specs, unshard
from tilecc.runtime.data_parallel import Bucket, make_buckets, mean_grads, overlap, split_batch
from tilecc.runtime.group_collective import all_reduce_blocks, concurrent_sends, group_collective
from tilecc.runtime.one_f_one_b import PipeOp, one_f_one_b
from tilecc.runtime.parallel_step import ChipGrid, dp_overlap
from tilecc.runtime.pipeline_run import _micro_batches
from tilecc.runtime.system_compile import export_shards
from tilecc.runtime.tp_pipeline_run import stage_marks, stage_numbers
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


def _order(step: TrainStep) -> list[int]:
    """The output order of a segment's training step (its `SegmentFn`)."""
    return cast(SegmentFn, step.module.model).order


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
    pp: int = 1  # pp > 1: forward_ns / backward_ns are one micro-batch's through every stage
    micro_batches: int = 1
    stage_fwd_ns: list[float] = field(default_factory=list)  # pp > 1: per stage, its mean per micro-batch
    stage_bwd_ns: list[float] = field(default_factory=list)
    send_ns: list[float] = field(default_factory=list)  # per stage boundary
    grad_send_ns: list[float] = field(default_factory=list)
    ops: list[PipeOp] = field(default_factory=list)  # the 1F1B timeline
    stage_buckets: list[list[Bucket]] = field(default_factory=list)  # pp > 1, dp > 1: per stage
    pipeline_free_ns: float = 0.0  # pp > 1: the 1F1B schedule of the compute alone (no communication)

    @property
    def comm_ns(self) -> float:
        return self.tp_comm_ns + self.dp_comm_ns

    @property
    def exposed_ns(self) -> float:
        """Communication on the step's critical path: every TP collective (bulk-synchronous)
        and what the DP all-reduce adds after the backward; pp > 1: what all communication
        (TP collectives, sends, DP all-reduce) adds to the 1F1B schedule of the compute alone."""
        if self.pp > 1:
            return self.step_ns - self.pipeline_free_ns
        return self.tp_comm_ns + self.dp_exposed_ns

    @property
    def hidden_share(self) -> float:
        return 1.0 - self.exposed_ns / self.comm_ns if self.comm_ns else 1.0

    def __str__(self) -> str:
        n_f = sum(c.phase == "forward" for c in self.collectives)
        n_b = len(self.collectives) - n_f
        if self.pp > 1:
            return (f"tensor parallel x{self.tp} in {self.pp} pipeline stages (1F1B, {self.micro_batches} "
                    f"micro-batches)" + (f" x data parallel x{self.dp}" if self.dp > 1 else "") +
                    f": step {self.step_ns / 1e3:,.1f} us, the compute alone {self.pipeline_free_ns / 1e3:,.1f} us, "
                    f"communication adds {self.exposed_ns / 1e3:,.1f} us; per micro-batch forward "
                    + ", ".join(f"{t / 1e3:,.1f}" for t in self.stage_fwd_ns) + " us, backward "
                    + ", ".join(f"{t / 1e3:,.1f}" for t in self.stage_bwd_ns) + f" us (with their TP all-reduces, "
                    f"{n_f} forward + {n_b} backward in all, {self.tp_comm_ns / 1e3:,.1f} us)"
                    + (f"; gradient all-reduce over the replicas {self.dp_comm_ns / 1e3:,.1f} us, "
                       f"{self.dp_exposed_ns / 1e3:,.1f} us after the pipeline" if self.dp > 1 else ""))
        lines = [f"tensor parallel x{self.tp}" + (f" x data parallel x{self.dp}" if self.dp > 1 else "") +
                 f": step {self.step_ns / 1e3:,.1f} us = compute {self.compute_ns / 1e3:,.1f} + exposed "
                 f"communication {self.exposed_ns / 1e3:,.1f} us ({self.exposed_ns / self.step_ns:.1%} of the step); "
                 f"TP all-reduces {n_f} forward + {n_b} backward, {self.tp_comm_ns / 1e3:,.1f} us, all exposed"]
        if self.dp > 1:
            lines.append(f"  gradient all-reduce over the replicas {self.dp_comm_ns / 1e3:,.1f} us, "
                         f"{1 - self.dp_exposed_ns / self.dp_comm_ns if self.dp_comm_ns else 1:.1%} hidden under "
                         f"the backward")
        return "\n".join(lines)


@dataclass
class _MicroRun:
    fwd: list[float]  # per stage: compute + TP collectives
    bwd: list[float]
    fwd_comm: list[float]  # per stage: its TP collectives among fwd
    bwd_comm: list[float]
    compute: float
    ready: dict[str, tuple[int, float]]  # weight input -> (its stage, ready ns in that stage's backward)
    grads: dict[tuple[int, int], dict[str, torch.Tensor]]  # per (replica, TP rank)
    loss: torch.Tensor | None
    sizes: dict[str, tuple[int, bool]]  # value -> (bytes, takes a gradient)


class TensorParallelTrainer:
    """The model sharded for training on `tp` chips (x `dp` replicas), cut into segments,
    each a training step compiled on first use; `inputs`: the example a step is exported
    for (the whole batch: each replica takes 1/dp of it)."""

    def __init__(self, model: nn.Module, inputs: tuple, system: SystemConfig, *, tp: int, dp: int = 1,
                 pp: int = 1, micro_batches: int = 1, plan: dict[str, Any] | None = None, loss: str = "mean"):
        if pp == 1 and tp * dp != system.chips:
            raise ShardingError(f"parallel: tp x dp = {tp} x {dp} = {tp * dp} must equal the system's "
                                f"{system.chips} chips ({system.topology.spec})")
        self.grid = ChipGrid(tp, pp, dp)
        self.grid.check(system)
        if len(set(system.chip_targets)) > 1:
            raise ShardingError("tensor parallelism needs identical chips (system.chip lists different configs)")
        drop = [(n, m.p) for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]
        if drop:
            raise ShardingError(f"{drop[0][0]}: dropout p={drop[0][1]}: training with tensor parallelism runs the "
                                f"graph exported without dropout; set p=0 on the model's dropout layers")
        self.model, self.system, self.tp, self.dp, self.loss = model, system, tp, dp, loss
        self.pp, self.micro_batches = pp, micro_batches
        shard = _micro_batches(split_batch(tuple(inputs), dp)[0], micro_batches)[0]
        plan = auto_plan(model.eval(), False) if plan is None else plan
        sh = export_shards(model, shard, plan, tp, training=True, mark=stage_marks(model, pp))
        self.graph = split_at_collectives(sh.ep, sh.shared, set(sh.values[0]))
        self.stage_of = stage_numbers(self.graph)
        self.values = [{k: v.mT.contiguous() if k in self.graph.transposed else v for k, v in vals.items()}
                       for vals in sh.values]
        self.user, self.fqn = sh.user, sh.fqn
        self.specs: list[dict[str, ShardSpec]] = [shard_specs(chip) for chip in sh.chips]
        for c in self.graph.collectives:
            if c.op not in ("all_reduce", "grad_all_reduce", "send_recv"):
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
        # per pipeline stage, every replica's TP group of it: [[chip(d, k, 0..tp-1)] per d]
        self.tp_groups = [np.array([[self.grid.chip(d, k, r) for r in range(tp)] for d in range(dp)])
                          for k in range(pp)]

    def step(self, inputs: tuple, *, target: torch.Tensor | None = None,
             mode: str = "contention") -> TensorParallelResult:
        if len(inputs) != len(self.user):
            raise ShardingError(f"the training step takes {len(self.user)} inputs, got {len(inputs)}")
        m_count = self.micro_batches
        shards = [_micro_batches(sh, m_count) for sh in split_batch(tuple(inputs), self.dp)]
        tshards = ([_micro_batches(t, m_count) for t in split_batch((target,), self.dp)] if target is not None
                   else [[(None,)] * m_count] * self.dp)
        colls: list[TpCollective] = []
        runs = [self._micro_step([shards[d][m] for d in range(self.dp)], [tshards[d][m][0] for d in range(self.dp)],
                                 mode, colls) for m in range(m_count)]
        grads = {rep: {n: sum(r.grads[rep][n] for r in runs) / m_count for n in runs[0].grads[rep]}
                 for rep in runs[0].grads}
        losses = [r.loss for r in runs if r.loss is not None]
        loss = torch.stack(losses).mean() if losses else None
        if self.pp == 1:
            run = runs[0]
            ready = {n: t for n, (_, t) in run.ready.items()}
            return self._finish(grads, ready, loss, run.fwd[0], run.bwd[0], run.compute, colls, mode)
        return self._finish_pipeline(grads, runs, loss, colls, mode)

    def _micro_step(self, shards: list[tuple], targets: list[torch.Tensor | None], mode: str,
                    colls: list[TpCollective]) -> _MicroRun:
        """One micro-batch (per replica, its own) forward and backward through every stage."""
        reps = [(d, r) for d in range(self.dp) for r in range(self.tp)]
        env = {(d, r): dict(self.values[r], **dict(zip(self.user, shards[d]))) for d, r in reps}
        diff = set(self.values[0])  # values with a gradient: the weights, and what they make
        pend: dict[tuple[int, int, int], Pending] = {}
        fwd = [0.0] * self.pp
        comm = [0.0] * self.pp  # the TP collectives, forward and backward
        compute = 0.0
        segs = self.graph.segments
        k = 0
        for st, stage in zip(self.graph.stages, self.stage_of):
            if isinstance(st, Segment):
                t = 0.0
                for d, r in reps:
                    args = [env[d, r][n] for n in st.inputs]
                    tgt = targets[d] if k == len(segs) - 1 else None
                    p = self.steps[k].forward(*args, target=tgt, input_grad=[n in diff for n in st.inputs])
                    pend[d, r, k] = p
                    t = max(t, sum(run.time_ns for run in p.forward_runs))
                    if self.steps[k].loss is not None:  # the last: its output is the loss
                        continue
                    for i, o in zip(_order(self.steps[k]), p.output):
                        env[d, r][st.outputs[i]] = o.detach()
                        if o.requires_grad:
                            diff.add(st.outputs[i])
                compute, fwd[stage], k = compute + t, fwd[stage] + t, k + 1
                continue
            for c in st:
                if c.input in diff:
                    diff.add(c.output)
                if c.op in ("grad_all_reduce", "send_recv"):  # the forward's identity (a send: timed by 1F1B)
                    for d, r in reps:
                        env[d, r][c.output] = env[d, r][c.input]
                    continue
                t_c = self._all_reduce(env, c.input, c.output, mode, colls, "forward", c.op, stage)
                fwd[stage] += t_c
                comm[stage] += t_c
        sizes = {n: (v.numel() * v.element_size(), n in diff) for n, v in env[0, 0].items()}
        bwd, bwd_comm, ready, grads, loss = self._backward(pend, reps, mode, colls)
        return _MicroRun(fwd, bwd, comm, bwd_comm, compute + sum(bwd) - sum(bwd_comm), ready, grads, loss, sizes)

    def _all_reduce(self, env: dict, src: str, dst: str, mode: str, colls: list[TpCollective], phase: str,
                    op: str, stage: int) -> float:
        blocks = [[env[d, r][src] for r in range(self.tp)] for d in range(self.dp)]
        outs, res = all_reduce_blocks(blocks, self.system, self.tp_groups[stage], mode=mode)
        for d in range(self.dp):
            for r in range(self.tp):
                env[d, r][dst] = env[d, r][dst] + outs[d][r] if phase == "backward" and dst in env[d, r] \
                    else outs[d][r]
        b = blocks[0][0]
        colls.append(TpCollective(phase, op, src, b.numel() * b.element_size(), res.algorithm, res.time_ns))
        return res.time_ns

    def _backward(self, pend: dict, reps: list[tuple[int, int]], mode: str,
                  colls: list[TpCollective]) -> tuple[list[float], list[float], dict[str, tuple[int, float]],
                                                      dict, Any]:
        """Segments in reverse; (per stage its backward ns, and its TP collectives' ns,
        weight input name -> (its stage, ready ns from that stage's backward start), per (d, r)
        the weight gradients by input name, the replicas' mean loss)."""
        g: dict[tuple[int, int], dict[str, torch.Tensor]] = {rep: {} for rep in reps}
        ready: dict[str, tuple[int, float]] = {}
        losses: dict[int, torch.Tensor] = {}
        bwd = [0.0] * self.pp
        comm = [0.0] * self.pp
        segs = self.graph.segments
        k = len(segs)
        for st, stage in reversed(list(zip(self.graph.stages, self.stage_of))):
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
                        if n in self.values[0] and rt is not None:  # a weight of two stages: the first's
                            prev = ready.get(n)
                            at = bwd[stage] + rt
                            ready[n] = (stage, max(prev[1], at) if prev is not None and prev[0] == stage else at)
                    t = max(t, res.backward_ns)
                bwd[stage] += t
                continue
            for c in st:
                if c.output not in g[reps[0]]:
                    continue
                if c.op in ("all_reduce", "send_recv"):  # every input's gradient is the output's
                    for rep in reps:
                        gi = g[rep][c.output]
                        g[rep][c.input] = g[rep][c.input] + gi if c.input in g[rep] else gi
                    continue
                t_c = self._all_reduce(g, c.output, c.input, mode, colls, "backward", "all_reduce", stage)
                bwd[stage] += t_c
                comm[stage] += t_c
        weights = {rep: {n: v for n, v in g[rep].items() if n in self.values[0]} for rep in reps}
        loss = torch.stack([losses[d] for d in sorted(losses)]).mean() if losses else None
        return bwd, comm, ready, weights, loss

    def _segment_backward(self, k: int, p: Pending, g: dict[str, torch.Tensor], seg: Segment) -> StepResult | None:
        step = self.steps[k]
        if step.loss is not None:
            return step.backward(p)
        order = _order(step)
        outs = p.output if isinstance(p.output, tuple) else (p.output,)
        go = [g.get(seg.outputs[i]) if o.requires_grad else None for i, o in zip(order, outs)]
        if all(x is None for x in go):  # nothing later takes a gradient from this segment
            return None
        return step.backward(p, go)

    def _gather(self, grads: dict) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor], dict[str, str]]:
        """(each TP rank's pieces averaged over the replicas, the whole gradients by the model's
        FQN, rank 0's copy's FQN -> the model's)."""
        chip_grads = []
        for r in range(self.tp):
            per_rep = [{self.fqn[n]: v.mT if n in self.graph.transposed else v for n, v in grads[d, r].items()}
                       for d in range(self.dp)]
            names = [n for n in per_rep[0] if self.specs[r][n].source is not None]
            chip_grads.append(mean_grads(per_rep, names) if self.dp > 1 else {n: per_rep[0][n] for n in names})
        src = {n: self.specs[0][n].source or n for n in chip_grads[0]}
        full = {src[n]: unshard([chip_grads[r][n] for r in range(self.tp)], self.specs[0][n]) for n in chip_grads[0]}
        return chip_grads, full, src

    def _finish(self, grads: dict, ready: dict[str, float], loss: Any, fwd: float, bwd: float, compute: float,
                colls: list[TpCollective], mode: str) -> TensorParallelResult:
        chip_grads, full, src = self._gather(grads)
        src_ready = {src[self.fqn[n]]: t for n, t in ready.items() if self.fqn[n] in src}
        res = TensorParallelResult(self.tp, self.dp, loss, full, chip_grads, fwd, bwd, compute,
                                   sum(c.time_ns for c in colls), colls, src_ready)
        res.step_ns = fwd + bwd
        if self.dp > 1:
            self._dp_buckets(res, mode)
        return res

    def _finish_pipeline(self, grads: dict, runs: list[_MicroRun], loss: Any, colls: list[TpCollective],
                         mode: str) -> TensorParallelResult:
        """The stages' mean times per micro-batch (each with its TP collectives) through 1F1B,
        the sends between stages timed for every replica's TP ranks at once; dp > 1: each
        stage's buckets from its last backward (parallel_step.dp_overlap)."""
        m, pp = self.micro_batches, self.pp
        f = [sum(r.fwd[k] for r in runs) / m for k in range(pp)]
        b = [sum(r.bwd[k] for r in runs) / m for k in range(pp)]
        send, gsend = self._sends(runs[0].sizes, mode)
        ops, total = one_f_one_b(f, b, m, send, gsend)
        # no communication at all (TP collectives, sends): the schedule of the compute alone
        _, free = one_f_one_b([sum(r.fwd[k] - r.fwd_comm[k] for r in runs) / m for k in range(pp)],
                              [sum(r.bwd[k] - r.bwd_comm[k] for r in runs) / m for k in range(pp)], m)
        chip_grads, full, src = self._gather(grads)
        ready = {src[self.fqn[n]]: sk for n, sk in runs[-1].ready.items() if self.fqn[n] in src}
        res = TensorParallelResult(self.tp, self.dp, loss, full, chip_grads, sum(f), sum(b),
                                   sum(r.compute for r in runs), sum(c.time_ns for c in colls), colls,
                                   {n: t for n, (_, t) in ready.items()}, pp=pp, micro_batches=m, stage_fwd_ns=f,
                                   stage_bwd_ns=b, send_ns=send, grad_send_ns=gsend, ops=ops)
        res.step_ns = total
        res.pipeline_free_ns = free
        if self.dp == 1:
            return res
        piece = {self.specs[0][n].source or n: v for n, v in chip_grads[0].items()}
        sizes = {k: v.numel() * v.element_size() for k, v in piece.items()}
        stage_buckets = [make_buckets(self.model, {n: sizes[n] for n in sizes if ready[n][0] == k},
                                      {n: t for n, (s, t) in ready.items() if s == k}) for k in range(pp)]
        itemsize = next(iter(piece.values())).element_size()
        ends, res.stage_buckets, _ = dp_overlap(stage_buckets, ops, self.system, self.grid, mode=mode,
                                                itemsize=itemsize)
        crit = max(range(pp), key=lambda k: ends[k])
        res.step_ns = ends[crit]
        res.buckets = res.stage_buckets[crit]
        res.dp_comm_ns = sum(bk.comm_ns for bk in res.buckets)
        res.dp_exposed_ns = res.step_ns - total
        return res

    def _sends(self, sizes: dict[str, tuple[int, bool]], mode: str) -> tuple[list[float], list[float]]:
        """Per stage boundary k -> k + 1: the values made at stage k or before and used after
        it, sent by every replica's TP ranks at once one value after another (the gradients of
        those that take one sent back)."""
        made: dict[str, int] = {}
        used: dict[str, int] = {}
        for st, k in zip(self.graph.stages, self.stage_of):
            for n in st.outputs if isinstance(st, Segment) else [c.output for c in st]:
                made.setdefault(n, k)
            for n in st.inputs if isinstance(st, Segment) else [c.input for c in st]:
                used[n] = max(used.get(n, k), k)
        send, gsend = [], []
        for k in range(self.pp - 1):
            pairs = [(self.grid.chip(d, k, r), self.grid.chip(d, k + 1, r)) for d in range(self.dp)
                     for r in range(self.tp)]
            back = [(q, p) for p, q in pairs]
            crossing = [n for n, s in made.items() if s <= k < used.get(n, -1)]
            send.append(sum(concurrent_sends(pairs, sizes[n][0], self.system, mode=mode) for n in crossing))
            gsend.append(sum(concurrent_sends(back, sizes[n][0], self.system, mode=mode) for n in crossing
                             if sizes[n][1]))
        return send, gsend

    def _dp_buckets(self, res: TensorParallelResult, mode: str) -> None:
        """The replicas' gradient all-reduce, each TP rank's pieces over its dp group, all at once."""
        piece = {self.specs[0][n].source or n: v for n, v in res.chip_grads[0].items()}
        sizes = {k: v.numel() * v.element_size() for k, v in piece.items()}
        buckets = make_buckets(self.model, sizes, {k: res.grad_ready_ns.get(k, res.backward_ns) for k in sizes})
        dp_groups = self.grid.dp_groups()  # [t, tp + t, ...] per TP rank
        for b in buckets:
            itemsize = piece[b.params[0]].element_size()
            r = group_collective("all_reduce", b.bytes, self.system, dp_groups, mode=mode, itemsize=itemsize)
            b.comm_ns, b.algorithm = r.time_ns, r.algorithm
        res.step_ns, res.dp_comm_ns, res.dp_exposed_ns = overlap(buckets, res.forward_ns, res.backward_ns)
        res.buckets = buckets
