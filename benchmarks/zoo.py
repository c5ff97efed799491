"""The model zoo (examples/zoo.py): every model compiled, run on the simulator, compared
with eager, its cycles against the intrinsic roofline bound. The README's zoo table.

    .venv/bin/python benchmarks/zoo.py [--target tiny] [--only llama bert ...]

A model that fails prints its error (a `TileccError`'s one line, or the internal
error's type and message) in the status column, and the script exits 1.
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

import zoo  # noqa: E402

import tilecc  # noqa: E402
from tilecc.errors import TileccError  # noqa: E402
from tilecc.runtime.compare import compare  # noqa: E402


def row(m: zoo.ZooModel, target: str) -> dict:
    model, inputs = m.factory()
    with torch.no_grad():
        ref = model(*inputs)
    t0 = time.perf_counter()
    try:
        cm = tilecc.compile(model, inputs, target=target, cache=False)
        compile_s = time.perf_counter() - t0
        out = cm(*inputs)
    except TileccError as e:
        return {"status": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    except Exception as e:  # noqa: BLE001 (an internal error: reported, and the run fails)
        return {"status": f"INTERNAL {type(e).__name__}: {str(e)[:160]}"}
    outs = [out] if not isinstance(out, tuple) else list(out)
    ok, err = compare(outs, [ref] if not isinstance(ref, (tuple, list)) else list(ref))
    r = cm.report
    return {
        "status": f"{'yes' if ok else 'NO'} ({err:.1g})", "ok": ok, "cycles": r.cycles,
        "bound": r.roofline_cycles, "resource": r.bottleneck, "ratio": r.roofline_ratio,
        "fallbacks": len(cm.program.meta.get("fallbacks", [])), "compile_s": compile_s,
        "simulate_s": r.simulate_seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tiny")
    ap.add_argument("--only", nargs="*", help="zoo model names (default: all)")
    args = ap.parse_args()
    print("| model | kind | from | cycles | intrinsic bound (resource) | ratio | fallbacks | "
          "compile s | simulate s | matches eager |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    failed = 0
    for m in zoo.ZOO:
        if args.only and m.name not in args.only:
            continue
        r = row(m, args.target)
        if "cycles" not in r:
            failed += 1
            print(f"| `{m.name}` | {m.kind} | {m.source} | | | | | | | {r['status']} |", flush=True)
            continue
        failed += not r["ok"]
        print(f"| `{m.name}` | {m.kind} | {m.source} | {r['cycles']:,.0f} | {r['bound']:,.0f} ({r['resource']}) | "
              f"{r['ratio']:.1f} | {r['fallbacks']} | {r['compile_s']:.1f} | {r['simulate_s']:.1f} | "
              f"{r['status']} |", flush=True)
    verdict = f"{failed} of the zoo's models failed" if failed else "every model matches eager"
    print(f"\n{args.target}: {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
