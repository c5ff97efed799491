"""The intrinsic work of tile-DSL kernels (frontend/dsl/work.py), against figures computed
by hand from the shapes: MACs, vector element-cycles (elements * the config's op cost *
inputs) and compulsory HBM bytes. Transposes, constants and copies the lowering adds
count nothing; the figures do not depend on the schedule or on the target's tile sizes
(only on each config's op costs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from xdsl.dialects.builtin import TensorType, bf16, f32
from xdsl.ir import Block

import tilecc
from tilecc.frontend.dsl.lower import KernelLowering
from tilecc.frontend.dsl.parser import load_kernels
from tilecc.frontend.dsl.work import dsl_call_work, kernel_work
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.roofline import LOWP_WORK_KEYS, WORK_KEYS, IntrinsicWork

KERNELS = Path(__file__).resolve().parent.parent / "examples" / "kernels"
TINY, CLOUD = load_config("tiny"), load_config("cloud")


def _ast(name: str):
    return tilecc.kernel(KERNELS / f"{name}.tdsl").ast


def _costs(cfg: HardwareConfig):
    c = cfg.vector.op_cost
    return c.unary, c.binary, c.reduce


def _elements(w: IntrinsicWork, cfg: HardwareConfig) -> dict[str, float]:
    """Elements * inputs of each kind of op (its vector figure over the config's cost)."""
    tables = dict(zip(("unary", "binary", "reduce"), _costs(cfg)))
    out = {}
    for kind, e in w.by_op.items():
        if kind != "matmul":
            table, fn = kind.split(".")
            out[kind] = e["vector"] / tables[table][fn]
    return out


@pytest.mark.parametrize("cfg", [TINY, CLOUD], ids=["tiny", "cloud"])
def test_gemm_gelu(cfg):
    M, K, N = 40, 24, 72
    un, bi, _ = _costs(cfg)
    w = kernel_work(_ast("gemm_gelu"), [(M, K), (K, N), (N,)], cfg)
    assert w.macs_16 == M * K * N and w.macs_fp32 == 0
    # acc + bias (a row: one input), gelu
    assert w.vector_element_cycles == M * N * (bi["add"] + un["gelu"])
    assert w.compulsory_hbm_bytes == 2 * M * K + 2 * K * N + 4 * N + 2 * M * N


@pytest.mark.parametrize("cfg", [TINY, CLOUD], ids=["tiny", "cloud"])
def test_softmax(cfg):
    R, C = 40, 33
    un, bi, red = _costs(cfg)
    w = kernel_work(_ast("softmax"), [(R, C)], cfg)
    assert w.macs_16 == w.macs_fp32 == 0
    # max(t), t - max (a column), exp, sum(e), e / sum (a column)
    assert w.vector_element_cycles == R * C * (red["max"] + bi["sub"] + un["exp"] + red["sum"] + bi["div"])
    assert w.compulsory_hbm_bytes == 2 * 4 * R * C


def test_layer_norm_and_rms_norm():
    R, C = 33, 40
    un, bi, red = _costs(CLOUD)
    w = kernel_work(_ast("layer_norm"), [(R, C), (C,), (C,)], CLOUD)
    # mean(t), t - mean, d * d (two tiles), mean, d * rsqrt(..) (a column), * w, + b (rows);
    # per row: + 1e-5, rsqrt
    per_element = red["sum"] + bi["sub"] + 2 * bi["mul"] + red["sum"] + bi["mul"] + bi["mul"] + bi["add"]
    assert w.vector_element_cycles == R * C * per_element + R * (bi["add"] + un["rsqrt"])
    assert w.compulsory_hbm_bytes == 4 * (2 * R * C + 2 * C)
    w = kernel_work(_ast("rms_norm"), [(R, C), (C,)], CLOUD)
    # the casts are free: t * t, mean, t * rsqrt (a column), * w (a row)
    per_element = 2 * bi["mul"] + red["sum"] + bi["mul"] + bi["mul"]
    assert w.vector_element_cycles == R * C * per_element + R * (bi["add"] + un["rsqrt"])
    assert w.compulsory_hbm_bytes == 2 * (2 * R * C + C)


TRANSPOSE = """
kernel tr(x: f32[R, C]) -> f32[C, R]:
    for r in tiles(R, target.partitions):
        out[:, r] = transpose(load(x[r, :])) * 2.0
"""


def test_transpose_adds_no_macs():
    """The program transposes on the matrix engine (identity matmuls); the kernel's work
    is the one multiply."""
    R, C = 40, 16
    k = tilecc.kernel(TRANSPOSE)
    w = kernel_work(k.ast, [(R, C)], TINY)
    assert w.macs_16 == w.macs_fp32 == 0
    assert w.vector_element_cycles == R * C * TINY.vector.op_cost.binary["mul"]
    x = np.random.default_rng(0).standard_normal((R, C)).astype(np.float32)
    np.testing.assert_allclose(k(x, target="tiny"), 2 * x.T, rtol=1e-6)
    work = k.compiled.program.work
    assert work["program_macs_fp32"] + work["program_macs_16"] > 0  # the identity matmuls
    assert {key: work[key] for key in WORK_KEYS + LOWP_WORK_KEYS} == w.figures()
    assert k.report.roofline_components["matrix"] == 0


@pytest.mark.parametrize("cfg", [TINY, CLOUD], ids=["tiny", "cloud"])
def test_causal_flash_attention(cfg):
    """The key loops stop at each query tile's end: the scores computed are the lower
    triangle of query tiles (diagonal tiles whole), three MACs each per head dimension
    (QK^T in both passes, PV); the mask adds only where it is not zero."""
    S, D = 200, 16
    T, B = cfg.sram.partitions, 8 * cfg.sram.partitions
    un, bi, red = _costs(cfg)
    tiles = [(m0, min(T, S - m0)) for m0 in range(0, S, T)]
    scores = sum(size * (m0 + size) for m0, size in tiles)
    blocks = sum(size * -(-(m0 + size) // B) for m0, size in tiles)  # ms / ls columns reduced
    masked = sum(size * (size - 1) // 2 for _, size in tiles)  # col > row in the diagonal tile
    w = kernel_work(_ast("flash_attention"), [(1, S, D)] * 3, cfg)
    assert w.macs_16 == 3 * D * scores and w.macs_fp32 == 0
    want = (S * D * bi["mul"]  # Q^T * scale
            + 2 * 2 * masked * bi["add"]  # the mask, a full tile, in both passes
            + (scores + blocks) * (red["max"] + red["sum"])  # max(s), max(ms); sum(p), sum(ls)
            + scores * (bi["sub"] + un["exp"])  # exp(s - mx), mx a column
            + S * D * bi["div"])  # o / l, l a column
    assert w.vector_element_cycles == want
    assert w.compulsory_hbm_bytes == 4 * 2 * S * D
    if cfg is TINY:
        assert (scores, blocks, masked) == (21568, 272, 1468)


SAME_ON_ANY_TILING = [
    ("gemm_gelu", [(40, 24), (24, 72), (72,)]),
    ("softmax", [(40, 33)]),
    ("layer_norm", [(33, 40), (40,), (40,)]),
    ("rms_norm", [(33, 40), (40,)]),
    ("mlp", [(40, 24), (24, 48), (48,), (48, 20), (20,)]),
    ("conv2d", [(20, 9, 10), (3, 3, 20, 24)]),
]


@pytest.mark.parametrize("name, shapes", SAME_ON_ANY_TILING, ids=[n for n, _ in SAME_ON_ANY_TILING])
def test_work_does_not_depend_on_the_targets_tiles(name, shapes):
    """tiny (16-wide tiles) and cloud (128-wide): the same MACs, bytes and element-ops,
    each weighted by its own config's op costs."""
    tiny, cloud = (kernel_work(_ast(name), shapes, cfg) for cfg in (TINY, CLOUD))
    assert (tiny.macs_16, tiny.macs_fp32, tiny.compulsory_hbm_bytes) == (
        cloud.macs_16, cloud.macs_fp32, cloud.compulsory_hbm_bytes)
    assert _elements(tiny, TINY) == _elements(cloud, CLOUD)
    assert tiny.macs_16 + tiny.vector_element_cycles > 0


def test_the_same_work_for_every_schedule_variant():
    """The scheduled and unscheduled lowerings count the same work, and the kernel's
    Program (the fastest variant) carries it, beside its own (larger) stream figures."""
    S, D = 72, 16
    ast = _ast("flash_attention")
    want = kernel_work(ast, [(1, S, D)] * 3, TINY)
    kl = KernelLowering(ast, [(1, S, D)] * 3, TINY, schedule=True)
    kl.run()
    assert kl.work() == want
    q = torch.randn(1, S, D).bfloat16()
    k = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    c = k.compile(q, q, q, target="tiny")
    work = c.program.work
    assert {key: work[key] for key in WORK_KEYS + LOWP_WORK_KEYS} == want.figures()
    assert work["program_macs_16"] > work["macs_16"]  # K's and P's transposes
    assert work["program_hbm_bytes"] > work["compulsory_hbm_bytes"]  # its constants, loaded too


def test_a_report_bound_is_the_intrinsic_work():
    """The program's MACs include the transposes of a's tiles; the bound's do not."""
    M, K, N = 32, 32, 64
    rng = np.random.default_rng(2)
    k = tilecc.kernel(KERNELS / "gemm_gelu.tdsl")
    a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
    k(a, b, rng.standard_normal(N).astype(np.float32), target="tiny")
    assert k.report is not None
    assert k.report.roofline_components["matrix"] == M * K * N / (TINY.matrix.rows * TINY.matrix.cols)


def test_dsl_call_work_reads_the_shapes_of_its_operands():
    M, K, N = 40, 24, 72
    k = tilecc.kernel(KERNELS / "gemm_gelu.tdsl")
    blk = Block(arg_types=[TensorType(bf16, [M, K]), TensorType(bf16, [K, N]), TensorType(f32, [N])])
    op = DslCallOp(blk.args, [TensorType(bf16, [M, N])], k)
    assert dsl_call_work(op, CLOUD) == kernel_work(load_kernels(k.ast.source)[0], [(M, K), (K, N), (N,)], CLOUD)
