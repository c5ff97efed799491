"""max_pool2d with return_indices=True (and unbatched input): values and indices equal eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilecc


class Pool(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.max_pool2d(x, return_indices=True, **self.kw)


def _check(model, x):
    cm = tilecc.compile(model, (x,), target="tiny")
    cm.sanitize = True
    got, want = cm(x), model(x)
    for gv, wv in zip(got, want, strict=True):
        assert gv.dtype == wv.dtype and gv.shape == wv.shape
        torch.testing.assert_close(gv, wv, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    ("shape", "kw"),
    [
        ((2, 3, 8, 8), {"kernel_size": 2}),
        ((1, 4, 9, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
        ((1, 2, 10, 9), {"kernel_size": (3, 2), "stride": (2, 1), "dilation": (2, 1), "ceil_mode": True}),
        ((3, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),  # unbatched
    ],
)
def test_max_pool2d_indices_match_eager(shape, kw):
    torch.manual_seed(0)
    _check(Pool(**kw), torch.randn(*shape))


def test_ties_take_the_first_max_and_infinities():
    x = torch.randint(0, 3, (1, 2, 6, 6)).float()  # many ties
    x[0, 0, 0, :2] = float("-inf")
    x[0, 1, :2, :2] = float("-inf")  # an all -inf window keeps its first position
    _check(Pool(kernel_size=2, padding=1), x)
    _check(Pool(kernel_size=3, stride=1), x.bfloat16())


class PoolUnpoolUse(torch.nn.Module):
    def forward(self, x):
        v, i = F.max_pool2d(x, 2, return_indices=True)
        return v * 2, i + 1


def test_indices_used_in_int_arithmetic():
    torch.manual_seed(1)
    _check(PoolUnpoolUse(), torch.randn(1, 3, 6, 4))


class Unbatched(torch.nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 2)


def test_unbatched_values_only():
    torch.manual_seed(2)
    _check(Unbatched(), torch.randn(3, 6, 8))
