"""A GPT-3-175B-shaped training step on 1,024 simulated chips: TP 8 x PP 8 x DP 16.

    .venv/bin/python benchmarks/cluster.py [--system "fattree:k=32,levels=2;chip=cloud"] [--tp 8 --pp 8 --dp 16]
                                           [--layers 96 --hidden 12288 --heads 96 --seq 2048]
                                           [--global-batch 1536 --micro-batch 1] [--mode contention] [--json]

The model is built on the meta device (weights without values: timing only, as
tilecc.generate's meta models): GPT-3's decoder block (pre-LayerNorm, causal attention, a
4d GELU MLP, bf16) as one tensor-parallel rank holds it (Megatron: q/k/v and fc1
column-parallel, the attention projection and fc2 row-parallel: heads/tp heads, 4d/tp MLP
columns), a vocabulary-parallel embedding (+ learned positions) on the first stage and a
vocabulary-parallel LM head with a log-softmax over its shard on the last (vocabulary
padded to a multiple of 128 x tp, as Megatron). Each part's forward and backward graphs are
compiled through the torch.compile path (runtime/train_step.py) for a `cloud` chip and
simulated; runtime/parallel_step.py composes the step: the TP all-reduces (2 per layer
forward, 2 backward), 1F1B over the pp stages with M = global batch / (dp x micro-batch)
micro-batches and the activation sends, and the DP gradient all-reduce of each layer's
bucket (bf16) over the 16 replicas, overlapped with the last micro-batch's backward; every
collective on the fat-tree with the contention model (runtime/group_collective.py).

The replay rule (what is simulated once and reused):
- identical layers compile once: the 96 blocks are one module shape, so one block's forward
  and backward are compiled and simulated once and stand for every layer of every stage;
- chips that run identical streams are simulated once: every TP rank of a stage and every DP
  replica of it runs the same stream on the same config (the simulator's timing depends on
  the stream and the config, never on the data), so one chip per stage is simulated, and a
  stage's forward / backward is layers x the block's (+ embedding / head);
- the collectives of all groups of a kind run at once and are simulated together on the
  shared links, one chip standing for all where the schedule is symmetric (contention.py).

Not modelled: the optimizer step, the tied embedding / LM-head gradient exchange between the
first and last stage, the vocabulary-parallel cross-entropy's three all-reduces of `seq`
floats, activation recomputation, and memory capacity (a stage's weights, gradients and
Adam state exceed one `cloud` core's 12 GiB HBM: the figure is a timing, not a feasibility).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tilecc.runtime.data_parallel import Bucket  # noqa: E402
from tilecc.runtime.parallel_step import ChipGrid, StageCost, parallel_step_time, tp_all_reduce_ns  # noqa: E402
from tilecc.runtime.train_step import TrainStep  # noqa: E402
from tilecc.simulator.interconnect.system import load_system  # noqa: E402

DTYPE = torch.bfloat16


def _ln(x: torch.Tensor, m: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm written out (mean, variance, scale): the fused layer-norm kernel needs a whole
    12,288-element row and its working buffers in one SRAM partition, which the `cloud`
    core's 224 KiB do not hold; the reductions compile at any width."""
    mu = x.float().mean(-1, keepdim=True)
    xc = x.float() - mu
    return (xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + m.eps)).to(x.dtype) * m.weight + m.bias


class Block(nn.Module):
    """One TP rank's shard of a GPT-3 decoder block."""

    def __init__(self, d: int, heads: int, tp: int):
        super().__init__()
        self.h, self.hd = heads // tp, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d // tp)
        self.proj = nn.Linear(d // tp, d)
        self.fc1 = nn.Linear(d, 4 * d // tp)
        self.fc2 = nn.Linear(4 * d // tp, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(_ln(x, self.ln1)).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.h * self.hd))  # + TP all-reduce
        return x + self.fc2(nn.functional.gelu(self.fc1(_ln(x, self.ln2))))  # + TP all-reduce


class Embed(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.empty(seq, d))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos  # + TP all-reduce (vocabulary-parallel lookup)


class Head(nn.Module):
    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.log_softmax(self.out(_ln(x, self.ln)).float(), -1)


def _bytes(m: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def _time(module: nn.Module, x: torch.Tensor, chip: str, **kw) -> tuple[float, float, float, list]:
    """(forward ns, backward ns, simulate seconds, the NPU programs' reports) of one
    micro-batch through `module`."""
    step = TrainStep(module, target=chip, timing_only=True, loss=kw.pop("loss", None))
    r = step.run(x, **kw)
    reps = [rep for run in r.forward_runs + r.backward_runs for rep in run.reports]
    return r.forward_ns, r.backward_ns, sum(rep.simulate_seconds for rep in reps), reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="fattree:k=32,levels=2;chip=cloud;link=trn2-neuronlink")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=8)
    ap.add_argument("--dp", type=int, default=16)
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--hidden", type=int, default=12288)
    ap.add_argument("--heads", type=int, default=96)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--mode", default="contention", choices=("ideal", "contention"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    t0 = time.perf_counter()
    system = load_system(a.system)
    grid = ChipGrid(a.tp, a.pp, a.dp)
    grid.check(system)
    micro = a.global_batch // (a.dp * a.micro_batch)
    if micro * a.dp * a.micro_batch != a.global_batch or a.layers % a.pp:
        raise SystemExit("--global-batch must be a multiple of dp x micro-batch and --layers of pp")
    target = system.chip_targets[0]
    cfg = system.chip_config(0)
    d, s, mb = a.hidden, a.seq, a.micro_batch
    vocab = -(-a.vocab // (128 * a.tp)) * 128  # per rank, padded as Megatron
    with torch.device("meta"):
        block, embed, head = Block(d, a.heads, a.tp).to(DTYPE), Embed(vocab, s, d).to(DTYPE), Head(vocab, d).to(DTYPE)
    x = torch.empty(mb, s, d, dtype=DTYPE, device="meta")
    ids = torch.zeros(mb, s, dtype=torch.int64, device="meta")
    lf, lb, sim1, block_reps = _time(block, x, target, grad_output=torch.empty_like(x), input_grad=True)
    ef, eb, sim2, _ = _time(embed, ids, target, grad_output=torch.empty_like(x))
    # the loss: the sum of the log-softmax stands for the cross-entropy (its gather of one
    # column per row is negligible); timing CE's own graph on the meta device gives AOTAutograd
    # an empty backward (a torch limit met here), so it is not used
    hf, hb, sim3, _ = _time(head, x, target, loss="sum", input_grad=True)
    t_parts = time.perf_counter() - t0
    act = mb * s * d * 2
    t_tp = tp_all_reduce_ns(system, grid, act, mode=a.mode)
    per = a.layers // a.pp
    stages = []
    for k in range(a.pp):
        f = per * lf + (ef if k == 0 else 0.0) + (hf if k == a.pp - 1 else 0.0)
        b = per * lb + (eb if k == 0 else 0.0) + (hb if k == a.pp - 1 else 0.0)
        buckets, at = [], 0.0
        if k == a.pp - 1:
            at += hb
            buckets.append(Bucket("head", [], _bytes(head), at))
        for j in reversed(range(per)):
            at += lb + 2 * t_tp
            buckets.append(Bucket(f"layer {k * per + j}", [], _bytes(block), at))
        if k == 0:
            at += eb
            buckets.append(Bucket("embedding", [], _bytes(embed), at))
        stages.append(StageCost(f, b, 2 * per + (k == 0), 2 * per, buckets, sum(bk.bytes for bk in buckets)))
    st = parallel_step_time(stages, micro, system, grid, act, mode=a.mode)
    wall = time.perf_counter() - t0

    # the bound: the workload's FLOPs over the 1,024 chips' peak; the bytes each chip must
    # move over its link (one link into the fabric per chip on a fat-tree)
    tokens = a.global_batch * s
    dense = 12 * a.layers * d * d + d * vocab * a.tp
    attn = 2 * a.layers * s * d  # per token: QK^T and AV (causal: half of it needed)
    flops = 6 * tokens * (dense + attn)
    peak = 2 * cfg.matrix.rows * cfg.matrix.cols * cfg.matrix.clock_ghz * 1e9
    compute_bound = flops / (grid.chips * peak)
    n_dp, n_tp = a.dp, a.tp
    tp_bytes = micro * (4 * per + 1) * 2 * (n_tp - 1) / n_tp * act if n_tp > 1 else 0.0
    pp_bytes = 2 * micro * act if a.pp > 1 else 0.0
    dp_bytes = 2 * (n_dp - 1) / n_dp * max(sc.param_bytes for sc in stages) if n_dp > 1 else 0.0
    bw = system.link.bandwidth_gbs * 1e9
    comm_bound = (tp_bytes + pp_bytes + dp_bytes) / bw

    shares = st.shares()
    if a.json:
        print(json.dumps({"step_s": st.step_ns / 1e9, "shares": shares, "bottleneck": st.bottleneck,
                          "compute_bound_s": compute_bound, "comm_bound_s": comm_bound, "wall_s": wall,
                          "layer_fwd_us": lf / 1e3, "layer_bwd_us": lb / 1e3,
                          "block_roofline_ratio": [rep.roofline_ratio for rep in block_reps],
                          "tp_all_reduce_us": t_tp / 1e3,
                          "send_us": st.t_send_ns / 1e3, "algorithms": st.algorithms, "micro_batches": micro}))
        return
    print(f"GPT-3-175B-shaped step: {a.layers} layers, d {d}, {a.heads} heads, seq {s}, global batch "
          f"{a.global_batch} (micro-batch {mb}, {micro} per replica); TP {a.tp} x PP {a.pp} x DP {a.dp} = "
          f"{grid.chips} `{target}` chips on {system.topology.spec}, {system.link.bandwidth_gbs:g} GB/s links, "
          f"{a.mode} mode")
    print(f"one block (one TP rank): forward {lf / 1e3:,.0f} us, backward {lb / 1e3:,.0f} us; embedding "
          f"{ef / 1e3:,.0f} / {eb / 1e3:,.0f} us; head + loss {hf / 1e3:,.0f} / {hb / 1e3:,.0f} us")
    for what, rep in zip(("forward", "backward"), block_reps):
        util = ", ".join(f"{k} {v:.0%}" for k, v in rep.utilization.items())
        print(f"  block {what} program: {rep.roofline_ratio:.1f}x its roofline bound (set by {rep.bottleneck}); "
              f"utilisation {util}")
    print(f"collectives: TP all-reduce of {act / 2**20:.0f} MiB over {a.tp} ({st.algorithms.get('tp', '-')}, all "
          f"{grid.chips // a.tp} groups at once) {t_tp / 1e3:,.1f} us; stage-to-stage send "
          f"{st.t_send_ns / 1e3:,.1f} us; "
          f"DP all-reduce of a layer's {_bytes(block) / 2**20:.0f} MiB over {a.dp} "
          f"({st.algorithms.get('dp', '-')}) {st.buckets[0][0].comm_ns / 1e3:,.1f} us")
    print()
    print("| figure | value |")
    print("| --- | ---: |")
    print(f"| step time (simulated) | {st.step_ns / 1e9:,.2f} s |")
    for k, v in shares.items():
        print(f"| {k} | {v:.1%} |")
    print(f"| bottleneck | {st.bottleneck} (stage {st.critical_stage}) |")
    print(f"| DP all-reduce hidden under the backward | "
          f"{1 - st.dp_comm_ns / st.dp_total_ns if st.dp_total_ns else 1.0:.1%} |")
    print(f"| bound: FLOPs / peak of {grid.chips} chips ({flops:.3g} FLOP / {grid.chips} x {peak / 1e12:.1f} TFLOP/s) "
          f"| {compute_bound:,.2f} s |")
    print(f"| bound: bytes per chip / link bandwidth (TP {tp_bytes / 1e9:,.1f} GB + PP {pp_bytes / 1e9:,.1f} GB + "
          f"DP {dp_bytes / 1e9:,.1f} GB at {bw / 1e9:g} GB/s) | {comm_bound:,.2f} s |")
    print(f"| step / max(bounds) | {st.step_ns / 1e9 / max(compute_bound, comm_bound):.2f}x |")
    print(f"| wall time of this benchmark | {wall:.1f} s (compile + simulate of the parts {t_parts:.1f} s, of which "
          f"simulating {sim1 + sim2 + sim3:.1f} s; the step's composition {wall - t_parts:.1f} s) |")


if __name__ == "__main__":
    main()
