"""Cross-kernel overlap (`codegen/link.py`): kernels order through semaphores on the
memory they share instead of a barrier; the sanitisers check the linked stream."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from tests.helpers import gpt2_block, run_and_compare
from tilecc.codegen.expand import expand_module
from tilecc.codegen.link import link_kernels
from tilecc.errors import RaceError
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.runtime.compiler import compile_graph
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import DType, Engine, Mem, Opcode, empty_stream, stream_of
from tilecc.simulator.machine import simulate
from tilecc.simulator.sanitizers import check_races

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

NO_LINK = frozenset({"link-kernels"})
NO_FORWARD = frozenset({"forward-activations"})  # every activation through HBM: the link's HBM ordering is tested


def _mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128),
    ).eval()
    return m, (torch.randn(64, 256),)


@pytest.fixture(scope="module")
def mlp_programs():
    m, x = _mlp()
    cfg = load_config("cloud")
    gp = import_exported_program(export_model(m, x))
    return m, x, cfg, compile_graph(gp, cfg, disabled=NO_FORWARD), compile_graph(gp, cfg, disabled=NO_LINK)


def _kernel_dmas(prog, k: int, op: Opcode) -> np.ndarray:
    _, start, count = prog.kernels[k]
    idx = np.arange(start, start + count)
    return idx[prog.stream["opcode"][idx] == op]


def test_weight_load_of_kernel_2_starts_before_kernel_1_ends(mlp_programs):
    m, x, cfg, linked, barriers = mlp_programs
    assert int((linked.stream["opcode"] == Opcode.BARRIER).sum()) == 1  # one group
    assert int((barriers.stream["opcode"] == Opcode.BARRIER).sum()) == len(barriers.kernels)
    out, rep = run_program(linked, x, sanitize=True)
    torch.testing.assert_close(out[0], m(*x).detach(), rtol=1e-4, atol=1e-4)
    _, b_rep = run_program(barriers, x)
    assert rep.cycles < b_rep.cycles
    res = simulate(linked.stream, cfg, linked.hbm_image())
    _, s1, c1 = linked.kernels[0]
    end_k1 = res.end[s1 : s1 + c1].max()
    first_load_k2 = res.start[_kernel_dmas(linked, 1, Opcode.DMA_LOAD)].min()
    assert first_load_k2 < end_k1


def test_raw_dependency_is_respected(mlp_programs):
    """Kernel 2 loads the hidden activation kernel 1 stores: each such load starts
    after every store of kernel 1 that writes bytes it reads."""
    _, _, cfg, linked, _ = mlp_programs
    res = simulate(linked.stream, cfg, linked.hbm_image())
    s = linked.stream
    stores = _kernel_dmas(linked, 0, Opcode.DMA_STORE)
    loads = _kernel_dmas(linked, 1, Opcode.DMA_LOAD)
    checked = 0
    for ld in loads:
        lo, hi = _hbm_range(s[ld], "a")
        for st in stores:
            slo, shi = _hbm_range(s[st], "o")
            if slo < hi and lo < shi:
                assert res.start[ld] >= res.end[st]
                checked += 1
    assert checked > 0


def _hbm_range(rec, slot: str) -> tuple[int, int]:
    isz = 2 if rec[f"{slot}_dtype"] in (DType.BF16, DType.F16) else 4
    lo = int(rec[f"{slot}_addr"])
    span = (int(rec["rows"]) - 1) * int(rec["hbm_rs"]) + (int(rec["cols"]) - 1) * int(rec["hbm_cs"])
    return lo, lo + span * isz + isz


def _dma(op, q, hbm, part=0, addr=0, rows=4, cols=8, **kw):
    f = {"opcode": op, "queue": q, "rows": rows, "cols": cols, "hbm_rs": cols, "hbm_cs": 1,
         "a_dtype": DType.F32, "o_dtype": DType.F32}
    if op == Opcode.DMA_LOAD:
        f |= {"a_mem": Mem.HBM, "a_addr": hbm, "o_mem": Mem.SRAM, "o_part": part, "o_addr": addr}
    else:
        f |= {"a_mem": Mem.SRAM, "a_part": part, "a_addr": addr, "o_mem": Mem.HBM, "o_addr": hbm}
    return f | kw


def _two_kernels(k1: list[dict], k2: list[dict]):
    bar = empty_stream(1)
    bar["opcode"], bar["engine"] = Opcode.BARRIER, Engine.ALL
    a, b = stream_of(*k1), stream_of(*k2)
    stream = np.concatenate([a, bar, b, bar])
    return stream, [("k1", 0, len(a)), ("k2", len(a) + 1, len(b))]


@pytest.mark.parametrize("case", ["raw", "war", "waw", "independent"])
def test_hazards_between_hand_written_kernels(case):
    """Kernel 1 on queue 0: load H0 -> SRAM, store SRAM -> H1 (signals sem 0 in between).
    Kernel 2 on queue 1 touches H1 (RAW: load; WAW: store), H0 (WAR: store), or an
    unrelated H2 (independent: no wait, starts at once)."""
    cfg = load_config("tiny")
    H0, H1, H2 = 0, 4096, 8192
    k1 = [_dma(Opcode.DMA_LOAD, 0, H0, signal_sem=0),
          _dma(Opcode.DMA_STORE, 0, H1, wait_sem=[0, -1, -1, -1], wait_val=[1, 0, 0, 0])]
    second = {
        "raw": _dma(Opcode.DMA_LOAD, 1, H1, part=8, addr=1024),
        "war": _dma(Opcode.DMA_STORE, 1, H0, part=8, addr=1024),
        "waw": _dma(Opcode.DMA_STORE, 1, H1, part=8, addr=1024),
        "independent": _dma(Opcode.DMA_LOAD, 1, H2, part=8, addr=1024),
    }[case]
    if second["opcode"] == Opcode.DMA_STORE:  # its SRAM source must have been written
        k2 = [_dma(Opcode.DMA_LOAD, 1, H2, part=8, addr=1024), second]
    else:
        k2 = [second]
    stream, spans = _two_kernels(k1, k2)
    linked, new_spans, notes = link_kernels(stream, spans, cfg)
    assert notes == [] and int((linked["opcode"] == Opcode.BARRIER).sum()) == 1
    hbm = np.zeros(cfg.hbm.capacity_bytes if cfg.hbm.capacity_bytes < 1 << 24 else 1 << 16, np.uint8)
    res = simulate(linked, cfg, hbm, sanitize=True)
    j = new_spans[1][1] + len(k2) - 1  # the hazardous instruction of kernel 2
    waits = linked["wait_sem"][new_spans[1][1] : j + 1]
    if case == "independent":
        assert (waits < 0).all()
        assert res.start[j] == 0.0
    else:
        # kernel 1's load (WAR) or store (RAW, WAW) ends before it starts
        dep = 0 if case == "war" else 1
        assert res.start[j] >= res.end[dep]
        assert (waits >= 0).any()


def test_missing_cross_kernel_wait_is_a_race(mlp_programs):
    """Drop the cross-kernel waits (on a semaphore value the earlier kernels' signals
    alone reach) of one instruction at a time: some drop leaves a race the sanitiser
    finds, and the linked stream itself is race-free."""
    _, _, cfg, linked, _ = mlp_programs
    s0 = linked.stream
    check_races(s0, cfg)
    tried = caught = 0
    for _, start, count in linked.kernels[1:]:
        sig = s0["signal_sem"][:start]
        earlier = np.bincount(sig[sig >= 0], minlength=cfg.semaphores)
        for i in range(start, start + count):
            ws, wv = s0["wait_sem"][i], s0["wait_val"][i]
            cross = (ws >= 0) & (wv <= earlier[np.maximum(ws, 0)])
            if not cross.any():
                continue
            s = s0.copy()
            s["wait_sem"][i][cross] = -1
            s["wait_val"][i][cross] = 0
            tried += 1
            try:
                check_races(s, cfg)
            except RaceError as e:
                assert "race" in str(e)
                caught += 1
    assert tried and caught


def test_no_link_gives_the_barrier_stream():
    """With link-kernels disabled the stream is `expand_module` of the synchronised
    module: a barrier after every kernel, unmirrored SRAM."""
    m, x = _mlp()
    cfg = load_config("cloud")
    gp = import_exported_program(export_model(m, x))
    seen = {}

    def grab(name, module):
        if name == "npu-insert-sync":
            seen["stream"] = expand_module(module.clone())[0]

    prog = compile_graph(gp, cfg, disabled=NO_LINK, after_pass=grab)
    assert np.array_equal(prog.stream, seen["stream"])
    assert int((prog.stream["opcode"] == Opcode.BARRIER).sum()) == len(prog.kernels)
    out, _ = run_program(prog, x, sanitize=True)
    torch.testing.assert_close(out[0], m(*x).detach(), rtol=1e-4, atol=1e-4)


def test_mlp_matches_eager_tiny():
    m, x = _mlp()
    cm = run_and_compare(m, x, target="tiny")
    # the report counts the program's kernel launches and the groups linking left
    r = cm.report
    assert r.launches == len(cm.program.kernels) > r.kernels >= 1
    assert f"in {r.launches} kernel launches, {r.kernels} barrier-separated group" in str(r)


def _gpt2(n_layer: int):
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_embd=64, n_head=4, n_layer=n_layer, n_positions=64, vocab_size=128,
                     use_cache=False)
    cfg._attn_implementation = "sdpa"

    class G(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = GPT2Model(cfg)

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    torch.manual_seed(0)
    return G().eval(), (torch.randint(0, 128, (1, 32)),)


def test_transformer_block_matches_eager():
    torch.manual_seed(0)
    cm = run_and_compare(gpt2_block(64, 4, n_positions=64), (torch.randn(1, 32, 64),))
    assert len(cm.program.kernels) > 1


def test_gpt2_two_layers_matches_eager():
    m, x = _gpt2(2)
    cm = run_and_compare(m, x)
    s = cm.program.stream
    notes = [r["message"] for r in cm.program.meta["remarks"] if r["pass_name"] == "link-kernels"]
    assert int((s["opcode"] == Opcode.BARRIER).sum()) == 1, notes


def test_a_kernel_that_cannot_link_keeps_one_barrier(monkeypatch):
    """Six independent kernels; linking any run that puts kernel 3 after an earlier one
    fails (as a kernel with no free wait slot does): one barrier stays, before kernel 3,
    and the runs on either side link (were all six kept apart before)."""
    import tilecc.codegen.link as link

    cfg = load_config("tiny")
    bar = empty_stream(1)
    bar["opcode"], bar["engine"] = Opcode.BARRIER, Engine.ALL
    parts, spans, at = [], [], 0
    for k in range(6):
        a = stream_of(_dma(Opcode.DMA_LOAD, k % 2, 4096 * k, part=0, addr=256 * k))
        parts += [a, bar]
        spans.append((f"k{k}", at, len(a)))
        at += len(a) + 1
    stream = np.concatenate(parts)
    real = link._link_group

    def fussy(s, local, config):
        names = [n for n, _, _ in local]
        if "k3" in names and names[0] != "k3":
            raise link._NoLink("no free wait slot for a cross-kernel wait")
        return real(s, local, config)

    monkeypatch.setattr(link, "_link_group", fussy)
    linked, new_spans, notes = link_kernels(stream, spans, cfg)
    assert notes == ["link: barrier kept before kernel 'k3': no free wait slot for a cross-kernel wait"]
    bars = np.flatnonzero(linked["opcode"] == Opcode.BARRIER)
    assert len(bars) == 2 and bars[0] == new_spans[3][1] - 1  # before k3, and the final one
    assert [n for n, _, _ in new_spans] == [f"k{k}" for k in range(6)]
    simulate(linked, cfg, np.zeros(1 << 16, np.uint8), sanitize=True)


def test_a_wait_with_no_room_moves_to_an_earlier_kernels_instruction_of_its_queue():
    """Kernel 2's first instruction (a load on queue 3) overwrites SRAM that kernel 1
    wrote on queues 0, 1, 2 and read on the matrix and vector engines: five engines to
    wait for, four wait slots, and no earlier instruction of queue 3 in kernel 2. The
    fifth wait goes to kernel 1's last instruction of queue 3, which comes after every
    producer in program order (so no cycle can close): the kernels link, race-free,
    instead of keeping a barrier."""
    from tilecc.simulator.isa import MAX_WAITS

    cfg = load_config("cloud")
    assert cfg.dma.queues == 4 and MAX_WAITS == 4
    copy = {"opcode": Opcode.VEC_UNARY, "func": 0, "rows": 4, "cols": 8, "a_mem": Mem.SRAM, "a_addr": 0,
            "a_dtype": DType.F32, "o_mem": Mem.SRAM, "o_addr": 3072, "o_dtype": DType.F32,
            "wait_sem": [0, -1, -1, -1], "wait_val": [1, 0, 0, 0], "signal_sem": 3}
    mm = {"opcode": Opcode.MATMUL, "rows": 4, "cols": 8, "k": 4, "a_mem": Mem.SRAM, "a_addr": 1024,
          "a_dtype": DType.F32, "b_mem": Mem.SRAM, "b_addr": 2048, "b_dtype": DType.F32, "o_mem": Mem.ACC,
          "o_addr": 0, "o_dtype": DType.F32, "wait_sem": [1, 2, -1, -1], "wait_val": [1, 1, 0, 0], "signal_sem": 4}
    k1 = [_dma(Opcode.DMA_LOAD, 0, 0, addr=0, signal_sem=0), _dma(Opcode.DMA_LOAD, 1, 4096, addr=1024, signal_sem=1),
          _dma(Opcode.DMA_LOAD, 2, 8192, addr=2048, signal_sem=2), copy, mm,
          _dma(Opcode.DMA_LOAD, 3, 12288, addr=8192)]
    k2 = [_dma(Opcode.DMA_LOAD, 3, 16384, addr=0, rows=4, cols=1024, hbm_rs=1024)]
    stream, spans = _two_kernels(k1, k2)
    linked, new_spans, notes = link_kernels(stream, spans, cfg)
    assert notes == [] and int((linked["opcode"] == Opcode.BARRIER).sum()) == 1
    first = new_spans[1][1]
    assert int((linked["wait_sem"][first] >= 0).sum()) == MAX_WAITS
    assert (linked["wait_sem"][len(k1) - 1] >= 0).any()  # kernel 1's queue-3 load carries the fifth
    res = simulate(linked, cfg, np.zeros(1 << 16, np.uint8), sanitize=True)
    assert res.start[first] >= res.end[: len(k1) - 1].max()


@pytest.mark.parametrize("cuts,limit", [((), 99), ((5, 10, 15, 20, 25), 99), ((3, 4, 11, 30), 7), ((), 4),
                                        ((1, 2, 3), 99), ((29,), 6)])
def test_link_runs_are_the_longest_linkable(monkeypatch, cuts, limit):
    """`_link_prefixes` cuts a group into the longest linkable runs, whatever order it
    tries runs in: with a monotone stand-in for `_link_group` (a run fails when it
    spans a cut, i.e. holds kernels c-1 and c, or has more than `limit` kernels) its
    runs equal the greedy longest runs, and each run's reason is that of the run one
    kernel longer."""
    from tilecc.codegen import link

    n = 31
    local = [(f"k{k}", 10 * k, 10) for k in range(n)]
    part = np.arange(10 * n)
    calls = []

    def fails(a: int, b: int) -> str | None:  # kernels [a, b)
        if b - a > limit:
            return f"longer than {limit}"
        return next((f"cut {c}" for c in cuts if a < c < b), None)

    def fake_link(s, spans, config):
        a = int(s[0]) // 10
        b = a + len(spans)
        calls.append((a, b))
        why = fails(a, b)
        if why is not None:
            raise link._NoLink(why)
        return s

    monkeypatch.setattr(link, "_link_group", fake_link)
    remarks: list[str] = []
    segments = link._link_prefixes(part, local, load_config("cloud"), remarks)
    want, i = [], 0
    while i < n:
        j = i + 1
        while j < n and fails(i, j + 1) is None:
            j += 1
        want.append((i, j))
        i = j
    got = [(int(seg[0]) // 10, int(seg[0]) // 10 + len(spans)) for seg, spans in segments]
    assert got == want
    assert [r.split("': ")[1] for r in remarks] == [fails(a, b + 1) for a, b in want[:-1]]
    assert len(remarks) == len(want) - 1
    if not cuts and limit >= n:
        assert calls == [(0, n)]  # a group that links whole is linked once


# Kernel 1 stores the left column block (columns 0..7) of an 8 x 16 f32 matrix M in HBM;
# kernel 2 touches a strided region of M, then (for a load) stores what it read to OUT.
# (name, kernel 2's access: opcode, element offset in M, rows, cols, row stride, column
# stride; whether it shares a byte with the left block)
_STRIDED = [
    ("store right block", Opcode.DMA_STORE, 8, 8, 8, 16, 1, False),
    ("load right block", Opcode.DMA_LOAD, 8, 8, 8, 16, 1, False),
    ("load right block, every other row", Opcode.DMA_LOAD, 8, 4, 8, 32, 1, False),
    ("load right block transposed", Opcode.DMA_LOAD, 8, 8, 8, 1, 16, False),
    ("store columns 7..14", Opcode.DMA_STORE, 7, 8, 8, 16, 1, True),
    ("load rows of 4, 24 apart", Opcode.DMA_LOAD, 8, 5, 4, 24, 1, True),
    ("load columns 4..11 transposed", Opcode.DMA_LOAD, 4, 8, 8, 1, 16, True),
]


@pytest.mark.parametrize("case", _STRIDED, ids=[c[0] for c in _STRIDED])
def test_strided_hbm_regions_wait_only_when_they_share_bytes(case):
    """Interleaved strided regions of one matrix (bounding ranges that meet): kernel 2's
    access waits for kernel 1's store exactly when they share a byte, so disjoint
    column blocks, row subsets and transposed blocks overlap in time; HBM matches numpy
    with the sanitisers on."""
    _, op, off, rows, cols, rs, cs, shares = case
    cfg = load_config("tiny")
    M, SRC1, SRC2, OUT = 0, 4096, 8192, 12288  # byte addresses
    rng = np.random.default_rng(0)
    m0 = rng.standard_normal((8, 16)).astype(np.float32)
    src1 = rng.standard_normal((8, 8)).astype(np.float32)
    src2 = rng.standard_normal((rows, cols)).astype(np.float32)
    f32 = {"a_dtype": DType.F32, "o_dtype": DType.F32}
    k1 = [_dma(Opcode.DMA_LOAD, 0, SRC1, rows=8, cols=8, signal_sem=0),
          _dma(Opcode.DMA_STORE, 0, M, rows=8, cols=8, hbm_rs=16, wait_sem=[0, -1, -1, -1], wait_val=[1, 0, 0, 0])]
    region = {"rows": rows, "cols": cols, "hbm_rs": rs, "hbm_cs": cs, **f32}
    if op == Opcode.DMA_STORE:
        k2 = [_dma(Opcode.DMA_LOAD, 1, SRC2, part=8, addr=1024, rows=rows, cols=cols, signal_sem=0),
              _dma(Opcode.DMA_STORE, 1, M + 4 * off, part=8, addr=1024, wait_sem=[0, -1, -1, -1],
                   wait_val=[1, 0, 0, 0], **region)]
    else:
        k2 = [_dma(Opcode.DMA_LOAD, 1, M + 4 * off, part=8, addr=1024, signal_sem=0, **region),
              _dma(Opcode.DMA_STORE, 1, OUT, part=8, addr=1024, rows=rows, cols=cols,
                   wait_sem=[0, -1, -1, -1], wait_val=[1, 0, 0, 0])]
    stream, spans = _two_kernels(k1, k2)
    linked, new_spans, notes = link_kernels(stream, spans, cfg)
    assert notes == [] and int((linked["opcode"] == Opcode.BARRIER).sum()) == 1
    hbm = np.zeros(1 << 16, np.uint8)
    for addr, arr in ((M, m0), (SRC1, src1), (SRC2, src2)):
        hbm[addr : addr + arr.nbytes] = arr.view(np.uint8).reshape(-1)
    res = simulate(linked, cfg, hbm, sanitize=True)
    # numpy: kernel 1, then kernel 2, on the flat matrix
    flat = m0.reshape(-1).copy()
    flat.reshape(8, 16)[:, :8] = src1
    idx = off + np.arange(rows)[:, None] * rs + np.arange(cols)[None, :] * cs
    if op == Opcode.DMA_STORE:
        flat[idx] = src2
    else:
        got = hbm[OUT : OUT + rows * cols * 4].view(np.float32).reshape(rows, cols)
        np.testing.assert_array_equal(got, flat[idx])
    np.testing.assert_array_equal(hbm[M : M + 512].view(np.float32), flat)
    k1_store = 1
    j = new_spans[1][1] + (1 if op == Opcode.DMA_STORE else 0)  # kernel 2's access of M
    cross = linked["wait_sem"][new_spans[1][1] : j + 1] >= 0
    if op == Opcode.DMA_STORE:
        cross[1] &= linked["wait_sem"][j] != linked["signal_sem"][new_spans[1][1]]
    if shares:
        assert cross.any()
        assert res.start[j] >= res.end[k1_store]
    else:
        assert not cross.any()
        assert res.start[j] < res.end[k1_store]


def test_a_load_waits_for_the_store_of_its_rows_not_the_queues_last_store():
    """Kernel 1 stores the top, then the bottom half of a matrix (neither signals in its
    kernel); kernel 2 loads the top half: it waits for the first store alone (which
    now signals the link semaphore), and starts before the second one ends."""
    cfg = load_config("tiny")
    M, SRC, OUT = 0, 4096, 8192
    rng = np.random.default_rng(1)
    src = rng.standard_normal((8, 64)).astype(np.float32)
    k1 = [_dma(Opcode.DMA_LOAD, 0, SRC, rows=8, cols=64, signal_sem=0),
          _dma(Opcode.DMA_STORE, 0, M, rows=4, cols=64, wait_sem=[0, -1, -1, -1], wait_val=[1, 0, 0, 0]),
          _dma(Opcode.DMA_STORE, 0, M + 4 * 64 * 4, part=4, rows=4, cols=64)]
    k2 = [_dma(Opcode.DMA_LOAD, 1, M, part=8, addr=1024, rows=4, cols=64, signal_sem=0),
          _dma(Opcode.DMA_STORE, 1, OUT, part=8, addr=1024, rows=4, cols=64,
               wait_sem=[0, -1, -1, -1], wait_val=[1, 0, 0, 0])]
    stream, spans = _two_kernels(k1, k2)
    linked, new_spans, notes = link_kernels(stream, spans, cfg)
    assert notes == []
    hbm = np.zeros(1 << 16, np.uint8)
    hbm[SRC : SRC + src.nbytes] = src.view(np.uint8).reshape(-1)
    res = simulate(linked, cfg, hbm, sanitize=True)
    np.testing.assert_array_equal(hbm[OUT : OUT + 1024].view(np.float32).reshape(4, 64), src[:4])
    load = new_spans[1][1]
    assert linked["signal_sem"][1] >= 0 and linked["signal_sem"][2] < 0
    assert res.end[1] <= res.start[load] < res.end[2]
