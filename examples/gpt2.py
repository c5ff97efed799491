"""GPT-2 from `transformers` (random weights, a small config): token ids -> hidden states.

    tilecc run examples/gpt2.py:gpt2 --target tiny
    tilecc run examples/gpt2.py:gpt2_sdpa --target edge

2 layers, hidden 128, 4 heads, vocabulary 1000, 64 positions, `use_cache=False`,
eager or sdpa attention; the wrapper returns `.last_hidden_state`. Nothing is
downloaded. The input is int64 token ids (converted to int32 on the device).
"""

import sys
import types

import torch

# a CUDA torchvision wheel next to CPU torch fails on import; transformers imports it
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

SEQ = 16


class LastHiddenState(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


def build(attn: str = "eager", seq: int = SEQ, dtype: torch.dtype = torch.float32, seed: int = 0):
    from transformers import GPT2Config, GPT2Model
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation=attn,
    )
    model = LastHiddenState(GPT2Model(cfg)).eval().to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(seed))
    return model, (ids,)


def gpt2():
    return build("eager")


def gpt2_sdpa():
    return build("sdpa")


def gpt2_bf16():
    return build("eager", dtype=torch.bfloat16)


def gpt2_small(seq: int = 128):
    """GPT-2 small's shape (12 layers, hidden 768, 12 heads, vocabulary 50,257, 1,024
    positions; random weights) on one 128-token sequence, bf16: the design-space study's
    workload (examples/sweep/gpt2_chips.toml)."""
    from transformers import GPT2Config, GPT2Model
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024, use_cache=False,
                     attn_implementation="sdpa")
    model = LastHiddenState(GPT2Model(cfg)).eval().to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    return model, (ids,)
