"""The scatter family: the ISA's DMA_SCATTER (indirect store), graph.index_scatter and
graph.as_strided, their importers, and every op end to end on the simulator against
eager PyTorch (duplicates, negative indices, every reduction)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import run_and_compare
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tilecc.codegen.asm import format_instruction, parse_asm, print_asm
from tilecc.codegen.binary import decode_stream, encode_stream
from tilecc.errors import MemoryAccessError, ShapeError, SimulatorError, UnsupportedOpError
from tilecc.ir import graph as g
from tilecc.ir import graph_scatter as gs
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import OPCODE_ENGINE, DType, Engine, Mem, Opcode
from tilecc.simulator.machine import simulate

E2E = settings(
    max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# --------------------------------------------------------------------------- ISA: DMA_SCATTER

SCATTER_LINE = (
    "dma.scatter q3 sram[p2 +0x40]:f32, index sram[p0 +0x0]:i32 "
    "-> hbm[0x1000 rs=768 bound=1000]:f32 16x768 wait(s1>=2) signal(s0)"
)


def test_scatter_isa_and_asm_round_trip():
    assert Opcode.DMA_SCATTER == 8 and OPCODE_ENGINE[Opcode.DMA_SCATTER] == Engine.DMA
    s = parse_asm(SCATTER_LINE + "\n")
    r = s[0]
    assert r["opcode"] == Opcode.DMA_SCATTER and r["queue"] == 3
    assert (r["o_mem"], r["o_addr"], r["hbm_rs"], r["k"]) == (Mem.HBM, 0x1000, 768, 1000)
    assert (r["a_mem"], r["a_part"], r["a_addr"], r["b_dtype"]) == (Mem.SRAM, 2, 0x40, DType.I32)
    assert format_instruction(r) == SCATTER_LINE
    assert decode_stream(encode_stream(s)).tobytes() == s.tobytes()
    assert print_asm(s) == SCATTER_LINE + "\n"


TABLE_AT, INDEX_AT, SRC_AT = 0x1000, 0x8000, 0x9000


def run_scatter(table: np.ndarray, index: np.ndarray, src: np.ndarray, *, bound=None):
    """Load `index` and `src` onto partitions, scatter src's rows into the table."""
    cfg = load_config("tiny")
    hbm = np.zeros(1 << 16, np.uint8)
    t = np.ascontiguousarray(table, dtype=np.float32)
    hbm[TABLE_AT : TABLE_AT + t.nbytes] = t.view(np.uint8).ravel()
    idx = np.ascontiguousarray(index, dtype=np.int32)
    hbm[INDEX_AT : INDEX_AT + idx.nbytes] = idx.view(np.uint8)
    x = np.ascontiguousarray(src, dtype=np.float32)
    hbm[SRC_AT : SRC_AT + x.nbytes] = x.view(np.uint8).ravel()
    n, (V, D), cols = len(idx), t.shape, x.shape[1]
    text = f"""
    dma.load q0 hbm[{INDEX_AT} rs=1 cs=1]:i32 -> sram[p0 +0x0]:i32 {n}x1 signal(s0)
    dma.load q1 hbm[{SRC_AT} rs={cols} cs=1]:f32 -> sram[p0 +0x40]:f32 {n}x{cols} signal(s1)
    dma.scatter q1 sram[p0 +0x40]:f32, index sram[p0 +0x0]:i32 -> hbm[{TABLE_AT + 4} rs={D} bound={bound or V}]:f32 {n}x{cols} wait(s0>=1, s1>=1)
    barrier
    """
    result = simulate(parse_asm(text), cfg, hbm, sanitize=True)
    return hbm[TABLE_AT : TABLE_AT + t.nbytes].view(np.float32).reshape(V, D), result


def test_scatter_writes_indexed_rows_last_duplicate_wins():
    table = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
    index = np.array([3, 0, 9, 3, 5])
    src = -np.arange(5 * 4, dtype=np.float32).reshape(5, 4) - 1
    out, result = run_scatter(table, index, src)
    want = table.copy()
    for r, i in enumerate(index):
        want[i, 1:5] = src[r]
    np.testing.assert_array_equal(out, want)
    assert result.hbm_bytes_written == 5 * 4 * 4


@pytest.mark.parametrize("bad, where", [(10, 2), (-1, 0)])
def test_scatter_index_out_of_range(bad, where):
    index = np.array([3, 0, 9, 3])
    index[where] = bad
    with pytest.raises(MemoryAccessError) as info:
        run_scatter(np.zeros((10, 8)), index, np.zeros((4, 4)))
    msg = str(info.value)
    assert msg.startswith("instruction 2 (dma1 DMA_SCATTER): scatter index")
    assert f"index {bad} (row {where} of the index column) out of range for a table of 10 rows" in msg


def test_scatter_table_is_checked_statically():
    with pytest.raises(MemoryAccessError, match=r"instruction 2 \(dma1 DMA_SCATTER\): table HBM bytes"):
        run_scatter(np.zeros((10, 8)), np.array([0]), np.zeros((1, 4)), bound=1 << 20)
    s = parse_asm(SCATTER_LINE.replace(" wait(s1>=2) signal(s0)", "").replace("q3", "q1"))
    s["b_dtype"] = DType.F32
    with pytest.raises(SimulatorError, match="scatter indices are i32"):
        simulate(s, load_config("tiny"), np.zeros(1 << 22, np.uint8))


# --------------------------------------------------------------------------- graph ops


def test_index_scatter_shape_errors():
    x = g.ConstantOp.make(np.zeros((4, 5), np.float32), DType.F32)
    i = g.ConstantOp.make(np.array([1, 2], np.float32), DType.I32)
    s = g.ConstantOp.make(np.zeros((4, 2), np.float32), DType.F32)
    op = gs.IndexScatterOp.make(x, i, s, 1, "sum")
    assert g.shape_of(op.results[0]) == (4, 5)
    with pytest.raises(ShapeError, match="src tensor<4x2xf32> must be tensor<2x5xf32>"):
        gs.IndexScatterOp.make(x, i, s, 0)
    with pytest.raises(ShapeError, match="reduce must be one of"):
        gs.IndexScatterOp.make(x, i, s, 1, "mean")
    with pytest.raises(ShapeError, match="outside the 20 elements"):
        gs.AsStridedOp.make(x, [3, 3], [5, 1], 8)


@given(
    v=st.integers(1, 6), n=st.integers(1, 8), r=st.integers(1, 3), seed=st.integers(0, 1000),
    reduce=st.sampled_from(gs.REDUCTIONS),
)
@settings(max_examples=40, deadline=None)
def test_index_scatter_reference_matches_torch(v, n, r, seed, reduce):
    rng = np.random.default_rng(seed)
    dest = rng.standard_normal((2, v, r)).astype(np.float32)
    idx = rng.integers(0, v, n)  # duplicates likely
    src = rng.standard_normal((2, n, r)).astype(np.float32)
    x = g.ConstantOp.make(dest, DType.F32)
    op = gs.IndexScatterOp.make(
        x, g.ConstantOp.make(idx.astype(np.float32), DType.I32), g.ConstantOp.make(src, DType.F32), 1, reduce
    )
    got = op.reference(dest, idx.astype(np.float32), src)
    t = torch.from_numpy(dest.copy())
    ti = torch.from_numpy(idx).view(1, n, 1).expand(2, n, r)
    if reduce == "none":
        for k in range(n):  # sequential: the last duplicate wins
            t[:, idx[k]] = torch.from_numpy(src[:, k])
        want = t
    else:
        want = t.scatter_reduce(1, ti, torch.from_numpy(src), reduce)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- end to end

X = torch.randn(2, 8, 5)
SRC = torch.randn(2, 3, 5)
DUP = torch.tensor([1, 6, 1])


def _put(idx, accumulate=False):
    def f(x, v):  # x[:, idx] = v (or += v): the index_put torch.export records
        return torch.ops.aten.index_put(x, [None, idx], v, accumulate)

    return f


@pytest.mark.parametrize(
    "name, fn, args",
    [
        ("index_copy", lambda x, s: x.index_copy(1, torch.tensor([1, 6, 3]), s) * 2, (X, SRC)),
        ("index_add duplicates alpha", lambda x, s: x.index_add(1, DUP, s, alpha=-2.0), (X, SRC)),
        ("index_put none entries", _put(torch.tensor([5, 0, 7])), (X, SRC)),
        ("index_put negative", _put(torch.tensor([-1, 0, -8])), (X, SRC)),
        ("index_put accumulate duplicates", _put(DUP, True), (X, SRC)),
        ("index_put broadcast value", lambda x: torch.ops.aten.index_put(x, [None, DUP], torch.tensor(3.0)), (X,)),
        ("index_put two indices", lambda x, v: torch.ops.aten.index_put(
            x, [torch.tensor([0, 1, 1]), torch.tensor([2, -1, 2])], v, True), (X, torch.randn(3, 5))),
        ("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 1, 1, 7, 2), (X, SRC)),
        ("select_scatter", lambda x, s: torch.select_scatter(x, s, 1, -2), (X, torch.randn(2, 5))),
    ],
)
def test_slice_scatters_match_eager(name, fn, args):
    run_and_compare(Fn(fn), args)


IDX = torch.tensor([[0, 7, 7, 2, 0], [3, 3, 3, 1, 6], [7, 0, 0, 0, 5]]).expand(2, 3, 5).contiguous()


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_matches_eager(reduce, include_self):
    src = torch.randn(2, 4, 5)
    run_and_compare(Fn(lambda x, s: x.scatter_reduce(1, IDX, s, reduce, include_self=include_self)), (X, src))


@pytest.mark.parametrize(
    "name, fn",
    [
        ("scatter src", lambda x, s: x.scatter(1, IDX, s)),
        ("scatter value", lambda x, s: x.scatter(1, IDX, -1.5) + s.sum()),
        ("scatter_add", lambda x, s: x.scatter_add(1, IDX, s)),
        ("scatter add reduce", lambda x, s: x.scatter(1, IDX, s, reduce="add")),
    ],
)
def test_scatter_matches_eager(name, fn):
    run_and_compare(Fn(fn), (X, torch.randn(2, 4, 5)))


def test_integer_scatter_add_and_bf16_index_add():
    counts = Fn(lambda i: torch.zeros(8, dtype=torch.int64).scatter_add(0, i, torch.ones_like(i)))
    run_and_compare(counts, (torch.tensor([1, 1, 7, 3, 1, 0]),))
    run_and_compare(Fn(lambda x, s: x.index_add(0, DUP, s)), (torch.randn(8, 4).bfloat16(), torch.randn(3, 4).bfloat16()))


@E2E
@given(v=st.integers(1, 20), n=st.integers(1, 20), r=st.integers(1, 40), seed=st.integers(0, 1000))
def test_index_add_with_duplicates_any_shape(v, n, r, seed):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, v, (n,), generator=gen)
    x, s = torch.randn(v, r, generator=gen), torch.randn(n, r, generator=gen)
    run_and_compare(Fn(lambda x, s: x.index_add(0, idx, s)), (x, s))


@pytest.mark.parametrize(
    "size, stride, offset",
    [
        ((3, 3), (1, 1), 0),  # overlapping windows
        ((4, 2, 3), (0, 3, 1), 2),  # a stride-0 dim and an offset
        ((2, 5), (10, 2), 1),  # innermost stride 2: a strided DMA copy
        ((3, 4), (4, 1), 0),
    ],
)
def test_as_strided_matches_eager(size, stride, offset):
    run_and_compare(Fn(lambda x: torch.as_strided(x * 2, size, stride, offset) + 1), (torch.randn(4, 5),))


def test_index_put_with_a_boolean_mask_is_a_clear_error():
    import tilecc

    mask = torch.tensor([True, False, True, False, True, False, True, False])
    with pytest.raises(UnsupportedOpError, match="boolean mask"):
        tilecc.compile(Fn(lambda x: torch.ops.aten.index_put(x, [mask], torch.tensor(0.0))), (torch.randn(8, 3),))


def _index_scatter(x):
    dt = g.element_dtype(x.type)
    index = g.ConstantOp.make(np.array([3, 1], np.float32), DType.I32)
    src = g.ConstantOp.make(np.ones((2, 6), np.float32), dt)
    return [index, src, gs.IndexScatterOp.make(x, index, src, 0, loc="s.py:1"),
            gs.IndexScatterOp.make(x, index, src, 0, "sum")]


def _as_strided(x):
    return [gs.AsStridedOp.make(x, [3, 2], [6, 1], 1, loc="a.py:2"), gs.AsStridedOp.make(x, [4, 4], [1, 0])]


SCATTER_BUILDERS = {"graph.index_scatter": _index_scatter, "graph.as_strided": _as_strided}
"""One builder per op of the family (also used by test_graph_ir's round-trip test)."""


class CacheUpdate(torch.nn.Module):
    """A prefill's KV-cache update: the heads of a projection's rows ``[B, S, H*D]``
    (a transposed view: each position's heads side by side) written at `pos` of a
    ``[B, H, V, D]`` cache."""

    def __init__(self, heads: int, v: int, d: int, dtype: torch.dtype):
        super().__init__()
        self.heads, self.d = heads, d
        self.register_buffer("cache", torch.zeros(1, heads, v, d, dtype=dtype))

    def forward(self, x, pos):
        rows = (x * 2).view(1, x.shape[1], self.heads, self.d).transpose(1, 2)
        self.cache.index_copy_(2, pos, rows)
        return self.cache.clone()


@pytest.mark.parametrize("heads,n,v,dtype", [(4, 40, 45, torch.float32), (3, 20, 20, torch.bfloat16),
                                             (8, 16, 19, torch.bfloat16)])
def test_cache_update_of_side_by_side_heads_matches_eager(heads, n, v, dtype):
    """One DMA loads a tile's rows of every head (`scatter._scatter_row_blocks`), each
    head's scatter writes a column window of it, the heads on different DMA queues."""
    g = torch.Generator().manual_seed(heads + n)
    x = torch.randn(1, n, heads * 8, generator=g).to(dtype)
    pos = torch.randperm(v, generator=g)[:n]
    cm = run_and_compare(CacheUpdate(heads, v, 8, dtype), (x, pos), target="cloud" if heads == 8 else "tiny")
    scatter = [name for name, _, _ in cm.program.kernels if "scatter" in name]
    assert len(scatter) == 1
    _, first, count = next(k for k in cm.program.kernels if k[0] == scatter[0])
    ops = cm.program.stream["opcode"][first:first + count]
    tiles = -(-n // min(n, 16 if heads != 8 else 128))
    # the indices and the rows once per tile; the rows' load goes where the kernel that
    # computes x * 2 holds the whole tile in one buffer (read in place:
    # passes/tile/forward_activations.py), never one load per head
    forwarded = sum(1 for op in cm.program.meta["remarks"] if "activation tiles kept" in op["message"])
    assert int((ops == Opcode.DMA_LOAD).sum()) == (tiles if forwarded else 2 * tiles)
    assert int((ops == Opcode.DMA_SCATTER).sum()) == heads * tiles


class ConstantCacheUpdate(torch.nn.Module):
    """A prefill's KV-cache update at constant positions (`tilecc/llm/programs.py`):
    rows ``start..start+n-1`` (or `order`, a constant permutation of them) of a
    ``[1, H, V, D]`` cache, from a projection's rows; `wide` takes the heads from a
    column window of wider rows (a merged q/k/v projection's v)."""

    def __init__(self, heads: int, v: int, d: int, start: int, wide: bool, order: list[int] | None = None):
        super().__init__()
        self.heads, self.d, self.start, self.wide, self.order = heads, d, start, wide, order
        self.register_buffer("cache", torch.zeros(1, heads, v, d))

    def forward(self, x):
        y = x * 2
        if self.wide:
            y = y[..., self.d:self.d + self.heads * self.d]
        rows = y.unflatten(-1, (self.heads, self.d)).transpose(1, 2)
        n = x.shape[1]
        pos = torch.tensor(self.order) if self.order else torch.arange(self.start, self.start + n)
        self.cache.index_copy_(2, pos, rows)
        return self.cache.clone()


@pytest.mark.parametrize("heads,n,v,start,wide,target", [
    (4, 40, 45, 0, False, "tiny"), (3, 24, 30, 5, True, "tiny"), (8, 256, 258, 0, False, "cloud"),
    (8, 256, 260, 2, True, "cloud"), (2, 7, 9, 1, False, "tiny"),
])
def test_cache_update_at_constant_positions_is_block_copies(heads, n, v, start, wide, target):
    """Constant contiguous positions (folded by passes/graph/scatter_index.py): k rows per
    partition, one store per head of runs of k*D elements, no indirect stores, no index
    kernel; the cache equals eager's."""
    x = torch.randn(1, n, heads * 8 + (16 if wide else 0), generator=torch.Generator().manual_seed(n))
    cm = run_and_compare(ConstantCacheUpdate(heads, v, 8, start, wide), (x,), target=target)
    names = [name for name, _, _ in cm.program.kernels]
    assert sum("scatter_rows" in name for name in names) == 1 and not any("_lt" in name for name in names), names
    assert int((cm.program.stream["opcode"] == Opcode.DMA_SCATTER).sum()) == 0


def test_cache_update_at_constant_scattered_positions_keeps_the_indirect_store():
    """A constant index that is not a contiguous range scatters row by row, as before."""
    order = [5, 1, 4, 0, 2, 7]
    x = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(3))
    cm = run_and_compare(ConstantCacheUpdate(3, 8, 8, 0, False, order), (x,))
    assert not any("scatter_rows" in name for name, _, _ in cm.program.kernels)
    assert int((cm.program.stream["opcode"] == Opcode.DMA_SCATTER).sum()) > 0
