"""One decode step's grouped-query attention as `transformers` writes it: `repeat_kv`
(the KV heads expanded to their query heads), then sdpa with the additive mask of the
cache positions. tilecc lowers it to the decode-attention kernel (one kernel over every
(batch, KV head) problem, the cache read once per KV head).

    tilecc run examples/gqa_decode.py:llama_1b_step --target cloud

`GqaDecode` is also the module of `benchmarks/decode_attention.py` and the decode
attention tests.
"""

import torch
import torch.nn.functional as F


class GqaDecode(torch.nn.Module):
    """q [B, H, L, D], k / v [B, Hkv, S, D], mask broadcast to [B, H, L, S]."""

    def forward(self, q, k, v, mask):
        b, hkv, s, d = k.shape
        n = q.shape[1] // hkv
        k = k[:, :, None].expand(b, hkv, n, s, d).reshape(b, hkv * n, s, d)
        v = v[:, :, None].expand(b, hkv, n, s, d).reshape(b, hkv * n, s, d)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def step_inputs(batch: int, S: int, kv_heads: int = 8, group: int = 4, head_dim: int = 64,
                dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    """One query row per head over a static cache of S positions, the last one not yet
    written (masked)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, kv_heads * group, 1, head_dim, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, S, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, S, head_dim, generator=g).to(dtype)
    mask = torch.zeros(batch, 1, 1, S, dtype=dtype)
    mask[..., S - 1:] = float("-inf")
    return q, k, v, mask


def llama_1b_step():
    """The Llama-3.2-1B shape (8 KV heads of 4 query heads, head dim 64, bf16) at batch
    1 over a 130-position cache."""
    return GqaDecode().eval(), step_inputs(1, 130)
