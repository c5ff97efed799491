"""Pareto fronts (tilecc/sweep/pareto.py) against the brute-force definition, with
minimised and maximised objectives, ties and NaN."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tilecc.sweep.pareto import dominates, pareto_mask


def brute_force(rows: list[list[float]], maximise: list[bool]) -> list[bool]:
    """O(n^2): a row is Pareto when it has no NaN and no valid row dominates it."""
    def valid(r: list[float]) -> bool:
        return not any(math.isnan(v) for v in r)

    def better_or_equal(a: float, b: float, m: bool) -> bool:
        return a >= b if m else a <= b

    def dom(a: list[float], b: list[float]) -> bool:
        return (all(better_or_equal(x, y, m) for x, y, m in zip(a, b, maximise))
                and any(x != y for x, y in zip(a, b)))

    return [valid(r) and not any(valid(o) and dom(o, r) for o in rows) for r in rows]


# few distinct values, so that ties and duplicates are common
VALUES = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 3.0, -1.0, 1e9, math.nan]),
                   st.floats(-100, 100, allow_nan=False))


@st.composite
def problems(draw):
    k = draw(st.integers(1, 4))
    maximise = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    rows = draw(st.lists(st.lists(VALUES, min_size=k, max_size=k), max_size=40))
    return rows, maximise


@settings(max_examples=400, deadline=None)
@given(problems())
def test_pareto_equals_brute_force(problem):
    rows, maximise = problem
    assert pareto_mask(rows, maximise) == brute_force(rows, maximise)


def test_minimised_and_maximised():
    rows = [[1.0, 10.0], [2.0, 20.0], [2.0, 5.0], [0.5, 1.0]]
    assert pareto_mask(rows, [False, True]) == [True, True, False, True]  # low x, high y
    assert pareto_mask(rows, [False, False]) == [False, False, False, True]
    assert pareto_mask(rows, [True, True]) == [False, True, False, False]


def test_ties_are_both_pareto_unless_dominated():
    assert pareto_mask([[1.0, 2.0], [1.0, 2.0]], [False, False]) == [True, True]
    assert pareto_mask([[1.0, 2.0], [1.0, 2.0], [1.0, 1.0]], [False, False]) == [False, False, True]


def test_nan_and_failed_points_are_never_pareto():
    assert pareto_mask([[math.nan, 0.0], [5.0, 5.0]], [False, False]) == [False, True]
    assert pareto_mask([[math.nan]], [True]) == [False]
    assert pareto_mask([], [False]) == []


def test_dominates():
    assert dominates([1.0, 1.0], [1.0, 2.0], [False, False])
    assert not dominates([1.0, 2.0], [1.0, 2.0], [False, False])  # equal: no domination
    assert dominates([1.0, 3.0], [1.0, 2.0], [False, True])
