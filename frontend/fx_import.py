"""Import an FX `GraphModule` (a torch.compile / AOTAutograd graph) into the `graph` dialect.

    gp = import_graph_module(gm, bindings)      # GraphProgram, like import_exported_program
    reason = node_support(node)                 # None if the NPU can run `node`, else why not

AOTAutograd graphs are flat: parameters, buffers and user inputs are all placeholders,
so every tensor placeholder becomes an argument of ``@forward`` (the weights are passed
at run time). A SymInt placeholder (``dynamic=True``) is bound to its concrete value of
this specialisation and is no program input. The conversion itself is the torch.export
importer's (`frontend/torch_export._Importer`): both paths accept exactly the same ops.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, cast

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import Graph, GraphModule, Node

from tilecc.errors import UnsupportedOpError
from tilecc.frontend.torch_export import _bind, _dtype, _Importer, _op_name
from tilecc.ir import graph as g
from tilecc.ir import graph_nn as nn
from tilecc.simulator.isa import DType

aten = torch.ops.aten


@dataclass
class _Arg:
    name: str


@dataclass
class _InSpec:
    arg: _Arg
    kind: InputKind = InputKind.USER_INPUT
    target: str | None = None


@dataclass
class _OutSpec:
    arg: _Arg
    kind: OutputKind = OutputKind.USER_OUTPUT
    target: str | None = None


@dataclass
class _Signature:
    input_specs: list[_InSpec]
    output_specs: list[_OutSpec]
    # an AOTAutograd graph is functional: it mutates no buffer (torch.export's field)
    buffers_to_mutate: dict[str, str] = field(default_factory=dict[str, str])


@dataclass
class FxProgram:
    """The parts of an ExportedProgram the importer reads, for a plain FX graph."""

    graph: Graph
    graph_signature: _Signature
    state_dict: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)
    range_constraints: dict = field(default_factory=dict)

    @staticmethod
    def of(graph: Graph) -> FxProgram:
        ins = [_InSpec(_Arg(n.name)) for n in graph.nodes if n.op == "placeholder"]
        out = next(n for n in graph.nodes if n.op == "output")
        vals = out.args[0] if isinstance(out.args[0], list | tuple) else [out.args[0]]
        outs = [_OutSpec(_Arg(getattr(v, "name", str(v)))) for v in vals]
        return FxProgram(graph, _Signature(ins, outs))


class _FxImporter(_Importer):
    def _handlers(self) -> dict:
        h = super()._handlers()
        h[aten.native_layer_norm.default] = self.h_layer_norm_with_stats
        return h

    def h_layer_norm_with_stats(self, node: Node) -> tuple:
        """Layer norm whose mean and rstd outputs are used (a training forward saves them
        for the backward): both computed in fp32 beside the normalised output."""
        y, mean_p, rstd_p = self.h_layer_norm(node)
        used = {i for u in node.users if u.target is operator.getitem and u.users and isinstance(i := u.args[1], int)}
        if not used & {1, 2}:
            return (y, mean_p, rstd_p)
        a = _bind(node)
        x = self.cast_to(self.tensor(a["input"]), DType.F32)
        rank = len(g.shape_of(x))
        dims = list(range(rank - len(a["normalized_shape"]), rank))
        mean = self.emit(nn.MeanOp.make(x, dims, True))
        d = self.emit(g.SubOp.make(x, mean))
        var = self.emit(nn.MeanOp.make(self.emit(g.MulOp.make(d, d)), dims, True))
        rstd = self.emit(g.RsqrtOp.make(self.emit(g.AddOp.make(var, self.scalar(float(a["eps"]), DType.F32)))))
        vals = node.meta["val"]
        return (y, self.cast_to(mean, _dtype(vals[1].dtype)), self.cast_to(rstd, _dtype(vals[2].dtype)))

    def placeholder(self, node: Node, spec: Any) -> None:
        v = node.meta.get("val")
        if isinstance(v, torch.SymInt | int) and not isinstance(v, bool):
            expr = v.node.expr if isinstance(v, torch.SymInt) else v
            self.env[node] = int(sympy.sympify(expr).subs(self.bindings or {}))
            return
        super().placeholder(node, spec)


def import_graph_module(gm: GraphModule | Graph, bindings: dict | None = None) -> g.GraphProgram:
    """`gm` (already decomposed, e.g. by AOTAutograd with tilecc's table) as a GraphProgram.

    Symbolic sizes are specialised by `bindings` (sympy symbol -> int). Raises one
    `UnsupportedOpError` listing every node that cannot be imported.
    """
    graph = gm.graph if isinstance(gm, GraphModule) else gm
    # FxProgram has the parts of an ExportedProgram that the importer reads (duck-typed)
    return _FxImporter(cast(ExportedProgram, FxProgram.of(graph)), bindings).run()


def tensor_inputs(graph: Graph) -> list[bool]:
    """Per placeholder: True if it is a program input (a tensor), False for a SymInt."""
    return [isinstance(n.meta.get("val"), torch.Tensor) for n in graph.nodes if n.op == "placeholder"]


def bindings_for(graph: Graph, args: tuple) -> dict:
    """Symbol -> int for the symbolic sizes of `graph`'s placeholders, read off `args`."""
    out: dict = {}
    for n, a in zip((n for n in graph.nodes if n.op == "placeholder"), args):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) and isinstance(v.node.expr, sympy.Symbol):
            out[v.node.expr] = int(a)
        elif isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor):
            for d, real in zip(v.shape, a.shape):
                if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                    out[d.node.expr] = int(real)
    return out


def hint_bindings(graph: Graph) -> dict:
    """Symbol -> the size dynamo traced with (its hint), for estimates before a call."""
    out: dict = {}
    for n in graph.nodes:
        v = n.meta.get("val")
        dims = list(v.shape) if isinstance(v, torch.Tensor) else [v] if isinstance(v, torch.SymInt) else []
        for d in dims:
            if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                hint = d.node.hint
                out[d.node.expr] = int(hint) if hint is not None else 64
    return out


def node_support(node: Node, bindings: dict | None = None) -> str | None:
    """None if the importer takes `node` alone (op, dtype and shape checked by its
    handler), else the reason. A multi-output node is checked with the `getitem`s that
    read it (layer norm's mean and rstd, used by its backward, are no NPU outputs)."""
    if node.op != "call_function":
        return f"{node.op} node"
    if node.target is operator.getitem:
        src = node.args[0]
        return node_support(src, bindings) if isinstance(src, Node) else "getitem of a non-node"
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor | list | tuple):
        return "not a tensor computation (runs on the host)"
    graph = Graph()
    env: dict[Node, Node] = {}
    for a in node.all_input_nodes:
        p = graph.placeholder(a.name)
        p.meta = dict(a.meta)
        env[a] = p
    copy = graph.node_copy(node, lambda a: env[a])
    outs: list[Node] = []
    if isinstance(val, torch.Tensor):
        outs.append(copy)
    else:
        for u in node.users:
            if u.target is operator.getitem and u.users:
                gi = graph.node_copy(u, lambda a: copy if a is node else env[a])
                outs.append(gi)
    if not outs:
        return "no tensor result used"
    graph.output(tuple(outs))
    try:
        import_graph_module(graph, bindings or hint_bindings(node.graph))
    except UnsupportedOpError as e:
        name = _op_name(node.target)
        return "; ".join(f"no NPU lowering for {w}" if w == name else w for w, _ in e.ops)
    except Exception as e:  # a handler that fails on this shape: not for the NPU
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


__all__ = ["import_graph_module", "node_support", "bindings_for", "hint_bindings", "tensor_inputs", "FxProgram"]
