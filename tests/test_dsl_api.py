"""The tile DSL's Python API (tilecc.kernel: numpy / torch in and out, report, each
stage's IR, source locations on ops) and its torch custom ops (export, tilecc compile
by inlining the kernel's tile IR, eager)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tilecc
from tilecc.errors import InputMismatchError, TileccError

KERNELS = Path(__file__).resolve().parent.parent / "examples" / "kernels"

SCALE = """\
kernel scale_add(x: f32[R, C], y: f32[R, C]) -> f32[R, C]:
    for r in tiles(R, 16):
        out[r, :] = load(x[r, :]) * 2.0 + load(y[r, :])
"""


def test_numpy_in_numpy_out_and_torch_in_torch_out():
    k = tilecc.kernel(SCALE)
    x, y = np.arange(40 * 3, dtype=np.float32).reshape(40, 3), np.ones((40, 3), np.float32)
    got = k(x, y)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, x * 2 + y)
    gt = k(torch.from_numpy(x), torch.from_numpy(y))
    assert isinstance(gt, torch.Tensor)
    torch.testing.assert_close(gt, torch.from_numpy(x * 2 + y))


def test_report_and_every_stage():
    k = tilecc.kernel(KERNELS / "softmax.tdsl")
    with pytest.raises(TileccError, match="has not been compiled yet"):
        k.ir("tile")
    k(np.random.default_rng(0).standard_normal((20, 9)).astype(np.float32), target="tiny")
    assert k.report.cycles > 0 and k.report.roofline_ratio >= 1.0
    tile_ir = k.ir("tile")
    assert "func.func @softmax" in tile_ir and "tile.reduce" in tile_ir and "scf.for" not in tile_ir
    # the source position of each op (file:line:col) is on it
    assert 'tilecc.loc = "' + str(KERNELS / "softmax.tdsl") + ':5:9"' in tile_ir
    assert "npu.kernel" in k.ir("npu") and "npu.vec_reduce" in k.ir("npu")
    assert "offset = " in k.ir("plan-sram")
    asm = k.asm()
    assert "vec.exp" in asm and "dma.load" in asm and "dma.store" in asm
    with pytest.raises(TileccError, match="unknown stage 'ptx'"):
        k.ir("ptx")


def test_every_tile_op_carries_its_dsl_location():
    k = tilecc.kernel(KERNELS / "gemm_gelu.tdsl")
    a, b, bias = torch.randn(40, 20).bfloat16(), torch.randn(20, 70).bfloat16(), torch.randn(70)
    k(a, b, bias)
    module = k.compiled.module
    ops = [op for op in module.walk() if op.name.startswith("tile.")]
    assert ops and all("tilecc.loc" in op.attributes for op in ops)
    lines = {op.name: op.attributes["tilecc.loc"].data.rsplit(":", 2)[1] for op in ops}
    assert lines["tile.matmul"] == "10" and lines["tile.unary"] == "11" and lines["tile.store"] == "11"


def test_loops_peel_the_edge_tile_and_multibuffer():
    k = tilecc.kernel(KERNELS / "gemm_gelu.tdsl")
    a, b, bias = torch.randn(20, 70).bfloat16(), torch.randn(70, 30).bfloat16(), torch.randn(30)
    k.sanitize = True
    got = k(a, b, bias)
    torch.testing.assert_close(got.float(), F.gelu(a.float() @ b.float() + bias).bfloat16().float(),
                               rtol=2e-2, atol=5e-2)
    ir = k.ir("tile")
    # K = 70 on 16-wide tiles, buffers=2: 4 full tiles as 2 loop iterations of 2 copies, and a
    # peeled edge tile of 6; each copy loads (and transposes, on the matrix engine) into
    # buffers of its own
    assert 'buffer = "a"' in ir and 'buffer = "a1"' in ir and 'buffer = "xT1"' in ir
    assert "sizes(%" in ir


def test_input_errors():
    k = tilecc.kernel(SCALE)
    with pytest.raises(InputMismatchError, match=r"kernel scale_add takes 2 array\(s\) \(x, y\), got 1"):
        k(np.ones((2, 2), np.float32))
    with pytest.raises(InputMismatchError, match="kernel scale_add: 'x' is f32, got an array of torch.float16"):
        k(np.ones((2, 2), np.float16), np.ones((2, 2), np.float32))


def test_kernel_as_torch_op_exports_compiles_and_matches_eager():
    k = tilecc.kernel(KERNELS / "gemm_gelu.tdsl")
    k.as_torch_op("tilecc_test::gemm_gelu")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(40, 24).bfloat16())
            self.bias = torch.nn.Parameter(torch.randn(24))

        def forward(self, x):
            y = torch.ops.tilecc_test.gemm_gelu(torch.relu(x), self.w, self.bias)
            return y.float() * 2 + 1

    m = Model()
    x = torch.randn(20, 40).bfloat16()
    with torch.no_grad():
        eager = m(x)  # the custom op runs the kernel on the simulator
        math = F.gelu(torch.relu(x).float() @ m.w.float() + m.bias).bfloat16().float() * 2 + 1
    torch.testing.assert_close(eager, math, rtol=2e-2, atol=0.1)
    ep = torch.export.export(m, (x,))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "tilecc_test.gemm_gelu.default" in targets  # export keeps the kernel as one op
    cm = tilecc.compile(ep, target="tiny")
    cm.sanitize = True
    got = cm(x)
    torch.testing.assert_close(got, eager)
    names = [s for s in cm.program.kernels]
    assert any("gemm_gelu" in n[0] for n in names)


def test_torch_op_fake_shapes_follow_result_types():
    k = tilecc.kernel(KERNELS / "conv2d.tdsl")
    k.as_torch_op("tilecc_test::conv2d")

    class Model(torch.nn.Module):
        def forward(self, x, w):
            return torch.ops.tilecc_test.conv2d(x, w) + 1

    x, w = torch.randn(3, 6, 9).bfloat16(), torch.randn(3, 2, 3, 5).bfloat16()
    ep = torch.export.export(Model(), (x, w))
    out = [n for n in ep.graph.nodes if n.op == "call_function"][0]
    assert tuple(out.meta["val"].shape) == (5, 4, 8)
    got = tilecc.compile(ep, target="tiny")(x, w)
    want = F.conv2d(x.float()[None], w.float().permute(3, 2, 0, 1))[0] + 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_tiles_with_a_start_unroll_and_folded_constant_tiles():
    src = """\
kernel band(x: f32[R, C]) -> f32[R, C]:
    for r in tiles(R, 16):
        for c in tiles(r.start, r.end, 16, unroll=True):
            out[r, c] = load(x[r, c]) + (col_ids(c) > row_ids(r)) * -100.0
        for c in tiles(0, r.start, 16):
            out[r, c] = load(x[r, c]) * 2.0
        for c in tiles(r.end, C, 16):
            out[r, c] = exp(load(x[r, c]))
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    x = np.random.default_rng(1).standard_normal((40, 40)).astype(np.float32)
    got = k(x)
    rows, cols = np.indices(x.shape)
    want = np.where(cols // 16 < rows // 16, x * 2, np.exp(x))
    diag = cols // 16 == rows // 16
    want[diag] = (x + np.where(cols > rows, -100.0, 0.0))[diag]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    ir = k.ir("tile")
    assert 'tile.binary "gt"' not in ir  # the id comparison folded into a constant tile


def test_scheduler_reorders_within_blocks_and_keeps_results():
    k = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    q, kk, v = (torch.randn(1, 40, 16).bfloat16() for _ in range(3))
    k.sanitize = True
    got = k(q, kk, v)
    want = F.scaled_dot_product_attention(q.float(), kk.float(), v.float(), is_causal=True)
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)
    from tilecc.frontend.dsl.lower import KernelLowering
    from tilecc.simulator.config import load_config

    shapes, cfg = [tuple(q.shape)] * 3, load_config("tiny")
    names = [[op.name for op in KernelLowering(k.ast, shapes, cfg, schedule=s).run().walk()]
             for s in (False, True)]
    assert sorted(names[0]) == sorted(names[1]) and names[0] != names[1]


def test_matmul_splits_a_long_contraction_and_transposes_tall_tiles():
    src = """\
kernel mm(a: bf16[M, K], b: bf16[K, N], c: bf16[K, N]) -> (y: f32[M, N], z: f32[N, K]):
    for m in tiles(M, 16):
        y[m, :] = matmul(load(a[m, :]), load(b[:, :]))
    z[:, :] = f32(transpose(load(c[:, :])))
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    a, b, c = torch.randn(20, 45).bfloat16(), torch.randn(45, 12).bfloat16(), torch.randn(45, 12).bfloat16()
    y, z = k(a, b, c)
    torch.testing.assert_close(y, a.float() @ b.float(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(z, c.float().T)
    ir = k.ir("tile")
    assert ir.count("tile.matmul") >= 3 * 2  # K = 45: three parts (and their transposes)


def test_unrolled_loops_load_a_read_only_tile_once():
    src = """\
kernel rep(x: f32[R, C], w: f32[C]) -> f32[R, C]:
    for r in tiles(R, 16, unroll=True):
        out[r, :] = load(x[r, :]) * load(w[:])
"""
    k = tilecc.kernel(src)
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((32, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(k(x, w), x * w, rtol=1e-6)
    assert k.ir("tile").count("tile.load") == 2 + 1  # x[r, :] per copy; w once for both copies


ROWSUM = """\
kernel rowsum(x: f32[R, C]) -> f32[R, 1]:
    for r in tiles(R, 16):
        acc = zeros(f32[r.size, 1])
        for c in tiles(C, 16{kw}):
            acc += sum(exp(load(x[r, c])))
        out[r, :] = acc
"""


@pytest.mark.parametrize("kw", [", unroll=True", ""])
def test_a_zeroed_sram_tile_takes_its_first_sum_directly(kw):
    """`acc = zeros(...)` then `acc += v`: in an unrolled loop the first execution writes v
    into acc (no fill, no add); in a loop that runs as scf.for the fill stays."""
    k = tilecc.kernel(ROWSUM.format(kw=kw))
    k.sanitize = True
    x = np.random.default_rng(3).standard_normal((20, 40)).astype(np.float32)
    np.testing.assert_allclose(k(x), np.exp(x).sum(-1, keepdims=True), rtol=1e-5)
    ir = k.ir("tile")
    adds = ir.count('tile.binary "add"')
    if kw:  # three column tiles per row tile: two adds per row-tile body (two bodies: full, peeled)
        assert adds == 2 * 2 and "const_fill" not in ir
    else:  # the loop body runs twice per row tile (16 + 16) plus a peeled 8: the fill stays
        assert adds >= 2 and "const_fill" in ir


def test_small_fills_in_loops_copy_a_resident_constant():
    """A running maximum filled in every row tile: a vector copy from a constant tile
    loaded once, not a DMA per fill (that DMA's latency sat on the loop's critical path)."""
    src = """\
kernel rowmax(x: f32[R, C]) -> f32[R, 1]:
    for r in tiles(R, 16):
        mx = full(f32[r.size, 1], -1e30)
        for c in tiles(C, 16, unroll=True):
            mx = max(mx, max(load(x[r, c])))
        out[r, :] = mx
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    x = np.random.default_rng(4).standard_normal((40, 33)).astype(np.float32)
    np.testing.assert_allclose(k(x), x.max(-1, keepdims=True), rtol=0)
    ir = k.ir("tile")
    assert "const_fill" in ir
    assert ir.count('tile.unary "copy"') >= 1


def test_the_scheduler_costs_vector_ops_from_the_config_table():
    import dataclasses

    from xdsl.dialects.builtin import Float32Type

    from tilecc.frontend.dsl.schedule import _Cost
    from tilecc.ir import tile as T
    from tilecc.simulator.config import load_config

    cfg = load_config("cloud")  # exp costs 3 VectorE cycles here, copy 1 (the preset's)
    table = dataclasses.replace(cfg.vector.op_cost, unary={**cfg.vector.op_cost.unary, "exp": 3.0})
    cfg = dataclasses.replace(cfg, vector=dataclasses.replace(cfg.vector, op_cost=table))
    buf = T.AllocOp(T.onchip_type([128, 512], Float32Type(), T.SRAM), "b").results[0]
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import IndexType, IntegerAttr

    rows = arith.ConstantOp(IntegerAttr(128, IndexType())).result
    cols = arith.ConstantOp(IntegerAttr(512, IndexType())).result
    cost = _Cost(cfg)
    # 128 partitions on 128 lanes: 512 groups; overhead 16 + 60 VectorE cycles; 2.5 core
    # cycles per VectorE cycle (2.4 / 0.96 GHz)
    fixed = (16 + 60) * 2.5
    exp = cost.timing(T.UnaryOp("exp", buf, buf, rows, cols))[1]
    copy = cost.timing(T.UnaryOp("copy", buf, buf, rows, cols))[1]
    assert (copy, exp) == (fixed + 512 * 2.5, fixed + 3 * 512 * 2.5) == (1470.0, 4030.0)


def test_empty_declares_a_tile_without_filling_it():
    """`empty(...)` allocates only: writing before reading works, and a read before any
    write is an uninitialised read the sanitiser reports."""
    good = """\
kernel twice(x: f32[R, C]) -> f32[R, C]:
    for r in tiles(R, 16):
        t = empty(f32[r.size, C])
        t = load(x[r, :]) * 2.0
        out[r, :] = t
"""
    bad = good.replace("        t = load(x[r, :]) * 2.0\n", "")
    x = np.random.default_rng(5).standard_normal((20, 8)).astype(np.float32)
    k = tilecc.kernel(good)
    k.sanitize = True
    np.testing.assert_allclose(k(x), 2 * x)
    assert 'tile.load' in k.ir("tile") and k.ir("tile").count("tile.load") == 2  # x per row tile: no fill DMA
    k = tilecc.kernel(bad)
    k.sanitize = True
    with pytest.raises(TileccError, match="uninitialised"):
        k(x)


def test_a_masked_product_lands_in_place_and_the_mask_covers_its_columns_only():
    """``s = matmul(...) + mask`` into an accumulator tile declared outside the loop: the
    product goes straight into s (no separate product tile) and the constant mask is
    added over the columns where it is not zero."""
    src = """\
kernel masked(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N]:
    for m in tiles(M, 16, unroll=True):
        s = empty(f32[m.size, 32], acc)
        for n in tiles(m.start, m.end + 16, 32, unroll=True):
            s = matmul(load(a[m, :]), load(b[:, n])) + (col_ids(n) > row_ids(m) + 16) * -100.0
            out[m, n] = s * 1.0
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    a, b = torch.randn(32, 16).bfloat16(), torch.randn(16, 48).bfloat16()
    got = k(a, b)
    want = a.float() @ b.float()
    rows, cols = np.indices((32, 48))
    mask = cols > rows + 16
    want = want + torch.as_tensor(np.where(mask, -100.0, 0.0), dtype=torch.float32)
    lo = np.repeat(np.arange(2) * 16, 16)[:, None]  # each row tile writes columns [m.start, m.end + 16)
    written = (cols >= lo) & (cols < lo + 32)
    torch.testing.assert_close(got[written], want[written], rtol=1e-5, atol=1e-4)
    ir = k.ir("tile")
    assert '"prod' not in ir  # no product tile besides s
    # each row tile's mask is non-zero in its columns 17..31 only (c > r + 16)
    adds = [line for line in ir.splitlines() if 'tile.binary "add"' in line]
    assert len(adds) == 2 and all("16x15x" in line for line in adds), adds  # columns 17..31 of 32


def test_transposes_use_a_dead_score_tile_as_their_scratch():
    """In the flash-attention example P's and K's transposes reuse s1 / s2 (dead at
    that point) instead of accumulator scratch of their own: only Q's transposes (a
    tile of another shape) have one."""
    import re

    k = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    q = torch.randn(1, 96, 16).bfloat16()
    c = k.compile(q, q, q, target="tiny")
    acc = set(re.findall(r'buffer = "(\w+)"\} : memref<(\d+x\d+)xf32, #tile.space<"acc">', c.stages["tile"]))
    assert {shape for name, shape in acc if name.startswith("tr")} == {"16x16"}  # Q's, not [16 x 64] blocks


def test_a_partial_query_tile_transposes_without_reading_unwritten_scratch():
    """Regression: the last query tile of one row (S = 33 on tiny) transposed P's key
    blocks into a scratch tile whose gaps one copy then read (an uninitialised read)."""
    k = tilecc.kernel(KERNELS / "flash_attention.tdsl")
    k.sanitize = True
    q, kk, v = (torch.randn(1, 33, 1).bfloat16() for _ in range(3))
    got = k(q, kk, v)
    want = F.scaled_dot_product_attention(q.float(), kk.float(), v.float(), is_causal=True)
    torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_kernels_keep_the_fastest_schedule_variant(monkeypatch):
    """A kernel is list-scheduled with each variant of `schedule_variants` (slacks and
    priority weights, and the order as written), compiled and simulated; the program
    kept is the fastest."""
    from tilecc.runtime import kernel as api
    from tilecc.simulator.machine import simulate

    q = torch.randn(1, 128, 16).bfloat16()
    variants = api.schedule_variants(api.SEARCH_MIN_OPS)  # the long-block set: every slack
    assert None in variants and len(variants) >= 4
    cycles = {}
    for variant in variants:
        monkeypatch.setattr(api, "schedule_variants", lambda n, v=variant: [v])
        p = tilecc.kernel(KERNELS / "flash_attention.tdsl").compile(q, q, q, target="tiny").program
        cycles[variant] = simulate(p.stream, p.config, None, functional=False, record=False).cycles
    monkeypatch.setattr(api, "schedule_variants", lambda n: variants)
    p = tilecc.kernel(KERNELS / "flash_attention.tdsl").compile(q, q, q, target="tiny").program
    assert simulate(p.stream, p.config, None, functional=False, record=False).cycles == min(cycles.values())
    assert len(set(cycles.values())) > 1  # the variants are different schedules


def test_column_windows_of_on_chip_tiles_read_write_and_accumulate():
    src = """\
kernel win(a: f32[R, C], b: bf16[C, C]) -> (y: f32[R, 2 * C], z: f32[R, 2 * C]):
    for r in tiles(R, 16):
        t = empty(f32[r.size, 2 * C])
        t[:, 0:C] = load(a[r, :]) * 2.0
        t[:, C:2 * C] = load(a[r, :])
        t[:, C:2 * C] += t[:, 0:C]
        y[r, :] = t
        acc = empty(f32[r.size, 2 * C], acc)
        for i in range(2, unroll=True):
            acc[:, i * C:(i + 1) * C] = matmul(bf16(load(a[r, :])), load(b[:, :]))
        acc[:, C:2 * C] += matmul(bf16(load(a[r, :])), load(b[:, :]))
        z[r, :] = acc
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    a, b = torch.randn(20, 8), torch.randn(8, 8).bfloat16()
    y, z = k(a, b)
    torch.testing.assert_close(y, torch.cat([2 * a, 3 * a], 1))
    ab = a.bfloat16().float() @ b.float()
    torch.testing.assert_close(z, torch.cat([ab, 2 * ab], 1), rtol=1e-5, atol=1e-4)
    assert k.ir("tile").count("tile.subview") >= 6


def test_reverse_runs_the_tiles_last_to_first():
    """`reverse=True` unrolls the loop and runs its tiles from the last (the partial edge
    tile) to the first; results are the same."""
    src = """\
kernel rev(x: f32[R, C]) -> f32[R, C]:
    for r in tiles(R, 16{kw}):
        out[r, :] = exp(load(x[r, :]))
"""
    x = np.random.default_rng(6).standard_normal((40, 8)).astype(np.float32)
    fwd, rev = tilecc.kernel(src.format(kw="")), tilecc.kernel(src.format(kw=", reverse=True"))
    rev.sanitize = True
    np.testing.assert_allclose(rev(x), np.exp(x), rtol=1e-6)
    fwd(x)
    import re

    def first_rows(k):  # the row offset of the first load: arith constants are printed in the prologue
        ir = k.ir("tile")
        consts = dict(re.findall(r"(%\w+) = arith.constant(?: \{[^}]*\})? (\d+) : index", ir))
        first = re.search(r"tile.load %\w+\[(%\w+), ", ir)
        return int(consts.get(first.group(1), "-1")) if first else None

    assert "scf.for" not in rev.ir("tile")
    assert first_rows(rev) == 32 and first_rows(fwd) != 32


def test_floor_division_of_compile_time_numbers():
    src = """\
kernel blocks(x: f32[R, C]) -> f32[R, C]:
    NB = (C + 7) // 8
    for r in tiles(R, 16):
        t = empty(f32[r.size, NB * 8])
        t[:, 0:C] = load(x[r, :]) * NB
        out[r, :] = t[:, 0:C]
"""
    k = tilecc.kernel(src)
    x = np.random.default_rng(7).standard_normal((5, 20)).astype(np.float32)
    np.testing.assert_allclose(k(x), 3 * x)
    bad = src.replace("load(x[r, :]) * NB", "load(x[r, :]) // 2.0")
    with pytest.raises(TileccError, match="'//' divides numbers known when the kernel is compiled"):
        tilecc.kernel(bad)(x)


def test_fills_of_different_values_in_one_loop_keep_their_own_constants():
    """Regression: small fills in a loop copy a resident constant tile; a running maximum
    (-1e30) and a running sum (0) of the same shape shared one such tile, so the maximum
    started from 0 (wrong for rows of negative numbers)."""
    src = """\
kernel two(x: f32[R, C]) -> (a: f32[R, 1], b: f32[R, 1]):
    for r in tiles(R, 16):
        mx = full(f32[r.size, 1], -1e30)
        s = zeros(f32[r.size, 1])
        s = s + 1.0
        for c in tiles(C, 16, unroll=True):
            mx = max(mx, max(load(x[r, c])))
            s = s + sum(load(x[r, c]))
        a[r, :] = mx
        b[r, :] = s
"""
    k = tilecc.kernel(src)
    k.sanitize = True
    x = np.random.default_rng(8).standard_normal((20, 40)).astype(np.float32) - 10
    a, b = k(x)
    np.testing.assert_allclose(a, x.max(-1, keepdims=True))
    np.testing.assert_allclose(b, 1 + x.sum(-1, keepdims=True), rtol=1e-5)
