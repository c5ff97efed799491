"""graph.pad in every mode over any dims, compiled and compared with torch eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run_and_compare
from hypothesis import given, settings
from hypothesis import strategies as st

from tilecc.errors import ShapeError
from tilecc.ir import graph as g
from tilecc.ir.graph_pad import PadOp


class Pad(torch.nn.Module):
    def __init__(self, pad: tuple[int, ...], mode: str, value: float = 0.0):
        super().__init__()
        self.pad, self.mode, self.value = pad, mode, value

    def forward(self, x):
        if self.mode == "constant":
            return F.pad(x, self.pad, value=self.value)
        return F.pad(x, self.pad, mode=self.mode)


CASES = [
    ((2, 3, 5, 6), (1, 2, 2, 1), "reflect"),
    ((2, 3, 5, 6), (1, 2, 2, 1), "replicate"),
    ((2, 3, 5, 6), (1, 2, 2, 1), "circular"),
    ((3, 5, 6), (2, 0, 0, 3), "reflect"),  # unbatched image
    ((2, 4, 7), (3, 1), "reflect"),  # 1-d
    ((2, 4, 7), (3, 1), "replicate"),
    ((2, 4, 7), (3, 4), "circular"),
    ((1, 2, 3, 4, 5), (1, 1, 1, 1, 2, 1), "replicate"),  # 3-d
    ((2, 5, 6, 8), (0, 0, 0, 3, 0, 2), "constant"),  # NHWC window padding
    ((2, 5, 6, 8), (1, 0, -1, 3, 2, 0, 1, 1), "constant"),  # every dim, a crop
    ((1, 3, 4, 4), (-1, 1, -2, 1), "reflect"),  # negative amounts crop
    ((1, 3, 4, 4), (-1, 1, -2, 1), "replicate"),
    ((1, 3, 4, 5), (2, -1, -2, 1), "circular"),  # the wrap is around the cropped range
    ((1, 20, 37, 41), (3, 3, 3, 3), "reflect"),  # more rows than partitions
    ((2, 24, 300), (5, 7), "reflect"),  # an audio conv's reflect pad (EnCodec-style)
    ((2, 24, 300), (6, 6), "circular"),
]


@pytest.mark.parametrize(("shape", "pad", "mode"), CASES, ids=[f"{m}-{s}-{p}" for s, p, m in CASES])
def test_pad_modes_match_eager(shape, pad, mode):
    torch.manual_seed(0)
    run_and_compare(Pad(pad, mode, 0.5), (torch.randn(*shape),))


def test_reference_matches_torch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for mode in ("reflect", "replicate", "circular"):
        for pad in ((2, 1, 3, 0), (-1, 2, 1, -2)):
            want = F.pad(torch.from_numpy(x), pad, mode=mode).numpy()
            low, high = [0, 0, pad[2], pad[0]], [0, 0, pad[3], pad[1]]
            op = PadOp.make(_value(x.shape), low, high, 0.0, mode)
            np.testing.assert_array_equal(op.reference(x), want)


def _value(shape):
    from xdsl.dialects.test import TestOp

    return TestOp.create(result_types=[g.tensor_type(list(shape), g.DType.F32)]).results[0]


@pytest.mark.parametrize(
    ("mode", "low", "high", "match"),
    [("reflect", [0, 4], [0, 0], "at most 3"), ("circular", [0, 5], [0, 0], "at most 4"),
     ("replicate", [0, -2], [0, -2], "keep part"), ("wrap", [0, 1], [0, 0], "not one of")],
)
def test_bad_pad_names_op(mode, low, high, match):
    with pytest.raises(ShapeError, match=f"graph.pad.*{match}"):
        PadOp.make(_value((3, 4)), low, high, 0.0, mode)


class SwinWindows(torch.nn.Module):
    """Swin's window partition: pad H and W of an NHWC map to a multiple of the window,
    split into windows, attend within each window, merge back and crop."""

    def __init__(self, c: int = 8, ws: int = 4):
        super().__init__()
        self.ws = ws
        self.qkv = torch.nn.Linear(c, 3 * c)

    def forward(self, x):
        b, h, w, c = x.shape
        ws = self.ws
        ph, pw = (ws - h % ws) % ws, (ws - w % ws) % ws
        x = F.pad(x, (0, 0, 0, pw, 0, ph))
        hp, wp = h + ph, w + pw
        win = x.view(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        q, k, v = self.qkv(win).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(1, 2) * c**-0.5, dim=-1) @ v
        y = a.view(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
        return y[:, :h, :w, :].contiguous()


def test_swin_window_partition_with_padding():
    torch.manual_seed(0)
    run_and_compare(SwinWindows(), (torch.randn(1, 6, 7, 8),))


@st.composite
def _pads(draw):
    """torch's rules: a constant pad covers up to every dim; a non-constant one pads the
    last 1-3 dims of an input with one or two more dims (a batch / channel dim)."""
    mode = draw(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
    if mode == "constant":
        rank = draw(st.integers(1, 4))
        npad = draw(st.integers(1, rank))
    else:
        npad = draw(st.integers(1, 3))
        rank = npad + draw(st.integers(1, 2))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    pad: list[int] = []
    for d in range(npad):
        size = shape[rank - 1 - d]
        top = {"reflect": size - 1, "circular": size}.get(mode, 3)
        lo, hi = draw(st.integers(-1, max(top, 0))), draw(st.integers(-1, max(top, 0)))
        if size + min(lo, 0) + min(hi, 0) <= 0:
            lo, hi = max(lo, 0), max(hi, 0)
        if mode == "circular":  # at most the size left after a crop (see graph_pad)
            kept = size + min(lo, 0) + min(hi, 0)
            lo, hi = min(lo, kept), min(hi, kept)
        pad += [lo, hi]
    return shape, tuple(pad), mode


@settings(max_examples=12, deadline=None, derandomize=True)
@given(_pads(), st.sampled_from([torch.float32, torch.bfloat16, torch.int64]))
def test_pad_matches_eager_property(case, dtype):
    shape, pad, mode = case
    x = (torch.randn(*shape) * 10).to(dtype)
    if mode == "constant" or dtype != torch.int64:  # torch's non-constant pads take floats only
        run_and_compare(Pad(pad, mode, 3.0), (x,))
