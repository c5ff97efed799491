"""Training graphs without needless copies: outputs that are views of inputs (a forward's
transposed weights, saved for the backward) stay host views (runtime/host_views.py), and
expanded (stride-0) operands are broadcasts, not one-element-per-descriptor DMA reads;
gradients against eager autograd."""

import copy

import numpy as np
import torch
from torch import nn

import tilecc.runtime.compiler as compiler
from tilecc.runtime.host_views import host_view_outputs
from tilecc.runtime.train_step import TrainStep
from tilecc.simulator.isa import Opcode

aten = torch.ops.aten


def test_host_view_outputs_copies_a_shared_chain_and_moves_a_lone_one():
    g = torch.fx.Graph()
    w, x = g.placeholder("w"), g.placeholder("x")
    t = g.call_function(aten.permute.default, (w, [1, 0]))
    y = g.call_function(aten.mm.default, (x, t))
    u = g.call_function(aten.unsqueeze.default, (x, 0))  # used by the output alone
    g.output((y, t, u))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    host = host_view_outputs(gm)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    y2, t2, u2 = out.args[0]
    assert y2 is y and u2 is u and t2 is not t  # the matmul keeps its own permute
    assert host == {t2, u} and t2.target is aten.permute.default and t2.args[0] is w
    gm.recompile()
    wv, xv = torch.randn(4, 3), torch.randn(2, 3)
    ry, rt, ru = gm(wv, xv)
    torch.testing.assert_close(ry, xv @ wv.t())
    assert rt.data_ptr() == wv.data_ptr() and ru.data_ptr() == xv.data_ptr()  # views, no copies


class _LnLinear(nn.Module):
    """A written-out layer norm (its backward expands per-row values) and a linear."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 384)

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        xc = x - mu
        return self.fc(xc * torch.rsqrt((xc * xc).mean(-1, keepdim=True) + 1e-5))


def test_training_step_has_no_weight_copy_and_no_broadcast_dma(monkeypatch):
    monkeypatch.setenv("TILECC_COMPILE_CACHE", "0")
    progs = []
    orig = compiler.compile_graph

    def spy(gp, cfg, **kw):
        p = orig(gp, cfg, **kw)
        progs.append(p)
        return p

    monkeypatch.setattr(compiler, "compile_graph", spy)
    torch.manual_seed(0)
    model = _LnLinear()
    x, go = torch.randn(4, 32, 256), torch.randn(4, 32, 384)
    ref = copy.deepcopy(model)
    xr = x.clone().requires_grad_(True)
    ref(xr).backward(go)
    r = TrainStep(model, target="cloud", loss=None).run(x, grad_output=go, input_grad=True)
    for k, p in ref.named_parameters():
        torch.testing.assert_close(r.grads[k], p.grad, rtol=2e-4, atol=2e-4, msg=k)
    torch.testing.assert_close(r.input_grads[0], xr.grad, rtol=2e-4, atol=2e-4)
    assert len(progs) == 2  # forward, backward
    # the forward saves the transposed weight for the backward: a host view of the
    # weight, not an output of the NPU program
    assert (256, 384) not in [tuple(o.shape) for o in progs[0].outputs]
    for p in progs:
        st = p.stream
        dma = st[np.isin(st["opcode"], [int(Opcode.DMA_LOAD), int(Opcode.DMA_STORE)])]
        broadcast = (dma["hbm_cs"] == 0) & (dma["cols"] > 1) & (dma["rows"] > 1)
        assert not broadcast.any(), "a stride-0 (broadcast) tile read by DMA"
