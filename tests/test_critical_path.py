"""The critical path of a run (`simulator/critical_path.py`): a chain of instructions,
each started by the one before it, whose cycles by kind add up to the run's; what bounds
a matrix-bound GEMM and an HBM-bound GEMV; the report and the CLI flag."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.helpers import tolerance
from tilecc.cli import main as cli_main
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.runtime.compiler import compile_graph
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import load_config
from tilecc.simulator.critical_path import KINDS, critical_path
from tilecc.simulator.machine import simulate


class Linear(torch.nn.Module):
    def __init__(self, k: int, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n) / k**0.5)

    def forward(self, x):
        return x @ self.w


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(8, 64, 3, 1, 1)
        self.c2 = torch.nn.Conv2d(64, 64, 3, 2, 1)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.c2(torch.relu(self.c1(x))))
        return self.fc(y.mean(dim=(2, 3)))


def _program(model, inputs, target="cloud"):
    with torch.no_grad():
        gp = import_exported_program(export_model(model.eval(), inputs))
    return compile_graph(gp, load_config(target))


def test_the_chain_covers_the_run_and_each_link_starts_the_next():
    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(1, 8, 20, 18)
    with torch.no_grad():
        want = model(x)
    prog = _program(model, (x,))
    (out,), rep = run_program(prog, (x,), sanitize=True, critical_path=True)
    rtol, atol = tolerance(torch.float32, float(want.abs().max()))
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol)
    sim = simulate(prog.stream, prog.config, prog.hbm_image(), functional=False)
    cp = critical_path(prog.stream, prog.config, sim.start, sim.end, prog.kernels)
    assert cp.cycles == pytest.approx(rep.cycles)
    assert sum(cp.by_kind.values()) == pytest.approx(rep.cycles, rel=1e-9)
    assert set(cp.by_kind) == set(KINDS)
    chain = cp.instructions
    assert sim.end[chain[-1]] == pytest.approx(rep.cycles)  # it ends with the run
    assert np.all(np.diff(sim.start[chain]) >= -1e-6)  # in time order
    assert len(np.unique(chain)) == len(chain)
    # per kernel: the kernels' shares add up to the run less what precedes the first instruction
    in_kernels = sum(c for _, c, _ in cp.by_kernel)  # all but barriers and any wait before the first
    assert 0.9 * rep.cycles <= in_kernels <= rep.cycles * (1 + 1e-9)
    assert {name for name, _, _ in cp.by_kernel} <= {k[0] for k in prog.kernels}
    assert rep.critical_path["cycles"] == pytest.approx(rep.cycles)
    assert "critical path" in str(rep)


@pytest.mark.parametrize("shape, kind", [((1024, 1024, 1024), "matrix"), ((1, 4096, 2048), "dma load")])
def test_what_bounds_a_gemm_and_a_gemv(shape, kind):
    """A square bf16 GEMM spends most of its chain on the matrix engine; a one-row GEMV
    streams its weight from HBM, so its chain is mostly loads."""
    m, k, n = shape
    torch.manual_seed(0)
    model, x = Linear(k, n).to(torch.bfloat16), torch.randn(m, k, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
    prog = _program(model, (x,))
    (out,), rep = run_program(prog, (x,), critical_path=True)
    rtol, atol = tolerance(torch.bfloat16, float(want.float().abs().max()))
    torch.testing.assert_close(out.float(), want.float(), rtol=rtol, atol=atol)
    by_kind = rep.critical_path["by_kind"]
    assert max(by_kind, key=lambda k: by_kind[k]) == kind, by_kind
    assert by_kind[kind] > 0.4 * rep.cycles


def test_cli_reports_the_critical_path(tmp_path, capsys):
    src = tmp_path / "m.py"
    src.write_text(
        "import torch\n"
        "def factory():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))\n"
        "    return m, (torch.randn(16, 64),)\n"
    )
    assert cli_main(["run", f"{src}:factory", "--critical-path", "--json", "-q", "--no-cache"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allclose"] and d["critical_path"]["cycles"] == pytest.approx(d["cycles"])
    assert sum(d["critical_path"]["by_kind"].values()) == pytest.approx(d["cycles"])
    assert cli_main(["run", f"{src}:factory", "--critical-path", "-q", "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert "critical path" in text and "instructions set the cycles" in text


class Stack(torch.nn.Module):
    """Three identical residual layers: `share-kernels` builds each kernel once, launched
    three times."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(3))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(64) for _ in range(3))

    def forward(self, x):
        for layer, norm in zip(self.layers, self.norms):
            x = x + layer(norm(x))
        return x


def test_launches_of_a_shared_kernel_are_summed():
    """`by_family` adds up every launch of a shared kernel (``name``, ``name#1``, ...):
    its rows are the by-kernel rows grouped, cycles and kinds summed, launches counted;
    the report then prints them as ``name xN``."""
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.randn(32, 64)
    with torch.no_grad():
        want = model(x)
    prog = _program(model, (x,))
    launches = [name for name, _, _ in prog.kernels]
    assert any("#2" in name for name in launches), launches  # one kernel, three launches
    (out,), rep = run_program(prog, (x,), critical_path=True)
    rtol, atol = tolerance(torch.float32, float(want.abs().max()))
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol)
    sim = simulate(prog.stream, prog.config, prog.hbm_image(), functional=False)
    cp = critical_path(prog.stream, prog.config, sim.start, sim.end, prog.kernels)
    fams = {name: (n, c, d) for name, n, c, d in cp.by_family}
    for name, (n, c, d) in fams.items():
        rows = [(k, kc, kd) for k, kc, kd in cp.by_kernel if k == name or k.startswith(name + "#")]
        assert n == len(rows) and c == pytest.approx(sum(kc for _, kc, _ in rows))
        for kind in KINDS:
            assert d[kind] == pytest.approx(sum(kd[kind] for _, _, kd in rows))
    assert sum(c for _, c, _ in cp.by_kernel) == pytest.approx(sum(c for _, c, _ in fams.values()))
    shared = [name for name, (n, _, _) in fams.items() if n == 3]
    assert shared, fams
    assert [r["kernel"] for r in rep.critical_path["by_family"]] == [name for name, *_ in cp.by_family][:10]
    assert f"{shared[0]} x3" in str(rep)
