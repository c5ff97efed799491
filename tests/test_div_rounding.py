"""div with rounding_mode trunc / floor, and floor / trunc / ceil / round, against eager."""

from __future__ import annotations

import pytest
import torch
from helpers import run_and_compare
from hypothesis import given, settings
from hypothesis import strategies as st

import tilecc


class Div(torch.nn.Module):
    def __init__(self, mode: str | None, scalar: float | None = None):
        super().__init__()
        self.mode, self.scalar = mode, scalar

    def forward(self, a, b):
        return torch.div(a, self.scalar if self.scalar is not None else b, rounding_mode=self.mode)


def _operands(dtype: torch.dtype):
    torch.manual_seed(0)
    if dtype.is_floating_point:
        a = torch.randn(6, 9) * 20
        b = torch.randn(6, 9)
        a[0, :6] = torch.tensor([3e9, -7e8, 1e-3, 2.5, 1.0, -1.0])  # huge, tiny, halves, 1 / 0.1f
        b[0, :6] = torch.tensor([0.3, 0.7, 3.0, 0.5, 0.1, 0.1])
        return a.to(dtype), b.to(dtype)
    a = torch.randint(-1000, 1000, (6, 9), dtype=dtype)
    b = torch.randint(1, 30, (6, 9), dtype=dtype) * torch.where(torch.rand(6, 9) < 0.5, -1, 1).to(dtype)
    return a, b


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_div_rounding_modes(mode, dtype):
    run_and_compare(Div(mode), _operands(dtype))


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_div_rounding_of_infinities_and_nan(mode):
    """inf / 3 floors to NaN in torch (its fmod is NaN) and truncates to inf."""
    a = torch.tensor([[float("inf"), -float("inf"), 5.0, float("nan"), 1.0, 4.0]])
    b = torch.tensor([[3.0, -2.0, float("inf"), 1.0, 0.0, -0.0]])
    m = Div(mode)
    cm = tilecc.compile(m, (a, b), target="tiny")
    cm.sanitize = True
    torch.testing.assert_close(cm(a, b), m(a, b), equal_nan=True, rtol=0, atol=0)


def test_div_rounding_by_scalar():
    a, b = _operands(torch.float32)
    run_and_compare(Div("floor", -0.7), (a, b))


class Round(torch.nn.Module):
    def forward(self, x):
        return torch.floor(x) + 2 * torch.trunc(x) + 4 * torch.ceil(x)


def test_floor_trunc_ceil():
    x = torch.randn(5, 7) * 10
    x[0, :3] = torch.tensor([-0.5, 1e10, -3.0])
    run_and_compare(Round(), (x,))


class RoundHalfEven(torch.nn.Module):
    def forward(self, x):
        return torch.round(x)


def test_round_half_to_even_exactly():
    """torch.round: ties to even (0.5 -> 0, 1.5 -> 2, -2.5 -> -2), values at and past 2**23
    (already integers, or not representable as x.5), NaN and infinities pass through."""
    x = torch.randn(6, 11) * 300
    x[0] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 8388607.5, 8388608.0, 1.5e9, -4194303.5, 0.49999997])
    x[1, :3] = torch.tensor([float("inf"), -float("inf"), float("nan")])
    m = RoundHalfEven()
    cm = tilecc.compile(m, (x,), target="tiny")
    cm.sanitize = True
    torch.testing.assert_close(cm(x), m(x), equal_nan=True, rtol=0, atol=0)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    st.sampled_from(["trunc", "floor"]),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.1, 0.3, 1.0, 7.0, 1e-3, 1e4]),
)
def test_div_rounding_exact_on_near_integer_quotients(mode, seed, scale):
    """Quotients just below / above integers (b = a / k nudged by an ulp) are where a
    floor of the rounded quotient differs from torch's floor of the exact one."""
    g = torch.Generator().manual_seed(seed)
    b = (torch.rand(8, 16, generator=g) + 0.05) * scale * torch.where(torch.rand(8, 16, generator=g) < 0.5, -1, 1)
    k = torch.randint(-300, 300, (8, 16), generator=g).float()
    a = k * b
    a = torch.where(torch.rand(8, 16, generator=g) < 0.5, torch.nextafter(a, a + 1), torch.nextafter(a, a - 1))
    m = Div(mode)
    cm = tilecc.compile(m, (a, b), target="tiny")
    torch.testing.assert_close(cm(a, b), m(a, b), rtol=0, atol=0)
