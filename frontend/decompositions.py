"""The one decomposition table both PyTorch paths use.

`torch.export` programs are decomposed with it (`frontend/torch_export.decompose`) and
`torch.compile` graphs go through AOTAutograd with it (`frontend/dynamo.backend`), so
the importer, the support check and `tilecc coverage` see the same ops either way:
Core ATen, with ``scaled_dot_product_attention`` kept whole (the NPU has a fused
attention lowering; decomposed it would be many small ops) and the reflect / replicate /
circular pads kept whole (``graph.pad`` has those modes; decomposed they are gathers of
computed indices or chains of slice_scatter).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

PADS_KEPT = (
    aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
    aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default,
    aten._pad_circular.default,
)


def decomposition_table() -> Any:
    """Core ATen decompositions (torch.export's table), keeping sdpa whole."""
    table = torch.export.default_decompositions()
    table.pop(aten.scaled_dot_product_attention.default, None)
    for op in PADS_KEPT:  # graph.pad has every mode: no gather of computed indices
        table.pop(op, None)
    return table


def aot_decompositions() -> dict:
    """The same table as a plain dict, the form `aot_autograd(decompositions=...)` takes."""
    return dict(decomposition_table().items())
