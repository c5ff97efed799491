"""Differential fuzzing: random programs (tests/fuzz_programs.py) compiled at -O0 and
-O2, simulated with the sanitisers on, compared with torch eager.

Profiles (``TILECC_FUZZ``): ``fast`` (default, a handful of examples, part of every
test run) and ``deep`` (``make fuzz``; ``TILECC_FUZZ_EXAMPLES`` examples, default
5000), which writes every failing program it finds, shrunk, to
tests/fuzz_regressions/ as a JSON case. Every saved case is replayed here by
`test_fuzz_regression` in every run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fuzz_programs import REGRESSIONS, case_path, check, programs, save_regression, with_saved_tolerance
from hypothesis import HealthCheck, given, settings

PROFILE = os.environ.get("TILECC_FUZZ", "fast")
DEEP = PROFILE == "deep"
settings.register_profile("tilecc-fuzz-fast", max_examples=6, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck), database=None)
settings.register_profile("tilecc-fuzz-deep", max_examples=int(os.environ.get("TILECC_FUZZ_EXAMPLES", "5000")),
                          deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
COUNTER = os.environ.get("TILECC_FUZZ_COUNTER")  # deep runs: a file counting the cases run


def _count(desc: dict) -> None:
    """One line per program run (a hash of it: shrinking replays repeat hashes)."""
    if COUNTER:
        import hashlib

        with open(COUNTER, "a") as f:
            f.write(hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16] + "\n")


@settings(settings.get_profile(f"tilecc-fuzz-{'deep' if DEEP else 'fast'}"))
@given(desc=programs())
def test_random_programs_match_eager(desc):
    _count(desc)
    try:
        check(with_saved_tolerance(desc))
    except Exception as e:
        if DEEP:  # while hypothesis shrinks, each smaller failing program replaces the last
            if _SAVED and _SAVED[-1] != case_path(desc) and not json.loads(_SAVED[-1].read_text()).get("explained"):
                _SAVED.pop().unlink(missing_ok=True)
            _SAVED.append(save_regression(desc, e))
        raise


_SAVED: list[Path] = []  # the case this run wrote last (the shrunk one, once shrinking ends)


REGRESSION_FILES = sorted(REGRESSIONS.glob("*.json"))


@pytest.mark.parametrize("path", REGRESSION_FILES, ids=[p.stem for p in REGRESSION_FILES])
def test_fuzz_regression(path: Path):
    check(json.loads(path.read_text())["program"])


def test_strategy_covers_the_op_set():
    """The strategy reaches every op kind (checked on drawn descriptions, no compiling)."""
    from fuzz_programs import BINARY, REDUCE, UNARY
    from hypothesis import find

    wanted = set(UNARY) | set(BINARY) | set(REDUCE) | {
        "linear", "matmul_param", "gram", "softmax", "layernorm", "reshape", "permute", "slice", "scale",
        "add_param", "div_param"}
    seen: set[str] = set()

    def covers(d):
        seen.update(s["op"] for s in d["steps"])
        return wanted <= seen

    find(programs(max_steps=6), covers, settings=settings(max_examples=5000, database=None))


def test_a_failing_program_is_saved_as_a_replayable_case(tmp_path):
    from fuzz_programs import FuzzModule, make_inputs

    desc = {"dtype": "float32", "seed": 1, "inputs": [[3, 5]],
            "steps": [{"op": "softmax", "args": [0], "dim": 1}], "outputs": [1]}
    path = save_regression(desc, AssertionError("-O2 output 0: Tensor-likes are not close!\nMismatched"), tmp_path)
    saved = json.loads(path.read_text())
    assert saved["program"] == desc and saved["failure"].startswith("AssertionError: -O2 output 0")
    assert save_regression(desc, AssertionError("again"), tmp_path) == path  # one file per program
    model = FuzzModule(saved["program"])
    assert model(*make_inputs(desc)).shape == (3, 5)
    check(saved["program"])


def test_a_deep_run_keeps_explained_cases(tmp_path):
    """A deep run replays hypothesis's database, so it meets saved programs again: an
    explained case is checked with the tolerance it carries and its file never rewritten."""
    saved = json.loads((REGRESSIONS / "case-0f4a3be95b8c.json").read_text())
    bare = {k: v for k, v in saved["program"].items() if k != "atol"}
    assert with_saved_tolerance(bare)["atol"] == saved["program"]["atol"]
    (tmp_path / case_path(bare).name).write_text(json.dumps(saved))
    path = save_regression(bare, AssertionError("not close"), tmp_path)
    assert json.loads(path.read_text()) == saved
    other = save_regression({**bare, "seed": 99}, AssertionError("not close"), tmp_path)
    assert other != path and json.loads(other.read_text())["failure"] == "AssertionError: not close"


def test_error_scales_follow_cancellation_not_the_output():
    """gram(x) - gram(x) is 0 but carries the rounding step of gram(x); a softmax starts
    afresh from its own output."""
    import torch
    from fuzz_programs import FuzzModule, make_inputs

    desc = {"dtype": "bfloat16", "seed": 0, "inputs": [[2, 12]],
            "steps": [{"op": "gram", "args": [0]}, {"op": "gram", "args": [0]}, {"op": "sub", "args": [1, 2]},
                      {"op": "softmax", "args": [3], "dim": -1}],
            "outputs": [3, 4]}
    model = FuzzModule(desc)
    (x,) = make_inputs(desc)
    diff_scale, softmax_scale = model.error_scales(x)
    assert float((x.float() @ x.float().T).abs().max()) * 0.99 <= diff_scale
    assert float(model(x)[0].float().abs().max()) == 0.0
    assert softmax_scale == float(torch.softmax(torch.zeros(2, 2), -1).max())
