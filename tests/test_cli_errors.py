"""The command line's error contract: one ``error:`` line and exit 2, before any compile
for bad output paths; a model failing in eager said so; an unexpected exception named
with its phase (TILECC_DEBUG=1 re-raises it); NaNs where eager has NaNs match."""

from __future__ import annotations

import json

import pytest
import torch

import tilecc
from tilecc.cli import main
from tilecc.runtime.compare import compare

MODELS = """import torch


def ints():
    return torch.nn.Linear(4, 4), (torch.arange(8).reshape(2, 4),)


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


def nan():
    x = torch.randn(4, 8)
    x[1, 2] = float("nan")
    return Double(), (x,)


def tiny():
    return torch.nn.Linear(8, 4), (torch.randn(2, 8),)
"""


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv", [
    ["run", "{m}:tiny", "--trace", "{d}/nosuch/t.json"],
    ["run", "{m}:tiny", "--save", "{d}"],
    ["sim", "{d}/p.tcp", "--trace", "{d}/nosuch/t.json"],
    ["explore", "{m}:tiny", "--html", "{d}/nosuch/x.html"],
])
def test_bad_output_path_is_reported_before_compiling(argv, models, tmp_path, capsys, monkeypatch):
    def no_compile(*a, **k):
        raise AssertionError("compiled despite a bad output path")

    monkeypatch.setattr(tilecc, "compile", no_compile)
    monkeypatch.setattr("tilecc.runtime.compiler.compile_graph", no_compile)
    argv = [a.format(m=models, d=tmp_path) for a in argv]
    assert main(argv) == 2
    err = _one_error(capsys)
    assert "does not exist" in err or "is a directory" in err


def test_model_failing_in_eager(models, capsys):
    assert main(["run", f"{models}:ints", "--quiet"]) == 2
    err = _one_error(capsys)
    assert err.startswith("error: the model fails in eager PyTorch: RuntimeError: mat1 and mat2")


def test_nan_where_eager_has_nan_matches(models, capsys):
    assert main(["run", f"{models}:nan", "--json", "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allclose"] is True and d["max_abs_error"] == 0.0


def test_nan_where_eager_has_a_number_is_a_mismatch(models, capsys, monkeypatch):
    from tilecc.runtime import executor

    real = executor.run_program

    def poisoned(*a, **k):
        outputs, report = real(*a, **k)
        outputs[0][0, 0] = float("nan")
        return outputs, report

    monkeypatch.setattr(executor, "run_program", poisoned)
    assert main(["run", f"{models}:tiny", "--json", "--quiet"]) == 1
    d = json.loads(capsys.readouterr().out)  # strict JSON: no NaN / Infinity literals
    assert d["allclose"] is False and d["max_abs_error"] is None


def test_compare_nan_and_inf():
    nan, inf = float("nan"), float("inf")
    t = torch.tensor
    assert compare([t([1.0, nan, inf])], [t([1.0, nan, inf])]) == (True, 0.0)
    assert compare([t([1.0, 2.0])], [t([1.0, nan])]) == (False, inf)  # a number where eager has NaN
    assert compare([t([1.0, nan])], [t([1.0, 2.0])]) == (False, inf)  # and the other way round
    assert compare([t([inf])], [t([-inf])]) == (False, inf)
    ok, worst = compare([t([1.0, 2.5])], [t([1.0, 2.0])])
    assert not ok and worst == 0.5
    # the tolerance scales with the finite magnitudes only (an inf does not make it infinite)
    assert compare([t([inf, 1.5])], [t([inf, 1.0])])[0] is False


def test_internal_error_names_the_phase_and_debug_reraises(monkeypatch, capsys):
    def broken(*a, **k):
        raise KeyError("fold")

    monkeypatch.setattr("tilecc.simulator.gemm.gemm", broken)
    assert main(["gemm", "4", "4", "4"]) == 2
    err = _one_error(capsys)
    assert err == ("error: internal error in tilecc gemm: KeyError: 'fold' (please report; "
                   "rerun with TILECC_DEBUG=1 for the traceback)\n")
    monkeypatch.setenv("TILECC_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["gemm", "4", "4", "4"])


def test_internal_error_in_a_pass_names_the_pass(models, monkeypatch, capsys):
    from tilecc.passes.graph_to_tile import conversion

    def broken(lw, op):
        raise IndexError("list index out of range")

    monkeypatch.setattr(conversion, "lower_op", broken)
    assert main(["run", f"{models}:tiny", "--quiet"]) == 2
    assert _one_error(capsys).startswith("error: internal error in lower-graph-to-tile: IndexError: list index")


def test_usage_errors_are_one_line(capsys):
    assert main(["gemm", "1", "x", "3"]) == 2
    assert "argument N: invalid int value: 'x'" in _one_error(capsys)
    assert main(["run", "a\x1cb.py:f", "--nosuch"]) == 2
    assert "--nosuch" in _one_error(capsys)
    assert main(["run", "a\x1cb.py:f"]) == 2  # a control character in the user's text is escaped
    assert "a\\x1cb.py" in _one_error(capsys)


def test_zero_size_graph_ir_is_a_clear_error(tmp_path, capsys):
    ir = tmp_path / "zero.mlir"
    ir.write_text("builtin.module {\n  func.func @forward(%x: tensor<0x8xf32>) -> tensor<0x8xf32> {\n"
                  "    %r = graph.relu %x : tensor<0x8xf32>\n    func.return %r : tensor<0x8xf32>\n  }\n}\n")
    assert main(["explore", str(ir), "--quiet"]) == 2
    assert "has the zero-size type tensor<0x8xf32>: tilecc compiles non-empty tensors" in _one_error(capsys)
