"""Softmax / log-softmax over any dim, and the float64 policy, against eager."""

from __future__ import annotations

import pytest
import torch
from helpers import run_and_compare

import tilecc
from tilecc.runtime.compare import tolerance


class Softmax(torch.nn.Module):
    def __init__(self, dim: int, log: bool = False, dtype: torch.dtype | None = None):
        super().__init__()
        self.dim, self.log, self.dtype = dim, log, dtype

    def forward(self, x):
        f = torch.log_softmax if self.log else torch.softmax
        return f(x, self.dim, dtype=self.dtype)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize(("shape", "dim"), [((3, 7, 5), 1), ((4, 6), 0), ((2, 3, 4, 5), -3), ((), 0)])
def test_softmax_over_any_dim(shape, dim, log):
    torch.manual_seed(0)
    run_and_compare(Softmax(dim, log), (torch.randn(shape) * 3,))


def _close_fp32(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == torch.float64 and got.shape == want.shape
    rtol, atol = tolerance(torch.float32, float(want.abs().max()))
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def test_softmax_float64_dtype_computes_in_fp32_with_remark_and_flag():
    torch.manual_seed(1)
    x = torch.randn(3, 5, 4)
    m = Softmax(1, dtype=torch.float64)
    cm = tilecc.compile(m, (x,), target="tiny")
    cm.sanitize = True
    _close_fp32(cm(x), m(x))
    assert cm.program.meta.get("float64_demoted") is True
    msgs = [r["message"] for r in cm.program.meta["remarks"]]
    assert any(msg.startswith("float64 computed in fp32: aten._softmax") for msg in msgs), msgs
    assert "float64" in str(cm.report)


class Scale64(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.linspace(-1, 1, 6, dtype=torch.float64))

    def forward(self, x):
        return x * self.w + 0.5


def test_float64_inputs_and_buffers():
    x = torch.randn(4, 6, dtype=torch.float64)
    m = Scale64()
    cm = tilecc.compile(m, (x,), target="tiny")
    cm.sanitize = True
    _close_fp32(cm(x), m(x))
    msgs = [r["message"] for r in cm.program.meta["remarks"]]
    assert "float64 computed in fp32: input 'x'" in msgs, msgs


def test_fp32_program_has_no_float64_flag():
    cm = run_and_compare(Softmax(-1), (torch.randn(2, 8),))
    assert "float64_demoted" not in cm.program.meta
