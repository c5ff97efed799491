"""The Triton backend: tile kernels emitted as @triton.jit source, run under Triton's
interpreter (TRITON_INTERPRET=1, set before Triton is imported) on small shapes and
compared with torch eager."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from tilecc.frontend.torch_export import export_model, import_exported_program  # noqa: E402
from tilecc.runtime.gpu import run_on_triton  # noqa: E402
from tilecc.simulator.config import load_config  # noqa: E402


class _Elementwise(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x * y + 1.0) - torch.exp(-x)


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(40, 24)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class _Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def _run(model, inputs):
    gp = import_exported_program(export_model(model, inputs))
    outs, sources = run_on_triton(gp, load_config("tiny"), inputs)
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(outs[0], want, rtol=1e-4, atol=1e-5)
    return sources


def test_elementwise_kernel_matches_eager():
    torch.manual_seed(0)
    sources = _run(_Elementwise(), (torch.randn(20, 40), torch.randn(20, 40)))
    assert sources and all(s.startswith("@triton.jit\ndef k") for s in sources.values())
    assert any("tl.load(" in s and "tl.store(" in s and "tl.exp(" in s for s in sources.values())


def test_kernel_with_subviews_is_refused_with_the_op_named():
    from tilecc.codegen.triton import TritonCodegenError

    torch.manual_seed(0)
    with pytest.raises(TritonCodegenError, match="tile.subview is not translated"):
        _run(_Linear(), (torch.randn(20, 40),))


def test_softmax_kernel_matches_eager():
    torch.manual_seed(0)
    sources = _run(_Softmax(), (torch.randn(12, 50),))
    assert any("tl.max(" in s or "tl.sum(" in s for s in sources.values())


def test_torch_compile_target_gpu_runs_the_graph_on_triton():
    plans: list = []
    torch.manual_seed(0)
    model, x, y = _Elementwise(), torch.randn(20, 40), torch.randn(20, 40)
    c = torch.compile(model, backend="tilecc", options={"target": "gpu", "plans": plans})
    with torch.no_grad():
        torch.testing.assert_close(c(x, y), model(x, y), rtol=1e-4, atol=1e-5)
    (plan,) = plans
    assert plan.partitions[0].device == "gpu" and plan.partitions[0].runs == 1
    assert all("@triton.jit" in s for s in plan.sources.values())


def test_target_gpu_graph_with_untranslated_kernel_runs_as_torch_ops():
    plans: list = []
    torch.manual_seed(0)
    model, x = _Linear(), torch.randn(20, 40)
    c = torch.compile(model, backend="tilecc", options={"target": "gpu", "plans": plans})
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=1e-4, atol=1e-5)
    (plan,) = plans
    assert plan.partitions[0].device == "fallback" and "tile.subview" in plan.fallbacks[0].reason
