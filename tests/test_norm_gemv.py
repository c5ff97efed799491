"""A decode step's RMS norm computed inside the one-row matmul it feeds
(passes/graph_to_tile/norm_gemv.py): one kernel instead of two, the same numerics as
the split norm's kernel, checked against eager; rows > 1 keep the separate kernels."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from tests.helpers import run_and_compare
from tilecc.simulator.isa import Opcode

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))


class _NormLinears(nn.Module):
    """Llama's pre-norm projection, twice (identical layers share one kernel): a norm
    whose result only the linear reads, then a residual add."""

    def __init__(self, d: int, n: int, layers: int = 2):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.norms = nn.ModuleList([LlamaRMSNorm(d, eps=1e-5) for _ in range(layers)])
        self.ups = nn.ModuleList([nn.Linear(d, n, bias=False) for _ in range(layers)])
        self.downs = nn.ModuleList([nn.Linear(n, d, bias=False) for _ in range(layers)])
        for norm in self.norms:
            nn.init.uniform_(norm.weight, 0.5, 1.5)

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            x = x + down(torch.tanh(up(norm(x))))
        return x


def _remarks(cm) -> list[str]:
    return [r["message"] for r in cm.program.meta["remarks"]]


def test_decode_norm_is_computed_in_the_gemv_and_matches_eager():
    torch.manual_seed(0)
    model = _NormLinears(1024, 1536).to(torch.bfloat16)
    x = torch.randn(1, 1, 1024, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    assert any("rms_norm + matmul 1x1024x1536" in m for m in _remarks(cm))
    names = [n for n, _, _ in cm.program.kernels]
    assert not any("rms_norm" in n for n in names)  # no kernel of its own
    # the norm's cross-partition sum is the kernel's one 128-row matmul; the rest are GEMV rows
    s = cm.program.stream
    mm = s[s["opcode"] == Opcode.MATMUL]
    assert int((mm["rows"] == 128).sum()) == 2 and int((mm["rows"] == 1).sum()) == len(mm) - 2


@pytest.mark.parametrize("rows", [2, 3])
def test_several_rows_keep_the_norm_kernel(rows):
    torch.manual_seed(1)
    model = _NormLinears(1024, 1536, layers=1).to(torch.bfloat16)
    x = torch.randn(1, rows, 1024, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    assert not any("rms_norm + matmul" in m for m in _remarks(cm))


@pytest.mark.parametrize("fmt, dt", [("int8", "I8"), ("fp8", "F8E4M3")])
def test_one_byte_weights_decode_norm_gemv_matches_eager(fmt, dt):
    """Weight-only int8 / fp8 e4m3 projections after the decode norm: the norm computed
    in the GEMV, the one-byte weight read by the matrix engine as the stationary operand
    (``rhs``, a 128-column tile) against the one-row bf16 moving operand, its scale
    applied after the contraction; outputs equal to eager.

    The weight stays stationary: with a bf16 row against a one-byte weight the array
    runs at the bf16 rate (`TimingRules.lowp_speedup` needs both operands 8-bit), and the
    moving operand's rows land on the accumulator's partitions (at most 128), so
    streaming the weight instead (a [K, 1] stationary row) also takes
    ``max(L, 128) = L`` per 128 x 128 weight tile: no faster on the matrix engine."""
    from tilecc.quantize import quantize_weights
    from tilecc.simulator.isa import DType

    torch.manual_seed(2)
    model = quantize_weights(_NormLinears(1024, 1536, layers=1).to(torch.bfloat16), fmt).eval()
    x = torch.randn(1, 1, 1024, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    assert any("rms_norm + matmul 1x1024x1536" in m for m in _remarks(cm))
    assert not cm.program.meta.get("fallbacks")
    # the scale (and tanh; the residual add) run on the evacuated rows: one kernel per GEMV
    assert any("1x1024x1536: its epilogue (mul, reshape, tanh)" in m for m in _remarks(cm))
    assert any("1x1536x1024: its epilogue (mul, reshape, add)" in m for m in _remarks(cm))
    assert len(cm.program.kernels) == 2
    s = cm.program.stream
    mm = s[s["opcode"] == Opcode.MATMUL]
    lowp = mm[mm["b_dtype"] == int(DType[dt])]
    # both projections read one-byte weights: 1024 x 1536 and 1536 x 1024, 128 x 128 tiles
    assert len(lowp) == 2 * (1024 // 128) * (1536 // 128)
    assert set(lowp["rows"].tolist()) == {1} and set(lowp["cols"].tolist()) == {128}
    assert set(lowp["a_dtype"].tolist()) == {int(DType.BF16)}


class _GemvEpilogue(nn.Module):
    """A one-row linear and an elementwise tail: one op (`heavy` False) or seven."""

    def __init__(self, k: int, n: int, heavy: bool):
        super().__init__()
        self.lin = nn.Linear(k, n, bias=False)
        self.heavy = heavy

    def forward(self, x):
        y = self.lin(x)
        if not self.heavy:
            return torch.relu(y)
        return torch.tanh(torch.sigmoid(y) * y + y * y) * 0.5 - y


@pytest.mark.parametrize("k, n, heavy", [(1024, 1024, False), (128, 16384, True)])
def test_gemv_epilogue_goes_where_the_cost_model_says(k, n, heavy):
    """A one-row matmul's epilogue runs on the GEMV's evacuated rows, one vector lane
    wide, only where that is estimated no slower than an elementwise kernel of its own
    over the partitions: a relu behind a 1024-deep contraction goes in the GEMV; a
    seven-op tail over 16,384 columns behind a one-k-tile contraction (little matmul
    work to hide it behind) stays a kernel of its own. Both equal eager."""
    torch.manual_seed(3)
    model = _GemvEpilogue(k, n, heavy).to(torch.bfloat16)
    cm = run_and_compare(model, (torch.randn(1, k, dtype=torch.bfloat16),), target="cloud")
    said = [m for m in _remarks(cm) if f"matmul 1x{k}x{n}: epilogue on the GEMV's rows" in m]
    assert len(said) == 1 and said[0].endswith("kept separate" if heavy else "fused"), said
    assert (len(cm.program.kernels) == 1) == (not heavy)
