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


@pytest.mark.parametrize("n, streams", [(1024, True), (1000, True), (1001, False)])
def test_gemv_orientation_needs_whole_column_tiles(n, streams):
    """The weight streams only where the output is whole column tiles (its [TN, w]
    image): 128 columns for N = 1024, 125 for N = 1000 (`gemv_tile_width`: eight
    tiles either way); N = 1001 has no such width (7 x 11 x 13) and keeps the weight
    stationary (and, its weight not pre-tiled, the general kernel). Two outputs of one
    group (the raw product and the residual sum) come from the same evacuation; both
    equal eager."""
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


@pytest.mark.parametrize("n, width", [(1000, 125), (250, 125), (1024, 128), (1001, 128), (200, 100), (130, 65), (10, 10)])
def test_gemv_tile_width_divides_n_in_as_many_tiles(n, width):
    """The column tile of a one-row matmul: the widest divisor of N within [64, 128] that
    keeps ceil(N / 128) tiles, else the array's 128 columns."""
    from tilecc.passes.graph_to_tile.matmul_problem import gemv_tile_width

    assert gemv_tile_width(n, 128) == width


class _Classifier(nn.Module):
    """A CNN's head: global average pool, flatten, a linear with bias to 1,000 classes."""

    def __init__(self, c: int, classes: int):
        super().__init__()
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_classifier_head_is_one_kernel(dtype):
    """A 1,000-class head at batch 1: the weight pre-tiled in 125-column tiles (eight of
    them), the global average pool computing the row in the partitions (the GEMV's
    prologue: fuse-graph's `mean_prologue`) and the bias add in the GEMV's evacuation:
    one kernel, no mean or add kernel beside it. Equal to eager."""
    torch.manual_seed(5)
    model = _Classifier(512, 1000).to(dtype)
    x = torch.randn(1, 512, 7, 7, dtype=dtype)
    cm = run_and_compare(model, (x,), target="cloud")
    assert [k[0] for k in cm.program.kernels] == ["k0_matmul"]
    rem = _remarks(cm)
    assert any("mean + matmul 1x512x1000: the average pool over 49 positions computes the matmul's row" in m
               for m in rem)
    assert any("matmul 1x512x1000: its epilogue (add) runs on each evacuated" in m for m in rem)
    assert any("stored pre-tiled for its matmul" in m and "fc.weight" in m for m in rem)


class _ConvHead(nn.Module):
    """A residual stage's last convolution, then the head: the convolution's output,
    read only by the head's pool, is stored zero-padded (`layout_plan.wants_padded`)."""

    def __init__(self, c: int, classes: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def test_classifier_head_pools_a_padded_map():
    """The pooled map stored with its zero ring (rows of W + 2): the head sums the ring's
    zeros too and divides by H * W, with no unpadding copy of the map. Equal to eager."""
    torch.manual_seed(6)
    model = _ConvHead(128, 10).eval().to(torch.bfloat16)
    x = torch.randn(1, 128, 8, 8, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    names = [k[0] for k in cm.program.kernels]
    assert names[-1].endswith("_matmul") and not any("unpad" in n or "reduce" in n for n in names), names
    assert any("the average pool over 64 positions computes the matmul's row" in m for m in _remarks(cm))
    _, first, count = cm.program.kernels[-1]
    head = cm.program.stream[first : first + count]
    sums = head[head["opcode"] == Opcode.VEC_REDUCE]
    assert len(sums) == 1 and (sums["rows"], sums["cols"]) == (128, 10 * 10)  # the padded map, ring and all


def test_classifier_head_takes_the_general_path_without_whole_tiles():
    """1,001 classes (7 x 11 x 13: no column tile within [64, 128] in eight tiles): the
    pool, the matmul and the bias add lower as before, as kernels of their own."""
    torch.manual_seed(7)
    model = _Classifier(256, 1001).to(torch.bfloat16)
    x = torch.randn(1, 256, 4, 4, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    names = [k[0] for k in cm.program.kernels]
    assert len(names) == 3 and "reduce_mean" in names[0], names


def test_classifier_head_general_path_pools_a_padded_map():
    """1,001 classes after a convolution whose output only the head reads (stored
    padded): the group's pool falls back to the reduction kernel, which reads the
    padded map as it is. Equal to eager."""
    torch.manual_seed(8)
    model = _ConvHead(128, 1001).eval().to(torch.bfloat16)
    x = torch.randn(1, 128, 8, 8, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target="cloud")
    names = [k[0] for k in cm.program.kernels]
    assert any("reduce_mean" in n for n in names) and not any("unpad" in n for n in names), names
