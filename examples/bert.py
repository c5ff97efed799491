"""BERT from `transformers` (random weights, a small config): token ids -> hidden states.

    tilecc run examples/bert.py:bert --target tiny
    tilecc run examples/bert.py:bert_sdpa --target edge

2 layers, hidden 128, 4 heads, intermediate 512, vocabulary 1000, 64 positions, eager
or sdpa attention; the wrapper returns `.last_hidden_state`. Nothing is downloaded.
The input is int64 token ids (converted to int32 on the device).
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
    from transformers import BertConfig, BertModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = BertConfig(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
        vocab_size=1000, max_position_embeddings=64, attn_implementation=attn,
    )
    model = LastHiddenState(BertModel(cfg, add_pooling_layer=False)).eval().to(dtype)
    ids = torch.randint(0, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(seed))
    return model, (ids,)


def bert():
    return build("eager")


def bert_sdpa():
    return build("sdpa")


def bert_bf16():
    return build("eager", dtype=torch.bfloat16)
