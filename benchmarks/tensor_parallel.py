"""Tensor parallelism of a Llama decoder on 1-8 simulated chips: time and speed-up.

    .venv/bin/python benchmarks/tensor_parallel.py [--target tiny] [--link nvlink4] [--tp 1,2,4,8]
                                                   [--seq 64] [--sp] [--quick] [--pipeline]
                                                   [--stream] [--chunks 4] [--algorithms]

The model is examples/llama_tp.py's (2 layers, hidden 256, 16 heads, 8 key / value heads,
MLP 512) at `--seq` tokens; every chip is a `--target` chip, the links the `--link` preset
(default nvlink4: 450 GB/s per direction, NVLink-4-like). tp=1 is the ordinary single-chip
compile (`tilecc.compile`); tp>1 compiles each chip's segments once and runs the system on
a ring and on a switch (the same programs: only the interconnect differs). Columns: the
simulated time, the speed-up over tp=1, the communication time and its share (all exposed:
collectives run between segments), the bytes on all links, whether the output equals
eager's, and the compile and simulation wall times. Every output is checked against eager.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

import tilecc  # noqa: E402
from tilecc.runtime.system_compile import compile_system  # noqa: E402
from tilecc.runtime.system_report import system_report  # noqa: E402
from tilecc.runtime.system_run import run_system  # noqa: E402
from tilecc.simulator.interconnect.system import load_system  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny")
    ap.add_argument("--link", default="nvlink4", help="a link preset (docs/system.md)")
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--sp", action="store_true", help="sequence parallelism around the norms")
    ap.add_argument("--quick", action="store_true", help="tp 1,2 and 16 tokens (a smoke run)")
    ap.add_argument("--stream", action="store_true",
                    help="also the table of the collectives in the instruction streams against between programs")
    ap.add_argument("--chunks", type=int, default=4, help="--stream: chunks per ring block")
    ap.add_argument("--algorithms", action="store_true",
                    help="also the table of the in-stream collective algorithms (one row per algorithm)")
    ap.add_argument("--pipeline", action="store_true",
                    help="also the pipeline table: pp=2 on a ring, micro-batches 1 / 2 / 4 of a batch of 4")
    args = ap.parse_args()
    from llama_tp import build

    tps = [1, 2] if args.quick else [int(t) for t in args.tp.split(",")]
    model, (ids,) = build(seq=16 if args.quick else args.seq)
    with torch.no_grad():
        ref = model(ids)
    print(f"Llama decoder (2 layers, hidden 256, 16 heads / 8 kv heads), {ids.shape[1]} tokens, "
          f"{args.target} chips, links {args.link}{', sp' if args.sp else ''}")
    print(f"{'tp':>3} {'system':>10} {'time us':>10} {'speed-up':>9} {'comm us':>9} {'comm %':>7} "
          f"{'link bytes':>11} {'eager':>6} {'compile s':>10} {'sim s':>7}")
    base = None
    compiled = {}
    for tp in tps:
        if tp == 1:
            t0 = time.perf_counter()
            cm = tilecc.compile(model, (ids,), target=args.target)
            c_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            out = cm(ids)
            rep = cm.report
            assert rep is not None
            base = rep.time_us
            ok = torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
            print(f"{1:>3} {'1 chip':>10} {base:10.2f} {1.0:8.2f}x {0.0:9.2f} {0.0:6.1f}% {0:>11} "
                  f"{'yes' if ok else 'NO':>6} {c_s:10.2f} {time.perf_counter() - t1:7.2f}")
            continue
        ring = load_system(f"ring:{tp};chip={args.target};link={args.link}")
        t0 = time.perf_counter()
        prog = compile_system(model, (ids,), ring, tp=tp, sp=args.sp)
        compiled[tp] = prog
        c_s = time.perf_counter() - t0
        for spec in (f"ring:{tp}", f"switch:{tp}"):
            system = load_system(f"{spec};chip={args.target};link={args.link}")
            p = dataclasses.replace(prog, system=system)
            t1 = time.perf_counter()
            outs, tl = run_system(p, (ids,))
            r = system_report(p, tl)
            ok = torch.allclose(outs[0], ref, rtol=1e-4, atol=1e-4)
            speed = f"{base / r.time_us:8.2f}x" if base else f"{'-':>9}"
            print(f"{tp:>3} {spec:>10} {r.time_us:10.2f} {speed} {r.comm_us:9.2f} {100 * r.comm_exposed_share:6.1f}% "
                  f"{r.link_bytes:11.0f} {'yes' if ok else 'NO':>6} {c_s:10.2f} {time.perf_counter() - t1:7.2f}")
            c_s = 0.0  # compiled once for both systems
    if args.stream:
        stream_table(args, compiled, ids, ref, base)
    if args.algorithms:
        algorithm_table(args, compiled, ids, ref)
    if args.pipeline:
        pipeline(args)


def stream_table(args: argparse.Namespace, compiled: dict, ids: torch.Tensor, ref: torch.Tensor,
                 base: float | None) -> None:
    from tilecc.runtime.stream_report import stream_report
    from tilecc.runtime.system_stream import build_streams, run_streams

    print(f"\ncollectives in the streams (ring, {args.chunks} chunks per block) against between "
          "the programs (bulk-synchronous)")
    print(f"{'tp':>3} {'system':>10} {'between us':>11} {'stream us':>10} {'x between':>10} {'x stream':>9} "
          f"{'exposed between':>16} {'exposed stream':>15} {'comm stream':>12} {'hidden':>7} {'eager':>6} {'sim s':>6}")
    for tp, prog in compiled.items():
        for spec in (f"ring:{tp}", f"switch:{tp}"):
            system = load_system(f"{spec};chip={args.target};link={args.link}")
            p = dataclasses.replace(prog, system=system)
            _, tl = run_system(p, (ids,), functional=False)
            between = system_report(p, tl)
            t1 = time.perf_counter()
            ssp = build_streams(p, chunks=args.chunks)
            outs, run = run_streams(ssp, (ids,))
            r = stream_report(ssp, run)
            ok = torch.allclose(outs[0], ref, rtol=1e-4, atol=1e-4)
            sx = f"{base / between.time_us:9.2f}x" if base else f"{'-':>10}"
            st = f"{base / r.time_us:8.2f}x" if base else f"{'-':>9}"
            print(f"{tp:>3} {spec:>10} {between.time_us:11.2f} {r.time_us:10.2f} {sx} {st} "
                  f"{between.comm_exposed_share * between.time_us:16.2f} {r.comm_exposed_share * r.time_us:15.2f} "
                  f"{r.comm_us:12.2f} "
                  f"{100 * r.extra['hidden_share']:6.1f}% {'yes' if ok else 'NO':>6} {time.perf_counter() - t1:6.2f}")


def algorithm_table(args: argparse.Namespace, compiled: dict, ids: torch.Tensor, ref: torch.Tensor) -> None:
    """One row per in-stream algorithm (runtime/stream_algorithm.py) that applies: the run's
    time, the mean time of one collective (its first send to its last receive, any chip),
    the exposed communication and the link bytes; ring2d on a torus of the same chips."""
    from tilecc.runtime.stream_algorithm import why_not
    from tilecc.runtime.stream_report import stream_report
    from tilecc.runtime.system_stream import build_streams, run_streams

    print(f"\nin-stream collective algorithms ({args.chunks} chunks per transfer; tree: its alpha-beta-best count)")
    print(f"{'tp':>3} {'system':>10} {'algorithm':>17} {'chosen':>17} {'time us':>10} {'per coll us':>12} "
          f"{'exposed us':>11} {'link bytes':>11} {'eager':>6} {'sim s':>6}")
    for tp, prog in compiled.items():
        specs = [f"ring:{tp}", f"switch:{tp}"]
        if tp >= 4:
            specs.append(f"torus:2x{tp // 2}")
        for spec in specs:
            system = load_system(f"{spec};chip={args.target};link={args.link}")
            p = dataclasses.replace(prog, system=system)
            for algorithm in ("ring", "halving_doubling", "tree", "ring2d", "auto"):
                if algorithm != "auto" and any(why_not(c.op, algorithm, system.topology, 2) is not None
                                               for c in p.graph.collectives if c.op != "shard"):
                    continue
                t1 = time.perf_counter()
                ssp = build_streams(p, chunks=args.chunks, algorithm=algorithm)
                outs, run = run_streams(ssp, (ids,))
                r = stream_report(ssp, run)
                ok = torch.allclose(outs[0], ref, rtol=1e-4, atol=1e-4)
                colls = [c for c in run.collectives if c["algorithm"] != "local"]
                per = sum(c["time_us"] for c in colls) / max(len(colls), 1)
                chosen = ",".join(sorted({c["algorithm"].split()[0] for c in colls}))
                print(f"{tp:>3} {spec:>10} {algorithm:>17} {chosen:>17} {r.time_us:10.2f} {per:12.2f} "
                      f"{r.comm_exposed_share * r.time_us:11.2f} {r.link_bytes:11.0f} {'yes' if ok else 'NO':>6} "
                      f"{time.perf_counter() - t1:6.2f}")


def pipeline(args: argparse.Namespace) -> None:
    from llama_tp import build

    model, (ids,) = build(batch=4, seq=16)
    with torch.no_grad():
        ref = model(ids)
    cm = tilecc.compile(model, (ids,), target=args.target)
    out = cm(ids)
    assert cm.report is not None and torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
    base = cm.report.time_us
    print(f"\npipeline: batch 4 x 16 tokens, {args.target} chips, ring:2, links {args.link}")
    print(f"{'pp':>3} {'micro-batches':>14} {'time us':>10} {'speed-up':>9} {'comm exposed us':>16} {'eager':>6}")
    print(f"{1:>3} {'-':>14} {base:10.2f} {1.0:8.2f}x {0.0:16.2f} {'yes':>6}")
    for mb in (1, 2, 4):
        sm = tilecc.compile(model, (ids,), target=args.target, system=f"ring:2;link={args.link}",
                            parallel={"pp": 2, "micro_batches": mb})
        out = sm(ids)
        r = sm.report
        assert r is not None
        ok = torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
        print(f"{2:>3} {mb:>14} {r.time_us:10.2f} {base / r.time_us:8.2f}x "
              f"{r.comm_exposed_share * r.time_us:16.2f} {'yes' if ok else 'NO':>6}")


if __name__ == "__main__":
    main()
