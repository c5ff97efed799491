"""`tilecc kernel`: a tile-DSL kernel from the command line; errors in one line, status 2."""

from __future__ import annotations

from pathlib import Path

from tilecc.cli import main

SOFTMAX = Path(__file__).resolve().parent.parent / "examples" / "kernels" / "softmax.tdsl"


def test_kernel_runs_and_reports(capsys):
    assert main(["kernel", str(SOFTMAX), "--shapes", "37x20"]) == 0
    out = capsys.readouterr().out
    assert "kernel            softmax" in out and "cycles" in out and "roofline ratio" in out


def test_kernel_emits_a_stage(capsys):
    assert main(["kernel", str(SOFTMAX), "--shapes", "5x7", "--emit", "asm"]) == 0
    assert "vec.exp" in capsys.readouterr().out


def test_kernel_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.tdsl"
    bad.write_text("kernel f(a: f32[M]) -> f32[M]:\n    out[:] = = 1\n")
    assert main(["kernel", str(bad), "--shapes", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}:2:14: syntax error: expected ")
    assert main(["kernel", str(SOFTMAX), "--shapes", "4x4,3"]) == 2
    assert "kernel softmax takes 1 tensor(s) (x), --shapes gives 2" in capsys.readouterr().err
