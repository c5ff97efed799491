"""The example kernels of examples/kernels/ against numpy (torch CPU math) on
hypothesis-drawn shapes, edge sizes included, on the simulator with its sanitisers on
(races, uninitialised reads, deadlocks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilecc

KERNELS = Path(__file__).resolve().parent.parent / "examples" / "kernels"
SETTINGS = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# tiny: 16 partitions, a 16 x 16 array; sizes around the tile edges
size = st.sampled_from([1, 2, 15, 16, 17, 31, 33, 40])


def _kernel(name: str) -> tilecc.kernel:
    k = tilecc.kernel(KERNELS / f"{name}.tdsl")
    k.sanitize = True
    return k


def _close(got, want, rtol=2e-2, atol_scale=2e-2):
    got = torch.as_tensor(got).float()
    want = torch.as_tensor(want).float()
    assert got.shape == want.shape
    atol = atol_scale * max(1.0, float(want.abs().max()) if want.numel() else 1.0)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def _bf(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).bfloat16()


@SETTINGS
@given(M=size, K=size, N=st.sampled_from([1, 16, 63, 64, 65, 130]))
def test_gemm_bias_gelu(M, K, N):
    torch.manual_seed(M * 1000 + K * 10 + N)
    a, b, bias = _bf(M, K), _bf(K, N), torch.randn(N)
    got = _kernel("gemm_gelu")(a, b, bias)
    assert got.dtype == torch.bfloat16
    _close(got, F.gelu(a.float() @ b.float() + bias).bfloat16())


@SETTINGS
@given(R=size, C=st.sampled_from([1, 2, 17, 100]))
def test_softmax(R, C):
    x = np.random.default_rng(R * 100 + C).standard_normal((R, C)).astype(np.float32) * 3
    got = _kernel("softmax")(x)  # numpy in, numpy out
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


@SETTINGS
@given(R=size, C=st.sampled_from([1, 2, 17, 100]))
def test_layer_norm(R, C):
    rng = np.random.default_rng(R * 7 + C)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((R, C), (C,), (C,)))
    got = _kernel("layer_norm")(x, w, b)
    mu = x.mean(-1, keepdims=True)
    want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(R=size, C=st.sampled_from([1, 2, 17, 100]))
def test_rms_norm(R, C):
    torch.manual_seed(R + 31 * C)
    x, w = _bf(R, C), _bf(C)
    got = _kernel("rms_norm")(x, w)
    xf = x.float()
    _close(got, (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16())


@SETTINGS
@given(H=st.sampled_from([1, 2]), S=size, D=st.sampled_from([1, 8, 16]))
def test_causal_flash_attention(H, S, D):
    torch.manual_seed(H + S * 3 + D * 101)
    q, k, v = _bf(H, S, D), _bf(H, S, D), _bf(H, S, D)
    got = _kernel("flash_attention")(q, k, v)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    _close(got, want.bfloat16(), rtol=3e-2, atol_scale=3e-2)


@SETTINGS
@given(C=st.sampled_from([1, 3, 17]), H=st.sampled_from([3, 6]), W=st.sampled_from([3, 20, 70]),
       KH=st.sampled_from([1, 3]), KW=st.sampled_from([1, 2, 3]), Fo=st.sampled_from([1, 16, 20]))
def test_conv2d(C, H, W, KH, KW, Fo):
    torch.manual_seed(C + H + W + KH + KW + Fo)
    x, w = _bf(C, H, W), _bf(KH, KW, C, Fo)
    got = _kernel("conv2d")(x, w)
    want = F.conv2d(x.float()[None], w.float().permute(3, 2, 0, 1))[0]
    _close(got, want, rtol=1e-4, atol_scale=1e-4)


@SETTINGS
@given(M=size, D=st.sampled_from([1, 16, 24]), Fh=st.sampled_from([5, 16, 40]), E=st.sampled_from([3, 20]))
def test_fused_mlp(M, D, Fh, E):
    torch.manual_seed(M + D + Fh + E)
    x, w1, b1 = _bf(M, D), _bf(D, Fh, scale=0.3), torch.randn(Fh)
    w2, b2 = _bf(Fh, E, scale=0.3), torch.randn(E)
    got = _kernel("mlp")(x, w1, b1, w2, b2)
    h = F.gelu(x.float() @ w1.float() + b1).bfloat16().float()
    _close(got, h @ w2.float() + b2, rtol=1e-3, atol_scale=1e-3)


@pytest.mark.parametrize("target", ["edge", "cloud"])
def test_examples_compile_for_the_larger_targets(target):
    """The same sources tile themselves to each target (target.partitions)."""
    torch.manual_seed(0)
    a, b, bias = _bf(130, 70), _bf(70, 300), torch.randn(300)
    k = tilecc.kernel(KERNELS / "gemm_gelu.tdsl")
    _close(k(a, b, bias, target=target), F.gelu(a.float() @ b.float() + bias).bfloat16())
    assert k.report is not None and k.report.cycles > 0


@pytest.mark.parametrize("name", ["softmax", "gemm_gelu", "rms_norm"])
def test_examples_on_the_triton_backend(name):
    """DSL kernels run on the GPU fallback too: their tile IR emitted as Triton kernels
    (under TRITON_INTERPRET=1 without CUDA), against the same torch math."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    k = tilecc.kernel(KERNELS / f"{name}.tdsl")
    if name == "softmax":
        x = torch.randn(33, 17) * 3
        got, want = k(x, target="gpu"), torch.softmax(x, -1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    elif name == "gemm_gelu":
        a, b, bias = _bf(17, 33), _bf(33, 65), torch.randn(65)
        got = k(a, b, bias, target="gpu")
        assert got.dtype == torch.bfloat16
        _close(got, F.gelu(a.float() @ b.float() + bias).bfloat16())
    else:
        x, w = _bf(31, 40), _bf(40)
        got = k(x, w, target="gpu")
        xf = x.float()
        _close(got, (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6) * w.float()).bfloat16())
    assert k.triton_sources and all("@triton.jit" in s for s in k.triton_sources.values())
