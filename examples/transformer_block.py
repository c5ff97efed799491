"""A pre-norm transformer block: layer norm, self-attention with softmax, MLP, residuals.

    tilecc run examples/transformer_block.py:block --target tiny
    tilecc run examples/transformer_block.py:block_bf16 --json
"""

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.reshape(b, s, self.heads, self.dh).permute(0, 2, 1, 3)
        k = k.reshape(b, s, self.heads, self.dh).permute(0, 2, 3, 1)
        v = v.reshape(b, s, self.heads, self.dh).permute(0, 2, 1, 3)
        scores = torch.matmul(q, k) * (1.0 / math.sqrt(self.dh))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, d)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, d: int = 48, heads: int = 4, hidden: int = 96):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def block():
    torch.manual_seed(0)
    return Block(), (torch.randn(2, 19, 48),)


def block_bf16():
    torch.manual_seed(0)
    return Block().to(torch.bfloat16), (torch.randn(2, 19, 48, dtype=torch.bfloat16),)
