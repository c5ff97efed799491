"""What a tile-DSL expression evaluates to while it is lowered, and the tables of the DSL.

A name in scope is bound to one of these (or to a compile-time number, or a run-time
index value):

    for m in tiles(M, 128)      m   -> TileVar(start=%i * 128, size=128, tile=128)
    a = load(x[m, :])           a   -> Lazy(x, indices=[m.start, 0])   (no DMA yet)
    p = matmul(a, b)            p   -> Product(parts=[(aT, b)])        (no matmul yet)
    y = exp(a)                  y   -> Value(buf=%y, "f32", "sram", shape=(128, 64))
    r = row_ids(m) (m static)   r   -> Const(data=[[0], [1], ...], kind="col")

`Lazy` and `Product` become a `Value` when their use is known (`tiles.materialise`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, IntegerType
from xdsl.ir import Attribute, SSAValue

from tilecc.frontend.dsl import ast as A
from tilecc.ir import tile

DTYPES: dict[str, Attribute] = {
    "f32": Float32Type(), "bf16": BFloat16Type(), "f16": Float16Type(), "i32": IntegerType(32),
}
ITEM = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4}
FLOATS = ("f32", "bf16", "f16")
UNARY = set(tile.UNARY_FNS) - {"copy"}
BIN = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "**": "pow", "==": "eq", "!=": "ne",
       "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
COMMUTATIVE = {"add", "mul", "max", "min", "eq", "ne"}
FLIP = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}
RESIDENT_CONST_FRACTION = 32  # constant tiles up to 1/32 of an SRAM partition per row: loaded once, kept
INTERLEAVE_MAX = 4  # a transposed slice of up to this many array heights is loaded by one DMA (interleaved)
SMALL_FILL_COLS = 64  # tiles filled in a loop up to this many columns: a vector copy, not a DMA


# ---- values ------------------------------------------------------------------------
@dataclass
class TileVar:
    """A loop variable: the tile starting at `start` (an index value or an int) of
    `size` elements (static in each copy of the body), `tile` at most."""

    name: str
    start: SSAValue | int
    size: int
    tile: int
    extent: int
    index: SSAValue | int  # the iteration number
    pos: A.Pos
    is_range: bool = False


@dataclass
class Value:
    """An on-chip tile: the leading `rows x cols` of buffer `buf` (static shape `shape`)."""

    buf: SSAValue
    dtype: str
    space: str
    shape: tuple[int, int]
    rows: int
    cols: int
    pos: A.Pos
    zero: bool = False  # still all zeros (nothing written yet; `zeros` in acc before a matmul)
    zero_loops: list = field(default_factory=list)  # loops entered since (their iteration numbers)
    # a `zeros` in SRAM whose first use is `x += ...`, not filled yet: (block, the op to
    # fill after, loc, inside a loop); that use writes its value straight into x when it is the first
    # execution, else emits the fill there (aug_assign)
    pending_fill: tuple | None = None

    def describe(self) -> str:
        return f"{self.dtype}[{self.rows} x {self.cols}] in {self.space}"


@dataclass
class Lazy:
    """`load(x[...])`: the HBM slice, DMA'd when its use is known."""

    param: str
    tensor: SSAValue
    dtype: str
    indices: list[SSAValue | int]  # start per HBM dim
    kept: list[int]  # HBM dims of the tile (0, 1 or 2 of them)
    sizes: list[int]  # actual size per kept dim
    tiles: list[int]  # static size per kept dim
    pos: A.Pos
    node: A.Node | None = None  # the load() call (keys its buffers)
    cast_to: str | None = None  # a cast applied after the DMA (a lazily broadcast row)

    @property
    def shape(self) -> tuple[int, int]:
        return _two(self.tiles)

    @property
    def actual(self) -> tuple[int, int]:
        return _two(self.sizes)

    @property
    def is_row(self) -> bool:
        return len(self.kept) <= 1


def _two(v: Sequence[int]) -> tuple[int, int]:
    return (1, 1) if not v else ((1, v[0]) if len(v) == 1 else (v[0], v[1]))


@dataclass
class Product:
    """A pending ``sum_i lhsT_i^T @ rhs_i``: operands already on chip, the contraction in
    parts of at most the array's rows."""

    parts: list[tuple[Value, Value]]
    m: int
    k: int
    n: int
    shape: tuple[int, int]
    pos: A.Pos


@dataclass
class Const:
    """A tile known at compile time (index ids of static loop tiles, and arithmetic on
    them): folded until used, then a DMA from an HBM constant."""

    data: np.ndarray  # f32, [rows x cols]; a row [1 x C] or column [R x 1] broadcasts
    pos: A.Pos
    kind: str = "tile"  # "row" (broadcast over rows), "col" or "tile"


Scalar = int | float  # compile-time numbers
Idx = SSAValue  # a run-time index (loop arithmetic)


def op_symbol(fn: str) -> str:
    """The DSL operator of a vector function ("add" -> "+"), for messages."""
    inv = {v: k for k, v in BIN.items()}
    return inv.get(fn, fn)


def fmt_dims(dims: Sequence[str | int]) -> str:
    """A parameter's declared dimensions as written: ``[M, 64]``."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


def stmt_target(s: A.Stmt) -> str:
    """The name a statement assigns or stores to ("?" when none)."""
    return getattr(s, "target", "?")
