"""lower-graph-to-tile for ``graph.as_strided``: a strided view of the input's elements.

The input is made dense (row-major, a copy only if it is a view that is not), then the
result is a `tile.view` of its root with the requested strides and offset added to the
input's own offset: no data moves. Overlapping windows and stride-0 dimensions are
fine for a view (every consumer only reads it). Where the innermost stride is not 1
the rows of the view would be one element per DMA descriptor in every consumer, so the
view is copied once into a dense tensor (a strided DMA copy) instead.

Before::

    %w = graph.as_strided %x size array<i64: 3, 3> stride array<i64: 1, 1> offset 0
        : tensor<5xf32> -> tensor<3x3xf32>

After (in @main)::

    %w = tile.view %x : memref<3x3xf32, strided<[1, 1]>>
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tilecc.ir import graph_scatter as gs
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.shapes import shape_of


def lower_as_strided(lw: LoweringContext, op: gs.AsStridedOp, loc: str) -> None:
    res = op.results[0]
    size, stride, offset = op.params()
    src = lw.dense(lw.materialise(op.input))
    _, base = lw.layout(src)
    view = lw.strided(src, size, stride, base + offset)
    rows_contiguous = not size or size[-1] == 1 or stride[-1] == 1
    lw.values[res] = view if rows_contiguous else lw.dense(view)
    assert tuple(shape_of(lw.values[res].type)) == tuple(size)


LOWERINGS: dict[type, Callable[[Any, Any, str], None]] = {
    gs.AsStridedOp: lower_as_strided,
}

__all__ = ["LOWERINGS"]
