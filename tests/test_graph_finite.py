"""`ir/graph_finite.never_infinite`: values finite by construction (the attention kernel
then adds its mask without clamping -inf), checked on imported graphs, and the attention
kernel with such a mask against eager."""

from __future__ import annotations

import torch
from helpers import run_and_compare

from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import graph_index as gi
from tilecc.ir.graph_finite import MASK_FINITE, never_infinite
from tilecc.passes.registry import default_pipeline
from tilecc.passes.session import CompileSession
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import Opcode


def _sdpa_mask_finite(model: torch.nn.Module, inputs: tuple) -> bool:
    """never_infinite of the sdpa's mask as the attention lowering sees it (the graph
    passes ran: folded scalars are constants, the mask a fused group)."""
    gp = import_exported_program(export_model(model, inputs))
    module = gp.module.clone()
    for name, run in default_pipeline(load_config("tiny"), 2, None, CompileSession(), weights=dict(gp.weights)):
        if name == "lower-graph-to-tile":
            break
        run(module)
    (sdpa,) = [op for op in module.walk() if isinstance(op, gi.SdpaOp)]
    assert sdpa.mask is not None
    return MASK_FINITE in sdpa.attributes or never_infinite(sdpa.mask)


class PositionMask(torch.nn.Module):
    """A static cache's mask: ``where(key <= query position, 0, min)`` from a position input."""

    def __init__(self, fill: float):
        super().__init__()
        self.fill = fill

    def forward(self, q, k, v, pos):
        allowed = torch.arange(k.shape[-2])[None, :] <= pos[:, None]
        # as transformers' sdpa_mask writes it: a tensor zero, the fill a Python float
        mask = torch.where(allowed, torch.tensor(0.0, dtype=q.dtype), self.fill)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class InputMask(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _qkv(dtype: torch.dtype, L: int = 20, S: int = 22):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, L, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, S, 16, generator=g).to(dtype) for _ in range(2))
    return q, k, v


class CastPositionMask(torch.nn.Module):
    """The same mask built in fp32 and cast to bf16: bf16's lowest value survives the cast
    (fp32's would overflow to -inf, so that one is not finite)."""

    def __init__(self, fill: float):
        super().__init__()
        self.fill = fill

    def forward(self, q, k, v, pos):
        allowed = torch.arange(k.shape[-2])[None, :] <= pos[:, None]
        mask = torch.where(allowed, 0.0, self.fill).to(q.dtype)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_where_of_finite_constants_is_finite():
    q, k, v = _qkv(torch.float32)
    assert _sdpa_mask_finite(PositionMask(torch.finfo(torch.float32).min), (q, k, v, torch.arange(20)))
    q, k, v = _qkv(torch.bfloat16)
    assert _sdpa_mask_finite(CastPositionMask(torch.finfo(torch.bfloat16).min), (q, k, v, torch.arange(20)))
    assert not _sdpa_mask_finite(CastPositionMask(torch.finfo(torch.float32).min), (q, k, v, torch.arange(20)))


def test_a_minus_inf_branch_or_an_input_mask_is_not():
    q, k, v = _qkv(torch.float32)
    assert not _sdpa_mask_finite(PositionMask(float("-inf")), (q, k, v, torch.arange(20)))
    assert not _sdpa_mask_finite(InputMask(), (q, k, v, torch.zeros(20, 22)))


def test_position_mask_attention_matches_eager_without_the_clamp():
    """The kernel skips the clamp (one vector pass over the mask rows per head and
    q-tile fewer than the same mask given as an input) and still matches eager."""
    q, k, v = _qkv(torch.bfloat16)
    pos = torch.arange(20) + 2
    known = run_and_compare(PositionMask(torch.finfo(torch.bfloat16).min), (q, k, v, pos))
    mask = torch.where(torch.arange(22)[None, :] <= pos[:, None], 0.0, torch.finfo(torch.bfloat16).min)
    given = run_and_compare(InputMask(), (q, k, v, mask.to(torch.bfloat16)))

    def vector(cm) -> int:  # the attention kernel's vector instructions
        prog = cm.program
        op = prog.stream["opcode"]
        vec = (op == Opcode.VEC_UNARY) | (op == Opcode.VEC_BINARY) | (op == Opcode.VEC_REDUCE)
        return sum(int(vec[first:first + n].sum()) for name, first, n in prog.kernels if "attention" in name)

    assert vector(known) < vector(given)
