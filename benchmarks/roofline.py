"""Issue-5 table: simulated cycles against the roofline bound, -O2 against -O0.

For each workload (preset `cloud`, bf16): compile at -O2 and -O0, simulate timing-only
(the numerics of the same kernels are checked against eager at small sizes in the test
suite), and print cycles, the roofline bound (the workload's intrinsic work, counted on
the imported graph: the same at -O2 and -O0) and the resource that sets it, the ratio,
the -O2 program's own work against the bound (the compiler's added work), HBM bytes
against compulsory bytes, the -O0 cycles and both compile times.

With `--bound-only` nothing is compiled or simulated: the table is the bound alone
(import + `ir/graph_work.py`), for the large workloads.

    .venv/bin/python benchmarks/roofline.py [--only gemm] [--skip-o0] [--target cloud] [--autotune]

With `--autotune` the -O2 matmul kernels' schedules come from the autotuner (simulated
candidates, cached in $TILECC_CACHE_DIR or ~/.cache/tilecc) instead of the cost model;
the compile time then includes the search unless the cache already holds the kernels.

With `--critical-path` each -O2 row is followed by the chain of instructions that sets
its cycles (by kind, and by kernel with a shared kernel's launches summed:
`simulator/critical_path.py`).

With `--barriers` each -O2 program is also compiled with a full barrier between
kernels (``disabled={"link-kernels"}``: the stream before cross-kernel overlap,
`codegen/link.py`) and the table compares its cycles and ratio with the linked ones.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import torch

# torchvision (imported by transformers too) next to a CPU torch: see README (these stubs
# keep its optional registrations from loading)
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilecc.frontend.torch_export import export_model, import_exported_program  # noqa: E402
from tilecc.ir.graph_work import graph_work  # noqa: E402
from tilecc.runtime.compiler import compile_graph  # noqa: E402
from tilecc.runtime.executor import run_program  # noqa: E402
from tilecc.runtime.report import critical_path_lines  # noqa: E402
from tilecc.simulator.config import load_config  # noqa: E402
from tilecc.simulator.roofline import roofline  # noqa: E402

DT = torch.bfloat16


class Linear(torch.nn.Module):
    """y = x @ W: x an activation [M, K], W a weight [K, N]."""

    def __init__(self, K: int, N: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(K, N) / K**0.5)

    def forward(self, x):
        return x @ self.w


def gemm(M, K, N):
    return lambda: (Linear(K, N).to(DT), (torch.randn(M, K, dtype=DT),))


def gpt2_block(attn: str = "sdpa"):
    """One GPT-2-small block; `attn` "sdpa" (scaled_dot_product_attention) or "eager"
    (matmul, scale, causal mask, softmax, matmul, as many model definitions write it)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = GPT2Config(n_embd=768, n_head=12, n_layer=1, n_positions=1024)
    cfg._attn_implementation = attn

    class B(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = GPT2Block(cfg)
            # a block alone gets no mask from GPT2Model: sdpa is causal by itself, eager
            # attention needs the model's additive causal mask to compute the same thing
            causal = torch.full((512, 512), torch.finfo(DT).min).triu(1)
            self.register_buffer("mask", causal.view(1, 1, 512, 512) if attn == "eager" else None)

        def forward(self, x):
            y = self.b(x, attention_mask=self.mask)
            return y[0] if isinstance(y, tuple) else y

    return B().to(DT), (torch.randn(1, 512, 768, dtype=DT),)


def gpt2_small():
    """GPT-2 small from `transformers`: 12 layers, d768, 12 heads, s512, random weights;
    token ids in, the last hidden state out (the LM head is the tied embedding: left out)."""
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_embd=768, n_head=12, n_layer=12, n_positions=1024, use_cache=False)
    cfg._attn_implementation = "sdpa"

    class G(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = GPT2Model(cfg)

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    return G().to(DT), (torch.randint(0, cfg.vocab_size, (1, 512)),)


def attention(heads=1, seq=2048, dim=128):
    class A(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    x = lambda: torch.randn(1, heads, seq, dim, dtype=DT)  # noqa: E731
    return lambda: (A(), (x(), x(), x()))


def resnet18():
    from torchvision.models import resnet18 as rn

    return rn(weights=None).eval().to(DT), (torch.randn(1, 3, 224, 224, dtype=DT),)


WORKLOADS = {
    "gemm 4096x4096x4096": gemm(4096, 4096, 4096),
    "gemm 128x4096x11008": gemm(128, 4096, 11008),
    "gemv 1x4096x4096": gemm(1, 4096, 4096),
    "gpt2 block d768 s512": gpt2_block,
    "gpt2 block d768 s512 eager attention": lambda: gpt2_block("eager"),
    "gpt2 small 12 layers s512": gpt2_small,
    "causal attention s2048 d128": attention(),
    "causal attention gpt2-small 12h s512 d64": attention(12, 512, 64),
    "resnet18 224": resnet18,
}
# the whole-program issue's targets (cloud, bf16, against the intrinsic bound)
TARGETS = {"gemm 4096x4096x4096": 1.05, "gpt2 block d768 s512": 1.3, "gpt2 block d768 s512 eager attention": 1.3,
           "gpt2 small 12 layers s512": 1.3, "causal attention s2048 d128": 1.2, "resnet18 224": 1.5}


def measure(name: str, target: str, skip_o0: bool, autotune: bool = False, barriers: bool = False,
            critical_path: bool = False) -> dict:
    torch.manual_seed(0)
    model, inputs = WORKLOADS[name]()
    cfg = load_config(target)
    with torch.no_grad():
        ep = export_model(model.eval(), inputs)
    gp = import_exported_program(ep)
    row = {"workload": name}
    for level in ((2,) if skip_o0 else (2, 0)):
        t0 = time.perf_counter()
        prog = compile_graph(gp, cfg, opt_level=level, autotune=autotune and level == 2)
        ct = time.perf_counter() - t0
        _, rep = run_program(prog, inputs, functional=False, critical_path=critical_path and level == 2)
        row[f"O{level}"] = rep
        row[f"compile_O{level}"] = ct
    if barriers:
        prog = compile_graph(gp, cfg, opt_level=2, autotune=autotune, disabled={"link-kernels"})
        row["barriers"] = run_program(prog, inputs, functional=False)[1]
    return row


def bound_only(name: str, target: str) -> str:
    """One table row of the bound alone: import and count, nothing compiled."""
    torch.manual_seed(0)
    model, inputs = WORKLOADS[name]()
    cfg = load_config(target)
    with torch.no_grad():
        gp = import_exported_program(export_model(model.eval(), inputs))
    work = graph_work(gp, cfg)
    comps = roofline(work.figures(), cfg)
    res = max(comps, key=lambda k: comps[k])
    return (f"| {name} | {comps[res]:,.0f} ({res}) | " + " | ".join(f"{comps[k]:,.0f}" for k in comps)
            + f" | {work.macs_16 + work.macs_fp32:,.0f} | {work.compulsory_hbm_bytes:,.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="substring of the workloads to run")
    ap.add_argument("--skip-o0", action="store_true")
    ap.add_argument("--target", default="cloud")
    ap.add_argument("--autotune", action="store_true", help="-O2 matmul schedules from the autotuner")
    ap.add_argument("--bound-only", action="store_true", help="the bound alone: import and count, no compile")
    ap.add_argument("--critical-path", action="store_true",
                    help="after each -O2 row, the chain of instructions that sets its cycles, by kind and kernel")
    ap.add_argument("--barriers", action="store_true",
                    help="compare with a barrier between kernels (no cross-kernel overlap)")
    args = ap.parse_args()
    if args.bound_only:
        print(f"preset {args.target}, bf16; the intrinsic roofline bound in core cycles\n")
        print("| workload | bound (resource) | matrix | hbm | vector | MACs | compulsory HBM bytes |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in WORKLOADS:
            if args.only in name:
                print(bound_only(name, args.target), flush=True)
        return
    print(f"preset {args.target}, bf16; ratio = simulated cycles / roofline bound (1.00 is the limit)"
          f"{'; -O2 matmul schedules autotuned' if args.autotune else ''}\n")
    if not args.barriers:
        print("| workload | -O2 cycles | bound (resource) | ratio | target | -O2 program work / bound "
              "| HBM bytes / compulsory | -O0 cycles | -O0 / -O2 | compile -O2 / -O0 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    else:
        print("| workload | -O2 cycles, barriers | ratio, barriers | -O2 cycles, linked | ratio, linked "
              "| target | barriers / linked |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in WORKLOADS:
        if args.only not in name:
            continue
        r = measure(name, args.target, args.skip_o0, args.autotune, args.barriers, args.critical_path)
        o2 = r["O2"]
        if args.barriers:
            b, tgt = r["barriers"], TARGETS.get(name)
            print(f"| {name} | {b.cycles:,.0f} | {b.roofline_ratio:.2f} | {o2.cycles:,.0f} | "
                  f"{o2.roofline_ratio:.2f} | {f'<= {tgt:.2f}' if tgt else '-'} | {b.cycles / o2.cycles:.3f}x |",
                  flush=True)
            continue
        o0 = r.get("O0")
        tgt = TARGETS.get(name)
        print(
            f"| {name} | {o2.cycles:,.0f} | {o2.roofline_cycles:,.0f} ({o2.bottleneck}) | {o2.roofline_ratio:.2f} | "
            f"{f'<= {tgt:.2f}' if tgt else '-'} | {o2.program_work_cycles / o2.roofline_cycles:.2f} | "
            f"{o2.hbm_bytes / max(o2.compulsory_hbm_bytes, 1):.2f} | "
            f"{f'{o0.cycles:,.0f}' if o0 else '-'} | {f'{o0.cycles / o2.cycles:.1f}x' if o0 else '-'} | "
            f"{r['compile_O2']:.1f} s / {r.get('compile_O0', float('nan')):.1f} s |",
            flush=True,
        )
        if o2.critical_path:
            print("\n".join("    " + line for line in critical_path_lines(o2.critical_path, top=6)), flush=True)


if __name__ == "__main__":
    main()
