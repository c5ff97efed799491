"""The `tilecc` command line.

    tilecc run FILE.py:FACTORY [--target NAME_OR_TOML] [--json] [--save PROGRAM]

`FACTORY()` returns `(model, example_inputs)`. The model is exported, compiled for the
target, run on the simulator and compared with torch eager on the same inputs.
Errors print one line (`error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from tilecc.errors import ModelLoadError, TileccError


def load_factory(spec: str) -> tuple[Any, tuple]:
    """Run `FILE.py:FACTORY` and return (model, example_inputs)."""
    if ":" not in spec:
        raise ModelLoadError(f"'{spec}': expected FILE.py:FACTORY")
    path_s, _, name = spec.rpartition(":")
    path = Path(path_s)
    if not path.is_file():
        raise ModelLoadError(f"'{path_s}': no such file")
    mod_name = f"tilecc_user_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelLoadError(f"'{path_s}': cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:  # the user's file failed: report it, in one line
        raise ModelLoadError(f"'{path_s}' raised {type(e).__name__}: {e}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ModelLoadError(f"'{path_s}' has no callable '{name}'")
    try:
        result = factory()
    except Exception as e:
        raise ModelLoadError(f"{spec}() raised {type(e).__name__}: {e}") from None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelLoadError(f"{spec}() must return (model, example_inputs)")
    model, inputs = result
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    return model, tuple(inputs)


def tolerance(dtype, scale: float = 1.0) -> tuple[float, float]:
    """(rtol, atol) used to compare with eager for an output dtype.

    `scale` is the largest magnitude of the expected output: in bf16 a small result
    computed from large cancelling values carries the rounding step of those values.
    """
    import torch

    scale = max(1.0, scale)
    if dtype == torch.bfloat16:
        return 2e-2, 2e-2 * scale
    if dtype == torch.float16:
        return 2e-3, 2e-3 * scale
    return 1e-4, 1e-5 * scale


def compare(outputs: list, expected: list) -> tuple[bool, float]:
    import torch

    ok, worst = True, 0.0
    for y, r in zip(outputs, expected, strict=True):
        r = r.detach()
        rtol, atol = tolerance(r.dtype, float(r.float().abs().max()) if r.numel() else 1.0)
        diff = (y.float() - r.float()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= bool(torch.allclose(y.float(), r.float(), rtol=rtol, atol=atol))
    return ok, worst


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    import tilecc
    from tilecc.simulator.config import load_config

    cfg = load_config(args.target)
    model, inputs = load_factory(args.source)
    t0 = time.perf_counter()
    cm = tilecc.compile(model, inputs, target=cfg)
    compile_seconds = time.perf_counter() - t0
    out = cm(*inputs)
    outputs = list(out) if isinstance(out, tuple) else [out]
    with torch.no_grad():
        ref = model.eval()(*inputs)
    expected = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    ok, worst = compare(outputs, expected)
    if args.save:
        cm.save(args.save)
    report = cm.report
    assert report is not None
    if args.json:
        d = report.to_dict()
        d.update(
            allclose=ok,
            max_abs_error=worst,
            compile_seconds=compile_seconds,
            simulate_seconds=report.simulate_seconds,
            source=args.source,
        )
        print(json.dumps(d, sort_keys=True))
    else:
        print(f"model             {args.source}")
        print(f"compile           {compile_seconds:.2f} s, simulate {report.simulate_seconds:.2f} s")
        print(f"matches eager     {'yes' if ok else 'NO'} (max abs error {worst:.3g})")
        print(report)
    return 0 if ok else 1


def cmd_coverage(args: argparse.Namespace) -> int:
    from tilecc.frontend.coverage import coverage
    from tilecc.frontend.torch_export import export_model

    model, inputs = load_factory(args.source)
    report = coverage(export_model(model, inputs))
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(report)
    return 0 if report.supported else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tilecc", description="A tensor compiler for tile-based NPUs.")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile a model, run it on the simulator, compare with eager")
    run.add_argument("source", help="FILE.py:FACTORY, FACTORY() returns (model, example_inputs)")
    run.add_argument("--target", default="tiny", help="preset name (tiny, edge, cloud) or a TOML file")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--save", help="write the compiled program to this file")
    run.set_defaults(fn=cmd_run)
    cov = sub.add_parser("coverage", help="list a model's ops and which tilecc supports (no run)")
    cov.add_argument("source", help="FILE.py:FACTORY")
    cov.add_argument("--json", action="store_true")
    cov.set_defaults(fn=cmd_coverage)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        return args.fn(args)
    except TileccError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
