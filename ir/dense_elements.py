"""A dense elements attribute's values as a numpy array, read from its bytes.

xDSL's `DenseIntOrFPElementsAttr.get_values()` unpacks element by element into Python
numbers (bf16 one `struct.unpack` per element): the packager reading a model's
constants (causal masks, position tables) spent most of half a second there. The
bytes are little-endian elements of the attribute's element type, so numpy reads
them in one `frombuffer`:

    dense_elements(attr)  ==  np.asarray(attr.get_values())   (element for element)

Floats come back as float32 (f32, f16 and bf16 all convert exactly; f64 as float64),
signed integers as int64 (what `np.asarray` makes of Python ints). Element types
without a plain numpy reading (unsigned or wide integers, complex), and floats holding
a NaN (whose payload the Python float round trip may change), take `get_values()`.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    Signedness,
)

__all__ = ["dense_elements"]


def dense_elements(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """The attribute's elements (1-D), equal to ``np.asarray(attr.get_values())``."""
    el = attr.get_element_type()
    raw = attr.data.data
    values: np.ndarray | None = None
    if isinstance(el, BFloat16Type):
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif isinstance(el, Float32Type | Float16Type | Float64Type):
        values = np.frombuffer(raw, dtype={Float32Type: "<f4", Float16Type: "<f2", Float64Type: "<f8"}[type(el)])
        values = values.astype(np.float64 if isinstance(el, Float64Type) else np.float32)
    elif isinstance(el, IntegerType) and el.signedness.data != Signedness.UNSIGNED and el.bitwidth in (8, 16, 32, 64):
        return np.frombuffer(raw, dtype=f"<i{el.bitwidth // 8}").astype(np.int64)
    if values is None or np.isnan(values).any():
        return np.asarray(attr.get_values())
    return values
