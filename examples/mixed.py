"""Models with an op the NPU does not run (`torch.sin`): torch.compile(backend="tilecc")
runs it on the fallback device and `tilecc explain` says where it came from.

    tilecc explain examples/mixed.py:mixed --target cloud
    tilecc explain examples/mixed.py:island          # a small NPU island joins the fallback
"""

import torch
from torch import nn


class Mixed(nn.Module):
    """Linear - sin - Linear - GELU: two NPU partitions around a fallback op."""

    def __init__(self, d: int = 64, h: int = 128):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y = torch.sin(y)  # no NPU lowering: runs on the fallback
        return torch.nn.functional.gelu(self.fc2(y))


class Island(nn.Module):
    """sin - (* 2 + 1) - cos: the NPU could run the middle, but moving its input and
    output costs more than it saves, so it joins the fallback."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sin(x)
        y = y * 2.0 + 1.0
        return torch.cos(y)


def mixed():
    torch.manual_seed(0)
    return Mixed(), (torch.randn(32, 64),)


def island():
    torch.manual_seed(0)
    return Island(), (torch.randn(16, 32),)
