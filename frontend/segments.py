"""A sharded model's graph cut at its collectives into per-chip compute segments.

    seg = split_at_collectives(ep)      # ep: torch.export of one chip's copy (tensor_parallel.py)
    seg.stages   # [Segment 0, [Collective ...], Segment 1, [Collective ...], Segment 2]

Before (one chip's exported graph):

    %q = linear(%x, %w_q) ... %o = linear(%attn, %w_o)
    %s = tilecc.all_reduce(%o, 4)
    %h = add(%x, %s) ...

After: Segment 0 (inputs x, w_q, ..., w_o; output o), the collective all_reduce(o) -> s,
Segment 1 (inputs x, s, ...; output h ...). A value's level is the number of collectives
that must run before it: a compute node sits at the largest level of its inputs (a
collective's result counts one more than the collective), and a collective runs after the
segment of its own level. Values flow between stages by name (the FX node names); a
segment's inputs are the graph's placeholders (weights and user inputs) and earlier values
it uses, its outputs the values later stages or the graph's outputs use. Every chip runs
the same segments (their shapes are equal; only the weights differ), so each compiles once.
The same collective twice on one value (two column-parallel linears reading one gathered
input) runs once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, GraphModule, Node

from tilecc.frontend.collective_ops import collective_name


@dataclass
class Segment:
    level: int
    module: GraphModule
    inputs: list[str]  # value names, in the module's argument order
    outputs: list[str]  # value names, in the order of its output tuple
    examples: list[torch.Tensor] = field(default_factory=list)  # zeros of its inputs' shapes


@dataclass(frozen=True)
class Collective:
    op: str  # all_reduce | reduce_scatter | all_gather | shard | send_recv | grad_all_reduce
    input: str
    output: str
    dim: int  # 0 for all_reduce
    group: int  # send_recv: the receiving stage
    shape: tuple[int, ...]  # of the input
    dtype: torch.dtype


@dataclass
class SegmentedGraph:
    placeholders: list[str]  # the exported graph's inputs, in its order
    stages: list[Segment | list[Collective]]
    outputs: list[str]
    transposed: set[str] = field(default_factory=set)  # weights the segments take as W^T (see below)

    @property
    def segments(self) -> list[Segment]:
        return [s for s in self.stages if isinstance(s, Segment)]

    @property
    def collectives(self) -> list[Collective]:
        return [c for s in self.stages if isinstance(s, list) for c in s]


def _res(alias: dict[Node, Node], a: object) -> Node:
    """The node standing for `a` (a repeated collective stands for its first occurrence)."""
    assert isinstance(a, Node)
    return alias.get(a, a)


def _val(n: Node) -> torch.Tensor:
    return n.meta["val"]


def split_at_collectives(ep: ExportedProgram, constants: dict[str, torch.Tensor] | None = None,
                         weights: set[str] | None = None) -> SegmentedGraph:
    """`constants`: graph inputs every chip holds alike (buffers, lifted constants), by name;
    segments hold them as their own constants (so the compiler folds them) instead of taking
    them as inputs. `weights`: the per-chip weight inputs; one that only feeds `linear` as
    its weight is taken transposed (`x @ W^T` becomes `matmul(x, WT)`, with WT laid out in
    HBM by the host when the weights are loaded), so no segment transposes a weight at run
    time: what the single-chip compile does at compile time for constant weights."""
    constants = constants or {}
    transposed = {n.name for n in ep.graph_module.graph.nodes
                  if n.op == "placeholder" and n.name in (weights or set()) and n.users
                  and all(u.target is torch.ops.aten.linear.default and u.args[1] is n and u.args[0] is not n
                          for u in n.users)}
    graph = ep.graph_module.graph
    level: dict[Node, int] = {}
    avail: dict[Node, int] = {}  # the first stage a value is available at
    alias: dict[Node, Node] = {}  # a repeated collective -> its first occurrence
    seen: dict[tuple, Node] = {}
    placeholders, out_node = [], None
    for n in graph.nodes:
        if n.op == "placeholder":
            placeholders.append(n.name)
            level[n] = avail[n] = 0
            continue
        if n.op == "output":
            out_node = n
            continue
        ins = [_res(alias, a) for a in n.all_input_nodes]
        lv = max((avail[a] for a in ins), default=0)
        if collective_name(n.target):
            key = (n.target, _res(alias, n.args[0]), tuple(n.args[1:]))
            if key in seen:
                alias[n] = seen[key]
                continue
            seen[key] = n
            level[n], avail[n] = lv, lv + 1
        else:
            level[n] = avail[n] = lv
    assert out_node is not None
    nodes = [n for n in graph.nodes if n in level and n.op != "placeholder"]
    last = max([level[n] for n in nodes] + [0])
    users: dict[Node, list[Node]] = {n: [] for n in level}
    for n in nodes:
        for a in n.all_input_nodes:
            users[_res(alias, a)].append(n)
    final = [_res(alias, a) for a in out_node.all_input_nodes]
    stages: list[Segment | list[Collective]] = []
    for lv in range(last + 1):
        compute = [n for n in nodes if level[n] == lv and not collective_name(n.target)]
        if compute:
            stages.append(_segment(lv, compute, users, final, alias, constants, transposed))
        comms = [_collective(n) for n in nodes if level[n] == lv and collective_name(n.target)]
        if comms:
            stages.append(comms)
    outs = [_res(alias, a).name if isinstance(a, Node) else a for a in out_node.args[0]]
    return SegmentedGraph(placeholders, stages, outs, transposed)


def _collective(n: Node) -> Collective:
    name = collective_name(n.target)
    assert name is not None
    x = n.args[0]
    assert isinstance(x, Node)
    dim = 0 if name in ("all_reduce", "send_recv", "grad_all_reduce") else int(n.args[1])  # type: ignore[arg-type]
    group = int(n.args[-1])  # type: ignore[arg-type]
    v = _val(x)
    dim = dim % v.dim() if v.dim() else 0
    return Collective(name, x.name, n.name, dim, group, tuple(v.shape), v.dtype)


def _segment(lv: int, compute: list[Node], users: dict[Node, list[Node]], final: list[Node],
             alias: dict[Node, Node], constants: dict[str, torch.Tensor], transposed: set[str]) -> Segment:
    g = Graph()
    root = torch.nn.Module()
    inside = set(compute)
    env: dict[Node, Node] = {}
    inputs: list[Node] = []

    def arg(a: Node) -> Node:
        a = _res(alias, a)
        if a not in env and a.name in constants:
            root.register_buffer(a.name, constants[a.name])
            env[a] = g.get_attr(a.name)
            env[a].meta["val"] = a.meta.get("val")
        if a not in env:
            env[a] = g.placeholder(a.name)
            env[a].meta["val"] = a.meta.get("val")
            inputs.append(a)
        return env[a]

    for n in compute:
        for a in n.all_input_nodes:
            if _res(alias, a) not in inside:
                arg(a)
        w = n.args[1] if n.target is torch.ops.aten.linear.default else None
        if isinstance(w, Node) and w.name in transposed:
            x = env[_res(alias, n.args[0])]
            y = g.call_function(torch.ops.aten.matmul.default, (x, env[w]))
            b = n.args[2] if len(n.args) > 2 else None
            env[n] = y if b is None else g.call_function(torch.ops.aten.add.Tensor, (y, env[_res(alias, b)]))
            env[n].meta["val"] = n.meta.get("val")
            continue
        env[n] = g.node_copy(n, lambda a: env[_res(alias, a)])
    outputs = [n for n in compute if n in final or any(u not in inside for u in users[n])]
    g.output(tuple(env[n] for n in outputs))
    gm = GraphModule(root, g)
    examples = [torch.zeros(_val(a).mT.shape if a.name in transposed else _val(a).shape, dtype=_val(a).dtype)
                for a in inputs]
    return Segment(lv, gm, [a.name for a in inputs], [n.name for n in outputs], examples)
