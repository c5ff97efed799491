"""A two-layer MLP (Linear - GELU - Linear), the smallest real model.

    tilecc run examples/mlp.py:mlp --target tiny
    tilecc run examples/mlp.py:mlp_odd --json          # sizes that are no tile multiple
    tilecc run examples/mlp.py:mlp_bf16 --target edge
"""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def mlp():
    torch.manual_seed(0)
    return MLP(64, 128, 32), (torch.randn(32, 64),)


def mlp_odd():
    """37 x 53 x 29: no dimension is a multiple of any tile size."""
    torch.manual_seed(0)
    return MLP(53, 29, 31), (torch.randn(37, 53),)


def mlp_bf16():
    torch.manual_seed(0)
    model = MLP(53, 29, 31).to(torch.bfloat16)
    return model, (torch.randn(37, 53, dtype=torch.bfloat16),)
