"""The tile DSL's scheduler (frontend/dsl/schedule.py: the simulator's timing model as its
estimate, DMA queue assignment) and the lowering choices that feed it: interleaved
transposed loads, transposes scaled on their way back, shared transposes reused by
shorter slices, resident constant tiles. Every kernel is checked against numpy (or
torch) on the simulator, with the sanitisers on."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilecc
from tilecc.frontend.dsl.lower import build_module
from tilecc.frontend.dsl.schedule import schedule_kernel
from tilecc.frontend.dsl.work import kernel_work
from tilecc.runtime import kernel as api
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import load_config
from tilecc.simulator.machine import simulate
from tilecc.simulator.timing import TimingRules

KERNELS = Path(__file__).resolve().parent.parent / "examples" / "kernels"

TALL_T = """\
kernel tall_t(x: bf16[R, D]) -> bf16[D, R]:
    for j in tiles(R, 4 * target.partitions, unroll=True):
        out[:, j] = transpose(load(x[j, :]))
"""


def _bf(*shape):
    return (torch.randn(*shape) * 0.5).bfloat16()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(R=st.sampled_from([64, 128, 150, 200]), D=st.sampled_from([1, 5, 16]))
def test_tall_transposes_are_exact_with_interleaved_loads(R, D):
    """A transposed slice of 4 array heights (64 rows on tiny) is one DMA with 4 rows per
    partition, un-interleaved by selection matmuls: exact (the matmuls only move data),
    and the partial last slice (not whole array heights) takes the plain path."""
    torch.manual_seed(R * 7 + D)
    x = _bf(R, D)
    k = tilecc.kernel(TALL_T)
    k.sanitize = True
    got = k(x)
    torch.testing.assert_close(got, x.t().contiguous(), rtol=0, atol=0)


@pytest.mark.parametrize("target, R, D, g", [("tiny", 128, 16, 2), ("tiny", 128, 1, 4), ("cloud", 512, 128, 4)])
def test_interleaved_load_in_the_tile_ir(target, R, D, g):
    """g rows per partition: the fewest that make a DMA chunk of at least the payload that
    saturates HBM (`TimingRules.dma_saturating_chunk`; tiny: 63.99 B, cloud: 4085 B), at
    most 4; each slice of 4 array heights is 4 / g DMAs and 4 * g selection matmuls of
    n0 / g contraction rows."""
    cfg = load_config(target)
    n0 = min(cfg.matrix.rows, cfg.matrix.cols, cfg.sram.partitions)
    assert g == min(4, math.ceil(TimingRules(cfg).dma_saturating_chunk() / (2 * D)))
    k = tilecc.kernel(TALL_T)
    x = _bf(R, D)
    torch.testing.assert_close(k(x, target=target), x.t().contiguous(), rtol=0, atol=0)
    ir = k.ir("tile")
    slices = R // (4 * n0)
    loads = [line for line in ir.splitlines() if "tile.load" in line and f"row_step = {g} " in line]
    assert len(loads) == slices * 4 // g, ir
    matmuls = [line for line in ir.splitlines() if "tile.matmul" in line]
    assert len(matmuls) == slices * 4 * g
    assert all(f"memref<{n0 // g}x{D}xbf16" in line for line in matmuls)


def test_a_transpose_scaled_by_a_number_is_scaled_on_its_way_back():
    src = """\
kernel st(x: f32[R, C]) -> f32[C, R]:
    s = rsqrt(C)
    for r in tiles(R, 16):
        out[:, r] = transpose(load(x[r, :])) * s
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    x = np.random.default_rng(0).standard_normal((40, 9)).astype(np.float32)
    np.testing.assert_allclose(k(x), x.T / np.sqrt(9), rtol=1e-6)
    ir = k.ir("tile")
    assert 'tile.scalar "mul"' in ir and 'tile.unary "copy"' not in ir
    # a scale that is a tile is a separate op, after the copy
    k2 = tilecc.kernel(src.replace("* s", "* load(c[:, r])").replace("(x: f32[R, C])", "(x: f32[R, C], c: f32[C, R])"))
    k2.sanitize = True
    y = np.random.default_rng(1).standard_normal((9, 40)).astype(np.float32)
    np.testing.assert_allclose(k2(x, y), x.T * y, rtol=1e-6)
    assert 'tile.unary "copy"' in k2.ir("tile")


def test_a_shorter_slice_reuses_the_leading_columns_of_a_shared_transpose():
    """In an unrolled loop a transposed slice that starts where a longer, already
    transposed one starts is a window of it: no second DMA, no second transpose."""
    src = """\
kernel pre(k: bf16[S, D]) -> (a: f32[D, S], b: f32[D, S // 2]):
    for j in tiles(S, S, unroll=True):
        a[:, j] = f32(transpose(load(k[j, :])))
    for j in tiles(S // 2, S // 2, unroll=True):
        b[:, j] = f32(transpose(load(k[j, :])))
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    x = _bf(32, 8)
    a, b = k(x)
    torch.testing.assert_close(a, x.float().t(), rtol=0, atol=0)
    torch.testing.assert_close(b, x.float().t()[:, :16], rtol=0, atol=0)
    assert k.report.hbm_bytes == _once(k.compiled.program, k.report)  # k read once
    assert k.ir("tile").count("tile.matmul") == 4  # the [0, 32) transpose only (2 folds x 2)


def _once(program, rep) -> int:
    """HBM bytes of reading every input and constant and writing every output once: the
    compulsory bytes (the kernel's parameters and results) plus its constant tiles."""
    return int(rep.compulsory_hbm_bytes) + sum(w.nbytes for w in program.weights)


def test_flash_attention_loads_every_tensor_once():
    """The causal kernel's partial key blocks reuse the whole blocks' K^T and V tiles and
    its mask is one resident constant: HBM traffic is exactly the program's compulsory
    bytes (the kernel's tensors and the program's constants, once each)."""
    q = _bf(1, 640, 128)
    k = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    c = k.compile(q, q, q, target="cloud")
    outs, rep = run_program(c.program, (q, q, q))
    want = F.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    torch.testing.assert_close(outs[0].float(), want, rtol=3e-2, atol=3e-2)
    assert rep.hbm_bytes == _once(c.program, rep)


def test_a_constant_tile_used_in_every_iteration_is_loaded_once():
    src = """\
kernel tri(x: f32[R, 16]) -> f32[R, 16]:
    for r in tiles(R, 16, unroll=True):
        out[r, :] = load(x[r, :]) + (col_ids(r) > row_ids(r)) * 2.0
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    x = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)
    np.testing.assert_allclose(k(x), x + np.triu(np.full((16, 16), 2.0, np.float32), 1)[None].repeat(4, 0)
                               .reshape(64, 16), rtol=1e-6)
    ir = k.ir("tile")
    const_args = {m for m in re.findall(r"tile\.load (%\w+)\[", ir)} - set(re.findall(r"tile\.load (%0)\[", ir))
    assert len(const_args) == 1
    assert sum(1 for line in ir.splitlines() if "tile.load" in line and f"{next(iter(const_args))}[" in line) == 1


@pytest.mark.parametrize("target, S, D, rel", [("tiny", 200, 16, 0.01), ("cloud", 2048, 128, 0.03)])
def test_the_schedule_estimate_is_the_simulated_time(target, S, D, rel):
    """The scheduler's estimate of a straight-line kernel (flash attention: every loop
    unrolled) follows the simulator's timing model: with the plain priority it is the
    simulated time to within 1 % on tiny, 3 % on cloud. (Measured 1.021 on cloud, was
    1.005 before DMA rates followed the NKI guidance: its 256-byte rows now move at 1/16
    of an engine's peak and each DMA pays 3120 fixed cycles, so DMAs dominate and the
    list schedule's own error shows; the sharing rule itself is followed exactly, every
    transfer here spans all 16 engines, so n of them each get 1/n as before.)"""
    cfg = load_config(target)
    kern = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    module = build_module(kern.ast, [(1, S, D)] * 3, cfg, target, schedule=False)
    estimate = schedule_kernel(api._kernel_func(module, "flash_attention"), cfg, 0.0, 0.0)
    program = api._finish(kern.ast, module, cfg, False, kernel_work(kern.ast, [(1, S, D)] * 3, cfg)).program
    cycles = simulate(program.stream, cfg, None, functional=False, record=False).cycles
    assert abs(estimate / cycles - 1) < rel, (estimate, cycles)
    # the top level's DMAs went on the queues the estimate assumed
    assert {int(q) for q in program.stream["queue"][program.stream["opcode"] <= 1]} == set(range(cfg.dma.queues))


def test_flash_attention_shares_k_and_v_within_each_head():
    """With a head loop that runs as scf.for, K^T and V are still loaded and transposed
    once per head (the head index is fixed within the loop body): HBM traffic is the
    program's compulsory bytes (its tensors and constants, once each)."""
    q = _bf(2, 72, 16)
    k = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    c = k.compile(q, q, q, target="tiny")
    outs, rep = run_program(c.program, (q, q, q), sanitize=True)
    want = F.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    torch.testing.assert_close(outs[0].float(), want, rtol=3e-2, atol=3e-2)
    assert rep.hbm_bytes == _once(c.program, rep)


def test_interleaved_loads_on_the_triton_backend():
    """The GPU fallback reads the same interleaved DMA pattern (g rows per partition)."""
    pytest.importorskip("triton")
    x = _bf(128, 1)
    k = tilecc.kernel(TALL_T)
    torch.testing.assert_close(k(x, target="gpu"), x.t().contiguous(), rtol=0, atol=0)
    k.compile(x, target="tiny")  # the tile IR the GPU kernel was generated from
    assert any("row_step = 4" in line for line in k.ir("tile").splitlines() if "tile.load" in line)
