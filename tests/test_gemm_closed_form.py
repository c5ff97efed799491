"""`tilecc gemm` in closed form: exactly the timing-only simulator's cycles on the
per-fold instruction stream (`simulate_folds`), in O(1) memory for any sizes."""

from __future__ import annotations

import dataclasses
import json
import time
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from tilecc.cli import main
from tilecc.simulator.config import load_config
from tilecc.simulator.gemm import gemm, simulate_folds


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 300), st.integers(1, 48), st.integers(1, 48),
       st.sampled_from(["ws", "os", "is"]), st.sampled_from(["compatible", "pipelined"]),
       st.sampled_from(["bf16", "f32"]), st.sampled_from(["tiny", "edge", "cloud"]))
def test_closed_form_equals_the_simulated_fold_stream(M, N, K, R, C, flow, mode, dtype, target):
    base = load_config(target)
    cfg = dataclasses.replace(base, matrix=dataclasses.replace(base.matrix, rows=R, cols=C, dataflow=flow, mode=mode))
    r = gemm(M, N, K, target, rows=R, cols=C, dataflow=flow, mode=mode, dtype=dtype)
    assert r["cycles"] == simulate_folds(M, N, K, cfg, dtype=dtype)


def test_huge_gemm_is_instant_and_small(capsys):
    tracemalloc.start()
    t0 = time.perf_counter()
    assert main(["gemm", "99999999", "99999999", "99999999", "--json"]) == 0
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    d = json.loads(capsys.readouterr().out)
    assert seconds < 2 and peak < 50 * 2**20
    n = -(-99999999 // 128)
    assert d["folds"] == n * n and d["macs"] == 99999999**3
    # pipelined WS on cloud's 128 x 128: L + (n - 1) * max(L, S') + S + D with S = M
    assert d["compute_cycles"] == 128 + (n * n - 1) * 99999999 + 99999999 + 254
