"""merge-linears (passes/graph/merge_linears.py): linears on one input become one matmul
by the concatenated weights, sliced back; the compiled programs match torch eager (fp32,
bf16 weights, int8 weights, a tiny Llama's prefill and decode), and what must not merge
(other inputs, a weight that is not a constant, another quantisation scheme) stays apart
with its remark."""

from __future__ import annotations

import copy
import sys
import types

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers import load_example, run_and_compare
from tilecc.frontend.export import export_model
from tilecc.frontend.torch_export import import_exported_program
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.bf16_weights import Bf16Weight
from tilecc.ir.meta_weights import MetaWeight
from tilecc.passes import remarks
from tilecc.passes.graph.canonicalize import canonicalize
from tilecc.passes.graph.merge_linears import merge_linears

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))


class Qkv(nn.Module):
    """An RMS norm read by three projections of different widths (GQA-like), each used."""

    def __init__(self, d: int = 64, bias: bool = False):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.q = nn.Linear(d, 64, bias=bias)
        self.k = nn.Linear(d, 32, bias=bias)
        self.v = nn.Linear(d, 32, bias=bias)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        return torch.tanh(q), k * 2.0, v


def _graph(model: nn.Module, *inputs):
    gp = import_exported_program(export_model(model.eval(), inputs))
    fn = gp.func
    canonicalize(fn, gp.weights)
    weights = dict(gp.weights)
    with remarks.collecting() as got:
        removed = merge_linears(gp.module, weights)
    return fn, weights, removed, [r.message for r in got.remarks]


def _ops(fn, kind):
    return [op for op in fn.body.block.ops if isinstance(op, kind)]


def test_three_linears_on_one_input_become_one_matmul():
    fn, weights, removed, notes = _graph(Qkv(), torch.randn(4, 64))
    assert removed == 2
    (mm,) = _ops(fn, g.MatmulOp)
    w = mm.operands[1].owner
    assert isinstance(w, g.WeightOp) and g.shape_of(w.result) == (64, 128)
    assert isinstance(mm.operands[0].owner, (g.RmsNormOp, g.ReshapeOp))  # the norm now has one reader
    slices = sorted(s.slice_params() for s in _ops(fn, gi.SliceOp) if s.input is mm.results[0])
    assert slices == [(1, 0, 64, 1), (1, 64, 96, 1), (1, 96, 128, 1)]
    sources = w.weight.split("+")
    assert len(sources) == 3 and not set(sources) & set(weights)  # the sources left the weights
    assert any("merged 3 linears" in n and "64 + 32 + 32" in n for n in notes)


def test_biases_merge_with_their_matmuls():
    torch.manual_seed(0)
    model = Qkv(bias=True)
    fn, weights, removed, notes = _graph(model, torch.randn(4, 64))
    assert removed == 2 and len(_ops(fn, g.MatmulOp)) == 1
    adds = [a for a in _ops(fn, g.AddOp) if isinstance(a.operands[0].owner, g.MatmulOp)
            or isinstance(a.operands[1].owner, g.MatmulOp)]
    (add,) = adds
    bias = next(o.owner for o in add.operands if isinstance(o.owner, g.WeightOp))
    want = torch.cat([model.q.bias, model.k.bias, model.v.bias]).detach().numpy()
    np.testing.assert_array_equal(np.asarray(weights[bias.weight]).reshape(-1), want)
    assert any("1 epilogue op(s) each" in n for n in notes)
    run_and_compare(model, (torch.randn(4, 64),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_qkv_matches_eager(dtype):
    torch.manual_seed(0)
    model = Qkv().to(dtype)
    if dtype == torch.bfloat16:  # the importer holds bf16 weights as bits: the merged one too
        fn, weights, _removed, _notes = _graph(model, torch.randn(4, 64, dtype=dtype))
        (mm,) = _ops(fn, g.MatmulOp)
        assert isinstance(weights[mm.operands[1].owner.weight], Bf16Weight)  # pyright: ignore[reportAttributeAccessIssue]
    for rows in (1, 8):  # a decode GEMV and a prefill-like block
        cm = run_and_compare(model, (torch.randn(rows, 64, dtype=dtype),), target="cloud")
        notes = [r["message"] for r in cm.program.meta["remarks"] if r["pass_name"] == "merge-linears"]
        assert any("merged 3 linears" in n for n in notes)


def test_int8_weights_merge_with_their_scales():
    from tilecc.quantize import quantize_weights

    torch.manual_seed(0)
    model = quantize_weights(Qkv().to(torch.bfloat16), "int8").eval()
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    fn, weights, removed, notes = _graph(model, x)
    assert removed == 2
    (mm,) = _ops(fn, g.MatmulOp)
    assert str(mm.operands[1].type.element_type) == "i8"  # pyright: ignore[reportAttributeAccessIssue]
    assert any("merged 3 linears" in n and "1 epilogue op(s) each" in n for n in notes)  # the scale
    run_and_compare(model, (x,), target="cloud")


def test_mixed_quantisation_schemes_do_not_merge():
    from tilecc.quantize import quantize_weights

    torch.manual_seed(0)
    model = quantize_weights(Qkv().to(torch.bfloat16), "int8", skip=("v",)).eval()
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    fn, _weights, removed, notes = _graph(model, x)
    assert removed == 1  # q and k (int8) merge, v (bf16) stays
    assert len(_ops(fn, g.MatmulOp)) == 2
    assert any("different element types" in n for n in notes)
    run_and_compare(model, (x,), target="cloud")


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 16, bias=False)
        self.b = nn.Linear(32, 16, bias=False)
        self.c = nn.Linear(32, 16, bias=False)

    def forward(self, x, y, w):
        return self.a(x), self.b(y), self.c(x) * (x @ w)


def test_other_inputs_and_non_constant_weights_stay_apart():
    torch.manual_seed(0)
    inputs = (torch.randn(4, 32), torch.randn(4, 32), torch.randn(32, 16))
    fn, _weights, removed, notes = _graph(TwoInputs(), *inputs)
    # a(x) and c(x) merge; b reads y; x @ w has a weight that is an input
    assert removed == 1 and len(_ops(fn, g.MatmulOp)) == 3
    assert any("its weight is not a compile-time constant" in n for n in notes)
    mm_b = [m for m in _ops(fn, g.MatmulOp) if g.shape_of(m.operands[1]) == (32, 16)
            and isinstance(m.operands[1].owner, g.WeightOp)]
    assert len(mm_b) == 1  # b's own matmul, unmerged
    run_and_compare(TwoInputs(), inputs)


def test_program_outputs_that_are_slices_match_eager():
    class Outs(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(32, 24, bias=False), nn.Linear(32, 8, bias=False)

        def forward(self, x):
            return self.q(x), self.k(x)

    torch.manual_seed(0)
    cm = run_and_compare(Outs(), (torch.randn(4, 32),))
    assert any("merged 2 linears" in r["message"] for r in cm.program.meta["remarks"])


def test_meta_weights_merge_to_a_meta_weight():
    with torch.device("meta"):
        model = Qkv()
    fn, weights, removed, _notes = _graph(model, torch.randn(4, 64, device="meta"))
    assert removed == 2
    (mm,) = _ops(fn, g.MatmulOp)
    w = weights[mm.operands[1].owner.weight]  # pyright: ignore[reportAttributeAccessIssue]
    assert isinstance(w, MetaWeight) and w.shape == (64, 128)


def _examples():
    return load_example("llm.py", "tilecc_test_merge_examples")


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8"])
def test_tiny_llama_prefill_and_decode_match_eager(weights):
    from tilecc.llm.programs import compile_programs
    from tilecc.llm.static_cache import StaticCacheLM

    model = _examples().tiny_llama()
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    if weights == "int8":
        from tilecc.quantize import quantize_weights

        model = quantize_weights(model.to(torch.bfloat16), "int8", skip=("lm_head",))
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    progs = compile_programs(copy.deepcopy(model), batch=1, prompt_len=6, max_len=10, cache=False)
    eager = StaticCacheLM(copy.deepcopy(model), batch=1, max_len=10).eval()
    tol = dict(rtol=1e-4, atol=1e-4) if weights == "fp32" else dict(rtol=3e-2, atol=3e-2)
    with torch.no_grad():
        want = eager(ids, torch.arange(6), last_only=True)
    torch.testing.assert_close(progs.prefill(ids, torch.arange(6)).float(), want.float(), **tol)
    token = want[:, -1].argmax(-1, keepdim=True)
    with torch.no_grad():
        want = eager(token, torch.tensor([6]), last_only=True)
    torch.testing.assert_close(progs.decode(token, torch.tensor([6])).float(), want.float(), **tol)
    for prog, gated in ((progs.prefill, 0), (progs.decode, 2)):
        notes = [r["message"] for r in prog.program.meta["remarks"] if r["pass_name"] == "merge-linears"]
        # per layer: q/k/v; gate/up only in decode (one row: no fused epilogue to keep)
        assert sum("merged 3 linears" in n for n in notes) == 2
        assert sum("merged 2 linears" in n for n in notes) == gated
        assert sum("meet in an elementwise op" in n for n in notes) == 2 - gated


class GatedMlp(nn.Module):
    def __init__(self, d: int = 64, h: int = 128):
        super().__init__()
        self.gate, self.up = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("rows", [1, 8])
def test_gated_mlp_merges_only_for_one_row(rows):
    """Several rows: silu(gate) * up stays the up matmul's fused epilogue (merged, it
    would be a vector kernel of its own); one row (a decode GEMV): gate and up merge."""
    torch.manual_seed(0)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    model = GatedMlp().to(torch.bfloat16)
    fn, _weights, removed, notes = _graph(model, x)
    assert removed == (1 if rows == 1 else 0)
    assert len(_ops(fn, g.MatmulOp)) == (2 if rows == 1 else 3)
    assert any("meet in an elementwise op" in n for n in notes) == (rows > 1)
    run_and_compare(model, (x,), target="cloud")
