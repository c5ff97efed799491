"""Shared test helpers: compile a model, run it on the simulator, compare with eager."""

from __future__ import annotations

import torch

import tilecc
from tilecc.runtime.compare import tolerance


class LastHidden(torch.nn.Module):
    """A `transformers` base model with its last hidden state as the one output."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


def load_example(name: str, module_name: str):
    """The module `examples/<name>`, loaded from its file under `module_name`."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / name
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_and_compare(model: torch.nn.Module, inputs: tuple, target: str = "tiny"):
    """Compile, run on the simulator, and assert the outputs match torch eager."""
    model = model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    cm = tilecc.compile(model, inputs, target=target)
    cm.sanitize = True  # every end-to-end run is checked for races and uninitialised reads
    got = cm(*inputs)
    exp_list = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got_list = list(got) if isinstance(got, tuple) else [got]
    assert len(got_list) == len(exp_list)
    for g, e in zip(got_list, exp_list):
        assert g.shape == e.shape and g.dtype == e.dtype
        rtol, atol = tolerance(e.dtype, float(e.float().abs().max()) if e.numel() else 1.0)
        torch.testing.assert_close(g.float(), e.float(), rtol=rtol, atol=atol)
    return cm


def random_batch_norm(c: int) -> torch.nn.BatchNorm2d:
    """A BatchNorm2d over `c` channels with random running statistics and affine terms
    (a fresh one is the identity in eval mode, which would hide a wrong fold)."""
    bn = torch.nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    return bn


def gpt2_block(embd: int, heads: int, **config) -> torch.nn.Module:
    """One `transformers` GPT-2 block (sdpa attention) as an eval module of the hidden
    states (its first output alone); `config`: more `GPT2Config` fields."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    conf = GPT2Config(n_embd=embd, n_head=heads, n_layer=1, **config)
    conf._attn_implementation = "sdpa"

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b = GPT2Block(conf)

        def forward(self, h):
            y = self.b(h)
            return y[0] if isinstance(y, tuple) else y

    return Block().eval()


def small_llama(batch: int = 2, seq: int = 8, layers: int = 1):
    """The `examples/llama_tp.py` decoder at hidden 64, 4 heads, 2 KV heads: (model, (ids,))."""
    import sys
    from pathlib import Path

    examples = str(Path(__file__).resolve().parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from llama_tp import build

    return build(hidden=64, heads=4, kv_heads=2, layers=layers, seq=seq, batch=batch)


def eager_train_step(model: torch.nn.Module, ids: torch.Tensor, loss: str = "mean"):
    """Eager autograd on a copy of `model` (train mode), the loss the output's mean or
    sum: (the loss, {parameter name: gradient})."""
    import copy

    ref = copy.deepcopy(model).train()
    out = ref(ids).float()
    value = out.mean() if loss == "mean" else out.sum()
    value.backward()
    return value.detach(), {k: p.grad for k, p in ref.named_parameters()}


def assert_grads_equal(got: dict, want: dict) -> None:
    """The same parameters, each gradient equal within the training tests' tolerance."""
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
