"""Importer handlers for the ATen ops of convolutional networks (convolution, pooling, batch norm, resizing, padding).

`handlers(imp)` maps ATen overloads to functions of an FX node that emit graph ops
through the importer `imp` (see `frontend/torch_export.py`).
"""

from __future__ import annotations

from typing import Any


def handlers(imp: Any) -> dict[Any, Any]:
    return {}
