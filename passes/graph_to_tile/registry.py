"""The op registry of `lower-graph-to-tile`: graph op class -> its lowering.

Every op family is one module exposing ``LOWERINGS``, a dict from graph op classes to
functions ``(lw: LoweringContext, op, loc) -> None`` that build the op's kernels and
record its result in ``lw.values`` (or ``lw.scalars``). The registry is the list of
those modules; adding a family is one file and one line here:

    # passes/graph_to_tile/cumsum.py
    def lower_cumsum(lw: LoweringContext, op: Operation, loc: str) -> None: ...
    LOWERINGS = {gi.CumsumOp: lower_cumsum}

    # here
    FAMILIES = (..., "cumsum")

A class claimed by two families is an error at start-up, never a silent override.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING

from xdsl.ir import Operation

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

Lowering = Callable[["LoweringContext", Operation, str], None]

FAMILIES = (
    "views",  # weights, constants, reshape / expand / permute views
    "pointwise",  # one elementwise op per kernel
    "rowwise",  # softmax, layer norm
    "matmul_baseline",  # graph.matmul: the -O2 blocked kernel or the baseline
    "fused",  # graph.fused groups (elementwise, rowwise, matmul with epilogue / prologue)
    "index",  # gather, slice, concat, where, log-softmax, attention
    "nn",  # convolution, pooling, resize, pad, reductions
    "dsl_call",  # tile-DSL kernels called from a graph
    "topk",  # topk / sort / argmax indices: selection by repeated extreme
    "bincount",  # bincount / histc: one-hot compare, column sum on the array
    "cumsum",  # running sums: triangular matmul per block, a carry between blocks
    "scatter",  # index_put / index_copy / scatter*: DMA scatters into a copy of the destination
    "as_strided",  # torch.as_strided: a strided view, or a strided DMA copy
    "rope",  # rotary position embedding: one kernel over the projection's rows
)


@cache
def lowerings() -> Mapping[type[Operation], Lowering]:
    """Every family's lowerings in one table (built once; the modules import lazily, since
    they import the context)."""
    table: dict[type[Operation], Lowering] = {}
    owner: dict[type[Operation], str] = {}
    for family in FAMILIES:
        module = importlib.import_module(f"tilecc.passes.graph_to_tile.{family}")
        for cls, fn in module.LOWERINGS.items():
            if cls in table:
                raise RuntimeError(f"lower-graph-to-tile: {cls.__name__} is lowered by both {owner[cls]} and {family}")
            table[cls] = fn
            owner[cls] = family
    return table
