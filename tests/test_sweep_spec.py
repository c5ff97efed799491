"""Sweep spec validation (tilecc/sweep/spec.py): every error is one line naming the key
and the value, raised before anything runs; the CLI prints it and exits 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tilecc.cli import main
from tilecc.sweep.spec import SweepSpecError, load_spec

ROOT = Path(__file__).resolve().parent.parent
MLP = f"{ROOT}/examples/mlp.py:mlp"

GOOD = f"""[sweep]
workload = "{MLP}"
base = "tiny"
objectives = ["latency", "energy"]
[sweep.grid]
"matrix.rows" = [8, 16]
"hbm.bytes_per_cycle" = [16.0, 32.0]
"""


def _spec(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(text)
    return p


def test_good_spec_lists_its_points(tmp_path):
    spec = load_spec(_spec(tmp_path, GOOD))
    assert spec.keys == ["matrix.rows", "hbm.bytes_per_cycle"]
    assert spec.points() == [{"matrix.rows": 8, "hbm.bytes_per_cycle": 16.0},
                             {"matrix.rows": 8, "hbm.bytes_per_cycle": 32.0},
                             {"matrix.rows": 16, "hbm.bytes_per_cycle": 16.0},
                             {"matrix.rows": 16, "hbm.bytes_per_cycle": 32.0}]
    assert [spec.point_at(i) for i in range(4)] == spec.points()
    cfg = spec.config(spec.points()[1], "p")
    assert cfg.matrix.rows == 8 and cfg.hbm.bytes_per_cycle == 32.0


def test_random_draws_distinct_points_deterministically(tmp_path):
    text = GOOD.replace('objectives', 'strategy = "random"\nn = 3\nseed = 7\nobjectives')
    a, b = load_spec(_spec(tmp_path, text)).points(), load_spec(_spec(tmp_path, text)).points()
    assert a == b and len(a) == 3 and len({tuple(p.values()) for p in a}) == 3


CASES = [
    # (edit of GOOD: old -> new, the one-line message it must give)
    (('"matrix.rows"', '"matrix.rowz"'), "unknown config key 'matrix.rowz'"),
    (('"matrix.rows"', '"nosuch"'), "unknown config key 'nosuch'"),
    (('[8, 16]', '[8, "sixteen"]'), "'sweep.grid.\"matrix.rows\"' has value 'sixteen': 'matrix.rows' takes an integer"),
    (('[8, 16]', '[8, 16.5]'), "has value 16.5: 'matrix.rows' takes an integer"),
    (('[8, 16]', '[8, true]'), "has value True: 'matrix.rows' takes an integer"),
    (('[16.0, 32.0]', '["fast"]'), "has value 'fast': 'hbm.bytes_per_cycle' takes float"),
    (('[8, 16]', '[]'), "'sweep.grid.\"matrix.rows\"' = []: expected a non-empty list"),
    (('[8, 16]', '8'), "'sweep.grid.\"matrix.rows\"' = 8: expected a non-empty list"),
    (('[8, 16]', '[8, 8]'), "lists a value twice"),
    (('"matrix.rows"', '"matrix"'), "'matrix' is a table of the config, not a value"),
    (('"matrix.rows" = [8, 16]', 'tp = [0, 2]'), "'sweep.grid.\"tp\"' has value 0: 'tp' takes a whole number in 1..1024"),
    (('"matrix.rows" = [8, 16]', 'weights = ["int4"]'), "'sweep.grid.\"weights\"' has value 'int4': 'weights' takes one of native, bf16, int8, fp8"),
    (('"matrix.rows"', 'matrix.rows'), "'sweep.grid.matrix' is a table: quote dotted keys"),
    (('"energy"]', '"speed"]'), "'sweep.objectives' has unknown objective 'speed'"),
    (('["latency", "energy"]', '[]'), "'sweep.objectives' = []: expected a non-empty list"),
    (('["latency", "energy"]', '["latency", "latency"]'), "names an objective twice"),
    (('base = "tiny"', 'base = "huge"'), "'sweep.base' = 'huge' is no preset (presets: cloud, edge, tiny"),
    (('base = "tiny"', 'base = "nosuch.toml"'), "'sweep.base' = 'nosuch.toml': no such file"),
    (('base = "tiny"', 'base = 3'), "'sweep.base' = 3: expected a preset name"),
    (('objectives', 'strategy = "bayes"\nobjectives'), "'sweep.strategy' = 'bayes' is not a strategy (allowed: grid, random, nsga2)"),
    (('objectives', 'strategy = "random"\nn = 0\nobjectives'), "'sweep.n' = 0: expected an integer"),
    (('objectives', 'n = 4\nobjectives'), "'sweep.n' = 4 does not apply to strategy 'grid'"),
    (('objectives', 'strategy = "nsga2"\ntrials = "many"\nobjectives'), "'sweep.trials' = 'many': expected an integer"),
    (('objectives', 'colour = "red"\nobjectives'), "unknown key 'sweep.colour'"),
    ((f'workload = "{MLP}"', 'workload = "mlp.py"'), "'sweep.workload' = 'mlp.py': expected FILE.py:FACTORY"),
    ((f'workload = "{MLP}"', 'workload = "nosuch.py:f"'), "'sweep.workload' = 'nosuch.py:f': no such file 'nosuch.py'"),
    ((f'workload = "{MLP}"', f'workload = "{ROOT}/examples/mlp.py:1x"'), "'1x' is not a Python name"),
    ((f'workload = "{MLP}"', 'workload = []'), "'sweep.workload' = []: name at least one"),
    ((f'workload = "{MLP}"\n', ''), "missing key 'sweep.workload'"),
    ((f'workload = "{MLP}"', f'workload = ["{MLP}", "{MLP}"]'), "names a workload twice"),
    (('[sweep.grid]', '[sweep.gird]'), "unknown key 'sweep.gird'"),
    (('[sweep]', '[other]\nx = 1\n[sweep]'), "unknown table or key 'other'"),
]


# the multi-chip axes (tilecc/sweep/systems.py): system keys validated by the system
# config's own rules, the parallelism knobs, and the combinations the runtime refuses
SYSTEM_CASES = [
    (('"matrix.rows" = [8, 16]', '"system.colour" = ["red"]'),
     "'sweep.grid.\"system.colour\"' has value 'red': unknown key 'system.colour' (system keys: system.topology"),
    (('"matrix.rows" = [8, 16]', '"system.link.bandwidth_gbs" = [100.0, -1.0]'),
     "'sweep.grid.\"system.link.bandwidth_gbs\"' has value -1.0: 'system.link.bandwidth_gbs' must be a finite "
     "number >= 0, got -1.0"),
    (('"matrix.rows" = [8, 16]', '"system.link.bandwidth_gbs" = [0.0]'),
     "has value 0.0: 'system.link.bandwidth_gbs' must be > 0, got 0.0"),
    (('"matrix.rows" = [8, 16]', '"system.link.latency_ns" = ["slow"]'),
     "has value 'slow': 'system.link.latency_ns' must be a number, got 'slow'"),
    (('"matrix.rows" = [8, 16]', '"system.topology" = ["ring:4", "hexagon:3"]'),
     "has value 'hexagon:3': 'system.topology' = 'hexagon:3' is not a topology"),
    (('"matrix.rows" = [8, 16]', '"system.link.preset" = ["nvlink9"]'),
     "has value 'nvlink9': 'system.link.preset' = 'nvlink9' is not a link preset (allowed: trn2-neuronlink"),
    (('"matrix.rows" = [8, 16]', '"system.chips" = [0]'), "has value 0: 'system.chips' takes a whole number"),
    (('"matrix.rows" = [8, 16]', '"system.cores_per_chip" = [0]'),
     "has value 0: 'system.cores_per_chip' must be a whole number in 1..1024, got 0"),
    (('"matrix.rows" = [8, 16]', '"system.cores_per_chip" = [2]'),
     "has value 2: not supported yet: the system runtime runs one core per chip"),
    (('"matrix.rows" = [8, 16]', '"system.chip" = ["edge"]'), "'system.chip' is not a sweep key"),
    (('"matrix.rows" = [8, 16]', 'topology = ["ring"]\n"system.topology" = ["ring:2"]'),
     "sweeps both 'topology' and 'system.topology'"),
    (('"matrix.rows" = [8, 16]', 'link_latency_ns = [1.0]\n"system.link.latency_ns" = [2.0]'),
     "sweeps both 'link_latency_ns' and 'system.link.latency_ns'"),
    (('"matrix.rows" = [8, 16]', 'pp = [1, 0]'), "'sweep.grid.\"pp\"' has value 0: 'pp' takes a whole number"),
    (('"matrix.rows" = [8, 16]', 'dp = [true]'), "'sweep.grid.\"dp\"' has value True: 'dp' takes a whole number"),
    (('"matrix.rows" = [8, 16]', 'micro_batches = [2.5]'), "has value 2.5: 'micro_batches' takes a whole number"),
    (('"matrix.rows" = [8, 16]', 'phase = ["decode"]\ntp = [2]'),
     "the combination phase = 'decode', tp = 2 is not supported yet: phase \"decode\" runs each replica on one chip"),
    (('base = "tiny"', 'base = "tiny"\nsystem = "ring:4;chip=edge"'),
     "'sweep.system' = 'ring:4;chip=edge': sets 'system.chip'"),
    (('base = "tiny"', 'base = "tiny"\nsystem = "blob:4"'),
     "'sweep.system' = 'blob:4': 'system.topology' = 'blob:4' is not a topology"),
    (('base = "tiny"', 'base = "tiny"\nsystem = "ring:4;bandwidth_gbs=-3"'),
     "'sweep.system' = 'ring:4;bandwidth_gbs=-3': 'system.link.bandwidth_gbs' must be a finite number >= 0, got -3"),
    (('base = "tiny"', 'base = "tiny"\nsystem = "nosuch.toml"'), "'sweep.system' = 'nosuch.toml': no such file"),
    (('base = "tiny"', 'base = "tiny"\nsystem = 4'), "'sweep.system' = 4: expected a system in short form"),
]
CASES += SYSTEM_CASES


@pytest.mark.parametrize("edit,message", CASES, ids=[c[1][:40] for c in CASES])
def test_bad_spec_is_one_line_naming_key_and_value(tmp_path, capsys, edit, message):
    old, new = edit
    assert old in GOOD
    path = _spec(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(SweepSpecError) as info:
        load_spec(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    assert message in text, text
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not out.exists()  # validated before the output directory is made


def test_not_a_spec(tmp_path, capsys):
    for text, message in [("[sweep\n", "not valid TOML"), ("name = 'x'\n", "unknown table or key 'name'"),
                          ("", "no [sweep] table")]:
        path = _spec(tmp_path, text)
        assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["sweep", str(ROOT / "simulator/presets/tiny.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "unknown table or key" in capsys.readouterr().err  # a hardware config is no sweep spec


def test_bad_cli_arguments_are_one_line(tmp_path, capsys):
    path = _spec(tmp_path, GOOD)
    for argv, message in [(["--workers", "0"], "0 workers: expected 1 to 1024"),
                          (["--workers", "x"], "'x' is not a number of workers"),
                          (["--fidelity", "exact"], "invalid choice: 'exact'")]:
        assert main(["sweep", str(path), "--out", str(tmp_path / "o"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert re.fullmatch(r"error: [^\n]*", err) and message in err, err
    assert main(["sweep", str(path)]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpt2_edge.toml", "gpt2_edge_estimate.toml"])
def test_example_studies_are_valid(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # the README runs them from the checkout's root
    spec = load_spec(ROOT / "examples" / "sweep" / name)
    assert spec.base == "edge" and "perf_per_mm2" in spec.objectives
    points = spec.points()
    assert len(points) == (16 if name == "gpt2_edge.toml" else 1728)
    for p in points[:: max(1, len(points) // 50)]:
        spec.config(p, "example")  # every drawn design is a valid config


def test_chips_study_is_valid(monkeypatch):
    """examples/sweep/llama_chips.toml: 24 designs over array x SRAM x DRAM x chips; its
    base ring resized by `system.chips` (tensor parallelism over the chips)."""
    monkeypatch.chdir(ROOT)
    spec = load_spec(ROOT / "examples" / "sweep" / "llama_chips.toml")
    points = spec.points()
    assert len(points) == 24 and spec.system_data == {"topology": "ring:4", "link": {"preset": "tpu-v5e-ici"}}
    tps = {p["system.chips"]: spec.deployment(p) for p in points}
    assert tps[1].system is None and (tps[2].tp, tps[2].system["topology"]) == (2, "ring:2")
    assert (tps[4].tp, tps[4].chips) == (4, 4)


def test_gpt2_chips_study_is_valid(monkeypatch):
    """examples/sweep/gpt2_chips.toml: GPT-2 small's shape over array x SRAM x HBM x chips."""
    monkeypatch.chdir(ROOT)
    spec = load_spec(ROOT / "examples" / "sweep" / "gpt2_chips.toml")
    points = spec.points()
    assert len(points) == 24
    tps = {p["system.chips"]: spec.deployment(p) for p in points}
    assert tps[1].system is None and (tps[4].tp, tps[4].chips) == (4, 4)
