"""The decode-attention kernel over long caches (passes/graph_to_tile/attention/decode_*.py):
where the whole cache does not fit one block (more view rows than partitions, or the
scores over the accumulator) the kernel reads it in blocks with the online softmax (a
running max, sum and output, rescaled per block) instead of falling back to the flash
kernel; against torch eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import run_and_compare
from tests.test_decode_attention import GqaDecode, _decode_inputs, _names
from tilecc.passes.graph_to_tile.attention.decode_cost import choose
from tilecc.passes.graph_to_tile.attention.decode_plan import candidates, decode_problem
from tilecc.simulator.config import load_config


class _Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def _online_remark(cm) -> str:
    msgs = [r["message"] for r in cm.program.meta["remarks"] if r["message"].startswith("decode attention [")]
    assert msgs, [r["message"] for r in cm.program.meta["remarks"]]
    return msgs[0]


@pytest.mark.parametrize("S", [1500, 3000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_cache_grouped_decode_matches_eager(S, dtype):
    """Grouped-query decode (2 KV heads of 2 query heads) over 1,500 / 3,000 cached
    positions, one sequence at the last position and one at a third (later blocks
    wholly masked): one decode kernel with the cache in blocks, equal to eager."""
    inputs = _decode_inputs(2, 2, 2, S, 16, [S - 1, S // 3], dtype, seed=1)
    cm = run_and_compare(GqaDecode(), inputs, "cloud")
    assert _names(cm) == ["k0_decode_attention"], _names(cm)
    msg = _online_remark(cm)
    assert "online softmax" in msg and "blocks of" in msg, msg
    # each block's mask windows: one DMA transpose per mask row where the mask is bf16
    assert ("mask rows by DMA transposes" in msg) == (dtype == torch.bfloat16), msg


def test_peak_in_a_late_block():
    """The largest score of each row sits in the last block, far above the others (the
    running max grows late: the earlier blocks' sums and outputs are rescaled by ~0)."""
    S = 1500
    q, k, v, mask = _decode_inputs(2, 2, 2, S, 16, [S - 1, S - 1], torch.float32, seed=2)
    k[:, :, S - 3, :] = 4.0 * q.reshape(2, 2, 2, 16)[:, :, 0, :]
    cm = run_and_compare(GqaDecode(), (q, k, v, mask), "cloud")
    assert _names(cm) == ["k0_decode_attention"], _names(cm)
    assert "online softmax" in _online_remark(cm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_on_tiny_without_mask(dtype):
    """One query row per head, no mask, 200 positions on `tiny` (16 partitions: blocks
    of at most 16 view rows)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 3, 1, 8, generator=g).to(dtype)
    k = torch.randn(1, 3, 200, 8, generator=g).to(dtype)
    v = torch.randn(1, 3, 200, 8, generator=g).to(dtype)
    cm = run_and_compare(_Sdpa(), (q, k, v), "tiny")
    assert _names(cm) == ["k0_decode_attention"], _names(cm)
    assert "online softmax" in _online_remark(cm)


def test_plan_long_cache_is_online_short_cache_is_not():
    """The Llama-3.2-1B decode problem: with 130 cached positions the whole cache is one
    block (the exact softmax); with 4,098 (a 4,096-token prompt) every candidate reads
    it in blocks of at most the partitions' view rows, and one is chosen."""
    cfg = load_config("cloud")

    def problem(S: int):
        p, why = decode_problem([8, 8, 4, 64], [8, 8, S, 64], [8, 8, S, 64], [8, 8, 4, 64], [8, 1, 1, S], False, 2,
                                False, 128)
        assert p is not None, why
        return p

    short = choose(problem(130), cfg)
    assert short is not None and not short[0].online
    long = problem(4098)
    cands = candidates(long, cfg)
    assert cands and all(s.online and 0 < s.rc <= 128 for s in cands)
    best = choose(long, cfg)
    assert best is not None
    s = best[0]
    assert sum(rows for _, rows in s.chunks(long)) * s.f == 4098


def test_one_k_transpose_accumulator(monkeypatch):
    """Ten positions per view row in blocks of 128 rows (1,280 score columns per block):
    two K-transpose accumulators beside the two score blocks do not fit the accumulator,
    so the schedule keeps one (`DecodeSchedule.kt_acc`, each problem's transposes
    waiting for the previous one's copy). Forced here (the cost model prefers 5 positions
    per row for this shape): equal to eager, the mask by DMA transposes."""
    import tilecc.passes.graph_to_tile.attention.decode_entry as entry

    rank = entry.rank
    monkeypatch.setattr(entry, "rank", lambda p, cfg: [x for x in rank(p, cfg) if x[0].kt_acc == 1])
    inputs = _decode_inputs(1, 8, 4, 2050, 64, [1500], torch.bfloat16, seed=4)
    cm = run_and_compare(GqaDecode(), inputs, "cloud")
    msg = _online_remark(cm)
    assert "10 positions per row" in msg and "blocks of 1280 positions" in msg, msg
    assert "mask rows by DMA transposes" in msg, msg
