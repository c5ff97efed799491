"""Training with tensor parallelism (runtime/tp_train.py): every chip's forward and backward
simulated, the all-reduces run on real data over the links; the loss and every gradient
(gathered from the chips' pieces) against eager autograd."""

import copy

import pytest
import torch

from tests.helpers import assert_grads_equal, eager_train_step, small_llama


def test_tp2_llama_step_equals_eager_and_times_its_all_reduces():
    import tilecc

    model, (ids,) = small_llama()
    want_loss, want = eager_train_step(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:2", parallel={"tp": 2})
    r = sm.train(ids)
    assert r is sm.train_result
    torch.testing.assert_close(r.loss, want_loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(r.grads, want)
    # each chip holds its piece of a sharded weight: rows of q (column-parallel), columns of o
    q, o = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    assert r.chip_grads[1][q].shape == (32, 64) and r.chip_grads[1][o].shape == (64, 32)
    torch.testing.assert_close(r.chip_grads[1][o], want[o][:, 32:], rtol=1e-4, atol=1e-5)
    # Megatron: an all-reduce after each row-parallel linear in the forward (o, down), one of the
    # column-parallel inputs' gradients in the backward (q/k/v's, gate/up's), each [2, 8, 64] fp32
    assert [(c.phase, c.op) for c in r.collectives] == [("forward", "all_reduce")] * 2 + \
        [("backward", "all_reduce")] * 2
    assert all(c.bytes == 2 * 8 * 64 * 4 and c.time_ns > 0 for c in r.collectives)
    # bulk-synchronous: the step is compute + every collective, all exposed
    assert r.tp_comm_ns == pytest.approx(sum(c.time_ns for c in r.collectives))
    assert r.step_ns == pytest.approx(r.forward_ns + r.backward_ns) == pytest.approx(r.compute_ns + r.tp_comm_ns)
    assert r.exposed_ns == r.comm_ns and r.hidden_share == 0.0
    # the backward makes the last layer's gradients first, the embedding's last
    ready = r.grad_ready_ns
    assert ready["model.norm.weight"] < ready["model.layers.0.mlp.down_proj.weight"] \
        < ready["model.layers.0.self_attn.q_proj.weight"] < ready["model.embed_tokens.weight"] <= r.backward_ns
    assert "tensor parallel x2" in str(r)
    # the same compiled system still runs inference
    with torch.no_grad():
        torch.testing.assert_close(sm(ids), model.eval()(ids), rtol=1e-4, atol=1e-4)


def test_tp2_gpt2_fused_qkv_and_row_bias_gradients_equal_eager():
    """GPT-2's Conv1D layers: the fused q / k / v projection's pieces are per block (q, k and
    v of each chip's heads), the row-parallel bias is added once after the sum; the loss a
    cross-entropy of the hidden states against class ids (`target=` reaches the last segment)."""
    import gpt2

    from tilecc.frontend.tensor_parallel import ShardingError
    from tilecc.runtime.tp_train import TensorParallelTrainer
    from tilecc.simulator.interconnect.system import load_system

    model, (ids,) = gpt2.build("eager", seq=8)
    model.model.h = model.model.h[:1]  # one block: the same layers, fewer segments to compile
    with pytest.raises(ShardingError, match=r"model.drop: dropout p=0.1: .* set p=0"):
        TensorParallelTrainer(model, (ids,), load_system("ring:2;chip=tiny"), tp=2)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    target = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    ref = copy.deepcopy(model).train()
    want_loss = torch.nn.functional.cross_entropy(ref(ids).float().flatten(0, -2), target.flatten())
    want_loss.backward()
    want = {k: p.grad for k, p in ref.named_parameters()}
    tr = TensorParallelTrainer(model, (ids,), load_system("ring:2;chip=tiny"), tp=2, loss="cross_entropy")
    r = tr.step((ids,), target=target)
    torch.testing.assert_close(r.loss, want_loss.detach(), rtol=1e-5, atol=1e-5)
    assert_grads_equal(r.grads, want)


def test_training_refuses_what_the_all_reduce_plan_does_not_cover():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from tilecc.frontend.tensor_parallel import ShardingError, auto_plan
    from tilecc.runtime.tp_train import TensorParallelTrainer
    from tilecc.simulator.interconnect.system import load_system

    model, (ids,) = small_llama()
    system = load_system("ring:2;chip=tiny")
    with pytest.raises(ShardingError, match=r"self_attn: training with tensor parallelism runs Megatron's "
                                            r"all-reduce plan .* the style PrepareModuleInput is not supported"):
        TensorParallelTrainer(model, (ids,), system, tp=2, plan=auto_plan(model, sp=True))
    plan = {"model.layers.0.mlp.up_proj": ColwiseParallel(output_layouts=Replicate()),
            "model.layers.0.mlp.down_proj": RowwiseParallel()}
    with pytest.raises(ShardingError, match=r"up_proj: .* a Replicate\(\) output \(an all-gather after it\)"):
        TensorParallelTrainer(model, (ids,), system, tp=2, plan=plan)
    with pytest.raises(ShardingError, match=r"tp x dp = 2 x 1 = 2 must equal the system's 4 chips"):
        TensorParallelTrainer(model, (ids,), load_system("ring:4"), tp=2)


def test_unshard_inverts_the_split_of_every_kind_of_piece():
    from tilecc.frontend.tensor_parallel import ShardSpec, unshard

    w = torch.arange(4 * 12.0).reshape(4, 12)
    assert torch.equal(unshard(list(w.chunk(2, 0)), ShardSpec("w", 0)), w)
    assert torch.equal(unshard(list(w.chunk(3, 1)), ShardSpec("w", 1)), w)
    # fused q / k / v: each chip keeps its part of each of the 3 blocks
    pieces = [w.reshape(4, 3, 4).chunk(2, 2)[r].reshape(4, 6) for r in range(2)]
    assert torch.equal(unshard(pieces, ShardSpec("w", 1, 3)), w)
    assert unshard([w, w], ShardSpec("w")) is w
