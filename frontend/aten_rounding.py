"""``div`` with ``rounding_mode`` "trunc" / "floor" (and ``floor`` / ``trunc`` / ``ceil`` /
``round``) from the vector engine's own rounding: an fp32 -> i32 conversion truncates
toward zero, and an fp32 addition rounds to nearest-even.

The ISA has no floor / trunc function, and needs none: ``VEC_*`` writing an i32 output
truncates toward zero (saturating at the int32 range, NaN -> 0; `simulator/isa.py`), so

    q     = a / b                        (fp32; int operands are converted first)
    t     = f32(i32(q))                  (truncation, two copies on the vector engine)
    floor = t - f32(q < t)               (one compare, one subtract)
    r     = where(|q| < 2**23, t|floor, q)

    round = sign(q) * ((|q| + 2**23) - 2**23)   (torch.round: half to even; in
                                                 [2**23, 2**24) the fp32 spacing is 1)

Every fp32 value of magnitude >= 2**23 is already an integer, which makes the result
exact for every fp32 value (the saturation never shows), and NaN / inf fail the compare
and pass through unchanged. Floor *division* is torch's floor of the exact quotient,
not of the rounded one: `floor_div` corrects the near-integer cases with an exact
product (Dekker). Cost per element: trunc division 6 elementwise vector ops, floor
division about 30 (fused into one kernel where the fuser takes casts), against 1-2 for
a native rounding function; these are rare ops (index arithmetic, bucketing), so the
ISA keeps none. Limits: integer operands are exact while ``|a|``, ``|b|`` < 2**24 (the
device computes in fp32); a zero result is +0.0 where torch may give -0.0 (equal under
comparison).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.fx import Node
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.simulator.isa import DType

EXACT = float(2**23)  # fp32 values at least this large are integers


def _const(imp: Any, v: float) -> SSAValue:
    return imp.emit(g.ConstantOp.make(np.array(v, dtype=np.float32), DType.F32))


def rounded(imp: Any, q: SSAValue, mode: str) -> SSAValue:
    """`q` (fp32) rounded toward zero ("trunc"), down ("floor"), up ("ceil") or to the
    nearest integer, half to even ("round")."""
    emit = imp.emit
    if mode == "round":
        a = emit(gi.AbsOp.make(q))
        r = emit(g.SubOp.make(emit(g.AddOp.make(a, _const(imp, EXACT))), _const(imp, EXACT)))
        neg = emit(gi.LtOp.make(q, _const(imp, 0.0)))
        signed = emit(gi.WhereOp.make(neg, emit(g.NegOp.make(r)), r))
        return emit(gi.WhereOp.make(emit(gi.LtOp.make(a, _const(imp, EXACT))), signed, q))
    if mode == "ceil":  # ceil(q) = -floor(-q)
        return emit(g.NegOp.make(rounded(imp, emit(g.NegOp.make(q)), "floor")))
    t = emit(g.CastOp.make(emit(g.CastOp.make(q, DType.I32)), DType.F32))
    if mode == "floor":
        t = emit(g.SubOp.make(t, emit(g.CastOp.make(emit(gi.LtOp.make(q, t)), DType.F32))))
    small = emit(gi.LtOp.make(emit(gi.AbsOp.make(q)), _const(imp, EXACT)))
    return emit(gi.WhereOp.make(small, t, q))


def _split(imp: Any, x: SSAValue) -> tuple[SSAValue, SSAValue]:
    """Veltkamp's split of fp32 `x` into 12 + 12 significant bits: x = hi + lo exactly."""
    emit = imp.emit
    c = emit(g.MulOp.make(x, _const(imp, 4097.0)))
    hi = emit(g.SubOp.make(c, emit(g.SubOp.make(c, x))))
    return hi, emit(g.SubOp.make(x, hi))


def _split_scalar(imp: Any, x: float) -> tuple[SSAValue, SSAValue]:
    """`_split` of a compile-time scalar, in numpy (ops on constants alone have no kernel)."""
    x32 = np.float32(x)
    c = np.float32(x32 * np.float32(4097.0))
    hi = np.float32(c - np.float32(c - x32))
    return _const(imp, float(hi)), _const(imp, float(np.float32(x32 - hi)))


def floor_div(imp: Any, a: SSAValue, b: SSAValue, b_scalar: float | None = None) -> SSAValue:
    """torch's floor division of fp32 `a` by `b` (c10's div_floor_floating: the floor of
    the exact quotient, via fmod). ``floor(fl(a / b))`` is one too large where the
    rounded quotient reached an integer the exact one is below (``1 / 0.1f``: 10, torch
    9); that is detected exactly with Dekker's product ``k * b = p + e`` and
    ``sign((p - a) + e) == sign(b)``. An infinite dividend over a non-zero divisor is NaN,
    as in torch (its fmod is NaN)."""
    emit = imp.emit
    q = emit(g.DivOp.make(a, b))
    k = rounded(imp, q, "floor")
    p = emit(g.MulOp.make(k, b))
    (kh, kl) = _split(imp, k)
    bh, bl = _split(imp, b) if b_scalar is None else _split_scalar(imp, b_scalar)
    e = emit(g.SubOp.make(emit(g.MulOp.make(kh, bh)), p))
    for u, v in ((kh, bl), (kl, bh), (kl, bl)):
        e = emit(g.AddOp.make(e, emit(g.MulOp.make(u, v))))
    d = emit(g.AddOp.make(emit(g.SubOp.make(p, a)), e))  # k * b - a, sign exact
    over = emit(gi.GtOp.make(emit(g.MulOp.make(d, b)), _const(imp, 0.0)))
    small = emit(gi.LtOp.make(emit(gi.AbsOp.make(q)), _const(imp, EXACT)))
    fix = emit(gi.WhereOp.make(small, emit(g.CastOp.make(over, DType.F32)), _const(imp, 0.0)))
    r = emit(g.SubOp.make(k, fix))
    inf_a = emit(gi.EqOp.make(emit(gi.AbsOp.make(a)), _const(imp, float("inf"))))
    if b_scalar is not None:
        return r if b_scalar == 0 else emit(gi.WhereOp.make(inf_a, _const(imp, float("nan")), r))
    nz_b = emit(gi.NeOp.make(b, _const(imp, 0.0)))
    return emit(gi.WhereOp.make(inf_a, emit(gi.WhereOp.make(nz_b, _const(imp, float("nan")), r)), r))


def div_mode(imp: Any, bind: Any, unsupported: Any) -> Any:
    """The handler of ``aten.div.Tensor_mode`` / ``div.Scalar_mode``."""

    def handle(node: Node) -> SSAValue:
        a = bind(node)
        mode = a.get("rounding_mode")
        _, dt = imp.out_meta(node)
        x, y = imp.operand(a["self"], DType.F32), imp.operand(a["other"], DType.F32)
        if mode == "floor":
            other = a["other"]
            scalar = float(other) if isinstance(other, int | float) and not isinstance(other, bool) else None
            return imp.cast_to(floor_div(imp, x, y, scalar), dt)
        if mode not in (None, "trunc"):
            raise unsupported(f"div rounding_mode {mode!r}")
        q = imp.emit(g.DivOp.make(x, y))
        return imp.cast_to(q if mode is None else rounded(imp, q, "trunc"), dt)

    return handle


def unary_rounding(imp: Any, bind: Any, mode: str) -> Any:
    """The handler of ``aten.floor`` / ``trunc`` / ``ceil`` / ``round`` of a float tensor
    (an int one is itself)."""

    def handle(node: Node) -> SSAValue:
        a = bind(node)
        _, dt = imp.out_meta(node)
        x = imp.tensor(a["self"])
        if g.element_dtype(x.type) == DType.I32:
            return x
        return imp.cast_to(rounded(imp, imp.cast_to(x, DType.F32), mode), dt)

    return handle
