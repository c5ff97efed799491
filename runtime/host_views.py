"""Graph outputs that are views of graph inputs: made on the host as views, never copied.

AOTAutograd's forward graph of a training step returns, besides the outputs, the tensors
its backward needs, and among them often a view of an input: the transposed weight of
every linear (`t = permute(w)`, used by the forward matmul and saved for the backward's).
Inside an NPU partition a view is an access pattern (no work); as a partition's output
it must exist in memory, so the partition would store a copy: the whole weight
transposed (GPT-3-175B shape, TP 8: 113 MB per linear, ~6 % of a block's forward time).
In eager, and in Inductor (`reinterpret_tensor` of the input), it is a view of the
input, free. So here:

Before (the NPU region holds the permute; its result leaves the region):

    %t = aten.permute(%w, [1, 0]) ; %y = aten.mm(%x, %t) ; output(%y, %t)

After (the region's matmul reads %t as a strided view of %w; the output is a second
view of %w that torch makes on the host, outside every region):

    %t = aten.permute(%w, [1, 0]) ; %y = aten.mm(%x, %t)
    %t_host = aten.permute(%w, [1, 0])      (host view: no NPU work, no transfer)
    output(%y, %t_host)

Only ops that always return a view qualify (`HOST_VIEW_OPS`: no `reshape`, `clone` or
`_to_copy`, which may copy), and only chains that start at a graph input; the timing
model (`runtime/graph_clock.py`) charges a view nothing, as for the fallback's views.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node, map_arg

__all__ = ["HOST_VIEW_OPS", "HOST_VIEW_REASON", "host_view_outputs"]

aten = torch.ops.aten

HOST_VIEW_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.permute.default, aten.t.default,
    aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.expand.default, aten.alias.default, aten.detach.default,
    aten.slice.Tensor, aten.select.int,
}
HOST_VIEW_REASON = "a view of a graph input returned as an output: made on the host as a view (no copy)"


def _chain(n: Node) -> list[Node] | None:
    """The view ops from a graph input to `n` (first to last), or None where `n` is not
    such a view."""
    nodes: list[Node] = []
    cur: object = n
    while isinstance(cur, Node) and cur.op == "call_function" and cur.target in HOST_VIEW_OPS:
        nodes.append(cur)
        cur = cur.args[0]
    if nodes and isinstance(cur, Node) and cur.op == "placeholder":
        return nodes[::-1]
    return None


def host_view_outputs(gm: GraphModule) -> set[Node]:
    """Rewrites `gm`'s graph so that every output that is a view chain of a graph input is
    computed by nodes of its own (a copy of the chain where other nodes use it too);
    returns those nodes, to be kept out of the NPU regions."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    host: set[Node] = set()
    copies: dict[Node, Node] = {}

    def own(a: Node) -> Node:
        chain = _chain(a)
        if chain is None:
            return a
        if all(u is out for u in a.users) and all(
                set(c.users) <= {nxt} for c, nxt in zip(chain, chain[1:])):
            host.update(chain)  # used by the output alone: the chain itself moves to the host
            return a
        if a in copies:
            return copies[a]
        prev = chain[0].args[0]
        with gm.graph.inserting_before(out):
            for c in chain:
                assert isinstance(prev, Node)
                assert callable(c.target)  # a call_function node's target
                new = gm.graph.call_function(c.target, (prev, *c.args[1:]), dict(c.kwargs))
                new.meta = dict(c.meta)
                host.add(new)
                prev = new
        assert isinstance(prev, Node)
        copies[a] = prev
        return prev

    new_args = map_arg(out.args, own)
    if host:
        out.args = new_args
        gm.graph.lint()
    return host
