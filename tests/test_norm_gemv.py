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
    # per layer the norm's cross-partition sum (one matmul) and the GEMVs' 2 x 96 weight
    # tiles, each streamed past the row's k-tile (a one-column stationary)
    s = cm.program.stream
    mm = s[s["opcode"] == Opcode.MATMUL]
    assert len(mm) == 2 * (1 + 2 * (1024 // 128) * (1536 // 128))
    assert (mm["cols"] == 1).all() and (mm["rows"] == 128).all()


def test_folded_norm_weight_is_neither_loaded_nor_multiplied():
    """fold-norm-weight puts each norm's weight into its up projection: the GEMV's norm
    has a weight of ones, so it loads no weight and multiplies by none (one DMA and one
    vector instruction fewer per layer than with the pass off), and still equals eager."""
    from tilecc.frontend.torch_export import export_model, import_exported_program
    from tilecc.runtime.compiler import compile_graph
    from tilecc.runtime.executor import run_program
    from tilecc.simulator.config import load_config
    from tilecc.simulator.isa import Engine

    torch.manual_seed(1)
    model = _NormLinears(1024, 1536).to(torch.bfloat16).eval()
    x = torch.randn(1, 1, 1024, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    assert sum("rms norm weight folded into 1 matmul weight" in m for m in _remarks(cm)) == 2
    cfg = load_config("cloud")
    with torch.no_grad():
        gp = import_exported_program(export_model(model, (x,)))
    on = compile_graph(gp, cfg)
    off = compile_graph(gp, cfg, disabled={"fold-norm-weight"})

    def count(prog, engine):
        return int((prog.stream["engine"] == engine).sum())

    assert count(on, Engine.DMA) == count(off, Engine.DMA) - 2
    assert count(on, Engine.VECTOR) == count(off, Engine.VECTOR) - 2
    with torch.no_grad():
        want = model(x)
    for prog in (on, off):
        (got,), _ = run_program(prog, (x,))
        torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


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
    in the GEMV, the one-byte weight streamed by the matrix engine as the moving
    operand (``lhsT``, 128 x 128 tiles) past the row's bf16 k-tile (the stationary
    ``rhs``, one column), its scale (and tanh, the residual add) applied to each
    evacuated [128, w] tile in the same kernel; outputs equal to eager.

    The orientation gains nothing on the matrix engine (one 128-cycle matmul per
    128 x 128 weight tile either way: bf16 x int8 streams at the bf16 rate and the moving
    rows land on the accumulator's 128 partitions); it puts the epilogue on 128 vector
    lanes instead of one."""
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
    assert sum("the weight streams past the row's k-tile" in m for m in _remarks(cm)) == 2
    assert len(cm.program.kernels) == 2
    s = cm.program.stream
    mm = s[s["opcode"] == Opcode.MATMUL]
    lowp = mm[mm["a_dtype"] == int(DType[dt])]
    # both projections stream one-byte weights: 1024 x 1536 and 1536 x 1024, 128 x 128
    # tiles, each against a one-column bf16 stationary
    assert len(lowp) == 2 * (1024 // 128) * (1536 // 128)
    assert set(lowp["rows"].tolist()) == {128} and set(lowp["cols"].tolist()) == {1}
    assert set(lowp["b_dtype"].tolist()) == {int(DType.BF16)}
    assert not (mm["b_dtype"] == int(DType[dt])).any()  # never the stationary operand


class _GemvEpilogue(nn.Module):
    """A one-row linear and an elementwise tail: a relu, or seven ops (`heavy`), the
    last multiplier a one-element tensor input (`scale`) or the constant 0.5."""

    def __init__(self, k: int, n: int, heavy: bool, scale: bool):
        super().__init__()
        self.lin = nn.Linear(k, n, bias=False)
        self.heavy, self.scale = heavy, scale

    def forward(self, x, s):
        y = self.lin(x)
        if not self.heavy:
            return torch.relu(y)
        return torch.tanh(torch.sigmoid(y) * y + y * y) * (s if self.scale else 0.5) - y


@pytest.mark.parametrize("heavy, scale", [(False, False), (True, False), (True, True)])
def test_gemv_epilogue_goes_where_the_cost_model_says(heavy, scale):
    """A one-row matmul's epilogue runs in the GEMV only where that is estimated no
    slower than an elementwise kernel of its own over the partitions. With 2-byte row
    operands the weight streams and the epilogue runs on [128, w] tiles (128 lanes): a
    relu, and even a seven-op tail over 16,384 columns, go in the GEMV. A one-element
    tensor operand has no [128, N/128] image, so the weight stays stationary and the
    epilogue would run on the one-partition row (one lane): the seven-op tail stays a
    kernel of its own. All equal eager."""
    torch.manual_seed(3)
    k, n = 1024, 16384
    model = _GemvEpilogue(k, n, heavy, scale).to(torch.bfloat16)
    args = (torch.randn(1, k, dtype=torch.bfloat16), torch.rand(1, dtype=torch.bfloat16) + 0.5)
    cm = run_and_compare(model, args, target="cloud")
    said = [m for m in _remarks(cm) if f"matmul 1x{k}x{n}: epilogue in the GEMV" in m]
    assert len(said) == 1 and said[0].endswith("kept separate" if scale else "fused"), said
    assert ("streamed weight" in said[0]) == (not scale)
    assert (len(cm.program.kernels) == 1) == (not scale)


class _GemvTwoOutputs(nn.Module):
    """A one-row linear whose product and a residual sum both leave the group."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.lin = nn.Linear(k, n, bias=False)

    def forward(self, x, r):
        y = self.lin(x)
        return y, y + r


@pytest.mark.parametrize("n, streams", [(1024, True), (1000, False)])
def test_gemv_orientation_needs_whole_column_tiles(n, streams):
    """The weight streams only where the output is whole 128-column tiles (its [128, w]
    image); N = 1000 keeps the weight stationary (and, its weight not pre-tiled, the
    general kernel). Two outputs of one group (the raw product and the residual sum)
    come from the same evacuation; both equal eager."""
    torch.manual_seed(4)
    model = _GemvTwoOutputs(2048, n).to(torch.bfloat16)
    x = torch.randn(1, 1, 2048, dtype=torch.bfloat16)
    r = torch.randn(1, 1, n, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x, r), target="cloud")
    assert any(f"matmul 1x2048x{n}: the weight streams past" in m for m in _remarks(cm)) == streams
    s = cm.program.stream
    mm = s[s["opcode"] == Opcode.MATMUL]
    assert (mm["cols"] == 1).all() == streams
    if streams:
        assert len(cm.program.kernels) == 1  # the sum in the GEMV's evacuation
