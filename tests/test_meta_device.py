"""Models on the `meta` device (ir/meta_weights.py): no weight values, compiled and
simulated in timing-only mode, with the cycles of the same model with its weights."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tilecc
from tests.helpers import run_and_compare
from tilecc.errors import TimingOnlyError
from tilecc.ir.meta_weights import MetaWeight

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import gpt2  # noqa: E402  (stubs torchvision for transformers)


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, use_cache=False).logits


def _llama(device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        return Logits(LlamaForCausalLM(cfg).to(torch.bfloat16)).eval()  # bf16: a cast of the rotary table


@pytest.fixture(scope="module")
def llama():
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    meta = tilecc.compile(_llama("meta"), (ids,), target="tiny", cache=False)
    real = run_and_compare(_llama("cpu"), (ids,))  # the same model with weights, against eager
    return meta, real, ids


def test_a_meta_llama_simulates_with_the_real_models_cycles(llama):
    meta, real, ids = llama
    assert meta.timing_only and not real.timing_only
    assert meta.program.meta["timing_only"] is True
    assert not meta.program.weight_data or set(meta.program.weight_data) < {w.name for w in meta.program.weights}
    report = meta.simulate(ids)
    assert report.cycles == real.report.cycles > 0
    # inputs on the meta device too: only shapes and dtypes matter
    assert meta.simulate(torch.empty(1, 16, dtype=torch.long, device="meta")).cycles == report.cycles
    assert meta.program.stream.tobytes() == real.program.stream.tobytes()
    assert any("shared by 2 launches" in r["message"] for r in meta.program.meta["remarks"])


def test_a_timing_only_model_says_what_to_call_instead(llama, tmp_path):
    meta, _real, ids = llama
    with pytest.raises(TimingOnlyError, match=r"meta device.*simulate"):
        meta(ids)
    with pytest.raises(TimingOnlyError, match="cannot be saved"):
        meta.save(tmp_path / "m.tilecc")
    with pytest.raises(Exception, match="shape"):
        meta.simulate(torch.zeros(1, 8, dtype=torch.long))


def test_a_meta_weight_has_no_values():
    w = MetaWeight((3, 4), np.dtype(np.float32))
    assert (w.size, w.nbytes, w.reshape(-1).shape, w.astype(np.int32).dtype) == (12, 48, (12,), np.int32)
    with pytest.raises(TimingOnlyError, match="no values"):
        np.asarray(w)


def test_a_meta_gpt2_folds_its_layer_norms_without_values():
    model, (ids,) = gpt2.build("sdpa")
    with torch.device("meta"):
        meta_model, _ = gpt2.build("sdpa")
    meta = tilecc.compile(meta_model, (ids,), target="tiny", cache=False)
    real = tilecc.compile(model, (ids,), target="tiny", cache=False)
    assert meta.timing_only
    assert meta.program.stream.tobytes() == real.program.stream.tobytes()
    assert meta.simulate(ids).cycles == real.simulate(ids).cycles
