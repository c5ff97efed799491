"""ir/dense_elements.py: a dense attribute's values read from its bytes equal xDSL's
element-by-element `get_values()` (the packager reads constants with it)."""

import numpy as np
import pytest
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    Signedness,
    TensorType,
)

from tilecc.ir.dense_elements import dense_elements

RNG = np.random.default_rng(0)
CASES = [
    (BFloat16Type(), (RNG.standard_normal(257) * 100).tolist() + [0.0, -0.0, float("inf"), -1e-40]),
    (Float32Type(), (RNG.standard_normal(257) * 1e3).tolist() + [float("-inf"), 1e-45]),
    (Float16Type(), RNG.standard_normal(64).tolist() + [65504.0]),
    (Float64Type(), RNG.standard_normal(64).tolist()),
    (IntegerType(32), RNG.integers(-(2**31), 2**31 - 1, 64).tolist()),
    (IntegerType(64), RNG.integers(-(2**62), 2**62, 64).tolist()),
    (IntegerType(8), RNG.integers(-128, 127, 64).tolist()),
    (IntegerType(1), [0, 1, 1, 0]),
    (IntegerType(32, Signedness.UNSIGNED), [0, 7, 2**32 - 1]),
    (Float32Type(), [float("nan"), 1.0]),  # a NaN: the general path
]


@pytest.mark.parametrize("el,vals", CASES, ids=[f"{el}-{i}" for i, (el, _) in enumerate(CASES)])
def test_dense_elements_equal_get_values(el, vals):
    attr = DenseIntOrFPElementsAttr.from_list(TensorType(el, [len(vals)]), vals)
    want = np.asarray(attr.get_values())
    got = dense_elements(attr)
    assert got.dtype.kind == want.dtype.kind
    assert got.shape == want.shape
    # bit for bit after the packager's conversion (float32 for floats)
    if want.dtype.kind == "f":
        assert np.array_equal(got.astype(np.float32).view(np.uint32), want.astype(np.float32).view(np.uint32)) \
            or np.isnan(want).any()
        assert np.array_equal(got, want, equal_nan=True)
    else:
        assert np.array_equal(got, want)


@pytest.mark.parametrize("el", [BFloat16Type(), Float32Type(), Float16Type()], ids=str)
@pytest.mark.parametrize("kind", ["f32", "f64", "int", "nan", "special"])
def test_dense_floats_equal_from_list(el, kind):
    from tilecc.ir.dense_elements import dense_floats

    vals = {
        "f32": (RNG.standard_normal(300) * 10).astype(np.float32),
        "f64": RNG.standard_normal(300) * 10,  # not float32: one rounding, as from_list
        "int": np.arange(-50, 50),
        "nan": np.array([np.nan, 1.0, 2.5], dtype=np.float32),
        # ties (halfway between bf16 / f16 neighbours), the largest, subnormals, infinities
        "special": np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 65520.0, 3.4e38, 1e-40, -1e-45, 0.0, -0.0,
                             np.inf, -np.inf, np.float32(2**-126) * 1.5], dtype=np.float32),
    }[kind]
    t = TensorType(el, [len(vals)])
    try:
        want = DenseIntOrFPElementsAttr.from_list(t, vals.tolist()).data.data
    except OverflowError:  # f16 beyond its range: both refuse
        with pytest.raises(OverflowError):
            dense_floats(vals, t)
        return
    assert dense_floats(vals, t).data.data == want
