"""The tile DSL's syntax tree: every node keeps its source position (line, column)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Pos:
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


@dataclass
class Node:
    pos: Pos = field(compare=False)


@dataclass
class TensorType(Node):
    dtype: str
    dims: list  # str (a size symbol), int, or an Expr of symbols (result types only)


@dataclass
class Param(Node):
    name: str
    type: TensorType


# ---- expressions -------------------------------------------------------------------
@dataclass
class Expr(Node):
    pass


@dataclass
class Number(Expr):
    value: int | float


@dataclass
class Name(Expr):
    id: str


@dataclass
class Attr(Expr):
    value: Expr
    attr: str


@dataclass
class FullSlice(Expr):
    pass


@dataclass
class RangeSlice(Expr):
    """``lo:hi`` in a subscript (a column window of an on-chip tile)."""

    lo: Expr
    hi: Expr


@dataclass
class Subscript(Expr):
    name: str
    indices: list[Expr]


@dataclass
class TypeExpr(Expr):
    dtype: str
    dims: list[Expr]


@dataclass
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass
class BinOp(Expr):
    op: str  # + - * / ** == != < <= > >=
    lhs: Expr
    rhs: Expr


@dataclass
class Neg(Expr):
    value: Expr


@dataclass
class Call(Expr):
    fn: str
    args: list[Expr]
    kwargs: dict[str, Expr]


# ---- statements --------------------------------------------------------------------
@dataclass
class Stmt(Node):
    pass


@dataclass
class Assign(Stmt):
    target: str
    value: Expr


@dataclass
class AugAssign(Stmt):
    target: str
    op: str  # + - * /
    value: Expr


@dataclass
class Store(Stmt):
    target: str
    indices: list[Expr]
    value: Expr


@dataclass
class AugStore(Stmt):
    """``x[:, a:b] += value``: an augmented assignment to a window of an on-chip tile."""

    target: str
    indices: list[Expr]
    op: str
    value: Expr


@dataclass
class Pass(Stmt):
    pass


@dataclass
class For(Stmt):
    var: str
    iter: Call  # tiles(extent, size[, buffers=n]) or range(n)
    body: list[Stmt]


@dataclass
class Kernel(Node):
    name: str
    params: list[Param]
    results: list[Param]
    body: list[Stmt]
    source: str = ""  # the whole source text (for error carets)
    filename: str = "<string>"
