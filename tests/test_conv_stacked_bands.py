"""-O2 banded convolutions with few output channels: bands side by side on the
accumulator partitions (`GemmO2Plan.stack`), and the floor / bias contraction rows that
replace the padded output's mask and the bias pass (`GemmO2Plan.pad_at`), against eager
with the sanitisers on; the plans and the epilogue's instructions on ResNet-18's 56 x 56
layer shape."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import random_batch_norm, run_and_compare
from tilecc.passes.graph_to_tile.nn.conv_plan import ConvProblem, plan_conv
from tilecc.passes.graph_to_tile.nn.geometry import Geometry
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import BinaryFn, Flag, Opcode

DTYPES = [torch.float32, torch.bfloat16]


class Block(torch.nn.Module):
    """conv-bn-relu, conv-bn + residual + relu (a ResNet basic block) after a stem conv."""

    def __init__(self, c: int, cin: int = 3, stride: int = 1, act: str = "relu"):
        super().__init__()
        self.stem = torch.nn.Conv2d(cin, c, 3, 1, 1)
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, stride, 1, bias=False), random_batch_norm(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False), random_batch_norm(c)
        self.down = torch.nn.Conv2d(c, c, 1, stride, 0, bias=False) if stride > 1 else None
        self.act = act

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = self.b1(self.c1(x))
        y = torch.relu(y) if self.act == "relu" else torch.sigmoid(y)
        r = self.down(x) if self.down is not None else x
        return torch.relu(self.b2(self.c2(y)) + r)


def _problem(C: int, H: int, W: int, steps: tuple[str, ...], floor: bool, bias: bool = True) -> ConvProblem:
    geo = Geometry(1, C, H, W, H, W, (3, 3), (1, 1), (1, 1), (1, 1))
    return ConvProblem(geo, 1, C, C, "gihwo", 2, 2, bias, steps, floor)


def test_resnet18_layer1_plan_stacks_two_bands_and_floors_the_padding():
    cfg = load_config("cloud")
    plan = plan_conv(cfg, 2, _problem(64, 56, 56, ("unary",), True), 58, "t").schedule
    assert plan is not None and plan.stack == 2 and plan.RB * plan.stack * 2 == 56
    assert plan.pad_at is not None and plan.extra == 2  # the floor row and the bias row
    si, ti = plan.pad_at
    assert plan.steps[si].K + plan.extra <= 128
    # steps that do not send -2^100 to 0 keep the mask (no floor row); 128 channels: no stack
    assert plan_conv(cfg, 2, _problem(64, 56, 56, ("unary",), False), 58, "t").schedule.pad_at is None
    full = plan_conv(cfg, 2, _problem(128, 28, 28, ("unary",), True), 30, "t").schedule
    assert full.stack == 1
    # 128 input channels fill every step: the floor and bias rows get a step of their own
    assert full.pad_at == (len(full.steps) - 1, 0) and full.steps[-1].K == 0 and full.steps[-1].folded


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_contraction_gets_a_floor_step(dtype):
    """128 channels (every contraction step full): the floor / bias rows as a step of
    their own; the block's two convolutions against eager, no mask multiply left."""
    torch.manual_seed(0)
    cm = run_and_compare(Block(128, cin=8).eval().to(dtype), (torch.randn(1, 8, 14, 13, dtype=dtype),), "cloud")
    for name, a, n in [kn for kn in cm.program.kernels if kn[0].endswith("_conv2d")][-2:]:
        s = cm.program.stream[a:a + n]
        mm = s[s["opcode"] == Opcode.MATMUL]
        assert (mm["k"] == 2).any(), name  # the floor and bias rows
        mul = s[(s["opcode"] == Opcode.VEC_BINARY) & (s["func"] == BinaryFn.MUL)
                & ((s["flags"] & (Flag.B_IMM | Flag.B_COLUMN)) == 0)]
        assert len(mul) == 0, name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, hw", [(16, (14, 11)), (32, (20, 17)), (64, (24, 22))])
def test_stacked_floored_basic_block_matches_eager(c, hw, dtype):
    torch.manual_seed(0)
    cm = run_and_compare(Block(c).eval().to(dtype), (torch.randn(1, 3, *hw, dtype=dtype),), "cloud")
    for name, a, n in [kn for kn in cm.program.kernels if kn[0].endswith("_conv2d")][-2:]:  # the block's two
        s = cm.program.stream[a:a + n]
        vec = s[(s["opcode"] == Opcode.VEC_BINARY) | (s["opcode"] == Opcode.VEC_UNARY)]
        # the epilogue covers two or more bands at once (2c partitions) ...
        assert (vec["rows"] >= 2 * c).any(), name
        # ... and multiplies by no 0/1 mask (no vector mul with a tile operand is left)
        mul = vec[(vec["opcode"] == Opcode.VEC_BINARY) & (vec["func"] == BinaryFn.MUL)
                  & ((vec["flags"] & (Flag.B_IMM | Flag.B_COLUMN)) == 0)]
        assert len(mul) == 0, name


@pytest.mark.parametrize("dtype", DTYPES)
def test_stacked_bands_keep_the_mask_and_bias_column_without_a_relu(dtype):
    """sigmoid after the first block conv: no floor (the mask and the bias as a repeated
    column); stride 2 with a downsample: stacked, not floored (phase rows Wq != Wp)."""
    torch.manual_seed(0)
    run_and_compare(Block(16, act="sigmoid").eval().to(dtype), (torch.randn(1, 3, 15, 13, dtype=dtype),), "cloud")
    run_and_compare(Block(32, stride=2).eval().to(dtype), (torch.randn(1, 3, 31, 29, dtype=dtype),), "cloud")


def test_an_odd_height_keeps_one_band_per_tile_with_a_remark():
    """13 rows do not split into groups of two bands: the bands stay one per accumulator
    tile (a remark says so); the floor rows still apply."""
    torch.manual_seed(0)
    cm = run_and_compare(Block(16).eval(), (torch.randn(1, 3, 13, 11),), "cloud")
    msgs = [(r["kind"], r["message"]) for r in cm.program.meta["remarks"]]
    assert ("missed", "convolution bands not stacked (16 output channels): 13 rows do not split into groups of "
            "bands that fit (one band per tile)") in msgs, msgs
    assert ("passed", "padded output floored by a contraction row (no mask; the bias in the contraction)") in msgs


def test_stacked_bands_with_a_batch_and_a_runtime_batch_norm():
    """Batch 2 (the floor rows and the bias reload per image); batch norm with statistics
    that are graph inputs: per-channel column steps, loaded repeated down the stack."""
    torch.manual_seed(0)
    run_and_compare(Block(16).eval(), (torch.randn(2, 3, 14, 12),), "cloud")

    class RuntimeBn(torch.nn.Module):
        def __init__(self, c=16):
            super().__init__()
            self.stem, self.c = torch.nn.Conv2d(3, c, 3, 1, 1), torch.nn.Conv2d(c, c, 3, 1, 1)

        def forward(self, x, mean, var):
            y = torch.relu(self.stem(x))
            z = torch.nn.functional.batch_norm(self.c(y), mean, var, None, None, False, 0.0, 1e-5)
            return torch.relu(z + y)

    c = 16
    run_and_compare(RuntimeBn(c).eval(), (torch.randn(1, 3, 16, 18), torch.randn(c), torch.rand(c) + 0.5), "cloud")


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_phase_rows_as_wide_as_the_padded_output(dtype):
    """A stride-2 3x3 convolution whose output is stored padded (rows of OW + 2) builds
    its phase images with rows that wide, so its accumulator rows line up with the output
    (whole bands, floor rows): 31 x 29 -> 16 x 15, phase rows of 17 instead of 16."""
    torch.manual_seed(0)
    cm = run_and_compare(Block(32, stride=2).eval().to(dtype), (torch.randn(1, 3, 31, 29, dtype=dtype),), "cloud")
    cols = []
    for name, a, n in cm.program.kernels:
        if name.endswith("_pad"):
            s = cm.program.stream[a:a + n]
            cols += list(s[s["opcode"] == Opcode.DMA_STORE]["cols"])
    assert 4 * 17 * 17 in cols, cols  # four phases of 17 x 17 (3x3 / 2 / pad 1 of 31 x 29, rows widened)
