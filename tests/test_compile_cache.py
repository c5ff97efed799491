"""The compile cache (runtime/cache.py): a second compile of the same model takes the
cached program; keys change with graph, weights, config, options and compiler; writes
are atomic; corrupt or truncated entries are rebuilt with a warning; two processes
compiling the same model at once both succeed."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import tilecc
from tilecc.runtime import cache as cache_mod
from tilecc.runtime.cache import CompileCache
from tilecc.runtime.executor import run_program

ROOT = Path(__file__).parent.parent


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(24, 19)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


def _model():
    torch.manual_seed(0)
    return _Net().eval(), torch.randn(13, 24)


def _check(cm, model, x):
    cm.sanitize = True
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)


def _entries(c: CompileCache) -> list[Path]:
    return sorted(c.dir.glob("*.tpg"))


def test_second_compile_takes_the_cached_program(tmp_path):
    model, x = _model()
    c = CompileCache(tmp_path)
    cm1 = tilecc.compile(model, (x,), cache=c)
    assert cm1.compile_stats.cache == "miss" and (c.hits, c.misses) == (0, 1)
    assert len(_entries(c)) == 1
    cm2 = tilecc.compile(model, (x,), cache=c)
    assert cm2.compile_stats.cache == "hit" and (c.hits, c.misses) == (1, 1)
    assert cm2.program.to_bytes() == cm1.program.to_bytes()
    _check(cm1, model, x)
    _check(cm2, model, x)
    assert cm2.report.cycles == cm1.report.cycles
    assert not list(c.dir.glob("*.tmp"))


def test_cache_is_off_with_cache_false_and_in_the_test_suite(tmp_path, monkeypatch):
    model, x = _model()
    monkeypatch.setenv("TILECC_CACHE_DIR", str(tmp_path))
    cm = tilecc.compile(model, (x,), cache=False)
    assert cm.compile_stats.cache == "" and not (tmp_path / "programs").exists()
    assert os.environ["TILECC_COMPILE_CACHE"] == "0"  # tests/conftest.py
    cm = tilecc.compile(model, (x,))  # default: follows TILECC_COMPILE_CACHE
    assert cm.compile_stats.cache == "" and not (tmp_path / "programs").exists()
    monkeypatch.setenv("TILECC_COMPILE_CACHE", "1")
    cm = tilecc.compile(model, (x,))
    assert cm.compile_stats.cache == "miss" and len(list((tmp_path / "programs").glob("*.tpg"))) == 1
    _check(cm, model, x)


def test_default_location(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECC_CACHE_DIR", str(tmp_path / "c"))
    assert CompileCache().dir == tmp_path / "c" / "programs"
    monkeypatch.delenv("TILECC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert CompileCache().dir == tmp_path / "xdg" / "tilecc" / "programs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CompileCache().dir == tmp_path / "home" / ".cache" / "tilecc" / "programs"


@pytest.mark.parametrize("level", ["exported", "graph-ir"])
def test_key_depends_on_graph_weights_config_options_and_compiler(tmp_path, monkeypatch, level):
    from tilecc.frontend.torch_export import export_model, import_exported_program
    from tilecc.simulator.config import load_config

    # keyed on the torch.export graph (static models) or on the imported graph IR (dynamic ones)
    graph = (lambda ep: ep) if level == "exported" else import_exported_program
    model, x = _model()
    c = CompileCache(tmp_path)
    gp = graph(export_model(model, (x,)))
    tiny, edge = load_config("tiny"), load_config("edge")
    base = c.key(gp, tiny, {"opt_level": 2, "autotune": False})
    again = graph(export_model(model, (x,)))
    assert c.key(again, tiny, {"opt_level": 2, "autotune": False}) == base  # deterministic
    assert c.key(gp, edge, {"opt_level": 2, "autotune": False}) != base
    assert c.key(gp, tiny, {"opt_level": 0, "autotune": False}) != base
    with torch.no_grad():
        model.fc.weight[0, 0] += 1.0
    changed = graph(export_model(model, (x,)))
    assert c.key(changed, tiny, {"opt_level": 2, "autotune": False}) != base
    other = graph(export_model(model, (torch.randn(14, 24),)))
    assert c.key(other, tiny, {"opt_level": 2, "autotune": False}) != base
    monkeypatch.setattr(cache_mod, "compiler_fingerprint", lambda: "tilecc-next")
    assert c.key(gp, tiny, {"opt_level": 2, "autotune": False}) != base


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_entry_is_rebuilt_with_a_warning(tmp_path, damage):
    model, x = _model()
    c = CompileCache(tmp_path)
    good = tilecc.compile(model, (x,), cache=c).program.to_bytes()
    (entry,) = _entries(c)
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 7]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not a program" * 9)
    entry.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="compile cache entry is corrupt .*; rebuilding it"):
        cm = tilecc.compile(model, (x,), cache=c)
    assert cm.compile_stats.cache == "miss" and c.rebuilt == 1
    assert entry.read_bytes() == good  # rewritten whole
    _check(cm, model, x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert tilecc.compile(model, (x,), cache=c).compile_stats.cache == "hit"
    assert not [w for w in seen if "compile cache" in str(w.message)]


def test_writes_are_atomic_and_a_failed_write_still_compiles(tmp_path, monkeypatch):
    model, x = _model()
    c = CompileCache(tmp_path)
    seen = []
    real = os.replace

    def recording(src, dst):
        seen.append((Path(src), Path(dst)))
        assert Path(src).parent == Path(dst).parent and Path(src).stat().st_size > 40
        real(src, dst)

    monkeypatch.setattr(cache_mod.os, "replace", recording)
    tilecc.compile(model, (x,), cache=c)
    (src, dst), = seen
    assert dst.suffix == ".tpg" and src.suffix == ".tmp" and not src.exists()

    def failing(src, dst):
        raise OSError("disk full")

    c2 = CompileCache(tmp_path / "other")
    monkeypatch.setattr(cache_mod.os, "replace", failing)
    with pytest.warns(UserWarning, match="cannot be written .*disk full"):
        cm = tilecc.compile(model, (x,), cache=c2)
    assert not list(c2.dir.glob("*")) and cm.compile_stats.cache == "miss"
    _check(cm, model, x)


def test_planted_miscompilation_is_never_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TILECC_TEST_BREAK_PASS", "fuse-graph")
    assert cache_mod.resolve(CompileCache(tmp_path)) is None and cache_mod.resolve(True) is None


CONCURRENT = r"""
import sys, hashlib, torch, tilecc
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(40, 56), torch.nn.GELU(), torch.nn.Linear(56, 33)).eval()
x = torch.randn(29, 40)
cm = tilecc.compile(model, (x,), target="tiny")
cm.sanitize = True
y = cm(x)
with torch.no_grad():
    torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-4)
print(cm.compile_stats.cache, hashlib.sha256(cm.program.to_bytes()).hexdigest())
"""


@pytest.mark.slow  # three fresh Python processes importing torch: ~15 s idle, ~40 s on a loaded machine
def test_two_processes_compiling_the_same_model_at_once_both_succeed(tmp_path):
    env = {**os.environ, "TILECC_CACHE_DIR": str(tmp_path), "TILECC_COMPILE_CACHE": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    digests = {out.split()[1] for out, _ in outs}
    assert len(digests) == 1
    entries = list((tmp_path / "programs").glob("*.tpg"))
    assert len(entries) == 1 and not list((tmp_path / "programs").glob("*.tmp"))
    # a third process takes the cached program, which is the same bytes
    p = subprocess.run([sys.executable, "-c", CONCURRENT], cwd=ROOT, env=env, text=True,
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    state, digest = p.stdout.split()
    assert state == "hit" and digest in digests


def test_cached_program_runs_like_a_fresh_one(tmp_path):
    model, x = _model()
    c = CompileCache(tmp_path)
    fresh = tilecc.compile(model, (x,), cache=False).program
    tilecc.compile(model, (x,), cache=c)
    cached = tilecc.compile(model, (x,), cache=c).program
    a, ra = run_program(fresh, (x,), sanitize=True)
    b, rb = run_program(cached, (x,), sanitize=True)
    assert torch.equal(a[0], b[0]) and ra.cycles == rb.cycles


def test_a_model_that_cannot_be_keyed_compiles_without_the_cache(tmp_path, monkeypatch):
    model, x = _model()

    def unkeyable(ep):
        raise RuntimeError("sparse tensors have no bytes")

    monkeypatch.setattr(cache_mod, "exported_digest", unkeyable)
    c = CompileCache(tmp_path)
    with pytest.warns(UserWarning, match="cannot be keyed"):
        cm = tilecc.compile(model, (x,), cache=c)
    assert not c.dir.exists()
    _check(cm, model, x)


def test_the_cache_directory_is_bounded_least_recently_used_first(tmp_path, monkeypatch):
    """Entries beyond $TILECC_CACHE_MAX_GB go, oldest use first; a hit refreshes an entry;
    the entry just written stays; a bad bound is one clear error."""
    c = CompileCache(tmp_path)
    c.dir.mkdir(parents=True)
    for i, name in enumerate(("a", "b", "c", "d")):
        p = c.path(name)
        p.write_bytes(b"x" * 1000)
        os.utime(p, (1000 + i, 1000 + i))
    os.utime(c.path("a"), (5000, 5000))  # used recently (as `get` does)
    assert c.evict(keep="b", max_bytes=2500) == 2  # c and d: the oldest after b, which stays
    assert sorted(p.stem for p in _entries(c)) == ["a", "b"]
    assert c.evict(max_bytes=0) == 0  # no bound
    model, x = _model()
    monkeypatch.setenv("TILECC_CACHE_MAX_GB", str(1500 / (1 << 30)))
    cm = tilecc.compile(model, (x,), target="tiny", cache=c)
    _check(cm, model, x)
    assert len(_entries(c)) == 1  # only the new program: it alone exceeds the bound
    monkeypatch.setenv("TILECC_CACHE_MAX_GB", "lots")
    with pytest.raises(tilecc.errors.ConfigError, match="TILECC_CACHE_MAX_GB"):
        cache_mod.max_bytes_from_env()
