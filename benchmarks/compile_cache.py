"""The compile cache's speed-up: a cold compile against a second compile of the same
model that takes the cached program (runtime/cache.py).

Each row compiles the model with `tilecc.compile(..., cache=CompileCache(tmp))` twice,
in one process, into a fresh empty cache directory, from the nn.Module (torch.export
runs in both compiles) and from an ExportedProgram made beforehand: cold (export, import, the pass
pipeline, encoding, the write) then warm (export, import, the key, the read and the
checksum). The warm program is checked to be the same bytes as the cold one, and both
are run on the simulator (sanitisers on) against torch eager.

    .venv/bin/python benchmarks/compile_cache.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore", category=FutureWarning)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import mlp  # noqa: E402
import transformer_block  # noqa: E402

import tilecc  # noqa: E402
from tilecc.runtime.cache import CompileCache  # noqa: E402
from tilecc.runtime.compare import compare  # noqa: E402


def deep_mlp():
    """12 Linear-GELU layers, 256 wide, batch 64, bf16: a pipeline-heavy compile."""
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(torch.bfloat16), (torch.randn(64, 256, dtype=torch.bfloat16),)


MODELS = {
    "mlp_odd (tiny)": (mlp.mlp_odd, "tiny"),
    "transformer block (tiny)": (transformer_block.block, "tiny"),
    "transformer block bf16 (cloud)": (transformer_block.block_bf16, "cloud"),
    "12-layer MLP 256 bf16 (cloud)": (deep_mlp, "cloud"),
}


def measure(factory, target: str, repeat: int, exported: bool) -> tuple[float, float, int]:
    model, inputs = factory()
    model = model.eval()
    src = torch.export.export(model, inputs) if exported else model
    cold, warm = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            c = CompileCache(d)
            t0 = time.perf_counter()
            a = tilecc.compile(src, inputs, target=target, cache=c)
            t1 = time.perf_counter()
            b = tilecc.compile(src, inputs, target=target, cache=c)
            t2 = time.perf_counter()
            assert a.compile_stats.cache == "miss" and b.compile_stats.cache == "hit"
            assert a.program.to_bytes() == b.program.to_bytes()
            size = c.path(next(iter(c.dir.glob("*.tpg"))).stem).stat().st_size
            cold.append(t1 - t0)
            warm.append(t2 - t1)
    b.sanitize = True
    out = b(*inputs)
    with torch.no_grad():
        ref = model(*inputs)
    ok, _ = compare([out], [ref])
    assert ok, "the cached program disagrees with eager"
    return min(cold), min(warm), size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("from an nn.Module (torch.export included in both) | from an ExportedProgram")
    print(f"{'model':32} {'cold s':>7} {'cached s':>8} {'x':>5} | {'cold s':>7} {'cached s':>8} {'x':>5} "
          f"{'entry KiB':>9}")
    for name, (factory, target) in MODELS.items():
        cold, warm, _ = measure(factory, target, args.repeat, exported=False)
        ecold, ewarm, size = measure(factory, target, args.repeat, exported=True)
        print(f"{name:32} {cold:7.3f} {warm:8.3f} {cold / warm:5.1f} | {ecold:7.3f} {ewarm:8.3f} "
              f"{ecold / ewarm:5.1f} {size / 1024:9.1f}")


if __name__ == "__main__":
    main()
