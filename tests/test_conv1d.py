"""1-d, unbatched and transposed convolutions (rewritten onto graph.conv2d), against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import run_and_compare


class WhisperFrontEnd(torch.nn.Module):
    """Whisper's audio encoder stem: conv1d(k3, p1) + GELU, conv1d(k3, s2, p1) + GELU."""

    def __init__(self, mels: int = 8, width: int = 16):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(mels, width, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(width, width, 3, stride=2, padding=1)

    def forward(self, x):
        return F.gelu(self.conv2(F.gelu(self.conv1(x))))


def test_whisper_conv1d_front_end():
    torch.manual_seed(0)
    run_and_compare(WhisperFrontEnd(), (torch.randn(1, 8, 24),))


class Conv1d(torch.nn.Module):
    def __init__(self, cin, cout, k, **kw):
        super().__init__()
        self.conv = torch.nn.Conv1d(cin, cout, k, **kw)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize(
    ("shape", "cout", "k", "kw"),
    [
        ((2, 4, 20), 6, 5, {"stride": 3, "padding": 2, "dilation": 2}),
        ((1, 8, 17), 8, 3, {"groups": 4, "padding": 1}),  # wav2vec-style grouped
        ((4, 12), 6, 3, {"bias": False}),  # unbatched
    ],
)
def test_conv1d_variants(shape, cout, k, kw):
    torch.manual_seed(1)
    run_and_compare(Conv1d(shape[-2], cout, k, **kw), (torch.randn(*shape),))


class RuntimeWeightConv1d(torch.nn.Module):
    def forward(self, x, w):
        return F.conv1d(x, w, stride=2)


def test_conv1d_runtime_weight():
    torch.manual_seed(2)
    run_and_compare(RuntimeWeightConv1d(), (torch.randn(1, 3, 11), torch.randn(5, 3, 3)))


class ConvT(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize(
    ("conv", "shape"),
    [
        (torch.nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1), (1, 4, 7)),
        (torch.nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, groups=2), (1, 4, 5, 6)),
        (torch.nn.ConvTranspose2d(3, 5, 2, stride=1, dilation=2), (2, 3, 4, 4)),
    ],
)
def test_conv_transpose(conv, shape):
    torch.manual_seed(3)
    run_and_compare(ConvT(conv), (torch.randn(*shape),))


class RuntimeWeightConvT(torch.nn.Module):
    def __init__(self, nd: int, **kw):
        super().__init__()
        self.f, self.kw = (F.conv_transpose1d if nd == 1 else F.conv_transpose2d), kw

    def forward(self, x, w):
        return self.f(x, w, **self.kw)


@pytest.mark.parametrize(
    ("nd", "x", "w", "kw"),
    [
        (1, (1, 4, 6), (4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
        (2, (1, 4, 4, 5), (4, 2, 3, 2), {"stride": (2, 1), "groups": 2, "dilation": (1, 2)}),
    ],
)
def test_conv_transpose_runtime_weight(nd, x, w, kw):
    torch.manual_seed(4)
    run_and_compare(RuntimeWeightConvT(nd, **kw), (torch.randn(*x), torch.randn(*w)))
