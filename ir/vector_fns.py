"""Graph op -> vector-engine function: the one table.

Every elementwise graph op that the vector engine computes in one instruction maps to
its function name in the ISA (`simulator/isa.py`'s `UnaryFn` / `BinaryFn`). Fusion
(`passes/graph/fuse.py`) asks which ops are elementwise, the lowering
(`passes/graph_to_tile/`) which function each one becomes, and the roofline bound
(`ir/graph_work.py`) what each one costs; all read this table (it lives in ir/ so that
the bound, computed on the graph before any pass, reads it too; `passes/vector_fns.py`
re-exports it).

    elementwise_fn(graph.relu)                      -> ("unary", "relu")
    elementwise_fn(graph.gelu {approximate="tanh"}) -> ("unary", "gelu_tanh")
    elementwise_fn(graph.cast)                      -> ("unary", "copy")
    elementwise_fn(graph.where)                     -> ("where", "")
"""

from __future__ import annotations

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Operation

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi

# one-input functions (graph.gelu and graph.cast depend on a property: see elementwise_fn)
UNARY: dict[type[Operation], str] = {
    g.ReluOp: "relu",
    g.ExpOp: "exp",
    g.TanhOp: "tanh",
    g.SigmoidOp: "sigmoid",
    g.NegOp: "neg",
    g.RsqrtOp: "rsqrt",
    g.SqrtOp: "sqrt",
    g.SiluOp: "silu",
    gi.AbsOp: "abs",
    gi.LogOp: "log",
    gi.ErfOp: "erf",
}
BINARY: dict[type[Operation], str] = {
    g.AddOp: "add",
    g.SubOp: "sub",
    g.MulOp: "mul",
    g.DivOp: "div",
    g.MaximumOp: "max",
    gi.PowOp: "pow",
    gi.MinimumOp: "min",
    gi.EqOp: "eq",
    gi.NeOp: "ne",
    gi.LtOp: "lt",
    gi.LeOp: "le",
    gi.GtOp: "gt",
    gi.GeOp: "ge",
}
COMMUTATIVE = ("add", "mul", "max", "min")


def gelu_fn(op: Operation) -> str:
    """The vector function of a GELU: exact (erf) or its tanh approximation."""
    approximate = op.properties["approximate"]
    return "gelu" if isinstance(approximate, StringAttr) and approximate.data == "none" else "gelu_tanh"


def elementwise_fn(op: Operation) -> tuple[str, str] | None:
    """("unary" | "binary" | "where", vector function) of an elementwise graph op (a cast
    is the unary copy), None for any other op."""
    t = type(op)
    if t in UNARY:
        return "unary", UNARY[t]
    if t in BINARY:
        return "binary", BINARY[t]
    if isinstance(op, g.GeluOp):
        return "unary", gelu_fn(op)
    if isinstance(op, g.CastOp):
        return "unary", "copy"
    if isinstance(op, gi.WhereOp):
        return "where", ""
    return None
