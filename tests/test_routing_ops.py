"""Routing ops (`ir/graph_routing.py`): topk, sort, argsort, argmax / argmin, max / min
along a dim, kthvalue, histc, bincount, one_hot and cumsum on any dim, each compiled,
run on the simulator (sanitizers on) and compared with eager; the graph ops' shape
inference and numpy references; clear errors for what cannot be imported."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run_and_compare
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import tilecc
from tilecc.errors import ShapeError, TileccError, UnsupportedOpError
from tilecc.ir import graph as g
from tilecc.ir import graph_routing as gr
from tilecc.ir.graph_interp import run_graph
from tilecc.simulator.isa import DType


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def flat(*outs):
    """Return values as one flat tuple (torch returns (values, indices) namedtuples)."""
    res = []
    for o in outs:
        res.extend(o if isinstance(o, tuple) else (o,))
    return tuple(res)


def ties(shape, levels=3, seed=0):
    """Values from a few levels: many ties."""
    g_ = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, shape, generator=g_).float() - 1.0


SLOW_HYP = settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow])


# -- selection ------------------------------------------------------------------------


@SLOW_HYP
@given(shape=st.sampled_from([(7,), (5, 9), (3, 4, 6), (20, 5)]), data=st.data(), largest=st.booleans())
def test_topk_matches_eager(shape, data, largest):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, shape[dim]))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(k))
    run_and_compare(Fn(lambda x: flat(torch.topk(x, k, dim=dim, largest=largest))), (x,))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stable_sort_with_ties_matches_eager(descending, dim):
    x = ties((6, 5, 4), seed=dim + 3)
    run_and_compare(Fn(lambda x: flat(torch.sort(x, dim=dim, descending=descending, stable=True),
                                      torch.argsort(x, dim=dim, descending=descending, stable=True))), (x,))


def test_sort_of_integers_and_bf16():
    ids = torch.tensor([[5, 1, 3, 1, 0, 7, 3, 2]])
    xb = torch.randn(3, 10).to(torch.bfloat16)
    run_and_compare(Fn(lambda i, x: flat(torch.sort(i, stable=True), torch.sort(x, dim=0, stable=True),
                                         torch.topk(x, 3))), (ids, xb))


def test_sort_of_a_row_longer_than_the_partitions():
    x = torch.randn(2, 70)
    run_and_compare(Fn(lambda x: flat(torch.sort(x, descending=True, stable=True))), (x,))


def test_sort_with_infinities_and_ties():
    x = torch.tensor([[1.0, float("inf"), -float("inf"), 1.0, -float("inf"), 0.0],
                      [-float("inf")] * 6])
    run_and_compare(Fn(lambda x: flat(torch.sort(x, dim=1, stable=True, descending=True),
                                      torch.sort(x, dim=1, stable=True))), (x,))


def test_topk_with_ties_gives_torchs_values_and_valid_indices():
    """torch's CPU topk orders tied values arbitrarily; tilecc gives the lowest index
    first (a valid answer): the values equal eager's, the indices point at them and
    are distinct."""
    x = ties((6, 9), levels=3, seed=4)
    f = Fn(lambda x: flat(torch.topk(x, 4, dim=1), torch.topk(x, 3, dim=0, largest=False)))
    cm = tilecc.compile(f, (x,), target="tiny")
    cm.sanitize = True
    got, want = cm(x), f(x)
    for (v, i, dim), (wv, _) in zip(((got[0], got[1], 1), (got[2], got[3], 0)), ((want[0], want[1]), (want[2], want[3]))):
        torch.testing.assert_close(v, wv, rtol=0, atol=0)
        torch.testing.assert_close(torch.gather(x, dim, i), wv, rtol=0, atol=0)
        assert all(len(set(r.tolist())) == len(r) for r in i.movedim(dim, -1).reshape(-1, i.shape[dim]))
    stable = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :4]
    torch.testing.assert_close(got[1], stable, rtol=0, atol=0)


@pytest.mark.parametrize("keepdim", [False, True])
def test_argmax_argmin_first_occurrence(keepdim):
    x = ties((4, 6, 5), levels=2, seed=1)
    run_and_compare(Fn(lambda x: (x.argmax(), x.argmin(), x.argmax(0, keepdim=keepdim), x.argmin(1, keepdim=keepdim),
                                  x.argmax(-1, keepdim=keepdim))), (x,))


def test_max_min_along_a_dim_and_kthvalue():
    """Distinct values: torch leaves the index of a tied k-th value unspecified."""
    x = torch.randn(5, 7)
    run_and_compare(Fn(lambda x: flat(torch.max(x, 1), torch.min(x, 0, keepdim=True), torch.max(x, -1, True),
                                      torch.kthvalue(x, 3, 1), torch.kthvalue(x, 1, 0, keepdim=True))), (x,))


def test_rank0_selection():
    x = torch.tensor(2.5)
    run_and_compare(Fn(lambda x: flat(torch.topk(x, 1), x.argmax(), torch.sort(x))), (x,))


# -- counting -------------------------------------------------------------------------


@pytest.mark.parametrize("bins,lo,hi", [(8, -1.0, 1.0), (5, 0.0, 3.0), (3, -0.3, 0.7)])
def test_histc_edges_match_eager(bins, lo, hi):
    """Values on every bin edge, at both ends and outside the range."""
    x = torch.cat([torch.linspace(lo - 0.5, hi + 0.5, 41), torch.tensor([lo, hi])]).reshape(1, -1)
    run_and_compare(Fn(lambda x: torch.histc(x, bins, lo, hi)), (x,))


@SLOW_HYP
@given(n=st.integers(1, 70), bins=st.integers(1, 40), seed=st.integers(0, 9))
def test_histc_data_range_matches_eager(n, bins, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    run_and_compare(Fn(lambda x: torch.histc(x, bins)), (x,))


def test_histc_of_a_constant_widens_the_range():
    run_and_compare(Fn(lambda x: torch.histc(x, 4)), (torch.full((9,), 3.0),))


def test_one_hot_and_counts_with_a_static_length():
    ids = torch.tensor([[0, 3, 5, 1], [5, 5, 2, 0]])
    w = torch.randn(2, 4)
    run_and_compare(Fn(lambda i, w: (F.one_hot(i, 6), F.one_hot(i, 6).sum((0, 1)),
                                     (F.one_hot(i, 6) * w[..., None]).sum((0, 1)))), (ids, w))


def test_bincount_graph_op_counts_and_weights():
    """graph.bincount directly (torch.export gives bincount a data-dependent length)."""
    from tilecc.passes.graph_to_tile.bincount import lower_bincount  # noqa: F401 (the family exists)

    x = np.array([0, 3, 3, 7, -1, 8, 2, 3], np.float32)
    w = np.arange(8, dtype=np.float32)
    op = gr.BincountOp.make(g.ConstantOp.make(x, DType.I32), 8)
    np.testing.assert_array_equal(op.reference(x), [1, 0, 1, 3, 0, 0, 0, 1])
    wop = gr.BincountOp.make(g.ConstantOp.make(x, DType.I32), 4, g.ConstantOp.make(w, DType.F32))
    np.testing.assert_array_equal(wop.reference(x, w), [0, 0, 6, 1 + 2 + 7])


def test_bincount_has_a_data_dependent_length():
    with pytest.raises(UnsupportedOpError, match="bincount.*max\\(input\\) \\+ 1"):
        tilecc.compile(Fn(lambda x: torch.bincount(x, minlength=8)), (torch.tensor([1, 2, 2]),), target="tiny")


# -- cumsum on any dim --------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_cumsum_every_dim(dtype):
    x = (torch.randn(3, 4, 5) * 4).to(dtype)
    run_and_compare(Fn(lambda x: tuple(torch.cumsum(x, d) for d in (0, 1, 2, -1))), (x,))


@pytest.mark.parametrize("shape,dim", [((3, 40), 1), ((37, 5), 0), ((2, 19, 33), 1), ((100,), 0)])
def test_cumsum_across_blocks_and_row_tiles(shape, dim):
    """Rows longer than the array's 16 columns (the carry between blocks), more rows than
    16 partitions, a middle dim; integers exact."""
    x = torch.randn(shape)
    ids = torch.randint(-50, 50, shape)
    run_and_compare(Fn(lambda x, i: (torch.cumsum(x, dim), torch.cumsum(i, dim))), (x, ids))


def test_cumsum_with_an_int32_result_of_floats():
    x = torch.tensor([1.0, 0.0, 2.0, 1.0])
    run_and_compare(Fn(lambda x: torch.cumsum(x, 0, dtype=torch.int32)), (x,))


# -- graph ops ------------------------------------------------------------------------


def _topk_indices(x):
    return [gr.TopkIndicesOp.make(x, 1, 2, loc="t.py:1"), gr.TopkIndicesOp.make(x, 0, 4, largest=False)]


def _bincount(x):
    ids = g.CastOp.make(x, DType.I32)
    return [ids, gr.BincountOp.make(ids, 5, loc="b.py:2"), gr.BincountOp.make(ids, 3, x, loc="b.py:3")]


def _cumsum(x):
    return [gr.CumsumOp.make(x, 1, loc="c.py:4"), gr.CumsumOp.make(x, -2)]


ROUTING_BUILDERS = {"graph.topk_indices": _topk_indices, "graph.bincount": _bincount, "graph.cumsum": _cumsum}
"""One builder per op of the family (also used by test_graph_ir's round-trip test)."""


def test_topk_indices_shape_inference_and_errors():
    x = g.ConstantOp.make(np.zeros((4, 6), np.float32), DType.F32)
    op = gr.TopkIndicesOp.make(x, -1, 3, largest=False)
    assert g.shape_of(op.result) == (4, 3) and g.element_dtype(op.result.type) == DType.I32
    assert op.params == (1, 3, False)
    with pytest.raises(ShapeError, match="k = 7"):
        gr.TopkIndicesOp.make(x, 1, 7)
    with pytest.raises(ShapeError, match="dim 2"):
        gr.TopkIndicesOp.make(x, 2, 1)
    with pytest.raises(ShapeError, match="must be i32"):
        gr.BincountOp.make(x, 4)


def test_topk_indices_reference_is_stable():
    x = np.array([[1, 3, 3, 0, 3]], np.float32)
    op = gr.TopkIndicesOp.make(g.ConstantOp.make(x, DType.F32), 1, 5)
    np.testing.assert_array_equal(op.reference(x), [[1, 2, 4, 0, 3]])
    small = gr.TopkIndicesOp.make(g.ConstantOp.make(x, DType.F32), 1, 2, largest=False)
    np.testing.assert_array_equal(small.reference(x), [[3, 0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selection_of_rows_longer_than_a_partition_streams(dtype):
    """Rows of 3000 (an SRAM partition of `tiny` holds ~1170 with the buffers): k passes
    over chunks from HBM; an LM-style argmax over a vocabulary, a top-5, ties."""
    x = torch.randn(3, 3000).to(dtype)
    x[1, 2500] = x[1, 7] = x[1].max() + 1  # a tie for the maximum across chunks
    x[2, 100:] = x[2, 50]  # long runs of ties
    run_and_compare(Fn(lambda x: (x.argmax(-1), x.argmin(-1), torch.topk(x, 5, dim=1).values)), (x,))
    cm = tilecc.compile(Fn(lambda x: torch.topk(x, 5, dim=1, largest=False).indices), (x,), target="tiny")
    cm.sanitize = True
    stable = torch.sort(x, dim=1, stable=True).indices[:, :5]  # the lowest index first among ties
    torch.testing.assert_close(cm(x), stable, rtol=0, atol=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_bincount_lowering_on_the_simulator(weighted):
    """graph.bincount compiled directly (torch.export never gives bincount a static
    length): 40 values (3 tiles of the 16-row array), 20 bins (2 chunks of its 16
    columns), values outside [0, 20) ignored; counts and weighted sums exact."""
    from xdsl.parser import Parser

    from tilecc.runtime.compiler import compile_graph
    from tilecc.runtime.executor import run_program
    from tilecc.simulator.config import load_config

    w_arg, w_use, w_type = (", %w: tensor<40xf32>", ", %w", ", tensor<40xf32>") if weighted else ("", "", "")
    text = f"""
    builtin.module {{
      func.func @forward(%x: tensor<40xi32>{w_arg}) -> tensor<20xf32> {{
        %c = graph.bincount %x{w_use} length 20 : tensor<40xi32>{w_type} -> tensor<20xf32>
        func.return %c : tensor<20xf32>
      }}
    }}
    """
    m = Parser(g.graph_context(), text).parse_module()
    gp = g.GraphProgram(m, {}, ["x", "w"][: 1 + weighted], ["c"])
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 24, 40)
    w = rng.standard_normal(40).astype(np.float32)
    inputs = (torch.from_numpy(x).to(torch.int32), torch.from_numpy(w))[: 1 + weighted]
    (got,), _ = run_program(compile_graph(gp, load_config("tiny")), inputs, sanitize=True)
    keep = (x >= 0) & (x < 20)
    want = np.bincount(x[keep], weights=w[keep] if weighted else None, minlength=20)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-6, atol=1e-6)
    (ref,) = run_graph(gp, [x.astype(np.float32), w][: 1 + weighted])
    np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-6)


def test_sort_of_a_very_long_row_is_a_clear_error():
    with pytest.raises(TileccError, match="topk_indices.*streams the row 5000 times"):
        tilecc.compile(Fn(lambda x: torch.sort(x)[0]), (torch.randn(1, 5000),), target="tiny")


def test_one_hot_without_num_classes_says_why():
    from tilecc.errors import ExportError

    with pytest.raises(ExportError, match="F.one_hot without num_classes"):
        tilecc.compile(Fn(lambda x: F.one_hot(x)), (torch.tensor([0, 2, 1]),), target="tiny")
