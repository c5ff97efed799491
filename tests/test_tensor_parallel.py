"""Tensor parallelism of a `transformers` Llama decoder on simulated chips, against eager."""

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

from helpers import LastHidden  # noqa: E402

import tilecc  # noqa: E402
from tilecc.frontend.tensor_parallel import ShardingError  # noqa: E402


def llama(heads=8, kv_heads=4, hidden=64, layers=1, seed=0):
    from transformers import LlamaConfig, LlamaModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=100,
                      max_position_embeddings=64, use_cache=False, attn_implementation="eager")
    return LastHidden(LlamaModel(cfg)).eval()


IDS = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(1))


def eager(model):
    with torch.no_grad():
        return model(IDS)


@pytest.mark.parametrize("tp,topology,sp", [(2, "ring:2", False), (4, "switch:4", True)])
def test_tp_matches_eager(tp, topology, sp):
    model = llama()
    sm = tilecc.compile(model, (IDS,), target="tiny", system=topology, parallel={"tp": tp, "sp": sp}, cache=False)
    out = sm(IDS)
    torch.testing.assert_close(out, eager(model), rtol=1e-4, atol=1e-4)
    rep = sm.report
    ops = [c["op"] for c in rep.collectives]
    assert ops == (["shard"] + ["all_gather", "reduce_scatter"] * 2 + ["all_gather"] if sp else ["all_reduce"] * 2)
    assert rep.chips_count == tp and len(rep.chips) == tp and all(c.busy_us > 0 for c in rep.chips)
    assert 0 < rep.comm_exposed_share < 1 and rep.time_us == pytest.approx(rep.compute_us + rep.comm_us)


@pytest.mark.slow
@pytest.mark.parametrize("tp,topology", [(8, "torus:2x4"), (8, "ring:8"), (2, "switch:2")])
def test_tp8_matches_eager(tp, topology):
    model = llama(heads=16, kv_heads=8, hidden=128, layers=2)
    for sp in (False, True):
        sm = tilecc.compile(model, (IDS,), target="tiny", system=topology, parallel={"tp": tp, "sp": sp}, cache=False)
        torch.testing.assert_close(sm(IDS), eager(model), rtol=1e-4, atol=1e-4)


def test_link_bytes_equal_the_collectives_traffic():
    """Every byte the report puts on a link is one the collective's schedule sends over it."""
    from tilecc.simulator.interconnect.collective import make_schedule, run_collective
    from tilecc.simulator.interconnect.routing import path_stats

    model = llama()
    sm = tilecc.compile(model, (IDS,), target="tiny", system="ring:4", parallel={"tp": 4}, cache=False)
    torch.testing.assert_close(sm(IDS), eager(model), rtol=1e-4, atol=1e-4)
    rep = sm.report
    s = 16 * 64 * 4  # the [1, 16, 64] fp32 activations each all-reduce sums
    assert [c["bytes"] for c in rep.collectives] == [s, s]
    sys_ = sm.program.system
    want = run_collective("all_reduce", s, sys_.topology, sys_.link, mode="contention", itemsize=4)
    assert rep.collectives[0]["time_us"] == pytest.approx(want.time_us)
    sched = make_schedule("all_reduce", want.algorithm, sys_.topology, sys_.link, s // 4, 4)
    per_collective = sum(float((path_stats(sys_.topology, st.src, st.dst)[0] * st.count).sum()) * 4
                         for st in sched.steps)
    assert rep.link_bytes == pytest.approx(2 * per_collective)
    # a reduction of S over n chips must bring (n-1)/n x S into every chip at least
    assert per_collective >= 4 * (3 / 4) * s
    # timing only: chip 0 simulated once and replayed for its identical peers gives the same timeline
    busy = [c.busy_us for c in rep.chips]
    sm.run(IDS, timing_only=True)
    assert sm.report.time_us == rep.time_us and sm.report.link_bytes == rep.link_bytes
    assert [c.busy_us for c in sm.report.chips] == busy


def test_user_plan_in_pytorch_vocabulary_and_trace(tmp_path):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = llama()
    plan = {"model.layers.*.mlp.gate_proj": ColwiseParallel(), "model.layers.*.mlp.up_proj": ColwiseParallel(),
            "model.layers.*.mlp.down_proj": RowwiseParallel()}  # attention replicated
    sm = tilecc.compile(model, (IDS,), target="tiny", system="ring:2", parallel={"tp": 2}, tp_plan=plan, cache=False)
    out = sm.run(IDS, trace=tmp_path / "t.json")
    torch.testing.assert_close(out, eager(model), rtol=1e-4, atol=1e-4)
    assert [c["op"] for c in sm.report.collectives] == ["all_reduce"]
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "process_name"}
    assert names == {(1, "chip 0"), (2, "chip 1"), (3, "links")}
    link_slices = [e for e in events if e["pid"] == 3 and e.get("ph") == "X"]
    assert len(link_slices) == 2 and all(e["name"] == "all_reduce" for e in link_slices)
    assert {e["pid"] for e in events if e.get("ph") == "X" and e["pid"] < 3} == {1, 2}


def test_sharding_errors():
    model = llama(heads=8, kv_heads=2)
    with pytest.raises(ShardingError, match=r"k_proj: 2 key / value heads cannot be split over 4 chips"):
        tilecc.compile(model, (IDS,), target="tiny", system="ring:4", parallel={"tp": 4}, cache=False)
    with pytest.raises(ShardingError, match=r"tp x pp x dp = 2 x 1 x 1 = 2 must equal the system's 4 chips"):
        tilecc.compile(model, (IDS,), target="tiny", system="ring:4", parallel={"tp": 2})
    with pytest.raises(ShardingError, match="no layer matches the automatic tensor-parallel plan"):
        tilecc.compile(torch.nn.Sequential(torch.nn.Linear(8, 8)), (torch.randn(2, 8),), system="ring:2",
                       parallel={"tp": 2})
    from torch.distributed.tensor.parallel import ColwiseParallel

    with pytest.raises(ShardingError, match=r"model.norm: ColwiseParallel shards nn.Linear layers; this one is a"):
        tilecc.compile(model, (IDS,), system="ring:2", parallel={"tp": 2}, tp_plan={"model.norm": ColwiseParallel()})
    with pytest.raises(ShardingError, match="tp_plan key 'nope' names no module"):
        tilecc.compile(model, (IDS,), system="ring:2", parallel={"tp": 2}, tp_plan={"nope": ColwiseParallel()})
    assert issubclass(ShardingError, tilecc.TileccError)
    assert np.isfinite(0.0)


def test_cli_errors(capsys):
    from tilecc.cli import main

    assert main(["run", "examples/llama_tp.py:llama", "--tp", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --tp / --pp / --dp / --sp / --micro-batches / --timing-only / --train need --system "
        "(e.g. --system ring:4)")
    assert main(["run", "examples/llama_tp.py:llama", "--system", "ring:4", "--tp", "3"]) == 2
    assert "tp x pp x dp = 3 x 1 x 1 = 3 must equal the system's 4 chips" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_runs_the_example(capsys):
    from tilecc.cli import main

    assert main(["run", "examples/llama_tp.py:llama", "--system", "ring:2", "--tp", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allclose"] and d["tp"] == 2 and d["link_bytes"] > 0 and len(d["chips"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("family", ["Qwen2", "Mistral"])
def test_auto_plan_other_families(family):
    import transformers

    cfg_cls, model_cls = getattr(transformers, f"{family}Config"), getattr(transformers, f"{family}Model")
    torch.manual_seed(0)
    cfg = cfg_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=100, max_position_embeddings=64, use_cache=False,
                  attn_implementation="eager")
    model = LastHidden(model_cls(cfg)).eval()  # Qwen2: q / k / v with biases (column-parallel: sliced)
    for sp in (False, True):
        sm = tilecc.compile(model, (IDS,), target="tiny", system="ring:2", parallel={"tp": 2, "sp": sp}, cache=False)
        torch.testing.assert_close(sm(IDS), eager(model), rtol=1e-4, atol=1e-4)


def test_bf16_tp_within_bf16_tolerance():
    """bf16 weights and activations: the sharded model is as close to eager as one chip is."""
    model = llama().to(torch.bfloat16)
    ref = eager(model).float()
    sm = tilecc.compile(model, (IDS,), target="tiny", system="ring:2", parallel={"tp": 2}, cache=False)
    out = sm(IDS)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)


@pytest.mark.slow
def test_cli_timing_only(capsys):
    from tilecc.cli import main

    assert main(["run", "examples/llama_tp.py:llama", "--system", "ring:4", "--tp", "4", "--timing-only",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allclose"] is None and d["time_us"] > d["comm_us"] > 0


@pytest.mark.parametrize("tp, attn", [(2, "eager"), (4, "sdpa")])
def test_gpt2_conv1d_and_fused_qkv_shard_and_match_eager(tp, attn):
    """GPT-2's Conv1D layers (weight [in, out]) under the automatic plan: the fused q / k / v
    projection split per block (whole heads of q, k and v on every chip), c_fc
    column-parallel, both c_proj row-parallel with their bias added once after the sum."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import gpt2

    model, (ids,) = gpt2.build(attn, seq=16)
    sm = tilecc.compile(model, (ids,), target="tiny", system=f"ring:{tp}", parallel={"tp": tp}, cache=False)
    with torch.no_grad():
        want = model(ids)
    torch.testing.assert_close(sm(ids), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ShardingError, match="GPT-2"):
        tilecc.compile(model, (ids,), target="tiny", system="ring:2", parallel={"tp": 2, "sp": True}, cache=False)
    with pytest.raises(ShardingError, match="4 attention heads cannot be split over 8 chips"):
        tilecc.compile(model, (ids,), target="tiny", system="ring:8", parallel={"tp": 8}, cache=False)
