"""Autotuning (passes/schedule/autotune.py) and its on-disk cache; the matmul tuning policy.

The generic tuner is tested with a fake kernel (a measure function over parameter
dicts); the matmul policy end to end on `tiny` (compiled programs compared with eager,
sanitisers on), counting candidate evaluations to show a second compile skips the
search.
"""

import dataclasses
import json
import os
import warnings
from pathlib import Path

import pytest
import torch

import tilecc
from tilecc.passes.schedule import autotune
from tilecc.passes.schedule.autotune import Autotuner, config_hash
from tilecc.simulator.config import load_config

CANDS = [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}]
SIG = {"M": 3, "K": 4, "N": 5, "dtypes": ["f32"] * 3, "kernel": "fake-1"}


class Measure:
    def __init__(self):
        self.calls = 0

    def __call__(self, params):
        self.calls += 1
        return 10.0 + (params["x"] - 3) ** 2


def test_tune_picks_the_fastest_and_caches(tmp_path):
    cfg = load_config("tiny")
    m = Measure()
    t = Autotuner(cfg, tmp_path)
    r = t.tune("fake", SIG, CANDS, m)
    assert r.params == {"x": 3} and r.cycles == 10.0 and not r.cached
    assert (t.searches, t.evaluations, t.hits, m.calls) == (1, 4, 0, 4)
    # same tuner: memory; a new tuner (another process): the file
    assert t.tune("fake", SIG, CANDS, m).params == {"x": 3} and t.hits == 1
    t2 = Autotuner(cfg, tmp_path)
    r2 = t2.tune("fake", SIG, CANDS, m)
    assert r2.cached and r2.params == {"x": 3}
    assert (t2.searches, t2.evaluations, t2.hits, m.calls) == (0, 0, 1, 4)
    data = json.loads(t.cache_file.read_text())
    assert data["config_hash"] == config_hash(cfg) and len(data["entries"]) == 1


def test_ties_keep_the_earlier_candidate_and_failures_lose(tmp_path):
    t = Autotuner(load_config("tiny"), tmp_path)

    def measure(p):
        if p["x"] == 1:
            raise tilecc.TileccError("does not compile")
        return 5.0

    assert t.tune("fake", SIG, CANDS, measure).params == {"x": 2}
    with pytest.raises(tilecc.TileccError, match="no candidates"):
        t.tune("fake", {"other": 1}, [], measure)


def test_cache_location_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECC_CACHE_DIR", str(tmp_path / "c"))
    t = Autotuner(load_config("tiny"))
    t.tune("fake", SIG, CANDS, Measure())
    assert t.cache_file.parent == tmp_path / "c" and t.cache_file.exists()
    monkeypatch.delenv("TILECC_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Autotuner(load_config("tiny")).cache_dir == tmp_path / "home" / ".cache" / "tilecc"


@pytest.mark.parametrize("garbage", ["{not json", "[1, 2]", '{"format": 1, "config_hash": "x", "entries": {}}',
                                     '{"format": 1, "config_hash": "%s", "entries": {"k": {"params": 3}}}'])
def test_corrupt_cache_is_ignored_with_a_warning_and_rewritten(tmp_path, garbage):
    cfg = load_config("tiny")
    t = Autotuner(cfg, tmp_path)
    tmp_path.mkdir(exist_ok=True)
    t.cache_file.write_text(garbage.replace("%s", config_hash(cfg)))
    m = Measure()
    with pytest.warns(UserWarning, match="corrupt"):
        r = t.tune("fake", SIG, CANDS, m)
    assert r.params == {"x": 3} and m.calls == 4
    data = json.loads(t.cache_file.read_text())  # rewritten, valid
    assert len(data["entries"]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Autotuner(cfg, tmp_path).tune("fake", SIG, CANDS, m).cached


def test_writes_are_atomic(tmp_path, monkeypatch):
    cfg = load_config("tiny")
    t = Autotuner(cfg, tmp_path)
    t.tune("fake", SIG, CANDS, Measure())
    before = t.cache_file.read_text()
    moves = []
    real_replace = os.replace

    def recording(src, dst):
        moves.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(autotune.os, "replace", recording)
    t.tune("fake", {**SIG, "M": 4}, CANDS, Measure())
    (src, dst), = moves
    assert src.parent == dst.parent == tmp_path and dst == t.cache_file and not src.exists()

    # a failure before the move leaves the old file whole and no temporary file behind
    def failing(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(autotune.os, "replace", failing)
    after_first = t.cache_file.read_text()
    with pytest.warns(UserWarning, match="cannot be written"):
        r = t.tune("fake", {**SIG, "M": 5}, CANDS, Measure())
    assert r.params == {"x": 3}  # the winner is still used
    assert t.cache_file.read_text() == after_first != before
    assert [p.name for p in tmp_path.iterdir()] == [t.cache_file.name]


def test_keyed_by_config_and_version(tmp_path, monkeypatch):
    cfg = load_config("tiny")
    m = Measure()
    Autotuner(cfg, tmp_path).tune("fake", SIG, CANDS, m)
    other = dataclasses.replace(cfg, hbm=dataclasses.replace(cfg.hbm, bytes_per_cycle=cfg.hbm.bytes_per_cycle * 2))
    t = Autotuner(other, tmp_path)
    assert config_hash(other) != config_hash(cfg) and t.cache_file != Autotuner(cfg, tmp_path).cache_file
    assert not t.tune("fake", SIG, CANDS, m).cached and t.evaluations == 4
    renamed = dataclasses.replace(cfg, name="renamed")  # the name is not hardware
    assert Autotuner(renamed, tmp_path).tune("fake", SIG, CANDS, m).cached
    monkeypatch.setattr(autotune, "VERSION", "tilecc-next")
    assert not Autotuner(cfg, tmp_path).tune("fake", SIG, CANDS, m).cached
    # another kernel signature misses too
    assert not Autotuner(cfg, tmp_path).tune("fake", {**SIG, "K": 99}, CANDS, m).cached


def test_max_candidates(tmp_path):
    t = Autotuner(load_config("tiny"), tmp_path, max_candidates=2)
    r = t.tune("fake", SIG, CANDS, Measure())
    assert t.evaluations == 2 and r.params == {"x": 2}


# ----------------------------------------------------------------------------- matmul


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(40, 56)
        self.b = torch.nn.Linear(56, 40)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + self.a(x).sum()


def test_autotune_compile_matches_eager_and_second_compile_skips_the_search(tmp_path):
    torch.manual_seed(0)
    model, x = _MLP().eval(), torch.randn(37, 40)
    with torch.no_grad():
        expected = model(x)
    t1 = Autotuner(load_config("tiny"), tmp_path, max_candidates=3)
    cm = tilecc.compile(model, (x,), target="tiny", autotune=t1)
    cm.sanitize = True
    torch.testing.assert_close(cm(x), expected, rtol=1e-4, atol=1e-4)
    assert t1.searches >= 2 and t1.evaluations == 3 * t1.searches
    t2 = Autotuner(load_config("tiny"), tmp_path, max_candidates=3)
    cm2 = tilecc.compile(model, (x,), target="tiny", autotune=t2)
    assert t2.evaluations == 0 and t2.searches == 0 and t2.hits >= 2
    assert cm2.program.stream.tobytes() == cm.program.stream.tobytes()
    # the tuned schedules are never slower than the cost model's (its choice is candidate 0)
    plain = tilecc.compile(model, (x,), target="tiny")
    plain(x)
    assert cm.report.cycles <= plain.report.cycles


def test_autotune_true_uses_the_env_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECC_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    a, b = torch.randn(20, 30), torch.randn(30, 25)

    class MM(torch.nn.Module):
        def forward(self, a, b):
            return a @ b

    cm = tilecc.compile(MM(), (a, b), target="tiny", autotune=True)
    cm.sanitize = True
    torch.testing.assert_close(cm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    files = list(tmp_path.glob("autotune-*.json"))
    assert len(files) == 1
    entries = json.loads(files[0].read_text())["entries"]
    assert len(entries) == 1 and next(iter(entries.values()))["kind"] == "matmul"


def test_cli_autotune(tmp_path, monkeypatch, capsys):
    from tilecc.cli import main

    monkeypatch.setenv("TILECC_CACHE_DIR", str(tmp_path))
    # (the transformer block: its q/k/v and output projections are matmul kernels the
    # autotuner searches, its MLP one fused MLP kernel: test_cli_autotune_fused_mlp)
    src = Path(__file__).resolve().parent.parent / "examples" / "transformer_block.py"
    assert main(["run", f"{src}:block", "--target", "tiny", "--autotune", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["allclose"]
    assert list(tmp_path.glob("autotune-*.json"))


def test_an_invalid_cached_matmul_schedule_is_searched_again(tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(20, 30), torch.randn(30, 25)

    class MM(torch.nn.Module):
        def forward(self, a, b):
            return a @ b

    t = Autotuner(load_config("tiny"), tmp_path, max_candidates=2)
    tilecc.compile(MM(), (a, b), target="tiny", autotune=t)
    data = json.loads(t.cache_file.read_text())
    (entry,) = data["entries"].values()
    entry["params"]["qb"] = [99]  # no such DMA queue
    t.cache_file.write_text(json.dumps(data))
    t2 = Autotuner(load_config("tiny"), tmp_path, max_candidates=2)
    with pytest.warns(UserWarning, match="not a valid candidate"):
        cm = tilecc.compile(MM(), (a, b), target="tiny", autotune=t2)
    assert t2.searches == 1
    torch.testing.assert_close(cm(a, b), a @ b, rtol=1e-4, atol=1e-4)


def _entries(d: Path) -> list[dict]:
    (f,) = d.glob("autotune-*.json")
    return list(json.loads(f.read_text())["entries"].values())


def test_cli_autotune_fused_mlp(tmp_path, monkeypatch, capsys):
    """An MLP alone is one fused MLP kernel: --autotune searches its schedule
    (passes/graph_to_tile/mlp/tuning.py) and caches the winner."""
    from tilecc.cli import main

    monkeypatch.setenv("TILECC_CACHE_DIR", str(tmp_path))
    src = Path(__file__).resolve().parent.parent / "examples" / "mlp.py"
    assert main(["run", f"{src}:mlp_odd", "--target", "tiny", "--autotune", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["allclose"] and out["kernels"] == 1
    mlp = [e for e in _entries(tmp_path) if e["kind"] == "fused_mlp"]
    assert len(mlp) == 1 and mlp[0]["evaluated"] >= 2
    sig = mlp[0]["signature"]
    assert (sig["M"], sig["K"], sig["H"], sig["N"]) == (37, 53, 29, 31) and sig["a"] == "f32"
    assert not sig["gated"] and not sig["prologue"] and sig["epilogue"] and sig["kernel"]
    assert any("chosen by the autotuner" in r["message"] for r in out["remarks"])


class _Gelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(40, 48), torch.nn.Linear(48, 24)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def test_fused_mlp_autotune_matches_eager_and_a_second_compile_hits_the_cache(tmp_path):
    torch.manual_seed(0)
    model, x = _Gelu().eval(), torch.randn(70, 40)
    with torch.no_grad():
        expected = model(x)
    t1 = Autotuner(load_config("tiny"), tmp_path)
    cm = tilecc.compile(model, (x,), target="tiny", autotune=t1)
    cm.sanitize = True
    torch.testing.assert_close(cm(x), expected, rtol=1e-4, atol=1e-4)
    kinds = [e["kind"] for e in _entries(tmp_path)]
    assert kinds == ["fused_mlp"] and t1.searches == 1 and t1.evaluations >= 2
    t2 = Autotuner(load_config("tiny"), tmp_path)
    cm2 = tilecc.compile(model, (x,), target="tiny", autotune=t2)
    assert (t2.searches, t2.evaluations, t2.hits) == (0, 0, 1)
    assert cm2.program.stream.tobytes() == cm.program.stream.tobytes()
    cm2.sanitize = True
    torch.testing.assert_close(cm2(x), expected, rtol=1e-4, atol=1e-4)
    # the cost model's pick is candidate 0: the tuned kernel is never slower
    plain = tilecc.compile(model, (x,), target="tiny")
    torch.testing.assert_close(plain(x), expected, rtol=1e-4, atol=1e-4)
    assert cm.report.cycles <= plain.report.cycles


def test_gated_mlp_autotune_matches_eager(tmp_path):
    """A SwiGLU MLP with its residual add (gated, an epilogue reading x) is one fused
    MLP kernel under the autotuner too; its signature says gated."""
    from tests.test_fused_mlp import SwiGlu

    torch.manual_seed(0)
    model, x = SwiGlu(32, 80).eval(), torch.randn(1, 50, 32)
    with torch.no_grad():
        expected = model(x)
    t = Autotuner(load_config("tiny"), tmp_path)
    cm = tilecc.compile(model, (x,), target="tiny", autotune=t)
    cm.sanitize = True
    torch.testing.assert_close(cm(x), expected, rtol=1e-4, atol=1e-4)
    assert any(name.endswith("fused_mlp") for name, _, _ in cm.program.kernels)
    (entry,) = [e for e in _entries(tmp_path) if e["kind"] == "fused_mlp"]
    assert entry["signature"]["gated"] and entry["signature"]["epilogue"] and entry["evaluated"] >= 2
