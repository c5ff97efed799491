"""HBM footprints as run patterns (`hbm_runs`) and their exact overlap test
(`runs_meet`), checked against byte sets built from `hbm_intervals`."""

from __future__ import annotations

import numpy as np

from tilecc.simulator.config import load_config
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.footprints import hbm_bounding, hbm_intervals, hbm_runs, runs_meet
from tilecc.simulator.isa import DType, Mem, Opcode, stream_of


def _random_dmas(n: int, seed: int) -> np.ndarray:
    """Loads and stores of random 2-D strided bf16 regions (negative, zero and
    transposed strides) around one HBM area."""
    rng = np.random.default_rng(seed)
    recs = []
    for _ in range(n):
        rs = int(rng.choice([0, 1, 2, 3, 5, 7, 8, 12]))
        cs = int(rng.choice([0, 1, 1, 1, 2, 3, 6]))
        rs, cs = (-rs if rng.random() < 0.2 else rs), (-cs if rng.random() < 0.1 else cs)
        if rng.random() < 0.3:
            rs, cs = cs, rs
        addr = int(rng.integers(200, 400)) * 2
        op = Opcode.DMA_LOAD if rng.random() < 0.5 else Opcode.DMA_STORE
        f = {"opcode": op, "rows": int(rng.integers(1, 6)), "cols": int(rng.integers(1, 6)),
             "hbm_rs": rs, "hbm_cs": cs, "a_dtype": DType.BF16, "o_dtype": DType.BF16,
             "a_mem": Mem.SRAM, "o_mem": Mem.SRAM}
        f |= {"a_mem": Mem.HBM, "a_addr": addr} if op == Opcode.DMA_LOAD else {"o_mem": Mem.HBM, "o_addr": addr}
        recs.append(f)
    return stream_of(*recs)


def test_runs_cover_the_bytes_and_meet_exactly():
    prog = DecodedProgram(_random_dmas(150, 0), load_config("cloud"))
    fp = hbm_bounding(prog)
    pitch, width, count = hbm_runs(prog, fp)
    runs, exact = [], 0
    for r in range(len(fp)):
        bytes_ = set()
        for lo, hi in hbm_intervals(prog, int(fp.instr[r]), "a" if fp.slot[r] == 0 else "o"):
            bytes_.update(range(lo, hi))
        b0, p, w = int(fp.b0[r]), int(pitch[r]), int(width[r])
        cover = {b0 + k * p + t for k in range(int(count[r])) for t in range(w)}
        assert bytes_ <= cover  # a superset: never misses a byte
        exact += bytes_ == cover
        runs.append(cover)
    assert exact > 0.7 * len(fp)  # only regions strided in both dimensions are not exact
    i, j = (x.ravel() for x in np.meshgrid(np.arange(len(fp)), np.arange(len(fp)), indexing="ij"))
    got = runs_meet(fp.b0[i], pitch[i], width[i], count[i], fp.b0[j], pitch[j], width[j], count[j])
    want = np.array([not runs[a].isdisjoint(runs[b]) for a, b in zip(i.tolist(), j.tolist(), strict=True)])
    assert want.any() and not want.all()
    np.testing.assert_array_equal(got, want)


def test_runs_meet_two_pitches_with_many_runs():
    """Two pitches, 1000 and 1001 bytes: x's runs [1000 i, 1000 i + 10) meet y's bytes
    500 + 1001 j first at j = 500 (i = 501), after several rounds of runs; with 500
    runs y misses x; a single byte against x is decided in O(1)."""
    xs = (np.zeros(4, np.int64), np.full(4, 1000), np.full(4, 10), np.full(4, 600))
    b = np.array([500, 500, 0, 9])
    m = np.array([600, 500, 1, 1])
    got = runs_meet(*xs, b, np.full(4, 1001), np.ones(4, np.int64), m)
    x_bytes = {1000 * i + t for i in range(600) for t in range(10)}
    want = [not x_bytes.isdisjoint({int(b[k]) + 1001 * j for j in range(int(m[k]))}) for k in range(4)]
    assert want == [True, False, True, True]
    np.testing.assert_array_equal(got, want)
