"""Simulator speed and memory: instructions per second, the 1024^3 GEMM, record=False.

    .venv/bin/python benchmarks/simulator.py [--target tiny] [--copies 60] [--quick]

Rates are instructions per second of CPU time (best of 3), robust to other load.

1. A long realistic stream: examples/transformer_block.py compiled for `--target`, its
   instruction stream replicated `--copies` times (each copy ends with a BARRIER, so
   the copies are independent kernels), run in timing-only mode (record=True and
   record=False) and in full (functional) mode on a shorter replica.
2. A long generated double-buffered GEMM pipeline (loads on two queues, accumulating
   matmuls, gelu, store per kernel) on the cloud preset, in both matrix modes.
3. `simulator.gemm.gemm(1024, 1024, 1024)` on a 128 x 128 weight-stationary array in
   compatible mode: wall time, compute cycles (SCALE-Sim: 89,983 in ~130 s and ~1 GB),
   peak traced Python memory and the process's peak-RSS growth (gemm is a closed form;
   `simulate_folds` times the simulator on the same fold stream).
4. record=False memory at 1x and 10x stream length (tracemalloc peak during the run,
   the stream itself excluded): it should not grow with the stream.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _compiled_stream(target: str):
    sys.path.insert(0, str(ROOT / "examples"))
    import warnings

    warnings.filterwarnings("ignore")
    from transformer_block import block

    import tilecc

    model, inputs = block()
    cm = tilecc.compile(model.eval(), inputs, target=target)
    return cm.program


def _pipeline_stream(kernels: int):
    """Per kernel: 4 steps of (an A^T tile on queue 0 (A stored transposed, so rows are
    contiguous), a B tile on queue 1, an accumulating 128x128x128 matmul), gelu on the
    result, store; double-buffered: step s+1's loads overlap step s's matmul."""
    from tilecc.simulator import isa
    from tilecc.simulator.isa import DType, Flag, Mem, Opcode, UnaryFn

    steps, rows = 4, 128
    per = 3 * steps + 3
    s = isa.empty_stream(per)
    for step in range(steps):
        a, b, m = 3 * step, 3 * step + 1, 3 * step + 2
        buf = (step % 2) * 256
        s[a] = s[b] = s[m]  # empty
        for i, queue in ((a, 0), (b, 1)):
            s[i]["opcode"], s[i]["engine"], s[i]["queue"] = Opcode.DMA_LOAD, isa.Engine.DMA, queue
            s[i]["a_mem"], s[i]["o_mem"] = Mem.HBM, Mem.SRAM
            s[i]["a_dtype"] = s[i]["o_dtype"] = DType.BF16
            s[i]["rows"], s[i]["cols"], s[i]["hbm_rs"], s[i]["hbm_cs"] = rows, rows, rows, 1
            s[i]["o_addr"] = buf + (0 if i == a else 512)
            s[i]["signal_sem"] = queue
            if step >= 2:  # the buffer is free once the matmul two steps back is done
                s[i]["wait_sem"][0], s[i]["wait_val"][0] = 2, step - 1
        s[m]["opcode"], s[m]["engine"] = Opcode.MATMUL, isa.Engine.MATRIX
        s[m]["a_mem"] = s[m]["b_mem"] = Mem.SRAM
        s[m]["o_mem"], s[m]["o_dtype"] = Mem.ACC, DType.F32
        s[m]["a_dtype"] = s[m]["b_dtype"] = DType.BF16
        s[m]["rows"] = s[m]["cols"] = s[m]["k"] = rows
        s[m]["a_addr"], s[m]["b_addr"] = buf, buf + 512
        s[m]["flags"] = Flag.ACCUMULATE if step else 0
        s[m]["wait_sem"][:2], s[m]["wait_val"][:2] = (0, 1), (step + 1, step + 1)
        s[m]["signal_sem"] = 2
    g, st, bar = per - 3, per - 2, per - 1
    s[g]["opcode"], s[g]["engine"], s[g]["func"] = Opcode.VEC_UNARY, isa.Engine.VECTOR, UnaryFn.GELU
    s[g]["a_mem"], s[g]["a_dtype"], s[g]["o_mem"], s[g]["o_dtype"] = Mem.ACC, DType.F32, Mem.SRAM, DType.BF16
    s[g]["rows"], s[g]["cols"], s[g]["o_addr"] = rows, rows, 2048
    s[g]["wait_sem"][0], s[g]["wait_val"][0], s[g]["signal_sem"] = 2, steps, 3
    s[st]["opcode"], s[st]["engine"], s[st]["queue"] = Opcode.DMA_STORE, isa.Engine.DMA, 1
    s[st]["a_mem"], s[st]["o_mem"], s[st]["a_dtype"], s[st]["o_dtype"] = Mem.SRAM, Mem.HBM, DType.BF16, DType.BF16
    s[st]["rows"], s[st]["cols"], s[st]["hbm_rs"], s[st]["hbm_cs"], s[st]["a_addr"] = rows, rows, rows, 1, 2048
    s[st]["wait_sem"][0], s[st]["wait_val"][0] = 3, 1
    s[bar]["opcode"], s[bar]["engine"] = Opcode.BARRIER, isa.Engine.ALL
    return np.concatenate([s] * kernels)


def _rate(stream, cfg, hbm=None, *, functional=False, record=True, repeat=3):
    from tilecc.simulator.machine import simulate

    best, result = float("inf"), None
    for _ in range(repeat):
        image = hbm.copy() if hbm is not None else None
        t = time.process_time()  # CPU time: robust to other processes on the machine
        result = simulate(stream, cfg, image, functional=functional, record=record)
        best = min(best, time.process_time() - t)
    return len(stream) / best, best, result


def _traced_peak(fn):
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="tiny")
    ap.add_argument("--copies", type=int, default=60, help="replicas of the compiled stream")
    ap.add_argument("--quick", action="store_true", help="smaller streams (a smoke run)")
    args = ap.parse_args(argv)
    from tilecc.simulator.config import load_config
    from tilecc.simulator.gemm import gemm, simulate_folds
    from tilecc.simulator.machine import simulate

    copies = 4 if args.quick else args.copies
    rows: list[tuple[str, str, str]] = []
    prog = _compiled_stream(args.target)
    base = prog.stream
    long = np.concatenate([base] * copies)
    cfg = prog.config
    n = len(long)
    name = f"transformer_block x{copies} ({args.target}, {n:,} instr)"
    r, sec, sim = _rate(long, cfg)
    rows.append((name, "timing-only, record=True", f"{r:,.0f} instr/s ({sec:.3f} s, {sim.cycles:,.0f} cycles)"))
    from tilecc.simulator import decode, scheduler

    prog_long = decode.DecodedProgram(long, cfg)
    for label, general in (("scheduler only: dataflow", False), ("scheduler only: event heap", True)):
        t = time.process_time()
        scheduler.schedule(prog_long, general=general)
        sec = time.process_time() - t
        rows.append((name, label, f"{n / sec:,.0f} instr/s ({sec:.3f} s)"))
    del prog_long
    r, sec, _ = _rate(long, cfg, record=False)
    rows.append((name, "timing-only, record=False", f"{r:,.0f} instr/s ({sec:.3f} s)"))
    short = np.concatenate([base] * max(1, copies // 20))
    r, sec, _ = _rate(short, cfg, prog.hbm_image(), functional=True, repeat=1)
    rows.append((f"transformer_block x{max(1, copies // 20)} ({len(short):,} instr)", "full (functional)",
                 f"{r:,.0f} instr/s ({sec:.3f} s)"))

    cloud = load_config("cloud")
    pipe = _pipeline_stream(500 if args.quick else 8000)
    r, sec, sim = _rate(pipe, cloud)
    rows.append((f"GEMM pipeline (cloud, {len(pipe):,} instr)", "timing-only, record=True",
                 f"{r:,.0f} instr/s ({sec:.3f} s, {sim.cycles:,.0f} cycles)"))
    r, sec, _ = _rate(pipe, cloud, record=False)
    rows.append((f"GEMM pipeline (cloud, {len(pipe):,} instr)", "timing-only, record=False",
                 f"{r:,.0f} instr/s ({sec:.3f} s)"))
    compatible = dataclasses.replace(cloud, matrix=dataclasses.replace(cloud.matrix, mode="compatible"))
    r, sec, sim = _rate(pipe, compatible, record=False)
    rows.append((f"GEMM pipeline (cloud, {len(pipe):,} instr)", "compatible mode, record=False",
                 f"{r:,.0f} instr/s ({sec:.3f} s, {sim.cycles:,.0f} cycles)"))

    gemm(64, 64, 64, cloud)  # warm the imports
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = gemm(1024, 1024, 1024, cloud, rows=128, cols=128, dataflow="ws", mode="compatible")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    peak = _traced_peak(lambda: gemm(1024, 1024, 1024, cloud, rows=128, cols=128, dataflow="ws",
                                     mode="compatible"))
    rows.append(("gemm 1024^3, 128x128 WS compatible", "compute cycles", f"{g['compute_cycles']:,} (SCALE-Sim 89,983)"))
    rows.append(("", "wall time", f"{g['wall_seconds'] * 1e3:.1f} ms (SCALE-Sim ~130 s)"))
    rows.append(("", "peak memory", f"{peak / 1024:,.0f} KiB traced, max-RSS growth {rss:,} KiB"))
    p = gemm(1024, 1024, 1024, cloud, rows=128, cols=128, dataflow="ws", mode="pipelined")
    rows.append(("gemm 1024^3, 128x128 WS pipelined", "compute cycles",
                 f"{p['compute_cycles']:,} (bound {p['roofline_cycles']:,.0f})"))
    big = gemm(16384, 16384, 16384, cloud, mode="pipelined")
    rows.append((f"gemm 16384^3 ({big['folds']:,} folds)", "wall time",
                  f"{big['wall_seconds']:.2f} s, {big['compute_cycles']:,.0f} cycles"))
    # gemm is a closed form; the simulator's own time on the same fold stream:
    ws = dataclasses.replace(cloud, matrix=dataclasses.replace(cloud.matrix, rows=128, cols=128, dataflow="ws",
                                                                 mode="compatible"))
    t0 = time.perf_counter()
    cycles = simulate_folds(1024, 1024, 1024, ws)
    rows.append(("gemm 1024^3 fold stream, simulated", "wall time",
                 f"{(time.perf_counter() - t0) * 1e3:.1f} ms, {cycles - 1:,.0f} compute cycles (= the closed form)"))

    one = np.concatenate([base] * (2 if args.quick else 10))
    ten = np.concatenate([one] * 10)
    for label, s in (("1x", one), ("10x", ten)):
        lean = _traced_peak(lambda: simulate(s, cfg, None, functional=False, record=False))
        rec = _traced_peak(lambda: simulate(s, cfg, None, functional=False, record=True))
        rows.append((f"record=False memory, {label} ({len(s):,} instr)", "peak traced",
                     f"{lean / 2**20:.1f} MiB (record=True {rec / 2**20:.1f} MiB; stream {s.nbytes / 2**20:.1f} MiB)"))

    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    print(f"{'workload':<{w0}}  {'measure':<{w1}}  result")
    print("-" * (w0 + w1 + 50))
    for a, b, c in rows:
        print(f"{a:<{w0}}  {b:<{w1}}  {c}")


if __name__ == "__main__":
    main()
