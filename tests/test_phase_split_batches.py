"""Phase images on the matrix engine in batches of units (`phase_split.units_a` /
`units_b`): the selections of several units side by side per phase, so one copy per
phase moves them all; against eager with the sanitisers on (zero fill for a strided
convolution, -inf for a max pool, odd sides, fp32 and bf16)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import run_and_compare
from tilecc.simulator.isa import Opcode, UnaryFn


class StridedConv(torch.nn.Module):
    def __init__(self, c: int = 16):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, 2, 1)

    def forward(self, x):
        return self.conv(x)


class Pool(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, 3, 2, 1)


def _pad_copies(cm) -> list[int]:
    """The column counts of the phase kernels' vector copies."""
    cols = []
    for name, a, n in cm.program.kernels:
        if name.endswith("_pad"):
            s = cm.program.stream[a:a + n]
            cols += list(s[(s["opcode"] == Opcode.VEC_UNARY) & (s["func"] == UnaryFn.COPY)]["cols"])
    return cols


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("module, shape", [(StridedConv(), (1, 16, 40, 38)), (Pool(), (1, 16, 41, 37)),
                                           (StridedConv(), (2, 16, 43, 30))])
def test_phase_split_in_batches_matches_eager(module, shape, dtype):
    torch.manual_seed(0)
    x = (torch.randn(*shape) - 1.0).to(dtype)  # mostly negative: the pool's padding must be -inf
    cm = run_and_compare(module.eval().to(dtype), (x,), "cloud")
    # one row of 4 phases per unit (W * 2 <= 128 positions), 4 units per batch: a copy of
    # 4 units' segments of one phase (4 x Wq columns) instead of one per unit and phase
    H, W = shape[2:]
    wq = (W + 2 - 3) // 2 + 1 + 1
    assert 4 * wq in _pad_copies(cm), (_pad_copies(cm), wq)


def _forwarded(cm) -> bool:
    """Whether plan-sram kept an activation tile on chip between two kernels."""
    return any("activation tiles kept" in r["message"] for r in cm.program.meta["remarks"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_band_of_every_phase_row_stores_once(dtype):
    """A split whose band holds every phase row (a small image) stores each channel tile
    with one DMA: per channel, the phases lie in the buffer as in HBM."""
    torch.manual_seed(0)
    x = torch.randn(1, 16, 13, 14, dtype=dtype)
    cm = run_and_compare(StridedConv().eval().to(dtype), (x,), "cloud")
    ((name, a, n),) = [kn for kn in cm.program.kernels if kn[0].endswith("_pad")]
    s = cm.program.stream[a:a + n]
    stores = s[s["opcode"] == Opcode.DMA_STORE]
    hq, wq = (13 + 2 - 3) // 2 + 2, (14 + 2 - 3) // 2 + 2  # phase rows and columns (3x3 / 2, padding 1)
    # one DMA; none where the convolution after it reads the buffer in place
    # (passes/tile/forward_activations.py: the buffer is the phase images as in HBM)
    if _forwarded(cm):
        assert len(stores) == 0, (name, stores["cols"])
    else:
        assert len(stores) == 1 and stores["cols"][0] == 4 * hq * wq, (name, stores["cols"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_band_strided_conv_loads_every_phase_at_once(dtype):
    """A strided 3x3 convolution over 128 channels (no folded kernel rows) in one band:
    the four phase images of the channel tile load with one DMA into one buffer."""
    torch.manual_seed(0)
    x = torch.randn(1, 128, 29, 27, dtype=dtype)
    cm = run_and_compare(StridedConv(128).eval().to(dtype), (x,), "cloud")
    ((name, a, n),) = [kn for kn in cm.program.kernels if kn[0].endswith("_conv2d")]
    s = cm.program.stream[a:a + n]
    hq, wq = (29 + 2 - 3) // 2 + 2, (27 + 2 - 3) // 2 + 2
    loads = s[s["opcode"] == Opcode.DMA_LOAD]
    # one DMA; none where it reads the phase split's buffer in place (forward_activations)
    assert (loads["cols"] == 4 * hq * wq).sum() == (0 if _forwarded(cm) else 1), (name, loads["cols"])


class PatchEmbed(torch.nn.Module):
    """A ViT's patch embedding: a convolution with stride = kernel (8 x 8 patches)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 32, 8, 8)

    def forward(self, x):
        return self.proj(x)


def test_patch_embedding_fits_the_accumulator_without_a_fallback():
    """A stride-8 patch embedding on `tiny` splits 64 phase images of 4 x 4 whose
    accumulator buffers are 16 bytes each: the buffer sets are counted with plan-sram's
    64-byte alignment, so the -O2 phase-split kernel fits (it overflowed the 4 KiB
    accumulator and fell back to the -O0 kernel when counted unaligned)."""
    torch.manual_seed(0)
    cm = run_and_compare(PatchEmbed().eval(), (torch.randn(1, 3, 32, 32),), target="tiny")
    remarks = [str(r) for r in cm.program.meta.get("remarks", [])]
    assert not cm.program.meta.get("fallbacks"), cm.program.meta.get("fallbacks")
    assert not any("fallback" in r and "missed" in r for r in remarks)
    assert any(name.endswith("_pad") for name, _, _ in cm.program.kernels)
