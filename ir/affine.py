"""Integer expressions over loop induction variables, as the npu dialect keeps them.

An npu instruction inside structured loops has fields that vary per iteration
(addresses, edge-tile sizes, the accumulate flag, semaphore thresholds). Each is an
`Expr` over the induction variables ``i0`` (outermost loop) ... ``iN``:

    4096 + 212*i0 + 64*i1        affine
    min(16, 37 - 16*i0)          the size of a possibly partial edge tile
    ne(i2)                        1 where i2 != 0 (accumulate after the first k-step)

Expressions print to and parse from exactly that text, and evaluate vectorised over
numpy arrays of iteration indices (codegen expands millions of dynamic instructions
this way without building one IR op each).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Affine:
    const: int = 0
    terms: tuple[tuple[int, int], ...] = ()  # (loop depth, coefficient), sorted, no zeros

    @staticmethod
    def of(const: int = 0, terms: dict[int, int] | None = None) -> Affine:
        items = tuple(sorted((d, c) for d, c in (terms or {}).items() if c != 0))
        return Affine(const, items)

    @staticmethod
    def iv(depth: int) -> Affine:
        return Affine(0, ((depth, 1),))

    def __add__(self, other: Affine) -> Affine:
        # `terms` is kept sorted without zeros, so a constant operand leaves the other's as is
        if not other.terms:
            return Affine(self.const + other.const, self.terms)
        if not self.terms:
            return Affine(self.const + other.const, other.terms)
        terms = dict(self.terms)
        for d, c in other.terms:
            terms[d] = terms.get(d, 0) + c
        return Affine.of(self.const + other.const, terms)

    def __neg__(self) -> Affine:
        return self.scale(-1)

    def __sub__(self, other: Affine) -> Affine:
        return self + (-other)

    def scale(self, k: int) -> Affine:
        if k == 0:
            return Affine(self.const * k)
        return Affine(self.const * k, tuple((d, c * k) for d, c in self.terms))  # still sorted, no zeros

    @property
    def is_const(self) -> bool:
        return not self.terms

    def max_depth(self) -> int:
        return max((d for d, _ in self.terms), default=-1)

    def evaluate(self, ivs: list[np.ndarray]) -> np.ndarray | int:
        out: np.ndarray | int = self.const
        for d, c in self.terms:
            out = out + c * ivs[d]
        return out

    def bounds(self, trips: list[int]) -> tuple[int, int]:
        lo = hi = self.const
        for d, c in self.terms:
            span = c * (trips[d] - 1)
            lo += min(0, span)
            hi += max(0, span)
        return lo, hi

    def __str__(self) -> str:
        parts: list[str] = []
        if self.const or not self.terms:
            parts.append(str(self.const))
        for d, c in self.terms:
            mono = f"i{d}" if abs(c) == 1 else f"{abs(c)}*i{d}"
            if not parts:
                parts.append(mono if c > 0 else f"-{mono}")
            else:
                parts.append(f"{'+' if c > 0 else '-'} {mono}")
        return " ".join(parts)


@dataclass(frozen=True)
class Min:
    args: tuple[Expr, ...]

    def evaluate(self, ivs: list[np.ndarray]) -> np.ndarray | int:
        vals = [a.evaluate(ivs) for a in self.args]
        out = vals[0]
        for v in vals[1:]:
            out = np.minimum(out, v)
        return out

    def bounds(self, trips: list[int]) -> tuple[int, int]:
        bs = [a.bounds(trips) for a in self.args]
        return min(b[0] for b in bs), min(b[1] for b in bs)

    def max_depth(self) -> int:
        return max(a.max_depth() for a in self.args)

    def __str__(self) -> str:
        return f"min({', '.join(str(a) for a in self.args)})"


@dataclass(frozen=True)
class Ne:
    """1 where the affine value is nonzero, else 0."""

    arg: Affine

    def evaluate(self, ivs: list[np.ndarray]) -> np.ndarray | int:
        v = self.arg.evaluate(ivs)
        return (np.asarray(v) != 0).astype(np.int64)

    def bounds(self, trips: list[int]) -> tuple[int, int]:
        lo, hi = self.arg.bounds(trips)
        return (0 if lo <= 0 <= hi else 1), (0 if lo == hi == 0 else 1)

    def max_depth(self) -> int:
        return self.arg.max_depth()

    def __str__(self) -> str:
        return f"ne({self.arg})"


Expr = Affine | Min | Ne

_TOKEN = re.compile(r"\s*(?:(\d+)|(i\d+)|(min|ne)|([-+*(),]))")


class ExprSyntaxError(ValueError):
    pass


@lru_cache(maxsize=65536)
def parse_expr(text: str) -> Expr:
    """The expression `text` prints as (expressions are immutable: a kernel's many
    instructions with one field text share the parse; codegen reparses every field)."""
    tokens = _tokenize(text) + ["<end>"]
    expr, pos = _parse_sum_or_call(tokens, 0, text)
    if pos != len(tokens) - 1:
        raise ExprSyntaxError(f"unexpected '{tokens[pos]}' in expression '{text}'")
    return expr


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExprSyntaxError(f"bad character at {pos} in expression '{text}'")
        tokens.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return tokens


def _parse_sum_or_call(tokens: list[str], pos: int, text: str) -> tuple[Expr, int]:
    if pos < len(tokens) and tokens[pos] in ("min", "ne"):
        fn = tokens[pos]
        if tokens[pos + 1] != "(":
            raise ExprSyntaxError(f"expected '(' after {fn} in '{text}'")
        args: list[Expr] = []
        pos += 2
        while True:
            arg, pos = _parse_sum_or_call(tokens, pos, text)
            args.append(arg)
            if tokens[pos] == ")":
                pos += 1
                break
            if tokens[pos] != ",":
                raise ExprSyntaxError(f"expected ',' or ')' in '{text}'")
            pos += 1
        if fn == "ne":
            if len(args) != 1 or not isinstance(args[0], Affine):
                raise ExprSyntaxError(f"ne() takes one affine argument in '{text}'")
            return Ne(args[0]), pos
        return Min(tuple(args)), pos
    return _parse_affine(tokens, pos, text)


def _parse_affine(tokens: list[str], pos: int, text: str) -> tuple[Affine, int]:
    result = Affine()
    sign = 1
    expect_term = True
    start = pos
    while pos < len(tokens):
        tok = tokens[pos]
        if tok in "+-" and len(tok) == 1:
            sign = sign if tok == "+" else -sign
            pos += 1
            expect_term = True
            continue
        if not expect_term or tok in (",", ")", "<end>"):
            break
        coeff = 1
        if tok.isdigit():
            coeff = int(tok)
            pos += 1
            if pos < len(tokens) and tokens[pos] == "*":
                tok = tokens[pos + 1]
                pos += 1
            else:
                result = result + Affine(sign * coeff)
                sign, expect_term = 1, False
                continue
        if not (tok.startswith("i") and tok[1:].isdigit()):
            raise ExprSyntaxError(f"expected a number or i<N>, got '{tok}' in '{text}'")
        result = result + Affine.of(0, {int(tok[1:]): sign * coeff})
        pos += 1
        sign, expect_term = 1, False
    if expect_term:
        got = "the end" if tokens[pos] == "<end>" else f"'{tokens[pos]}'"
        what = "a term" if pos > start else "an expression"
        raise ExprSyntaxError(f"expected {what}, got {got} in '{text}'")
    return result, pos
