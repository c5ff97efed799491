"""Throughput of the Triton backend against torch eager and torch.compile's default
backend on CUDA: GEMM with a fused epilogue, softmax, layer norm, attention.

    python benchmarks/gpu.py            # needs an NVIDIA GPU and `pip install tilecc[gpu]`

Each row checks the tilecc output against eager first (fp32, rtol 1e-3) and prints
milliseconds per call (median of 20 after 5 warm-up calls) and tilecc's throughput as a
fraction of the default backend's. A workload whose kernels the Triton emitter does not
translate yet prints the reason instead of a time. Without CUDA it exits with status 2.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch


class GemmEpilogue(torch.nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _time(fn, args) -> float:
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device here; run it on a machine with an NVIDIA GPU "
              "(GPU figures: not yet measured)", file=sys.stderr)
        return 2
    from tilecc.errors import TileccError
    from tilecc.frontend.torch_export import export_model, import_exported_program
    from tilecc.runtime.gpu import prepare_triton, run_on_triton
    from tilecc.simulator.config import load_config

    dev = "cuda"
    cases = [
        ("gemm+gelu 4096x4096x4096", GemmEpilogue(4096, 4096), (torch.randn(4096, 4096),)),
        ("softmax 8192x4096", Softmax(), (torch.randn(8192, 4096),)),
        ("layer norm 8192x4096", torch.nn.LayerNorm(4096), (torch.randn(8192, 4096),)),
        ("attention 8x16x1024x64", Attention(), tuple(torch.randn(8, 16, 1024, 64) for _ in range(3))),
    ]
    cfg = load_config("cloud")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'workload':<28} {'eager ms':>9} {'inductor ms':>12} {'tilecc ms':>10} {'vs inductor':>12}")
    for name, model, inputs in cases:
        model = model.eval()
        gp_inputs = inputs
        with torch.no_grad():
            try:
                gp = import_exported_program(export_model(model, gp_inputs))
            except TileccError as e:
                print(f"{name:<28} tilecc: {str(e).splitlines()[0]}")
                continue
            model = model.to(dev)
            args = tuple(t.to(dev) for t in inputs)
            eager = _time(model, args)
            default = torch.compile(model)
            inductor = _time(default, args)
            try:
                prep = prepare_triton(gp, cfg)  # lowering and emission once, outside the timing
                out, _ = run_on_triton(gp, cfg, args, device=dev, prepared=prep)
                torch.testing.assert_close(out[0], model(*args), rtol=1e-3, atol=1e-3)
                ours = _time(lambda *a: run_on_triton(gp, cfg, a, device=dev, prepared=prep), args)
            except TileccError as e:
                print(f"{name:<28} {eager:>9.3f} {inductor:>12.3f}  tilecc: {str(e).splitlines()[0]}")
                continue
        print(f"{name:<28} {eager:>9.3f} {inductor:>12.3f} {ours:>10.3f} {inductor / ours:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
