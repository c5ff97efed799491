"""Buffer alignment: where on-chip and HBM buffers may start.

plan-sram and plan-hbm place every buffer at a multiple of `BUFFER_ALIGN` bytes, so a
buffer of n bytes takes ``align_up(n)`` of its memory; the tile-DSL front end checks a
kernel's SRAM and accumulator budget with the same rounding before planning:

    align_up(100)  ->  128
    align_up(128)  ->  128
"""

from __future__ import annotations

from xdsl.dialects.builtin import MemRefType

from tilecc.ir.dtypes import element_size

BUFFER_ALIGN = 64  # bytes


def align_up(nbytes: int, align: int = BUFFER_ALIGN) -> int:
    """`nbytes` rounded up to a multiple of `align`."""
    return -(-nbytes // align) * align


def buffer_bytes(t: MemRefType) -> int:
    """Bytes per partition of an on-chip buffer of type `t` (its columns x element size)."""
    return t.get_shape()[1] * element_size(t.element_type)


__all__ = ["BUFFER_ALIGN", "align_up", "buffer_bytes"]
