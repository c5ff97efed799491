"""Decomposed activations: the primitive-op spellings of GELU and SiLU that torch.export
produces, recognised as the one vector function they are.

canonicalize-graph (`passes/graph/canonicalize.py`) rewrites them into one op; the
roofline bound (`ir/graph_work.py`), counted on the graph before any pass, counts them
as that one function. Patterns (operands of commutative ops in either order, constants
compared to 1 %, as bf16 rounds them):

- ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``  ->  ``gelu(x, "tanh")``
- ``0.5 * x * (1 + erf(x * (1/sqrt(2))))`` (or ``x / sqrt(2)``)  ->  ``gelu(x, "none")``
- ``x * sigmoid(x)``                                              ->  ``silu(x)``

    match_gelu(final multiply)  ->  (x, "tanh" | "none") or None
    match_silu(multiply)        ->  x or None
"""

from __future__ import annotations

import math
from typing import TypeVar

from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi

OpT = TypeVar("OpT", bound=Operation)


def scalar_value(v: SSAValue) -> float | None:
    """The value of a one-element `graph.constant` (None for anything else)."""
    op = v.owner
    if isinstance(op, g.ConstantOp):
        data = op.values()
        if data.size == 1:
            return float(data.reshape(-1)[0])
    return None


def _near(v: SSAValue, target: float) -> bool:
    x = scalar_value(v)
    return x is not None and abs(x - target) <= 0.01 * abs(target)


def _def(v: SSAValue, cls: type[OpT]) -> OpT | None:
    op = v.owner
    return op if isinstance(op, cls) else None


def _pairs(op: Operation) -> list[tuple[SSAValue, SSAValue]]:
    a, b = op.operands
    return [(a, b), (b, a)]


def _times_const(v: SSAValue, c: float) -> SSAValue | None:
    """x if v = x * c (either order), or x / (1/c)."""
    m = _def(v, g.MulOp)
    if m is not None:
        for x, k in _pairs(m):
            if _near(k, c):
                return x
    d = _def(v, g.DivOp)
    if d is not None and _near(d.operands[1], 1.0 / c):
        return d.operands[0]
    return None


def _plus_one(v: SSAValue) -> SSAValue | None:
    a = _def(v, g.AddOp)
    if a is None:
        return None
    for x, k in _pairs(a):
        if _near(k, 1.0):
            return x
    return None


def _gelu_tanh_inner(t: SSAValue, x: SSAValue) -> bool:
    """t == tanh(sqrt(2/pi) * (x + 0.044715 * x**3))."""
    th = _def(t, g.TanhOp)
    if th is None:
        return False
    inner = _times_const(th.operands[0], math.sqrt(2.0 / math.pi))
    if inner is None:
        return False
    add = _def(inner, g.AddOp)
    if add is None:
        return False
    for a, b in _pairs(add):
        if a is not x:
            continue
        cube = _times_const(b, 0.044715)
        p = _def(cube, gi.PowOp) if cube is not None else None
        if p is not None and p.operands[0] is x and _near(p.operands[1], 3.0):
            return True
    return False


def _gelu_erf_inner(t: SSAValue, x: SSAValue) -> bool:
    """t == erf(x / sqrt(2))."""
    e = _def(t, gi.ErfOp)
    return e is not None and _times_const(e.operands[0], 1.0 / math.sqrt(2.0)) is x


def match_gelu(op: Operation) -> tuple[SSAValue, str] | None:
    """(x, approximation) if `op` is the final multiply of a decomposed GELU."""
    if not isinstance(op, g.MulOp):
        return None
    for half, rest in _pairs(op):
        x = _times_const(half, 0.5)
        if x is None or x.type != op.results[0].type:
            continue
        t = _plus_one(rest)
        if t is None:
            continue
        if _gelu_tanh_inner(t, x):
            return x, "tanh"
        if _gelu_erf_inner(t, x):
            return x, "none"
    return None


def match_silu(op: Operation) -> SSAValue | None:
    if not isinstance(op, g.MulOp):
        return None
    for x, s in _pairs(op):
        sg = _def(s, g.SigmoidOp)
        if sg is not None and sg.operands[0] is x and x.type == op.results[0].type:
            return x
    return None


__all__ = ["match_gelu", "match_silu", "scalar_value"]
