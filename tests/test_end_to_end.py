"""Whole models compiled, run on the simulator and compared with torch eager."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import run_and_compare
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
import mlp as mlp_example  # noqa: E402
import transformer_block as block_example  # noqa: E402

# each example compiles a model (seconds): generate, but do not spend minutes shrinking
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mlp_odd_sizes(dtype):
    model = mlp_example.MLP(53, 29, 31).to(dtype)
    x = torch.randn(37, 53, dtype=dtype)
    cm = run_and_compare(model, (x,))
    r = cm.report
    assert r.cycles >= r.roofline_cycles > 0
    assert r.instructions_by_engine["matrix"] > 0
    # matrix-engine MACs executed: the model's, plus -O2's on-chip transposes of the
    # activation operand (one [k x m] x [m x m] identity matmul per A tile) and the bias
    # rows added on the matrix engine (a K = 1 matmul of a ones row: m x n MACs per layer)
    assert r.macs >= 37 * 53 * 29 + 37 * 29 * 31
    assert r.macs <= 1.5 * (37 * 53 * 29 + 37 * 29 * 31) + 37 * (29 + 31)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", ["tiny", "edge"])
def test_transformer_block(dtype, target):
    model = block_example.Block().to(dtype)
    x = torch.randn(2, 19, 48, dtype=dtype)
    cm = run_and_compare(model, (x,), target)
    assert cm.report.roofline_ratio >= 1.0


def test_transformer_block_fp16():
    """fp16 storage and matmul inputs (fp32 accumulation, like bf16)."""
    model = block_example.Block().to(torch.float16)
    run_and_compare(model, (torch.randn(2, 19, 48, dtype=torch.float16),))


def test_mlp_on_cloud_preset():
    model = mlp_example.MLP(200, 300, 130)
    run_and_compare(model, (torch.randn(150, 200),), "cloud")


class _Ops(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n))
        self.ln = torch.nn.LayerNorm(n)

    def forward(self, x, y):
        a = torch.relu(x) * self.w - y / 3.0
        b = torch.exp(-a * a) + torch.tanh(x) * torch.sigmoid(y)
        c = torch.softmax(b, dim=-1) + self.ln(a)
        return c.transpose(0, 1).reshape(-1, 2), torch.nn.functional.gelu(c, approximate="tanh")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@given(st.integers(1, 40), st.integers(1, 70), st.sampled_from([torch.float32, torch.bfloat16]))
def test_elementwise_and_rowwise_ops(rows, cols, dtype):
    cols = cols * 2  # the reshape to (-1, 2) needs an even element count
    model = _Ops(cols).to(dtype)
    x = torch.randn(rows, cols, dtype=dtype)
    y = torch.randn(1, cols, dtype=dtype)  # broadcast over rows
    run_and_compare(model, (x, y))


class _Bmm(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@given(st.integers(1, 3), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_batched_matmul_shapes(batch, m, k, n):
    a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    run_and_compare(_Bmm(), (a, b))


def test_broadcast_matmul():
    run_and_compare(_Bmm(), (torch.randn(2, 3, 17, 20), torch.randn(20, 9)))
