"""Fallbacks (passes/fallback.py, runtime/compiler.compile_graph): an -O2 lowering that
fails on a valid program gives way to a general kernel with a remark; only a failure
of the general kernel reaches the user, as a TileccError naming the op and its place."""

from __future__ import annotations

import pytest
import torch
from helpers import run_and_compare

import tilecc
from tilecc.errors import InternalError, TileccError
from tilecc.passes.graph_to_tile import matmul as blocked


class BroadcastPrologue(torch.nn.Module):
    """A layer norm over `x + pos` (pos broadcast over the batch) feeding a linear: the
    matmul group's layer-norm prologue cannot walk a broadcast operand across the
    reshape (ALBERT's embedding projection has this shape)."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Parameter(torch.randn(1, 64, 128))
        self.ln = torch.nn.LayerNorm(128)
        self.fc = torch.nn.Linear(128, 256)

    def forward(self, x):
        return self.fc(self.ln(x + self.pos))


def _fallback_remarks(cm) -> list[str]:
    return [r["message"] for r in cm.program.meta["remarks"] if r["pass_name"] == "fallback"]


def test_a_fused_group_that_cannot_lower_is_left_unfused():
    torch.manual_seed(0)
    cm = run_and_compare(BroadcastPrologue(), (torch.randn(2, 64, 128),), target="cloud")
    (fb,) = cm.program.meta["fallbacks"]
    assert fb["fallback"] == "left unfused" and "graph.layer_norm" in fb["op"]
    assert "a broadcast operand across a reshape" in fb["reason"]
    assert fb["loc"].endswith(tuple(f"test_fallback.py:{n}" for n in range(200))) and "(Linear)" in fb["loc"]
    (msg,) = _fallback_remarks(cm)
    assert "left unfused" in msg and "broadcast operand" in msg


class TwoLinears(torch.nn.Module):
    """Two bias-free linears: plain matmuls (no fusion group), the -O2 blocked kernel."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(48, 40, bias=False)
        self.b = torch.nn.Linear(40, 24, bias=False)

    def forward(self, x):
        return self.b(self.a(x))


def _broken_blocked(calls: list[str]):
    real = blocked.lower_matmul_blocked

    def broken(lw, op, loc):
        calls.append(loc)
        raise IndexError("planted bug in the blocked matmul")

    return real, broken


def test_a_failing_optimised_kernel_falls_back_to_the_baseline(monkeypatch):
    calls: list[str] = []
    _, broken = _broken_blocked(calls)
    monkeypatch.setattr(blocked, "lower_matmul_blocked", broken)
    torch.manual_seed(0)
    cm = run_and_compare(TwoLinears(), (torch.randn(20, 48),))
    fbs = cm.program.meta["fallbacks"]
    assert [f["fallback"] for f in fbs] == ["lowered by its -O0 kernel"] * 2
    assert all(f["op"] == "graph.matmul" and "IndexError: planted bug" in f["reason"] for f in fbs)
    assert len(calls) == 2  # the first matmul fails; then (it at -O0) the second; then neither runs


def test_a_failing_baseline_is_a_tilecc_error_naming_the_op(monkeypatch):
    def broken(lw, op, loc):
        raise KeyError("planted bug in every matmul kernel")

    monkeypatch.setattr(blocked, "lower_matmul_blocked", broken)
    monkeypatch.setitem(_registry_lowerings(), _matmul_class(), broken)  # the -O0 kernel too
    with pytest.raises(TileccError) as info:
        tilecc.compile(TwoLinears(), (torch.randn(20, 48),), target="tiny", cache=False)
    assert isinstance(info.value, InternalError)
    text = str(info.value)
    assert "graph.matmul" in text and "test_fallback.py:" in text and "KeyError" in text


def test_a_failure_after_lowering_compiles_the_program_at_O0(monkeypatch):
    from tilecc.passes import registry

    real = registry.plan_sram
    seen = {"n": 0}

    def flaky(module, cfg, **kw):
        seen["n"] += 1
        if seen["n"] == 1:
            raise ZeroDivisionError("planted bug in plan-sram")
        return real(module, cfg, **kw)

    monkeypatch.setattr(registry, "plan_sram", flaky)
    torch.manual_seed(0)
    cm = run_and_compare(TwoLinears(), (torch.randn(20, 48),))
    (fb,) = cm.program.meta["fallbacks"]
    assert fb["fallback"] == "compiled at -O0" and fb["reason"].startswith("plan-sram: internal error ZeroDivisionError")


def _registry_lowerings():
    from tilecc.passes.graph_to_tile.registry import lowerings

    return lowerings()


def _matmul_class():
    from tilecc.ir import graph as g

    return g.MatmulOp


class PositionIds(torch.nn.Module):
    """RoBERTa's position ids: a cumsum (a matmul with a triangular constant) of a mask,
    times the mask. The mask's elementwise group feeds the matmul's operand: it must not
    merge into the matmul's epilogue group (it did, for batch > 1, and the fused kernel
    failed on a value used before it was lowered)."""

    def forward(self, ids):
        mask = ids.ne(1).int()
        return (torch.cumsum(mask, dim=1).type_as(mask) + 2) * mask + 1


def test_a_producer_of_a_matmul_operand_is_not_fused_into_its_epilogue():
    ids = torch.randint(0, 6, (2, 16), generator=torch.Generator().manual_seed(0))
    cm = run_and_compare(PositionIds(), (ids,))
    assert "fallbacks" not in cm.program.meta


def test_an_o2_kernel_that_overflows_sram_falls_back_for_its_op_alone(monkeypatch):
    """ViT's patch embedding (a stride-8 8x8 convolution of 192 channels) on `tiny`, with
    a planted planner gap: the -O2 phase-split kernel counts its buffers unaligned (as it
    did until 2026-12-07), so its 16-byte accumulator buffers, 64 bytes each once
    plan-sram aligns them, overflow the accumulator in plan-sram. Only that convolution
    goes to its -O0 kernel; the rest of the program stays -O2."""
    from tilecc.passes.graph_to_tile.nn import phase_split

    monkeypatch.setattr(phase_split, "partition_bytes", lambda cols, isz: cols * isz)

    class PatchEmbed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Conv2d(3, 192, 8, stride=8)
            self.fc = torch.nn.Linear(192, 64)

        def forward(self, x):
            return self.fc(self.proj(x).flatten(2).transpose(1, 2))

    torch.manual_seed(0)
    cm = run_and_compare(PatchEmbed(), (torch.randn(1, 3, 32, 32),))
    (fb,) = cm.program.meta["fallbacks"]
    assert fb["op"] == "graph.conv2d" and fb["fallback"] == "lowered by its -O0 kernel"
    assert fb["reason"].startswith("plan-sram: kernel ") and "proj (Conv2d)" in fb["loc"]
