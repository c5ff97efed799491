"""The sweep's multi-chip axes (tilecc/sweep/systems.py) end to end on a tiny Llama and
`tiny` chips: a tp point and a pp point each match eager and the runtime's own run, their
energy and area count every chip, dp replicas scale the area and energy but not the
latency, and a grid with a chips axis has the Pareto column a brute-force check gives."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from tilecc.simulator.area import area
from tilecc.simulator.config import load_config
from tilecc.sweep.execute import run_sweep
from tilecc.sweep.spec import load_spec
from tilecc.sweep.systems import Deployment, resolve

LLAMA = """import sys, types
for m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(m, types.ModuleType(m))
import torch


class LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def llama():
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64, max_position_embeddings=16, use_cache=False,
                      attn_implementation="eager")
    return LastHidden(LlamaModel(cfg)).eval(), (torch.randint(0, 64, (2, 4)),)
"""

HEAD = '[sweep]\nworkload = "{w}"\nbase = "tiny"\nobjectives = [{objectives}]\n[sweep.grid]\n'


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("sysw")
    (d / "llama.py").write_text(LLAMA)
    return f"{d / 'llama.py'}:llama"


def _sweep(tmp_path: Path, workload: str, objectives: list[str], grid: str, system: str = ""):
    spec = tmp_path / "spec.toml"
    head = HEAD.format(w=workload, objectives=", ".join(f'"{o}"' for o in objectives))
    if system:
        head = head.replace('base = "tiny"\n', f'base = "tiny"\nsystem = "{system}"\n')
    spec.write_text(head + grid)
    summary = run_sweep(load_spec(spec), str(tmp_path / "o"), workers=1)
    rows = list(csv.DictReader((tmp_path / "o" / "results.csv").read_text().splitlines()))
    return summary, rows


def test_resolve_follows_the_documented_rules():
    ring4 = {"topology": "ring:4", "link": {"preset": "nvlink4"}}
    assert resolve({}, None) == Deployment()
    assert resolve({"tp": 2}, None).system == {"topology": "ring:2"}
    d = resolve({"system.chips": 2, "pp": 2, "micro_batches": 2}, ring4)  # chips resize the base's ring
    assert (d.tp, d.pp, d.micro_batches, d.system) == (1, 2, 2, {"topology": "ring:2", "chips": 2,
                                                                 "link": {"preset": "nvlink4"}})
    assert resolve({"system.chips": 1, "dp": 3}, ring4) == Deployment(None, 1, 1, 1, 3)
    d = resolve({"topology": "switch", "link_bandwidth_gbs": 50.0, "dp": 2}, ring4)  # the old knobs: aliases
    assert (d.tp, d.chips, d.system) == (4, 8, {"topology": "switch:4", "link": {"preset": "nvlink4",
                                                                                   "bandwidth_gbs": 50.0}})
    with pytest.raises(Exception, match=r"tp x pp = 2 x 1 = 2 must equal the system's 4 chip"):
        resolve({"tp": 2}, ring4)
    with pytest.raises(Exception, match="cannot resize 'system.topology' = 'torus:2x2'"):
        resolve({"system.chips": 2}, {"topology": "torus:2x2"})


def test_tp_and_pp_points_match_eager_and_the_runtime(workload, tmp_path, monkeypatch):
    """A tp point and a pp point of one grid: each compared with eager inside the sweep
    (a failed point otherwise), through `tilecc.compile(..., system=, parallel=)`; their
    latency is that run's report's, their energy adds the chips' idle static power to it,
    their area is both chips'."""
    import tilecc.system_api as system_api

    runs = []
    real = system_api.compile_for_system

    def spy(*args, **kwargs):
        runs.append((kwargs["parallel"], real(*args, **kwargs)))
        return runs[-1][1]

    monkeypatch.setattr(system_api, "compile_for_system", spy)
    summary, rows = _sweep(tmp_path, workload, ["latency", "energy", "area", "perf_per_mm2", "perf_per_watt"],
                           '"system.chips" = [2]\npp = [1, 2]\nmicro_batches = [2]\n',
                           system="ring:2;bandwidth_gbs=100")
    assert summary.failed == 0, [r["failure"] for r in rows]
    assert [p for p, _ in runs] == [{"tp": 2}, {"pp": 2, "micro_batches": 2}]
    chip = area(load_config("tiny")).total
    static = load_config("tiny").energy.static_watts
    for r, (_, sm) in zip(rows, runs):
        rep = sm.report
        assert rep.chips_count == 2 and rep.system == "ring:2"
        idle = sum(c.idle_us for c in rep.chips) * 1e-6 * static
        assert float(r["latency"]) == pytest.approx(rep.time_us, rel=1e-12)
        assert float(r["energy"]) == pytest.approx(rep.energy_j + idle, rel=1e-12)
        assert float(r["area"]) == pytest.approx(2 * chip)
        assert float(r["perf_per_mm2"]) == pytest.approx(1e6 / float(r["latency"]) / (2 * chip))
        assert float(r["perf_per_watt"]) == pytest.approx(1 / float(r["energy"]))
    assert sum(c.idle_us for c in runs[1][1].report.chips) > 0  # the pipeline's fill and drain: charged


def test_dp_replicas_scale_area_and_energy_not_latency(workload, tmp_path):
    """`dp` replicas on one chip each: one replica's latency (half the batch), every
    replica's energy and area; each replica's outputs checked against eager on its share."""
    summary, rows = _sweep(tmp_path, workload, ["latency", "energy", "area", "throughput"], 'dp = [1, 2]\n')
    assert summary.failed == 0, [r["failure"] for r in rows]
    one, two = rows
    assert float(two["area"]) == pytest.approx(2 * float(one["area"]))
    assert float(two["latency"]) < float(one["latency"])  # a replica serves half the batch
    assert float(two["throughput"]) == pytest.approx(1e6 / float(two["latency"]))  # the whole batch per latency


def test_a_chips_axis_pareto_column_equals_brute_force(workload, tmp_path):
    """A grid over chips x the fixed area: points differing only in area share one run,
    each gets its own chips' area, and the `pareto` column equals a brute-force dominance
    check over the CSV's objective values."""
    objectives = ["latency", "energy", "perf_per_mm2", "area"]
    summary, rows = _sweep(tmp_path, workload, objectives, '"system.chips" = [1, 2]\n"area.fixed_mm2" = [0.5, 8.0]\n')
    assert summary.failed == 0, [r["failure"] for r in rows]
    by = {(r["system.chips"], r["area.fixed_mm2"]): r for r in rows}
    for fixed in ("0.5", "8.0"):
        chip = area(load_config("tiny")).total - 0.5 + float(fixed)
        assert float(by[("1", fixed)]["area"]) == pytest.approx(chip)
        assert float(by[("2", fixed)]["area"]) == pytest.approx(2 * chip)
    for chips in ("1", "2"):  # the area knob does not change the run: one run per chips value
        assert by[(chips, "0.5")]["latency"] == by[(chips, "8.0")]["latency"]
        assert by[(chips, "0.5")]["energy"] == by[(chips, "8.0")]["energy"]
    # (no latency order between 1 and 2 chips: at hidden 32, tp = 2's all-reduces cost about
    # what halving the matmuls saves, and the order flipped when the one-chip GEMV got faster)
    vals = [[float(r[o]) for o in objectives] for r in rows]
    sign = [1, 1, -1, 1]  # latency, energy and area minimised, perf/mm^2 maximised

    def dominates(a, b):
        return all(s * x <= s * y for s, x, y in zip(sign, a, b)) and any(s * x < s * y for s, x, y in zip(sign, a, b))

    brute = [not any(dominates(o, v) for o in vals) for v in vals]
    assert [r["pareto"] == "true" for r in rows] == brute
    assert not any(math.isnan(x) for v in vals for x in v) and 0 < sum(brute) < len(rows)


@pytest.mark.slow  # ~50 s: two decode points (prefill and decode programs, tokens against eager)
def test_dp_decode_replicas_serve_the_batch_between_them(tmp_path):
    """phase = "decode" with dp = 2: each replica generates batch / dp sequences (checked
    against eager tokens); tokens per step stay the batch, area and energy double, and the
    bound of the whole batch over dp chips is not measured (NaN)."""
    example = Path(__file__).resolve().parent.parent / "examples" / "llm.py"
    summary, rows = _sweep(tmp_path, f"{example}:tiny_llama", ["tpot", "tokens_per_second", "area", "roofline_ratio"],
                           'phase = ["decode"]\nbatch = [2]\nprompt_len = [6]\ndp = [1, 2]\n')
    assert summary.failed == 0, [r["failure"] for r in rows]
    one, two = rows
    assert float(two["area"]) == pytest.approx(2 * float(one["area"]))
    for r in rows:
        assert float(r["tokens_per_second"]) == pytest.approx(2e6 / float(r["tpot"]))  # the whole batch per step
    assert float(two["tpot"]) < float(one["tpot"])  # a replica decodes one sequence, not two
    assert math.isnan(float(two["roofline_ratio"])) and not math.isnan(float(one["roofline_ratio"]))
