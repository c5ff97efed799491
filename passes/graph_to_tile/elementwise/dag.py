"""The DAG of an elementwise kernel: leaves, immediates, nodes, and their buffers by liveness.

An `ElementwiseKernel` (kernel.py) is built as a list of values: `Leaf` (an HBM tensor
with a broadcast index map, loaded per tile), `Imm` (an immediate) and `Node` (a vector
step on tiles: unary, binary, where, or a row-wise op of `ROWWISE`). Each value has a
class (imm < column < tile) that decides the shape of its buffer. For
``y = gelu(x + b) * 0.5`` with ``b`` a row vector::

    values = [Leaf(x, [0, 1]), Leaf(b, [None, 1]), Node("binary", "add", [0, 1]),
              Node("unary", "gelu", [2]), Imm(0.5), Node("binary", "mul", [3, 4])]
      -> topo_order(values, [5]) = [0, 1, 2, 3, 4, 5]
         assign_temps(values, {5}) = {2: ("bf16", "tile", 0), 3: ("bf16", "tile", 0)}
         (the gelu writes over the add's buffer: its input dies there)

Immediates fold at build time (`FOLD_BINARY`, `FOLD_UNARY`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.dialects.builtin import MemRefType
from xdsl.ir import Attribute, SSAValue

from tilecc.passes.graph_to_tile.shapes import IndexMap

ALIGN = 64  # bytes: on-chip buffers start at multiples of this within a partition


@dataclass
class Leaf:
    """An operand: an HBM tensor of the iteration space's rank (or, `given`, a tile
    another kernel hands over), loaded per tile or as a column."""

    value: SSAValue  # HBM memref in @main, of the iteration space's rank
    imap: IndexMap
    cls: str = "tile"  # "tile" or "column" (broadcast along columns: one value per row)
    given: Attribute | None = None  # element type of a leaf not loaded (an accumulator tile)


@dataclass
class Imm:
    """An immediate (a scalar known at compile time)."""

    value: float


@dataclass
class Node:
    """A vector step over its `args` (indices of earlier values), rounded to `elem`."""

    kind: str  # "unary", "binary", "where", or a row-wise op: ROWWISE
    fn: str  # unary / binary function ("" otherwise)
    args: list[int]
    elem: Attribute
    cls: str = "tile"
    eps: float = 0.0  # layer_norm, rms_norm


# row-wise nodes: whole rows (the last dim) in one tile; scratch they use per tile
# (fp32 tiles, fp32 columns)
ROWWISE = {"layer_norm": (2, 2), "rms_norm": (1, 1), "softmax": (1, 2), "log_softmax": (2, 2)}


Value = Leaf | Imm | Node
CLASS_RANK = {"imm": 0, "column": 1, "tile": 2}

# folding of immediates (both operands known at compile time)
FOLD_BINARY: dict[str, Callable[[np.float32, np.float32], np.float32]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
}
FOLD_UNARY: dict[str, Callable[[np.float32], np.float32]] = {
    "copy": lambda x: x, "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "square": np.square,
    "reciprocal": lambda x: 1 / x,
}


def value_class(v: Value) -> str:
    """imm, column or tile."""
    return "imm" if isinstance(v, Imm) else v.cls


def leaf_elem(v: Leaf) -> Attribute:
    """The element type of a leaf (its tensor's, or the given tile's)."""
    if v.given is not None:
        return v.given
    t = v.value.type
    assert isinstance(t, MemRefType)
    return t.element_type


def value_elem(v: Value) -> Attribute | None:
    """The element type of a value (None for an immediate)."""
    if isinstance(v, Node):
        return v.elem
    if isinstance(v, Leaf):
        return leaf_elem(v)
    return None


def topo_order(values: list[Value], roots: list[int]) -> list[int]:
    """Values needed by `roots`, in topological order (each once)."""
    seen: set[int] = set()
    out: list[int] = []

    def visit(i: int) -> None:
        if i in seen:
            return
        seen.add(i)
        v = values[i]
        if isinstance(v, Node):
            for a in v.args:
                visit(a)
        out.append(i)

    for r in roots:
        visit(r)
    return out


def _last_use(values: list[Value], order: list[int]) -> dict[int, int]:
    """Value -> the position in `order` of its last reader."""
    last: dict[int, int] = {}
    for pos, i in enumerate(order):
        v = values[i]
        if isinstance(v, Node):
            for a in v.args:
                last[a] = pos
    return last


def assign_temps(
    values: list[Value], stored: set[int], roots: Sequence[int] = (), external: set[int] | frozenset[int] = frozenset()
) -> dict[int, tuple[str, str, int]]:
    """Buffer of each node that is neither stored nor `external` (its buffer comes from
    elsewhere), by liveness: (element type, class, index); a node may take the buffer
    of an input that dies there (not a `where`: it reads its inputs after writing
    scratch). `roots` are values computed besides the stored ones."""
    stored = set(stored) | set(external)
    order = topo_order(values, sorted(stored | set(roots)))
    last = _last_use(values, order)
    free: dict[tuple[str, str], list[int]] = {}
    count: dict[tuple[str, str], int] = {}
    owner: dict[int, tuple[str, str, int]] = {}
    for pos, i in enumerate(order):
        v = values[i]
        if not isinstance(v, Node):
            continue
        dying = sorted({a for a in v.args if last.get(a) == pos and a in owner})
        if v.kind != "where":
            for a in dying:
                free.setdefault(owner[a][:2], []).append(owner[a][2])
        if i not in stored:
            key = (str(v.elem), v.cls)
            pool = free.setdefault(key, [])
            if pool:
                idx = pool.pop(0)
            else:
                idx = count.get(key, 0)
                count[key] = idx + 1
            owner[i] = (key[0], key[1], idx)
        if v.kind == "where":
            for a in dying:
                free.setdefault(owner[a][:2], []).append(owner[a][2])
        if i in owner and last.get(i) is None and i not in stored:
            free.setdefault(owner[i][:2], []).append(owner[i][2])
    return owner


def temp_demand(
    values: list[Value], stored: set[int], roots: Sequence[int] = (), external: set[int] | frozenset[int] = frozenset()
) -> dict[tuple[str, str], tuple[Attribute, int]]:
    """(element type, class) -> (element type, buffers) the temporaries need."""
    owner = assign_temps(values, stored, roots, external)
    out: dict[tuple[str, str], tuple[Attribute, int]] = {}
    for i, (e, cls, idx) in owner.items():
        elem = values[i].elem  # type: ignore[union-attr]
        n = out.get((e, cls), (elem, 0))[1]
        out[(e, cls)] = (elem, max(n, idx + 1))
    return out


def row_scratch(values: list[Value]) -> tuple[int, int]:
    """(fp32 tile buffers, fp32 column buffers) the row-wise nodes need per tile."""
    need = [ROWWISE[v.kind] for v in values if isinstance(v, Node) and v.kind in ROWWISE]
    return max((t for t, _ in need), default=0), max((c for _, c in need), default=0)


def where_scratch(values: list[Value]) -> int:
    """fp32 tile buffers a `where` needs (its two masks and the inverted condition)."""
    return 3 if any(isinstance(v, Node) and v.kind == "where" for v in values) else 0
