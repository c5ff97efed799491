"""A Llama decoder from `transformers` (random weights, a small config) on several chips
with tensor parallelism: token ids -> hidden states.

    tilecc run examples/llama_tp.py:llama --system ring:4 --tp 4
    tilecc run examples/llama_tp.py:llama --system "switch:8;link=nvlink4" --tp 8 --sp --trace tp8.json
    tilecc run examples/llama_tp.py:llama_pipeline --system ring:2 --pp 2 --micro-batches 4
    tilecc run examples/llama_tp.py:llama_pipeline --system ring:4 --pp 2 --micro-batches 2 --tp 2 --train
    tilecc run examples/llama_tp.py:llama_pipeline --system ring:8 --tp 2 --pp 2 --dp 2 --micro-batches 2

2 layers, hidden 256, 16 attention heads, 8 key / value heads (grouped-query), MLP 512,
vocabulary 1000, 32 tokens, eager attention, `use_cache=False`. Nothing is downloaded. The
automatic plan (tilecc/frontend/tensor_parallel.py) makes q / k / v and gate / up
column-parallel and o / down row-parallel; each chip runs 16/tp query heads and 8/tp key /
value heads. From Python:

    import tilecc
    model, (ids,) = llama()
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:4", parallel={"tp": 4})
    sm(ids); print(sm.report)
"""

import sys
import types

import torch

# a CUDA torchvision wheel next to CPU torch fails on import; transformers imports it
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

SEQ = 32


class LastHiddenState(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


def build(hidden: int = 256, heads: int = 16, kv_heads: int = 8, layers: int = 2, seq: int = SEQ,
          batch: int = 1, seed: int = 0):
    from transformers import LlamaConfig, LlamaModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=1000,
                      max_position_embeddings=max(64, seq), use_cache=False, attn_implementation="eager")
    model = LastHiddenState(LlamaModel(cfg)).eval()
    ids = torch.randint(0, 1000, (batch, seq), generator=torch.Generator().manual_seed(seed))
    return model, (ids,)


def llama():
    return build()


def llama_pipeline():
    """Batch 4, so that `--micro-batches 4` gives one sequence per micro-batch."""
    return build(batch=4, seq=16)
