"""Differential fuzzing of the tile DSL: random row-wise kernels (expression trees of
loads, constants, activations, arithmetic, row reductions broadcast back over the row,
a broadcast row operand, bf16 casts) over hypothesis-drawn sizes and tile heights,
run on the simulator with the sanitisers on and compared with the same expression in
numpy (float64, then rounded like the kernel's output).

Profiles as tests/test_fuzz.py (``TILECC_FUZZ=deep`` with ``TILECC_FUZZ_EXAMPLES``)."""

from __future__ import annotations

import os

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilecc

DEEP = os.environ.get("TILECC_FUZZ", "fast") == "deep"
settings.register_profile("tilecc-dsl-fuzz-fast", max_examples=6, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck), database=None)
settings.register_profile("tilecc-dsl-fuzz-deep", max_examples=int(os.environ.get("TILECC_FUZZ_EXAMPLES", "2000")),
                          deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)

# bounded activations keep random trees finite; (DSL name, numpy)
UNARY = {
    "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "neg": np.negative, "abs": np.abs, "silu": lambda x: x / (1 + np.exp(-x)),
}
BINARY = {"+": np.add, "-": np.subtract, "*": np.multiply}
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


def _trees(n_inputs: int):
    leaf = st.one_of(
        st.integers(0, n_inputs - 1).map(lambda i: ("in", i)),
        st.sampled_from([0.5, 1.5, -2.0]).map(lambda c: ("const", c)),
        st.just(("row",)),
    )

    def extend(sub):
        return st.one_of(
            st.tuples(st.just("un"), st.sampled_from(sorted(UNARY)), sub),
            st.tuples(st.just("bin"), st.sampled_from(sorted(BINARY)), sub, sub),
            # a row reduction of one tree broadcast back against another: a (op) red(b)
            st.tuples(st.just("red"), st.sampled_from(sorted(REDUCE)), st.sampled_from(["+", "-", "*"]), sub, sub),
        )

    return st.recursive(leaf, extend, max_leaves=6)


def _has_input(t) -> bool:
    return t[0] == "in" or any(isinstance(x, tuple) and _has_input(x) for x in t[1:])


def _tile_valued(t) -> bool:
    """A tree the kernel can store: every operation has a tile operand (the DSL
    broadcasts rows, columns and scalars against tiles, not against each other; those
    kernels are rejected with a clear error, tested in tests/test_dsl_errors.py)."""
    def ok(x) -> bool:
        kind = x[0]
        if kind == "un" and not _has_input(x[2]):
            return False  # an activation of a constant or of the row alone
        if kind == "red" and not (_has_input(x[3]) and _has_input(x[4])):
            return False  # the DSL broadcasts a reduced column against tiles only
        if kind == "bin" and not (_has_input(x[2]) or _has_input(x[3])):
            return False
        return all(ok(y) for y in x[1:] if isinstance(y, tuple))

    return _has_input(t) and ok(t)


@st.composite
def kernels(draw):
    n = draw(st.integers(1, 3))
    tree = draw(_trees(n).filter(_tile_valued))
    return {
        "n": n, "tree": tree,
        "R": draw(st.sampled_from([1, 3, 16, 17, 40])), "C": draw(st.sampled_from([1, 2, 7, 33, 100])),
        "T": draw(st.sampled_from([1, 8, 16])), "buffers": draw(st.sampled_from([1, 2])),
        "out": draw(st.sampled_from(["f32", "bf16"])),
    }


def _src(k: dict) -> str:
    def ex(t) -> str:
        kind = t[0]
        if kind == "in":
            return f"load(x{t[1]}[r, :])"
        if kind == "const":
            return repr(t[1])
        if kind == "row":
            return "load(w[:])"
        if kind == "un":
            return f"{t[1]}({ex(t[2])})"
        if kind == "bin":
            return f"({ex(t[2])} {t[1]} {ex(t[3])})"
        return f"({ex(t[3])} {t[2]} {t[1]}({ex(t[4])}))"

    params = ", ".join([f"x{i}: f32[R, C]" for i in range(k["n"])] + ["w: f32[C]"])
    body = ex(k["tree"])
    if k["out"] == "bf16":
        body = f"bf16({body})"
    return (f"kernel fuzz({params}) -> {k['out']}[R, C]:\n"
            f"    for r in tiles(R, {k['T']}, buffers={k['buffers']}):\n"
            f"        out[r, :] = {body}\n")


def _reference(k: dict, xs: list[np.ndarray], w: np.ndarray) -> np.ndarray:
    def ev(t):
        kind = t[0]
        if kind == "in":
            return xs[t[1]]
        if kind == "const":
            return np.float64(t[1])
        if kind == "row":
            return w[None, :]
        if kind == "un":
            return UNARY[t[1]](ev(t[2]))
        if kind == "bin":
            return BINARY[t[1]](ev(t[2]), ev(t[3]))
        b = np.broadcast_to(ev(t[4]), (k["R"], k["C"]))
        return BINARY[t[2]](ev(t[3]), REDUCE[t[1]](b, axis=-1, keepdims=True))

    return np.broadcast_to(ev(k["tree"]), (k["R"], k["C"]))


def check(k: dict) -> None:
    rng = np.random.default_rng(k["R"] * 131 + k["C"])
    xs = [rng.standard_normal((k["R"], k["C"])).astype(np.float32) for _ in range(k["n"])]
    w = rng.standard_normal(k["C"]).astype(np.float32)
    kern = tilecc.kernel(_src(k))
    kern.sanitize = True
    got = kern(*[torch.from_numpy(x) for x in xs], torch.from_numpy(w), target="tiny").float().numpy()
    want = _reference(k, [x.astype(np.float64) for x in xs], w.astype(np.float64))
    scale = max(1.0, float(np.abs(want).max()))
    tol = 2e-2 if k["out"] == "bf16" else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=_src(k))


@settings(settings.get_profile(f"tilecc-dsl-fuzz-{'deep' if DEEP else 'fast'}"))
@given(k=kernels())
def test_random_dsl_kernels_match_numpy(k):
    check(k)


def test_a_known_kernel_through_the_generator():
    """The generator's source and reference agree on a hand-checked tree: softmax-like
    `x0 - max(x0)` then exp-free scaling by the broadcast row."""
    k = {"n": 1, "tree": ("bin", "*", ("red", "max", "-", ("in", 0), ("in", 0)), ("row",)),
         "R": 17, "C": 33, "T": 16, "buffers": 2, "out": "f32"}
    assert "max(load(x0[r, :]))" in _src(k) and "load(w[:])" in _src(k)
    check(k)


# ---- loop-carried row statistics over column tiles -----------------------------------
# The lowering's lazily zeroed SRAM tiles (`a = zeros(...)` then `a += ...` written
# straight into a), small fills in loops (vector copies of a resident constant) and
# `empty` buffers overwritten by every iteration, in unrolled and scf.for loops.


@st.composite
def accumulating_kernels(draw):
    return {
        "fn": draw(st.sampled_from(["", *sorted(UNARY)])), "red": draw(st.sampled_from(["sum", "max"])),
        "R": draw(st.sampled_from([1, 3, 16, 17, 40])), "C": draw(st.sampled_from([1, 2, 7, 33, 100])),
        "T": draw(st.sampled_from([1, 8, 16])), "TC": draw(st.sampled_from([1, 8, 16, 32])),
        "unroll": draw(st.booleans()), "buffers": draw(st.sampled_from([1, 2])), "scratch": draw(st.booleans()),
    }


def _acc_src(k: dict) -> str:
    tile = "load(x[r, c])"
    val = f"{k['fn']}({tile})" if k["fn"] else tile
    if k["scratch"]:  # an `empty` tile declared per row tile, overwritten by every column tile
        pre, val, stmt = "        t = empty(f32[r.size, 1])\n", "t", f"            t = {k['red']}({val})\n"
    else:
        pre, stmt = "", ""
    if k["red"] == "sum":
        init, update = "zeros(f32[r.size, 1])", f"a += {'t' if k['scratch'] else f'sum({val})'}"
    else:
        init, update = "full(f32[r.size, 1], -1e30)", f"a = max(a, {'t' if k['scratch'] else f'max({val})'})"
    unroll = ", unroll=True" if k["unroll"] else ""
    return (f"kernel stat(x: f32[R, C]) -> f32[R, 1]:\n"
            f"    for r in tiles(R, {k['T']}, buffers={k['buffers']}):\n"
            f"{pre}"
            f"        a = {init}\n"
            f"        for c in tiles(C, {k['TC']}{unroll}):\n"
            f"{stmt}"
            f"            {update}\n"
            f"        out[r, :] = a\n")


def check_accumulating(k: dict) -> None:
    x = np.random.default_rng(k["R"] * 7 + k["C"]).standard_normal((k["R"], k["C"])).astype(np.float32)
    kern = tilecc.kernel(_acc_src(k))
    kern.sanitize = True
    got = kern(torch.from_numpy(x), target="tiny").numpy()
    fx = UNARY[k["fn"]](x.astype(np.float64)) if k["fn"] else x.astype(np.float64)
    want = fx.sum(-1, keepdims=True) if k["red"] == "sum" else fx.max(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())),
                               err_msg=_acc_src(k))


@settings(settings.get_profile(f"tilecc-dsl-fuzz-{'deep' if DEEP else 'fast'}"))
@given(k=accumulating_kernels())
def test_random_accumulating_kernels_match_numpy(k):
    check_accumulating(k)
