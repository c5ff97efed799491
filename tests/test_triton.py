"""The Triton backend: tile kernels emitted as @triton.jit source, run under Triton's
interpreter (TRITON_INTERPRET=1, which runtime/gpu.py sets when CUDA is absent) on
small shapes and compared with torch eager."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.runtime.gpu import run_on_triton
from tilecc.simulator.config import load_config


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


def test_linear_kernel_matches_eager():
    """Matmul with bias and tanh epilogue: subviews of on-chip buffers, tl.dot."""
    torch.manual_seed(0)
    sources = _run(_Linear(), (torch.randn(20, 40),))
    assert any("tl.dot(" in s for s in sources.values())


class _LayerNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(40)
        torch.nn.init.normal_(self.ln.weight)
        torch.nn.init.normal_(self.ln.bias)

    def forward(self, x):
        return self.ln(x)


def test_layer_norm_kernel_matches_eager():
    torch.manual_seed(0)
    _run(_LayerNorm(), (torch.randn(20, 40),))


def test_softmax_kernel_matches_eager():
    torch.manual_seed(0)
    sources = _run(_Softmax(), (torch.randn(12, 50),))
    assert any("tl.max(" in s or "tl.sum(" in s for s in sources.values())


def test_torch_compile_target_gpu_runs_a_model_on_triton():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import mlp as mlp_example

    plans: list = []
    model, (x,) = mlp_example.mlp()
    c = torch.compile(model, backend="tilecc", options={"target": "gpu", "plans": plans})
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=1e-4, atol=1e-5)
    (plan,) = plans
    (part,) = plan.npu_partitions
    assert part.device == "gpu" and part.runs == 1 and not plan.transfers
    assert part.sources and all(s.startswith("@triton.jit") for s in part.sources.values())


def test_target_gpu_op_without_tile_lowering_runs_as_torch_op():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import mixed as mixed_example

    plans: list = []
    model, (x,) = mixed_example.mixed()
    c = torch.compile(model, backend="tilecc", options={"target": "gpu", "plans": plans})
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=1e-4, atol=1e-5)
    (plan,) = plans
    assert [p.device for p in plan.partitions] == ["gpu", "gpu", "fallback"]
    assert all(p.runs == 1 for p in plan.npu_partitions)
    (fb,) = plan.fallbacks
    assert fb.op == "aten.sin.default" and fb.location == "mixed.py:22"


@pytest.mark.slow
def test_target_gpu_runs_tiny_gpt2_on_triton():
    """Embedding gathers, strided q/k/v views, attention, layer norm and GELU kernels:
    the whole graph as Triton kernels (about 10 s under the interpreter)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_dynamo import _tiny_gpt2

    plans: list = []
    model, ids = _tiny_gpt2()
    model.eval()
    c = torch.compile(model, backend="tilecc", options={"target": "gpu", "plans": plans})
    with torch.no_grad():
        torch.testing.assert_close(c(ids), model(ids), rtol=1e-4, atol=1e-4)
    parts = [q for p in plans for q in p.npu_partitions]
    assert parts and all(q.runs == 1 for q in parts)
    assert not [f for p in plans for f in p.fallbacks if "Triton backend cannot" in f.reason]


@pytest.mark.slow
def test_target_gpu_runs_bert_on_triton():
    """The BERT example (2 layers x 128): 44 kernels, about a minute under the interpreter."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import bert as bert_example

    plans: list = []
    model, (ids,) = bert_example.build("eager")
    c = torch.compile(model.eval(), backend="tilecc", options={"target": "gpu", "plans": plans})
    with torch.no_grad():
        torch.testing.assert_close(c(ids), model(ids), rtol=1e-4, atol=1e-4)
    parts = [q for p in plans for q in p.npu_partitions]
    assert parts and all(q.runs == 1 for q in parts) and not [f for p in plans for f in p.fallbacks]


def test_target_gpu_bf16_mlp_within_bf16_tolerance():
    """bf16 tensors in HBM, fp32 blocks on chip (the NPU also computes in fp32)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
    import mlp as mlp_example

    model, (x,) = mlp_example.mlp_bf16()
    c = torch.compile(model, backend="tilecc", options={"target": "gpu"})
    with torch.no_grad():
        y, want = c(x), model(x)
    assert y.dtype == torch.bfloat16
    scale = float(want.float().abs().max())
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2 * scale)
