"""Compile time and peak memory: tilecc against torch.compile's default backend.

GPT-2 small (transformers GPT2LMHeadModel: 12 layers, d=768, 12 heads, vocab 50257,
random weights, bf16, batch 1, sequence 512). Each compile runs in a fresh process
(same CPU, one run after the other): the model is built and the inputs made first,
then the clock starts.

- tilecc: `tilecc.compile(model, (ids,), target="cloud")` (torch.export, import,
  the -O2 pass pipeline, encoding), cold (no autotune cache involved).
- torch.compile (default backend, Inductor, CPU): the first call of
  `torch.compile(model)` minus one eager call, with a fresh, empty Inductor cache dir.

Peak memory is the child's peak resident set size minus its resident size just before
compiling (the model, weights and inputs already in memory).

`--meta-llama`: a Llama-3.2-1B-shaped model (transformers LlamaForCausalLM: 16 layers,
hidden 2048, 32 heads, 8 KV heads, MLP 8192, vocabulary 128,256, tied embeddings) built
on the meta device (no weights), bf16, target cloud: the compile seconds of a prefill of
128 tokens and of a 1-token step (each in a fresh process), timing-only programs whose
simulated cycles it prints too (target: <= 60 s each on this 2-core machine). Identical
layers compile once (`passes/graph_to_tile/sharing.py`).

    .venv/bin/python benchmarks/compile_time.py [--layers 12] [--seq 512] [--only tilecc]
    .venv/bin/python benchmarks/compile_time.py --meta-llama [--layers 16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time, types
for m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(m, types.ModuleType(m))
import torch
from transformers import GPT2Config, GPT2LMHeadModel

layers, seq, which = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
cfg = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
cfg._attn_implementation = "sdpa"
model = GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()
ids = torch.randint(0, 50257, (1, seq))


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(ids, use_cache=False).logits


net = Logits(model).eval()


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


with torch.no_grad():
    if which == "tilecc":
        import tilecc
        base = rss_kib()
        t0 = time.perf_counter()
        cm = tilecc.compile(net, (ids,), target="cloud", cache=False)  # a cold compile
        seconds = time.perf_counter() - t0
        extra = {"instructions": int(len(cm.program.stream)), "kernels": len(cm.program.kernels)}
    else:
        net(ids)  # warm eager kernels
        t0 = time.perf_counter()
        net(ids)
        eager = time.perf_counter() - t0
        compiled = torch.compile(net)
        base = rss_kib()
        t0 = time.perf_counter()
        compiled(ids)
        seconds = time.perf_counter() - t0 - eager
        extra = {"eager_call_s": eager}
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT " + json.dumps({"seconds": seconds, "peak_mib": (peak - base) / 1024, **extra}))
"""


LLAMA_CHILD = r"""
import json, resource, sys, time, types
for m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(m, types.ModuleType(m))
import torch
from transformers import LlamaConfig, LlamaForCausalLM

layers, seq = int(sys.argv[1]), int(sys.argv[2])
cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, use_cache=False,
                  max_position_embeddings=4096)


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(ids, use_cache=False).logits


with torch.device("meta"):
    net = Logits(LlamaForCausalLM(cfg).to(torch.bfloat16)).eval()
ids = torch.zeros(1, seq, dtype=torch.long)
import tilecc
t0 = time.perf_counter()
cm = tilecc.compile(net, (ids,), target="cloud", cache=False)
seconds = time.perf_counter() - t0
report = cm.simulate(ids)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT " + json.dumps({"seconds": seconds, "peak_mib": peak / 1024, "cycles": report.cycles,
                             "timing_only": cm.timing_only, "instructions": int(len(cm.program.stream)),
                             "launches": len(cm.program.kernels),
                             "kernels": len({k[0].split("#")[0] for k in cm.program.kernels})}))
"""


def run(which: str, layers: int, seq: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
            "TILECC_CACHE_DIR": cache,
            "PYTHONWARNINGS": "ignore",
        }
        child = LLAMA_CHILD if which == "meta-llama" else CHILD
        p = subprocess.run(
            [sys.executable, "-c", child, str(layers), str(seq), which],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600,
        )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"{which} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--only", choices=["tilecc", "inductor"], default=None)
    ap.add_argument("--meta-llama", action="store_true",
                    help="compile a Llama-3.2-1B-shaped model on the meta device (prefill 128, 1-token step)")
    args = ap.parse_args()
    if args.meta_llama:
        meta_llama(16 if args.layers == 12 else args.layers)
        return
    which = [args.only] if args.only else ["tilecc", "inductor"]
    rows = {w: run(w, args.layers, args.seq) for w in which}
    print(f"GPT-2 small: {args.layers} layers, d=768, sequence {args.seq}, bf16, CPU ({os.cpu_count()} cores)\n")
    print("| compiler | compile s | peak memory MiB | notes |")
    print("| --- | ---: | ---: | --- |")
    for w, r in rows.items():
        note = (f"{r['kernels']} kernels, {r['instructions']:,} instructions, target cloud" if w == "tilecc"
                else f"torch.compile default backend (Inductor), eager call {r['eager_call_s']:.2f} s subtracted")
        who = "tilecc" if w == "tilecc" else "torch.compile"
        print(f"| {who} | {r['seconds']:.1f} | {r['peak_mib']:.0f} | {note} |")
    if len(rows) == 2:
        print(f"\ntilecc / torch.compile compile time: {rows['tilecc']['seconds'] / rows['inductor']['seconds']:.2f} "
              "(target <= 0.5)")


def meta_llama(layers: int) -> None:
    rows = {seq: run("meta-llama", layers, seq) for seq in (128, 1)}
    print(f"Llama-3.2-1B shape on the meta device: {layers} layers, hidden 2048, 32 heads / 8 KV heads, MLP 8192, "
          f"vocabulary 128,256, tied embeddings, bf16, target cloud, CPU ({os.cpu_count()} cores)\n")
    print("| program | compile s | target | peak RSS MiB | kernels / launches | instructions | simulated cycles |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for seq, r in rows.items():
        what = f"prefill {seq} tokens" if seq > 1 else "1-token step"
        print(f"| {what} | {r['seconds']:.1f} | <= 60 | {r['peak_mib']:.0f} | {r['kernels']} / {r['launches']} | "
              f"{r['instructions']:,} | {r['cycles']:,.0f} |")


if __name__ == "__main__":
    main()
