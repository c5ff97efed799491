"""`phase = "train"` sweep points: one training step on one chip, gradients against eager."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tilecc.simulator.config import load_config
from tilecc.sweep.evaluate_train import run_train
from tilecc.sweep.spec import SweepSpecError, load_spec

ROOT = Path(__file__).resolve().parents[1]


def test_a_train_point_is_one_step_checked_against_eager_autograd(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config("tiny")
    f = run_train("examples/mlp.py:mlp", {}, cfg)
    assert not isinstance(f, str), f
    assert f.latency_us > 0 and f.energy_j > 0 and f.macs > 0
    assert f.cycles == pytest.approx(f.latency_us * 1e-6 * cfg.clock_ghz * 1e9)
    assert 0 < f.roofline_cycles <= f.cycles  # the regions' bound, never above the step
    assert f.bottleneck in ("matrix", "hbm", "vector") and not math.isnan(f.area_mm2)


def test_a_train_point_on_several_chips_is_a_spec_error(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nworkload = "examples/llama_tp.py:llama"\nbase = "tiny"\nobjectives = ["latency"]\n'
                    '[sweep.grid]\n"matrix.rows" = [8, 16]\nphase = ["train"]\ntp = [2]\n')
    with pytest.raises(SweepSpecError, match='phase "train" runs on one chip'):
        load_spec(spec).points()


def test_train_and_forward_points_of_one_sweep_differ_and_train_costs_more(tmp_path, monkeypatch):
    import csv

    from tilecc.sweep.execute import run_sweep

    monkeypatch.chdir(ROOT)
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nworkload = "examples/mlp.py:mlp"\nbase = "tiny"\nobjectives = ["latency", "energy"]\n'
                    '[sweep.grid]\nphase = ["forward", "train"]\n')
    run_sweep(load_spec(spec), str(tmp_path / "o"), workers=1)
    rows = {r["phase"]: r for r in csv.DictReader(open(tmp_path / "o" / "results.csv"))}
    assert not rows["forward"]["failure"] and not rows["train"]["failure"]
    direct = run_train("examples/mlp.py:mlp", {}, load_config("tiny"))
    assert not isinstance(direct, str)
    assert float(rows["train"]["latency"]) == pytest.approx(direct.latency_us)
    assert float(rows["train"]["latency"]) > 2 * float(rows["forward"]["latency"])  # forward + backward
