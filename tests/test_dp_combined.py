"""Data parallelism combined with tensor or pipeline parallelism on real data
(runtime/tp_pipeline_run.py's chip grid, runtime/tp_train.py, runtime/pipeline_train.py):
inference outputs and training gradients against eager."""

import pytest
import torch

import tilecc
from tests.helpers import assert_grads_equal, eager_train_step, small_llama
from tilecc.frontend.tensor_parallel import ShardingError


def test_dp2_x_tp2_inference_and_training_equal_eager():
    model, (ids,) = small_llama(batch=2)
    want_loss, want = eager_train_step(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:4", parallel={"dp": 2, "tp": 2})
    with torch.no_grad():
        torch.testing.assert_close(sm(ids), model.eval()(ids), rtol=1e-4, atol=1e-4)
    rep = sm.report
    assert all(c.busy_us > 0 for c in rep.chips)  # both replicas' two TP ranks ran
    assert {c["op"] for c in rep.collectives} == {"all_reduce"} and rep.extra["dp"] == 2
    r = sm.train(ids)
    torch.testing.assert_close(r.loss, want_loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(r.grads, want)  # the replicas' mean over their halves of the batch: the whole batch's
    assert r.dp == 2 and r.tp == 2
    # the TP all-reduces of both replicas at once (chips 0-1 and 2-3), all exposed; the replicas'
    # gradient all-reduce in buckets from their ready times, one stream (data_parallel.overlap)
    assert len(r.collectives) == 4 and r.tp_comm_ns > 0
    names = [b.name for b in r.buckets]
    assert names.index("model.layers.0") < names.index("model.embed_tokens")
    for prev, b in zip([None] + r.buckets[:-1], r.buckets):
        assert b.start_ns == pytest.approx(max(r.forward_ns + b.ready_ns, prev.end_ns if prev else 0.0))
        assert b.comm_ns > 0
    assert r.step_ns == pytest.approx(max(r.forward_ns + r.backward_ns, r.buckets[-1].end_ns))
    # (absolute tolerance: with the gradient all-reduce hidden, step - forward - backward is 0
    # up to the float rounding of the sum it came from)
    assert r.dp_exposed_ns == pytest.approx(r.step_ns - r.forward_ns - r.backward_ns, abs=1e-6)
    assert r.exposed_ns == pytest.approx(r.tp_comm_ns + r.dp_exposed_ns) and 0.0 < r.hidden_share < 1.0
    assert "data parallel x2" in str(r)


def test_dp2_x_pp2_inference_and_training_equal_eager():
    model, (ids,) = small_llama(batch=4, seq=8, layers=2)
    want_loss, want = eager_train_step(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:4",
                        parallel={"dp": 2, "pp": 2, "micro_batches": 2})
    with torch.no_grad():
        torch.testing.assert_close(sm(ids), model.eval()(ids), rtol=1e-4, atol=1e-4)
    assert all(c.busy_us > 0 for c in sm.report.chips)
    assert {c["op"] for c in sm.report.collectives} == {"send_recv"}
    r = sm.train(ids)
    torch.testing.assert_close(r.loss, want_loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(r.grads, want)
    # each stage's buckets from its last backward; the step ends after the last stage's last bucket
    assert r.dp == 2 and len(r.buckets) == 2 and all(b.comm_ns > 0 for bs in r.buckets for b in bs)
    stage0 = {b.name for b in r.buckets[0]}
    assert "model.embed_tokens" in stage0 and "model.layers.0" in stage0 and "model.norm" not in stage0
    pipeline_end = max(o.end_ns for o in r.ops)
    assert r.step_ns >= pipeline_end and r.dp_exposed_ns == pytest.approx(r.step_ns - pipeline_end, abs=1e-6)
    assert r.dp_comm_ns > 0 and "data parallel x2" in str(r)


def test_tp2_x_pp2_x_dp2_inference_equals_eager():
    model, (ids,) = small_llama(batch=4, seq=8, layers=2)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:8",
                        parallel={"tp": 2, "pp": 2, "dp": 2, "micro_batches": 2})
    with torch.no_grad():
        want = model.eval()(ids)
        torch.testing.assert_close(sm(ids), want, rtol=1e-4, atol=1e-4)
    rep = sm.report
    assert rep.extra == {"tp": 2, "pp": 2, "dp": 2, "micro_batches": 2}
    # every chip ran: chip = (replica x 2 + stage) x 2 + TP rank, a stage's ranks the same stream
    busy = [c.busy_us for c in rep.chips]
    assert all(b > 0 for b in busy) and busy[0] == busy[1] and busy[:4] == busy[4:]
    assert {c["op"] for c in rep.collectives} == {"all_reduce", "send_recv"}
    # both replicas' TP all-reduces and sends share the ring: each replica alone is no slower
    alone = tilecc.compile(model, (ids[:2],), target="tiny", system="ring:4",
                           parallel={"tp": 2, "pp": 2, "micro_batches": 2})
    with torch.no_grad():
        torch.testing.assert_close(alone(ids[:2]), want[:2], rtol=1e-4, atol=1e-4)
    assert sm.timeline.total_ns >= alone.timeline.total_ns * (1 - 1e-9)
    assert 0 < sm.timeline.exposed_comm_ns < sm.timeline.total_ns


def _check_tp_pipeline_step(r, want_loss, want, dp):
    torch.testing.assert_close(r.loss, want_loss, rtol=1e-5, atol=1e-6)
    assert_grads_equal(r.grads, want)  # the micro-batches' (and replicas') mean: the whole batch's
    assert (r.tp, r.pp, r.dp, r.micro_batches) == (2, 2, dp, 2)
    # per micro-batch and layer 2 TP all-reduces forward, 2 backward; each stage's on its own group
    assert [c.phase for c in r.collectives].count("forward") == 8 and len(r.collectives) == 16
    assert len(r.ops) == 2 * 2 * 2 and r.send_ns[0] > 0 and r.grad_send_ns[0] > 0
    busiest = max(2 * (f + b) for f, b in zip(r.stage_fwd_ns, r.stage_bwd_ns))
    pipeline_end = max(o.end_ns for o in r.ops)
    assert busiest < pipeline_end <= r.step_ns
    # communication (TP all-reduces inside the stages, the sends) adds to the compute's schedule
    assert 0 < r.pipeline_free_ns < pipeline_end and r.exposed_ns == pytest.approx(r.step_ns - r.pipeline_free_ns)
    assert "pipeline stages (1F1B, 2 micro-batches)" in str(r)
    return pipeline_end


def test_tp2_x_pp2_training_equals_eager():
    model, (ids,) = small_llama(batch=4, seq=8, layers=2)
    want_loss, want = eager_train_step(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:4", parallel={"tp": 2, "pp": 2, "micro_batches": 2})
    r = sm.train(ids)
    end = _check_tp_pipeline_step(r, want_loss, want, 1)
    assert r.step_ns == end and r.dp_comm_ns == 0 and not r.buckets


@pytest.mark.slow  # ~13 s; tp x pp training and dp x pp training stay in the default profile
def test_tp2_x_pp2_x_dp2_training_equals_eager():
    model, (ids,) = small_llama(batch=4, seq=8, layers=2)
    want_loss, want = eager_train_step(model, ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:8",
                        parallel={"tp": 2, "pp": 2, "dp": 2, "micro_batches": 2})
    r = sm.train(ids)
    end = _check_tp_pipeline_step(r, want_loss, want, 2)
    # each stage's TP pieces all-reduced over the replicas from its last backward
    assert len(r.stage_buckets) == 2 and all(b.comm_ns > 0 for bs in r.stage_buckets for b in bs)
    stage0 = {b.name for b in r.stage_buckets[0]}
    assert "model.embed_tokens" in stage0 and "model.layers.0" in stage0 and "model.norm" not in stage0
    assert r.dp_comm_ns > 0 and r.dp_exposed_ns == pytest.approx(r.step_ns - end, abs=1e-6)
    assert "x data parallel x2" in str(r)


def test_combination_errors_name_key_value_and_rule(capsys):
    model, (ids,) = small_llama(batch=4)
    with pytest.raises(ShardingError, match=r"'sp' = True with 'dp' = 2: .* all-reduce plan"):
        tilecc.compile(model, (ids,), system="ring:4", parallel={"tp": 2, "dp": 2, "sp": True})
    with pytest.raises(ShardingError, match=r"'dp' = 3 must divide the batch; input 0 has batch 4"):
        tilecc.compile(model, (ids,), system="ring:6", parallel={"tp": 2, "dp": 3})
    with pytest.raises(ShardingError, match=r"collectives='stream' runs tp alone or pp alone, not with dp"):
        tilecc.compile(model, (ids,), system="ring:4", parallel={"tp": 2, "dp": 2, "collectives": "stream"})
    from tilecc.cli import main

    assert main(["run", "examples/llama_tp.py:llama_pipeline", "--system", "ring:8", "--dp", "2", "--tp", "2",
                 "--pp", "3"]) == 2
    assert "tp x pp x dp = 2 x 3 x 2 = 12 must equal the system's 8 chips" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--system", "ring:2", "--pp", "2", "--micro-batches", "2"],
                                   pytest.param(["--system", "ring:2", "--tp", "2"], marks=pytest.mark.slow)])
def test_cli_train_runs_a_training_step_without_dp(flags, capsys):
    """`tilecc run ... --train`: a pipeline-parallel or tensor-parallel training step from
    the command line, its gradients compared with eager autograd's (the exit code says so)."""
    import json

    from tilecc.cli import main

    assert main(["run", "examples/llama_tp.py:llama_pipeline", *flags, "--train", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allclose"] is True and d["step_us"] > 0 and "dp" not in d["parallel"]
    assert main(["run", "examples/llama_tp.py:llama_pipeline", *flags, "--train", "--timing-only"]) == 2
    assert "--timing-only is not supported with a training step" in capsys.readouterr().err
