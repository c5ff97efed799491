"""Importer handlers for the ATen ops of indexing, slicing, joining, reductions, comparisons and selection.

`handlers(imp)` maps ATen overloads to functions of an FX node that emit graph ops
through the importer `imp` (see `frontend/torch_export.py`).
"""

from __future__ import annotations

from typing import Any


def handlers(imp: Any) -> dict[Any, Any]:
    return {}
