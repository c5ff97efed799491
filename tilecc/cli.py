"""The `tilecc` command line.

    tilecc run FILE.py:FACTORY [--target NAME_OR_TOML] [--json] [--save PROGRAM]
    tilecc run FILE.py:FACTORY --system SPEC --tp N [--sp] | --pp N [--micro-batches M]  (system_cli.py)
    tilecc explain FILE.py:FACTORY [--target NAME_OR_TOML] [--training] [--json]
    tilecc explore SOURCE [--print-ir-after-all] [--remarks] [--html PAGE] ...  (tilecc/explore.py)
    tilecc bisect FILE.py:FACTORY [--target NAME_OR_TOML]   (docs/reliability.md)
    tilecc sweep SPEC.toml --out DIR [--workers N] [--resume] ...   (tilecc/sweep/cli.py)
    tilecc generate FILE.py:FACTORY --prompt-len P --new-tokens N [--batch B] ...  (tilecc/generate_cli.py)
    tilecc collective OP --bytes N --topology T [--mode ideal|contention] ...  (docs/system.md)

`FACTORY()` returns `(model, example_inputs)`. The model is run in eager PyTorch (a model
that fails there is reported as such), exported, compiled for the target, run on the
simulator and compared with the eager result.

No traceback reaches the user: a bad argument, a missing or unwritable output path
(checked before anything is compiled) and every `TileccError` print one line
(``error: ...``) and exit with status 2; any other exception prints ``error: internal
error in <phase>: <Type>: <msg> (please report; ...)`` and exits 2 (``TILECC_DEBUG=1``
re-raises it). Long compiles and simulations show a progress line on a terminal's stderr
(`tilecc/progress_display.py`; ``--quiet`` silences it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from tilecc.cli_args import ArgumentParser, add_quiet, one_line, output_file
from tilecc.errors import ModelLoadError, TileccError
from tilecc.progress_display import ProgressDisplay
from tilecc.runtime.compare import compare
from tilecc.simulator import progress

DEBUG_ENV = "TILECC_DEBUG"  # set: unexpected exceptions keep their traceback


def run_eager(model: Any, inputs: tuple) -> list:
    """The model's outputs in eager PyTorch (eval mode, no grad), as a list;
    `ModelLoadError` ("the model fails in eager PyTorch: ...") if it raises."""
    import torch

    progress.report("eager")
    try:
        with torch.no_grad():
            out = model.eval()(*inputs)
    except Exception as e:  # the user's model: report it in one line
        raise ModelLoadError(f"the model fails in eager PyTorch: {type(e).__name__}: {_first_line(e)}") from None
    return list(out) if isinstance(out, (tuple, list)) else [out]


def load_factory(spec: str) -> tuple[Any, tuple]:
    """Run `FILE.py:FACTORY` and return (model, example_inputs)."""
    progress.report("load")
    if ":" not in spec:
        raise ModelLoadError(f"'{spec}': expected FILE.py:FACTORY")
    path_s, _, name = spec.rpartition(":")
    path = Path(path_s)
    if not path.is_file():
        raise ModelLoadError(f"'{path_s}': no such file")
    if path.suffix != ".py":
        raise ModelLoadError(f"'{path_s}': expected a Python file (FILE.py:FACTORY)")
    mod_name = f"tilecc_user_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelLoadError(f"'{path_s}': cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as e:  # the user's file failed (a SyntaxError, a sys.exit): one line
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ModelLoadError(f"'{path_s}' raised {type(e).__name__}: {_first_line(e)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ModelLoadError(f"'{path_s}' has no callable '{name}'")
    try:
        result = factory()
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ModelLoadError(f"{spec}() raised {type(e).__name__}: {_first_line(e)}") from None
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelLoadError(f"{spec}() must return (model, example_inputs)")
    model, inputs = result
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    return model, tuple(inputs)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass


def _tilecc_cause(e: BaseException) -> TileccError | None:
    """The `TileccError` that `e` wraps (its ``__cause__`` / ``__context__`` chain, or
    dynamo's ``inner_exception``), if any."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, TileccError):
            return cur
        seen.add(id(cur))
        inner = getattr(cur, "inner_exception", None)
        cur = inner if isinstance(inner, BaseException) else (cur.__cause__ or cur.__context__)
    return None


def _first_line(e: BaseException) -> str:
    return one_line(str(e))


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    import tilecc
    from tilecc.runtime.executor import run_program
    from tilecc.simulator.config import load_config
    from tilecc.system_cli import cmd_run_system, wants_system

    if wants_system(args):  # many chips (tilecc/system_cli.py)
        return cmd_run_system(args, load_factory, run_eager)
    cfg = load_config(args.target)
    model, inputs = load_factory(args.source)
    expected = run_eager(model, inputs)
    progress.report("export")
    t0 = time.perf_counter()
    cm = tilecc.compile(model, inputs, target=cfg, opt_level=args.opt_level, autotune=args.autotune,
                        cache=False if args.no_cache else None)
    compile_seconds = time.perf_counter() - t0
    if cm.program is None:  # only a dynamic-shape compile leaves it unset
        raise TileccError(f"{args.source}: compiled with dynamic shapes; `tilecc run` takes static ones")
    outputs, report = run_program(cm.program, inputs, trace=args.trace, sanitize=not args.no_sanitize,
                                  critical_path=args.critical_path)
    cm.report = report
    progress.report("compare")
    if len(outputs) != len(expected):
        raise TileccError(f"{args.source}: the compiled program has {len(outputs)} output(s), eager {len(expected)}")
    ok, worst = compare(outputs, [torch.as_tensor(r) for r in expected])
    if args.save:
        cm.save(args.save)
    report = cm.report
    assert report is not None
    if args.json:
        d = report.to_dict()
        d.update(
            allclose=ok,
            max_abs_error=worst if math.isfinite(worst) else None,  # NaN against a number: strict JSON
            compile_seconds=compile_seconds,
            compile_cache=cm.compile_stats.cache if cm.compile_stats else "",
            simulate_seconds=report.simulate_seconds,
            source=args.source,
        )
        print(json.dumps(d, sort_keys=True))
    else:
        print(f"model             {args.source}")
        cached = " (from the compile cache)" if cm.compile_stats and cm.compile_stats.cache == "hit" else ""
        print(f"compile           {compile_seconds:.2f} s{cached}, simulate {report.simulate_seconds:.2f} s")
        print(f"matches eager     {'yes' if ok else 'NO'} (max abs error {worst:.3g})")
        print(report)
        if args.trace:
            print(f"trace             {args.trace} (open in ui.perfetto.dev)")
    return 0 if ok else 1


def cmd_gemm(args: argparse.Namespace) -> int:
    from tilecc.simulator.gemm import gemm

    r = gemm(
        args.M, args.N, args.K, args.target,
        rows=args.rows, cols=args.cols, dataflow=args.dataflow, mode=args.mode, dtype=args.dtype,
    )
    if args.json:
        print(json.dumps(r, sort_keys=True))
        return 0
    print(
        f"GEMM {args.M} x {args.N} x {args.K} ({r['dtype']}) on a {r['rows']} x {r['cols']} array, "
        f"{r['dataflow']} dataflow, {r['mode']} mode"
    )
    print(f"compute cycles    {r['compute_cycles']:,}  ({r['time_us']:,.2f} us at {r['clock_ghz']} GHz)")
    print(f"utilisation       {r['utilization']:.2f} %")
    print(f"folds             {r['folds']:,}")
    print(f"MACs              {r['macs']:,}")
    print(f"simulated in      {r['wall_seconds'] * 1e3:.1f} ms")
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    import torch

    from tilecc.runtime.executor import run_program
    from tilecc.runtime.program import Program
    from tilecc.simulator import numerics
    from tilecc.simulator.config import load_config

    program = Program.load(args.program)
    if args.target:
        program.config = load_config(args.target)
    gen = torch.Generator().manual_seed(args.seed)
    inputs = []
    data = _load_npz(args.inputs, [s.name for s in program.inputs]) if args.inputs else None
    for spec in program.inputs:
        dtype = numerics.DTYPE_TO_TORCH[spec.dtype]
        if data is not None:
            inputs.append(torch.from_numpy(data[spec.name]).to(dtype))
        else:
            inputs.append(torch.randn(spec.shape, generator=gen).to(dtype))
    outputs, report = run_program(program, tuple(inputs), trace=args.trace, sanitize=True,
                                  critical_path=args.critical_path)
    if args.json:
        d = report.to_dict()
        d["outputs"] = [{"name": s.name, "shape": list(s.shape)} for s in program.outputs]
        print(json.dumps(d, sort_keys=True))
    else:
        print(f"program           {args.program}")
        print(report)
        if args.trace:
            print(f"trace             {args.trace}")
    return 0


def _load_npz(path: str, names: list[str]) -> dict:
    """The arrays of an .npz file, one per program input (InputMismatchError naming the
    file and the missing input otherwise)."""
    import zipfile

    import numpy as np

    from tilecc.errors import InputMismatchError

    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        why = "not a zip archive of .npy arrays" if not zipfile.is_zipfile(path) else str(e).split(". ")[0]
        raise InputMismatchError(f"{path}: cannot be read as an .npz file ({why})") from None
    for name in names:
        if name not in data:
            raise InputMismatchError(
                f"{path}: no array named '{name}' (the program's inputs: {', '.join(names)}; "
                f"the file has: {', '.join(sorted(data)) or 'nothing'})"
            )
    return data


def cmd_coverage(args: argparse.Namespace) -> int:
    from tilecc.frontend.coverage import coverage
    from tilecc.frontend.torch_export import export_model

    model, inputs = load_factory(args.source)
    run_eager(model, inputs)
    progress.report("coverage")
    report = coverage(export_model(model, inputs))
    if args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(report)
    return 0 if report.supported else 1


def cmd_explain(args: argparse.Namespace) -> int:
    from tilecc.explanation import explain
    from tilecc.simulator.config import load_config

    load_config(args.target)  # a bad target is reported before torch.compile wraps the error
    model, inputs = load_factory(args.source)
    run_eager(model, inputs)
    progress.report("torch.compile")
    e = explain(model, *inputs, target=args.target, training=args.training)
    print(json.dumps(e.to_dict(), sort_keys=True) if args.json else e)
    return 0


def cmd_bisect(args: argparse.Namespace) -> int:
    from tilecc.runtime.bisect import bisect
    from tilecc.simulator.config import load_config

    cfg = load_config(args.target)
    model, inputs = load_factory(args.source)
    run_eager(model, inputs)
    progress.report("bisect")
    result = bisect(model, inputs, cfg, opt_level=args.opt_level)
    print(f"model              {args.source} (target {cfg.name}, -O{args.opt_level})")
    print(result)
    return 0 if result.matches else 1


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="tilecc", description="A tensor compiler for tile-based NPUs.")
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile a model, run it on the simulator, compare with eager")
    run.add_argument("source", help="FILE.py:FACTORY, FACTORY() returns (model, example_inputs)")
    run.add_argument("--target", default="tiny", help="preset name (tiny, edge, cloud) or a TOML file")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("-O", dest="opt_level", type=int, choices=[0, 2], default=2,
                     help="-O0: baseline kernels (the reference for every figure); -O2 (default): optimised")
    run.add_argument("--autotune", action="store_true",
                     help="pick each matmul kernel's schedule by simulating candidates (cached in "
                          "$TILECC_CACHE_DIR or ~/.cache/tilecc; a second run skips the search)")
    run.add_argument("--no-cache", action="store_true",
                     help="compile afresh, without the compile cache ($TILECC_CACHE_DIR or ~/.cache/tilecc)")
    run.add_argument("--save", type=output_file, help="write the compiled program to this file")
    run.add_argument("--trace", type=output_file, help="write a Perfetto / Chrome-trace timeline (JSON) here")
    run.add_argument("--no-sanitize", action="store_true", help="skip the race / uninitialised-read checks")
    run.add_argument("--critical-path", action="store_true",
                     help="report the chain of instructions that set the cycles, by kind and by kernel")
    from tilecc.system_cli import add_arguments as add_system_arguments  # many chips

    add_system_arguments(run)
    add_quiet(run)
    run.set_defaults(fn=cmd_run)
    sim = sub.add_parser("sim", help="run a saved program on the simulator")
    sim.add_argument("program", help="a program file written by `tilecc run --save`")
    sim.add_argument("--target", help="simulate on another config (preset or TOML)")
    sim.add_argument("--inputs", help=".npz file with one array per input name (default: random)")
    sim.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    sim.add_argument("--trace", type=output_file, help="write a Perfetto / Chrome-trace timeline (JSON) here")
    sim.add_argument("--json", action="store_true")
    sim.add_argument("--critical-path", action="store_true",
                     help="report the chain of instructions that set the cycles, by kind and by kernel")
    add_quiet(sim)
    sim.set_defaults(fn=cmd_sim)
    gm = sub.add_parser("gemm", help="cycles of one GEMM layer on a systolic array (SCALE-Sim's question)")
    gm.add_argument("M", type=int)
    gm.add_argument("N", type=int)
    gm.add_argument("K", type=int)
    gm.add_argument("--target", default="cloud", help="preset or TOML (default: cloud)")
    gm.add_argument("--rows", type=int, help="array rows (overrides the config)")
    gm.add_argument("--cols", type=int, help="array columns (overrides the config)")
    gm.add_argument("--dataflow", choices=["ws", "os", "is"])
    gm.add_argument("--mode", choices=["compatible", "pipelined"])
    gm.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    gm.add_argument("--json", action="store_true")
    gm.set_defaults(fn=cmd_gemm)
    cov = sub.add_parser("coverage", help="list a model's ops and which tilecc supports (no run)")
    cov.add_argument("source", help="FILE.py:FACTORY")
    cov.add_argument("--json", action="store_true")
    cov.set_defaults(fn=cmd_coverage)
    from tilecc.kernel_cli import add_parser as add_kernel_parser  # the tile DSL

    add_kernel_parser(sub)
    ex = sub.add_parser("explain", help="how torch.compile(backend='tilecc') splits a model: NPU "
                                        "partitions, fallback ops with source line and reason, transfers")
    ex.add_argument("source", help="FILE.py:FACTORY")
    ex.add_argument("--target", default="tiny", help="preset name (tiny, edge, cloud) or a TOML file")
    ex.add_argument("--training", action="store_true", help="also run a backward pass and explain its graph")
    ex.add_argument("--json", action="store_true")
    add_quiet(ex)
    ex.set_defaults(fn=cmd_explain)
    from tilecc.generate_cli import add_parser as add_generate_parser  # LLM decoding (tilecc/llm/)

    add_generate_parser(sub)
    from tilecc.collective_cli import add_parser as add_collective_parser  # many chips: one collective

    add_collective_parser(sub)
    from tilecc.explore_cli import add_explore_parser

    add_explore_parser(sub)
    from tilecc.sweep.cli import add_sweep_parser

    add_sweep_parser(sub)
    bis = sub.add_parser("bisect", help="when a compiled model disagrees with eager: the first op that "
                                        "differs and the first pass after which the result changes")
    bis.add_argument("source", help="FILE.py:FACTORY")
    bis.add_argument("--target", default="tiny", help="preset name or a TOML file")
    bis.add_argument("-O", dest="opt_level", type=int, choices=[0, 2], default=2)
    add_quiet(bis)
    bis.set_defaults(fn=cmd_bisect)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv`; the exit status (0 ok, 1 a finding such as "does not
    match eager", 2 an error reported in one line on stderr, 130 interrupted)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error, already printed in one line
        return e.code if isinstance(e.code, int) else 2
    debug = bool(os.environ.get(DEBUG_ENV))
    display = ProgressDisplay(enabled=not getattr(args, "quiet", False))
    try:
        with warnings.catch_warnings(), display:
            warnings.simplefilter("default" if debug else "ignore")  # a library's warning is no error line
            return args.fn(args)
    except TileccError as e:
        print(f"error: {_first_line(e) or type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tilecc ... | head`: the reader has gone, nothing to report
        _silence_stdout()
        return 0
    except Exception as e:
        cause = _tilecc_cause(e)  # torch.compile wraps the backend's errors
        if cause is not None:
            print(f"error: {_first_line(cause) or type(cause).__name__}", file=sys.stderr)
            return 2
        if debug:
            raise
        phase = display.phase or f"tilecc {args.command}"
        print(f"error: internal error in {phase}: {type(e).__name__}: {_first_line(e)} "
              f"(please report; rerun with {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
