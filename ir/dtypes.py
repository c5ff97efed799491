"""Element types: the size of one element, the one place it is decided.

    element_size(f32) -> 4    element_size(bf16) -> 2    element_size(i32) -> 4
    element_size(i8) -> 1     element_size(i1) -> 1
"""

from __future__ import annotations

from xdsl.dialects.builtin import Float32Type, Float64Type, IntegerType
from xdsl.ir import Attribute


def element_size(elem: Attribute) -> int:
    """Bytes of one element of type `elem` (bf16 / f16 and other 16-bit floats: 2)."""
    if isinstance(elem, Float32Type):
        return 4
    if isinstance(elem, Float64Type):
        return 8
    if isinstance(elem, IntegerType):
        return max(1, elem.width.data // 8)
    return 2
