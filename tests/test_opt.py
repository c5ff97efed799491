"""tilecc-opt (the mlir-opt-style driver) and the generic form's exchange with real MLIR."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tilecc.opt import main, parse_module, pass_names
from tilecc.passes.registry import PASSES

HERE = Path(__file__).parent
GRAPH = HERE / "filecheck/passes/pipeline.mlir"
TILE = HERE / "filecheck/dialects/roundtrip.mlir"


def _run(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_passes(capsys):
    rc, out, _ = _run(["--list-passes"], capsys)
    names = out.split()
    assert rc == 0 and names[: len(PASSES)] == sorted(PASSES)
    assert {"canonicalize", "cse", "dce"} <= set(names)  # xDSL's own passes come too
    assert names == pass_names()


def test_any_pipeline_on_a_file(capsys, tmp_path):
    from tilecc.passes.registry import pipeline_spec

    out_file = tmp_path / "out.mlir"
    rc, out, err = _run([str(GRAPH), "-p", pipeline_spec("tiny"), "-o", str(out_file)], capsys)
    assert rc == 0 and out == "" and err == ""
    text = out_file.read_text()
    assert 'npu.kernel "k0_fused_matmul"' in text and "npu.matmul" in text
    module = parse_module(text, str(out_file))  # the output parses back and verifies
    assert module.ops.first is not None


def test_stdin_generic_and_options(capsys, monkeypatch):
    src = TILE.read_text()
    rc, generic, _ = _run(["-", "-p", "plan-sram{target=tiny},cse", "--print-op-generic"], capsys, src, monkeypatch)
    assert rc == 0 and generic.startswith('"builtin.module"() ({')
    assert '"tile.alloc"() <{buffer = "a", offset = 0 : i64}>' in generic
    rc, custom, _ = _run([], capsys, generic, monkeypatch)  # stdin when no file is named
    assert rc == 0 and 'tile.alloc {buffer = "a", offset = 0 : i64}' in custom


def test_errors_are_one_line(capsys, monkeypatch, tmp_path):
    rc, _, err = _run(["-", "-p", "no-such-pass"], capsys, "builtin.module {}", monkeypatch)
    assert rc == 2 and err == "error: Unrecognized passes: ['no-such-pass']\n"
    rc, _, err = _run(["-", "-p", "plan-sram{target=nowhere}"], capsys, "builtin.module {}", monkeypatch)
    assert rc == 2 and err.startswith("error: unknown target 'nowhere'") and err.count("\n") == 1
    rc, _, err = _run([str(tmp_path / "missing.mlir")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "missing.mlir" in err
    bad = "builtin.module {\n  func.func @f() {\n    graph.bogus\n  }\n}\n"
    rc, _, err = _run(["-"], capsys, bad, monkeypatch)
    assert rc == 2 and err.startswith("error: stdin:") and err.count("\n") == 1
    assert "graph.bogus is not registered" in err


def test_stock_xdsl_opt_knows_tilecc():
    exe = Path(sys.executable).parent / "xdsl-opt"
    p = subprocess.run([str(exe), str(TILE), "-p", "plan-sram{target=tiny}"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert 'tile.alloc {buffer = "a", offset = 0 : i64}' in p.stdout


def _iree_opt() -> str:
    exe = shutil.which("iree-opt") or str(Path(sys.executable).parent / "iree-opt")
    if not Path(exe).exists():
        pytest.skip("iree-opt is absent (pip install iree-base-compiler ships it)")
    return exe


@pytest.mark.parametrize("pipeline", [
    "",  # the graph dialect as written
    "lower-graph-to-tile{target=tiny opt_level=0},plan-sram{target=tiny},plan-hbm{target=tiny}",  # tile level
])
def test_generic_form_round_trips_through_iree_opt(pipeline, capsys, monkeypatch):
    """Real MLIR (iree-opt) parses and verifies the generic form of func, arith, scf and
    memref around tilecc's ops (unregistered there), and what it prints parses back into
    the same module."""
    iree_opt = _iree_opt()
    rc, generic, err = _run([str(GRAPH), "-p", pipeline, "--print-op-generic"] if pipeline else
                            [str(GRAPH), "--print-op-generic"], capsys)
    assert rc == 0, err
    p = subprocess.run([iree_opt, "--allow-unregistered-dialect", "--mlir-print-op-generic", "-"],
                       input=generic, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    ours, theirs = parse_module(generic), parse_module(p.stdout, "<iree-opt>")
    assert ours.is_structurally_equivalent(theirs)
    if pipeline:
        assert '"scf.for"' in p.stdout or '"arith.constant"' in p.stdout
