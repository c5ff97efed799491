"""Mixture-of-experts layers end to end: a tiny Mixtral / Qwen2-MoE from `transformers`
(random weights; its default experts implementation, "batched_mm" on CPU, gathers
each token's expert weights and runs bmm: no scatter) and a hand-written MoE layer
(router, softmax, topk, renormalise, per-expert SwiGLU combined by a one-hot weighted
sum), compiled, run on the simulator and compared with eager.

The routing itself is checked too: the top-k expert indices must equal eager's
exactly (a wrong index would change the output by a whole expert).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import run_and_compare

import tilecc
from tilecc.errors import TileccError
from tilecc.frontend.torch_export import supported_targets

# a CUDA torchvision wheel next to CPU torch fails on import; transformers imports it
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))


class Logits(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids).logits


def mixtral(experts_implementation: str | None = None, seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    from transformers import MixtralConfig, MixtralForCausalLM

    kw = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
    cfg = MixtralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        use_cache=False, attn_implementation="sdpa", **kw,
    )
    torch.manual_seed(seed)
    model = Logits(MixtralForCausalLM(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(seed))
    return model, (ids,)


def qwen2_moe(experts_implementation: str | None = None, seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, max_position_embeddings=64,
        use_cache=False, attn_implementation="sdpa",
        **({} if experts_implementation is None else {"experts_implementation": experts_implementation}),
    )
    torch.manual_seed(seed)
    model = Logits(Qwen2MoeForCausalLM(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(seed))
    return model, (ids,)


def _kernel_names(cm: tilecc.CompiledModel) -> list[str]:
    return [name.split("_", 1)[1] for name, _, _ in cm.program.kernels]


def test_mixtral_batched_experts_logits_match_eager():
    """experts_implementation="batched_mm": topk routing, each token's expert weights
    gathered, bmm; no scatter."""
    model, inputs = mixtral("batched_mm")
    cm = run_and_compare(model, inputs, "tiny")
    assert "topk" in _kernel_names(cm)
    assert cm.report.roofline_ratio >= 1.0  # the intrinsic work stays a lower bound


def test_mixtral_bf16_on_edge():
    model, inputs = mixtral("batched_mm")
    run_and_compare(model.to(torch.bfloat16), inputs, "edge")


_GROUPED_NEEDS = (torch.ops.aten.div.Tensor_mode, torch.ops.aten.index_put.default)


@pytest.mark.skipif(
    not all(op in supported_targets() for op in _GROUPED_NEEDS),
    reason="transformers' default grouped experts need aten.div.Tensor_mode (floor) and aten.index_put "
    "(inv_perm[perm] = arange), imported by other op families",
)
def test_mixtral_default_grouped_experts_logits_match_eager():
    """The default experts implementation ("grouped_mm"): sort the (token, expert) pairs
    by expert, histc + cumsum the group offsets, transformers' grouped_mm_fallback per
    group, un-permute with index_put."""
    model, inputs = mixtral()
    run_and_compare(model, inputs, "tiny")


def test_qwen2_moe_batched_experts_logits_match_eager():
    """Qwen2-MoE: 8 experts, top-2 without renormalisation, a sigmoid-gated shared expert."""
    model, inputs = qwen2_moe("batched_mm")
    run_and_compare(model, inputs, "tiny")


class GroupedMM(torch.nn.Module):
    """The grouped experts' offsets and matmuls: routing ids sorted, histc per expert,
    cumsum to offsets, transformers' grouped_mm_fallback."""

    def __init__(self, experts: int = 4, k_in: int = 8, n_out: int = 6):
        super().__init__()
        self.experts = experts
        self.weight = torch.nn.Parameter(torch.randn(experts, k_in, n_out))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids_sorted, perm = torch.sort(ids)
        counts = torch.histc(ids_sorted.float(), bins=self.experts, min=0, max=self.experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        return torch.ops.transformers.grouped_mm_fallback(x[perm], self.weight, offs=offsets), offsets


@pytest.mark.parametrize("ids", [[3, 0, 1, 3, 0, 0, 2, 3, 1, 0], [1, 1, 1, 1, 1, 1, 2, 2, 2, 2]])
def test_transformers_grouped_mm_with_histc_offsets(ids):
    import transformers.integrations.moe  # noqa: F401  (registers the custom op)

    torch.manual_seed(0)
    model = GroupedMM()
    run_and_compare(model, (torch.randn(len(ids), 8), torch.tensor(ids)), "tiny")


def test_mixtral_eager_experts_say_which_implementation_exports():
    """The eager experts loop picks tokens per expert with data-dependent shapes."""
    model, inputs = mixtral("eager")
    with pytest.raises(TileccError, match="experts_implementation"):
        tilecc.compile(model, inputs, target="tiny")


class HandMoE(torch.nn.Module):
    """A Mixtral-style sparse MoE block written by hand: router linear, softmax, top-k,
    renormalise, every expert's SwiGLU MLP on every token, combined with a one-hot
    weighted sum (no scatter)."""

    def __init__(self, hidden: int = 32, inter: int = 48, experts: int = 4, k: int = 2):
        super().__init__()
        self.k, self.experts = k, experts
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate = torch.nn.Parameter(torch.randn(experts, hidden, inter) / hidden**0.5)
        self.up = torch.nn.Parameter(torch.randn(experts, hidden, inter) / hidden**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, inter, hidden) / inter**0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, h = x.shape
        t = x.reshape(b * s, h)
        probs = torch.softmax(self.router(t), dim=-1)
        w, idx = torch.topk(probs, self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        # [T, E]: each token's weight for each expert (0 where not routed)
        combine = (F.one_hot(idx, self.experts).to(x.dtype) * w.unsqueeze(-1)).sum(1)
        hs = torch.einsum("th,ehi->eti", t, self.gate)
        us = torch.einsum("th,ehi->eti", t, self.up)
        ys = torch.einsum("eti,eih->eth", F.silu(hs) * us, self.down)  # [E, T, H]
        out = (ys * combine.t().unsqueeze(-1)).sum(0)
        return out.reshape(b, s, h), idx


@pytest.mark.parametrize("k", [1, 2])
def test_hand_written_moe_layer(k):
    torch.manual_seed(k)
    model = HandMoE(k=k)
    x = torch.randn(1, 12, 32)
    run_and_compare(model, (x,), "tiny")


def test_uninitialised_tensors_fold_to_zeros():
    """The grouped experts' ``inv_perm = torch.empty_like(perm)``: torch leaves the values
    unspecified (whatever memory held, often outside int32); folded as zeros, so the
    program is deterministic and its integer constants fit the device's int32."""

    class M(torch.nn.Module):
        def forward(self, x):
            junk = torch.empty(3, 4, dtype=torch.int64)
            return x + junk.to(torch.float32) + torch.empty_like(x)

    x = torch.randn(3, 4)
    cm = tilecc.compile(M(), (x,), target="tiny")
    torch.testing.assert_close(cm(x), x, rtol=0, atol=0)
