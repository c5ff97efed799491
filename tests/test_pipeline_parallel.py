"""Pipeline parallelism (inference) of a `transformers` Llama decoder on simulated chips."""

import sys
import types

import pytest
import torch

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

import tilecc  # noqa: E402
from tests.test_tensor_parallel import llama  # noqa: E402
from tilecc.frontend.tensor_parallel import ShardingError  # noqa: E402

IDS = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(2))


def test_pp2_matches_eager_and_micro_batches_fill_the_pipeline():
    model = llama(layers=2)
    with torch.no_grad():
        ref = model(IDS)
    times = {}
    for mb in (1, 4):
        sm = tilecc.compile(model, (IDS,), target="tiny", system="ring:2", parallel={"pp": 2, "micro_batches": mb},
                            cache=False)
        torch.testing.assert_close(sm(IDS), ref, rtol=1e-4, atol=1e-4)
        rep = sm.report
        times[mb] = rep.time_us
        sends = [c for c in rep.collectives if c["op"] == "send_recv"]
        # per micro-batch: the hidden states (B/mb x 16 x 64 fp32) and the mask / rotary tables
        hidden = [c for c in sends if c["bytes"] == (4 // mb) * 16 * 64 * 4]
        assert len(hidden) == mb and all(c["algorithm"] == "direct 0->1" for c in sends)
        assert rep.link_bytes == pytest.approx(sum(c["bytes"] for c in sends))  # one hop on a ring of 2
        busy = [c.busy_us for c in rep.chips]
        assert all(b > 0 for b in busy)
        if mb == 1:  # no overlap: the stages run one after the other, the values sent side by side
            assert rep.time_us == pytest.approx(sum(busy) + max(c["time_us"] for c in sends), rel=1e-6)
        else:  # micro-batches fill the pipeline: the stages run side by side most of the time
            assert rep.time_us < 0.7 * sum(busy)
    # and it pays here, although a quarter of the rows per matmul runs less efficiently
    assert times[4] < 0.9 * times[1]


def test_pipeline_errors():
    model = llama(layers=2)
    with pytest.raises(ShardingError, match="2 layers cannot make 4 pipeline stages"):
        tilecc.compile(model, (IDS,), system="ring:4", parallel={"pp": 4})
    with pytest.raises(ShardingError, match="input 0: batch 4 cannot be cut into 3 micro-batches"):
        tilecc.compile(model, (IDS,), system="ring:2", parallel={"pp": 2, "micro_batches": 3})
    with pytest.raises(ShardingError, match=r"'sp' = True with 'dp' = 2"):
        tilecc.compile(model, (IDS,), system="ring:8", parallel={"pp": 2, "tp": 2, "dp": 2, "sp": True})
    with pytest.raises(ShardingError, match="tp_plan= applies to tensor parallelism"):
        tilecc.compile(model, (IDS,), system="ring:2", parallel={"pp": 2}, tp_plan={})
    with pytest.raises(ShardingError, match="'dp' = 3 must divide the batch; input 0 has batch 4"):
        tilecc.compile(model, (IDS,), system="ring:3", parallel={"dp": 3})
