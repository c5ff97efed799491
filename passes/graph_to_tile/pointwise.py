"""Elementwise graph ops, one at a time: one `ElementwiseKernel` each (at -O2 most
arrive fused instead, as `graph.fused "elementwise"`: `fused.py`).

Before (graph)::

    %y = graph.relu %x : tensor<37x53xf32>

After (tile; `tiny`: 16 partitions)::

    func.func @k0_relu(%x: memref<37x53xf32>, %out: memref<37x53xf32>) attributes {tile.kernel} {
      scf.for %i = %c0 to %c3 step %c1 {          // row tiles of 16, the last one 5 rows
        tile.load %x[...] into %in sizes(%r, %c) ...
        tile.unary "relu" %in into %o sizes(%r, %c) ...
        tile.store %o into %out[...] sizes(%r, %c) ...
    }}

The vector function of each op comes from the one table, `passes/vector_fns.py`.
"""

from __future__ import annotations

from xdsl.ir import Operation

from tilecc.ir import graph as g
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of
from tilecc.passes.vector_fns import BINARY, UNARY, gelu_fn


def lower_unary(lw: LoweringContext, op: Operation, fn: str, loc: str, what: str | None = None) -> None:
    """`op`'s result = vector function `fn` of its operand."""
    from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

    res = op.results[0]
    ek = ElementwiseKernel(lw, what or fn, loc, shape_of(res.type))
    lw.finish_elementwise(ek, res, ek.unary(fn, ek.leaf(op.operands[0]), elem_of(res.type)))


def lower_binary(lw: LoweringContext, op: Operation, fn: str, loc: str) -> None:
    """`op`'s result = vector function `fn` of its two (broadcast) operands."""
    from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

    res = op.results[0]
    ek = ElementwiseKernel(lw, fn, loc, shape_of(res.type))
    a, b = ek.leaf(op.operands[0]), ek.leaf(op.operands[1])
    lw.finish_elementwise(ek, res, ek.binary(fn, a, b, elem_of(res.type)))


def _by_table(lw: LoweringContext, op: Operation, loc: str) -> None:
    if type(op) in UNARY:
        lower_unary(lw, op, UNARY[type(op)], loc)
    else:
        lower_binary(lw, op, BINARY[type(op)], loc)


def lower_gelu(lw: LoweringContext, op: Operation, loc: str) -> None:
    lower_unary(lw, op, gelu_fn(op), loc)


def lower_cast(lw: LoweringContext, op: Operation, loc: str) -> None:
    """A cast is a copy into a buffer of the result's element type."""
    lower_unary(lw, op, "copy", loc)


LOWERINGS = {
    **{t: _by_table for t in UNARY},
    **{t: _by_table for t in BINARY},
    g.GeluOp: lower_gelu,
    g.CastOp: lower_cast,
}
