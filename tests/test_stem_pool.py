"""The stem convolution and its 3x3 / 2 max pool in one kernel (passes/graph_to_tile/nn/
conv_stem_pool.py): outputs against eager, the kernels it leaves (the input's phase
images and the fused kernel; no max-pool kernel, no phase images of the convolution's
output), and the fallback with its remark where the pair cannot fuse."""

from __future__ import annotations

import pytest
import torch
from helpers import random_batch_norm as _bn
from helpers import run_and_compare

from tilecc.simulator.isa import Opcode


class _Stem(torch.nn.Module):
    """conv -> tail -> max_pool2d(3, 2, 1); tail: "bn_relu", "relu", "sigmoid",
    "shift_relu" (a per-channel add, a column step), "neg" (not monotone)."""

    def __init__(self, cin, cout, k, s, p, tail, bias=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, k, s, p, bias=bias)
        self.bn = _bn(cout) if tail == "bn_relu" else None
        self.shift = torch.nn.Parameter(torch.randn(1, cout, 1, 1)) if tail == "shift_relu" else None
        self.tail = tail

    def forward(self, x):
        y = self.conv(x)
        if self.bn is not None:
            y = torch.relu(self.bn(y))
        elif self.tail == "sigmoid":
            y = torch.sigmoid(y)
        elif self.tail == "neg":
            y = -y
        elif self.shift is not None:
            y = torch.relu(y + self.shift)
        else:
            y = torch.relu(y)
        return torch.nn.functional.max_pool2d(y, 3, 2, 1)


def _remarks(cm) -> list[tuple[str, str]]:
    return [(r["kind"], r["message"]) for r in cm.program.meta["remarks"]
            if r["pass_name"] == "lower-graph-to-tile" and "max pool" in r["message"]]


def _kinds(cm) -> list[str]:
    return [name.split("_", 1)[1] for name, _, _ in cm.program.kernels]


@pytest.mark.parametrize("cin, cout, k, s, p, shape, target, tail, bias", [
    (3, 64, 7, 2, 3, (1, 64, 64), "cloud", "bn_relu", False),  # the ResNet stem, smaller image
    (3, 16, 7, 2, 3, (2, 32, 28), "cloud", "bn_relu", False),  # batch 2, not square
    (3, 16, 7, 2, 3, (1, 64, 48), "cloud", "bn_relu", False),  # 16 channels: 8 bands side by side
    (3, 24, 3, 1, 1, (1, 18, 20), "edge", "relu", True),       # stride 1: phase images of stride 2
    (4, 8, 5, 2, 2, (1, 24, 24), "cloud", "sigmoid", False),   # a monotone step, no bias
    (3, 16, 3, 2, 1, (1, 20, 20), "cloud", "shift_relu", False),  # a per-channel operand: one band per op
    (3, 16, 7, 2, 3, (1, 30, 26), "cloud", "bn_relu", False),  # odd sides (15 x 13): padding below, right
    (3, 24, 3, 1, 1, (1, 17, 20), "edge", "relu", True),       # one odd side
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stem_and_max_pool_run_as_one_kernel(cin, cout, k, s, p, shape, target, tail, bias, dtype):
    torch.manual_seed(0)
    m = _Stem(cin, cout, k, s, p, tail, bias).eval().to(dtype)
    n, h, w = shape
    cm = run_and_compare(m, (torch.randn(n, cin, h, w, dtype=dtype),), target)
    assert _kinds(cm) == ["conv2d_pad", "conv2d_max_pool2d"]
    ((kind, msg),) = _remarks(cm)
    assert kind == "passed" and "fused into the stem" in msg
    # the pool is whole-band vector ops: six max ops per band group, no per-row or per-tap ops
    name, a, c = cm.program.kernels[1]
    st = cm.program.stream[a:a + c]
    vec = st[(st["opcode"] == Opcode.VEC_BINARY) | (st["opcode"] == Opcode.VEC_UNARY)]
    assert len(vec) <= 12 * (h // (2 * s)) + 16, (name, len(vec))


@pytest.mark.parametrize("tail, why", [("neg", "does not commute with the max")])
def test_a_stem_whose_tail_does_not_commute_with_the_max_keeps_its_pool_kernel(tail, why):
    torch.manual_seed(0)
    cm = run_and_compare(_Stem(3, 16, 7, 2, 3, tail).eval(), (torch.randn(1, 3, 32, 32) - 1.0,), "cloud")
    assert "max_pool2d" in _kinds(cm) and "conv2d_max_pool2d" not in _kinds(cm)
    ((kind, msg),) = _remarks(cm)
    assert kind == "missed" and why in msg


class _StemPool2(_Stem):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2, 2)


def test_another_max_pool_keeps_its_kernel():
    torch.manual_seed(0)
    cm = run_and_compare(_StemPool2(3, 16, 7, 2, 3, "relu").eval(), (torch.randn(1, 3, 32, 32),), "cloud")
    assert "max_pool2d" in _kinds(cm)
    ((kind, msg),) = _remarks(cm)
    assert kind == "missed" and "not 3x3" in msg
