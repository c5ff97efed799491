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


def test_data_parallel_2_gradients_equal_eager_and_buckets_overlap_the_backward():
    import tilecc

    model, (ids,) = _llama(batch=4)
    want = _eager_grads(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:2", parallel={"dp": 2})
    r = sm.train(ids, loss="mean")
    for k in want:
        torch.testing.assert_close(r.grads[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    # one bucket per decoder layer and per other module, in the order the backward makes them
    names = [b.name for b in r.buckets]
    assert names.index("model.layers.1") < names.index("model.layers.0") < names.index("model.embed_tokens")
    assert [b.ready_ns for b in r.buckets] == sorted(b.ready_ns for b in r.buckets)
    fwd, step = r.forward_ns, r.step_ns
    for prev, b in zip([None] + r.buckets[:-1], r.buckets):  # one stream, each from its ready time
        assert b.start_ns == pytest.approx(max(fwd + b.ready_ns, prev.end_ns if prev else 0.0))
        assert b.comm_ns > 0
    assert step == pytest.approx(max(fwd + r.backward_ns, r.buckets[-1].end_ns))
    # the layers' all-reduces run under the rest of the backward; the embedding's, made
    # last, cannot
    assert r.buckets[0].end_ns < fwd + r.backward_ns
    assert 0.0 < r.hidden_share < 1.0 and r.exposed_ns == pytest.approx(r.buckets[-1].comm_ns, rel=0.5)


def test_parallel_spec_errors_name_key_and_value():
    import tilecc
    from tilecc.frontend.tensor_parallel import ShardingError

    model, (ids,) = _llama(batch=4)
    with pytest.raises(ShardingError, match=r"'dp' = 3 must divide the batch; input 0 has batch 4"):
        tilecc.compile(model, (ids,), system="ring:3", parallel={"dp": 3})
    with pytest.raises(ShardingError, match=r"tp x pp x dp = 2 x 1 x 2 = 4 must equal the system's 8 chips"):
        tilecc.compile(model, (ids,), system="ring:8", parallel={"tp": 2, "dp": 2})
    with pytest.raises(ShardingError, match=r"'dp' must be a whole number >= 1, got 0"):
        tilecc.compile(model, (ids,), system="ring:2", parallel={"dp": 0})
    sm = tilecc.compile(model, (ids,), system="ring:2", parallel={"dp": 2})
    with pytest.raises(TileccError, match="call sm.train"):
        sm(ids)


def test_1f1b_timeline_matches_the_hand_computed_case():
    from tilecc.runtime.one_f_one_b import one_f_one_b, stage_order

    assert stage_order(0, 2, 4) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert stage_order(1, 2, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    ops, total = one_f_one_b([1, 1], [1, 1], 4)
    got = {(o.stage, o.kind, o.micro): (o.start_ns, o.end_ns) for o in ops}
    # by hand: stage 1 runs F0 B0 F1 B1 ... back to back from t=1; stage 0 waits for each B
    assert [got[(0, k, m)] for k, m in stage_order(0, 2, 4)] == \
        [(0, 1), (1, 2), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (9, 10)]
    assert [got[(1, k, m)] for k, m in stage_order(1, 2, 4)] == \
        [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9)]
    assert total == 10 == (4 + 2 - 1) * (1 + 1)  # (M + P - 1)(F + B)
    # with transfers: activations take 0.5, gradients 0.25, backward 2 (worked by hand)
    _, total = one_f_one_b([1, 1], [2, 2], 4, [0.5], [0.25])
    assert total == 16.5
    _, total = one_f_one_b([1] * 4, [2] * 4, 8)
    assert total == (8 + 4 - 1) * 3


def test_parallel_step_time_parts_sum_to_the_step():
    from tilecc.frontend.tensor_parallel import ShardingError
    from tilecc.runtime.data_parallel import Bucket
    from tilecc.runtime.group_collective import group_collective
    from tilecc.runtime.parallel_step import ChipGrid, StageCost, parallel_step_time
    from tilecc.simulator.interconnect.system import load_system

    system = load_system("fattree:k=4,levels=2;chip=tiny")
    grid = ChipGrid(tp=2, pp=2, dp=4)
    stages = [StageCost(100e3, 200e3, 4, 4, [Bucket(f"l{j}", [], 1 << 20, (j + 1) * 100e3) for j in range(2)])
              for _ in range(2)]
    t = parallel_step_time(stages, 8, system, grid, 64 << 10)
    parts = t.compute_ns + t.tp_comm_ns + t.bubble_ns + t.pp_comm_ns + t.dp_comm_ns
    assert parts == pytest.approx(t.step_ns)
    assert t.compute_ns == 8 * 300e3 and t.tp_comm_ns == pytest.approx(8 * 8 * t.t_tp_ns)
    # the bubble is the 1F1B's (P - 1)(F + B) for equal stages
    assert t.bubble_ns == pytest.approx((2 - 1) * (300e3 + 8 * t.t_tp_ns))
    # the DP groups are the 4 replicas of one (stage, TP rank): stride tp x pp
    assert grid.dp_groups()[1].tolist() == [1, 5, 9, 13]
    one = group_collective("all_reduce", 1 << 20, system, grid.dp_groups())
    assert t.buckets[0][0].comm_ns == one.time_ns
    assert 0 <= t.dp_comm_ns <= t.dp_total_ns
    with pytest.raises(ShardingError, match=r"tp x pp x dp = 2 x 2 x 2 = 8 must equal the system's 16 chips"):
        parallel_step_time(stages, 8, system, ChipGrid(2, 2, 2), 1024)


def test_group_collective_of_one_group_equals_the_system_collective():
    import numpy as np

    from tilecc.runtime.group_collective import group_collective
    from tilecc.simulator.interconnect.collective import run_collective
    from tilecc.simulator.interconnect.system import load_system

    system = load_system("ring:8")
    for algo in ("ring", "halving_doubling"):
        g = group_collective("all_reduce", 1 << 20, system, np.arange(8)[None, :], algorithm=algo, itemsize=4)
        want = run_collective("all_reduce", 1 << 20, system.topology, system.link, algorithm=algo, mode="contention",
                              itemsize=4)
        assert g.time_ns == pytest.approx(want.time_ns)
    # two groups of 4 on the ring's halves share no link with each other: as one alone
    both = group_collective("all_reduce", 1 << 20, system, [[0, 1, 2, 3], [4, 5, 6, 7]], algorithm="ring")
    one = group_collective("all_reduce", 1 << 20, system, [[0, 1, 2, 3]], algorithm="ring")
    assert both.time_ns == pytest.approx(one.time_ns)


def test_pipeline_1f1b_pp2_gradients_equal_eager():
    import tilecc

    model, (ids,) = _llama(batch=2)
    want = _eager_grads(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:2", parallel={"pp": 2, "micro_batches": 2})
    r = sm.train(ids)
    assert set(r.grads) == set(want)
    for k in want:
        torch.testing.assert_close(r.grads[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
    # the timeline is the 1F1B schedule of the simulated stage times
    from tilecc.runtime.one_f_one_b import one_f_one_b

    _, total = one_f_one_b(r.fwd_ns, r.bwd_ns, 2, r.send_ns, r.grad_send_ns)
    assert r.step_ns == total and all(t > 0 for t in r.fwd_ns + r.bwd_ns + r.send_ns + r.grad_send_ns)
    assert r.bubble_ns > 0 and r.exposed_comm_ns > 0


def test_cli_dp_error_is_one_line(capsys):
    from tilecc.cli import main

    assert main(["run", "examples/llama_tp.py:llama_pipeline", "--system", "ring:3", "--dp", "3"]) == 2
    assert "parallel: 'dp' = 3 must divide the batch; input 0 has batch 4" in capsys.readouterr().err


def test_tp2_x_pp2_outputs_equal_eager():
    import tilecc

    model, (ids,) = _llama(batch=2)
    model.eval()
    with torch.no_grad():
        want = model(ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:4", parallel={"tp": 2, "pp": 2, "micro_batches": 2})
    got = sm(ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # every chip ran: a stage's two TP ranks and the two stages; all-reduces inside the stages
    rep = sm.report
    assert all(c.busy_us > 0 for c in rep.chips)
    ops = {c["op"] for c in rep.collectives}
    assert ops == {"all_reduce", "send_recv"}
    assert 0 < rep.time_us
