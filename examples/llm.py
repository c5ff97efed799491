"""Tiny causal LMs from `transformers` (random weights, nothing downloaded) for
`tilecc generate`, and a mid-size Llama for the serving figures on `cloud`.

    tilecc generate examples/llm.py:tiny_llama --prompt-len 8 --new-tokens 8
    tilecc generate examples/llm.py:tiny_gpt2 --prompt-len 8 --new-tokens 8 --batch 2
    tilecc generate examples/llm.py:llama_mid --prompt-len 128 --new-tokens 4 --batch 8 \\
        --target cloud --weights bf16 --timing-only

Each factory returns the model (eval mode, fp32). The tiny ones have 2 layers, hidden
64, 4 heads (2 KV heads where the family has grouped-query attention), vocabulary 256.
"""

import sys
import types

import torch

# a CUDA torchvision wheel next to CPU torch fails on import; transformers imports it
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _build(config_cls, model_cls, seed: int = 0, **cfg):
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    return model_cls(config_cls(**cfg)).eval()


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return _build(LlamaConfig, LlamaForCausalLM, **TINY)


def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _build(Qwen2Config, Qwen2ForCausalLM, **TINY)


def tiny_mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return _build(MistralConfig, MistralForCausalLM, sliding_window=None, **TINY)


def tiny_gemma():
    from transformers import GemmaConfig, GemmaForCausalLM

    return _build(GemmaConfig, GemmaForCausalLM, head_dim=16, **TINY)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return _build(GPT2Config, GPT2LMHeadModel, vocab_size=256, n_embd=64, n_layer=2, n_head=4,
                  n_positions=256, bos_token_id=0, eos_token_id=0)


def llama_mid():
    """A mid-size Llama: 4 layers, hidden 1024, 16 heads, 4 KV heads, MLP 4096,
    vocabulary 32,000 (about 0.13 B parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _build(LlamaConfig, LlamaForCausalLM, vocab_size=32000, hidden_size=1024, intermediate_size=4096,
                  num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                  max_position_embeddings=4096, tie_word_embeddings=True)
