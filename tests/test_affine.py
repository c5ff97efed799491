import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tilecc.ir.affine import Affine, ExprSyntaxError, Min, Ne, parse_expr

affines = st.builds(
    Affine.of,
    st.integers(-10_000, 10_000),
    st.dictionaries(st.integers(0, 4), st.integers(-300, 300), max_size=4),
)
exprs = st.one_of(
    affines,
    st.builds(lambda a, b: Min((a, b)), affines, affines),
    st.builds(Ne, affines),
)


@given(exprs)
def test_print_parse_round_trip(e):
    assert parse_expr(str(e)) == e


@given(exprs, st.lists(st.integers(1, 5), min_size=5, max_size=5))
def test_vectorised_evaluation_matches_scalar(e, trips):
    grid = np.indices(trips).reshape(len(trips), -1)
    ivs = [grid[d] for d in range(len(trips))]
    vec = np.broadcast_to(e.evaluate(ivs), (grid.shape[1],))
    for j in range(0, grid.shape[1], 7):
        point = [int(grid[d, j]) for d in range(len(trips))]
        assert vec[j] == np.asarray(e.evaluate([np.array(p) for p in point]))
    lo, hi = e.bounds(trips)
    assert lo <= vec.min() and vec.max() <= hi


def test_edge_tile_size():
    e = parse_expr("min(16, 37 - 16*i0)")
    assert list(e.evaluate([np.arange(3)])) == [16, 16, 5]


@pytest.mark.parametrize("bad", ["1 +", "min(1", "i", "2 * 3", "x0", "ne(min(1, 2))"])
def test_syntax_errors(bad):
    with pytest.raises(ExprSyntaxError):
        parse_expr(bad)
