"""`tilecc bisect`: a planted miscompilation (passes/break_pass.py, behind the test-only
TILECC_TEST_BREAK_PASS) is found, and bisect names the op and the pass."""

import pytest
import torch

from tilecc.cli import main
from tilecc.runtime import bisect as bisect_mod
from tilecc.runtime.bisect import bisect, candidate_ops, cut_after
from tilecc.simulator.config import load_config

SOURCE = '''import torch


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(24, 19)

    def forward(self, x):
        h = torch.relu(self.fc(x))  # fc
        y = h * 0.5 + 1.0  # affine
        return torch.tanh(y) * 3.0


def factory():
    torch.manual_seed(0)
    return M(), (torch.randn(13, 24),)
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(SOURCE)
    return path


def _factory(path):
    from tilecc.cli import load_factory

    return load_factory(f"{path}:factory")


def test_a_correct_model_matches(model_file, capsys):
    assert main(["bisect", f"{model_file}:factory"]) == 0
    assert "compiled vs eager  match" in capsys.readouterr().out


@pytest.mark.parametrize("broken", ["fuse-graph", "canonicalize-graph"])
def test_planted_miscompilation_names_the_op_and_the_pass(model_file, monkeypatch, capsys, broken):
    monkeypatch.setenv("TILECC_TEST_BREAK_PASS", broken)
    model, inputs = _factory(model_file)
    r = bisect(model, inputs, load_config("tiny"))
    assert not r.matches and r.max_error > 0.1
    # the first graph.add is the Linear's bias add (line 10): the planted fault turned it into a sub
    assert r.first_op_name == "graph.add" and "fc (Linear) @ model.py:10" in r.first_op
    assert r.culprit == broken
    by_name = {t.name.strip(): t.ok for t in r.trials}
    assert by_name[f"-O2 without {broken}"] is True and by_name["-O2"] is False
    assert main(["bisect", f"{model_file}:factory"]) == 1
    out = capsys.readouterr().out
    assert "first op           graph.add at fc (Linear) @ model.py:10" in out and f"first pass         {broken}" in out


def test_every_cut_of_a_correct_model_matches_the_interpreter(model_file, monkeypatch):
    model, inputs = _factory(model_file)
    from tilecc.frontend.torch_export import export_model, import_exported_program

    gp = import_exported_program(export_model(model, inputs))
    ops = candidate_ops(gp)
    assert len(ops) >= 5
    cut = cut_after(gp, 2)
    assert len(candidate_ops(cut)) == 3 and cut.func.function_type.outputs.data[0] == ops[2].results[0].type
    cfg = load_config("tiny")
    assert bisect_mod._first_op(gp, cfg, inputs, 2) == (None, None)
    monkeypatch.setattr(bisect_mod, "LINEAR_SCAN_OPS", 0)  # the binary search
    assert bisect_mod._first_op(gp, cfg, inputs, 2) == (None, None)


def test_binary_search_finds_the_same_op(model_file, monkeypatch):
    monkeypatch.setenv("TILECC_TEST_BREAK_PASS", "fuse-graph")
    monkeypatch.setattr(bisect_mod, "LINEAR_SCAN_OPS", 0)
    model, inputs = _factory(model_file)
    r = bisect(model, inputs, load_config("tiny"))
    assert r.first_op_name == "graph.add" and "model.py:10" in r.first_op and r.culprit == "fuse-graph"


def test_planted_fault_is_off_without_the_flag(model_file):
    model, inputs = _factory(model_file)
    assert bisect(model, inputs, load_config("tiny")).matches
    with torch.no_grad():
        assert model(*inputs).shape == (13, 19)
