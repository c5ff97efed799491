"""The fused MLP kernel (passes/graph/fuse_mlp.py, passes/graph_to_tile/mlp/): layer norm,
up projection, bias, activation (or SwiGLU's gate), down projection, bias, residual as one
kernel whose hidden stays in SRAM. Every compiled program is checked against torch eager (with the
simulator's sanitisers, `run_and_compare`); the stream is checked for the structure the
lowering promises (one kernel, only the output stored); the fallback says why."""

import numpy as np
import pytest
import torch
from helpers import run_and_compare
from hypothesis import given, settings
from hypothesis import strategies as st

import tilecc
from tilecc.ir.weight_layout import source_of
from tilecc.simulator.isa import Opcode

ACTS = {
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "gelu": torch.nn.functional.gelu,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
}


class Mlp(torch.nn.Module):
    """A transformer MLP: optional layer norm, fc1 + bias, activation, fc2 + bias,
    optional residual (GPT-2's ln_2 / c_fc / gelu_new / c_proj / + x)."""

    def __init__(self, d: int, h: int, *, ln: bool = True, residual: bool = True, act: str = "gelu_tanh"):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d) if ln else None
        self.fc1, self.fc2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)
        self.residual, self.act = residual, ACTS[act]

    def forward(self, x):
        y = self.ln(x) if self.ln is not None else x
        out = self.fc2(self.act(self.fc1(y)))
        return out + x if self.residual else out


class SwiGlu(torch.nn.Module):
    """Llama's gated MLP: down(silu(gate(x)) * up(x)) (+ x), no biases."""

    def __init__(self, d: int, h: int, residual: bool = True, norm: bool = False):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6) if norm else None
        self.gate, self.up = torch.nn.Linear(d, h, bias=False), torch.nn.Linear(d, h, bias=False)
        self.down, self.residual = torch.nn.Linear(h, d, bias=False), residual

    def forward(self, x):
        y = self.norm(x) if self.norm is not None else x
        out = self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))
        return out + x if self.residual else out


def _kernels(cm) -> list[str]:
    return [name for name, _, _ in cm.program.kernels]


def _stored_elements(cm, kernel: str) -> int:
    """Elements the kernel's DMA stores write to HBM."""
    (a, c), = [(a, c) for name, a, c in cm.program.kernels if kernel in name]
    s = cm.program.stream[a:a + c]
    stores = s["opcode"] == Opcode.DMA_STORE
    return int((s["rows"][stores].astype(np.int64) * s["cols"][stores]).sum())


def _check(model, x, target="cloud"):
    cm = run_and_compare(model, (x,), target=target)
    return cm, [str(r) for r in cm.program.meta.get("remarks", [])]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ln,residual", [(True, True), (False, False), (True, False), (False, True)])
def test_gpt2_mlp_is_one_kernel(dtype, ln, residual):
    """ln -> c_fc -> gelu_new -> c_proj (-> + x): one kernel, equal to eager, and the
    only HBM stores are the output's M x d elements (the hidden is never stored)."""
    torch.manual_seed(0)
    model = Mlp(256, 1024, ln=ln, residual=residual).to(dtype)
    x = torch.randn(1, 256, 256, dtype=dtype)
    cm, got = _check(model, x)
    assert _kernels(cm) == ["k0_fused_mlp"]
    assert _stored_elements(cm, "fused_mlp") == 256 * 256
    assert any("hidden computed transposed" in r for r in got)
    # W2 stored pre-tiled (whole tiles): a derived weight of fc2's; W1 too where the
    # chosen schedule's hidden groups divide H (the remark says which)
    sources = sorted(source_of(w.name) or "" for w in cm.program.weights if source_of(w.name))
    w1_tiled = any("pre-tiled: W1 yes" in r for r in got)
    assert [s.split(".")[0] for s in sources] == (["fc1", "fc2"] if w1_tiled else ["fc2"])
    assert all(s.split(".")[1] == "weight" for s in sources)


@pytest.mark.parametrize("act", ["gelu", "relu", "silu"])
def test_odd_sizes_and_activations(act):
    """Sizes that are no multiples of 128 (partial m-tiles, k-tiles, hidden tiles and
    output chunks), exact gelu, relu and silu."""
    torch.manual_seed(0)
    model = Mlp(200, 328, act=act).to(torch.bfloat16)
    x = torch.randn(1, 333, 200, dtype=torch.bfloat16)
    cm, _ = _check(model, x)
    assert _kernels(cm) == ["k0_fused_mlp"]
    assert _stored_elements(cm, "fused_mlp") == 333 * 200


@pytest.mark.parametrize("m,d,h,dtype", [(200, 32, 72, torch.float32), (37, 50, 100, torch.bfloat16)])
def test_tiny_target(m, d, h, dtype):
    """`tiny` (16 partitions, a 16 x 16 array): many m-tiles (the loop over pairs of
    m-tiles and its peeled ends), every size a partial tile."""
    torch.manual_seed(0)
    model = Mlp(d, h).to(dtype)
    x = torch.randn(1, m, d, dtype=dtype)
    cm, _ = _check(model, x, target="tiny")
    assert _kernels(cm) == ["k0_fused_mlp"]
    assert _stored_elements(cm, "fused_mlp") == m * d


@settings(max_examples=4, deadline=None)
@given(m=st.integers(2, 300), d=st.integers(2, 260), h=st.integers(2, 400), ln=st.booleans(),
       act=st.sampled_from(sorted(ACTS)))
def test_sizes(m, d, h, ln, act):
    torch.manual_seed(0)
    model = Mlp(d, h, ln=ln, act=act)
    x = torch.randn(1, m, d)
    cm, _ = _check(model, x)
    assert len(_kernels(cm)) >= 1


@pytest.mark.parametrize("m,d,h,dtype,target", [(256, 256, 512, torch.bfloat16, "cloud"),
                                                (50, 32, 80, torch.float32, "tiny")])
def test_swiglu_is_one_kernel(m, d, h, dtype, target):
    """The gated MLP: the up matmul joins the group; per hidden tile a second
    accumulator holds x @ Wu, and silu(gate) * up is the activation: one kernel, only
    the output stored."""
    torch.manual_seed(0)
    model = SwiGlu(d, h, norm=False).to(dtype)
    x = torch.randn(1, m, d, dtype=dtype)
    cm, _ = _check(model, x, target=target)
    kernels = _kernels(cm)
    assert [k for k in kernels if "copy" not in k] == [f"k{len(kernels) - 1}_fused_mlp"]
    assert _stored_elements(cm, "fused_mlp") == m * d


@pytest.mark.parametrize("m,d,h,dtype", [(256, 256, 512, torch.bfloat16), (200, 96, 200, torch.float32)])
def test_swiglu_with_its_norm(m, d, h, dtype):
    """A norm read by both the gate and the up projection is fuse-graph's shared
    prologue (computed once, in the gate projection's kernel, which stores it for the up
    projection): that rule runs before fuse-mlp, so the gated MLP keeps three matmul
    kernels and no norm kernel (fuse-mlp's `_norm_of` finds no lone norm; choosing the
    mlp group where its weights fit would need the fit known at fuse time). Equal to eager."""
    torch.manual_seed(0)
    model = SwiGlu(d, h, norm=True).to(dtype)
    x = torch.randn(1, m, d, dtype=dtype)
    cm, _ = _check(model, x, target="cloud")
    kernels = [k for k in _kernels(cm) if "copy" not in k]
    assert not any("rms_norm" in k for k in kernels)
    assert sum("fused_matmul" in k for k in kernels) == 3


def test_llama_decoder_mlp_norm_is_no_kernel():
    from helpers import small_llama

    model, ids = small_llama(batch=2, seq=64)
    cm = run_and_compare(model, ids, target="cloud")
    # post_attention_layernorm is the gate projection's prologue: the final norm is the only one
    assert sum("rms_norm" in k for k in _kernels(cm)) == 1


def test_falls_back_when_the_weights_do_not_fit():
    """On `tiny` (1 MiB of SRAM) W1 and W2 of a 64 x 2048 MLP cannot stay resident: the
    two matmul groups run as their own kernels, equal to eager, and a remark says why."""
    torch.manual_seed(0)
    model = Mlp(64, 2048)
    x = torch.randn(1, 32, 64)
    cm, got = _check(model, x, target="tiny")
    assert not any("fused_mlp" in k for k in _kernels(cm))
    missed = [r for r in got if "mlp group not fused" in r]
    assert missed and "no schedule fits SRAM" in missed[0]


def test_hidden_with_another_user_is_not_joined():
    """A hidden read twice (returned as well) is no mlp group: it must reach HBM."""

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return self.fc2(h), h

    torch.manual_seed(0)
    model = Two()
    x = torch.randn(1, 128, 64)
    cm = tilecc.compile(model.eval(), (x,), target="cloud")
    got = cm(x)
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    assert not any("fused_mlp" in k for k in _kernels(cm))


def test_cost_model_charges_an_uneven_w1_split():
    """GPT-2's MLP (768 x 3072, bf16, 512 tokens) on `cloud` (three weight queues): with
    g=6, W1 is 4 equal DMAs (W2 4 of the same size after them); the queue holding two W1
    DMAs ends its second once the other queues moved as many bytes, W2's included: six
    DMAs' bytes at the HBM peak, not W1's four. The model then prefers an even split
    (measured in the simulator: g=4 225,219 cycles, g=6 233,831)."""
    from tilecc.passes.graph_to_tile.mlp.cost import choose, estimate, weight_arrivals
    from tilecc.passes.graph_to_tile.mlp.problem import MlpProblem
    from tilecc.passes.graph_to_tile.mlp.schedule import MlpSchedule
    from tilecc.passes.schedule.matmul_schedule import MatmulProblem
    from tilecc.simulator.config import load_config
    from tilecc.simulator.timing import TimingRules

    cfg = load_config("cloud")
    t = MatmulProblem.make(cfg, 512, 768, 768)
    p = MlpProblem(512, 768, 3072, 768, 2, 2, False, t.TM, t.TK, t.TN, w1_tileable=True, w2_group=6)
    assert cfg.dma.queues == 4 and p.nh == 24
    one = 768 * 6 * 128 * 2  # bytes of one W1 group (and of one W2 group) at g=6
    _, w1_all, _ = weight_arrivals(p, MlpSchedule(6, 6), cfg)
    fixed = float(TimingRules(cfg).dma_fixed(p.TK))
    assert w1_all == pytest.approx(fixed + 6 * one / cfg.hbm.bytes_per_cycle)
    assert estimate(p, MlpSchedule(4, 6), cfg) < estimate(p, MlpSchedule(6, 6), cfg)
    assert choose(p, cfg) == MlpSchedule(4, 6)


@pytest.mark.parametrize("fuse_mlp", [True, False])
def test_remarks_say_the_groups_were_joined(fuse_mlp):
    """fuse-graph's 'did not fuse' remark for the down projection's matmul is withdrawn
    when fuse-mlp joins the two groups (it stays, and is true, with fuse-mlp off)."""
    from tilecc.frontend.torch_export import export_model, import_exported_program
    from tilecc.passes import remarks
    from tilecc.runtime.compare import tolerance
    from tilecc.runtime.compiler import compile_graph
    from tilecc.runtime.executor import run_program
    from tilecc.simulator.config import load_config

    torch.manual_seed(0)
    model = Mlp(64, 256).to(torch.bfloat16).eval()
    x = torch.randn(1, 128, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        gp = import_exported_program(export_model(model, (x,)))
        want = model(x)
    prog = compile_graph(gp, load_config("cloud"), disabled=set() if fuse_mlp else {"fuse-mlp"})
    got = [remarks.Remark.from_dict(r) for r in prog.meta["remarks"]]
    (out,), _ = run_program(prog, (x,), sanitize=True)
    rtol, atol = tolerance(want.dtype, float(want.float().abs().max()))
    torch.testing.assert_close(out.float(), want.float(), rtol=rtol, atol=atol)
    stale = [r for r in got
             if (r.pass_name, r.kind) == ("fuse-graph", "missed") and "into the matmul group of" in r.message]
    joined = [r for r in got if (r.pass_name, r.kind) == ("fuse-mlp", "passed")]
    names = [name for name, _, _ in prog.kernels]
    if fuse_mlp:
        assert joined and not stale, [str(r) for r in got]
        assert names == ["k0_fused_mlp"]
    else:
        assert len(stale) == 1 and not joined, [str(r) for r in got]
        assert "fc2" in stale[0].loc and "another matmul's output" in stale[0].message
        assert len(names) == 2
