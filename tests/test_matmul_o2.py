"""The -O2 blocked matmul kernel (passes/graph_to_tile/matmul.py) against eager and -O0.

Every run is checked by the simulator's sanitisers (races, uninitialised reads), so the
semaphores the sync pass places for its multi-buffered loads are checked too. Besides
the cost model's default schedules, hypothesis draws schedules from the whole fitting
space (`matmul_schedule.candidates`) and forces them, so every loop shape the kernel
can take (peeled edges, unrolled pairs, one or two B / lhsT sets, staggered queues) is
compared with eager.
"""

import numpy as np
import pytest
import torch
from helpers import run_and_compare
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tilecc
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.passes.graph_to_tile import matmul as lower_matmul
from tilecc.passes.schedule import cost_model
from tilecc.passes.schedule.matmul_schedule import (
    MatmulProblem,
    MatmulSchedule,
    candidates,
    chunk_widths,
    fits,
    footprint,
    kernel_matmuls,
)
from tilecc.passes.schedule.matmul_tuning import kernel_alone
from tilecc.runtime.compare import tolerance
from tilecc.runtime.compiler import compile_graph, measure_program
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import load_config


class _MM(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class _Linear(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n) / k**0.5)

    def forward(self, x):
        return torch.relu(x @ self.w)


def _forced(a, b, target, schedule=None, pick=None):
    """Compile a @ b with a forced schedule (or `pick(problem, cfg)`), run it with the
    sanitisers on, compare with eager; returns (program, report, problem)."""
    cfg = load_config(target)
    gp = import_exported_program(export_model(_MM(), (a, b)))
    seen = {}

    def policy(problem, measure=None):
        seen["p"] = problem
        return schedule if schedule is not None else pick(problem, cfg)

    prog = compile_graph(gp, cfg, matmul_policy=policy)
    (out,), rep = run_program(prog, (a, b), sanitize=True)
    expected = a @ b
    rtol, atol = tolerance(expected.dtype, float(expected.float().abs().max()))
    torch.testing.assert_close(out.float(), expected.float(), rtol=rtol, atol=atol)
    return prog, rep, seen.get("p")


@settings(max_examples=12, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 150), k=st.integers(1, 90), n=st.integers(1, 140),
    batch=st.sampled_from([(), (2,), (2, 3)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_blocked_matmul_matches_eager(m, k, n, batch, dtype):
    a = torch.randn(*batch, m, k, dtype=dtype)
    b = torch.randn(*batch, k, n, dtype=dtype)
    run_and_compare(_MM(), (a, b))


@settings(max_examples=25, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 200), k=st.integers(1, 100), n=st.integers(1, 150),
    batch=st.sampled_from([(), (), (2,)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    which=st.integers(0, 10**6),
)
def test_any_fitting_schedule_matches_eager(m, k, n, batch, dtype, which):
    """A schedule drawn from every one that fits (tiny), forced on the kernel."""
    torch.manual_seed(which % 1000)
    a = torch.randn(*batch, m, k, dtype=dtype)
    b = torch.randn(*batch, k, n, dtype=dtype)

    def pick(problem, cfg):
        cands = candidates(problem, cfg)
        assert cands, problem
        return cands[which % len(cands)]

    _forced(a, b, "tiny", pick=pick)


@pytest.mark.parametrize("schedule", [
    MatmulSchedule(nb=3, w=2, g=1, b_sets=2, pipelined=True, qb=(0,), qa=(1,)),
    MatmulSchedule(nb=2, w=1, g=3, b_sets=1, pipelined=False, qb=(0,), qa=(0,)),
    MatmulSchedule(nb=5, w=3, g=2, b_sets=2, pipelined=False, qb=(0,), qa=(1,)),
    MatmulSchedule(nb=1, w=4, g=1, b_sets=2, pipelined=True, qb=(0,), qa=(1,)),
])
def test_edge_shapes_every_structure(schedule):
    """Several blocks with a short last block and m-tile, a short k tile, a narrow last
    chunk, two batch dims with a broadcast B (then a broadcast A): each forced structure
    matches eager."""
    torch.manual_seed(0)
    a = torch.randn(2, 3, 119, 37)
    b = torch.randn(1, 3, 37, 75)
    _forced(a, b, "tiny", schedule)
    _forced(torch.randn(3, 119, 37), torch.randn(2, 3, 37, 75), "tiny", schedule)


def test_staggered_queues_on_edge():
    """The edge preset (2 DMA queues): loads staggered over both queues' work."""
    torch.manual_seed(1)
    a, b = torch.randn(70, 130, dtype=torch.bfloat16), torch.randn(130, 100, dtype=torch.bfloat16)
    _forced(a, b, "edge", MatmulSchedule(nb=2, w=2, g=2, b_sets=2, pipelined=True, qb=(0,), qa=(1,)))


@pytest.mark.parametrize("target", ["tiny", "edge", "cloud"])
def test_blocked_matmul_presets(target):
    torch.manual_seed(0)
    run_and_compare(_Linear(300, 260).to(torch.bfloat16), (torch.randn(130, 300, dtype=torch.bfloat16),), target)


def test_o2_beats_o0_and_both_match():
    torch.manual_seed(0)
    model, x = _Linear(256, 256), torch.randn(192, 256)
    expected = model(x)
    cycles = {}
    for level in (0, 2):
        cm = tilecc.compile(model, (x,), target="tiny", opt_level=level)
        torch.testing.assert_close(cm(x), expected.detach(), rtol=1e-4, atol=1e-4)
        cycles[level] = cm.report.cycles
    assert cycles[2] * 3 < cycles[0], cycles


def test_bad_opt_level_is_a_clear_error():
    with pytest.raises(tilecc.TileccError, match="opt_level 1: tilecc has -O0"):
        tilecc.compile(_MM(), (torch.randn(2, 2), torch.randn(2, 2)), opt_level=1)


def test_same_model_gives_identical_streams():
    torch.manual_seed(0)
    model, x = _Linear(100, 90), torch.randn(77, 100)
    s1 = tilecc.compile(model, (x,), target="tiny").program.stream
    s2 = tilecc.compile(model, (x,), target="tiny").program.stream
    assert s1.tobytes() == s2.tobytes()


# ----------------------------------------------------------------------------- cost model


@pytest.mark.parametrize("target,shape", [("tiny", (150, 90, 140)), ("edge", (300, 200, 130)),
                                          ("tiny", (1, 64, 200))])
def test_cost_model_estimate_tracks_the_simulator(target, shape):
    """The analytical estimate of the chosen schedule is within 25 % of its simulated
    cycles (the kernel alone, timing-only)."""
    cfg = load_config(target)
    p = MatmulProblem.make(cfg, *shape, a_dtype="f32", b_dtype="f32")
    s = cost_model.choose(p, cfg)
    assert s is not None and fits(p, s, cfg)
    est = cost_model.estimate(p, s, cfg)
    real = measure_program(kernel_alone(p, cfg), s, cfg)
    assert 0.75 < est / real < 1.25, (est, real, s)


def test_cost_model_ranks_and_is_deterministic():
    cfg = load_config("tiny")
    p = MatmulProblem.make(cfg, 100, 70, 90, a_dtype="f32", b_dtype="f32")
    ranked = cost_model.rank(p, cfg)
    assert [e for e, _ in ranked] == sorted(e for e, _ in ranked)
    assert cost_model.choose(p, cfg) == cost_model.choose(p, cfg)
    assert all(fits(p, s, cfg) for _, s in ranked)


def test_cost_model_prefers_long_b_transfers_when_hbm_bound():
    """cloud, M = 1: the kernel streams B; the model picks wide chunks (long DMAs that
    amortise the ~2,000-cycle fixed cost) and B queues apart from the store queue."""
    cfg = load_config("cloud")
    p = MatmulProblem.make(cfg, 1, 4096, 4096)
    s = cost_model.choose(p, cfg)
    assert s.w >= 6 and cfg.dma.queues - 1 not in s.qb
    big = MatmulProblem.make(cfg, 4096, 4096, 4096)
    sb = cost_model.choose(big, cfg)
    assert sb.nb >= 4  # B is re-read once per block: large blocks


def test_footprint_and_kernel_size_match_the_kernel():
    cfg = load_config("tiny")
    p = MatmulProblem.make(cfg, 119, 37, 75, batch=(2,))
    s = MatmulSchedule(nb=3, w=2, g=1, b_sets=2, pipelined=True, qb=(0,), qa=(1,))
    gp = kernel_alone(p, cfg)
    counts = {}

    def after(name, module):
        if name == "plan-sram":
            for op in module.walk():
                if op.name == "tile.alloc" and "offset" in op.properties:
                    space = str(op.result.type.memory_space)
                    shape = op.result.type.get_shape()
                    counts.setdefault("acc" if "acc" in space else "sram", []).append(
                        (op.properties["offset"].value.data, shape[1] * (4 if "f32" in str(op.result.type) else 2)))
        if name == "lower-graph-to-tile":
            counts["matmuls"] = sum(1 for op in module.walk() if op.name == "tile.matmul")

    compile_graph(gp, cfg, matmul_policy=lambda _p, _m=None: s, after_pass=after)
    sram, acc = footprint(p, s)
    assert max(o + n for o, n in counts["sram"]) <= sram
    assert max(o + n for o, n in counts["acc"]) <= acc
    # an upper bound (narrower chunks hold fewer matmuls), close to the count
    assert counts["matmuls"] <= kernel_matmuls(p, s) <= 1.25 * counts["matmuls"] + 8


def test_chunk_widths_are_balanced():
    cfg = load_config("cloud")
    p = MatmulProblem.make(cfg, 128, 4096, 11008)
    w = chunk_widths(p, 12)
    assert sum(w) == 11008 and max(w) <= 12 * 128 and max(w) - min(w) <= 128 + 11008 % 128


# ----------------------------------------------------------------------------- extension points


class _ReluEpilogue(lower_matmul.BlockedMatmulKernel):
    """Extension point (b): the evacuation applies relu on its way to HBM."""

    def evacuate(self, acc, parity, m0, n0, ms, ns):
        from tilecc.ir import tile

        out = self.obuf[parity]
        self.kb.add(tile.UnaryOp("relu", acc, out, self.c(ms), self.c(ns)))
        self.kb.add(tile.StoreOp(out, self.argO, [*self.ivs, m0, n0], self.c(ms), self.c(ns),
                                 self.rank - 2, self.rank - 1))


class _NegatedA(lower_matmul.BlockedMatmulKernel):
    """Extension point (a): the A rows are produced on chip (here: loaded and negated)."""

    def load_a_rows(self, dst, m0, k0, ms, cols, queue):
        from tilecc.ir import tile

        super().load_a_rows(dst, m0, k0, ms, cols, queue)
        self.kb.add(tile.UnaryOp("neg", dst, dst, self.c(ms), self.c(cols)))


@pytest.mark.parametrize("cls,fn", [(_ReluEpilogue, lambda a, b: torch.relu(a @ b)),
                                    (_NegatedA, lambda a, b: (-a) @ b)])
def test_extension_points(monkeypatch, cls, fn):
    monkeypatch.setattr(lower_matmul, "BlockedMatmulKernel", cls)
    torch.manual_seed(0)
    a, b = torch.randn(70, 45), torch.randn(45, 60)
    cfg = load_config("tiny")
    gp = import_exported_program(export_model(_MM(), (a, b)))
    prog = compile_graph(gp, cfg)
    (out,), _ = run_program(prog, (a, b), sanitize=True)
    torch.testing.assert_close(out, fn(a, b), rtol=1e-4, atol=1e-4)


def test_problem_signature_is_json_and_schedule_round_trips():
    import json

    cfg = load_config("tiny")
    p = MatmulProblem.make(cfg, 5, 6, 7, batch=(2,), a_batch=(True,), b_batch=(False,))
    json.dumps(p.signature())
    s = MatmulSchedule(nb=2, w=3, g=1, b_sets=1, pipelined=False, qb=(0, 1), qa=(1,), stagger=True)
    assert MatmulSchedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert np.isfinite(cost_model.estimate(p, MatmulSchedule(nb=1, w=1, g=1, qb=(0,), qa=(1,)), cfg))
