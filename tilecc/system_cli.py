"""`tilecc run FILE.py:FACTORY --system SPEC (--tp N [--sp] [--collectives stream [--chunks C] [--algorithm A]] |
--pp N [--micro-batches M] [--collectives stream [--chunks C]] | --dp N)`:
a model on many simulated chips, compared with eager.

    tilecc run examples/llama_tp.py:llama --system "ring:4;link=nvlink4" --tp 4 --sp --trace run.json

`--system` takes the short form (`ring:4;chip=edge;bandwidth_gbs=100`, docs/system.md) or a
TOML file with a `[system]` table; `--target` is every chip's config unless the system names
one. Prints whether the output matches eager, then the system report (per chip, per link,
the communication's share: runtime/system_report.py); `--json` prints it as one object.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--system", help="many chips: a system spec (ring:4, torus:2x4, switch:8, a .toml file)")
    run.add_argument("--tp", type=int, default=1, help="with --system: tensor-parallel chips")
    run.add_argument("--sp", action="store_true", help="with --tp: sequence parallelism around the norms")
    run.add_argument("--collectives", choices=("between", "stream"), default="between",
                     help="with --tp or --pp: collectives (a pipeline's sends) between the chips' programs "
                          "(bulk-synchronous), or in the instruction streams (on link DMA queues, every chip "
                          "co-simulated)")
    run.add_argument("--chunks", type=int, default=4, help="with --collectives stream: chunks per ring block")
    run.add_argument("--algorithm", choices=("ring", "halving_doubling", "tree", "ring2d", "auto"), default="ring",
                     help="with --collectives stream: how the collectives are lowered (auto: the least alpha-beta "
                          "time on the topology)")
    run.add_argument("--pp", type=int, default=1, help="with --system: pipeline stages (one chip each)")
    run.add_argument("--micro-batches", type=int, default=1, help="with --pp: micro-batches the batch is cut into")
    run.add_argument("--dp", type=int, default=1,
                     help="with --system: data-parallel replicas (alone, or of --tp or --pp groups); runs a "
                          "training step (the loss: the output's mean) and compares its gradients with eager autograd")
    run.add_argument("--train", action="store_true",
                     help="with --system: one training step (the loss: the output's mean) under --tp / --pp / --dp "
                          "in any combination, its gradients compared with eager autograd (implied by --dp)")
    run.add_argument("--timing-only", action="store_true",
                     help="with --tp: no data moves, chip 0 is simulated for its identical peers (not compared "
                          "with eager)")


def wants_system(args: argparse.Namespace) -> bool:
    return (bool(args.system) or args.tp != 1 or args.dp != 1 or args.pp != 1 or args.sp or args.micro_batches != 1
            or args.timing_only or args.collectives != "between" or args.train)


def cmd_run_system(args: argparse.Namespace, load_factory: Any, run_eager: Any) -> int:
    import torch

    import tilecc
    from tilecc.errors import TileccError
    from tilecc.runtime.compare import compare
    from tilecc.simulator import progress

    if not args.system:
        raise TileccError("--tp / --pp / --dp / --sp / --micro-batches / --timing-only / --train need --system "
                          "(e.g. --system ring:4)")
    if args.dp != 1 or args.train:
        for flag in ("sp", "timing_only"):
            if getattr(args, flag):
                raise TileccError(f"--{flag.replace('_', '-')} is not supported with a training step "
                                  f"(--train, --dp)")
        if args.collectives != "between":
            raise TileccError("--collectives stream is not supported with a training step (--train, --dp)")
        return _run_training(args, load_factory)
    for flag in ("save", "autotune"):
        if getattr(args, flag, None):
            raise TileccError(f"--{flag} is not supported with --system")
    model, inputs = load_factory(args.source)
    expected = None if args.timing_only else run_eager(model, inputs)
    parallel: dict[str, Any] = {"tp": args.tp, "sp": args.sp} if args.pp == 1 else \
        {"pp": args.pp, "micro_batches": args.micro_batches}
    if args.tp != 1 and args.pp != 1:
        parallel = {"tp": args.tp, "pp": args.pp}
    if args.collectives != "between":
        parallel.update(collectives=args.collectives, chunks=args.chunks)
        if args.collectives == "stream" and (args.pp == 1 or args.algorithm != "ring"):  # a pipeline's sends: none
            parallel.update(algorithm=args.algorithm)
    progress.report("export")
    t0 = time.perf_counter()
    sm = tilecc.compile(model, inputs, target=args.target, system=args.system, parallel=parallel,
                        opt_level=args.opt_level, cache=False if args.no_cache else None)
    compile_seconds = time.perf_counter() - t0
    sm.sanitize = not args.no_sanitize
    t1 = time.perf_counter()
    out = sm.run(*inputs, trace=args.trace, timing_only=args.timing_only)
    simulate_seconds = time.perf_counter() - t1
    outputs = list(out) if isinstance(out, tuple) else [out]
    ok, worst = True, math.nan
    if expected is not None:
        if len(outputs) != len(expected):
            raise TileccError(f"{args.source}: the system program has {len(outputs)} output(s), "
                              f"eager {len(expected)}")
        ok, worst = compare(outputs, [torch.as_tensor(r) for r in expected])
    report = sm.report
    assert report is not None
    if args.json:
        d = report.to_dict()
        d.update(allclose=ok if expected is not None else None, max_abs_error=worst if math.isfinite(worst) else None,
                 compile_seconds=compile_seconds, simulate_seconds=simulate_seconds, source=args.source,
                 parallel=parallel)
        print(json.dumps(d, sort_keys=True, default=str))
    else:
        print(f"model             {args.source}")
        print(f"compile           {compile_seconds:.2f} s, simulate {simulate_seconds:.2f} s")
        if expected is None:
            print("matches eager     not checked (timing only: chip 0 simulated for its identical peers)")
        else:
            print(f"matches eager     {'yes' if ok else 'NO'} (max abs error {worst:.3g})")
        print(report)
        if args.trace:
            print(f"trace             {args.trace} (open in ui.perfetto.dev)")
    return 0 if ok else 1


def _run_training(args: argparse.Namespace, load_factory: Any) -> int:
    """`--train` or `--dp N` (with any of `--tp T`, `--pp P [--micro-batches M]`): one
    training step, its gradients against eager autograd's."""
    import copy

    import tilecc
    from tilecc.runtime.compare import compare

    parallel: dict[str, Any] = {"dp": args.dp} if args.dp != 1 else {}
    if args.tp != 1:
        parallel["tp"] = args.tp
    if args.pp != 1:
        parallel.update(pp=args.pp, micro_batches=args.micro_batches)
    model, inputs = load_factory(args.source)
    ref = copy.deepcopy(model).train()
    out = ref(*inputs)
    out = out[0] if isinstance(out, tuple | list) else out
    out.float().mean().backward()
    t0 = time.perf_counter()
    sm = tilecc.compile(model, inputs, target=args.target, system=args.system, parallel=parallel)
    r = sm.train(*inputs, loss="mean")
    seconds = time.perf_counter() - t0
    names = [k for k, p in ref.named_parameters() if p.grad is not None]
    ok, worst = compare([r.grads[k] for k in names], [dict(ref.named_parameters())[k].grad for k in names])
    if args.json:
        d = {"source": args.source, "parallel": parallel, "dp": args.dp, "allclose": ok, "max_abs_error": worst,
             "step_us": r.step_ns / 1e3, "seconds": seconds}
        for k in ("forward", "backward", "comm"):  # a pipeline's step has per-stage figures instead
            if hasattr(r, f"{k}_ns"):
                d[f"{k}_us"] = getattr(r, f"{k}_ns") / 1e3
        if hasattr(r, "exposed_ns"):
            d.update(exposed_comm_us=r.exposed_ns / 1e3, hidden_share=r.hidden_share)
        print(json.dumps(d, sort_keys=True))
    else:
        print(f"model             {args.source}")
        print(f"compile + run     {seconds:.2f} s")
        print(f"gradients = eager {'yes' if ok else 'NO'} (max abs error {worst:.3g}, {len(names)} parameters)")
        print(r)
    return 0 if ok else 1
