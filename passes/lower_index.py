"""lower-graph-to-tile, continued: tile kernels for indexing, slicing, joining, reductions, comparisons and selection.

Each function takes the `GraphToTile` lowering state, the graph op and its source
location, emits kernels with `KernelBuilder` and records the op's HBM result in
`lowering.values`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LOWERINGS: dict[type, Callable[[Any, Any, str], None]] = {}
