"""The decode-attention kernel alone: simulated cycles against the KV-cache bytes bound.

One decode step's attention of the Llama-3.2-1B shape (8 KV heads of 4 query heads,
head dim 64, bf16) as `transformers` writes it (`repeat_kv`, then sdpa with the additive
mask of the cache positions), for several cache lengths and batch sizes: each point is
compiled for `--target` and simulated timing-only. The bound is the time to read the
whole K and V cache once at the HBM peak (``2 * batch * 8 * S * 64 * 2`` bytes over
``hbm.bytes_per_cycle``): the kernel reads the whole static cache, and the query rows,
mask and output are a few KiB. The schedule column is the one the cost model and the
replays chose (the decode kernel's remark).

    .venv/bin/python benchmarks/decode_attention.py
    .venv/bin/python benchmarks/decode_attention.py --lengths 130,4098 --batches 1
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

import tilecc
from tilecc.simulator.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from gqa_decode import GqaDecode, step_inputs  # noqa: E402

KV_HEADS, GROUP, HEAD_DIM = 8, 4, 64


def inputs(batch: int, S: int) -> tuple[torch.Tensor, ...]:
    return step_inputs(batch, S, KV_HEADS, GROUP, HEAD_DIM)


def schedule(cm: tilecc.CompiledModel) -> str:
    msg = next((r["message"] for r in cm.program.meta["remarks"] if r["message"].startswith("decode attention [")),
               None)
    if msg is None:
        return "flash kernel"
    m = re.search(r"groups of (\d+), (\d+) positions per row", msg)
    parts = [f"n={m.group(1)} f={m.group(2)}"] if m else []
    b = re.search(r"in (\d+) blocks of (\d+) positions", msg)
    if b:
        parts.append(f"{b.group(1)} blocks of {b.group(2)}")
    parts.append("mask transposed" if "mask rows by DMA transposes" in msg else "mask strided")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="130,2050,4098", help="cache positions, comma-separated")
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--target", default="cloud")
    args = ap.parse_args(argv)
    cfg = load_config(args.target)
    print(f"target {args.target}; decode attention of the Llama-3.2-1B shape, bf16; bound = K and V bytes / HBM peak")
    print(f"{'cache':>6} {'batch':>5} {'cycles':>11} {'KV bound':>10} {'x bound':>7} {'compile s':>9}  schedule")
    for S in (int(x) for x in args.lengths.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            x = inputs(batch, S)
            t0 = time.perf_counter()
            cm = tilecc.compile(GqaDecode().eval(), x, target=cfg)
            compile_s = time.perf_counter() - t0
            cycles = cm.simulate(*x).cycles
            bound = 2 * batch * KV_HEADS * S * HEAD_DIM * 2 / cfg.hbm.bytes_per_cycle
            print(f"{S:>6} {batch:>5} {cycles:>11,.0f} {bound:>10,.0f} {cycles / bound:>7.2f} {compile_s:>9.1f}  "
                  f"{schedule(cm)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
