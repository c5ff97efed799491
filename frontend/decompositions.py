"""The one decomposition table both PyTorch paths use.

`torch.export` programs are decomposed with it (`frontend/torch_export.decompose`) and
`torch.compile` graphs go through AOTAutograd with it (`frontend/dynamo.backend`), so
the importer, the support check and `tilecc coverage` see the same ops either way:
Core ATen, with ``scaled_dot_product_attention`` kept whole (the NPU has a fused
attention lowering; decomposed it would be many small ops).
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def decomposition_table() -> Any:
    """Core ATen decompositions (torch.export's table), keeping sdpa whole."""
    table = torch.export.default_decompositions()
    table.pop(aten.scaled_dot_product_attention.default, None)
    return table


def aot_decompositions() -> dict:
    """The same table as a plain dict, the form `aot_autograd(decompositions=...)` takes."""
    return dict(decomposition_table().items())
