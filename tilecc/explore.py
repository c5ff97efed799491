"""The compiler explorer: every stage of a compile visible, every decision explained.

    tilecc explore examples/transformer_block.py:block --print-ir-after-all --remarks
    tilecc explore model.mlir --stage asm
    tilecc explore examples/mlp.py:mlp --diff --timing --html mlp.html

A source is ``FILE.py:FACTORY`` (the model is exported and imported as `tilecc run`
does), an IR text file at the graph level (``func.func @forward``; weights get seeded
random data and the run is checked against the graph interpreter), or a tile-DSL file
(``SOURCE_LOADERS``: the DSL front end registers its suffix there). The pipeline is
the compiler's own (`runtime.compiler.compile_graph`), observed through its
`before_pass` / `after_pass` instrumentation; the IR after each pass is printed with
every op's ``tilecc.loc`` (its layer and the user's line, ``fc1 (Linear) @ model.py:12``),
the asm listing ends each line with ``# <that location>``, and the passes' remarks (`passes/remarks.py`) say what was
decided and why. `tilecc/explore_html.py` renders the same `Exploration` as one
self-contained HTML page.
"""

from __future__ import annotations

import difflib
import io
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.errors import ModelLoadError, TileccError
from tilecc.simulator import progress

STAGES = ("graph", "tile", "npu", "asm")
# the first pass of the next level: the stage's IR is the IR this pass receives
_STAGE_END = {"graph": "lower-graph-to-tile", "tile": "lower-tile-to-npu"}


class ExploreError(TileccError):
    """A bad explorer request (unknown pass or stage, unreadable source)."""


@dataclass
class Source:
    """What the user gave: a display name, its text (for the HTML page), the graph
    program to compile, and a reference (inputs -> expected outputs, numpy)."""

    name: str
    text: str
    program: Any  # tilecc.ir.graph.GraphProgram
    inputs: tuple
    reference: Callable[[tuple], list]
    frontend_seconds: dict[str, float] = field(default_factory=dict)
    path: str = ""


@dataclass
class PassRecord:
    name: str
    before: str
    after: str
    seconds: float

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass
class Exploration:
    source: Source
    target: str
    opt_level: int
    passes: list[PassRecord]
    remarks: list  # passes.remarks.Remark
    program: Any  # runtime.program.Program
    asm: str
    compile_seconds: float
    report: Any = None  # runtime.report.Report
    trace: dict | None = None
    matches: bool | None = None
    max_abs_error: float = 0.0

    def stage(self, name: str) -> str:
        """The IR text of one stage: graph (what lower-graph-to-tile receives), tile
        (what lower-tile-to-npu receives), npu (after the last pass), asm."""
        if name == "asm":
            return self.asm
        if name == "npu":
            return self.passes[-1].after
        first = _STAGE_END[name]
        for p in self.passes:
            if p.name == first:
                return p.before
        raise ExploreError(f"stage '{name}' is not in this pipeline")

    def pass_names(self) -> list[str]:
        return [p.name for p in self.passes]


# ----------------------------------------------------------------------------- sources


def load_python(spec: str) -> Source:
    import torch

    from tilecc.cli import load_factory, run_eager
    from tilecc.frontend.torch_export import export_model, import_exported_program

    model, inputs = load_factory(spec)
    run_eager(model, inputs)  # a model that fails in eager is reported as such
    progress.report("export")
    t0 = time.perf_counter()
    ep = export_model(model, inputs)
    t1 = time.perf_counter()
    gp = import_exported_program(ep)
    t2 = time.perf_counter()
    path = spec.rpartition(":")[0]

    def reference(args: tuple) -> list:
        with torch.no_grad():
            out = model.eval()(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return Source(spec, _read(path), gp, inputs, reference,
                  {"torch.export": t1 - t0, "import": t2 - t1}, path)


def load_ir(path: str, seed: int = 0) -> Source:
    """A graph-level IR file (``func.func @forward``); weights and inputs are seeded
    random data, the reference is the graph interpreter."""
    import torch

    from tilecc.ir.graph import GraphProgram, WeightOp, shape_of
    from tilecc.ir.graph_interp import run_graph
    from tilecc.opt import parse_module

    text = _read(path)
    t0 = time.perf_counter()
    module = parse_module(text, path)
    gp = GraphProgram(module)
    try:
        fn = gp.func
    except Exception:
        fn = None
    if fn is None:
        raise ExploreError(f"{path}: explore takes graph-level IR (a func.func @forward); "
                           "run tile or npu IR through tilecc-opt")
    _check_non_empty(path, fn)
    rng = np.random.default_rng(seed)
    for op in fn.walk():
        if isinstance(op, WeightOp):
            name = op.weight
            gp.weights[name] = rng.standard_normal(shape_of(op.results[0])).astype(np.float32) * 0.5
    args = fn.body.block.args
    gp.input_names = [f"arg{i}" for i in range(len(args))]
    gp.output_names = [f"out{i}" for i in range(len(fn.function_type.outputs.data))]
    from tilecc.ir.graph import element_dtype
    from tilecc.simulator import numerics

    inputs = []
    for a in args:
        x = torch.from_numpy(rng.standard_normal(shape_of(a)).astype(np.float32))
        inputs.append(x.to(numerics.DTYPE_TO_TORCH[element_dtype(a.type)]))

    def reference(xs: tuple) -> list:
        return [torch.from_numpy(np.asarray(y, dtype=np.float32)) for y in run_graph(gp, list(xs))]

    return Source(path, text, gp, tuple(inputs), reference, {"parse": time.perf_counter() - t0}, path)


def _check_non_empty(path: str, fn: Any) -> None:
    """`ExploreError` at the first value with a zero-size dimension (as the torch
    importer's check: tilecc compiles non-empty tensors)."""
    from xdsl.dialects.builtin import TensorType

    from tilecc.ir.graph import source_loc

    values = [(a, "an argument of @forward") for a in fn.body.block.args]
    values += [(r, f"{op.name} at {source_loc(op)}") for op in fn.walk() for r in op.results]
    for v, what in values:
        if isinstance(v.type, TensorType) and 0 in tuple(v.type.get_shape()):
            raise ExploreError(f"{path}: {what} has the zero-size type {v.type}: tilecc compiles non-empty tensors")


def load_tile_dsl(spec: str) -> Source:
    """A tile-DSL file with its input shapes, ``FILE.tdsl:64x32,32x48,48``: the kernel
    becomes a torch custom op (`Kernel.as_torch_op`) called by a one-op model, so the
    explorer follows it through the same pipeline as models (lower-graph-to-tile inlines
    the kernel's tile IR); the reference is the kernel run directly (`tilecc.kernel`) on
    the same random inputs."""
    import torch

    from tilecc.frontend.dsl.torch_op import TORCH_DTYPE
    from tilecc.frontend.torch_export import export_model, import_exported_program
    from tilecc.kernel_cli import _shapes
    from tilecc.runtime.kernel import kernel as dsl_kernel

    path, _, shapes_text = spec.partition(":")
    text = _read(path)
    k = dsl_kernel(Path(path))
    if not shapes_text:
        example = ",".join("x".join(["64"] * len(p.type.dims)) for p in k.ast.params)
        raise ExploreError(f"'{path}': a tile-DSL source needs its input shapes, one per parameter "
                           f"({', '.join(p.name for p in k.ast.params)}): {path}:{example}")
    shapes = _shapes(shapes_text)
    if len(shapes) != len(k.ast.params):
        raise ExploreError(f"'{spec}': kernel {k.name} takes {len(k.ast.params)} array(s) "
                           f"({', '.join(p.name for p in k.ast.params)}), the shapes give {len(shapes)}")
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(sh, generator=gen).to(TORCH_DTYPE[p.type.dtype])
                   for sh, p in zip(shapes, k.ast.params))
    op = k.as_torch_op(_fresh_op_name("tilecc_explore", k.name))

    class Call(torch.nn.Module):
        def forward(self, *xs):
            return op(*xs)

    t0 = time.perf_counter()
    ep = export_model(Call(), inputs)
    t1 = time.perf_counter()
    gp = import_exported_program(ep)
    t2 = time.perf_counter()

    def reference(xs: tuple) -> list:
        out = k(*xs)
        return list(out) if isinstance(out, tuple) else [out]

    return Source(spec, text, gp, inputs, reference, {"torch.export": t1 - t0, "import": t2 - t1}, path)


def _fresh_op_name(namespace: str, name: str) -> str:
    """``namespace::name_<n>`` with the first n not yet registered with torch (torch's
    operator registry is per process: every explored kernel needs a name of its own)."""
    import torch

    ns = getattr(torch.ops, namespace)
    n = 1
    while hasattr(ns, f"{name}_{n}"):
        n += 1
    return f"{namespace}::{name}_{n}"


# suffix -> loader; FILE.py:FACTORY is recognised by its colon
SOURCE_LOADERS: dict[str, Callable[[str], Source]] = {
    ".mlir": load_ir,
    ".ir": load_ir,
    ".tile": load_tile_dsl,
    ".tdsl": load_tile_dsl,
}


def load_source(spec: str) -> Source:
    path, colon, _ = spec.rpartition(":")
    if colon and path.endswith(".py"):
        return load_python(spec)
    head = spec.partition(":")[0]
    if Path(head).suffix in (".tdsl", ".tile"):
        return load_tile_dsl(spec)
    suffix = Path(spec).suffix
    loader = SOURCE_LOADERS.get(suffix)
    if loader is None:
        if suffix == ".py":
            raise ModelLoadError(f"'{spec}': expected FILE.py:FACTORY")
        raise ExploreError(f"'{spec}': expected FILE.py:FACTORY or a file ending in "
                           + ", ".join(sorted(SOURCE_LOADERS)))
    return loader(spec)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ExploreError(f"'{path}': {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ExploreError(f"'{path}': not UTF-8 text") from None


# ----------------------------------------------------------------------------- running


def explore(
    source: Source,
    target: str = "tiny",
    opt_level: int = 2,
    *,
    run: bool = True,
) -> Exploration:
    """Compile `source` recording the IR around every pass, its time and the remarks;
    with `run`, simulate the program on the source's inputs (compared with the
    reference) and keep the engine timeline (the Perfetto trace, as a dict)."""
    from tilecc.passes.remarks import Remark
    from tilecc.runtime.compiler import CompileStats, compile_graph
    from tilecc.simulator.config import load_config

    if opt_level not in (0, 2):
        raise ExploreError(f"-O{opt_level}: tilecc has -O0 and -O2")
    cfg = load_config(target)
    befores: dict[str, str] = {}
    records: list[PassRecord] = []
    npu_module: list = []

    def before(name: str, module) -> None:
        # nothing changes the module between passes: the IR before a pass is the IR after
        # the previous one (printing costs about 100 us per op; print each state once)
        befores[name] = records[-1].after if records else str(module)

    def after(name: str, module) -> None:
        records.append(PassRecord(name, befores.pop(name), str(module), 0.0))
        if name == "npu-insert-sync":
            npu_module.append(module)

    stats = CompileStats()
    t0 = time.perf_counter()
    program = compile_graph(source.program, cfg, before_pass=before, after_pass=after, stats=stats,
                            opt_level=opt_level)
    seconds = time.perf_counter() - t0
    for r in records:
        r.seconds = stats.pass_seconds.get(r.name, 0.0)
    ex = Exploration(
        source, cfg.name, opt_level, records,
        [Remark.from_dict(d) for d in program.meta.get("remarks", [])],
        program, asm_listing(npu_module[0], program) if npu_module else "", seconds,
    )
    if run:
        _simulate(ex)
    return ex


def _simulate(ex: Exploration) -> None:
    import json

    from tilecc.runtime.compare import compare
    from tilecc.runtime.executor import run_program

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        outputs, report = run_program(ex.program, ex.source.inputs, trace=path)
        ex.trace = json.loads(path.read_text())
    ex.report = report
    ex.matches, ex.max_abs_error = compare(outputs, ex.source.reference(ex.source.inputs))


def asm_listing(module, program=None) -> str:
    """The program's assembly, one line per record, each ending in ``# file:line`` of
    the op it came from; a comment line names each kernel (`parse_asm` reads it back).
    With `program`, its final stream is listed (linked kernels: the cross-kernel waits
    and only the barriers the link kept, codegen/link.py); each kernel's records are its
    launch's records in order, so the locations still apply."""
    from tilecc.codegen.asm import print_asm
    from tilecc.codegen.expand import barrier, launches

    spans = list(program.kernels) if program is not None else None
    final = program.stream if program is not None else None
    out: list[str] = []
    end = 0
    for i, (name, stream, origin, insts, k) in enumerate(launches(module)):
        if spans is not None and final is not None and i < len(spans) and spans[i][2] == len(stream):
            first = spans[i][1]
            if first > end:  # a barrier the link kept (or the expansion's own)
                out.append(print_asm(final[end:first]).rstrip("\n"))
            stream, end = final[first : first + len(stream)], first + len(stream)
        out.append(f"# kernel {name}{_loc_suffix(k)}")
        locs = [_loc_of(i.op) for i in insts]
        text = print_asm(stream) if stream.size else ""
        for line, o in zip(text.splitlines(), origin.tolist()):
            out.append(f"{line}  # {locs[o]}" if locs[o] else line)
        if spans is None:
            out.append(print_asm(barrier()).rstrip("\n"))
    if final is not None and end < len(final):
        out.append(print_asm(final[end:]).rstrip("\n"))
    return "\n".join(out) + "\n"


def _loc_of(op) -> str:
    loc = op.attributes.get("tilecc.loc")
    return loc.data if loc is not None else ""


def _loc_suffix(op) -> str:
    loc = _loc_of(op)
    return f" ({loc})" if loc else ""


# ----------------------------------------------------------------------------- text output


def dump_header(kind: str, name: str) -> str:
    return f"// -----// IR Dump {kind} {name} //----- //"


def render_text(
    ex: Exploration,
    *,
    print_after_all: bool = False,
    print_after: tuple[str, ...] = (),
    print_before: tuple[str, ...] = (),
    stage: str | None = None,
    diff: bool = False,
    timing: bool = False,
    remarks: bool = False,
) -> str:
    """What `tilecc explore` prints, in MLIR's formats (IR dumps, pass timing)."""
    names = ex.pass_names()
    for p in (*print_after, *print_before):
        if p not in names:
            raise ExploreError(f"unknown pass '{p}' (this pipeline runs {', '.join(names)})")
    if stage is not None and stage not in STAGES:
        raise ExploreError(f"unknown stage '{stage}' (expected {', '.join(STAGES)})")
    out = io.StringIO()
    if print_after_all:
        out.write(dump_header("Before", names[0]) + "\n" + ex.passes[0].before + "\n\n")
    for p in ex.passes:
        if p.name in print_before:
            out.write(dump_header("Before", p.name) + "\n" + p.before + "\n\n")
        if print_after_all or p.name in print_after:
            out.write(dump_header("After", p.name) + "\n" + p.after + "\n\n")
    if print_after_all:
        out.write("// -----// asm //----- //\n" + ex.asm + "\n")
    if diff:
        for p in ex.passes:
            out.write(pass_diff(p))
    if stage is not None:
        out.write(ex.stage(stage) + ("\n" if stage != "asm" else ""))
    if remarks:
        out.write(remarks_text(ex))
    if timing:
        out.write(timing_table(ex))
    if ex.report is not None and not stage:
        verdict = "yes" if ex.matches else "NO"
        out.write(f"// simulated {ex.report.cycles:,.0f} cycles on {ex.target}; matches the reference: "
                  f"{verdict} (max abs error {ex.max_abs_error:.3g})\n")
    return out.getvalue()


def pass_diff(p: PassRecord) -> str:
    if not p.changed:
        return f"// -----// {p.name}: no change //----- //\n\n"
    return f"// -----// Diff {p.name} //----- //\n" + unified_diff(p.before, p.after, p.name) + "\n\n"


def unified_diff(before: str, after: str, name: str, context: int = 2) -> str:
    """A unified diff of two IR texts. GNU diff (Myers' algorithm) where it exists:
    difflib's matcher is quadratic on the long, repetitive texts a lowering produces
    (minutes for a GPT-2 block's tile IR)."""
    exe = shutil.which("diff")
    if exe is None:
        return "\n".join(difflib.unified_diff(before.splitlines(), after.splitlines(), f"before {name}",
                                               f"after {name}", lineterm="", n=context))
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / "a", Path(d) / "b"
        a.write_text(before + "\n")
        b.write_text(after + "\n")
        p = subprocess.run([exe, f"-U{context}", "--label", f"before {name}", "--label", f"after {name}", str(a),
                            str(b)], capture_output=True, text=True)
    if p.returncode > 1:
        raise ExploreError(f"diff failed: {p.stderr.strip()}")
    return p.stdout.rstrip("\n")


def remarks_text(ex: Exploration) -> str:
    lines = [f"// -----// Remarks ({len(ex.remarks)}) //----- //"]
    lines += [str(r) for r in ex.remarks]
    return "\n".join(lines) + "\n\n"


def timing_rows(ex: Exploration) -> list[tuple[str, float]]:
    rows = list(ex.source.frontend_seconds.items())
    rows += [(p.name, p.seconds) for p in ex.passes]
    return rows


def timing_table(ex: Exploration) -> str:
    """MLIR's ``--mlir-timing`` report: wall time per pass and its share of the total."""
    rows = timing_rows(ex)
    total = sum(s for _, s in rows) or 1e-12
    bar = "===" + "-" * 73 + "==="
    lines = [bar, "... Execution time report ...".center(79), bar,
             f"  Total Execution Time: {total:.4f} seconds", "", "  ----Wall Time----  ----Name----"]
    lines += [f"  {s:8.4f} ({100 * s / total:5.1f}%)  {name}" for name, s in rows]
    lines.append(f"  {total:8.4f} (100.0%)  Total")
    return "\n".join(lines) + "\n\n"


__all__ = ["Exploration", "Source", "SOURCE_LOADERS", "STAGES", "explore", "load_source", "render_text"]
