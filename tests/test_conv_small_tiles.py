"""The small-image convolution (`conv_small.emit_conv_small_o2`) with several
contraction tiles: tile t takes the channels p * nk + t, so one DMA loads every tile's
slab; output-channel chunks one after another. Against eager with the sanitisers on."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_and_compare
from tilecc.simulator.isa import Opcode


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cin, cout, s, hw, target, nk", [
    (256, 300, 1, (5, 6), "cloud", 2),   # two tiles of 128; three output-channel chunks
    (48, 20, 2, (6, 5), "tiny", 4),      # four tiles of 12 (an even count), strided
])
def test_interleaved_contraction_tiles_load_once(cin, cout, s, hw, target, nk, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, s, 1), torch.nn.ReLU()).eval().to(dtype)
    cm = run_and_compare(model, (torch.randn(1, cin, *hw, dtype=dtype),), target)
    ((name, a, n),) = [kn for kn in cm.program.kernels if kn[0].endswith("_conv2d")]
    st = cm.program.stream[a:a + n]
    loads = st[st["opcode"] == Opcode.DMA_LOAD]
    # one load of [cin / nk partitions x nk channels' phase images]
    oh, ow = (hw[0] + 2 - 3) // s + 1, (hw[1] + 2 - 3) // s + 1
    nph, hq, wq = s * s, oh + 2 // s, ow + 2 // s
    slab = loads[(loads["rows"] == cin // nk) & (loads["cols"] == nk * nph * hq * wq)]
    assert len(slab) == 1, (name, loads["rows"], loads["cols"], nk * nph * hq * wq)
