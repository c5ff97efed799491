"""The -O2 blocked matmul kernel (passes/lower_matmul.py) against eager and -O0.

Every run is checked by the simulator's sanitisers (races, uninitialised reads), so the
semaphores the sync pass places for its multi-buffered loads are checked too.
"""

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tilecc
from helpers import run_and_compare


class _MM(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class _Linear(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n) / k**0.5)

    def forward(self, x):
        return torch.relu(x @ self.w)


@settings(max_examples=12, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 150), k=st.integers(1, 90), n=st.integers(1, 140),
    batch=st.sampled_from([(), (2,), (2, 3)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_blocked_matmul_matches_eager(m, k, n, batch, dtype):
    a = torch.randn(*batch, m, k, dtype=dtype)
    b = torch.randn(*batch, k, n, dtype=dtype)
    run_and_compare(_MM(), (a, b))


@pytest.mark.parametrize("target", ["tiny", "edge", "cloud"])
def test_blocked_matmul_presets(target):
    torch.manual_seed(0)
    run_and_compare(_Linear(300, 260).to(torch.bfloat16), (torch.randn(130, 300, dtype=torch.bfloat16),), target)


def test_o2_beats_o0_and_both_match():
    torch.manual_seed(0)
    model, x = _Linear(256, 256), torch.randn(192, 256)
    expected = model(x)
    cycles = {}
    for level in (0, 2):
        cm = tilecc.compile(model, (x,), target="tiny", opt_level=level)
        torch.testing.assert_close(cm(x), expected.detach(), rtol=1e-4, atol=1e-4)
        cycles[level] = cm.report.cycles
    assert cycles[2] * 3 < cycles[0], cycles


def test_bad_opt_level_is_a_clear_error():
    with pytest.raises(tilecc.TileccError, match="opt_level 1: tilecc has -O0"):
        tilecc.compile(_MM(), (torch.randn(2, 2), torch.randn(2, 2)), opt_level=1)
