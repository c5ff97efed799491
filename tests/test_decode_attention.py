"""The decode-attention kernel (passes/graph_to_tile/attention/decode_*.py): a decode
step's attention (a few query rows per head over the whole KV cache, masked by the
position) as one kernel over every (batch, KV head) problem, against torch eager."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tilecc
from tests.helpers import run_and_compare
from tilecc.passes.graph_to_tile.attention.decode_cost import choose, estimate
from tilecc.passes.graph_to_tile.attention.decode_plan import candidates, decode_problem
from tilecc.simulator.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gqa_decode import GqaDecode  # noqa: E402  (repeat_kv, then sdpa with the mask)


class _Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def _decode_inputs(batch, kv_heads, group, S, D, positions, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, 1, D, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, S, D, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, S, D, generator=g).to(dtype)
    mask = torch.zeros(batch, 1, 1, S, dtype=dtype)
    for b, pos in enumerate(positions):
        mask[b, :, :, pos + 1:] = float("-inf")  # cache positions not yet written
    return q, k, v, mask


def _names(cm) -> list[str]:
    return [name for name, _, _ in cm.program.kernels]


@settings(max_examples=12, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.sampled_from([1, 2, 3]), kv_heads=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 2, 4]),
       S=st.sampled_from([1, 6, 16, 24, 33, 40]), D=st.sampled_from([1, 8, 15, 16]), data=st.data(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_grouped_decode_matches_eager_tiny(batch, kv_heads, group, S, D, data, dtype):
    """Batch, heads, KV heads, head dim, cache length and each sequence's position: one
    decode-attention kernel, equal to eager."""
    positions = [data.draw(st.integers(0, S - 1)) for _ in range(batch)]
    inputs = _decode_inputs(batch, kv_heads, group, S, D, positions, dtype)
    cm = run_and_compare(GqaDecode(), inputs, "tiny")
    assert any("decode_attention" in n for n in _names(cm)), _names(cm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_1b_decode_shape_on_cloud(dtype):
    """The Llama-3.2-1B decode shape (8 KV heads of 4 query heads, head dim 64) over a
    130-position cache at batch 4: groups of problems, several positions per DMA row."""
    positions = [129, 64, 3, 100]
    inputs = _decode_inputs(4, 8, 4, 130, 64, positions, dtype, seed=3)
    cm = run_and_compare(GqaDecode(), inputs, "cloud")
    assert _names(cm) == ["k0_decode_attention"]
    msgs = [r["message"] for r in cm.program.meta["remarks"] if r["message"].startswith("decode attention [")]
    assert msgs and "32 problems of 4 rows" in msgs[0], msgs
    # a bf16 mask loads by DMA transposes (one per mask row of a group); fp32 cannot
    assert ("mask rows by DMA transposes" in msgs[0]) == (dtype == torch.bfloat16), msgs


def test_mask_layout_choice():
    """The mask rows load transposed (window t of mask row b on partition b f + t, one
    DMA transpose per row) where that is faster than f strided loads of every f-th
    position: a 2-byte mask, several windows, the rows times f within the partitions;
    the DMA cost model decides, and the layout changes the buffers and the selection
    constant's shapes."""
    from tilecc.passes.graph_to_tile.attention.decode_plan import (
        mask_shape,
        mask_transposed,
        sel_shape,
        with_mask_layout,
    )
    from tilecc.simulator.timing import DmaPattern, TimingRules

    cfg = load_config("cloud")
    tm = TimingRules(cfg)

    def problem(batch: int, S: int, isz: int = 2):
        p, why = decode_problem([batch, 8, 4, 64], [batch, 8, S, 64], [batch, 8, S, 64], [batch, 8, 4, 64],
                                [batch, 1, 1, S], False, isz, isz == 4, 128)
        assert p is not None, why
        return p

    best = choose(problem(1, 2050), cfg)
    assert best is not None
    s = best[0]
    assert s.online and s.f > 1 and s.mask_span == 1 and s.mask_t
    # the strided alternative: f loads of one element per descriptor, each far slower
    strided = s.f * tm.dma_time(1, s.rc, 2, DmaPattern.STRIDED)
    assert tm.dma_time(s.f, s.rc, 2, DmaPattern.TRANSPOSE) * 3 < strided
    assert mask_shape(problem(1, 2050), s) == (s.f, s.rc) and sel_shape(problem(1, 2050), s) == (s.f, s.f * s.n * 4)
    plain = replace(s, mask_t=False)
    assert mask_shape(problem(1, 2050), plain) == (1, s.f * s.rc)
    assert with_mask_layout(problem(1, 2050), plain, cfg).mask_t
    # fp32 masks cannot be DMA-transposed; one window needs no permutation; rows times f
    # beyond the partitions do not fit one contraction
    assert not mask_transposed(problem(1, 2050, 4), replace(s, mask_t=False), cfg)
    assert not mask_transposed(problem(1, 2050), replace(s, f=1, mask_t=False), cfg)
    assert not mask_transposed(problem(1, 2050), replace(s, mask_span=64, mask_t=False), cfg)


def test_one_query_row_without_mask():
    """Multi-head attention of one new token (no grouping, no mask)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(2, 3, 1, 16, generator=g), torch.randn(2, 3, 40, 16, generator=g), torch.randn(
        2, 3, 40, 16, generator=g)
    cm = run_and_compare(_Sdpa(), (q, k, v), "tiny")
    assert any("decode_attention" in n for n in _names(cm))


class _Masked(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_mask_varying_by_row_falls_back_with_a_remark():
    """Two query rows with different mask rows are not one decode problem: the flash
    kernel lowers it and a remark says why."""
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 2, 2, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g), torch.randn(
        1, 2, 20, 8, generator=g)
    mask = torch.zeros(1, 1, 2, 20)
    mask[0, 0, 0, 10:] = float("-inf")
    cm = run_and_compare(_Masked(), (q, k, v, mask), "tiny")
    assert _names(cm) == ["k0_attention"]
    missed = [r["message"] for r in cm.program.meta["remarks"] if r["kind"] == "missed"]
    assert any("decode-shaped attention" in m and "flash kernel" in m and "mask" in m for m in missed), missed


def test_problem_recognition():
    """What counts as a decode problem: few rows, no causal mask, k / v per problem, a
    mask with one row per problem (the mask row of each problem recorded)."""
    p, why = decode_problem([2, 8, 4, 64], [2, 8, 130, 64], [2, 8, 130, 64], [2, 8, 4, 64], [2, 1, 1, 130],
                            False, 2, False, 128)
    assert p is not None and p.P == 16 and p.L == 4 and p.mask_rows == (0,) * 8 + (1,) * 8 and p.mask_count == 2
    assert decode_problem([1, 2, 64, 8], [1, 2, 64, 8], [1, 2, 64, 8], [1, 2, 64, 8], None, False, 2, False,
                          128)[0] is None
    assert "causal" in decode_problem([1, 2, 1, 8], [1, 2, 9, 8], [1, 2, 9, 8], [1, 2, 1, 8], None, True, 2, False,
                                      128)[1]
    assert "broadcast" in decode_problem([1, 2, 1, 8], [1, 1, 9, 8], [1, 1, 9, 8], [1, 2, 1, 8], None, False, 2,
                                         False, 128)[1]
    why = decode_problem([1, 2, 2, 8], [1, 2, 9, 8], [1, 2, 9, 8], [1, 2, 2, 8], [1, 1, 2, 9], False, 2, False, 128)[1]
    assert "mask" in why


def test_cost_model_chooses_among_fitting_schedules():
    """The schedule is the candidate of least estimate; every candidate fits SRAM and the
    accumulator, divides the problems into whole groups and the cache into whole rows."""
    cfg = load_config("cloud")
    p, _ = decode_problem([32, 8, 4, 64], [32, 8, 130, 64], [32, 8, 130, 64], [32, 8, 4, 64], [32, 1, 1, 130],
                          False, 2, False, 128)
    assert p is not None
    cands = candidates(p, cfg)
    assert cands and all(p.P % s.n == 0 and p.S % s.f == 0 and s.n * p.L <= 128 and s.m * s.R(p) <= 128
                         for s in cands)
    best = choose(p, cfg)
    assert best is not None
    s, cost, tried = best
    assert tried == len(cands)
    assert cost.total == min(estimate(p, c, cfg).total for c in cands)
    # at batch 32 a K / V transfer of one problem (16 KiB in 128-byte rows) would leave the
    # DMA queues busiest: the choice reads several positions per row
    assert s.f > 1


def test_estimate_tracks_the_simulated_time():
    """The kernel's estimate (its schedule's replay) is within 15% of the simulated cycles."""
    inputs = _decode_inputs(8, 8, 4, 130, 64, [129] * 8, torch.bfloat16)
    cm = tilecc.compile(GqaDecode().eval(), inputs, target="cloud")
    report = cm.simulate(*inputs)
    msg = next(r["message"] for r in cm.program.meta["remarks"] if r["message"].startswith("decode attention ["))
    sched = float(msg.split("schedule ")[1].split(";")[0].replace(",", ""))
    assert abs(sched - report.cycles) / report.cycles < 0.15, (sched, report.cycles)


@pytest.mark.parametrize("batch,dtype", [(8, torch.float32), (16, torch.bfloat16)])
def test_many_groups_in_a_loop_tiny(batch, dtype):
    """More problems than fill the partitions (tiny: 16): groups of 4 problems, several
    groups per loop body and several loop trips, every position of the cache in use."""
    positions = [(7 * b) % 24 for b in range(batch)]
    inputs = _decode_inputs(batch, 2, 4, 24, 8, positions, dtype, seed=batch)
    cm = run_and_compare(GqaDecode(), inputs, "tiny")
    msg = next(r["message"] for r in cm.program.meta["remarks"] if r["message"].startswith("decode attention ["))
    assert f"{batch * 2} problems of 4 rows in groups of 4" in msg, msg
