"""The collective operators a sharded graph carries, the cut into segments, and the data
movement of the system runtime's collectives (no compile: fast)."""

import numpy as np
import pytest
import torch

from tilecc.frontend import collective_ops  # noqa: F401 (registers torch.ops.tilecc.*)
from tilecc.frontend.collective_ops import collective_name
from tilecc.frontend.segments import Segment, split_at_collectives

ops = torch.ops.tilecc


class TwoLinears(torch.nn.Module):
    """x -> fc1 -> all_reduce -> + x -> all_gather(dim 1) twice (one runs) -> fc2, fc3."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8, bias=False)
        self.fc2 = torch.nn.Linear(8, 4)
        self.fc3 = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = ops.all_reduce(self.fc1(x), 2) + x
        a = self.fc2(ops.all_gather(h, 1, 2))
        b = self.fc3(ops.all_gather(h, 1, 2))
        return a * b, h


def test_fake_shapes_and_names():
    x = torch.randn(2, 6, 8)
    assert ops.reduce_scatter(x, 1, 3).shape == (2, 2, 8)
    assert ops.all_gather(x, 2, 2).shape == (2, 6, 16)
    assert ops.shard(x, 0, 2).shape == (1, 6, 8)
    assert torch.equal(ops.all_reduce(x, 4), x) and torch.equal(ops.send_recv(x, 0, 1), x)
    assert collective_name(torch.ops.tilecc.all_gather.default) == "all_gather"
    assert collective_name(torch.ops.aten.add.Tensor) is None


def test_split_at_collectives_runs_like_the_graph():
    m = TwoLinears().eval()
    x = torch.randn(1, 3, 8)
    ep = torch.export.export(m, (x,))
    params = {n.name for n in ep.graph_module.graph.nodes if n.op == "placeholder" and n.name.startswith("p_")}
    g = split_at_collectives(ep, {}, params)
    kinds = [type(s).__name__ if isinstance(s, Segment) else [c.op for c in s] for s in g.stages]
    assert kinds == ["Segment", ["all_reduce"], "Segment", ["all_gather"], "Segment"]  # the repeated gather runs once
    assert g.transposed == params - {"p_fc2_bias", "p_fc3_bias"}
    # run the segments in eager with the markers' single-chip meaning: equals the whole graph
    state = dict(m.named_parameters())
    env = {}
    for spec, name in zip(ep.graph_signature.input_specs, g.placeholders):
        v = x if spec.target is None else state[spec.target].detach()
        env[name] = v.mT if name in g.transposed else v
    for st in g.stages:
        if isinstance(st, Segment):
            outs = st.module(*[env[n] for n in st.inputs])
            env.update(zip(st.outputs, outs))
        else:
            for c in st:
                f = getattr(ops, c.op)
                env[c.output] = f(env[c.input], c.group) if c.op == "all_reduce" else f(env[c.input], c.dim, c.group)
    want = m(x)
    for name, w in zip(g.outputs, want):
        torch.testing.assert_close(env[name], w)


@pytest.mark.parametrize("op,dim", [("all_reduce", 0), ("reduce_scatter", 1), ("all_gather", 1), ("all_gather", 0)])
def test_runtime_collectives_move_the_right_blocks(op, dim):
    from tilecc.frontend.segments import Collective
    from tilecc.runtime.system_run import _collective
    from tilecc.simulator.interconnect.system import load_system

    n = 4
    blocks = [torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(r)) for r in range(n)]

    class P:  # the part of a SystemProgram _collective reads
        system = load_system("torus:2x2")

    c = Collective(op, "x", "y", dim, n, tuple(blocks[0].shape), blocks[0].dtype)
    outs, t_ns, link_bytes, _, _ = _collective(c, blocks, P(), "contention")
    total = sum(blocks)
    for r, o in enumerate(outs):
        if op == "all_reduce":
            want = total
        elif op == "reduce_scatter":
            want = total.chunk(n, dim)[r]
        else:
            want = torch.cat(blocks, dim)
        torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    assert t_ns > 0 and link_bytes.sum() > 0
    assert np.all(link_bytes >= 0)
