"""Element types: the size of one element and the mask value, each decided in one place.

    element_size(f32) -> 4    element_size(bf16) -> 2    element_size(i32) -> 4
    element_size(i8) -> 1     element_size(i1) -> 1     element_size(f8E4M3FN) -> 1
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import Float8E4M3FNType, Float32Type, Float64Type, IntegerType
from xdsl.ir import Attribute

from tilecc.simulator.isa import DType


def element_size(elem: Attribute) -> int:
    """Bytes of one element of type `elem` (bf16 / f16 and other 16-bit floats: 2)."""
    if isinstance(elem, Float8E4M3FNType):
        return 1
    if isinstance(elem, Float32Type):
        return 4
    if isinstance(elem, Float64Type):
        return 8
    if isinstance(elem, IntegerType):
        return max(1, elem.bitwidth // 8)
    return 2


# the most negative finite value of each float element type (torch.finfo(dtype).min)
_LOWEST: dict[DType, float] = {
    DType.F32: float(np.finfo(np.float32).min),
    DType.BF16: -3.3895313892515355e38,
    DType.F16: float(np.finfo(np.float16).min),
}


def masked_value(dt: DType) -> float:
    """The additive mask value of a dropped key: the dtype's most negative finite value
    (printed IR keeps finite constants exactly; -inf constants do not read back)."""
    if dt not in _LOWEST:
        raise ValueError(f"masked_value: {dt.name} is not a float element type")
    return _LOWEST[dt]
