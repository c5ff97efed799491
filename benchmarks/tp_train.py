"""A training step of a Llama decoder with tensor parallelism (and dp x tp, dp x pp) on
simulated chips: step time, communication and its exposed share.

    .venv/bin/python benchmarks/tp_train.py [--target tiny] [--link nvlink4] [--tp 2,4]
                                            [--seq 32] [--batch 2] [--combined]

The model is examples/llama_tp.py's (2 layers, hidden 256, 16 heads, 8 key / value heads,
MLP 512) at `--seq` tokens x `--batch` sequences, the loss the mean of its output. Two
one-chip baselines: the training step of the whole graph (runtime/train_step.py) and
runtime/tp_train.py's own path with tp=1 (the model cut at the same points, weights read
by linears laid out as W^T by the host; run as dp 2 replicas of the doubled batch on
ring:2, its compute alone: one chip's full-batch step); the speed-up is against the
latter. tp>1 runs runtime/tp_train.py on `ring:<tp>` with `--link` links (nvlink4: 450
GB/s per direction). `--combined` adds dp 2 x
tp 2 and dp 2 x pp 2 (2 micro-batches) on ring:4. Every loss and gradient is checked
against eager autograd (a row says `grads = eager: yes`).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

from tilecc.runtime.pipeline_train import pipeline_train_step  # noqa: E402
from tilecc.runtime.tp_train import TensorParallelTrainer  # noqa: E402
from tilecc.runtime.train_step import TrainStep  # noqa: E402
from tilecc.simulator.interconnect.system import load_system  # noqa: E402


def _eager(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    ref = copy.deepcopy(model).train()
    ref(ids).float().mean().backward()
    return {k: p.grad for k, p in ref.named_parameters() if p.grad is not None}


def _same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return set(got) == set(want) and all(torch.allclose(got[k], want[k], rtol=1e-4, atol=1e-5) for k in want)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny")
    ap.add_argument("--link", default="nvlink4")
    ap.add_argument("--tp", default="2,4")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--combined", action="store_true")
    args = ap.parse_args()
    from llama_tp import build

    model, (ids,) = build(seq=args.seq, batch=args.batch)
    want = _eager(model, ids)
    print("| parallel | system | step us | speed-up | comm us | exposed us | exposed share | grads = eager | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    t0 = time.perf_counter()
    one = TrainStep(model, target=args.target, loss="mean").run(ids)
    whole = one.forward_ns + one.backward_ns
    t1 = time.perf_counter()
    seg = TensorParallelTrainer(model, (torch.cat([ids, ids]),), load_system(f"ring:2;chip={args.target}"), tp=1,
                                dp=2).step((torch.cat([ids, ids]),))
    base = seg.compute_ns
    print(f"| 1 chip, whole graph | - | {whole / 1e3:,.1f} | {base / whole:.2f}x | 0 | 0 | 0 % | "
          f"{'yes' if _same(one.grads, want) else 'NO'} | {t1 - t0:.1f} |")
    print(f"| 1 chip, segmented | - | {base / 1e3:,.1f} | 1.00x | 0 | 0 | 0 % | "
          f"{'yes' if _same(seg.grads, want) else 'NO'} | {time.perf_counter() - t1:.1f} |")
    for tp in [int(x) for x in args.tp.split(",") if int(x) > 1]:
        t0 = time.perf_counter()
        system = f"ring:{tp};link={args.link}"
        r = TensorParallelTrainer(model, (ids,), load_system(f"{system};chip={args.target}"), tp=tp).step((ids,))
        step, comm, exposed = r.step_ns, r.comm_ns, r.exposed_ns
        print(f"| tp {tp} | {system} | {step / 1e3:,.1f} | {base / step:.2f}x | {comm / 1e3:,.1f} | "
              f"{exposed / 1e3:,.1f} | {exposed / step:.1%} | {'yes' if _same(r.grads, want) else 'NO'} | "
              f"{time.perf_counter() - t0:.1f} |")
    if not args.combined:
        return
    system = f"ring:4;link={args.link}"
    cfg = load_system(f"{system};chip={args.target}")
    t0 = time.perf_counter()
    r = TensorParallelTrainer(model, (ids,), cfg, tp=2, dp=2).step((ids,))
    print(f"| dp 2 x tp 2 | {system} | {r.step_ns / 1e3:,.1f} | {base / r.step_ns:.2f}x | {r.comm_ns / 1e3:,.1f} | "
          f"{r.exposed_ns / 1e3:,.1f} | {r.exposed_ns / r.step_ns:.1%} | {'yes' if _same(r.grads, want) else 'NO'} | "
          f"{time.perf_counter() - t0:.1f} |")
    t0 = time.perf_counter()
    p = pipeline_train_step(model, (ids,), cfg, pp=2, micro_batches=args.batch // 2, dp=2)
    comm = p.dp_comm_ns + sum(p.send_ns) + sum(p.grad_send_ns)
    exposed = p.exposed_comm_ns + p.dp_exposed_ns
    print(f"| dp 2 x pp 2 (M={args.batch // 2}) | {system} | {p.step_ns / 1e3:,.1f} | {base / p.step_ns:.2f}x | "
          f"{comm / 1e3:,.1f} | {exposed / 1e3:,.1f} | {exposed / p.step_ns:.1%} | "
          f"{'yes' if _same(p.grads, want) else 'NO'} | {time.perf_counter() - t0:.1f} |")


if __name__ == "__main__":
    main()
