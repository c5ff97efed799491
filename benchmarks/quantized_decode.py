"""Issue 21 item 4: decode-shaped linears with bf16, int8 and fp8 e4m3 weights, and W8A8.

A stack of `--layers` Linear(2048 x 2048) layers (no bias) run on M = 1..8 rows (the
decode step of a batch of M sequences), bf16 activations, on `cloud`: the bf16 model,
and the same model with its weights quantised by `tilecc.quantize.quantize_weights`
(one byte a parameter in HBM, read by the matrix engine directly, the per-channel scale
in the matmul's epilogue), and W8A8 (`tilecc.quantize.SCHEMES["w8a8"]`: int8 weights, each
layer's input quantised per row on the NPU, int8 x int8 matmuls). Printed per row:
simulated cycles (timing-only; the numerics of the same kernels are checked against
eager in tests/test_quantize.py and tests/test_quantize_w8a8.py), the intrinsic
bound (weights bytes / HBM bandwidth dominate it), the ratio, and the speed-up of each
format over bf16 at the same M. Target (issue 21): int8 >= 1.7x fewer cycles per token.

    .venv/bin/python benchmarks/quantized_decode.py [--layers 4] [--rows 1 8] [--target cloud]
        [--formats bf16 int8 w8a8]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tilecc  # noqa: E402
from tilecc.quantize import quantize_scheme  # noqa: E402
from tilecc.runtime.executor import run_program  # noqa: E402

TARGET_INT8_SPEEDUP = 1.7


def stack(layers: int, d: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(layers)]).to(torch.bfloat16).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--target", default="cloud")
    ap.add_argument("--formats", nargs="+", default=["bf16", "int8", "fp8", "w8a8"],
                    help="bf16 first (the speed-ups are against it)")
    args = ap.parse_args()
    base = stack(args.layers, args.dim)
    print(f"{args.layers} x Linear({args.dim} x {args.dim}), bf16 activations, target {args.target}")
    print(f"{'M':>3} {'weights':>8} {'cycles':>12} {'bound':>12} {'ratio':>6} {'vs bf16':>8} "
          f"{'weight MB':>9} {'compile s':>9}")
    for m in args.rows:
        x = torch.randn(m, args.dim, dtype=torch.bfloat16)
        cycles_bf16 = None
        for fmt in args.formats:
            model = base if fmt == "bf16" else quantize_scheme(copy.deepcopy(base), fmt, skip=())
            t0 = time.perf_counter()
            cm = tilecc.compile(model, (x,), target=args.target)
            compile_s = time.perf_counter() - t0
            _, rep = run_program(cm.program, (x,), functional=False)
            cycles_bf16 = rep.cycles if fmt == "bf16" else cycles_bf16
            weight_bytes = sum(s.nbytes for s in cm.program.weights)
            speedup = f"{cycles_bf16 / rep.cycles:.2f}x" if cycles_bf16 else "-"
            print(f"{m:>3} {fmt:>8} {rep.cycles:>12,.0f} {rep.roofline_cycles:>12,.0f} "
                  f"{rep.roofline_ratio:>6.2f} {speedup:>8} {weight_bytes / 1e6:>9.2f} {compile_s:>9.1f}")
    print(f"target: int8 >= {TARGET_INT8_SPEEDUP}x fewer cycles than bf16 at the same M")


if __name__ == "__main__":
    main()
