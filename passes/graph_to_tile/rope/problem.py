"""The rotary-embedding problem: `graph.rope` seen as ``[B, H, S, D]`` with its layouts.

x is viewed at rank 4 (leading unit dims added), cos and sin broadcast to it (stride 0
along the dims they broadcast over). What the kernel's shape depends on:

- ``heads_adjacent``: x's heads are adjacent within a position (head stride D, element
  stride 1), as in the q / k projection ``[S, H * D]`` that ``view(B, S, H, D).transpose(1, 2)``
  leaves: one position's H * D elements are one contiguous row, so a tile of positions
  is one DMA. Otherwise each head of a tile is its own ``[positions x D]`` DMA.
- ``shared_table``: cos and sin do not vary over heads (``[B, 1, S, D]``): loaded once
  per tile of positions and applied to every head.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Attribute

from tilecc.ir.dtypes import element_size


@dataclass(frozen=True)
class RopeProblem:
    B: int
    H: int
    S: int
    D: int
    elem: Attribute
    heads_adjacent: bool
    shared_table: bool
    table_rows: bool  # cos / sin vary along positions (else one row broadcast to all)

    @property
    def isz(self) -> int:
        return element_size(self.elem)

    @property
    def half(self) -> int:
        return self.D // 2


def x_strides_adjacent(strides: list[int], H: int, D: int) -> bool:
    """Whether x ``[B, H, S, D]`` with element `strides` has its heads adjacent: each
    position's ``H * D`` elements one contiguous row."""
    return strides[3] == 1 and (H == 1 or strides[1] == D)
