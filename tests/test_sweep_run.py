"""`tilecc sweep` end to end on a tiny workload and the tiny target: the rows equal a
direct compile and simulation (each point's program is checked against eager inside
the sweep), points that share a compile share it, an interrupted sweep resumes to the
same table, the estimate tier is fast and reports its error, the report renders in
headless Chromium, and a local Ray run (or a process pool) gives the same table."""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import run_and_compare

from tilecc.cli import main
from tilecc.sweep import backends
from tilecc.sweep.execute import run_sweep
from tilecc.sweep.results import SweepOutputError
from tilecc.sweep.spec import load_spec

WORKLOAD = """import torch
def lin():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8)), (torch.randn(8, 16),)
"""

SPEC = """[sweep]
workload = "{workload}"
base = "tiny"
objectives = ["latency", "energy", "perf_per_mm2"]
calibration_points = 2
[sweep.grid]
"matrix.cols" = [8, 16]
"hbm.bytes_per_cycle" = [8.0, 32.0]
"area.fixed_mm2" = [0.5, 2.0]
"sram.bytes_per_partition" = [64, 65536]
"""


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    (d / "tinyw.py").write_text(WORKLOAD)
    path = d / "spec.toml"
    path.write_text(SPEC.format(workload=d / "tinyw.py:lin"))
    return path


@pytest.fixture(scope="module")
def full(spec_path, tmp_path_factory):
    """The uninterrupted in-process sweep: (summary, results.csv text, tasks evaluated)."""
    out = tmp_path_factory.mktemp("full")
    calls = []
    real = backends.evaluate_task
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "evaluate_task", lambda t: calls.append(t) or real(t))
        summary = run_sweep(load_spec(spec_path), str(out / "o"), workers=1)
    return summary, (out / "o" / "results.csv").read_text(), calls, out / "o"


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(text.splitlines()))


def test_rows_equal_a_direct_compile_and_simulation(full):
    summary, text, calls, _ = full
    rows = _rows(text)
    assert list(rows[0]) == ["point", "matrix.cols", "hbm.bytes_per_cycle", "area.fixed_mm2",
                             "sram.bytes_per_partition", "latency", "energy", "perf_per_mm2", "bottleneck",
                             "pareto", "failure"]
    assert [int(r["point"]) for r in rows] == list(range(16))
    ok = [r for r in rows if not r["failure"]]
    assert len(ok) == 8 and summary.failed == 8
    for r in rows:
        if r["sram.bytes_per_partition"] == "64":  # a config the compiler cannot tile: the reason
            assert "do not fit SRAM" in r["failure"] and r["latency"] == "" and r["pareto"] == "false"
    # points 1 apart in area.fixed_mm2 only share one compile and simulation
    assert len(calls) == 8 and all(len(t.points) == 2 for t in calls)
    r = next(r for r in ok if r["matrix.cols"] == "8" and r["hbm.bytes_per_cycle"] == "32.0"
             and r["area.fixed_mm2"] == "2.0")
    model, inputs = _workload(full[3].parent.parent)
    import tomllib

    from tilecc.simulator.area import area
    from tilecc.simulator.config import PRESET_DIR, from_dict

    data = tomllib.loads((PRESET_DIR / "tiny.toml").read_text())
    data["matrix"]["cols"], data["hbm"]["bytes_per_cycle"], data["area"]["fixed_mm2"] = 8, 32.0, 2.0
    cfg = from_dict(data)
    cm = run_and_compare(model, inputs, target=cfg)  # against torch eager, sanitisers on
    rep = cm.report
    assert float(r["latency"]) == rep.time_us
    assert float(r["energy"]) == rep.energy["joules"]
    assert float(r["perf_per_mm2"]) == pytest.approx(1e6 / rep.time_us / area(cfg).total, rel=1e-12)
    assert r["bottleneck"] == rep.bottleneck
    # the area-only twin: same latency, less perf per mm^2
    twin = next(x for x in ok if x["point"] == str(int(r["point"]) - 2))
    assert twin["latency"] == r["latency"] and float(twin["perf_per_mm2"]) > float(r["perf_per_mm2"])


def _workload(d: Path):
    import importlib.util

    path = next(Path(d).rglob("tinyw.py"))
    spec = importlib.util.spec_from_file_location("tinyw", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.lin()


def test_pareto_column(full):
    rows = _rows(full[1])
    pareto = [r for r in rows if r["pareto"] == "true"]
    assert pareto and all(not r["failure"] for r in pareto)
    # a Pareto point is not dominated: no other point is faster, cheaper and denser at once
    for p in pareto:
        for o in rows:
            if o["failure"] or o is p:
                continue
            lat, en, ppa = float(o["latency"]), float(o["energy"]), float(o["perf_per_mm2"])
            better = (lat <= float(p["latency"]) and en <= float(p["energy"]) and ppa >= float(p["perf_per_mm2"]))
            strictly = (lat, en, ppa) != (float(p["latency"]), float(p["energy"]), float(p["perf_per_mm2"]))
            assert not (better and strictly)


def test_resume_after_an_interrupt_equals_the_uninterrupted_run(full, spec_path, tmp_path):
    out = tmp_path / "o"

    def stop(n: int) -> None:
        if n == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_spec(spec_path), str(out), workers=1, on_point=stop)
    written = (out / "results.csv").read_text().splitlines()
    assert len(written) == 1 + 5 and not (out / "report.html").exists()
    with pytest.raises(SweepOutputError, match="exists: pass --resume"):
        run_sweep(load_spec(spec_path), str(out), workers=1)
    # a row cut short by a kill is dropped and its point rerun
    with open(out / "results.csv", "a") as f:
        f.write("13,16,32.0")
    calls = []
    real = backends.evaluate_task
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "evaluate_task", lambda t: calls.append(t) or real(t))
        summary = run_sweep(load_spec(spec_path), str(out), workers=1, resume=True)
    assert summary.resumed == 5
    done_before = {int(line.split(",")[0]) for line in written[1:]}
    assert not any(i in done_before for t in calls for i in t.points)  # nothing recomputed
    assert (out / "results.csv").read_text() == full[1]


def test_resume_refuses_another_spec(spec_path, tmp_path):
    out = tmp_path / "o"
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_spec(spec_path), str(out), workers=1, on_point=lambda n: (_ for _ in ()).throw(KeyboardInterrupt))
    other = spec_path.parent / "other.toml"
    other.write_text(spec_path.read_text().replace('"energy", ', ""))
    with pytest.raises(SweepOutputError, match="another spec or fidelity"):
        run_sweep(load_spec(other), str(out), workers=1, resume=True)


def test_estimate_fidelity_is_fast_and_reports_its_error(spec_path, tmp_path):
    big = spec_path.parent / "big.toml"
    big.write_text(spec_path.read_text().replace('"matrix.cols" = [8, 16]', '"matrix.cols" = [4, 8, 12, 16]')
                   .replace('[0.5, 2.0]', '[0.5, 1.0, 2.0, 3.0, 4.0]').replace("[64, 65536]", "[4096, 16384, 65536]")
                   .replace("[8.0, 32.0]", "[4.0, 8.0, 16.0, 32.0, 64.0]"))
    summary = run_sweep(load_spec(big), str(tmp_path / "o"), workers=1, fidelity="estimate")
    assert summary.points == 4 * 5 * 5 * 3 and summary.failed == 0
    assert summary.estimate_rate >= 100, summary.estimate_rate
    err = next(iter(summary.estimate_errors.values()))
    assert err.points == 2 and all(e < 0.5 for e in err.latency + err.energy)
    assert "estimate error against full simulation on 2 sample point(s)" in str(summary)
    rows = _rows((tmp_path / "o" / "results.csv").read_text())
    assert sum(r["pareto"] == "true" for r in rows) == summary.pareto > 0


def test_nsga2_draws_trials_deterministically_and_resumes(spec_path, tmp_path):
    pytest.importorskip("optuna", reason="strategy = nsga2 needs optuna (pip install 'tilecc[sweep]')")
    text = spec_path.read_text().replace("calibration_points = 2", 'strategy = "nsga2"\ntrials = 20\nseed = 3\n'
                                         "calibration_points = 2")
    ns = spec_path.parent / "ns.toml"
    ns.write_text(text)
    a = run_sweep(load_spec(ns), str(tmp_path / "a"), workers=1, fidelity="estimate")
    assert a.points == 20

    def stop(n: int) -> None:
        if n == 18:  # within the second generation (16 trials per generation)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_spec(ns), str(tmp_path / "b"), workers=1, fidelity="estimate", on_point=stop)
    b = run_sweep(load_spec(ns), str(tmp_path / "b"), workers=1, fidelity="estimate", resume=True)
    assert b.resumed == 18  # the seeded sampler asks the same trials; those done are told their rows
    assert (tmp_path / "a" / "results.csv").read_text() == (tmp_path / "b" / "results.csv").read_text()


def test_report_renders_in_headless_chromium(full):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    page = full[3] / "report.html"
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", text)  # nothing fetched
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r"<span id=\"render-check\">([^<]*)</span>", out.stdout)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    check = dict(kv.split("=") for kv in m.group(1).split())
    assert int(check["sections"]) == 4
    assert int(check["plots"]) == int(check["plots-rendered"]) == 3  # 3 pairs of 3 objectives
    assert int(check["rows"]) == 16
    assert int(check["pareto"]) == full[0].pareto > 0


def test_cli_runs_and_summarises(spec_path, tmp_path, capsys):
    small = _small(spec_path)
    assert main(["sweep", str(small), "--out", str(tmp_path / "o"), "--workers", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "sweep             2 points (full fidelity), 0 failed" in out
    assert (tmp_path / "o" / "report.html").is_file()
    assert main(["sweep", str(small), "--out", str(tmp_path / "o"), "-q"]) == 2  # results exist
    assert "pass --resume" in capsys.readouterr().err


@pytest.mark.slow
def test_local_pool_gives_the_same_table(full, spec_path, tmp_path):
    run_sweep(load_spec(spec_path), str(tmp_path / "o"), workers=2)
    assert (tmp_path / "o" / "results.csv").read_text() == full[1]


def _small(spec_path) -> Path:
    small = spec_path.parent / "small.toml"
    small.write_text(spec_path.read_text().replace("[8, 16]", "[16]").replace("[0.5, 2.0]", "[0.5]")
                     .replace("[64, 65536]", "[65536]"))
    return small


def test_local_ray_gives_the_same_table_as_in_process(spec_path, tmp_path):
    """CI starts a local Ray instance (ray is a dev dependency) and compares its table
    with the in-process run's on a 2-point spec (the 16-point one under -m slow)."""
    pytest.importorskip("ray", reason="--ray needs ray (pip install 'tilecc[sweep]')")
    spec = load_spec(_small(spec_path))
    run_sweep(spec, str(tmp_path / "local"), workers=1)
    run_sweep(spec, str(tmp_path / "ray"), ray="local")
    local = (tmp_path / "local" / "results.csv").read_text()
    assert local.count("\n") == 3  # the header and two points
    assert (tmp_path / "ray" / "results.csv").read_text() == local


@pytest.mark.slow  # ~35 s: starting a local Ray instance, 16 points
def test_local_ray_gives_the_same_table(full, spec_path, tmp_path):
    pytest.importorskip("ray", reason="--ray needs ray (pip install 'tilecc[sweep]')")
    run_sweep(load_spec(spec_path), str(tmp_path / "o"), ray="local")
    assert (tmp_path / "o" / "results.csv").read_text() == full[1]


def test_weights_knob_compiles_each_format_against_its_own_eager(spec_path, tmp_path):
    """`weights` is a workload knob (tilecc/sweep/knobs.py): points differing in it never
    share a compile, and each is compared with the eager run of the transformed model."""
    spec = spec_path.parent / "weights.toml"
    spec.write_text(spec_path.read_text().split("[sweep.grid]")[0]
                    + '[sweep.grid]\n"matrix.cols" = [16]\nweights = ["native", "bf16", "int8"]\n')
    calls = []
    real = backends.evaluate_task
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "evaluate_task", lambda t: calls.append(t) or real(t))
        summary = run_sweep(load_spec(spec), str(tmp_path / "o"), workers=1)
    rows = _rows((tmp_path / "o" / "results.csv").read_text())
    assert [r["weights"] for r in rows] == ["native", "bf16", "int8"] and summary.failed == 0, rows
    assert [t.knobs for t in calls] == [{"weights": "native"}, {"weights": "bf16"}, {"weights": "int8"}]
    # bf16 halves the weight and activation bytes: less energy than fp32
    assert float(rows[1]["energy"]) < float(rows[0]["energy"])
    with pytest.raises(Exception, match="the workload knob 'weights' needs --fidelity full"):
        run_sweep(load_spec(spec), str(tmp_path / "e"), fidelity="estimate")


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
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=100, max_position_embeddings=64, use_cache=False,
                      attn_implementation="eager")
    return LastHidden(LlamaModel(cfg)).eval(), (torch.randint(0, 100, (1, 16)),)
"""


def test_tp_knob_sweeps_chips_and_topology_against_eager(tmp_path):
    """`tp`, `topology` and `link_bandwidth_gbs` are system knobs: each point shards the
    model over the chips (tilecc/system_api.py), simulates every chip and link, compares
    with eager; area is the chips' sum, the bound the single chip's over tp."""
    (tmp_path / "llama.py").write_text(LLAMA)
    spec = tmp_path / "tp.toml"
    spec.write_text(f'[sweep]\nworkload = "{tmp_path}/llama.py:llama"\nbase = "tiny"\n'
                    'objectives = ["latency", "energy", "area", "roofline_ratio"]\n[sweep.grid]\n'
                    'tp = [1, 2]\ntopology = ["switch"]\nlink_bandwidth_gbs = [25.0, 400.0]\n')
    summary = run_sweep(load_spec(spec), str(tmp_path / "o"), workers=1)
    rows = _rows((tmp_path / "o" / "results.csv").read_text())
    assert summary.failed == 0, [r["failure"] for r in rows]
    one = [r for r in rows if r["tp"] == "1"]
    two = [r for r in rows if r["tp"] == "2"]
    # one chip: the system knobs do not apply, its points have one figure set (one compile)
    assert len(one) == 2 and len({(r["latency"], r["energy"]) for r in one}) == 1
    assert all(float(r["area"]) == pytest.approx(2 * float(one[0]["area"])) for r in two)
    by = {r["link_bandwidth_gbs"]: float(r["latency"]) for r in two}
    assert by["25.0"] > by["400.0"]  # a slower link costs time
    assert all(float(r["roofline_ratio"]) > 1 for r in rows)


def test_decode_phase_sweeps_the_serving_figures_against_eager_tokens(tmp_path):
    """`phase = "decode"`: the factory's causal LM generates on the simulator with a
    static KV cache (tilecc/llm/), its tokens compared with eager model.generate; the
    figures are one decode step's, so the per-token objectives are defined. Forward
    points of the same sweep leave them undefined (never Pareto)."""
    from tilecc.sweep.objectives import OBJECTIVES, Figures

    example = Path(__file__).resolve().parent.parent / "examples" / "llm.py"
    spec = tmp_path / "decode.toml"
    spec.write_text(f'[sweep]\nworkload = "{example}:tiny_llama"\nbase = "tiny"\n'
                    'objectives = ["tpot", "joules_per_token", "tokens_per_second"]\n[sweep.grid]\n'
                    '"hbm.bytes_per_cycle" = [8.0, 64.0]\nphase = ["decode"]\nbatch = [1, 2]\nprompt_len = [6]\n')
    summary = run_sweep(load_spec(spec), str(tmp_path / "o"), workers=1)
    rows = _rows((tmp_path / "o" / "results.csv").read_text())
    assert summary.failed == 0, [r["failure"] for r in rows]
    assert len(rows) == 4 and all(r["phase"] == "decode" for r in rows)
    for r in rows:
        tpot, jpt, tps = (float(r[k]) for k in ("tpot", "joules_per_token", "tokens_per_second"))
        assert tpot > 0 and jpt > 0 and tps == pytest.approx(int(r["batch"]) * 1e6 / tpot, rel=1e-6)
    # more HBM bandwidth: a decode step (weight-bound) is faster
    by = {(r["hbm.bytes_per_cycle"], r["batch"]): float(r["tpot"]) for r in rows}
    assert by[("64.0", "1")] < by[("8.0", "1")]
    forward = Figures(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "hbm")
    assert math.isnan(OBJECTIVES["joules_per_token"].value(forward))


def test_decode_knobs_are_checked():
    from tilecc.sweep.knobs import check_knob, effective_knobs

    assert check_knob("phase", "prefill") == "'phase' takes one of forward, decode, train"
    assert check_knob("batch", 0) == "'batch' takes a whole number in 1..65536"
    # the generation's shape does not change a forward point (one compile for both)
    assert effective_knobs({"phase": "forward", "batch": 4}) == {}
    assert effective_knobs({"phase": "decode", "batch": 4}) == {"phase": "decode", "batch": 4}
