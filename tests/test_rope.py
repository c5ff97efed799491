"""Rotary position embedding: recognised as `graph.rope` (passes/graph/rope.py) and lowered
to one kernel over the projection's rows (passes/graph_to_tile/rope/), against eager."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Region

import tilecc
from tilecc.ir import graph as g
from tilecc.ir.graph_interp import run_graph
from tilecc.ir.graph_rope import RopeOp
from tilecc.passes import remarks
from tilecc.simulator.isa import DType, Opcode

# test_graph_ir's print / parse round trip of every op: x [4, 6] rotated by itself
ROPE_BUILDERS = {"graph.rope": lambda x: RopeOp.make(x, x, x, loc="rope.py:1")}


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    h = t.shape[-1] // 2
    return torch.cat((-t[..., h:], t[..., :h]), dim=-1)


class QK(torch.nn.Module):
    """HF Llama's attention prologue: q and k projections viewed [B, S, H, D], transposed,
    rotated by cos / sin [B, S, D] unsqueezed over heads."""

    def __init__(self, heads: int, kv_heads: int, d: int):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, d

    def forward(self, q, k, cos, sin):
        B, S, _ = q.shape
        q = q.view(B, S, self.h, self.d).transpose(1, 2)
        k = k.view(B, S, self.kv, self.d).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, (k * c) + (rotate_half(k) * s)


def _compile(model, args):
    cm = tilecc.compile(model, args, target="tiny", cache=False)
    assert cm.program is not None
    return cm, [remarks.Remark.from_dict(d) for d in cm.program.meta["remarks"]]


def _kernels(cm) -> list[str]:
    """Kernel kinds launched (a re-launch of a shared kernel, ``rope#1``, as ``rope``)."""
    return [name.split("_", 1)[1].split("#")[0] for name, _, _ in cm.program.kernels]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    B=st.integers(1, 2), S=st.integers(1, 140), kv=st.integers(1, 3), group=st.integers(1, 3),
    D=st.sampled_from([2, 8, 16, 64]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_rope_matches_eager(B, S, kv, group, D, dtype, seed):
    H = kv * group
    gen = torch.Generator().manual_seed(seed)
    args = (torch.randn(B, S, H * D, generator=gen).to(dtype), torch.randn(B, S, kv * D, generator=gen).to(dtype),
            torch.randn(B, S, D, generator=gen).to(dtype), torch.randn(B, S, D, generator=gen).to(dtype))
    model = QK(H, kv, D)
    cm, rs = _compile(model, args)
    got, want = cm(*args), model(*args)
    for a, b in zip(got, want):
        # each step rounds as eager's op by op: equal, not just close
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    names = _kernels(cm)
    assert names.count("rope") == 2, names
    assert not any(n in ("neg", "concat") for n in names), names
    assert sum("-> graph.rope" in r.message for r in rs) == 2


def test_rope_kernel_reads_each_tile_of_rows_once():
    """S = 300 on tiny: the q kernel's x loads are one DMA per tile of positions (all heads),
    and cos / sin load once per tile, not once per head."""
    B, S, H, D = 1, 300, 4, 16
    args = (torch.randn(B, S, H * D), torch.randn(B, S, H * D), torch.randn(B, S, D), torch.randn(B, S, D))
    cm, rs = _compile(QK(H, H, D), args)
    torch.testing.assert_close(cm(*args), QK(H, H, D)(*args), rtol=0, atol=0)
    msg = [r.message for r in rs if "rope over" in r.message]
    # q and k have one shape: one kernel, launched twice (passes/graph_to_tile/sharing.py)
    assert len(msg) == 1 and "one DMA" in msg[0] and "once per tile for every head" in msg[0], msg
    assert _kernels(cm).count("rope") == 2


def test_decode_rope_puts_heads_on_the_rows():
    """One position (decode): the tile is [heads x D] with the position's cos / sin row
    broadcast to every head, five vector instructions in all instead of four per head."""
    B, S, H, KV, D = 1, 1, 8, 2, 16
    args = (torch.randn(B, S, H * D), torch.randn(B, S, KV * D), torch.randn(B, S, D), torch.randn(B, S, D))
    cm, rs = _compile(QK(H, KV, D), args)
    torch.testing.assert_close(cm(*args), QK(H, KV, D)(*args), rtol=0, atol=0)
    msg = [r.message for r in rs if "rope over" in r.message]
    assert len(msg) == 2 and all("one position x" in m and "heads on the rows" in m for m in msg), msg
    prog = cm.program
    assert prog is not None
    ropes = [(first, count) for name, first, count in prog.kernels if name.endswith("_rope")]
    assert len(ropes) == 2
    for first, count in ropes:
        ops = [Opcode(int(o)).name for o in prog.stream["opcode"][first:first + count]]
        assert sum(o.startswith("VEC_") for o in ops) == 5, ops


def test_decode_rope_of_several_sequences_is_one_tile_of_them():
    """One position for each of 6 sequences (a batched decode step), each with its own
    cos / sin row: the sequences are the rows of one tile (x one DMA at its batch
    stride, cos and sin one each, one store), not a tile and four DMAs per sequence;
    equal to eager."""
    B, S, H, KV, D = 6, 1, 8, 2, 16
    gen = torch.Generator().manual_seed(11)
    args = (torch.randn(B, S, H * D, generator=gen), torch.randn(B, S, KV * D, generator=gen),
            torch.randn(B, S, D, generator=gen), torch.randn(B, S, D, generator=gen))
    cm, rs = _compile(QK(H, KV, D), args)
    for a, b in zip(cm(*args), QK(H, KV, D)(*args)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    msg = [r.message for r in rs if "rope over" in r.message]
    assert len(msg) == 2 and all("[B 1, S 6," in m and "tiles 6 positions" in m for m in msg), msg
    prog = cm.program
    assert prog is not None
    for name, first, count in prog.kernels:
        if name.endswith("_rope"):
            engines = prog.stream["opcode"][first:first + count]
            dmas = sum(Opcode(int(o)).name.startswith("DMA_") for o in engines)
            assert dmas == 4, (name, dmas)


class NearMiss(torch.nn.Module):
    """Rotary-looking chains that are not `x * cos + rotate_half(x) * sin`."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x, cos, sin):
        q = x.view(1, x.shape[1], 2, 8).transpose(1, 2)
        if self.kind == "sub":
            return q * cos - rotate_half(q) * sin
        return q * cos + torch.cat((-q[..., 6:], q[..., :6]), dim=-1) * sin


@pytest.mark.parametrize(("kind", "why"), [("sub", "graph.sub"), ("split", "not the two halves")])
def test_near_miss_is_left_decomposed_with_a_remark(kind, why):
    args = (torch.randn(1, 5, 16), torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8))
    cm, rs = _compile(NearMiss(kind), args)
    torch.testing.assert_close(cm(*args), NearMiss(kind)(*args))
    assert "rope" not in _kernels(cm)
    assert any(r.kind == "missed" and "rotate_half left decomposed" in r.message and why in r.message
               for r in rs), [str(r) for r in rs]


@pytest.mark.parametrize("cos_shape", [(1, 1, 6, 8), (6, 8), (1, 3, 6, 8), (1, 1, 1, 8)])
def test_rope_reference_and_broadcasts(cos_shape):
    """The op's reference (run_graph) is eager's rotary embedding for every broadcast of
    cos / sin: shared by heads, rank 2, per head, one row for all positions; the compiled
    kernel (per-head tables and broadcast rows included) matches it."""
    x = torch.randn(1, 3, 6, 8)
    cos, sin = torch.randn(*cos_shape), torch.randn(*cos_shape)

    class R(torch.nn.Module):
        def forward(self, x, cos, sin):
            return x * cos + rotate_half(x) * sin

    want = R()(x, cos, sin)
    types = [g.tensor_type(t.shape, DType.F32) for t in (x, cos, sin)]
    block = Block(arg_types=types)
    op = RopeOp.make(*block.args)
    block.add_op(op)
    block.add_op(func.ReturnOp(op.result))
    fn = func.FuncOp("forward", (types, [op.result.type]), Region(block))
    prog = g.GraphProgram(ModuleOp([fn]), {}, ["x", "cos", "sin"], ["y"])
    (ref,) = run_graph(prog, [x.numpy(), cos.numpy(), sin.numpy()])
    torch.testing.assert_close(torch.from_numpy(ref), want)
    cm, _ = _compile(R(), (x, cos, sin))
    assert "rope" in _kernels(cm)
    torch.testing.assert_close(cm(x, cos, sin), want, rtol=0, atol=0)


def test_shared_cos_runs_over_many_heads_per_instruction():
    """cos / sin shared by the heads (the Llama form): x * cos runs over several heads per
    vector instruction (cos replicated side by side) and the add over the chunk, so a
    tile takes fewer than four instructions a head; the result still equals eager's."""
    B, S, H, D = 1, 40, 8, 16
    args = (torch.randn(B, S, H * D).bfloat16(), torch.randn(B, S, H * D).bfloat16(),
            torch.randn(B, S, D).bfloat16(), torch.randn(B, S, D).bfloat16())
    cm, rs = _compile(QK(H, H, D), args)
    for a, b in zip(cm(*args), QK(H, H, D)(*args)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    msg = [r.message for r in rs if "rope over" in r.message]
    assert len(msg) == 1 and "x * cos over" in msg[0], msg
    prog = cm.program
    assert prog is not None
    first, count = next((f, c) for name, f, c in prog.kernels if name.endswith("_rope"))
    ops = [Opcode(int(o)).name for o in prog.stream["opcode"][first:first + count]]
    tiles = -(-S // prog.config.sram.partitions)  # tiles of positions, one per partition row
    assert sum(o.startswith("VEC_") for o in ops) < 4 * H * tiles, ops


class ProjRope(torch.nn.Module):
    """Llama's attention prologue from the hidden rows: the input RMS norm, q / k / v
    projections (merged into one matmul by merge-linears, the norm its prologue), q and
    k rotated."""

    def __init__(self, width: int, heads: int, kv_heads: int, d: int):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, d
        self.w = torch.nn.Parameter(torch.rand(width) + 0.5)
        self.q = torch.nn.Linear(width, heads * d, bias=False)
        self.k = torch.nn.Linear(width, kv_heads * d, bias=False)
        self.v = torch.nn.Linear(width, kv_heads * d, bias=False)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        h = x.float()
        x = self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        q = self.q(x).view(B, S, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(B, S, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(B, S, self.kv, self.d).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v


@pytest.mark.parametrize(("S", "H", "KV", "D"), [(40, 4, 2, 16), (70, 6, 3, 8)])
def test_rope_in_the_projection_evacuation_matches_eager(S, H, KV, D):
    """The rotation of q and k runs where the projection's accumulator tiles are
    evacuated (rope/epilogue.py): no rope kernel, q / k / v as eager's within the
    projection's bf16 rounding."""
    torch.manual_seed(0)
    model = ProjRope(32, H, KV, D).to(torch.bfloat16).eval()
    args = (torch.randn(1, S, 32).bfloat16(), torch.randn(1, S, D).bfloat16(), torch.randn(1, S, D).bfloat16())
    cm, rs = _compile(model, args)
    names = _kernels(cm)
    assert "rope" not in names and names.count("fused_matmul") + names.count("matmul") == 1, names
    assert any("applied as the projection's accumulator tiles are evacuated" in r.message for r in rs)
    with torch.no_grad():
        want = model(*args)
    for a, b in zip(cm(*args), want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


class ProjRopeTwoTables(ProjRope):
    """k rotated by other cos / sin than q."""

    def forward(self, x, cos, sin, cos_k, sin_k):
        q, _, v = super().forward(x, cos, sin)
        B, S, _ = x.shape
        h = x.float()
        xn = self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        k = self.k(xn).view(B, S, self.kv, self.d).transpose(1, 2)
        c, s = cos_k.unsqueeze(1), sin_k.unsqueeze(1)
        return q, k * c + rotate_half(k) * s, v


def test_rope_in_the_evacuation_needs_one_cos_sin_pair():
    """q and k rotated by different tables: the ropes stay kernels of their own (a
    remark says why) and the results still equal eager's."""
    torch.manual_seed(0)
    S, H, KV, D = 24, 4, 2, 16
    model = ProjRopeTwoTables(32, H, KV, D).to(torch.bfloat16).eval()
    args = (torch.randn(1, S, 32).bfloat16(), *(torch.randn(1, S, D).bfloat16() for _ in range(4)))
    cm, rs = _compile(model, args)
    assert _kernels(cm).count("rope") == 2, _kernels(cm)
    assert any("stay kernels of their own: the ropes read different cos / sin" in r.message for r in rs)
    with torch.no_grad():
        want = model(*args)
    for a, b in zip(cm(*args), want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
