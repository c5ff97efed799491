"""Per-model figures: simulated cycles against the roofline bound, compile and simulate time.

    .venv/bin/python benchmarks/models.py [--target tiny] [--markdown]

Each example factory is compiled with tilecc, run on the simulator, compared with eager,
and its report summarised in one row. Compile time is measured next to
`torch.compile`'s default backend (inductor) on the same model and CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
warnings.filterwarnings("ignore")

import tilecc  # noqa: E402
from tilecc.cli import load_factory  # noqa: E402
from tilecc.runtime.compare import compare  # noqa: E402

MODELS = [
    "mlp.py:mlp_odd",
    "mlp.py:mlp_bf16",
    "transformer_block.py:block",
    "transformer_block.py:block_bf16",
    "gpt2.py:gpt2",
    "gpt2.py:gpt2_sdpa",
    "bert.py:bert",
    "resnet.py:resnet18",
]


def inductor_compile_seconds(model, inputs) -> float:
    torch._dynamo.reset()
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.compile(model)(*inputs)
    return time.perf_counter() - t0


def row(spec: str, target: str, with_inductor: bool) -> dict:
    model, inputs = load_factory(str(ROOT / "examples" / spec))
    t0 = time.perf_counter()
    cm = tilecc.compile(model, inputs, target=target, cache=False)  # compile time is measured: cold
    compile_s = time.perf_counter() - t0
    out = cm(*inputs)
    with torch.no_grad():
        ref = model.eval()(*inputs)
    outs = [out] if not isinstance(out, tuple) else list(out)
    ok, err = compare(outs, [ref] if not isinstance(ref, (tuple, list)) else list(ref))
    r = cm.report
    return {
        "model": spec, "target": target, "cycles": r.cycles, "bound": r.roofline_cycles,
        "resource": r.bottleneck, "ratio": r.roofline_ratio, "program_work": r.program_work_cycles,
        "hbm": r.hbm_bytes,
        "compulsory": r.compulsory_hbm_bytes, "instructions": r.instructions,
        "compile_s": compile_s, "simulate_s": r.simulate_seconds, "ok": ok, "err": err,
        "inductor_s": inductor_compile_seconds(model, inputs) if with_inductor else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tiny")
    ap.add_argument("--inductor", action="store_true", help="also time torch.compile (slow)")
    ap.add_argument("--only", nargs="*", help="model specs to run (default: all)")
    args = ap.parse_args()
    print("| model | target | cycles | roofline bound (resource) | ratio | program work / bound | "
          "HBM bytes / compulsory | instructions | compile s | inductor compile s | simulate s | matches eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec in args.only or MODELS:
        r = row(spec, args.target, args.inductor)
        print(
            f"| `{r['model']}` | {r['target']} | {r['cycles']:,.0f} | {r['bound']:,.0f} ({r['resource']}) | "
            f"{r['ratio']:.1f} | {r['program_work'] / max(r['bound'], 1.0):.2f} | "
            f"{r['hbm']:,} / {r['compulsory']:,} | {r['instructions']:,} | "
            f"{r['compile_s']:.2f} | {r['inductor_s']:.2f} | {r['simulate_s']:.2f} | "
            f"{'yes' if r['ok'] else 'NO'} ({r['err']:.2g}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
