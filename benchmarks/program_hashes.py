"""Byte-identity check for refactors: the SHA-256 of every benchmark workload's and
example's compiled program, compared with the hashes recorded before the change.

    .venv/bin/python benchmarks/program_hashes.py            # compare with program_hashes.json
    .venv/bin/python benchmarks/program_hashes.py --record   # write program_hashes.json
    .venv/bin/python benchmarks/program_hashes.py --only gemm --jobs 2

A refactor that claims "no behaviour change" must leave every hash equal: the encoded
Program (instruction stream, HBM layout, weights, config, work figures) is the whole
observable result of a compile. The workloads are those of `roofline.py` (cloud, -O2 and
-O0), `models.py` (tiny and cloud), `dsl_kernels.py` (cloud) and every example factory
and tile-DSL kernel in `examples/` (tiny). Autotuning stays off (its winners depend on a
disk cache), and the compile cache is off so every program is built afresh.
A program records its ops' source locations (`file.py:LINE`), so an edit that moves the
lines of a benchmark or example file changes its hashes too: keep those files' line
numbers when comparing. Exit status 1 when a hash differs or a workload that compiled before no longer does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HASHES = Path(__file__).with_name("program_hashes.json")

EXAMPLE_FACTORIES = [
    "mlp.py:mlp", "mlp.py:mlp_odd", "mlp.py:mlp_bf16",
    "transformer_block.py:block", "transformer_block.py:block_bf16",
    "gpt2.py:gpt2", "gpt2.py:gpt2_sdpa", "gpt2.py:gpt2_bf16",
    "bert.py:bert", "resnet.py:resnet18", "mixed.py:mixed", "mixed.py:island",
]
MODEL_TARGETS = ("tiny", "cloud")


def _setup() -> None:
    os.environ["TILECC_COMPILE_CACHE"] = "0"
    for m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(m, types.ModuleType(m))
    for p in (ROOT, ROOT / "benchmarks", ROOT / "examples"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    import warnings

    warnings.filterwarnings("ignore")


def workloads() -> list[str]:
    """Every workload's name: `kind:spec:target[:level]`."""
    _setup()
    import dsl_kernels
    import roofline

    names = [f"roofline:{w}:cloud:{lvl}" for w in roofline.WORKLOADS for lvl in (2, 0)]
    names += [f"example:{spec}:{t}" for spec in EXAMPLE_FACTORIES for t in MODEL_TARGETS]
    names += [f"dsl:{w}:cloud" for w in dsl_kernels.WORKLOADS]
    return names


def _digest(program) -> str:
    return hashlib.sha256(program.to_bytes()).hexdigest()


def compile_one(name: str) -> tuple[str, str]:
    """(name, sha256 of the program) or (name, "error: ...")."""
    _setup()
    import torch

    from tilecc.errors import TileccError

    kind, spec, target, *rest = name.split(":", 3) if not name.startswith("example:") else _split_example(name)
    torch.manual_seed(0)
    try:
        if kind == "roofline":
            import roofline

            from tilecc.frontend.torch_export import export_model, import_exported_program
            from tilecc.runtime.compiler import compile_graph
            from tilecc.simulator.config import load_config

            model, inputs = roofline.WORKLOADS[spec]()
            with torch.no_grad():
                ep = export_model(model.eval(), inputs)
            prog = compile_graph(import_exported_program(ep), load_config(target), opt_level=int(rest[0]))
        elif kind == "example":
            import tilecc
            from tilecc.cli import load_factory

            model, inputs = load_factory(str(ROOT / "examples" / spec))
            prog = tilecc.compile(model, inputs, target=target, cache=False).program
        else:
            import dsl_kernels

            import tilecc

            file, make = dsl_kernels.WORKLOADS[spec]
            k = tilecc.kernel(dsl_kernels.KERNELS / f"{file}.tdsl")
            k.keep_ir = False
            prog = k.compile(*make(), target=target).program
    except TileccError as e:
        return name, f"error: {type(e).__name__}: {str(e).splitlines()[0]}"
    return name, _digest(prog)


def _split_example(name: str) -> list[str]:
    kind, rest = name.split(":", 1)
    spec, target = rest.rsplit(":", 1)
    return [kind, spec, target]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", action="store_true", help="write the hashes instead of comparing")
    ap.add_argument("--only", default="", help="substring of the workload names")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    names = [n for n in workloads() if args.only in n]
    with ProcessPoolExecutor(args.jobs, max_tasks_per_child=1) as pool:
        got = dict(pool.map(compile_one, names))
    if args.record:
        old = json.loads(HASHES.read_text()) if HASHES.exists() and args.only else {}
        old.update(got)
        HASHES.write_text(json.dumps(dict(sorted(old.items())), indent=1) + "\n")
        print(f"recorded {len(got)} program hashes in {HASHES.name}")
        return
    want = json.loads(HASHES.read_text())
    bad = 0
    for n in names:
        status = "same" if want.get(n) == got[n] else ("NEW" if n not in want else "DIFFERENT")
        bad += status != "same"
        print(f"{status:9} {n}  {got[n][:16]}")
    print(f"{len(names) - bad} same, {bad} different")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
