"""The -O2 attention kernel (passes/graph_to_tile/attention/) against torch eager sdpa.

Every run goes through `helpers.run_and_compare`: compiled with `tilecc.compile`, run on
the simulator with the sanitisers on (races between engine queues, reads of on-chip
memory never written, out-of-bounds accesses), compared with eager
`F.scaled_dot_product_attention` at `tilecc.runtime.compare.tolerance`. So the semaphores the sync
pass derives from the reordered kernel body are checked on every shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run_and_compare
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tilecc
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.passes.graph_to_tile import attention as la
from tilecc.passes.registry import default_pipeline
from tilecc.passes.session import CompileSession
from tilecc.simulator.config import load_config


class _Sdpa(torch.nn.Module):
    def __init__(self, causal: bool = False, scale: float | None = None):
        super().__init__()
        self.causal, self.scale = causal, scale

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)


class _Masked(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _qkv(batch, heads, L, S, D, Dv, dtype, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    kvh = heads if kv_heads is None else kv_heads
    q = torch.randn(*batch, heads, L, D, generator=g).to(dtype)
    k = torch.randn(*batch, kvh, S, D, generator=g).to(dtype)
    v = torch.randn(*batch, kvh, S, Dv, generator=g).to(dtype)
    return q, k, v


def _kernel_names(cm) -> list[str]:
    return [name for name, _, _ in cm.program.kernels]


# ------------------------------------------------------------------------------- shapes

# tiny: 16 partitions, a 16x16 array: tile +- 1, 1, and head dims above the partitions
SIZES = st.sampled_from([1, 2, 15, 16, 17, 31, 33, 40])
DIMS = st.sampled_from([1, 8, 15, 16, 17, 20, 33])


@settings(max_examples=10, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(L=SIZES, S=SIZES, D=DIMS, Dv=DIMS, heads=st.sampled_from([1, 2, 3]), batch=st.sampled_from([(), (2,)]),
       causal=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_matches_eager_tiny(L, S, D, Dv, heads, batch, causal, dtype):
    q, k, v = _qkv(batch, heads, L, S, D, Dv, dtype)
    cm = run_and_compare(_Sdpa(causal), (q, k, v), "tiny")
    assert any("attention" in n for n in _kernel_names(cm))


@pytest.mark.parametrize(
    "L,S,D,causal,dtype",
    [
        (1, 1, 1, False, torch.float32),  # one query, one key
        (1, 40, 16, True, torch.float32),  # causal, L < S: the one query sees key 0 only
        (40, 3, 8, True, torch.bfloat16),  # causal, L > S: later queries see every key
        (17, 17, 17, True, torch.bfloat16),  # tile + 1 everywhere, D = partitions + 1
        (32, 32, 16, True, torch.bfloat16),  # D = partitions: separate fold and row-sum matmuls
        (48, 50, 48, True, torch.float16),  # D = 3 partitions, fp16 (normal mode only with a mask)
        (64, 64, 16, False, torch.bfloat16),  # even lengths: rows paired per DMA row
    ],
)
def test_edge_sizes(L, S, D, causal, dtype):
    q, k, v = _qkv((), 2, L, S, D, D, dtype, seed=L + S + D)
    run_and_compare(_Sdpa(causal), (q, k, v), "tiny")


@pytest.mark.parametrize(
    "target,L,S,D,causal,dtype",
    [
        ("edge", 70, 70, 40, True, torch.bfloat16),
        ("edge", 33, 64, 32, False, torch.float32),
        ("cloud", 200, 200, 128, True, torch.bfloat16),  # D = 128: the benchmark's layout
        ("cloud", 130, 257, 64, False, torch.bfloat16),
        ("cloud", 96, 96, 64, True, torch.float16),
    ],
)
def test_presets(target, L, S, D, causal, dtype):
    q, k, v = _qkv((1,), 2, L, S, D, D, dtype, seed=D)
    run_and_compare(_Sdpa(causal), (q, k, v), target)


def test_scale_and_value_width():
    q, k, v = _qkv((2,), 2, 20, 23, 12, 5, torch.float32)
    run_and_compare(_Sdpa(scale=0.37), (q, k, v), "tiny")


def test_kv_broadcast_over_heads():
    """k and v with one head serve every query head (loaded once per loop body)."""
    q, k, v = _qkv((2,), 4, 21, 19, 16, 16, torch.bfloat16, kv_heads=1)
    run_and_compare(_Sdpa(True), (q, k, v), "tiny")


def _attention_kernels(cm) -> list[str]:
    return [n for n in _kernel_names(cm) if "attention" in n]


def _lowering_session(model, inputs, target: str) -> CompileSession:
    """The compile session of `model` lowered to tile kernels (the pipeline `tilecc.compile`
    runs, up to lower-graph-to-tile): its caches hold the attention kernels' estimates."""
    module = import_exported_program(export_model(model, inputs)).module.clone()
    session = CompileSession()
    for name, run in default_pipeline(load_config(target), 2, None, session):
        run(module)
        if name == "lower-graph-to-tile":
            break
    return session


def test_heads_in_a_loop_of_bodies():
    """8 heads of 10-12 key-tile pairs on tiny (256 semaphores): bodies of 4 heads
    (the K^T / V sets alternate within a body), a loop of 2 iterations."""
    q, k, v = _qkv((1,), 8, 64, 64, 16, 16, torch.bfloat16)
    cm = run_and_compare(_Sdpa(True), (q, k, v), "tiny")
    assert len(_attention_kernels(cm)) == 1
    # a semaphore per producer, not npu-insert-sync's one-per-queue fallback
    assert len(set(cm.program.stream["signal_sem"].tolist()) - {-1}) > 8


def test_long_causal_sequence_splits_into_kernels():
    """136 pairs per head exceed one body's semaphores on tiny: consecutive q-block
    ranges become kernels of their own, each preparing the K / V blocks it sees."""
    q, k, v = _qkv((1,), 1, 256, 256, 16, 16, torch.bfloat16)
    cm = run_and_compare(_Sdpa(True), (q, k, v), "tiny")
    names = _attention_kernels(cm)
    session = _lowering_session(_Sdpa(True), (q, k, v), "tiny")
    assert len(names) >= 2 and all(la.kernel_estimate(session, n) is not None for n in names)


def test_q_broadcast_over_batch():
    q, _, _ = _qkv((1,), 2, 9, 12, 8, 8, torch.float32)
    _, k, v = _qkv((3,), 2, 9, 12, 8, 8, torch.float32, seed=5)
    run_and_compare(_Sdpa(), (q, k, v), "tiny")


# ---------------------------------------------------------- strided views: GPT-2's q/k/v


class _QkvSplit(torch.nn.Module):
    """GPT-2's attention inputs: q, k, v sliced out of one projected ``[b, s, 3 d]`` tensor
    and viewed as heads (strided HBM views whose heads lie side by side in each row), the
    output permuted back (written through the permute's layout: a strided view too)."""

    def __init__(self, heads: int, causal: bool = True):
        super().__init__()
        self.heads, self.causal = heads, causal

    def forward(self, qkv):
        b, s, d3 = qkv.shape
        d = d3 // 3
        q, k, v = qkv.split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return o.transpose(1, 2).reshape(b, s, d)


class _HeadViews(torch.nn.Module):
    """q, k, v from separate ``[b, n, heads * width]`` tensors (value width Dv), an
    optional additive mask, and k / v of one head broadcast over the query heads."""

    def __init__(self, heads: int, causal: bool = False, kv_heads: int | None = None):
        super().__init__()
        self.heads, self.causal, self.kv_heads = heads, causal, kv_heads or heads

    def forward(self, qi, ki, vi, *mask):
        b, L, _ = qi.shape
        S = ki.shape[1]
        q = qi.view(b, L, self.heads, -1).transpose(1, 2)
        k = ki.view(b, S, self.kv_heads, -1).transpose(1, 2)
        v = vi.view(b, S, self.kv_heads, -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None, is_causal=self.causal)
        return o.transpose(1, 2).reshape(b, L, -1)


def _attention_dmas(cm) -> tuple[np.ndarray, np.ndarray]:
    """The row lengths (elements) of the attention kernels' DMA loads and stores."""
    st = cm.program.stream
    sel = np.zeros(len(st), dtype=bool)
    for name, lo, n in cm.program.kernels:
        if "attention" in name:
            sel[lo:lo + n] = True
    ops = st["opcode"][sel]
    cols = st["cols"][sel]
    return cols[ops == 1], cols[ops == 2]


@settings(max_examples=8, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(heads=st.sampled_from([2, 3, 4, 6]), s=st.sampled_from([1, 9, 16, 33, 40]),
       dh=st.sampled_from([4, 8, 20]), batch=st.sampled_from([1, 2]), causal=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_strided_qkv_views_tiny(heads, s, dh, batch, causal, dtype):
    """q/k/v as GPT-2 slices them out of one projection: the kernel reads them (and writes
    the output) through strided views, loading several heads per DMA where that pays."""
    qkv = torch.randn(batch, s, 3 * heads * dh, generator=torch.Generator().manual_seed(s + dh)).to(dtype)
    cm = run_and_compare(_QkvSplit(heads, causal), (qkv,), "tiny")
    assert _attention_kernels(cm)


def test_strided_views_group_heads_per_dma_cloud():
    """The GPT-2 layout on cloud (12 heads of 64: 128-byte rows per head): q, k and the
    output move several heads per DMA ([T x g 64] blocks, g >= 4: no group of the 12 heads
    reaches the ~4 KiB payload that saturates HBM, so the largest groups are tried), so
    there are far fewer transfers than one per head and tile."""
    heads, s, dh = 12, 256, 64
    qkv = torch.randn(1, s, 3 * heads * dh, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    cm = run_and_compare(_QkvSplit(heads), (qkv,), "cloud")
    loads, stores = _attention_dmas(cm)
    blocks = s // 128
    assert len(stores) < heads * blocks and (stores >= 4 * dh).all() and stores.max() % dh == 0
    assert (loads >= 4 * dh).sum() >= 2 * blocks  # q and k blocks of a head group
    assert len(loads) + len(stores) < 4 * heads * blocks / 1.5  # one per head and tile: 4 * heads * blocks


@pytest.mark.parametrize(
    "target,batch,heads,L,S,D,Dv,causal,dtype,mask_shape,kv_heads",
    [
        ("tiny", 2, 8, 64, 64, 8, 8, True, torch.bfloat16, None, None),  # head groups in a loop of bodies
        ("tiny", 1, 4, 17, 23, 20, 12, False, torch.float32, None, None),  # D > partitions, Dv != D
        ("tiny", 1, 4, 18, 21, 8, 8, False, torch.float32, (1, 4, 1, 21), None),  # a mask per head
        ("tiny", 1, 4, 18, 21, 8, 8, False, torch.float32, (18, 21), None),
        ("tiny", 1, 4, 20, 20, 16, 16, True, torch.bfloat16, None, 1),  # k / v broadcast over heads
        ("tiny", 1, 4, 128, 128, 8, 8, True, torch.bfloat16, None, None),  # causal: kernels of head groups
        ("edge", 1, 4, 70, 70, 16, 16, True, torch.bfloat16, None, None),
        ("edge", 1, 4, 40, 33, 32, 32, False, torch.float16, None, None),
        ("cloud", 1, 4, 200, 200, 32, 32, True, torch.bfloat16, None, None),
    ],
)
def test_strided_head_views(target, batch, heads, L, S, D, Dv, causal, dtype, mask_shape, kv_heads):
    g = torch.Generator().manual_seed(L + S + D)
    kvh = kv_heads or heads
    ins = tuple(torch.randn(batch, n, h * w, generator=g).to(dtype)
                for n, h, w in ((L, heads, D), (S, kvh, D), (S, kvh, Dv)))
    if mask_shape is not None:
        ins += (torch.randn(mask_shape, generator=g).to(dtype),)
    cm = run_and_compare(_HeadViews(heads, causal, kv_heads), ins, target)
    assert _attention_kernels(cm)


def _kt_copies(cm, scale: float) -> list[tuple[int, int]]:
    """(partitions, columns) of each K^T copy of the attention kernels: the vector
    multiplies by the scale that move K's transposes from the accumulator into SRAM."""
    st = cm.program.stream
    out: list[tuple[int, int]] = []
    for name, lo, n in cm.program.kernels:
        if "attention" not in name:
            continue
        s = st[lo:lo + n]
        sel = ((s["opcode"] == 5) & (s["func"] == 2) & ((s["flags"] & 4) != 0) & (s["a_mem"] == 2)
               & np.isclose(s["imm"], scale))
        out += list(zip(s["rows"][sel].tolist(), s["cols"][sel].tolist()))
    return out


def test_packed_kt_two_heads_per_copy_cloud():
    """GPT-2's layout on cloud (12 heads of 64, 128 partitions): two heads' K^T share one
    buffer (rows 0..63 and 64..127), so a K^T copy runs on all 128 lanes where two copies
    on 64 lanes each ran before (a copy's time is set by its columns, not its rows), and
    the key blocks of a head share copies (one per block before). Outputs match eager."""
    heads, s, dh = 12, 256, 64
    qkv = torch.randn(1, s, 3 * heads * dh, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    cm = run_and_compare(_QkvSplit(heads), (qkv,), "cloud")
    copies = _kt_copies(cm, dh ** -0.5)
    assert all(r == 2 * dh for r, _ in copies) and sum(c for _, c in copies) == heads // 2 * s
    assert len(copies) < heads // 2 * (s // 128)


def test_kt_copy_spans_key_blocks_tiny():
    """Head width 8 on tiny (16 partitions): each head's K^T copy covers all four key
    blocks (64 keys) in one instruction, not one copy per block."""
    q, k, v = _qkv((1,), 4, 64, 64, 8, 8, torch.bfloat16, seed=5)
    cm = run_and_compare(_Sdpa(), (q, k, v), "tiny")
    copies = _kt_copies(cm, 8 ** -0.5)
    assert copies and all(c == 64 for _, c in copies)


@pytest.mark.parametrize("grouped", [False, True], ids=["dense", "strided"])
def test_packed_kt_tiny(grouped):
    """Packed K^T on tiny (16 partitions, head width 8): dense heads (separate K loads,
    one transpose each into the two halves of the accumulator) and strided heads (a K
    group block of the 6 heads: one transpose per pair). Causal, 6 heads."""
    heads, s, dh = 6, 40, 8
    if grouped:
        qkv = torch.randn(1, s, 3 * heads * dh, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
        cm = run_and_compare(_QkvSplit(heads), (qkv,), "tiny")
    else:
        q, k, v = _qkv((1,), heads, s, s, dh, dh, torch.bfloat16, seed=4)
        cm = run_and_compare(_Sdpa(True), (q, k, v), "tiny")
    copies = _kt_copies(cm, dh ** -0.5)
    assert copies and all(r == 2 * dh for r, _ in copies)


def test_head_grouping_needs_heads_side_by_side():
    """Heads h and h + 1 of a row are neighbours in GPT-2's views (head stride = width),
    not in a dense ``[b, h, n, d]`` tensor (head stride n * d), unless n == 1."""
    out = (1, 12, 512, 64)
    assert la.heads_adjacent(out, (512 * 2304, 64, 2304, 1), out)
    assert not la.heads_adjacent(out, (12 * 512 * 64, 512 * 64, 64, 1), out)
    assert la.heads_adjacent((1, 12, 1, 64), (768, 64, 64, 1), (1, 12, 1, 64))
    assert not la.heads_adjacent((1, 1, 512, 64), (512 * 64, 64, 64, 1), out)  # one head, broadcast
    assert not la.heads_adjacent(out, (512 * 4608, 128, 4608, 2), out)  # element-strided rows
    cfg, bf16 = load_config("cloud"), torch_to_elem(torch.bfloat16)
    assert la.group_sizes(cfg, out, 64, 64, 2, (True,) * 4) == [6, 12]  # 128-byte rows: no divisor of 12 reaches the 4 KiB saturating payload
    plan = la.plan_attention(cfg, out, out, out, out, True, False, bf16, 1, False, (False, False), (4, 4, 1, 4))
    assert plan.heads == 4 and plan.rowsum_fused and plan.gsets == 2
    plan = la.plan_attention(cfg, out, out, out, out, True, False, bf16, 1, True, (False, False), (4, 4, 4, 4))
    assert not plan.rowsum_fused  # a grouped V has no room for a ones column per head


# -------------------------------------------------------------------------------- masks


@pytest.mark.parametrize("L,S,mask", [(100, 100, True), (104, 96, False), (200, 200, False)],
                         ids=["mask", "paired-partial", "paired-partial-long"])
def test_batched_max_rows_keep_pending_buffers(L, S, mask):
    """D = T (16 on tiny): one copy writes the -m rows of up to 4 q-tiles, so a q-tile's
    pass 2 waits for later q-tiles' pass 1. Those must not overwrite what the waiting pass
    2 reads: the mask rows (a ring of 2) and the S - m buffers of transposed mode (a
    ring of 3; the small last q-tile of a paired sequence runs them). The kernel flushes
    the waiting q-tiles first (it did not: wrong rows, or every row with a mask)."""
    q, k, v = _qkv((1,), 2 if mask else 1, L, S, 16, 16, torch.bfloat16, seed=L)
    if mask:
        m = torch.randn(L, S, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
        run_and_compare(_Masked(), (q, k, v, m), "tiny")
    else:
        run_and_compare(_Sdpa(), (q, k, v), "tiny")


@pytest.mark.parametrize(
    "mask_shape",
    [(18, 21), (2, 1, 1, 21), (2, 3, 18, 21), (1, 18, 1), (3, 1, 21)],
    ids=["LxS", "padding", "full", "column", "heads"],
)
def test_additive_masks(mask_shape):
    torch.manual_seed(3)
    q, k, v = _qkv((2,), 3, 18, 21, 8, 8, torch.float32)
    mask = torch.randn(mask_shape)
    run_and_compare(_Masked(), (q, k, v, mask), "tiny")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_mask_with_minus_inf(dtype):
    """A float mask may hold -inf (torch's ``full(-inf).triu(1)``): added through a matmul
    with an identity it would give 0 * -inf = NaN; the kernel clamps it."""
    q, k, v = _qkv((1,), 2, 20, 20, 8, 8, dtype)
    mask = torch.full((20, 20), float("-inf")).triu(1).to(dtype)
    run_and_compare(_Masked(), (q, k, v, mask), "tiny")


def test_bool_mask_bf16():
    q, k, v = _qkv((1,), 2, 30, 30, 16, 16, torch.bfloat16)
    keep = torch.rand(1, 2, 30, 30, generator=torch.Generator().manual_seed(4)) > 0.4
    keep[..., 0] = True  # every row keeps a key
    run_and_compare(_Masked(), (q, k, v, keep), "tiny")


# ------------------------------------------------------------------------- the kernel


def test_one_kernel_at_o2_and_the_decomposition_at_o0():
    q, k, v = _qkv((1,), 2, 64, 64, 16, 16, torch.bfloat16)
    model = _Sdpa(True)
    expected = model(q, k, v)
    cycles = {}
    for level in (0, 2):
        cm = tilecc.compile(model, (q, k, v), target="tiny", opt_level=level)
        names = _kernel_names(cm)
        if level == 2:
            assert len(names) == 1 and "attention" in names[0], names
        else:
            assert len(names) >= 5 and not any("attention" in n for n in names), names
        torch.testing.assert_close(cm(q, k, v).float(), expected.float(), rtol=2e-2, atol=2e-2)
        cycles[level] = cm.report.cycles
    assert cycles[2] * 3 < cycles[0], cycles


def test_schedule_estimate_is_the_simulated_time():
    """The kernel's schedule is chosen by replaying it with the simulator's timing rules;
    for a kernel of one loop body the replay is the simulated time."""
    q, k, v = _qkv((1,), 2, 50, 45, 24, 24, torch.bfloat16)
    cm = tilecc.compile(_Sdpa(True), (q, k, v), target="tiny")
    (name,) = _kernel_names(cm)
    cm(q, k, v)
    estimate = la.kernel_estimate(_lowering_session(_Sdpa(True), (q, k, v), "tiny"), name)
    assert estimate == pytest.approx(cm.report.cycles, rel=1e-9)


def test_falls_back_to_the_decomposition_when_buffers_do_not_fit():
    """D = 1024 on tiny: Q^T's transposes alone need more accumulator than the 4 KiB per
    partition; the decomposition still compiles (and matches)."""
    assert la.plan_attention(load_config("tiny"), (1, 8, 1024), (1, 8, 1024), (1, 8, 1024), (1, 8, 1024), False, False,
                    torch_to_elem(torch.float32)) is None
    q, k, v = _qkv((), 1, 8, 8, 1024, 1024, torch.float32)
    cm = run_and_compare(_Sdpa(), (q, k, v), "tiny")
    assert not any("attention" in n for n in _kernel_names(cm))


def test_rows_pair_only_in_contiguous_tensors():
    """Pairing views rows as ``[N / 2, 2 D]``: not for a strided HBM view."""
    from xdsl.dialects.builtin import MemRefType, StridedLayoutAttr, f32
    from xdsl.ir import Block

    cfg, bf16 = load_config("tiny"), torch_to_elem(torch.bfloat16)
    shapes = [(1, 64, 8)] * 4
    assert la.plan_attention(cfg, *shapes, False, False, bf16, 2).qseq.f == 2
    plan = la.plan_attention(cfg, *shapes, False, False, bf16, 2, pair_ok=(False, False))
    assert plan.qseq.f == plan.kseq.f == 1
    plain = Block(arg_types=[MemRefType(f32, [64, 8])]).args[0]
    strided = Block(arg_types=[MemRefType(f32, [64, 8], StridedLayoutAttr([32, 1], 0))]).args[0]
    assert la.contiguous(plain) and not la.contiguous(strided)


def torch_to_elem(dtype):
    from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type

    return {torch.float32: Float32Type(), torch.bfloat16: BFloat16Type(), torch.float16: Float16Type()}[dtype]


@pytest.mark.parametrize("L,S,f", [(64, 64, 1), (64, 64, 2), (100, 36, 2), (36, 100, 2), (128, 96, 4), (7, 30, 1)])
def test_causal_tiles_reproduce_tril(L, S, f):
    """The per-tile classification (skipped, full, or one of the mask patterns) put back
    together is exactly torch's top-left aligned ``tril(ones(L, S))``."""
    T = 16
    qseq, kseq = la.Seq(L, f if L % f == 0 else 1, T), la.Seq(S, f if S % f == 0 else 1, T)
    pairs, masks = la.causal_pairs(qseq, kseq, causal=True)
    seen = np.zeros((L, S), dtype=int)
    vis = np.zeros((L, S), dtype=bool)
    ktiles = kseq.tiles()
    for qi, (bq, tq) in enumerate(qseq.tiles()):
        rows = qseq.index(bq, tq, np.arange(qseq.rows(bq)))
        for k, mid in pairs[qi]:
            bk, tk = ktiles[k]
            cols = kseq.index(bk, tk, np.arange(kseq.rows(bk)))
            seen[np.ix_(rows, cols)] += 1
            tile = np.ones((len(rows), len(cols)), bool) if mid is None else masks[mid][: len(rows), : len(cols)]
            vis[np.ix_(rows, cols)] = tile
    tril = np.tril(np.ones((L, S), dtype=bool))
    assert (seen <= 1).all()  # no score computed twice
    assert ((seen == 1) | ~tril).all()  # every visible score computed
    np.testing.assert_array_equal(vis & (seen == 1), tril)


@pytest.mark.parametrize("sep_fold", [False, True])
def test_q_transposes_by_dma_and_batched_max_rows(monkeypatch, sep_fold):
    """bf16: Q^T loads by DMA transposes (the scale in the K^T copies); -m as rows of
    their own (several q-tiles' rows written by one copy) where D leaves a fold row in
    Q^T too, when the search is made to take it. Checked against eager with the
    sanitisers on (the batch defers pass 2 of its q-tiles)."""
    from tilecc.passes.graph_to_tile.attention import entry
    from tilecc.simulator.isa import Opcode

    plan_attention = entry.plan_attention
    chosen = []

    def only(*args, **kw):
        plan = plan_attention(*args, **kw)
        if plan is not None and (plan.fold_row is None) != sep_fold:
            return None
        chosen.append(plan)
        return plan

    monkeypatch.setattr(entry, "plan_attention", only)
    q, k, v = _qkv((1,), 2, 80, 72, 12, 12, torch.bfloat16, seed=5)
    cm = run_and_compare(_Sdpa(True), (q, k, v), "tiny")
    assert chosen and all(p.qdma for p in chosen)
    assert all(p.neg_batch > 1 for p in chosen) == sep_fold
    s = cm.program.stream
    loads = s[s["opcode"] == Opcode.DMA_LOAD]
    assert ((loads["hbm_rs"] == 1) & (loads["hbm_cs"] > 1)).any()  # a transposed view: Q^T


# ------------------------------------------------------------------------ normalisation


class _Gqa(torch.nn.Module):
    """Grouped-query attention as Llama writes it: each k / v head repeated for the
    query heads that share it."""

    def __init__(self, rep: int, causal: bool = True):
        super().__init__()
        self.rep, self.causal = rep, causal

    def forward(self, q, k, v):
        k, v = (t.repeat_interleave(self.rep, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def _batched_reciprocals(cm) -> list[int]:
    """The column counts of the attention kernels' reciprocals of more than one column
    (the row sums of several q-tiles inverted by one instruction)."""
    from tilecc.simulator.isa import Opcode, UnaryFn

    st = cm.program.stream
    out: list[int] = []
    for name, lo, n in cm.program.kernels:
        if "attention" in name:
            s = st[lo:lo + n]
            sel = (s["opcode"] == Opcode.VEC_UNARY) & (s["func"] == UnaryFn.RECIPROCAL) & (s["cols"] > 1)
            out += s["cols"][sel].tolist()
    return out


def _force_rbatch(monkeypatch, rbatch: int) -> list:
    """Make the search take only plans with a separate row sum, their row sums inverted
    `rbatch` q-tiles at a time (without a spare O_aug: the ring comes round soonest),
    and output blocks of several q-tiles (paired q rows, or grouped heads: a batch ends
    at a block's store); the plans taken."""
    from dataclasses import replace

    from tilecc.passes.graph_to_tile.attention import entry, plan

    plan_attention = entry.plan_attention
    chosen = []

    def only(cfg, *args, **kw):
        p = plan_attention(cfg, *args, **kw)
        if p is None or p.rowsum_fused or (p.qseq.f == 1 and p.grp[3] == 1):
            return None
        c = replace(p, rbatch=rbatch, ospare=0)
        if plan.acc_bytes(c) > cfg.accumulator.bytes_per_partition:
            return None
        chosen.append(c)
        return c

    monkeypatch.setattr(entry, "plan_attention", only)
    return chosen


CASES = {  # model, inputs (q, k, v[, mask])
    "causal-paired-bf16": lambda: (_Sdpa(True), _qkv((1,), 3, 80, 80, 16, 16, torch.bfloat16, seed=11)),
    "partial-block-fp32": lambda: (_Sdpa(), _qkv((2,), 2, 44, 29, 8, 16, torch.float32, seed=12)),
    "causal-partial-bf16": lambda: (_Sdpa(True), _qkv((1,), 2, 46, 46, 12, 16, torch.bfloat16, seed=13)),
    "additive-mask": lambda: (_Masked(), (*_qkv((2,), 3, 36, 21, 8, 16, torch.float32, seed=14),
                                          torch.randn(2, 3, 36, 21, generator=torch.Generator().manual_seed(1)))),
    "bool-mask": lambda: (_Masked(), (*_qkv((1,), 2, 40, 33, 16, 16, torch.bfloat16, seed=15),
                                      torch.rand(40, 33, generator=torch.Generator().manual_seed(2)) > 0.3)),
    "gqa": lambda: (_Gqa(2), (torch.randn(1, 4, 50, 16).to(torch.bfloat16),
                              torch.randn(1, 2, 50, 16).to(torch.bfloat16),
                              torch.randn(1, 2, 50, 16).to(torch.bfloat16))),
}


@pytest.mark.parametrize("rbatch", [2, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_row_sums_of_several_q_tiles_share_a_reciprocal(monkeypatch, case, rbatch):
    """A separate row sum (Dv = T on tiny, or taken by force) lands in a column of a
    batch accumulator; one reciprocal inverts the row sums of `rbatch` q-tiles and each
    output is a column multiply, its O_aug held until then. Nothing may overtake the
    waiting outputs: another q-tile's pass 2 into a held O_aug, a short last q-tile in
    the batch, the store of their output block (the batch ends there). Against eager,
    sanitisers on."""
    chosen = _force_rbatch(monkeypatch, rbatch)
    torch.manual_seed(0)
    model, ins = CASES[case]()
    cm = run_and_compare(model, ins, "tiny")
    assert chosen and _batched_reciprocals(cm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_sum_batches_span_heads_of_a_group(monkeypatch, dtype):
    """GPT-2's strided views on tiny: a grouped V (its row sum a matmul of its own) and
    grouped output blocks, stored once the group's last head wrote them: a reciprocal
    batch spans q-tiles of several heads and ends at the group's store."""
    chosen = _force_rbatch(monkeypatch, 4)
    heads, s, dh = 4, 40, 8
    qkv = torch.randn(1, s, 3 * heads * dh, generator=torch.Generator().manual_seed(9)).to(dtype)
    cm = run_and_compare(_QkvSplit(heads), (qkv,), "tiny")
    assert chosen and _batched_reciprocals(cm)
    assert any(max(p.grp) > 1 for p in chosen)


def test_row_sum_batches_chosen_on_cloud():
    """The search keeps a reciprocal batch where its schedule is faster: causal bf16 at
    head width 128 (the row sum is a matmul of its own; 1.4 % fewer cycles on cloud when
    added, 146,894 -> 144,775 for one head of 2,048)."""
    cfg, bf16 = load_config("cloud"), torch_to_elem(torch.bfloat16)
    shape = (1, 1, 2048, 128)
    p = la.plan_attention(cfg, shape, shape, shape, shape, True, False, bf16, 2, True)
    from tilecc.passes.graph_to_tile.attention.plan import acc_bytes, rbatch_plans

    plans = rbatch_plans(p, cfg)
    assert plans and all(x.rbatch > 1 and acc_bytes(x) <= cfg.accumulator.bytes_per_partition for x in plans)
    fused = la.plan_attention(load_config("cloud"), (1, 2, 256, 64), (1, 2, 256, 64), (1, 2, 256, 64),
                              (1, 2, 256, 64), True, False, bf16, 1)
    assert fused.rowsum_fused and not rbatch_plans(fused, cfg)  # the row sum is in each O_aug


# ------------------------------------------------------------------ grouped-query heads


@pytest.mark.parametrize("dtype,causal,L", [(torch.bfloat16, True, 128), (torch.float32, False, 100),
                                            (torch.bfloat16, False, 97)])
def test_kv_heads_prepared_once_for_their_query_heads(dtype, causal, L):
    """Grouped-query attention whose heads do not fit one body (tiny: 64 pairs a body,
    one head of 128 causal queries has 36): the first body of a KV head's query heads
    prepares K^T / V_aug, the loop of the others reads them. Checked against eager with
    the sanitisers on (the next KV head's body overwrites what the loop read); each KV
    head's K^T is copied out once (bf16: the copies carry the scale)."""
    g = torch.Generator().manual_seed(L)
    batch, heads, kv_heads, D = 2, 4, 2, 8
    q = torch.randn(batch, heads, L, D, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, L, D, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, L, D, generator=g).to(dtype)
    cm = run_and_compare(_Gqa(heads // kv_heads, causal), (q, k, v), "tiny")
    assert _attention_kernels(cm)
    if dtype == torch.bfloat16:
        copies = _kt_copies(cm, D ** -0.5)
        assert sum(c for _, c in copies) == batch * kv_heads * L  # not once per query head


@pytest.mark.parametrize("L,causal,dtype,mask", [(128, True, torch.bfloat16, False), (100, False, torch.float32, True)],
                         ids=["causal-bf16", "mask-fp32"])
def test_kv_broadcast_over_strided_heads_across_bodies(L, causal, dtype, mask):
    """One K / V head for four query heads read through strided views (q and the output
    may move several heads per DMA), more pairs than a body holds: the first body
    prepares K^T / V_aug, the loop of the others reads them. Against eager."""
    g = torch.Generator().manual_seed(L)
    heads, D = 4, 8
    ins = tuple(torch.randn(1, L, h * D, generator=g).to(dtype) for h in (heads, 1, 1))
    if mask:
        ins += (torch.randn(L, L, generator=g).to(dtype),)
    cm = run_and_compare(_HeadViews(heads, causal, 1), ins, "tiny")
    assert _attention_kernels(cm)


# ---------------------------------------------------------------- exp groups across q-tiles


XCASES = {  # bf16, D = T = 16: a -m row of its own, one copy for 4 q-tiles
    "causal": lambda: (_Sdpa(True), _qkv((1,), 2, 96, 96, 16, 16, torch.bfloat16, seed=21)),
    "partial-block": lambda: (_Sdpa(), _qkv((1,), 2, 44, 29, 16, 16, torch.bfloat16, seed=22)),
    "additive-mask": lambda: (_Masked(), (*_qkv((1,), 2, 36, 21, 16, 16, torch.bfloat16, seed=23),
                                          torch.randn(1, 2, 36, 21, generator=torch.Generator().manual_seed(3))
                                          .to(torch.bfloat16))),
    "bool-mask": lambda: (_Masked(), (*_qkv((1,), 2, 40, 33, 16, 16, torch.bfloat16, seed=24),
                                      torch.rand(40, 33, generator=torch.Generator().manual_seed(4)) > 0.3)),
    "gqa": lambda: (_Gqa(2), (torch.randn(1, 4, 50, 16).to(torch.bfloat16),
                              torch.randn(1, 2, 50, 16).to(torch.bfloat16),
                              torch.randn(1, 2, 50, 16).to(torch.bfloat16))),
}


@pytest.mark.parametrize("rbatch", [1, 2])
@pytest.mark.parametrize("case", list(XCASES))
def test_exp_groups_span_the_q_tiles_of_a_max_batch(monkeypatch, case, rbatch):
    """D = T (16 on tiny): one copy writes the -m rows of 4 q-tiles, whose pass 2 then
    runs together; with `xgroup` an exp group may hold the last key tiles of one q-tile
    and the first of the next (each tile's S^T from its own Q^T, -m row and mask rows;
    each q-tile's output after its last PV, in a reciprocal batch too). Against eager,
    sanitisers on; never more exps than with groups per q-tile (fewer for the causal
    case: 1..6 key tiles per q-tile, or 2..6 paired)."""
    from dataclasses import replace

    from tilecc.passes.graph_to_tile.attention import entry
    from tilecc.simulator.isa import Opcode, UnaryFn

    plan_attention = entry.plan_attention
    chosen = []

    def exps(xgroup: bool) -> int:
        def only(*args, **kw):
            p = plan_attention(*args, **kw)
            if p is None or p.neg_batch == 1 or (rbatch > 1 and p.qseq.f == 1):
                return None
            p = replace(p, xgroup=xgroup, rbatch=rbatch, ospare=0)
            chosen.append(p)
            return p

        monkeypatch.setattr(entry, "plan_attention", only)
        model, ins = XCASES[case]()
        cm = run_and_compare(model, ins, "tiny")
        s = cm.program.stream
        return int(((s["opcode"] == Opcode.VEC_UNARY) & (s["func"] == UnaryFn.EXP)).sum())

    spanning, per_q_tile = exps(True), exps(False)
    assert chosen and all(p.neg_batch > 1 and not p.rowsum_fused for p in chosen)
    assert spanning < per_q_tile if case == "causal" else spanning <= per_q_tile
