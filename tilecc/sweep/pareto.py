"""Pareto fronts over minimised and maximised objectives.

    pareto_mask([[1.0, 5.0], [2.0, 4.0], [2.0, 6.0]], maximise=[False, False])
    -> [True, True, False]          # the third is dominated by the first

A point dominates another when it is at least as good in every objective and strictly
better in one. A point is Pareto when no other point dominates it, so equal points
(ties) are both Pareto unless a third dominates them. A point with a NaN (a failed
point, or an objective undefined there) is never Pareto and dominates nothing.

The front is found by sorting on the objectives (lexicographically, best first): a point
can only be dominated by one before it, so each point is compared with the front found
so far, O(n * front) instead of the brute force's O(n^2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["dominates", "pareto_mask"]


def _oriented(row: Sequence[float], maximise: Sequence[bool]) -> tuple[float, ...]:
    """The row with every objective turned into one to minimise."""
    return tuple(-v if m else v for v, m in zip(row, maximise))


def dominates(a: Sequence[float], b: Sequence[float], maximise: Sequence[bool]) -> bool:
    """Whether `a` dominates `b` (no worse everywhere, better somewhere)."""
    oa, ob = _oriented(a, maximise), _oriented(b, maximise)
    return all(x <= y for x, y in zip(oa, ob)) and any(x < y for x, y in zip(oa, ob))


def pareto_mask(rows: Sequence[Sequence[float]], maximise: Sequence[bool]) -> list[bool]:
    """For each row (one value per objective), whether it is on the Pareto front."""
    mask = [False] * len(rows)
    valid = [i for i, r in enumerate(rows) if len(r) == len(maximise) and not any(math.isnan(v) for v in r)]
    order = sorted(valid, key=lambda i: _oriented(rows[i], maximise))
    front: list[tuple[float, ...]] = []
    for i in order:
        o = _oriented(rows[i], maximise)
        if any(_dominates_oriented(f, o) for f in front):
            continue
        front.append(o)
        mask[i] = True
    return mask


def _dominates_oriented(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
