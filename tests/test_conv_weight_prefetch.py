"""Convolution weights stream ahead of the compute (`passes/graph_to_tile/nn/queues.py`,
`plan-sram`'s ring placement): the weights and constants of a convolution kernel load on
DMA queues of their own, so they do not queue behind its activation loads (which wait
for the kernel before it), and consecutive kernels' buffers are apart, so the next
kernels' weights load while the current one computes. Outputs against eager."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers import random_batch_norm as _bn
from tests.helpers import run_and_compare
from tilecc.passes.graph_to_tile.nn.queues import queue_split, weight_pieces
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import Opcode
from tilecc.simulator.machine import simulate


class _Layer3(torch.nn.Module):
    """Four 3x3 convolutions of 256 channels at 14 x 14 (ResNet-18's layer3 shape: ~1.2 MB
    of weights each, far more than its activations), batch norm, ReLU, a residual."""

    def __init__(self, c: int = 256, n: int = 4) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 3, 1, 1, bias=False) for _ in range(n))
        self.bns = torch.nn.ModuleList(_bn(c) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            y = bn(conv(y))
            y = torch.relu(y + x) if i % 2 else torch.relu(y)
            x = y if i % 2 else x
        return y


def _weight_loads(prog, k: int) -> np.ndarray:
    """The kernel's DMA loads from the convolution weights (HBM ranges of the program's weights)."""
    _, start, count = prog.kernels[k]
    idx = np.arange(start, start + count)
    s = prog.stream
    loads = idx[s["opcode"][idx] == Opcode.DMA_LOAD]
    big = [w for w in prog.weights if w.nbytes >= 256 * 256 * 9 * 2]
    return np.array([i for i in loads if any(w.offset <= int(s["a_addr"][i]) < w.offset + w.nbytes for w in big)])


def test_conv_weights_load_while_the_kernel_before_computes():
    torch.manual_seed(0)
    model = _Layer3().eval().to(torch.bfloat16)
    x = torch.randn(1, 256, 14, 14, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), "cloud")  # eager numerics, sanitisers on
    prog, cfg = cm.program, cm.program.config
    convs = [k for k, (name, _, _) in enumerate(prog.kernels) if name.endswith("conv2d")]
    assert len(convs) == 4
    res = simulate(prog.stream, cfg, prog.hbm_image(), functional=False)
    weight_queues = set(queue_split(cfg)[0])
    for prev, k in zip(convs, convs[1:]):
        w = _weight_loads(prog, k)
        # few large DMAs (each pays ~3,100 cycles of fixed latency): a contraction tile's
        # nine taps in as many pieces as there are weight queues
        assert (prog.stream["cols"][w] >= 9 // len(weight_pieces(cfg, 1, 9)) * 256).all()
        assert set(prog.stream["queue"][w].tolist()) <= weight_queues
        _, s0, c0 = prog.kernels[prev]
        # the old order (weights behind the first band's activation loads on shared
        # queues) started them only once the kernel before had stored its output
        assert res.start[w].min() < res.end[s0: s0 + c0].max()
    # the ring placement: the last convolution's weights load two kernels ahead, before
    # the second one ends (with every other kernel mirrored they shared its bytes)
    _, s1, c1 = prog.kernels[convs[1]]
    assert res.start[_weight_loads(prog, convs[3])].min() < res.end[s1: s1 + c1].max()


def test_queue_split_keeps_weights_off_the_store_queue():
    cfg = load_config("cloud")
    weights, acts = queue_split(cfg)
    assert weights == [0, 1] and acts == [2, 3]
    assert queue_split(cfg, light_weights=True) == ([0], [1, 2, 3])
    tiny = load_config("tiny")
    w, a = queue_split(tiny)
    assert tiny.dma.queues - 1 not in w and set(w) | set(a) == set(range(tiny.dma.queues))
