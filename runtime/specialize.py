"""Shape specialisation of programs exported with dynamic sizes (torch.export `Dim`s).

The exported program keeps its sizes symbolic (sympy symbols with value ranges, in
`range_constraints`). At call time the concrete input shapes bind the symbols; a shape
outside the declared range is an `InputMismatchError`; each distinct binding is compiled
once and cached (see `tilecc.api.CompiledModel`).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from tilecc.errors import InputMismatchError


def user_inputs(ep: ExportedProgram) -> list[tuple[str, tuple[Any, ...]]]:
    """(name, shape with SymInts) of each user input, in order."""
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs}
    out = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and kinds.get(node.name) == InputKind.USER_INPUT:
            val = node.meta.get("val")
            out.append((node.name, tuple(val.shape) if isinstance(val, torch.Tensor) else ()))
    return out


def is_dynamic(ep: ExportedProgram) -> bool:
    return any(isinstance(d, torch.SymInt) for _, shape in user_inputs(ep) for d in shape)


def bind(ep: ExportedProgram, inputs: tuple) -> dict[sympy.Symbol, int]:
    """Symbol values implied by the concrete `inputs`, checked against the declared ranges."""
    specs = user_inputs(ep)
    if len(inputs) != len(specs):
        raise InputMismatchError(
            f"the program takes {len(specs)} input(s) ({', '.join(n for n, _ in specs)}), got {len(inputs)}"
        )
    bindings: dict[sympy.Symbol, int] = {}
    deferred: list[tuple[str, int, Any, int]] = []
    for (name, shape), t in zip(specs, inputs):
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"input '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != len(shape):
            raise InputMismatchError(
                f"input '{name}' has {t.dim()} dimensions, the program takes {len(shape)}"
            )
        for dim, (want, got) in enumerate(zip(shape, t.shape)):
            if not isinstance(want, torch.SymInt):
                if int(want) != got:
                    raise InputMismatchError(
                        f"input '{name}' dimension {dim} is {got}, the program was exported with "
                        f"the static size {int(want)}"
                    )
                continue
            expr = want.node.expr
            if isinstance(expr, sympy.Symbol) and expr not in bindings:
                bindings[expr] = int(got)
            deferred.append((name, dim, expr, int(got)))
    for name, dim, expr, got in deferred:
        value = int(expr.subs(bindings))
        if value != got:
            raise InputMismatchError(
                f"input '{name}' dimension {dim} is {got}, but the program requires {expr} = {value}"
            )
    for sym, value in bindings.items():
        vr = ep.range_constraints.get(sym)
        if vr is None:
            continue
        lo, hi = vr.lower, vr.upper
        if value < lo or (hi != sympy.oo and value > hi):
            where = next(f"input '{n}' dimension {d}" for n, d, e, _ in deferred if e == sym)
            raise InputMismatchError(
                f"{where} is {value}, outside the range [{lo}, {hi}] declared for it at export ({sym})"
            )
    return bindings
