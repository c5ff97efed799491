"""Collectives in the instruction streams: LINK_SEND / LINK_RECV, the ring all-reduce lowering
(passes/npu/collectives.py), the multi-chip co-simulation (simulator/multichip.py) and
tensor parallelism with parallel={"collectives": "stream"} (runtime/system_stream.py)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

from helpers import LastHidden  # noqa: E402

import tilecc  # noqa: E402
from tilecc.codegen.binary import decode_stream, encode_stream  # noqa: E402
from tilecc.errors import ProgramFormatError, SimulatorError  # noqa: E402
from tilecc.frontend.tensor_parallel import ShardingError  # noqa: E402
from tilecc.passes.npu.collectives import ring_all_gather, ring_all_reduce, ring_reduce_scatter  # noqa: E402
from tilecc.simulator.config import load_config  # noqa: E402
from tilecc.simulator.decode import DecodedProgram  # noqa: E402
from tilecc.simulator.interconnect.system import load_system  # noqa: E402
from tilecc.simulator.isa import DType, Engine, Mem, Opcode, stream_of  # noqa: E402
from tilecc.simulator.machine import simulate  # noqa: E402
from tilecc.simulator.multichip import cosimulate  # noqa: E402
from tilecc.simulator.scheduler import schedule  # noqa: E402

CFG = load_config("tiny")


def _all_reduce(n: int, elements: int, chunks: int, topology: str, dtype=DType.F32, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(elements).astype(np.float32) for _ in range(n)]
    x_addr, y_addr = 0, -(-elements * 4 // 64) * 64
    hbms = []
    for r in range(n):
        h = np.zeros(2 * y_addr + 64, np.uint8)
        h[: elements * 4] = xs[r].view(np.uint8)
        hbms.append(h)
    system = load_system(topology)
    streams = [ring_all_reduce(r, n, x_addr, y_addr, elements, dtype, chunks) for r in range(n)]
    res = cosimulate(streams, CFG, system.topology, system.link, hbms)
    ys = [h[y_addr: y_addr + elements * 4].view(np.float32) for h in hbms]
    return xs, ys, res, hbms


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 8), elements=st.integers(1, 300), chunks=st.integers(1, 5),
       kind=st.sampled_from(["ring", "switch"]))
def test_ring_all_reduce_functional_equals_sum(n, elements, chunks, kind):
    xs, ys, _, hbms = _all_reduce(n, elements, chunks, f"{kind}:{n}")
    want = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        np.testing.assert_allclose(ys[r], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(hbms[r][: elements * 4].view(np.float32), xs[r])  # x unchanged


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 8), per=st.integers(1, 40), chunks=st.integers(1, 4))
def test_ring_halves_functional(n, per, chunks):
    """Reduce-scatter: chip r's block r of its buffer is block r of the sum; all-gather: every
    chip ends with every chip's block r."""
    elements = n * per
    rng = np.random.default_rng(n * 1000 + per)
    xs = [rng.standard_normal(elements).astype(np.float32) for _ in range(n)]
    y_addr = -(-elements * 4 // 64) * 64
    system = load_system(f"ring:{n}")
    hbms = [np.zeros(2 * y_addr, np.uint8) for _ in range(n)]
    for r in range(n):
        hbms[r][: elements * 4] = xs[r].view(np.uint8)
    cosimulate([ring_reduce_scatter(r, n, 0, y_addr, elements, DType.F32, chunks) for r in range(n)], CFG,
               system.topology, system.link, hbms)
    total = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        got = hbms[r][y_addr: y_addr + elements * 4].view(np.float32)[r * per: (r + 1) * per]
        np.testing.assert_allclose(got, total[r * per: (r + 1) * per], rtol=1e-5, atol=1e-5)
    hbms = [np.zeros(elements * 4, np.uint8) for _ in range(n)]
    for r in range(n):
        hbms[r].view(np.float32)[r * per: (r + 1) * per] = xs[r][r * per: (r + 1) * per]
    cosimulate([ring_all_gather(r, n, 0, elements, DType.F32, chunks) for r in range(n)], CFG,
               system.topology, system.link, hbms)
    want = np.concatenate([xs[r][r * per: (r + 1) * per] for r in range(n)])
    for r in range(n):
        np.testing.assert_array_equal(hbms[r].view(np.float32), want)


def test_ring_all_reduce_time_matches_alpha_beta_without_chunking():
    """One chunk: each of the 2(n-1) steps is alpha + S/(nB) after the previous one."""
    n, elements = 4, 4096
    _, _, res, _ = _all_reduce(n, elements, 1, f"ring:{n};bandwidth_gbs=100;latency_ns=500")
    alpha_beta = 2 * (n - 1) * (500 + elements * 4 / n / 100)
    assert res.finish_ns == pytest.approx(alpha_beta, rel=1e-9)
    _, _, piped, _ = _all_reduce(n, elements, 4, f"ring:{n};bandwidth_gbs=100;latency_ns=500")
    assert piped.finish_ns < res.finish_ns  # the chunks pipeline over the links


def _one_transfer(nbytes_elems: int, topology: str, extra_send: bool = False):
    """Chip 0 sends `nbytes_elems` f32 to chip 1 (twice over one link with `extra_send`)."""
    send = dict(opcode=Opcode.LINK_SEND, queue=0, a_dtype=DType.F32, o_dtype=DType.F32, a_mem=Mem.HBM, a_addr=0,
                rows=1, cols=nbytes_elems, hbm_rs=nbytes_elems, hbm_cs=1, k=1, signal_sem=0)
    recv = dict(opcode=Opcode.LINK_RECV, queue=0, a_dtype=DType.F32, o_dtype=DType.F32, o_mem=Mem.HBM,
                o_addr=nbytes_elems * 4, rows=1, cols=nbytes_elems, hbm_rs=nbytes_elems, hbm_cs=1, k=0,
                signal_sem=0)
    s0 = [send] + ([dict(send, queue=1, signal_sem=1)] if extra_send else [])
    s1 = [recv] + ([dict(recv, queue=1, o_addr=nbytes_elems * 8, signal_sem=1)] if extra_send else [])
    system = load_system(topology)
    hbms = [np.zeros(nbytes_elems * 12, np.uint8) for _ in range(2)]
    hbms[0][: nbytes_elems * 4] = np.arange(nbytes_elems, dtype=np.float32).view(np.uint8)
    res = cosimulate([stream_of(*s0), stream_of(*s1)], CFG, system.topology, system.link, hbms)
    return res, hbms


def test_one_transfer_hand_computed():
    """2 chips, 1 MiB at 100 GB/s over one link with 500 ns latency: 1,048,576 / 100 ns + 500 ns."""
    elems = 1 << 18  # 1 MiB of f32
    res, hbms = _one_transfer(elems, "ring:2;bandwidth_gbs=100;latency_ns=500")
    assert res.finish_ns == pytest.approx((1 << 20) / 100 + 500, rel=1e-12)
    sent = res.chips[0].end[0] / res.clock_ghz  # the send completes when its last byte has left
    assert sent == pytest.approx((1 << 20) / 100, rel=1e-12)
    assert res.link_bytes.sum() == 1 << 20
    np.testing.assert_array_equal(hbms[1][elems * 4: elems * 8].view(np.float32), np.arange(elems))


def test_two_transfers_share_the_link():
    """Two sends over the same link at once stream at half the bandwidth each."""
    elems = 1 << 16
    res, hbms = _one_transfer(elems, "ring:2;bandwidth_gbs=100;latency_ns=500", extra_send=True)
    assert res.finish_ns == pytest.approx(2 * (elems * 4) / 100 + 500, rel=1e-12)
    np.testing.assert_array_equal(hbms[1][elems * 8: elems * 12].view(np.float32), np.arange(elems))


def test_unpaired_transfers_are_an_error():
    system = load_system("ring:2")
    s = ring_all_reduce(0, 2, 0, 256, 16, DType.F32, 1)
    with pytest.raises(SimulatorError, match="do not pair"):
        cosimulate([s, s[:0]], CFG, system.topology, system.link)


@pytest.mark.parametrize("linked", [True, False], ids=["linked", "barriers"])
def test_single_chip_engines_match_the_scheduler(linked):
    """Without links the co-simulation of a chip is the single-chip general scheduler's timing
    (one linked group, or a barrier after every kernel)."""
    from tilecc.frontend.torch_export import export_model, import_exported_program
    from tilecc.runtime.compiler import compile_graph

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval()
    gp = import_exported_program(export_model(m, (torch.randn(32, 64),)))
    # fuse-mlp off: the two linears stay two kernels, so there is a barrier or a link between them
    off = {"fuse-mlp"} if linked else {"fuse-mlp", "link-kernels"}
    stream = compile_graph(gp, CFG, disabled=frozenset(off)).stream
    assert linked or int((stream["opcode"] == Opcode.BARRIER).sum()) > 1
    ref = schedule(DecodedProgram(stream, CFG), general=True)
    system = load_system("ring:2")
    res = cosimulate([stream, stream], CFG, system.topology, system.link)
    assert res.chips[0].finish == pytest.approx(ref.finish, rel=1e-12)
    assert ref.start is not None and ref.end is not None
    np.testing.assert_allclose(res.chips[1].start, ref.start, rtol=1e-12)
    np.testing.assert_allclose(res.chips[1].end, ref.end, rtol=1e-12)


def test_circular_waits_deadlock():
    """Each chip's send waits for its own receive: nobody sends; the error names the engines."""
    from tilecc.errors import DeadlockError

    system = load_system("ring:2")
    streams = []
    for r in range(2):
        s = ring_all_reduce(r, 2, 0, 256, 16, DType.F32, 1)
        s["wait_sem"][0, 0], s["wait_val"][0, 0] = 1, 1  # the first send waits for the first receive
        streams.append(s)
    with pytest.raises(DeadlockError, match="chip 0 kernel 0: link0 at instruction 0"):
        cosimulate(streams, CFG, system.topology, system.link)


def test_link_opcodes_binary_version_2_and_listing():
    s = ring_all_reduce(1, 4, 0, 1024, 64, DType.BF16, 2)
    data = encode_stream(s)
    assert int.from_bytes(data[8:10], "little") == 2
    np.testing.assert_array_equal(decode_stream(data), s)
    old = bytearray(data)
    old[8:10] = (1).to_bytes(2, "little")
    with pytest.raises(ProgramFormatError, match="format version 1 does not have"):
        decode_stream(bytes(old))
    prog = DecodedProgram(s, CFG)
    assert prog.engine_names[-2:] == ["link0", "link1"] and set(prog.eng[prog.is_link]) == {prog.queues + 2, prog.queues + 3}
    with pytest.raises(SimulatorError, match="multi-chip"):
        simulate(s, CFG, np.zeros(4096, np.uint8))


def test_engine_field_of_link_ops():
    s = ring_all_reduce(0, 2, 0, 64, 8, DType.F32, 1)
    assert set(s["engine"].tolist()) == {int(Engine.LINK)}


# ------------------------------------------------------------------ tensor parallelism


def _llama(heads=8, kv_heads=4, hidden=64, layers=1):
    from transformers import LlamaConfig, LlamaModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=100,
                      max_position_embeddings=64, use_cache=False, attn_implementation="eager")
    return LastHidden(LlamaModel(cfg)).eval()


IDS = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tp,topology,layers", [(2, "ring:2", 1), (4, "ring:4", 2)])
def test_tp_in_stream_matches_eager(tp, topology, layers):
    """Two layers: the masks and rotary tables the compiler folds to constants cross segments."""
    model = _llama(layers=layers)
    sm = tilecc.compile(model, (IDS,), target="tiny", system=topology,
                        parallel={"tp": tp, "collectives": "stream", "chunks": 2}, cache=False)
    out = sm(IDS)
    with torch.no_grad():
        ref = model(IDS)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    rep = sm.report
    assert rep is not None and [c["op"] for c in rep.collectives] == ["all_reduce"] * 2 * layers
    assert rep.comm_us > 0 and rep.link_bytes > 0 and len(rep.chips) == tp
    assert rep.energy_j > rep.link_energy_j > 0 and all(c.energy_j > 0 for c in rep.chips)
    # every link byte is the ring's: 2 all-reduces a layer x 2(n-1)/n x S per chip, over n chips
    s_bytes = 16 * 64 * 4
    assert rep.link_bytes == pytest.approx(2 * layers * 2 * (tp - 1) * s_bytes)


@pytest.mark.parametrize("tp,topology", [(2, "ring:2"), (4, "switch:4")])
def test_sequence_parallel_in_stream_matches_eager(tp, topology):
    """sp: shard (in place), reduce-scatter and all-gather halves of the ring in the streams."""
    model = _llama(layers=2)
    sm = tilecc.compile(model, (IDS,), target="tiny", system=topology,
                        parallel={"tp": tp, "sp": True, "collectives": "stream", "chunks": 2}, cache=False)
    out = sm(IDS)
    with torch.no_grad():
        ref = model(IDS)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    rep = sm.report
    assert rep is not None
    ops = [c["op"] for c in rep.collectives]
    assert ops == ["shard"] + ["all_gather", "reduce_scatter"] * 4 + ["all_gather"]
    # every all-gather / reduce-scatter moves (n-1)/n of the whole tensor out of each chip,
    # over 1 link on a ring, 2 through a switch
    s_bytes, hops = 16 * 64 * 4, 2 if topology.startswith("switch") else 1
    assert rep.link_bytes == pytest.approx(9 * (tp - 1) * s_bytes * hops)


def test_sanitizers_check_the_chip_streams():
    """The linked chip streams are race-free; dropping a ring send's wait on the receive that
    wrote its chunk is a race the detector names."""
    from tilecc.errors import RaceError
    from tilecc.runtime.system_stream import run_streams

    sm = tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2",
                        parallel={"tp": 2, "collectives": "stream", "chunks": 2}, cache=False)
    ssp = sm.program
    _, run = run_streams(ssp, (IDS,), sanitize=True)
    _, timing = run_streams(ssp, (IDS,), functional=False)  # timing never depends on the data
    assert timing.result.finish_ns == run.result.finish_ns and timing.exposed_ns == run.exposed_ns
    s = ssp.streams[0]
    sends = np.flatnonzero((s["opcode"] == Opcode.LINK_SEND) & (s["wait_sem"][:, 0] >= 0))
    s["wait_sem"][sends[0]] = -1
    s["wait_val"][sends[0]] = 0
    with pytest.raises(RaceError):
        run_streams(ssp, (IDS,), sanitize=True)


@pytest.mark.slow
def test_cli_stream_collectives_and_trace(tmp_path):
    """`tilecc run ... --tp 2 --collectives stream --trace`: matches eager, a track per chip
    engine (the link queues included) and per link in the trace."""
    import json
    import subprocess

    trace = tmp_path / "tp2.json"
    p = subprocess.run([sys.executable, "-m", "tilecc.cli", "run", "examples/llama_tp.py:llama", "--system",
                        "ring:2", "--tp", "2", "--collectives", "stream", "--chunks", "2", "--trace", str(trace),
                        "--json"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads(p.stdout.strip().splitlines()[-1])
    assert d["allclose"] and d["extra"]["collectives"] == "stream"
    names = {(e["pid"], e["args"]["name"]) for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("name") == "thread_name"}
    assert {(1, "link0"), (1, "link1"), (2, "matrix")} <= names
    assert {(3, "link 0->1"), (3, "link 1->0")} <= names


def test_stream_mode_rejects_bad_options():
    with pytest.raises(ShardingError, match="collectives='stream' runs tp alone or pp alone"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:4",
                       parallel={"tp": 2, "pp": 2, "collectives": "stream"}, cache=False)
    with pytest.raises(ShardingError, match="'collectives'"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2",
                       parallel={"tp": 2, "collectives": "later"}, cache=False)


class _Branches(torch.nn.Module):
    """A Megatron MLP (column- then row-parallel: one all-reduce) and an independent
    replicated branch that the compiler places after the row-parallel linear."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256, bias=False)
        self.down = torch.nn.Linear(256, 128, bias=False)
        self.side = torch.nn.Linear(128, 128, bias=False)
        self.side2 = torch.nn.Linear(128, 128, bias=False)

    def forward(self, x):
        h = self.down(torch.relu(self.up(x)))
        z = self.side2(torch.relu(self.side(x)))
        return h + z


def test_independent_compute_overlaps_the_all_reduce():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    torch.manual_seed(0)
    model = _Branches().eval()
    x = torch.randn(64, 128)
    sm = tilecc.compile(model, (x,), target="tiny", system="ring:2;latency_ns=2000",
                        parallel={"tp": 2, "collectives": "stream"}, cache=False,
                        tp_plan={"up": ColwiseParallel(), "down": RowwiseParallel()})
    out = sm(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    rep, res = sm.report, sm.stream_run.result
    assert rep.extra["hidden_share"] > 0
    # checked against the schedule: chip 0's matrix engine works between its first send's
    # start and its last receive's end, and the run is shorter than compute + communication
    prog = DecodedProgram(sm.program.streams[0], load_config("tiny"))
    start, end = res.chips[0].start, res.chips[0].end
    lo, hi = start[prog.is_send].min(), end[prog.is_recv].max()
    mms = np.flatnonzero(prog.is_mm)
    busy = np.minimum(end[mms], hi) - np.maximum(start[mms], lo)
    assert busy[busy > 0].sum() > 0.5 * (hi - lo)
    assert rep.comm_exposed_share < 1e-9 < rep.comm_us  # exposed: time less time with free links
    between = tilecc.compile(model, (x,), target="tiny", system="ring:2;latency_ns=2000", parallel={"tp": 2},
                             cache=False, tp_plan={"up": ColwiseParallel(), "down": RowwiseParallel()})
    between(x)
    assert between.report is not None and rep.time_us < between.report.time_us
