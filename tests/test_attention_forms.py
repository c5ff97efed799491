"""Attention as models write it (passes/graph/attention.py): the explicit chain
``matmul(q, k^T)``, scale, mask, softmax, ``matmul(p, v)`` becomes one `graph.sdpa` (the
flash kernel), a constant causal mask becomes ``causal``; every form matches eager on the
simulator, and a chain that cannot be rewritten says why in a remark."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import run_and_compare

L, D, H = 24, 16, 2


class Explicit(torch.nn.Module):
    """q, k, v [1, H, L, D] -> attention in one of the forms models write."""

    def __init__(self, form: str, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.form = form
        self.register_buffer("causal", torch.tril(torch.ones(L, L, dtype=torch.bool)).view(1, 1, L, L))
        add = torch.zeros(L, L).masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool)), torch.finfo(dtype).min)
        self.register_buffer("additive", add.to(dtype).view(1, 1, L, L))
        self.register_buffer("bias", (0.1 * torch.arange(L * L, dtype=torch.float32).view(1, 1, L, L) / L).to(dtype))

    def forward(self, q, k, v, pad=None):
        s = torch.matmul(q, k.transpose(-1, -2))
        if self.form == "mul_add_causal":  # Llama / Mistral eager: scale, additive causal mask
            s = s * (1.0 / math.sqrt(D)) + self.additive
        elif self.form == "div_where_causal":  # GPT-2 (older transformers): divide, where(bias, s, min)
            s = s / math.sqrt(D)
            s = torch.where(self.causal, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
        elif self.form == "runtime_mask":  # BERT: an additive padding mask from an input
            s = s / math.sqrt(D) + pad
        elif self.form == "plain":  # no scale, no mask
            pass
        elif self.form == "scale_after_bias":  # (s + bias) * c: the scale multiplies the mask
            s = (s + self.bias) * 0.25
        elif self.form == "fp32_softmax":  # softmax upcast: a cast inside the chain (not rewritten)
            s = torch.softmax((s * 0.25).float(), dim=-1).to(q.dtype)
            return torch.matmul(s, v)
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, v)


def _qkv(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, L, D, generator=g).to(dtype) for _ in range(3))


def _attention_remarks(cm) -> list[tuple[str, str]]:
    return [(r["kind"], r["message"]) for r in cm.program.meta["remarks"]
            if r["pass_name"] == "canonicalize-graph" and "attention" in r["message"]]


@pytest.mark.parametrize("form,causal", [
    ("mul_add_causal", True), ("div_where_causal", True), ("plain", False), ("scale_after_bias", False),
])
def test_explicit_attention_becomes_one_sdpa(form, causal):
    cm = run_and_compare(Explicit(form), _qkv())
    ((kind, msg),) = _attention_remarks(cm)
    assert kind == "passed" and "graph.sdpa" in msg
    assert ("causal" in msg) == causal
    # one kernel for the attention: no softmax kernel is left
    names = [k[0] for k in cm.program.kernels]
    assert not any("softmax" in n for n in names), names


def test_a_runtime_padding_mask_is_sdpa_s_additive_mask():
    q, k, v = _qkv()
    pad = torch.zeros(1, 1, 1, L)
    pad[..., -5:] = torch.finfo(torch.float32).min
    cm = run_and_compare(Explicit("runtime_mask"), (q, k, v, pad))
    ((kind, msg),) = _attention_remarks(cm)
    assert kind == "passed" and "add mask" in msg and "causal" not in msg


def test_bf16_explicit_causal_attention():
    cm = run_and_compare(Explicit("mul_add_causal", torch.bfloat16).to(torch.bfloat16), _qkv(torch.bfloat16))
    ((kind, msg),) = _attention_remarks(cm)
    assert kind == "passed" and "causal" in msg


def test_a_cast_inside_the_chain_is_left_decomposed_with_a_remark():
    cm = run_and_compare(Explicit("fp32_softmax", torch.bfloat16).to(torch.bfloat16), _qkv(torch.bfloat16))
    ((kind, msg),) = _attention_remarks(cm)
    assert kind == "missed" and "cast" in msg


def test_gpt2_eager_attention_runs_as_the_flash_kernel():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import gpt2

    cm = run_and_compare(*gpt2.gpt2())
    remarks = _attention_remarks(cm)
    assert len(remarks) == 2 and all(k == "passed" and "causal" in m for k, m in remarks)


class GroupedQuery(torch.nn.Module):
    """Llama's eager attention: k and v heads repeated over groups of query heads
    (`repeat_kv`: expand + reshape), a [B, 1, 1, S] padding mask or a per-head mask."""

    def __init__(self, n_rep: int, per_head: bool):
        super().__init__()
        self.n_rep, self.per_head = n_rep, per_head

    def forward(self, q, k, v, mask):
        def repeat_kv(x):
            b, h, s, d = x.shape
            return x[:, :, None, :, :].expand(b, h, self.n_rep, s, d).reshape(b, h * self.n_rep, s, d)

        s = torch.matmul(q, repeat_kv(k).transpose(2, 3)) * (D ** -0.5) + mask
        return torch.matmul(torch.softmax(s, dim=-1), repeat_kv(v))


@pytest.mark.parametrize("per_head", [False, True])
def test_grouped_query_attention_broadcasts_k_and_v(per_head):
    g = torch.Generator().manual_seed(3)
    B, KV, n = 2, 2, 3
    q = torch.randn(B, KV * n, L, D, generator=g)
    k, v = (torch.randn(B, KV, L, D, generator=g) for _ in range(2))
    mask = torch.zeros(B, KV * n if per_head else 1, 1, L)
    mask[0, ..., -4:] = torch.finfo(torch.float32).min
    if per_head:
        mask = mask + 0.1 * torch.randn(B, KV * n, 1, L, generator=g)
    cm = run_and_compare(GroupedQuery(n, per_head), (q, k, v, mask))
    ((kind, msg),) = _attention_remarks(cm)
    assert kind == "passed" and f"serves {n} query heads" in msg


class SdpaAfterRepeatKv(torch.nn.Module):
    """Llama's sdpa attention over a static cache: `repeat_kv` (expand + reshape) of k and v,
    then scaled_dot_product_attention with a mask built at run time from the positions
    (``where(key <= query position, 0, min)``, broadcast over heads)."""

    def __init__(self, n_rep: int):
        super().__init__()
        self.n_rep = n_rep

    def forward(self, q, k, v, pos):
        def repeat_kv(x):
            b, h, s, d = x.shape
            return x[:, :, None, :, :].expand(b, h, self.n_rep, s, d).reshape(b, h * self.n_rep, s, d)

        keys = torch.arange(k.shape[-2])
        allowed = keys[None, :] <= pos[:, None]
        mask = torch.where(allowed, 0.0, torch.finfo(q.dtype).min).to(q.dtype)[None, None]
        o = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), attn_mask=mask)
        return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_after_repeat_kv_broadcasts_k_and_v(dtype):
    g = torch.Generator().manual_seed(5)
    B, KV, n, S = 1, 2, 3, L + 2
    q = torch.randn(B, KV * n, L, D, generator=g).to(dtype)
    k, v = (torch.randn(B, KV, S, D, generator=g).to(dtype) for _ in range(2))
    cm = run_and_compare(SdpaAfterRepeatKv(n), (q, k, v, torch.arange(L)))
    msgs = [r["message"] for r in cm.program.meta["remarks"] if r["pass_name"] == "canonicalize-graph"]
    assert any(f"serves {n} query heads" in m for m in msgs), msgs
    kernels = [name for name, _, _ in cm.program.kernels]
    assert not any("copy" in name for name in kernels), kernels  # no repeated k / v materialised


class SdpaWithCausalMask(torch.nn.Module):
    """scaled_dot_product_attention given the causal pattern as an additive attn_mask."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.full((L, L), torch.finfo(torch.float32).min).triu(1))

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def test_sdpa_with_a_constant_causal_mask_becomes_causal():
    cm = run_and_compare(SdpaWithCausalMask(), _qkv())
    ((kind, msg),) = [(r["kind"], r["message"]) for r in cm.program.meta["remarks"]
                      if r["pass_name"] == "canonicalize-graph"]
    assert kind == "passed" and "-> causal" in msg


def test_gpt2_eager_and_sdpa_attention_compile_to_the_same_program():
    """GPT-2's eager attention views q, v and its result 3-D around the matmuls; as sdpa
    those reshape pairs fold (passes/graph/fold_reshapes.py), so the flash kernel reads
    and writes through the same views as the sdpa block's: the same kernels, no copy
    kernel for the result's layout, the same cycles."""
    import sys
    import types

    # a CUDA torchvision wheel next to CPU torch fails on import; transformers imports it
    for m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(m, types.ModuleType(m))
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    from tilecc.runtime.executor import run_program

    S = 32

    class Block(torch.nn.Module):
        def __init__(self, attn: str):
            super().__init__()
            cfg = GPT2Config(n_embd=64, n_head=2, n_layer=1, n_positions=S)
            cfg._attn_implementation = attn
            self.b = GPT2Block(cfg)
            causal = torch.full((S, S), torch.finfo(torch.float32).min).triu(1)
            self.register_buffer("mask", causal.view(1, 1, S, S) if attn == "eager" else None)

        def forward(self, x):
            y = self.b(x, attention_mask=self.mask)
            return y[0] if isinstance(y, tuple) else y

    x = torch.randn(1, S, 64)
    programs = {}
    for attn in ("sdpa", "eager"):
        torch.manual_seed(0)
        cm = run_and_compare(Block(attn), (x,))
        _, rep = run_program(cm.program, (x,), functional=False)
        programs[attn] = (rep.launches, rep.instructions, rep.cycles)
    assert programs["eager"] == programs["sdpa"]
