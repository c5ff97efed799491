"""The roofline bound is the workload's intrinsic work (ir/graph_work.py), counted on the
imported graph: hand-computed expectations from the shapes, both attention forms alike,
and the same bound at every opt level and matmul schedule."""

import math
import types

import pytest
import torch
import torch.nn.functional as F

from tilecc.errors import TileccError
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import graph as g
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.ir.graph_work import WORK_TABLE, graph_work
from tilecc.passes.schedule.autotune import Autotuner
from tilecc.runtime.compiler import compile_graph
from tilecc.simulator.config import load_config
from tilecc.simulator.roofline import WORK_KEYS, roofline
from tilecc.simulator.timing import core_cycles_per

BF = torch.bfloat16


def _import(model, *inputs):
    with torch.no_grad():
        return import_exported_program(export_model(model.eval(), inputs))


class Linear(torch.nn.Module):
    def __init__(self, K, N):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(K, N) / K**0.5)

    def forward(self, x):
        return x @ self.w


def test_every_graph_op_has_a_rule():
    """No op counts 0 by omission: each has a row of the table (unknown ops are errors)."""
    assert set(g.ALL_OPS) | {DslCallOp} <= set(WORK_TABLE)


@pytest.mark.parametrize("target", ["cloud", "tiny"])
def test_gemm(target):
    M, K, N = 256, 384, 512
    cfg = load_config(target)
    gp = _import(Linear(K, N).to(BF), torch.randn(M, K, dtype=BF))
    w = graph_work(gp, cfg)
    assert (w.macs_16, w.macs_fp32) == (M * K * N, 0)
    assert w.compulsory_hbm_bytes == (M * K + K * N + M * N) * 2
    # the bf16 result leaves the fp32 accumulator through one vector copy (DMA never converts)
    assert w.vector_element_cycles == M * N * cfg.vector.op_cost.unary["copy"]
    r = roofline(w.figures(), cfg)
    R, C = cfg.matrix.rows, cfg.matrix.cols
    assert r["matrix"] == pytest.approx(M * K * N / (R * C) * core_cycles_per(cfg, "matrix"))
    assert r["hbm"] == pytest.approx((M * K + K * N + M * N) * 2 / cfg.hbm.bytes_per_cycle)
    assert r["vector"] == pytest.approx(M * N / cfg.vector.lanes * core_cycles_per(cfg, "vector"))


S, D, H, FF = 16, 32, 2, 64  # the transformer block's sizes
DH = D // H


class Block(torch.nn.Module):
    """A pre-LN transformer block; `explicit` writes attention the way eager models do."""

    def __init__(self, explicit: bool):
        super().__init__()
        self.explicit = explicit
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        for ln in (self.ln1, self.ln2):  # an affine that is not the identity
            torch.nn.init.normal_(ln.weight)
            torch.nn.init.normal_(ln.bias)
        self.qkv, self.out = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
        self.fc1, self.fc2 = torch.nn.Linear(D, FF), torch.nn.Linear(FF, D)
        self.register_buffer("causal", torch.ones(S, S, dtype=torch.bool).tril(), persistent=False)

    def attend(self, q, k, v):
        if not self.explicit:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(DH))
        s = s.masked_fill(~self.causal, torch.finfo(s.dtype).min)  # transformers' mask value
        return torch.softmax(s, dim=-1) @ v

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(1, S, H, DH).transpose(1, 2) for t in (q, k, v))
        a = self.attend(q, k, v).transpose(1, 2).reshape(1, S, D)
        x = x + self.out(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _block_expectation(cfg):
    c = cfg.vector.op_cost
    un, bi, re = c.unary, c.binary, c.reduce
    pairs = S * (S + 1) // 2  # torch's top-left causal mask
    macs = S * D * 3 * D + S * D * D + S * D * FF + S * FF * D + H * (DH + DH) * pairs
    ln = re["sum"] + bi["sub"] + un["square"] + re["sum"] + bi["mul"]  # the affine folds into the linear
    vector = (
        2 * S * D * ln
        + (S * 3 * D + S * D + S * FF + S * D) * bi["add"]  # biases: one input (a column)
        + 2 * S * D * bi["add"] * 2  # residuals: two tensor inputs
        + S * FF * un["gelu"]
        + H * pairs * (re["max"] + un["exp"])  # attention per unmasked pair (sub, sum: on the array)
        + H * S * DH * bi["mul"]  # its final normalisation
        + H * S * DH * bi["mul"]  # its scale, folded into q
    )
    weights = D * 3 * D + 3 * D + D * D + D + D * FF + FF + FF * D + D + 4 * D
    hbm = (S * D + S * D + weights) * 2
    return macs, vector, hbm


def test_transformer_block_both_attention_forms_give_the_hand_computed_bound():
    cfg = load_config("cloud")
    want = _block_expectation(cfg)
    works = []
    for explicit in (False, True):
        torch.manual_seed(0)
        gp = _import(Block(explicit).to(BF), torch.randn(1, S, D, dtype=BF))
        w = graph_work(gp, cfg)
        assert (w.macs_16, w.vector_element_cycles, w.compulsory_hbm_bytes) == want
        assert w.macs_fp32 == 0 and w.by_op["attention"]["count"] == 1
        works.append(w)
    assert works[0].by_op["attention"] == works[1].by_op["attention"]


def test_small_cnn():
    """conv (its batch norm folded by the importer) + relu + max pool + linear, fp32."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10),
    )
    cfg = load_config("cloud")
    w = graph_work(_import(model, torch.randn(1, 3, 8, 8)), cfg)
    c = cfg.vector.op_cost
    conv_out = 8 * 8 * 8
    assert (w.macs_16, w.macs_fp32) == (0, conv_out * 3 * 3 * 3 + 128 * 10)
    # 2x2 windows read directly (64 per channel) beat the separable order (8*4*2 + 4*2*4)
    assert w.vector_element_cycles == (
        conv_out * c.binary["add"] + conv_out * c.unary["relu"] + 8 * 4 * 4 * 4 * c.reduce["max"]
        + 10 * c.binary["add"] * 2  # the bias is a full [10] tensor of the [1, 10] result
    )
    weights = 8 * 3 * 9 + 8 + 128 * 10 + 10  # folded conv weight and bias, linear
    assert w.compulsory_hbm_bytes == (3 * 64 + 10 + weights) * 4
    r = roofline(w.figures(), cfg)
    assert r["matrix"] == pytest.approx(w.macs_fp32 * cfg.matrix.fp32_slowdown / (128 * 128))


@pytest.mark.parametrize("k, stride, pad, per_channel", [
    (3, 2, 1, 11 * 11),  # taps inside the 8x8 input per dim: 2 + 3 + 3 + 3; direct 121 < 8*11 + 4*11
    (3, 1, 0, 8 * 6 * 3 + 6 * 6 * 3),  # stride 1: rows then columns (252) beat direct (324)
])
def test_max_pool_reads_the_fewest_taps(k, stride, pad, per_channel):
    cfg = load_config("tiny")
    w = graph_work(_import(torch.nn.MaxPool2d(k, stride, pad), torch.randn(1, 2, 8, 8)), cfg)
    assert w.vector_element_cycles == 2 * per_channel * cfg.vector.op_cost.reduce["max"]


def test_embedding_counts_the_gathered_rows_and_a_tied_table_whole():
    class Emb(torch.nn.Module):
        def __init__(self, tied):
            super().__init__()
            self.tied = tied
            self.e = torch.nn.Embedding(1000, 16)

        def forward(self, ids):
            h = self.e(ids)
            return h @ self.e.weight.t() if self.tied else h

    cfg = load_config("tiny")
    ids = torch.randint(0, 1000, (1, 8))
    w = graph_work(_import(Emb(False), ids), cfg)
    assert w.compulsory_hbm_bytes == 8 * 4 + 8 * 16 * 4 + 8 * 16 * 4  # ids, output, 8 rows
    w = graph_work(_import(Emb(True), ids), cfg)
    assert w.compulsory_hbm_bytes == 8 * 4 + 8 * 1000 * 4 + 1000 * 16 * 4  # the table, whole


class Attention(torch.nn.Module):
    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


def test_causal_attention_same_bound_at_every_level_and_no_compiler_constants():
    """-O0 and -O2 lower causal attention differently (masks, identities: compiler
    constants); the bound is the hand count at both."""
    cfg = load_config("tiny")
    L, E = 32, 16
    x = [torch.randn(1, 1, L, E, dtype=BF) for _ in range(3)]
    gp = _import(Attention(), *x)
    c = cfg.vector.op_cost
    pairs = L * (L + 1) // 2
    want = {
        "macs_16": pairs * 2 * E, "macs_fp32": 0,
        "vector_element_cycles": pairs * (c.reduce["max"] + c.unary["exp"]) + 2 * L * E * c.binary["mul"],
        "compulsory_hbm_bytes": 4 * L * E * 2,
    }
    for level in (0, 2):
        prog = compile_graph(gp, cfg, opt_level=level)
        assert {k: prog.work[k] for k in WORK_KEYS} == want, level
        assert prog.work["program_hbm_bytes"] >= want["compulsory_hbm_bytes"]


def test_a_constant_mask_counts_like_causal():
    """A tril buffer as an additive mask (transformers' finfo.min) masks the same pairs as
    causal=True; the mask's data is not compulsory traffic."""
    class Masked(torch.nn.Module):
        def __init__(self, L):
            super().__init__()
            keep = torch.ones(L, L, dtype=torch.bool).tril()
            self.register_buffer("mask", torch.zeros(L, L).masked_fill(~keep, torch.finfo(torch.float32).min))

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)

    cfg = load_config("tiny")
    L, E = 24, 8
    x = [torch.randn(1, 2, L, E) for _ in range(3)]
    causal, masked = graph_work(_import(Attention(), *x), cfg), graph_work(_import(Masked(L), *x), cfg)
    assert masked.figures() == causal.figures()
    assert causal.macs_fp32 == 2 * (L * (L + 1) // 2) * 2 * E


def test_explicit_attention_on_inputs_reads_them():
    """The chain's matmuls read q, k and v straight from the inputs: their bytes count."""
    class Explicit(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    cfg = load_config("tiny")
    L, E = 16, 8
    w = graph_work(_import(Explicit(), *(torch.randn(L, E) for _ in range(3))), cfg)
    c = cfg.vector.op_cost
    assert w.by_op["attention"]["count"] == 1 and w.macs_fp32 == L * L * 2 * E
    assert w.vector_element_cycles == L * L * (c.reduce["max"] + c.unary["exp"]) + L * E * c.binary["mul"]
    assert w.compulsory_hbm_bytes == 4 * L * E * 4


def test_a_run_time_mask_counts_every_pair():
    """Nothing is masked at compile time; adding the mask costs the bound nothing (the
    array can add it), its bytes are an input's."""
    cfg = load_config("tiny")
    L, E = 8, 4
    x = [torch.randn(1, 1, L, E) for _ in range(3)]
    w = graph_work(_import(Attention(), *x, torch.randn(L, L)), cfg)
    c = cfg.vector.op_cost
    per = c.reduce["max"] + c.unary["exp"]
    assert w.macs_fp32 == L * L * 2 * E
    assert w.vector_element_cycles == L * L * per + 2 * L * E * c.binary["mul"]
    assert w.compulsory_hbm_bytes == (4 * L * E + L * L) * 4


def test_a_decomposed_gelu_counts_as_the_one_function():
    class GeluNew(torch.nn.Module):  # GPT-2's gelu_new, as torch.export writes it out
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    class Silu(torch.nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(x)

    cfg = load_config("cloud")
    x = torch.randn(64, 96)
    for model, fn in ((GeluNew(), "gelu_tanh"), (Silu(), "silu")):
        w = graph_work(_import(model, x), cfg)
        assert w.vector_element_cycles == 64 * 96 * cfg.vector.op_cost.unary[fn]


@pytest.mark.parametrize("explicit", [False, True])
def test_the_bound_never_exceeds_the_programs_own_work(explicit):
    """On every resource the compiled program (either level) does at least the bound's work."""
    cfg = load_config("tiny")
    gp = _import(Block(explicit).to(BF), torch.randn(1, S, D, dtype=BF))
    for level in (0, 2):
        w = compile_graph(gp, cfg, opt_level=level).work
        own = {"macs_16": w["program_macs_16"], "macs_fp32": w["program_macs_fp32"],
               "vector_element_cycles": w["program_vector_element_cycles"],
               "compulsory_hbm_bytes": w["program_hbm_bytes"]}
        bound, program = roofline(w, cfg), roofline(own, cfg)
        assert all(bound[k] <= program[k] for k in bound), (level, bound, program)


def test_the_bound_ignores_the_matmul_schedule(tmp_path):
    cfg = load_config("tiny")
    x = torch.randn(48, 96, dtype=BF)
    gp = _import(Linear(96, 64).to(BF), x)
    base = compile_graph(gp, cfg)
    for prog in (
        compile_graph(gp, cfg, opt_level=0),
        compile_graph(gp, cfg, autotune=Autotuner(cfg, tmp_path, max_candidates=2)),
    ):
        assert {k: prog.work[k] for k in WORK_KEYS} == {k: base.work[k] for k in WORK_KEYS}
    assert base.work["macs_16"] == 48 * 96 * 64


def test_a_dsl_call_without_its_work_is_an_error():
    kernel = types.SimpleNamespace(name="k", ast=types.SimpleNamespace(source="kernel k()", filename="k.tdsl"))
    gp = _import(torch.nn.ReLU(), torch.randn(4, 4))
    ret = gp.func.body.block.last_op
    assert ret is not None
    call = DslCallOp([gp.func.body.block.args[0]], [gp.func.body.block.args[0].type], kernel)
    gp.func.body.block.insert_op_before(call, ret)
    with pytest.raises(TileccError, match="graph.dsl_call of kernel 'k'"):
        graph_work(gp, load_config("tiny"))
