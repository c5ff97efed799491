"""In-place buffer mutation: a module whose forward() updates a registered buffer (a
static KV cache) compiles; each call returns eager's outputs and leaves the buffer's new
value in `CompiledModel.state`, so the next call sees it. The update writes the
buffer's HBM in place (no copy kernel; the state output aliases the state input)."""

from __future__ import annotations

import copy

import pytest
import torch

import tilecc
from tilecc.errors import InputMismatchError
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import graph_scatter as gs
from tilecc.ir.graph_work import graph_work
from tilecc.simulator.config import load_config


class StaticKV(torch.nn.Module):
    """Decode-style attention over a static cache updated at `pos` (two update forms)."""

    def __init__(self, heads=2, length=8, dim=4):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, heads, length, dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, length, dim))

    def forward(self, q, k, v, pos):
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache[:, :, pos] = v
        scores = q @ self.k_cache.transpose(-1, -2)
        return torch.softmax(scores, -1) @ self.v_cache


def _step(n=1):
    return tuple(torch.randn(1, 2, n, 4) for _ in range(3))


def test_static_kv_cache_two_calls_match_eager():
    model = StaticKV().eval()
    eager = copy.deepcopy(model)
    cm = tilecc.compile(model, (*_step(), torch.tensor([0])))
    for pos in ([2], [5], [2]):
        q, k, v = _step(len(pos))
        p = torch.tensor(pos)
        want = eager(q, k, v, p)
        got = cm(q, k, v, p)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(cm.state.buffers["k_cache"], eager.k_cache)
        torch.testing.assert_close(cm.state.buffers["v_cache"], eager.v_cache)
    # the buffers compiled with are untouched: the state lives in the compiled model
    assert not model.k_cache.any()


def test_cache_update_writes_the_buffer_in_place():
    cm = tilecc.compile(StaticKV().eval(), (*_step(), torch.tensor([0])))
    prog = cm.program
    names = [k[0] for k in prog.kernels]
    assert sum("scatter" in n for n in names) == 2 and not any("scatter_copy" in n for n in names)
    ins = {s.name: s.offset for s in prog.inputs}
    outs = {s.name: s.offset for s in prog.outputs}
    assert outs["buffer:k_cache"] == ins["buffer:k_cache"]
    assert outs["buffer:v_cache"] == ins["buffer:v_cache"]


def test_intrinsic_bytes_count_the_rows_written_not_the_cache():
    ep = export_model(StaticKV(length=64).eval(), (*_step(), torch.tensor([0])))
    gp = import_exported_program(ep)
    assert sum(isinstance(op, gs.IndexScatterOp) for op in gp.func.body.block.ops) == 2
    work = graph_work(gp, load_config("tiny"))
    cache = 1 * 2 * 64 * 4 * 4
    # q, k, v (read), pos, the output, and the two rows written: far below one cache
    assert work.compulsory_hbm_bytes < cache


class Accumulate(torch.nn.Module):
    """A running histogram buffer (index_put_ with accumulate and duplicates)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("counts", torch.zeros(6))

    def forward(self, idx, w):
        self.counts.index_put_((idx,), w, accumulate=True)
        return self.counts * 1.0


def test_accumulating_buffer_over_calls():
    model = Accumulate().eval()
    eager = copy.deepcopy(model)
    cm = tilecc.compile(model, (torch.tensor([0, 1, 2]), torch.ones(3)))
    for idx in ([1, 1, 5], [0, 5, 5]):
        i, w = torch.tensor(idx), torch.randn(3)
        torch.testing.assert_close(cm(i, w), eager(i, w))
    torch.testing.assert_close(cm.state.buffers["counts"], eager.counts)


class MutateInput(torch.nn.Module):
    def forward(self, x, idx):
        x.index_copy_(0, idx, torch.ones(2, 3))
        return x.sum(0)


def test_mutated_user_input_is_updated_in_place():
    x = torch.randn(5, 3)
    idx = torch.tensor([4, 1])
    cm = tilecc.compile(MutateInput(), (x.clone(), idx))
    mine, theirs = x.clone(), x.clone()
    want = MutateInput()(theirs, idx)
    torch.testing.assert_close(cm(mine, idx), want)
    torch.testing.assert_close(mine, theirs)


def test_loaded_program_without_its_buffers_is_a_clear_error(tmp_path):
    cm = tilecc.compile(StaticKV().eval(), (*_step(), torch.tensor([0])))
    cm.save(tmp_path / "kv.tilecc")
    loaded = tilecc.load(tmp_path / "kv.tilecc")
    with pytest.raises(InputMismatchError, match="updates buffer 'k_cache'"):
        loaded(*_step(), torch.tensor([1]))
    loaded.state.buffers.update(k_cache=torch.zeros(1, 2, 8, 4), v_cache=torch.zeros(1, 2, 8, 4))
    q, k, v = _step()
    eager = StaticKV()
    torch.testing.assert_close(loaded(q, k, v, torch.tensor([1])), eager(q, k, v, torch.tensor([1])),
                               rtol=1e-4, atol=1e-4)
