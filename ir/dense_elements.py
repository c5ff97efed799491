"""Dense elements attributes read from and written as bytes, not element by element.

xDSL's `DenseIntOrFPElementsAttr.get_values()` unpacks element by element into Python
numbers (bf16 one `struct.unpack` per element): the packager reading a model's
constants (causal masks, position tables) spent 0.3 s CPU there on the benchmark
GPT-2. The bytes are little-endian elements of the attribute's element type, so
numpy reads them in one `frombuffer`:

    dense_elements(attr)  ==  np.asarray(attr.get_values())   (element for element)

`dense_floats(values, type)` builds the attribute of float values from their bytes,
equal to ``DenseIntOrFPElementsAttr.from_list(type, values.tolist())`` (whose bf16
packing rounds each Python float on its own: 6 ms for a 128 x 128 identity, 0.2 ms
from its bytes).

Floats come back as float32 (f32, f16 and bf16 all convert exactly; f64 as float64),
signed integers as int64 (what `np.asarray` makes of Python ints). Element types
without a plain numpy reading (unsigned or wide integers, complex), and floats holding
a NaN (whose payload the Python float round trip may change), take `get_values()`.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    BytesAttr,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    Signedness,
    TensorType,
)

__all__ = ["dense_elements", "dense_floats"]


def dense_elements(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """The attribute's elements (1-D), equal to ``np.asarray(attr.get_values())``."""
    el = attr.get_element_type()
    raw = attr.data.data
    values: np.ndarray | None = None
    if isinstance(el, BFloat16Type):
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif isinstance(el, Float32Type | Float16Type | Float64Type):
        wide = isinstance(el, Float64Type)
        fmt = "<f8" if wide else "<f4" if isinstance(el, Float32Type) else "<f2"
        values = np.frombuffer(raw, dtype=fmt).astype(np.float64 if wide else np.float32)
    elif isinstance(el, IntegerType) and el.signedness.data != Signedness.UNSIGNED and el.bitwidth in (8, 16, 32, 64):
        return np.frombuffer(raw, dtype=f"<i{el.bitwidth // 8}").astype(np.int64)
    if values is None or np.isnan(values).any():
        return np.asarray(attr.get_values())
    return values


def dense_floats(values: np.ndarray, t: TensorType) -> DenseIntOrFPElementsAttr:
    """The attribute of type `t` holding `values` (its elements in order), equal to
    ``from_list(t, values.tolist())``: for f32 and bf16 elements each value rounded to
    nearest even from its bytes, as `from_list` rounds it. Other element types (f16,
    whose overflow `from_list` raises on), values that are not exactly float32 (one
    rounding, not two) and values holding a NaN (whose bits `from_list` sets its own
    way) go through `from_list`."""
    from tilecc.simulator.numerics import f32_to_bf16_bits

    src = np.asarray(values).reshape(-1)
    flat = np.ascontiguousarray(src, dtype=np.float32)
    el = t.get_element_type()
    if np.isnan(flat).any() or not isinstance(el, Float32Type | BFloat16Type) \
            or (src.dtype != np.float32 and not np.array_equal(flat, src)):  # not float32 values
        return DenseIntOrFPElementsAttr.from_list(cast(Any, t), src.tolist())
    raw = f32_to_bf16_bits(flat).astype("<u2") if isinstance(el, BFloat16Type) else flat.astype("<f4")
    return DenseIntOrFPElementsAttr(cast(Any, t), BytesAttr(raw.tobytes()))
