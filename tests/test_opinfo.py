"""PyTorch's OpInfo samples for every op tilecc claims, compiled and compared with eager."""

import pytest
import torch
from opinfo_harness import CLAIMED, claimed_opinfos, run_op

OPINFOS = claimed_opinfos()


def _id(o):
    return f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name


def test_every_claimed_op_has_an_opinfo():
    found = {(o.name, o.variant_test_name) for o in OPINFOS}
    assert found == {(n, v) for n, vs in CLAIMED.items() for v in vs}


# the default profile runs the first FAST_SAMPLES admitted samples of each op in fp32 and
# the first in bf16 (101 ops: the suite's 12-minute budget); `-m slow` runs every admitted
# sample (what benchmarks/op_coverage.py reports)
FAST_SAMPLES = 3


@pytest.mark.parametrize("opinfo", OPINFOS, ids=_id)
def test_opinfo_fp32(opinfo):
    res = run_op(opinfo, torch.float32, limit=FAST_SAMPLES)
    failures = [f"{s.desc}: {s.detail}" for s in res.samples if s.status == "fail"]
    assert res.samples, "no admitted samples"
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("opinfo", OPINFOS, ids=_id)
def test_opinfo_fp32_all_samples(opinfo):
    res = run_op(opinfo, torch.float32)
    failures = [f"{s.desc}: {s.detail}" for s in res.samples if s.status == "fail"]
    assert res.samples, "no admitted samples"
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("opinfo", OPINFOS, ids=_id)
def test_opinfo_bf16(opinfo):
    res = run_op(opinfo, torch.bfloat16, limit=1)
    failures = [f"{s.desc}: {s.detail}" for s in res.samples if s.status == "fail"]
    assert not failures, "\n".join(failures)
