"""Where a decode step's time goes: per kernel family, the simulated cycles of its launches.

Compiles only the decode program of a Llama-shaped model on the meta device (as
`benchmarks/llm.py` does: `StaticCacheLM`, one token per sequence, the cache holding
``prompt + 2`` positions), simulates it timing-only with every instruction's start and
end recorded, and prints per kernel family (the kernel name without its ``k<i>_``
prefix and launch suffix): launches, the sum of each launch's span (first start to
last end) and that sum's share of the step. Linked kernels overlap (codegen/link.py),
so the shares may add up to more than 100 %. `--weights int8 | fp8 | w8a8` quantises
the model as `benchmarks/llm.py` does (lm_head kept bf16 unless `--quantize-lm-head`).

    .venv/bin/python benchmarks/llm_kernels.py --model 1b --batch 32
    .venv/bin/python benchmarks/llm_kernels.py --model 1b --batch 1 --weights int8
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm  # noqa: E402


def family(name: str) -> str:
    return re.sub(r"#\d+$", "", re.sub(r"^k\d+_", "", name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="1b", choices=sorted(llm.SHAPES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--target", default="cloud")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--weights", default="bf16", help="bf16, or a tilecc.quantize scheme (int8, fp8, w8a8)")
    ap.add_argument("--quantize-lm-head", action="store_true", help="quantise lm_head too (default: kept bf16)")
    args = ap.parse_args(argv)

    import tilecc
    from tilecc.llm.programs import _LastLogits
    from tilecc.llm.static_cache import StaticCacheLM
    from tilecc.simulator.machine import simulate

    model = llm.build(args.model, args.prompt + 2)
    if args.weights != "bf16":
        from tilecc.quantize import quantize_scheme

        model = quantize_scheme(model, args.weights, skip=() if args.quantize_lm_head else ("lm_head",))
    lm = StaticCacheLM(model, batch=args.batch, max_len=args.prompt + 2).eval()
    step = torch.zeros(args.batch, 1, dtype=torch.long, device="meta")
    decode = tilecc.compile(_LastLogits(lm).eval(), (step, torch.tensor([args.prompt], device="meta")),
                            target=args.target)
    prog = decode.program
    sim = simulate(prog.stream, prog.config, None, functional=False, record=True)
    assert sim.start is not None and sim.end is not None
    spans: dict[str, list[float]] = {}
    for name, first, count in prog.kernels:
        if count == 0:
            continue
        t0 = float(np.min(sim.start[first:first + count]))
        t1 = float(np.max(sim.end[first:first + count]))
        spans.setdefault(family(name), []).append(t1 - t0)
    total = sim.cycles
    ghz = prog.config.clock_ghz
    weights = args.weights + ("+lm" if args.quantize_lm_head else "")
    print(f"{llm.NAMES[args.model]}, {weights}, batch {args.batch}, cache {args.prompt + 2} positions, {args.target}: "
          f"decode step {total:,.0f} cycles ({total / ghz / 1e6:.3f} ms)")
    print(f"{'kernel family':<28} {'launches':>8} {'cycles':>14} {'share':>7}")
    rows = sorted(spans.items(), key=lambda kv: -sum(kv[1]))
    for fam, xs in rows[:args.top]:
        print(f"{fam:<28} {len(xs):>8} {sum(xs):>14,.0f} {sum(xs) / total:>7.1%}")
    att = sum(sum(xs) for fam, xs in spans.items() if "attention" in fam)
    print(f"{'attention (all kernels)':<28} {'':>8} {att:>14,.0f} {att / total:>7.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
