"""RMSNorm (graph.rms_norm): the decomposed norms of Llama / Qwen2 / Mistral (cast, then
the weight) and Gemma (the fp32 ``1 + w``, then the cast) become one op, run as one
row-wise kernel or as the prologue of the matmul reading them, and match eager; a
near-match stays decomposed with a remark saying why."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilecc
from tilecc.frontend.torch_export import import_exported_program
from tilecc.ir import graph as g
from tilecc.ir.graph_work import graph_work
from tilecc.passes import remarks
from tilecc.passes.graph.canonicalize import canonicalize
from tilecc.simulator.config import load_config


class LlamaStyleNorm(torch.nn.Module):
    """LlamaRMSNorm / Qwen2RMSNorm / MistralRMSNorm's forward."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width) * 0.5 + 1)
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        v = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(v + self.eps)
        return self.weight * h.to(x.dtype)


class GemmaStyleNorm(torch.nn.Module):
    """GemmaRMSNorm's forward: ``(1 + w)`` in fp32, the cast after the multiply."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width) * 0.5)
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class NormThenLinear(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module, width: int):
        super().__init__()
        self.norm, self.proj = norm, torch.nn.Linear(width, 24, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x))


class MeanOverDim0(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)


def _names(cm) -> list[str]:
    return [name for name, _, _ in cm.program.kernels]


def _graph(model, x):
    return import_exported_program(torch.export.export(model, (x,)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 9), width=st.sampled_from([8, 48, 96, 200]), eps=st.sampled_from([1e-6, 1e-5, 0.1]),
       gemma=st.booleans(), bf16=st.booleans())
def test_rms_norm_matches_eager_as_one_kernel(rows, width, eps, gemma, bf16):
    dt = torch.bfloat16 if bf16 else torch.float32
    torch.manual_seed(rows * 1000 + width)
    model = (GemmaStyleNorm if gemma else LlamaStyleNorm)(width, eps).to(dt).eval()
    x = torch.randn(2, rows, width, dtype=dt) * 3
    cm = tilecc.compile(model, (x,))
    assert _names(cm) == ["k0_rms_norm"], _names(cm)
    with torch.no_grad():
        want = model(x)
    got = cm(x)
    assert got.dtype == want.dtype
    if bf16:  # the kernel's fp32 sum order differs from eager's: at most one bf16 ulp
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "target"), [((1, 1, 2048), "cloud"), ((3, 1, 256), "cloud"), ((2, 1, 96), "tiny")])
def test_few_rows_split_over_partitions_match_eager(shape, target, gemma, dt):
    """A decode step's rows: each spread over partitions, the row sums gathered by one
    matmul (passes/graph_to_tile/rms_norm_split.py), still one kernel."""
    torch.manual_seed(shape[0])
    model = (GemmaStyleNorm if gemma else LlamaStyleNorm)(shape[-1], 1e-5).to(dt).eval()
    x = torch.randn(*shape, dtype=dt) * 3
    cm = tilecc.compile(model, (x,), target=target)
    assert _names(cm) == ["k0_rms_norm"], _names(cm)
    (sram,) = [r["message"] for r in cm.program.meta["remarks"] if r["message"].startswith("kernel k0_rms_norm: sram")]
    assert "acc 0 of" not in sram, sram  # the row totals come from the matrix engine's accumulator
    with torch.no_grad():
        want = model(x)
    got = cm(x)
    if dt == torch.bfloat16:
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_split_is_chosen_for_few_rows_only():
    from tilecc.passes.graph_to_tile.rms_norm_split import split_of

    class _Lw:  # the two fields split_of reads
        cfg = load_config("cloud")
        P = cfg.sram.partitions

    lw = _Lw()
    assert split_of(lw, 1, 2048) == 128  # type: ignore[arg-type]
    assert split_of(lw, 8, 2048) == 16  # type: ignore[arg-type]
    assert split_of(lw, 128, 2048) is None  # type: ignore[arg-type]  (prefill: the row-wise kernel)
    assert split_of(lw, 1, 7) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_prologue_of_the_matmul_reading_it(gemma, dt):
    norm = (GemmaStyleNorm if gemma else LlamaStyleNorm)(64, 1e-6)
    model = NormThenLinear(norm, 64).to(dt).eval()
    x = torch.randn(3, 5, 64, dtype=dt)
    cm = tilecc.compile(model, (x,))
    assert _names(cm) == ["k0_fused_matmul"], _names(cm)
    with torch.no_grad():
        want = model(x)
    tol = dict(rtol=2e-2, atol=2e-2) if dt == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cm(x).float(), want.float(), **tol)


@pytest.mark.parametrize("gemma", [False, True])
def test_recognised_op_and_the_bound_agree(gemma):
    """canonicalize-graph makes one graph.rms_norm of the chain; the intrinsic work of
    the imported (decomposed) graph is the op's."""
    model = (GemmaStyleNorm if gemma else LlamaStyleNorm)(32, 1e-5).to(torch.bfloat16).eval()
    gp = _graph(model, torch.randn(4, 32, dtype=torch.bfloat16))
    cfg = load_config("cloud")
    before = graph_work(gp, cfg)
    with remarks.collecting() as rc:
        assert canonicalize(gp.func, gp.weights) == 1
    (op,) = [o for o in gp.func.body.block.ops if isinstance(o, g.RmsNormOp)]
    assert op.weight_after_cast is not gemma
    assert op.eps_value == pytest.approx(1e-5)
    assert not any(isinstance(o, g.CastOp) for o in gp.func.body.block.ops)
    assert any("graph.rms_norm" in r.message for r in rc.remarks)
    after = graph_work(gp, cfg)
    assert after.vector_element_cycles == pytest.approx(before.vector_element_cycles)
    assert set(before.by_op) >= {"graph.rms_norm"}


def test_mean_over_dim0_stays_decomposed_with_a_remark():
    model = MeanOverDim0().eval()
    x = torch.randn(6, 16)
    cm = tilecc.compile(model, (x,))
    torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-6)
    assert "rms_norm" not in " ".join(_names(cm))
    missed = [r["message"] for r in cm.program.meta["remarks"] if "RMSNorm" in r["message"] and r["kind"] == "missed"]
    assert missed and "dims [0]" in missed[0], missed


def test_rms_norm_verifier_names_the_bad_weight():
    from tilecc.errors import ShapeError

    gp = _graph(LlamaStyleNorm(8, 1e-6).eval(), torch.randn(2, 8))
    x = gp.func.body.block.args[0]
    w = next(o for o in gp.func.body.block.ops if isinstance(o, g.WeightOp)).results[0]
    with pytest.raises(ShapeError, match=r"weight shape \[2, 8\] must be \[8\]"):
        g.RmsNormOp.make(x, x, 1e-6, x.type)  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match=r"result shape \[2, 4\] must equal the input's \[2, 8\]"):
        g.RmsNormOp.make(x, w, 1e-6, g.tensor_type((2, 4), g.element_type(g.element_dtype(x.type))))
    op = g.RmsNormOp.make(x, w, 1e-6, x.type)  # type: ignore[arg-type]
    assert "graph.rms_norm" in str(op) and "eps" in str(op)
    op.erase()


@pytest.mark.parametrize(("rows", "width"), [(128, 128), (135, 64), (40, 96)])
def test_norm_prologue_runs_under_the_matmuls_and_matches_eager(rows, width):
    """Many m-tiles (tiny: 16 rows each) with k-tiles in B groups: a step transposes the
    prepared m-tile R k-tiles at a time over its first k-tiles and the next m-tile's norm
    runs under the remaining matmuls (`BlockedMatmulKernel.front_part`, a remark says so),
    where the k-tiles allow it; the result equals eager's within bf16 rounding."""
    model = NormThenLinear(LlamaStyleNorm(width, 1e-6), width).to(torch.bfloat16).eval()
    x = torch.randn(1, rows, width, dtype=torch.bfloat16)
    cm = tilecc.compile(model, (x,), cache=False)
    assert _names(cm) == ["k0_fused_matmul"], _names(cm)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(cm(x).float(), want.float(), rtol=2e-2, atol=2e-2)
    msgs = [remarks.Remark.from_dict(d).message for d in cm.program.meta["remarks"]]
    front = [m for m in msgs if "prologue's vector work runs under" in m]
    tk = cm.program.config.sram.partitions
    if width // tk >= 4:  # k-tiles enough for a first part on a group boundary
        assert front, [m for m in msgs if "cost model chose" in m]


class NormThenMLP(torch.nn.Module):
    """Llama's post-attention norm and MLP: the norm's result is the A rows of two matmuls."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = LlamaStyleNorm(width, 1e-6)
        self.gate = torch.nn.Linear(width, hidden, bias=False)
        self.up = torch.nn.Linear(width, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_norm_read_by_two_matmuls_is_the_prologue_of_the_first(dt):
    """The norm feeding the gate and up projections is computed once, as the prologue of
    the first of them (which stores it for the other), not as a kernel of its own."""
    model = NormThenMLP(64, 96).to(dt).eval()
    x = torch.randn(1, 40, 64, dtype=dt)
    cm = tilecc.compile(model, (x,), cache=False)
    names = _names(cm)
    assert not any("rms_norm" in n for n in names), names
    assert sum("fused_matmul" in n for n in names) == 3, names
    with torch.no_grad():
        want = model(x)
    tol = dict(rtol=3e-2, atol=3e-2) if dt == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cm(x).float(), want.float(), **tol)


def _remarks(cm, pass_name: str) -> list[tuple[str, str]]:
    return [(r["kind"], r["message"]) for r in cm.program.meta["remarks"] if r["pass_name"] == pass_name]


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_norm_weight_folds_into_the_matmuls_it_feeds(dt):
    """fold-norm-weight: the Llama norm feeding the gate and up projections has its
    weight folded into both weights (``(n * w) @ W = n @ (w W)``); the norm keeps a weight
    of ones, which the lowering drops (no multiply), and the result equals eager."""
    torch.manual_seed(3)
    model = NormThenMLP(64, 96).to(dt).eval()
    x = torch.randn(1, 40, 64, dtype=dt)
    cm = tilecc.compile(model, (x,), cache=False)
    assert _remarks(cm, "fold-norm-weight") == [
        ("passed", "rms norm weight folded into 2 matmul weights: the norm's weight multiply is gone")]
    folded = [s.name for s in cm.program.weights if ".norm_folded" in s.name]
    assert len(folded) == 2, [s.name for s in cm.program.weights]
    with torch.no_grad():
        want = model(x)
    tol = dict(rtol=3e-2, atol=3e-2) if dt == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cm(x).float(), want.float(), **tol)
    # the same graph with the pass off: one more vector multiply per row block of the norm
    from tilecc.runtime.compiler import compile_graph
    from tilecc.runtime.executor import run_program

    cfg = load_config("tiny")
    on = compile_graph(_graph(model, x), cfg)
    off = compile_graph(_graph(model, x), cfg, disabled={"fold-norm-weight"})
    assert not any(".norm_folded" in s.name for s in off.weights)
    (got_on,), rep_on = run_program(on, (x,))
    (got_off,), rep_off = run_program(off, (x,))
    assert rep_on.cycles < rep_off.cycles, (rep_on.cycles, rep_off.cycles)
    torch.testing.assert_close(got_on.float(), want.float(), **tol)
    torch.testing.assert_close(got_off.float(), want.float(), **tol)


class NormReadTwice(torch.nn.Module):
    """The norm's result is read by a linear layer and by an add: nothing to fold into."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = LlamaStyleNorm(width, 1e-6)
        self.proj = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return self.proj(h) + h


def test_norm_weight_stays_where_another_op_reads_the_norm():
    torch.manual_seed(4)
    model = NormReadTwice(32).eval()
    x = torch.randn(6, 32)
    cm = tilecc.compile(model, (x,), cache=False)
    assert not _remarks(cm, "fold-norm-weight")
    assert not any(".norm_folded" in s.name for s in cm.program.weights)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(cm(x), want, rtol=1e-4, atol=1e-5)


def test_gemma_norm_weight_is_not_a_weight_and_stays():
    """Gemma's weight operand is ``1 + w``, computed in the graph: not a weight to fold."""
    model = NormThenLinear(GemmaStyleNorm(64, 1e-6), 64).eval()
    x = torch.randn(3, 5, 64)
    cm = tilecc.compile(model, (x,), cache=False)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(cm(x), want, rtol=1e-4, atol=1e-5)
    assert all(kind == "passed" for kind, _ in _remarks(cm, "fold-norm-weight"))


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_norm_weight_stays_before_one_byte_weights(scheme):
    """A norm feeding int8 / fp8 weights (per-channel scales on the output side) is not
    folded: the graph type decides, so the model on the meta device (no values) folds
    exactly where the model with its weights does."""
    from tilecc.quantize import quantize_scheme

    torch.manual_seed(5)
    model = quantize_scheme(NormThenMLP(64, 96).to(torch.bfloat16), scheme, skip=()).eval()
    x = torch.randn(1, 40, 64, dtype=torch.bfloat16)
    cm = tilecc.compile(model, (x,), cache=False)
    assert not _remarks(cm, "fold-norm-weight")
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(cm(x).float(), want.float(), rtol=3e-2, atol=3e-2)
    with torch.device("meta"):
        meta = quantize_scheme(NormThenMLP(64, 96).to(torch.bfloat16), scheme, skip=()).eval()
    cm_meta = tilecc.compile(meta, (x.to("meta"),), cache=False)
    assert not _remarks(cm_meta, "fold-norm-weight")
    assert cm_meta.simulate(x.to("meta")).cycles == cm.simulate(x).cycles
