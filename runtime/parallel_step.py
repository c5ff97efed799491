"""The time of a training step under TP x PP x DP on a chip grid, composed from simulated
parts: each stage's forward and backward per micro-batch (the chips' programs), the
tensor-parallel all-reduces inside it, the pipeline's sends (1F1B, one_f_one_b.py) and the
data-parallel gradient all-reduce overlapped with the last micro-batch's backward.

    grid = ChipGrid(tp=8, pp=8, dp=16)          # chip = (d * pp + p) * tp + t: TP fastest
    t = parallel_step_time(stages, micro_batches=96, system=sys, grid=grid, act_bytes=2048 * 12288 * 2)
    t.step_ns, t.shares()                        # compute, TP comm, PP comm, bubble, DP comm

Placement: a stage's TP ranks are neighbours (chip ids t = 0..tp-1 together, inside one
leaf switch of a fat-tree), the stages of a replica follow, the replicas are outermost
(stride tp x pp). Every TP group, every stage's sends and every DP group run their
collective at the same time as their peers (the groups of a kind are symmetric), so each
kind is timed once, all groups together, on the shared links (group_collective.py):
- TP: every all-reduce of a stage (Megatron: 2 in the forward of a layer, after the
  row-parallel linears; 2 in the backward) is exposed: the forward / backward per
  micro-batch is compute + tp_all_reduces x t_tp (bulk-synchronous, as runtime/system_run.py).
- PP: a micro-batch's activation (and its gradient back) goes from every chip of stage k
  to its TP peer of stage k+1; all boundaries' sends are timed at once (the worst case).
- DP: each stage's buckets (given with their ready offsets in the last backward) are
  all-reduced over the replicas one after another from the time they are ready (the rule
  of data_parallel.overlap), all stages at once on the fabric.
The step ends when the last stage's last bucket is reduced. Its parts, on the critical
stage (the one ending last): compute (M x (F + B) without communication), TP
communication (exposed), the bubble (the 1F1B schedule's idle time with free sends), PP
communication (what the sends add to the schedule) and DP communication (what the gradient
all-reduce adds after the pipeline's end); they sum to the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tilecc.frontend.tensor_parallel import ShardingError
from tilecc.runtime.data_parallel import Bucket, overlap
from tilecc.runtime.group_collective import concurrent_sends, group_collective
from tilecc.runtime.one_f_one_b import PipeOp, one_f_one_b
from tilecc.simulator.interconnect.system import SystemConfig


@dataclass(frozen=True)
class ChipGrid:
    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.dp

    def chip(self, d: int, p: int, t: int) -> int:
        return (d * self.pp + p) * self.tp + t

    def tp_groups(self) -> np.ndarray:
        return np.arange(self.chips).reshape(-1, self.tp)

    def dp_groups(self) -> np.ndarray:
        return np.arange(self.chips).reshape(self.dp, self.pp * self.tp).T

    def pp_pairs(self) -> list[tuple[int, int]]:
        return [(self.chip(d, p, t), self.chip(d, p + 1, t)) for d in range(self.dp) for p in range(self.pp - 1)
                for t in range(self.tp)]

    def check(self, system: SystemConfig) -> None:
        if self.chips != system.chips:
            raise ShardingError(f"parallel: tp x pp x dp = {self.tp} x {self.pp} x {self.dp} = {self.chips} must "
                                f"equal the system's {system.chips} chips ({system.topology.spec})")


@dataclass
class StageCost:
    """One stage (one chip of it: its TP peers run the same stream) per micro-batch."""

    fwd_ns: float  # compute (the simulated programs)
    bwd_ns: float
    tp_fwd: int = 0  # tensor-parallel all-reduces of the activation in the forward
    tp_bwd: int = 0
    buckets: list[Bucket] = field(default_factory=list)  # ready_ns: offset in the last backward
    param_bytes: int = 0


@dataclass
class StepTime:
    step_ns: float
    critical_stage: int
    compute_ns: float
    tp_comm_ns: float
    bubble_ns: float
    pp_comm_ns: float
    dp_comm_ns: float  # exposed
    dp_total_ns: float  # every bucket's all-reduce, hidden or not (the critical stage's)
    t_tp_ns: float
    t_send_ns: float
    ops: list[PipeOp]
    buckets: list[list[Bucket]]
    algorithms: dict[str, str]

    def shares(self) -> dict[str, float]:
        parts = {"compute": self.compute_ns, "tp communication": self.tp_comm_ns, "pipeline bubble": self.bubble_ns,
                 "pp communication": self.pp_comm_ns, "dp communication (exposed)": self.dp_comm_ns}
        return {k: v / self.step_ns for k, v in parts.items()}

    @property
    def bottleneck(self) -> str:
        s = self.shares()
        return max(s, key=lambda k: s[k])


def tp_all_reduce_ns(system: SystemConfig, grid: ChipGrid, act_bytes: int, *, itemsize: int = 2,
                     mode: str = "contention") -> float:
    """One TP all-reduce of the activation, every TP group at once."""
    if grid.tp == 1:
        return 0.0
    return group_collective("all_reduce", act_bytes, system, grid.tp_groups(), mode=mode, itemsize=itemsize).time_ns


def parallel_step_time(stages: list[StageCost], micro_batches: int, system: SystemConfig, grid: ChipGrid,
                       act_bytes: int, *, act_itemsize: int = 2, mode: str = "contention") -> StepTime:
    grid.check(system)
    if len(stages) != grid.pp:
        raise ShardingError(f"parallel: {len(stages)} stage costs for 'pp' = {grid.pp}")
    algos: dict[str, str] = {}
    t_tp = 0.0
    if grid.tp > 1:
        r = group_collective("all_reduce", act_bytes, system, grid.tp_groups(), mode=mode, itemsize=act_itemsize)
        t_tp, algos["tp"] = r.time_ns, r.algorithm
    t_send = concurrent_sends(grid.pp_pairs(), act_bytes, system, mode=mode) if grid.pp > 1 else 0.0
    fwd = [s.fwd_ns + s.tp_fwd * t_tp for s in stages]
    bwd = [s.bwd_ns + s.tp_bwd * t_tp for s in stages]
    sends = [t_send] * (grid.pp - 1)
    ops, _ = one_f_one_b(fwd, bwd, micro_batches, sends, sends)
    free_ops, _ = one_f_one_b(fwd, bwd, micro_batches)
    ends, all_buckets, dp_algo = dp_overlap([s.buckets for s in stages], ops, system, grid, mode=mode)
    if dp_algo:
        algos["dp"] = dp_algo
    k = int(np.argmax(ends))
    step = ends[k]
    pipe_end = max(o.end_ns for o in ops if o.stage == k)
    free_end = max(o.end_ns for o in free_ops if o.stage == k)
    m = micro_batches
    compute = m * (stages[k].fwd_ns + stages[k].bwd_ns)
    tp_comm = m * (stages[k].tp_fwd + stages[k].tp_bwd) * t_tp
    return StepTime(step, k, compute, tp_comm, free_end - compute - tp_comm, pipe_end - free_end, step - pipe_end,
                    sum(b.comm_ns for b in all_buckets[k]), t_tp, t_send, ops, all_buckets, algos)


def dp_overlap(stage_buckets: list[list[Bucket]], ops: list[PipeOp], system: SystemConfig, grid: ChipGrid, *,
               mode: str = "contention", itemsize: int = 2) -> tuple[list[float], list[list[Bucket]], str]:
    """Each stage's buckets (ready_ns: offsets in its last backward of `ops`) all-reduced over
    the replicas one after another from their ready times (data_parallel.overlap), every
    stage's dp groups at once on the fabric: (each stage's end, the timed buckets, the
    algorithm)."""
    dp_times: dict[int, tuple[float, str]] = {}
    ends, all_buckets = [], []
    for k, given in enumerate(stage_buckets):
        last_b = max((o for o in ops if o.stage == k and o.kind == "B"), key=lambda o: o.end_ns)
        stage_end = max(o.end_ns for o in ops if o.stage == k)
        bks = [Bucket(b.name, b.params, b.bytes, b.ready_ns) for b in given]
        for b in bks:
            if grid.dp > 1:
                if b.bytes not in dp_times:
                    r = group_collective("all_reduce", b.bytes, system, grid.dp_groups(), mode=mode,
                                         itemsize=itemsize)
                    dp_times[b.bytes] = (r.time_ns, r.algorithm)
                b.comm_ns, b.algorithm = dp_times[b.bytes]
        end = stage_end
        if bks:  # overlap(): forward_ns = the last backward's start, backward_ns = its length
            end, _, _ = overlap(bks, last_b.start_ns, stage_end - last_b.start_ns)
        ends.append(end)
        all_buckets.append(bks)
    return ends, all_buckets, next(iter(dp_times.values()))[1] if dp_times else ""
