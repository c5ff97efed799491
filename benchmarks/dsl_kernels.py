"""Tile-DSL example kernels on `cloud`: simulated cycles against the roofline bound.

For each kernel of examples/kernels/ at a benchmark size: compile (DSL front end, then
the compiler's plan-sram .. npu-insert-sync), simulate timing-only, and print cycles, the
roofline bound and the resource that sets it, the ratio and the compile time. The
causal flash-attention row is also compiled the compiler's way (torch sdpa through
`tilecc.compile`, passes/graph_to_tile/attention/) for comparison. Numerics of the same
kernels are checked against numpy in tests/test_dsl_kernels.py.

    .venv/bin/python benchmarks/dsl_kernels.py [--only flash] [--target cloud] [--functional]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import tilecc
from tilecc.runtime.executor import run_program

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "examples" / "kernels"


def _bf(*shape):
    return (torch.randn(*shape) * 0.5).bfloat16()


WORKLOADS = {
    "flash_attention causal h1 s2048 d128": ("flash_attention", lambda: (_bf(1, 2048, 128),) * 3),
    "flash_attention causal h2 s2048 d128": ("flash_attention", lambda: (_bf(2, 2048, 128),) * 3),
    "gemm_gelu 1024x1024x1024": ("gemm_gelu", lambda: (_bf(1024, 1024), _bf(1024, 1024), torch.randn(1024))),
    "softmax 2048x2048 f32": ("softmax", lambda: (torch.randn(2048, 2048),)),
    "layer_norm 2048x2048 f32": ("layer_norm", lambda: (torch.randn(2048, 2048), torch.randn(2048), torch.randn(2048))),
    "rms_norm 2048x4096 bf16": ("rms_norm", lambda: (_bf(2048, 4096), _bf(4096))),
    "conv2d c128 56x56 k3 f128": ("conv2d", lambda: (_bf(128, 58, 58), _bf(3, 3, 128, 128))),
    "mlp 512x1024x4096x1024": ("mlp", lambda: (_bf(512, 1024), _bf(1024, 4096), torch.randn(4096),
                                               _bf(4096, 1024), torch.randn(1024))),
}


def compiler_attention(target: str, functional: bool) -> tuple[float, float, float]:
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q = _bf(1, 1, 2048, 128)
    t0 = time.perf_counter()
    cm = tilecc.compile(Attn(), (q, q, q), target=target)
    seconds = time.perf_counter() - t0
    _, rep = run_program(cm.program, (q, q, q), functional=functional)
    return rep.cycles, rep.roofline_ratio, seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--target", default="cloud")
    ap.add_argument("--functional", action="store_true", help="also compute the outputs (slower)")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{'kernel':40} {'cycles':>12} {'bound':>12} {'set by':>7} {'ratio':>6} {'compile s':>9}")
    for name, (file, make) in WORKLOADS.items():
        if args.only and args.only not in name:
            continue
        k = tilecc.kernel(KERNELS / f"{file}.tdsl")
        k.keep_ir = False
        inputs = make()
        t0 = time.perf_counter()
        c = k.compile(*inputs, target=args.target)
        seconds = time.perf_counter() - t0
        _, rep = run_program(c.program, inputs, functional=args.functional)
        print(f"{name:40} {rep.cycles:12,.0f} {rep.roofline_cycles:12,.0f} {rep.bottleneck:>7} "
              f"{rep.roofline_ratio:6.2f} {seconds:9.2f}")
        if name.startswith("flash_attention causal h1"):
            cyc, ratio, secs = compiler_attention(args.target, args.functional)
            label = "  (compiler: sdpa -> attention)"
            print(f"{label:40} {cyc:12,.0f} {'':>12} {'':>7} {ratio:6.2f} {secs:9.2f}")


if __name__ == "__main__":
    main()
