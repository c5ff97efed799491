"""The compiler's own provenance (tilecc/sources.py): which folders its packages come
from, the source hash the compile cache and saved fuzz cases carry, and the test
suite's refusal to judge another checkout's code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tilecc.sources import SUBPACKAGES, foreign_packages, package_dirs

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_comes_from_this_checkout():
    dirs = package_dirs()
    assert set(dirs) == set(SUBPACKAGES)
    assert dirs["tilecc.passes"] == ROOT / "passes"
    assert foreign_packages(ROOT) == {}


def _mixed_checkout(tmp_path: Path) -> Path:
    """A second checkout holding only tilecc/ (as a worktree run with this checkout's
    editable install sees it: its own tilecc/, every subpackage from here)."""
    other = tmp_path / "other"
    shutil.copytree(ROOT / "tilecc", other / "tilecc", ignore=shutil.ignore_patterns("__pycache__"))
    (other / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", other / "tests" / "conftest.py")
    (other / "tests" / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    return other


PROBE = ("import json, sys; sys.path.insert(0, '.'); from tilecc.sources import foreign_packages, "
         "compiler_source_hash; print(json.dumps([sorted(foreign_packages('.')), compiler_source_hash()]))")


def test_a_mixed_checkout_is_seen_and_hashed_as_it_runs(tmp_path):
    import json

    other = _mixed_checkout(tmp_path)
    # this checkout's hash from a fresh process too (this one's is of the sources it imported)
    ours = json.loads(subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout)[1]
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=other, capture_output=True, text=True, check=True)
    foreign, same = json.loads(run.stdout)
    assert foreign == sorted(n for n in SUBPACKAGES if n != "tilecc")  # passes/, frontend/, ... from here
    assert same == ours  # identical sources, identical hash
    with open(other / "tilecc" / "errors.py", "a") as f:
        f.write("# edited in the other checkout\n")
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=other, capture_output=True, text=True, check=True)
    assert json.loads(run.stdout)[1] != ours  # the cache key follows the code that runs


def test_the_suite_refuses_another_checkouts_compiler(tmp_path):
    other = _mixed_checkout(tmp_path)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=other,
                         capture_output=True, text=True)
    assert run.returncode != 0
    text = run.stdout + run.stderr
    assert f"these tests are in {other.resolve()} but the compiler is imported from elsewhere" in text
    assert f"tilecc.passes from {ROOT / 'passes'}" in text
    assert "Traceback" not in text
