"""`MlpProblem`: one fused MLP ``y = act(norm(x) @ W1 + b1) @ W2 + b2 (+ r)`` on one target.

The sizes (M tokens, K model width, H hidden units, N outputs), the element types and
the target's tiles, plus what the group's parts cost: the activation's vector work per
hidden element, the down projection's epilogue per output element, the norm
prologue's per input element, and the SRAM their buffers take. The schedule
(schedule.py) and its cost model (cost.py) read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecc.passes.graph_to_tile.elementwise.dag import ALIGN


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class MlpProblem:
    M: int  # tokens (rows of x and y)
    K: int  # model width (x's columns, W1's rows)
    H: int  # hidden units (W1's columns, W2's rows)
    N: int  # outputs (W2's columns)
    ia: int  # bytes per element of x, the weights and the hidden (the matmuls' operands)
    io: int  # bytes per element of the output
    fp32: bool  # operands in fp32 (the array's slow mode)
    TM: int  # tokens per m-tile (accumulator partitions)
    TK: int  # contraction rows of one matmul (array rows)
    TN: int  # output columns of one matmul (array columns)
    act_cost: float = 1.0  # vector cost per hidden element of the activation (the evacuation)
    act_ops: int = 1  # its vector instructions per hidden tile
    epi_cost: float = 1.0  # the down projection's epilogue per output element
    epi_ops: int = 1
    pro_cost: float = 0.0  # the norm prologue per input element (0: x rows are loaded)
    pro_ops: int = 0
    pro_sram: int = 0  # bytes per partition of the prologue's buffers
    epi_sram_per_col: int = 0  # the epilogue's per column of a chunk
    epi_sram: int = 0  # its fixed bytes (operands loaded once)
    act_sram: int = 0  # the activation's temporaries
    # the weights may be stored pre-tiled (ir/weight_layout.py): W1 (a weight) in hidden
    # groups with their K tiles side by side; W2 in groups of `w2_group` hidden tiles (0: as is)
    w1_tileable: bool = False
    w2_group: int = 0
    # gated (SwiGLU): a second up projection Wu, [K, H] like W1, its product an operand
    # of the activation (``act(x @ W1) * (x @ Wu)``)
    gated: bool = False

    @property
    def nk(self) -> int:
        """k-tiles of the up projection (over K)."""
        return cdiv(self.K, self.TK)

    @property
    def nh(self) -> int:
        """hidden tiles (k-tiles of the down projection)."""
        return cdiv(self.H, self.TK)

    @property
    def n_mtiles(self) -> int:
        return cdiv(self.M, self.TM)
