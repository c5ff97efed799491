"""The model zoo: real models as users bring them, from `transformers`, `timm` and
`torchvision` (random weights, small configs; nothing is downloaded).

    tilecc run examples/zoo.py:llama --target tiny
    python benchmarks/zoo.py            # every model: compiled, run, compared, cycles

Each factory returns ``(model, example_inputs)``. `ZOO` lists them with their kind;
`FAST` is the subset the default test profile compiles (tests/test_zoo.py), the rest
run under ``-m slow``. Language models take int64 token ids and return their first
output (logits or the last hidden state); vision models take a small NCHW image.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

# PyPI's torchvision wheel is a CUDA build: skip its C++ op registrations (timm and
# transformers import torchvision)
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

SEQ = 16
VOCAB = 256


class FirstOutput(torch.nn.Module):
    """A `transformers` model called with keyword inputs, returning one tensor."""

    def __init__(self, model: torch.nn.Module, field: str, **fixed):
        super().__init__()
        self.model = model
        self.field = field
        self.fixed = fixed

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        names = ("input_ids",) if len(inputs) == 1 else ("input_ids", "decoder_input_ids")
        kw = dict(zip(names, inputs))
        if self.fixed.get("features"):
            kw = {"input_features": inputs[0]}
        elif self.fixed.get("values"):
            kw = {"input_values": inputs[0]}
        out = self.model(**kw)
        return getattr(out, self.field)


def _quiet():
    from transformers.utils import logging

    logging.set_verbosity_error()


def _ids(batch: int = 1, seq: int = SEQ, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _lm(config_cls: str, model_cls: str, field: str = "logits", **kw) -> tuple[torch.nn.Module, tuple]:
    import transformers

    _quiet()
    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(**kw)
    cfg.use_cache = False
    model = getattr(transformers, model_cls)(cfg).eval()
    return FirstOutput(model, field).eval(), (_ids(vocab=cfg.vocab_size),)


_DEC = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, attn_implementation="eager")


# ---- decoder language models ------------------------------------------------------------

def gpt2():
    return _lm("GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
               n_positions=64, attn_implementation="eager")


def llama():
    return _lm("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2, **_DEC)


def mistral():
    return _lm("MistralConfig", "MistralForCausalLM", num_key_value_heads=2, sliding_window=8, **_DEC)


def qwen2():
    return _lm("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2, **_DEC)


def qwen3():
    return _lm("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=16, **_DEC)


def gemma():
    return _lm("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1, head_dim=16, **_DEC)


def phi3():
    return _lm("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=4, pad_token_id=0, **_DEC)


def opt():
    return _lm("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=64, ffn_dim=128,
               num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
               word_embed_proj_dim=64, attn_implementation="eager")


def gpt_neox():
    return _lm("GPTNeoXConfig", "GPTNeoXForCausalLM", **_DEC)


def mixtral():
    return _lm("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2, num_local_experts=4,
               num_experts_per_tok=2, **_DEC)


# ---- encoders and seq2seq ---------------------------------------------------------------

_ENC = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=64, attn_implementation="eager")


def bert():
    return _lm("BertConfig", "BertModel", field="last_hidden_state", **_ENC)


def roberta():
    return _lm("RobertaConfig", "RobertaModel", field="last_hidden_state", **_ENC)


def albert():
    return _lm("AlbertConfig", "AlbertModel", field="last_hidden_state", embedding_size=32, **_ENC)


def distilbert():
    return _lm("DistilBertConfig", "DistilBertModel", field="last_hidden_state", vocab_size=VOCAB,
               dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64,
               attn_implementation="eager")


def electra():
    return _lm("ElectraConfig", "ElectraModel", field="last_hidden_state", embedding_size=32, **_ENC)


def t5():
    import transformers

    _quiet()
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                num_heads=4, use_cache=False, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    return FirstOutput(model, "logits").eval(), (_ids(), _ids(seq=8, seed=1))


def bart():
    import transformers

    _quiet()
    torch.manual_seed(0)
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                  encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                                  use_cache=False, attn_implementation="eager")
    model = transformers.BartForConditionalGeneration(cfg).eval()
    return FirstOutput(model, "logits").eval(), (_ids(), _ids(seq=8, seed=1))


# ---- audio encoders ---------------------------------------------------------------------

def whisper_encoder():
    import transformers

    _quiet()
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                     encoder_ffn_dim=128, max_source_positions=16, vocab_size=VOCAB,
                                     decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                                     attn_implementation="eager")
    enc = transformers.WhisperModel(cfg).get_encoder().eval()
    feats = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(0))
    return FirstOutput(enc, "last_hidden_state", features=True).eval(), (feats,)


def wav2vec2():
    import transformers

    _quiet()
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2),
                                      conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=4, attn_implementation="eager")
    model = transformers.Wav2Vec2Model(cfg).eval()
    wave = torch.randn(1, 400, generator=torch.Generator().manual_seed(0))
    return FirstOutput(model, "last_hidden_state", values=True).eval(), (wave,)


# ---- convolutional networks -------------------------------------------------------------

def _image(res: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 3, res, res, generator=torch.Generator().manual_seed(seed))


def _randomise_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial running statistics (a fresh model's would hide batch-norm mistakes)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d) and m.running_mean is not None:
                c = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
    return model.eval()


def _tv(name: str, res: int = 32, **kw):
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kw)
    return _randomise_norms(model), (_image(res),)


def _timm(name: str, res: int = 32, **kw):
    import timm

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kw)
    return _randomise_norms(model), (_image(res),)


def resnet18():
    return _tv("resnet18", num_classes=10)


def mobilenet_v2():
    return _tv("mobilenet_v2", num_classes=10, width_mult=0.5)


def mobilenet_v3_small():
    return _tv("mobilenet_v3_small", num_classes=10)


def efficientnet_b0():
    return _tv("efficientnet_b0", num_classes=10)


def squeezenet():
    return _tv("squeezenet1_1", res=48, num_classes=10)


def regnet():
    return _timm("regnety_002", num_classes=10)


def convnext():
    return _timm("convnext_atto", num_classes=10)


def resnet_timm():
    return _timm("resnet10t", num_classes=10)


# ---- vision transformers ----------------------------------------------------------------

def vit():
    return _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=10, depth=2)


def deit():
    return _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, num_classes=10, depth=2)


def swin():
    return _timm("swin_tiny_patch4_window7_224", res=64, img_size=64, window_size=7, embed_dim=32,
                 depths=(1, 1), num_heads=(2, 4), num_classes=10)


def vit_torchvision():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                 hidden_dim=64, mlp_dim=128, num_classes=10)
    with torch.no_grad():  # torchvision zero-initialises the head: every logit would be 0
        torch.nn.init.normal_(model.heads.head.weight, std=0.2)
    return model.eval(), (_image(32),)


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  # decoder, moe, encoder, seq2seq, audio, cnn, vit
    source: str  # transformers, timm, torchvision
    factory: Callable[[], tuple[torch.nn.Module, tuple]]


ZOO: tuple[ZooModel, ...] = (
    ZooModel("gpt2", "decoder", "transformers", gpt2),
    ZooModel("llama", "decoder", "transformers", llama),
    ZooModel("mistral", "decoder", "transformers", mistral),
    ZooModel("qwen2", "decoder", "transformers", qwen2),
    ZooModel("qwen3", "decoder", "transformers", qwen3),
    ZooModel("gemma", "decoder", "transformers", gemma),
    ZooModel("phi3", "decoder", "transformers", phi3),
    ZooModel("opt", "decoder", "transformers", opt),
    ZooModel("gpt_neox", "decoder", "transformers", gpt_neox),
    ZooModel("mixtral", "moe", "transformers", mixtral),
    ZooModel("bert", "encoder", "transformers", bert),
    ZooModel("roberta", "encoder", "transformers", roberta),
    ZooModel("albert", "encoder", "transformers", albert),
    ZooModel("distilbert", "encoder", "transformers", distilbert),
    ZooModel("electra", "encoder", "transformers", electra),
    ZooModel("t5", "seq2seq", "transformers", t5),
    ZooModel("bart", "seq2seq", "transformers", bart),
    ZooModel("whisper_encoder", "audio", "transformers", whisper_encoder),
    ZooModel("wav2vec2", "audio", "transformers", wav2vec2),
    ZooModel("resnet18", "cnn", "torchvision", resnet18),
    ZooModel("mobilenet_v2", "cnn", "torchvision", mobilenet_v2),
    ZooModel("mobilenet_v3_small", "cnn", "torchvision", mobilenet_v3_small),
    ZooModel("efficientnet_b0", "cnn", "torchvision", efficientnet_b0),
    ZooModel("squeezenet", "cnn", "torchvision", squeezenet),
    ZooModel("regnet", "cnn", "timm", regnet),
    ZooModel("convnext", "cnn", "timm", convnext),
    ZooModel("resnet_timm", "cnn", "timm", resnet_timm),
    ZooModel("vit", "vit", "timm", vit),
    ZooModel("deit", "vit", "timm", deit),
    ZooModel("swin", "vit", "timm", swin),
    ZooModel("vit_torchvision", "vit", "torchvision", vit_torchvision),
)

# compiled by the default test profile (half a minute on two cores; tests/test_nn_ops.py
# runs MobileNet v3 and ResNet-18 too); the rest are `slow`
FAST = ("llama", "bert")
