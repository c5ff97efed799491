"""torch.export -> graph dialect importer, checked against eager PyTorch."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from xdsl.parser import Parser

from tilecc.errors import ExportError, TileccError, UnsupportedOpError
from tilecc.frontend.torch_export import (
    decomposition_table,
    export_model,
    import_exported_program,
    node_location,
)
from tilecc.ir import float64
from tilecc.ir import graph as g
from tilecc.ir.graph_interp import run_graph
from tilecc.simulator.isa import DType

THIS = Path(__file__).name


def line_of(marker: str) -> int:
    """1-based line number of the source line carrying ``# <marker>``."""
    for i, text in enumerate(Path(__file__).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return i
    raise AssertionError(marker)


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in=37, d_hidden=53, d_out=29):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        h = self.fc1(x)  # mlp-fc1
        h = self.act(h)  # mlp-gelu
        return self.fc2(h)  # mlp-fc2


class AttentionBlock(nn.Module):
    """Pre-norm attention with explicit matmuls + softmax, then a GELU(tanh) MLP."""

    def __init__(self, d=52, heads=4, ff=37):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, elementwise_affine=False)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)

    def forward(self, x):
        B, T, D = x.shape
        hd = D // self.heads
        y = self.ln1(x)
        q = self.q(y).reshape(B, T, self.heads, hd).permute(0, 2, 1, 3)
        k = self.k(y).view(B, T, self.heads, hd).transpose(1, 2)
        v = self.v(y).reshape(B, T, self.heads, hd).permute(0, 2, 1, 3)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)  # attn-scores
        a = torch.softmax(scores, dim=-1)  # attn-softmax
        o = (a @ v).permute(0, 2, 1, 3).reshape(B, T, D)
        x = x + self.o(o)  # attn-residual
        h = F.gelu(self.ff1(self.ln2(x)), approximate="tanh")
        return x + self.ff2(h)


class Zoo(nn.Module):
    """Every other supported elementwise / data-movement op, buffers and constants."""

    def __init__(self, n=29):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, n))
        self.register_buffer("shift", torch.linspace(-1, 1, n), persistent=False)
        self.w = nn.Parameter(torch.randn(n, 7) / 5)

    def forward(self, x, y):
        a = torch.relu(x) + torch.exp(-torch.sigmoid(y))
        b = torch.tanh(x) * torch.sigmoid(y) - torch.neg(y)
        c = torch.sqrt(x * x + 1.0) + torch.rsqrt(y * y + 0.5)
        d = F.silu(x) / (torch.sigmoid(y) + 0.25)
        e = torch.maximum(a, b) + torch.add(c, d, alpha=2) - 0.5 * x
        e = 1.0 - e  # zoo-rsub
        e = e * self.scale + self.shift + torch.tensor([0.25]).to(x.dtype)
        f = (e * 0.125).unsqueeze(0).squeeze(0).unsqueeze(1).expand(-1, 2, -1).contiguous()
        f = f.reshape(-1, f.shape[-1])
        f = f.to(torch.float16).to(x.dtype)
        m = torch.mm(f.t().t(), self.w)  # zoo-mm
        return m, F.relu(-e).clone()


class Unsupported(nn.Module):
    def forward(self, x):
        a = torch.cumprod(x, dim=1)  # unsupported-cumprod
        s = torch.digamma(x)  # unsupported-digamma
        return torch.relu(a + s)


class SDPA(nn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, q, q)  # sdpa


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def assert_close(out: np.ndarray, ref: np.ndarray, dtype: torch.dtype) -> None:
    """rtol / atol from TOL; atol scales with the output's magnitude (one rounding of a
    large intermediate shows up as an absolute error on a cancelled small result)."""
    tol = dict(TOL[dtype])
    tol["atol"] *= max(1.0, float(np.abs(ref).max(initial=0.0)))
    np.testing.assert_allclose(out, ref, **tol)


def compile_and_compare(model: nn.Module, inputs: tuple, dtype: torch.dtype) -> g.GraphProgram:
    torch.manual_seed(0)
    model = model.to(dtype).eval()
    inputs = tuple(t.to(dtype) for t in inputs)
    ep = export_model(model, inputs)
    program = import_exported_program(ep)
    program.module.verify()
    outs = run_graph(program, [t.float().numpy() for t in inputs])
    with torch.no_grad():
        ref = model(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert o.dtype == np.float32
        assert_close(o, r.float().numpy(), dtype)
    return program


def aten_ops(model: nn.Module, inputs: tuple) -> set[str]:
    ep = export_model(model, inputs).run_decompositions(decomposition_table())
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def graph_ops(program: g.GraphProgram) -> list:
    return [op for op in program.func.body.block.ops if op.name.startswith("graph.")]


# ---------------------------------------------------------------------------
# numerics vs eager
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 37), (2, 7, 37)])
def test_mlp_matches_eager(dtype, shape):
    torch.manual_seed(1)
    p = compile_and_compare(MLP(), (torch.randn(*shape),), dtype)
    assert p.input_names == ["x"]
    assert len(p.output_names) == 1
    # the transposes of the weights are folded at compile time
    assert set(p.weights) == {"fc1.weight.permute", "fc1.bias", "fc2.weight.permute", "fc2.bias"}
    assert p.weights["fc1.weight.permute"].shape == (37, 53)
    ops = {op.name for op in graph_ops(p)}
    assert {"graph.weight", "graph.matmul", "graph.add", "graph.gelu"} <= ops
    assert "graph.permute" not in ops
    want = g.element_dtype(p.func.function_type.outputs.data[0])
    assert want == (DType.F32 if dtype == torch.float32 else DType.BF16)


def test_bf16_weights_are_exact_float32():
    torch.manual_seed(2)
    m = MLP().to(torch.bfloat16)
    p = import_exported_program(export_model(m, (torch.randn(3, 37, dtype=torch.bfloat16),)))
    for name, w in p.weights.items():
        assert w.dtype == np.float32
        base, _, folded = name.partition(".weight.")
        ref = dict(m.named_parameters())[base + ".weight" if folded else name].detach().float()
        np.testing.assert_array_equal(w, (ref.T if folded else ref).numpy())
    ws = [op for op in graph_ops(p) if isinstance(op, g.WeightOp)]
    assert all(g.element_dtype(op.result.type) == DType.BF16 for op in ws)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_block_matches_eager(dtype):
    torch.manual_seed(3)
    p = compile_and_compare(AttentionBlock(), (torch.randn(2, 29, 52),), dtype)
    ops = {op.name for op in graph_ops(p)}
    assert {
        "graph.layer_norm", "graph.softmax", "graph.matmul", "graph.permute",
        "graph.reshape", "graph.div", "graph.gelu", "graph.add", "graph.constant",
    } <= ops
    # ln2 has no affine parameters: ones / zeros are synthesised
    lns = [op for op in graph_ops(p) if isinstance(op, g.LayerNormOp)]
    assert len(lns) == 2
    assert isinstance(lns[1].weight.owner, g.ConstantOp)
    np.testing.assert_array_equal(lns[1].weight.owner.values(), np.ones(52, np.float32))
    np.testing.assert_array_equal(lns[1].bias.owner.values(), np.zeros(52, np.float32))
    assert all(op.normalized_ndim.value.data == 1 for op in lns)
    assert math.isclose(lns[0].eps.value.data, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_zoo_matches_eager(dtype):
    torch.manual_seed(4)
    x, y = torch.randn(5, 29), torch.randn(5, 29)
    p = compile_and_compare(Zoo(), (x, y), dtype)
    assert p.input_names == ["x", "y"]
    assert len(p.output_names) == 2
    assert {"scale", "shift", "w"} <= set(p.weights)
    ops = {op.name for op in graph_ops(p)}
    for name in ("relu", "exp", "tanh", "sigmoid", "neg", "sqrt", "rsqrt", "maximum",
                 "sub", "mul", "div", "cast", "expand", "reshape", "matmul"):
        assert f"graph.{name}" in ops, name


def test_intermediates_available_for_bisection():
    torch.manual_seed(5)
    m = MLP()
    x = torch.randn(4, 37)
    p = import_exported_program(export_model(m, (x,)))
    outs, env = run_graph(p, [x.numpy()], keep=True)
    gelu = next(op for op in graph_ops(p) if isinstance(op, g.GeluOp))
    with torch.no_grad():
        ref = m.act(m.fc1(x)).numpy()
    np.testing.assert_allclose(env[gelu.result], ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# locations, printing
# ---------------------------------------------------------------------------


def test_locations_on_imported_ops():
    p = import_exported_program(export_model(MLP(), (torch.randn(3, 37),)))
    locs = {op.name: set() for op in graph_ops(p)}
    for op in graph_ops(p):
        loc = g.source_loc(op)
        # "fc1 (Linear) @ test_frontend.py:51": the layer, then the user's line
        assert re.fullmatch(r"([\w.]+ \(\w+\) @ )?[\w.]+\.py:\d+", loc), (op.name, loc)
        locs[op.name].add(loc)
    assert locs["graph.gelu"] == {f"act (GELU) @ {THIS}:{line_of('mlp-gelu')}"}
    assert locs["graph.matmul"] == {
        f"fc1 (Linear) @ {THIS}:{line_of('mlp-fc1')}", f"fc2 (Linear) @ {THIS}:{line_of('mlp-fc2')}"
    }
    # a weight is located at its first use
    w = next(op for op in graph_ops(p) if isinstance(op, g.WeightOp) and op.weight == "fc2.weight.permute")
    assert g.source_loc(w) == f"fc2 (Linear) @ {THIS}:{line_of('mlp-fc2')}"


def test_attention_locations():
    p = import_exported_program(export_model(AttentionBlock(), (torch.randn(1, 5, 52),)))
    sm = next(op for op in graph_ops(p) if isinstance(op, g.SoftmaxOp))
    assert g.source_loc(sm) == f"{THIS}:{line_of('attn-softmax')}"
    div = next(op for op in graph_ops(p) if isinstance(op, g.DivOp))
    assert g.source_loc(div) == f"{THIS}:{line_of('attn-scores')}"
    assert sm.axis == 3


def test_imported_module_roundtrips():
    p = import_exported_program(export_model(AttentionBlock(), (torch.randn(1, 5, 52),)))
    text = str(p.module)
    assert f'tilecc.loc = "{THIS}:' in text
    parsed = Parser(g.graph_context(), text).parse_module()
    parsed.verify()
    assert parsed.is_structurally_equivalent(p.module)
    x = np.random.default_rng(0).standard_normal((1, 5, 52)).astype(np.float32)
    q = g.GraphProgram(parsed, p.weights, p.input_names, p.output_names)
    np.testing.assert_array_equal(run_graph(p, [x])[0], run_graph(q, [x])[0])


def test_node_location_falls_back_to_node_name():
    ep = export_model(MLP(), (torch.randn(3, 37),))
    ph = next(n for n in ep.graph.nodes if n.op == "placeholder")
    assert node_location(ph) == ph.name


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_unsupported_ops_are_all_listed():
    ep = export_model(Unsupported(), (torch.randn(4, 6),))
    with pytest.raises(UnsupportedOpError) as info:
        import_exported_program(ep)
    ops = info.value.ops
    names = [n for n, _ in ops]
    assert ("aten.cumprod.default", f"{THIS}:{line_of('unsupported-cumprod')}") in ops
    digamma = [(n, loc) for n, loc in ops if n.startswith("aten.digamma")]
    assert digamma == [(digamma[0][0], f"{THIS}:{line_of('unsupported-digamma')}")]
    assert len(ops) == 2, names  # dependants (add, relu) are not reported
    msg = str(info.value)
    assert "aten.cumprod.default" in msg and "aten.digamma" in msg
    assert f"{THIS}:{line_of('unsupported-cumprod')}" in msg


def test_sdpa_is_kept_whole():
    ep = export_model(SDPA(), (torch.randn(1, 2, 5, 8),))
    p = import_exported_program(ep)
    (op,) = [op for op in graph_ops(p) if op.name == "graph.sdpa"]
    assert g.source_loc(op) == f"{THIS}:{line_of('sdpa')}"


def test_integer_input_is_i32_and_float64_is_fp32():
    class M(nn.Module):
        def forward(self, x, idx):
            return x * 2

    p = import_exported_program(export_model(M(), (torch.randn(3), torch.arange(3))))
    assert g.element_dtype(p.func.function_type.inputs.data[1]) == DType.I32
    assert p.input_dtypes == ["float32", "int64"]
    # the float64 policy (ir/float64.py): imported as fp32, the input listed for a remark
    ep = export_model(M(), (torch.randn(3), torch.randn(3, dtype=torch.float64)))
    p = import_exported_program(ep)
    assert g.element_dtype(p.func.function_type.inputs.data[1]) == DType.F32
    assert p.input_dtypes == ["float32", "float64"]
    assert float64.demoted(p.module) == [("input 'idx'", "<input>")]


def test_addmm_with_beta_and_alpha():
    class M(nn.Module):
        def forward(self, x):
            return torch.addmm(x, x, x, beta=2.0, alpha=0.5)  # addmm-beta

    x = torch.randn(4, 4)
    p = import_exported_program(export_model(M(), (x,)))
    (out,) = run_graph(p, [x.numpy()])
    np.testing.assert_allclose(out, M()(x).numpy(), rtol=1e-5, atol=1e-6)
    mul = next(op for op in graph_ops(p) if isinstance(op, g.MulOp))
    assert g.source_loc(mul) == f"{THIS}:{line_of('addmm-beta')}"


def test_layer_norm_statistics_are_reported():
    class M(nn.Module):
        def forward(self, x):
            y, mean, rstd = torch.native_layer_norm(x, [6], None, None, 1e-5)  # ln-stats
            return y + mean

    with pytest.raises(UnsupportedOpError) as info:
        import_exported_program(export_model(M(), (torch.randn(4, 6),)))
    assert info.value.ops == [
        ("aten.native_layer_norm.default (mean output)", f"{THIS}:{line_of('ln-stats')}")
    ]


def test_export_failure_is_wrapped():
    class M(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x
            return -x

    with pytest.raises(ExportError, match="torch.export failed on M") as info:
        export_model(M(), (torch.randn(3),))
    assert isinstance(info.value, TileccError)
    assert info.value.__cause__ is not None


def test_export_model_accepts_a_single_tensor_and_sets_eval():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    m.train()
    ep = export_model(m, torch.randn(2, 4))
    core = ep.run_decompositions(decomposition_table())
    ops = {str(n.target) for n in core.graph.nodes if n.op == "call_function"}
    assert not any("dropout" in o or "bernoulli" in o for o in ops), ops
    p = import_exported_program(ep)
    x = torch.randn(2, 4)
    with torch.no_grad():
        np.testing.assert_allclose(run_graph(p, [x.numpy()])[0], m.eval()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_aten_ops_of_the_example_models():
    """Documents the decomposed ops the example models produce (all importable)."""
    seen = set()
    seen |= aten_ops(MLP(), (torch.randn(2, 7, 37),))
    seen |= aten_ops(AttentionBlock(), (torch.randn(2, 5, 52),))
    seen |= aten_ops(Zoo(), (torch.randn(5, 29), torch.randn(5, 29)))
    assert {"aten.addmm.default", "aten.gelu.default", "aten._softmax.default",
            "aten.native_layer_norm.default", "aten.bmm.default", "aten.view.default",
            "aten.permute.default", "aten.expand.default"} <= seen


class _MaskedScores(torch.nn.Module):
    """A causal mask built from arange/comparisons/where: all compile-time constants."""

    def forward(self, s):
        n = s.shape[-1]
        i = torch.arange(n)
        mask = torch.where(i[None, :] <= i[:, None], 0.0, -1e9)
        return torch.softmax(s + mask, dim=-1)


def test_compile_time_constants_fold():
    p = import_exported_program(export_model(_MaskedScores(), (torch.randn(2, 7, 7),)))
    ops = {op.name for op in graph_ops(p)}
    assert ops == {"graph.weight", "graph.add", "graph.softmax"}, ops
    (name,) = p.weights
    assert p.weights[name].shape == (7, 7)
    x = torch.randn(2, 7, 7)
    (out,) = run_graph(p, [x.numpy()])
    np.testing.assert_allclose(out, _MaskedScores()(x).numpy(), rtol=1e-6, atol=1e-6)
