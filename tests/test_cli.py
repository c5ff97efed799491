"""The tilecc command line, run as a user would (subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
TILECC = [sys.executable, "-m", "tilecc.cli"]


def run(*args, cwd=ROOT):
    return subprocess.run([*TILECC, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_run_json_mlp_odd_sizes():
    p = run("run", "examples/mlp.py:mlp_odd", "--target", "tiny", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["allclose"] is True
    assert d["cycles"] > 0 and d["roofline_ratio"] >= 1.0
    for key in ("max_abs_error", "roofline_cycles", "instructions", "compile_seconds", "simulate_seconds"):
        assert key in d
    # the bound is the workload's; the program's own work is a figure of its own, never below it
    assert set(d["roofline_components"]) == set(d["program_work_components"]) == {"matrix", "hbm", "vector"}
    assert d["program_work_cycles"] >= d["roofline_cycles"] > 0 and d["clock_ghz"] > 0


def test_run_readable_report_and_save(tmp_path):
    out = tmp_path / "mlp.tlc"
    p = run("run", "examples/mlp.py:mlp_bf16", "--save", str(out))
    assert p.returncode == 0, p.stderr
    assert "matches eager     yes" in p.stdout
    assert "roofline ratio" in p.stdout and "of the bound): the compiler's added work" in p.stdout
    assert "core clock" in p.stdout
    assert out.stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "nothere.py:f"], "error: 'nothere.py': no such file"),
        (["run", "examples/mlp.py"], "error: 'examples/mlp.py': expected FILE.py:FACTORY"),
        (["run", "examples/mlp.py:nope"], "error: 'examples/mlp.py' has no callable 'nope'"),
        (["run", "examples/mlp.py:mlp", "--target", "huge"], "error: unknown target 'huge'"),
    ],
)
def test_errors_are_one_line_exit_2(args, message):
    p = run(*args)
    assert p.returncode == 2
    assert p.stderr.startswith(message)
    assert len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_unsupported_op_lists_all_places(tmp_path):
    src = tmp_path / "bad.py"
    src.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = torch.cumprod(x, 0)\n"
        "        return torch.digamma(y)\n"
        "def make():\n"
        "    return M(), (torch.randn(4, 4),)\n"
    )
    p = run("run", f"{src}:make")
    assert p.returncode == 2
    assert "aten.cumprod" in p.stderr and "bad.py:4" in p.stderr
    assert "aten.digamma" in p.stderr and "bad.py:5" in p.stderr


COVERAGE_MODEL = (
    "import torch\n"
    "class M(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__(); self.fc = torch.nn.Linear(8, 8)\n"
    "    def forward(self, x):\n"
    "        y = torch.cumprod(self.fc(x), 0)\n"
    "        z = torch.digamma(y)\n"
    "        return torch.cumprod(z, 1) + torch.relu(x)\n"
    "def make():\n"
    "    return M(), (torch.randn(4, 8),)\n"
)


def test_coverage_lists_every_unsupported_place(tmp_path):
    src = tmp_path / "cov.py"
    src.write_text(COVERAGE_MODEL)
    p = run("coverage", f"{src}:make", "--json")
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)
    ops = {o["op"]: o for o in d["ops"]}
    assert d["supported"] is False
    assert ops["aten.cumprod.default"]["count"] == 2
    assert ops["aten.cumprod.default"]["places"] == ["cov.py:6", "cov.py:8"]
    assert ops["aten.digamma.default"]["places"] == ["cov.py:7"]
    assert ops["aten.addmm.default"]["status"] == "supported"
    assert ops["aten.permute.default"]["status"] == "folded"  # the weight transpose
    text = run("coverage", f"{src}:make").stdout
    assert "at cov.py:8" in text and "2 unsupported" in text


def test_coverage_of_supported_model_exits_0():
    p = run("coverage", "examples/transformer_block.py:block")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all supported" in p.stdout


def test_gemm_reproduces_scalesim():
    p = run("gemm", "1024", "1024", "1024", "--rows", "128", "--cols", "128",
            "--dataflow", "ws", "--mode", "compatible", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["compute_cycles"] == 89983
    assert abs(d["utilization"] - 72.83) < 0.01


def test_run_trace_and_sim_saved_program(tmp_path):
    trace, prog = tmp_path / "t.json", tmp_path / "p.tlc"
    p = run("run", "examples/mlp.py:mlp", "--trace", str(trace), "--save", str(prog))
    assert p.returncode == 0, p.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["ph"] for e in events} >= {"M", "X", "C", "s", "f"}
    assert "energy" in p.stdout and "set by" in p.stdout
    p = run("sim", str(prog), "--json", "--trace", str(tmp_path / "t2.json"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["cycles"] > 0 and d["energy"]
    p = run("sim", str(tmp_path / "missing.tlc"))
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "no such program file" in p.stderr
