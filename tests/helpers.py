"""Shared test helpers: compile a model, run it on the simulator, compare with eager."""

from __future__ import annotations

import torch

import tilecc
from tilecc.runtime.compare import tolerance


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
