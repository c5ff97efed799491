"""Training steps on the simulator: one chip (forward + backward graphs), data parallelism,
1F1B pipelines; every gradient against eager autograd."""

import copy
import sys
from pathlib import Path

import pytest
import torch

from tilecc.errors import TileccError
from tilecc.runtime.train_step import TrainStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def _llama(batch=2, seq=16, layers=2):
    from llama_tp import build

    return build(hidden=64, heads=4, kv_heads=2, layers=layers, seq=seq, batch=batch)


def _eager_grads(model, ids, loss="mean"):
    ref = copy.deepcopy(model).train()
    out = ref(ids).float()
    (out.mean() if loss == "mean" else out.sum()).backward()
    return {k: p.grad for k, p in ref.named_parameters()}


def test_train_step_one_chip_matches_eager_autograd():
    model, (ids,) = _llama()
    want = _eager_grads(model, ids)
    r = TrainStep(model, loss="mean").run(ids)
    assert set(r.grads) == set(want)
    for k in want:
        torch.testing.assert_close(r.grads[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    assert r.forward_ns > 0 and r.backward_ns > r.forward_ns
    # the backward makes the last layer's gradients first, the embedding's last
    ready = r.grad_ready_ns
    assert ready["model.norm.weight"] < ready["model.layers.1.mlp.down_proj.weight"] \
        < ready["model.layers.0.mlp.down_proj.weight"] < ready["model.embed_tokens.weight"] <= r.backward_ns
    assert all(0 < t <= r.backward_ns for t in ready.values())


def test_train_step_bad_loss_is_a_tilecc_error():
    model, _ = _llama()
    with pytest.raises(TileccError, match="loss='hinge'"):
        TrainStep(model, loss="hinge")
