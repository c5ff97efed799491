"""Calibration: each engine alone, simulated against its closed form and the published figure.

    .venv/bin/python benchmarks/calibration.py [--target cloud] [--markdown]

Microbenchmarks of one instruction (or a short back-to-back chain) on an otherwise idle
machine, simulated timing-only (`simulator.machine.simulate`):

- matrix: one matmul per shape class (a full 128x128x128 tile, half its moving rows,
  one row (GEMV), a short contraction, narrow columns, an fp32 operand), and a chain of
  eight back-to-back matmuls whose issue interval is the engine's throughput;
- DMA: loads of 64 B to 1 MiB in all, contiguous on 128 partitions and on one
  partition, a transposed view of 2-byte elements (the DMA transpose path) and an
  element-strided view, and four loads at once on the four queues;
- vector: copy, a two-input add, exp and a sum-reduction over 512 columns on 1, 32 and
  128 partitions.

Beside each simulated figure: the closed form written here from the config's own keys
(not by calling `simulator.timing`, so the two are independent), and where a public
figure exists, what it predicts, with its source. All cycles are core-clock cycles
(`clock_ghz`); the engines' own clocks convert into it.

Published figures used (cloud, the Trainium2 NeuronCore-v3 class):
- TensorE 79 dense BF16 TFLOPS, 20 FP32 TFLOPS, 2.4 GHz (NKI Trainium2 architecture
  guide): a 128x128 array streaming one moving row per cycle;
- VectorE 0.96 GHz; an instruction over N free-dimension elements per partition costs
  about N cycles plus ~60 cycles of fixed access overhead (NKI performance guide);
- 16 DMA engines of 27.2 GB/s per NeuronCore ("Introduction to DMA with NKI"); HBM
  2.9 TB/s per chip over 8 cores = 362 GB/s per core; payloads of >= 4 KiB per
  partition saturate it (NKI DMA bandwidth guide).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilecc.simulator import isa
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.isa import BinaryFn, DType, Mem, Opcode, ReduceFn, UnaryFn
from tilecc.simulator.machine import simulate


@dataclass
class Row:
    engine: str
    case: str
    simulated: float
    closed: float
    published: float | None = None
    source: str = ""
    extra: str = ""


_stream = isa.stream_of


def _span(stream: np.ndarray, cfg: HardwareConfig) -> tuple[np.ndarray, np.ndarray]:
    r = simulate(stream, cfg, None, functional=False)
    assert r.start is not None and r.end is not None
    return r.start, r.end


# -- matrix ------------------------------------------------------------------------------


def _matmul(m: int, k: int, n: int, dtype: DType) -> dict[str, Any]:
    return dict(opcode=Opcode.MATMUL, rows=m, cols=n, k=k, a_mem=Mem.SRAM, a_dtype=dtype, b_mem=Mem.SRAM,
                b_dtype=dtype, b_addr=0, o_mem=Mem.ACC, o_dtype=DType.F32)


def matrix_rows(cfg: HardwareConfig) -> list[Row]:
    mx = cfg.matrix
    to_core = cfg.clock_ghz / mx.clock_ghz
    r, c = mx.rows, mx.cols
    preload = r if mx.dataflow in ("ws", "is") else 0
    drain = r + c - 2
    rows: list[Row] = []
    big = cfg.accumulator.partitions  # M rows land on M accumulator partitions
    cases = [
        ("full tile", r, r, c, DType.BF16),
        ("half the rows", max(big // 2, 1), r, c, DType.BF16),
        ("one row (GEMV)", 1, r, c, DType.BF16),
        ("short contraction", r, max(r // 4, 1), c, DType.BF16),
        ("narrow columns", r, r, max(c // 4, 1), DType.BF16),
        ("fp32 operand", r, r, c, DType.F32),
    ]
    for name, m, k, n, dt in cases:
        _, end = _span(_stream(_matmul(m, k, n, dt)), cfg)
        t = {"ws": m, "os": k, "is": n}[mx.dataflow]
        stream = t * (mx.fp32_slowdown if dt == DType.F32 else 1)
        closed = (preload + stream + drain) * to_core
        rows.append(Row("matrix", f"{name} {m}x{k}x{n} {dt.name.lower()} (latency)", float(end[0]), closed))
    # throughput: eight back-to-back matmuls, the interval between results
    for name, m, dt in (("chain of 8, bf16", big, DType.BF16), ("chain of 8, fp32", big, DType.F32)):
        _, end = _span(_stream(*[_matmul(m, r, c, dt)] * 8), cfg)
        interval = float(np.diff(end).mean())
        stream = m * (mx.fp32_slowdown if dt == DType.F32 else 1)
        closed = (max(preload, max(stream, mx.min_interval_cycles)) if mx.mode == "pipelined"
                  else preload + stream + drain) * to_core
        published, source = None, ""
        if cfg.name == "cloud":
            tflops = 79e12 if dt == DType.BF16 else 20e12
            published = 2 * m * r * c / tflops * cfg.clock_ghz * 1e9
            source = f"TensorE {tflops / 1e12:g} TFLOPS (NKI trn2 guide)"
        macs_per_cycle = m * r * c / interval
        rows.append(Row("matrix", f"{name} {m}x{r}x{c} (issue interval)", interval, closed, published, source,
                        f"{macs_per_cycle:,.0f} MAC/cycle"))
    return rows


# -- DMA ---------------------------------------------------------------------------------


def _load(rows: int, cols: int, dtype: DType, rs: int, cs: int, queue: int = 0, o_addr: int = 0) -> dict[str, Any]:
    return dict(opcode=Opcode.DMA_LOAD, queue=queue, a_mem=Mem.HBM, o_mem=Mem.SRAM, a_dtype=dtype, o_dtype=dtype,
                rows=rows, cols=cols, hbm_rs=rs, hbm_cs=cs, o_addr=o_addr)


def _dma_closed(cfg: HardwareConfig, rows: int, cols: int, isz: int, kind: str) -> float:
    """A transfer alone, from the config's keys: fixed part, then bytes at the rate its
    engines and its per-partition chunks allow, capped by HBM."""
    d = cfg.dma
    if kind == "contiguous":
        chunk, descriptors = cols * isz, rows
    elif kind == "transpose":  # the source read in runs of `rows` elements, one per column
        chunk, descriptors = rows * isz, cols
    else:  # element-strided: one element per descriptor
        chunk, descriptors = isz, rows * cols
    engines = min(d.engines, rows)
    # an engine spends packet_overhead_cycles per packet, then chunk / engine_bytes_per_cycle
    packet = d.packet_overhead_cycles + chunk / d.engine_bytes_per_cycle
    rate = min(cfg.hbm.bytes_per_cycle, engines * chunk / packet)
    fixed = d.latency_cycles + cfg.hbm.latency_cycles + descriptors * d.per_descriptor_cycles
    return fixed + rows * cols * isz / rate


def dma_rows(cfg: HardwareConfig) -> list[Row]:
    p = cfg.sram.partitions
    cap = cfg.sram.bytes_per_partition // 2
    ghz = cfg.clock_ghz
    published_peak = None
    if cfg.name == "cloud":
        published_peak = (362e9, "HBM 2.9 TB/s / 8 cores; >= 4 KiB per partition saturates (NKI DMA guide)")
    rows: list[Row] = []
    # (partitions, bytes per partition): 64 B in all up to 1 MiB in all
    shapes = [(1, 64), (1, 512), (1, 4096), (1, 32768), (p, 64), (p, 512), (p, 2048), (p, 4096), (p, 8192)]
    for parts, per in shapes:
        if per > cap:
            continue
        cols = per // 2
        _, end = _span(_stream(_load(parts, cols, DType.BF16, cols, 1)), cfg)
        closed = _dma_closed(cfg, parts, cols, 2, "contiguous")
        total = parts * per
        gbs = total / (end[0] / (ghz * 1e9)) / 1e9
        pub, src = None, ""
        if published_peak and parts == p and per >= 4096:
            pub = _dma_closed_at(cfg, parts, cols, 2, published_peak[0])
            src = published_peak[1]
        elif cfg.name == "cloud" and parts == 1 and per >= 4096:
            pub = _dma_closed_at(cfg, parts, cols, 2, 27.2e9)
            src = "one DMA engine, 27.2 GB/s (NKI DMA intro)"
        rows.append(Row("dma", f"load {total:,} B contiguous, {parts} partition(s) x {per:,} B",
                        float(end[0]), closed, pub, src, f"{gbs:,.1f} GB/s"))
    # a transposed view (the DMA transpose path) and an element-strided one: 128 x 128 bf16
    n = min(p, 128)
    for kind, rs, cs in (("transpose", 1, n), ("element-strided", 2 * n, 2)):
        _, end = _span(_stream(_load(n, n, DType.BF16, rs, cs)), cfg)
        closed = _dma_closed(cfg, n, n, 2, kind)
        gbs = n * n * 2 / (end[0] / (ghz * 1e9)) / 1e9
        rows.append(Row("dma", f"load {n}x{n} bf16, {kind} view", float(end[0]), closed, None,
                        "no published rate for the DMA transpose path" if kind == "transpose" else "",
                        f"{gbs:,.1f} GB/s"))
    # four queues at once: 4 x 1 MiB on 128 partitions, HBM shared
    cols = min(4096, cfg.sram.bytes_per_partition // 8 // 2)
    loads = [_load(p, cols, DType.BF16, cols, 1, queue=q % cfg.dma.queues, o_addr=q * cols * 2) for q in range(4)]
    _, end = _span(_stream(*loads), cfg)
    total = 4 * p * cols * 2
    alone = _dma_closed(cfg, p, cols, 2, "contiguous")
    fixed = cfg.dma.latency_cycles + cfg.hbm.latency_cycles + p * cfg.dma.per_descriptor_cycles
    if cfg.dma.queues >= 4:  # all four in flight at once share HBM: 4x the transfer
        closed = fixed + 4 * (alone - fixed)
    else:
        closed = float("nan")
    gbs = total / (end.max() / (ghz * 1e9)) / 1e9
    rows.append(Row("dma", f"4 loads of {p * cols * 2:,} B on {min(4, cfg.dma.queues)} queues at once",
                    float(end.max()), closed, None, "", f"{gbs:,.1f} GB/s aggregate"))
    return rows


def _dma_closed_at(cfg: HardwareConfig, rows: int, cols: int, isz: int, bytes_per_s: float) -> float:
    fixed = cfg.dma.latency_cycles + cfg.hbm.latency_cycles + rows * cfg.dma.per_descriptor_cycles
    return fixed + rows * cols * isz / (bytes_per_s / (cfg.clock_ghz * 1e9))


# -- vector ------------------------------------------------------------------------------


def vector_rows(cfg: HardwareConfig) -> list[Row]:
    v = cfg.vector
    to_core = cfg.clock_ghz / v.clock_ghz
    cols = 512
    ops = [
        ("copy", Opcode.VEC_UNARY, int(UnaryFn.COPY), 0, v.op_cost.unary["copy"], 1),
        ("add (two tiles)", Opcode.VEC_BINARY, int(BinaryFn.ADD), 0, v.op_cost.binary["add"], 2),
        ("exp", Opcode.VEC_UNARY, int(UnaryFn.EXP), 0, v.op_cost.unary["exp"], 1),
        ("sum-reduce", Opcode.VEC_REDUCE, int(ReduceFn.SUM), 0, v.op_cost.reduce["sum"], 1),
    ]
    rows: list[Row] = []
    for parts in (1, 32, 128):
        if parts > cfg.sram.partitions:
            continue
        for name, opcode, func, flags, cost, inputs in ops:
            op = dict(opcode=opcode, func=func, flags=flags, rows=parts, cols=cols, a_mem=Mem.SRAM,
                      a_dtype=DType.F32, b_mem=Mem.SRAM, b_dtype=DType.F32, b_addr=4 * cols, o_mem=Mem.SRAM,
                      o_dtype=DType.F32, o_addr=8 * cols)
            _, end = _span(_stream(op), cfg)
            closed = (v.latency_cycles + v.access_cycles + math.ceil(parts / v.lanes) * cols * cost * inputs) * to_core
            pub, src = None, ""
            if cfg.name == "cloud" and name in ("copy", "add (two tiles)"):
                pub = (60 + cols * inputs) * cfg.clock_ghz / 0.96
                src = "~N cycles per input + ~60 at 0.96 GHz (NKI)"
            rows.append(Row("vector", f"{name} on {parts} partition(s) x {cols}", float(end[0]), closed, pub, src))
    return rows


def _table(rows: list[Row], markdown: bool) -> str:
    head = ["engine", "case", "simulated", "closed form", "sim/closed", "published", "sim/published", "note"]
    body = []
    for r in rows:
        ratio = r.simulated / r.closed if r.closed and not math.isnan(r.closed) else float("nan")
        pub = f"{r.published:,.0f}" if r.published is not None else "-"
        pr = f"{r.simulated / r.published:.2f}" if r.published else "-"
        note = "; ".join(x for x in (r.extra, r.source) if x)
        body.append([r.engine, r.case, f"{r.simulated:,.0f}", f"{r.closed:,.0f}", f"{ratio:.3f}", pub, pr, note])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(out)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*b) for b in body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cloud")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args(argv)
    cfg = load_config(args.target)
    rows = matrix_rows(cfg) + dma_rows(cfg) + vector_rows(cfg)
    print(f"calibration on {cfg.name}: core clock {cfg.clock_ghz:g} GHz (all cycles), matrix "
          f"{cfg.matrix.clock_ghz:g} GHz, vector {cfg.vector.clock_ghz:g} GHz")
    print(_table(rows, args.markdown))
    bad = [r for r in rows if r.closed and not math.isnan(r.closed) and abs(r.simulated / r.closed - 1) > 1e-9]
    if bad:
        print(f"\n{len(bad)} case(s) where the simulator departs from the closed form:", file=sys.stderr)
        for r in bad:
            print(f"  {r.engine}: {r.case}: {r.simulated:,.1f} vs {r.closed:,.1f}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
