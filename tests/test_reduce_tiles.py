"""Reductions along the free dimension with a few row tiles of one chunk each (a CNN's
global mean pool): every tile with buffers and DMA queues of its own (`reduce.py`),
against eager with the sanitisers on."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_and_compare
from tilecc.simulator.isa import Opcode


class Reduce(torch.nn.Module):
    def __init__(self, fn: str):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        if self.fn == "mean":
            return x.mean((2, 3))
        if self.fn == "sum":
            return x.sum((2, 3))
        return x.amax((2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn, shape, target", [("mean", (2, 200, 5, 6), "cloud"), ("sum", (1, 512, 7, 7), "cloud"),
                                               ("amax", (1, 40, 3, 5), "tiny")])
def test_few_row_tiles_reduce_side_by_side(fn, shape, dtype, target):
    torch.manual_seed(0)
    cm = run_and_compare(Reduce(fn).eval(), (torch.randn(*shape, dtype=dtype),), target)
    ((name, a, n),) = [kn for kn in cm.program.kernels if "reduce" in kn[0]]
    s = cm.program.stream[a:a + n]
    loads = s[s["opcode"] == Opcode.DMA_LOAD]
    assert len(loads) >= 2 and len(set(loads["queue"].tolist())) >= 2, name  # the tiles' loads side by side
