"""In-stream collective algorithms beyond the ring: halving-doubling, the double binary tree,
the 2-D torus ring and send/recv (passes/npu/collective_*.py), lowered from the schedule
side's algorithms (collective_lowering.py), co-simulated (simulator/multichip.py), chosen
by `algorithm` (runtime/stream_algorithm.py) for tensor parallelism."""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
import torch

for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

from helpers import LastHidden  # noqa: E402

import tilecc  # noqa: E402
from tilecc.errors import TileccError  # noqa: E402
from tilecc.passes.npu.collective_halving_doubling import (  # noqa: E402
    hd_all_gather,
    hd_all_reduce,
    hd_reduce_scatter,
)
from tilecc.passes.npu.collective_lowering import lower_schedule  # noqa: E402
from tilecc.passes.npu.collective_ring2d import (  # noqa: E402
    ring2d_all_gather,
    ring2d_all_reduce,
    ring2d_reduce_scatter,
)
from tilecc.passes.npu.collective_send_recv import send_recv  # noqa: E402
from tilecc.passes.npu.collective_tree import tree_all_reduce  # noqa: E402
from tilecc.passes.npu.collectives import ring_all_reduce  # noqa: E402
from tilecc.runtime.stream_algorithm import StreamAlgorithmError, choose  # noqa: E402
from tilecc.simulator.config import load_config  # noqa: E402
from tilecc.simulator.interconnect import contention, formulas  # noqa: E402
from tilecc.simulator.interconnect.collective import make_schedule  # noqa: E402
from tilecc.simulator.interconnect.system import load_system  # noqa: E402
from tilecc.simulator.isa import DType, Opcode  # noqa: E402
from tilecc.simulator.multichip import cosimulate  # noqa: E402

CFG = load_config("tiny")
B, L, W = 50.0, 500.0, 300.0  # GB/s, link latency ns, switch latency ns
LINK = f"bandwidth_gbs={B};latency_ns={L};switch_latency_ns={W}"


def _pad(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def _run(topology: str, records, hbms=None):
    system = load_system(topology)
    n = system.topology.n_chips
    return cosimulate([records(r) for r in range(n)], CFG, system.topology, system.link, hbms)


def _contributions(n: int, elements: int, seed: int):
    """n chips' random f32 contributions x (returned), each at HBM 0 of its image, and
    the offset y after them where a result goes."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(elements).astype(np.float32) for _ in range(n)]
    y = _pad(elements * 4)
    hbms = [np.zeros(2 * y, np.uint8) for _ in range(n)]
    for r in range(n):
        hbms[r][: elements * 4] = xs[r].view(np.uint8)
    return xs, y, hbms


def _all_reduce(topology: str, n: int, elements: int, lowering, seed: int = 0):
    """Chip r's x at 0, the result y after it: (inputs, outputs, hbms, result)."""
    xs, y, hbms = _contributions(n, elements, seed)
    res = _run(topology, lambda r: lowering(r, 0, y), hbms)
    return xs, [h[y: y + elements * 4].view(np.float32) for h in hbms], hbms, res


ALL_REDUCES = {
    "halving_doubling": lambda n, e, c: lambda r, x, y: hd_all_reduce(r, n, x, y, e, DType.F32, c),
    "tree": lambda n, e, c: lambda r, x, y: tree_all_reduce(r, n, x, y, e, DType.F32, c),
    "ring": lambda n, e, c: lambda r, x, y: ring_all_reduce(r, n, x, y, e, DType.F32, c),
}


@pytest.mark.parametrize("algorithm", sorted(ALL_REDUCES))
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("elements,chunks", [(1, 1), (37, 3), (1000, 4)])
def test_all_reduce_equals_the_sum(algorithm, n, elements, chunks):
    if algorithm == "tree" and elements < 2:
        with pytest.raises(TileccError, match="two halves"):
            tree_all_reduce(0, n, 0, 64, elements, DType.F32)
        return
    xs, ys, hbms, _ = _all_reduce(f"switch:{n}", n, elements, ALL_REDUCES[algorithm](n, elements, chunks))
    want = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        np.testing.assert_allclose(ys[r], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(hbms[r][: elements * 4].view(np.float32), xs[r])  # x unchanged


@pytest.mark.parametrize("n", [3, 5, 6, 7])
@pytest.mark.parametrize("chunks", [1, 3])
def test_tree_all_reduce_any_chip_count(n, chunks):
    elements = 101
    xs, ys, _, _ = _all_reduce(f"ring:{n}", n, elements, ALL_REDUCES["tree"](n, elements, chunks), seed=n)
    want = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        np.testing.assert_allclose(ys[r], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12])
@pytest.mark.parametrize("elements,chunks", [(1, 1), (37, 3), (1000, 4)])
def test_halving_doubling_all_reduce_any_chip_count(n, elements, chunks):
    """n not a power of 2: the folded chips' whole buffers, the core's halving-doubling and
    the unfold, every chip's link records co-simulated: the sum on every chip."""
    xs, ys, hbms, _ = _all_reduce(f"switch:{n}", n, elements, ALL_REDUCES["halving_doubling"](n, elements, chunks),
                                  seed=n)
    want = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        np.testing.assert_allclose(ys[r], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(hbms[r][: elements * 4].view(np.float32), xs[r])  # x unchanged


@pytest.mark.parametrize("dims", [(2, 2), (2, 4), (4, 2), (3, 3), (2, 2, 2)])
@pytest.mark.parametrize("elements", [5, 144])
def test_ring2d_all_reduce_equals_the_sum(dims, elements):
    n = math.prod(dims)
    topo = "torus:" + "x".join(map(str, dims))
    xs, ys, _, _ = _all_reduce(topo, n, elements,
                               lambda r, x, y: ring2d_all_reduce(r, dims, x, y, elements, DType.F32, 2))
    want = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        np.testing.assert_allclose(ys[r], want, rtol=1e-5, atol=1e-5)


HALVES = {
    "halving_doubling": (lambda n: n, "switch:{n}", hd_reduce_scatter, hd_all_gather),
    "ring2d": (lambda n: (2, n // 2), "torus:2x{h}", ring2d_reduce_scatter, ring2d_all_gather),
}


@pytest.mark.parametrize("algorithm,n", [("halving_doubling", 3), ("halving_doubling", 4), ("halving_doubling", 6),
                                         ("halving_doubling", 7), ("halving_doubling", 8), ("ring2d", 4),
                                         ("ring2d", 8)])
@pytest.mark.parametrize("chunks", [1, 2])
def test_reduce_scatter_and_all_gather_halves(algorithm, n, chunks):
    """Reduce-scatter: chip r's shard r of its buffer is shard r of the sum; all-gather:
    every chip ends with every chip's shard r (the ring halves' conventions)."""
    size, spec, rs, ag = HALVES[algorithm]
    topo = spec.format(n=n, h=n // 2)
    per = 6
    elements = n * per
    xs, y, hbms = _contributions(n, elements, n)
    _run(topo, lambda r: rs(r, size(n), 0, y, elements, DType.F32, chunks), hbms)
    total = np.sum(np.stack(xs), axis=0, dtype=np.float64)
    for r in range(n):
        got = hbms[r][y: y + elements * 4].view(np.float32)[r * per: (r + 1) * per]
        np.testing.assert_allclose(got, total[r * per: (r + 1) * per], rtol=1e-5, atol=1e-5)
    hbms = [np.zeros(elements * 4, np.uint8) for _ in range(n)]
    for r in range(n):
        hbms[r].view(np.float32)[r * per: (r + 1) * per] = xs[r][r * per: (r + 1) * per]
    _run(topo, lambda r: ag(r, size(n), 0, elements, DType.F32, chunks), hbms)
    want = np.concatenate([xs[r][r * per: (r + 1) * per] for r in range(n)])
    for r in range(n):
        np.testing.assert_array_equal(hbms[r].view(np.float32), want)


def test_send_recv_functional_and_cut_through_time():
    """Chip 1 sends 1 MiB to chip 3 of a switch in 4 pieces: the pieces stream back to back,
    the last arrives S/B + alpha after the first leaves (alpha: 2 links + the switch)."""
    elements = 1 << 18
    x = np.arange(elements, dtype=np.float32)
    y = _pad(elements * 4)
    hbms = [np.zeros(2 * y, np.uint8) for _ in range(4)]
    hbms[1][: elements * 4] = x.view(np.uint8)
    res = _run(f"switch:4;{LINK}", lambda r: send_recv(r, 4, 1, 3, 0, y, elements, DType.F32, 4), hbms)
    np.testing.assert_array_equal(hbms[3][y: y + elements * 4].view(np.float32), x)
    assert not hbms[0].any() and not hbms[2].any()
    assert res.finish_ns == pytest.approx(elements * 4 / B + 2 * L + W, rel=1e-9)
    with pytest.raises(TileccError, match="two different chips"):
        send_recv(0, 4, 2, 2, 0, y, elements, DType.F32)


# ------------------------------------------------------------------ timing


def test_halving_doubling_time_equals_its_formula_on_a_switch():
    """switch:8, 1 MiB: one transfer per chip per step, no link shared: each of the 2 log2 n
    steps is alpha + its bytes / B, exactly the alpha-beta formula (one chunk); chunks
    pipeline the steps (faster, never slower)."""
    n, elements = 8, 1 << 18
    form = formulas.halving_doubling("all_reduce", n, elements * 4, 2 * L + W, B)
    one = _run(f"switch:{n};{LINK}", lambda r: hd_all_reduce(r, n, 0, 1 << 22, elements, DType.F32, 1))
    assert one.finish_ns == pytest.approx(form, rel=1e-6)
    four = _run(f"switch:{n};{LINK}", lambda r: hd_all_reduce(r, n, 0, 1 << 22, elements, DType.F32, 4))
    assert 0.8 * form < four.finish_ns < form
    rs = _run(f"switch:{n};{LINK}", lambda r: hd_reduce_scatter(r, n, 0, 1 << 22, elements, DType.F32, 1))
    assert rs.finish_ns == pytest.approx(formulas.halving_doubling("reduce_scatter", n, elements * 4, 2 * L + W, B),
                                         rel=1e-6)


@pytest.mark.parametrize("n", [3, 6])
def test_halving_doubling_time_any_chip_count(n):
    """n not a power of 2, one chunk: the in-stream run takes the schedule side's contention
    time exactly (the fold into a core chip shares its switch port with the core's first
    step, which starts on the chips that did not fold), so at least the ideal closed form
    2 (alpha + S/B) + 2 log2(p') alpha + 2 (p'-1)/p' S/B."""
    elements = 3 * 5 * 7 * 8 * 64
    system = load_system(f"switch:{n};{LINK}")
    got = _run(f"switch:{n};{LINK}", lambda r: hd_all_reduce(r, n, 0, 1 << 22, elements, DType.F32, 1))
    sched = make_schedule("all_reduce", "halving_doubling", system.topology, system.link, elements, 4)
    assert got.finish_ns == pytest.approx(contention.simulate(sched, system.topology, system.link, 4).time_ns,
                                          rel=1e-9)
    form = formulas.halving_doubling("all_reduce", n, elements * 4, 2 * L + W, B)
    assert form == pytest.approx(6 * (2 * L + W) + 3.5 * elements * 4 / B if n == 6 else
                                 4 * (2 * L + W) + 3 * elements * 4 / B, rel=1e-12)
    assert form <= got.finish_ns < 1.2 * form


@pytest.mark.parametrize("dims", [(4, 2), (2, 4)])
def test_ring2d_time_equals_the_multiring_formula_on_a_torus(dims):
    """One ring per dimension, every step one hop over that dimension's links: the
    multi-dimensional ring formula (the message shrinking by A then B), one chunk."""
    elements = 1 << 18
    n = math.prod(dims)
    topo = "torus:" + "x".join(map(str, dims)) + f";{LINK}"
    form = formulas.multiring("all_reduce", dims, elements * 4, [L, L], [B, B])
    got = _run(topo, lambda r: ring2d_all_reduce(r, dims, 0, 1 << 22, elements, DType.F32, 1))
    assert n == 8 and got.finish_ns == pytest.approx(form, rel=1e-6)


def test_tree_time_matches_the_schedule_sides_contention_mode():
    """The double binary tree at its alpha-beta-best chunk count on switch:8, 1 MiB. Its
    formula counts one transfer per chip per step; a chip of the tree sends up to 4 chunks
    a step through its one switch port, so both the in-stream run and the schedule side's
    contention mode (the same schedule, processor sharing per link) take about twice the
    formula; the two agree within 5%."""
    n, elements = 8, 1 << 18
    system = load_system(f"switch:{n};{LINK}")
    sched = make_schedule("all_reduce", "double_binary_tree", system.topology, system.link, elements, 4)
    got = _run(f"switch:{n};{LINK}", lambda r: tree_all_reduce(r, n, 0, 1 << 22, elements, DType.F32, sched.chunks))
    cont = contention.simulate(sched, system.topology, system.link, 4).time_ns
    form = formulas.double_binary_tree(n, elements * 4, 2 * L + W, B, sched.chunks)
    assert got.finish_ns == pytest.approx(cont, rel=0.05)
    assert 1.5 * form < got.finish_ns < 3 * form


def test_lowering_rejects_a_schedule_it_cannot_split():
    from tilecc.simulator.interconnect.schedule import Schedule, Step

    sched = Schedule("all_reduce", "odd", 2, 4)
    sched.steps.append(Step.make([0, 1], [1, 0], [0, 0], [0, 0], [2, 2], [True, True]))
    sched.steps.append(Step.make([0, 1], [1, 0], [0, 0], [0, 0], [4, 4], [False, False]))  # half received
    with pytest.raises(TileccError, match="some from the input and some from the result"):
        lower_schedule(sched, 0, 0, 64, DType.F32)


# ------------------------------------------------------------------ selection


def test_auto_picks_by_the_alpha_beta_cost():
    sw, ring, torus = (load_system(f"{t};{LINK}") for t in ("switch:8", "ring:8", "torus:4x2"))
    big, small = 1 << 22, 64
    # a switch: halving-doubling's log2(n) latencies beat the ring's n-1, same bytes
    assert choose("all_reduce", "auto", sw.topology, sw.link, big, 4) == "halving_doubling"
    # a ring: halving-doubling's partners are several hops apart and share links: the ring
    assert choose("all_reduce", "auto", ring.topology, ring.link, big, 4) == "ring"
    # a torus: one ring per dimension
    assert choose("all_gather", "auto", torus.topology, torus.link, small, 4) == "ring2d"
    # 6 chips: the 4-chip core with 2 folded chips (no longer refused)
    assert choose("all_reduce", "halving_doubling", load_system("switch:6").topology, sw.link, big, 4) == \
        "halving_doubling"
    with pytest.raises(StreamAlgorithmError, match="all_reduce only"):
        choose("reduce_scatter", "tree", sw.topology, sw.link, big, 4)
    with pytest.raises(StreamAlgorithmError, match="not a torus"):
        choose("all_reduce", "ring2d", sw.topology, sw.link, big, 4)


# ------------------------------------------------------------------ tensor parallelism


def _llama(layers=1):
    from transformers import LlamaConfig, LlamaModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=100, max_position_embeddings=64, use_cache=False,
                      attn_implementation="eager")
    return LastHidden(LlamaModel(cfg)).eval()


IDS = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("algorithm,topology,sp", [
    ("halving_doubling", "switch:4", False),
    ("tree", "switch:4", False),
    ("ring2d", "torus:2x2", False),
    ("halving_doubling", "switch:4", True),
    ("ring2d", "torus:2x2", True),
    ("auto", "switch:4", False),
])
def test_tp_decoder_with_each_algorithm_matches_eager(algorithm, topology, sp):
    model = _llama()
    sm = tilecc.compile(model, (IDS,), target="tiny", system=topology, cache=False,
                        parallel={"tp": 4, "sp": sp, "collectives": "stream", "chunks": 2, "algorithm": algorithm})
    out = sm(IDS)
    with torch.no_grad():
        ref = model(IDS)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    rep = sm.report
    assert rep is not None and rep.link_bytes > 0
    want = "halving_doubling" if algorithm == "auto" else algorithm
    used = {c["algorithm"] for c in rep.collectives if c["op"] != "shard"}
    assert used == {f"{want} (in-stream)"}
    sends = sum(int((s["opcode"] == Opcode.LINK_SEND).sum()) for s in sm.program.streams)
    assert sends > 0


def test_tp3_decoder_with_halving_doubling_matches_eager():
    """tp = 3 (6 heads, 3 key-value heads): the in-stream halving-doubling folds chip 0 into
    chip 1, chips 1 and 2 exchange halves, chip 1 returns the sum; with sp the reduce-scatter
    and all-gather fold alike (18 tokens: the sequence splits in 3)."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=6,
                      num_key_value_heads=3, vocab_size=100, max_position_embeddings=64, use_cache=False,
                      attn_implementation="eager")
    model = LastHidden(LlamaModel(cfg)).eval()
    for sp, tokens in ((False, 16), (True, 18)):
        ids = torch.randint(0, 100, (1, tokens), generator=torch.Generator().manual_seed(1))
        sm = tilecc.compile(model, (ids,), target="tiny", system="switch:3", cache=False,
                            parallel={"tp": 3, "sp": sp, "collectives": "stream", "chunks": 2,
                                      "algorithm": "halving_doubling"})
        out = sm(ids)
        with torch.no_grad():
            ref = model(ids)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        rep = sm.report
        assert rep is not None
        assert {c["algorithm"] for c in rep.collectives if c["op"] != "shard"} == {"halving_doubling (in-stream)"}
        if not sp:  # per all-reduce of S bytes: fold S, core 2 x 2 x S/2, unfold S; each over 2 switch links
            reduces = [c for c in rep.collectives if c["op"] == "all_reduce"]
            assert reduces and rep.link_bytes == len(reduces) * 2 * 4 * (tokens * 48 * 4)


def test_algorithm_knob_errors():
    from tilecc.frontend.tensor_parallel import ShardingError

    with pytest.raises(ShardingError, match="'algorithm' applies to collectives='stream'"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2", parallel={"tp": 2, "algorithm": "tree"},
                       cache=False)
    with pytest.raises(ShardingError, match="'algorithm' = 'star'"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2", cache=False,
                       parallel={"tp": 2, "collectives": "stream", "algorithm": "star"})
    with pytest.raises(TileccError, match="not a torus"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2", cache=False,
                       parallel={"tp": 2, "collectives": "stream", "algorithm": "ring2d"})


# ------------------------------------------------------------------ pipeline parallelism


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_pipeline_sends_activations_in_the_streams(micro_batches):
    """pp=2: chip 0 sends stage 1's inputs (hidden states, mask, rotary tables) as LINK_SEND
    pieces after each micro-batch; the outputs equal eager's and the time is the analytic
    pipeline's (runtime/pipeline_run.py: transfers alpha + S/B after their producer) or up to 2% less."""
    from tilecc.runtime.pipeline_run import compile_pipeline, run_pipeline
    from tilecc.runtime.pipeline_stream import build_pipeline_streams, run_pipeline_streams

    model = _llama(layers=2)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids)
    pp = compile_pipeline(model, (ids,), load_system("ring:2;chip=tiny"), pp=2, micro_batches=micro_batches,
                          cache=False)
    psp = build_pipeline_streams(pp, chunks=2)
    outs, run = run_pipeline_streams(psp, (ids,))
    res, exposed = run.result, run.exposed_ns
    torch.testing.assert_close(outs[0], ref, rtol=1e-4, atol=1e-4)
    _, _, analytic = run_pipeline(pp, (ids,))
    # the analytic model starts a stage when all its inputs have arrived; in the stream a
    # stage's first kernel loads its weights before that (its RMS norm is fused into the
    # q/k/v matmul, whose weight loads need no input): the stream is never slower and at
    # most 2% faster (tiny, micro_batches=1: 198.2 against 201.5 us)
    assert analytic.time_us * 0.98 <= res.finish_ns / 1e3 <= analytic.time_us * 1.001
    assert 0 < exposed < 0.05 * res.finish_ns
    n_values = len(psp.transfers)
    assert n_values >= 2 and {t[1] for t in psp.transfers} == {0} and {t[3] for t in psp.transfers} == {1}
    sends = psp.streams[0]["opcode"] == Opcode.LINK_SEND
    recvs = psp.streams[1]["opcode"] == Opcode.LINK_RECV
    assert int(sends.sum()) == int(recvs.sum()) == micro_batches * sum(
        min(2, int(np.prod(t[2].shape))) for t in psp.transfers)
    hidden = max(int(np.prod(t[2].shape)) * 4 for t in psp.transfers)
    assert hidden == (4 // micro_batches) * 16 * 64 * 4


def test_pipeline_stream_from_compile_matches_eager_and_the_direct_path():
    """`tilecc.compile(..., parallel={"pp": 2, "micro_batches": 2, "collectives": "stream"})`:
    the sends in the streams, both chips co-simulated; the output equals eager's, the time is
    the streams' co-simulation (the same as building and running them directly), the link
    bytes are the values sent over ring:2's one link per micro-batch, and the trace has a
    track per chip engine and one for the link."""
    import tempfile
    from pathlib import Path

    from tilecc.errors import RaceError
    from tilecc.runtime.pipeline_run import compile_pipeline
    from tilecc.runtime.pipeline_stream import PipelineStreams, build_pipeline_streams, run_pipeline_streams

    model = _llama(layers=2)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids)
    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:2", cache=False,
                        parallel={"pp": 2, "micro_batches": 2, "collectives": "stream", "chunks": 2})
    assert isinstance(sm.program, PipelineStreams)
    sm.sanitize = True
    with tempfile.TemporaryDirectory() as tmp:
        out = sm.run(ids, trace=Path(tmp) / "pp.json")
        events = json.loads((Path(tmp) / "pp.json").read_text())["traceEvents"]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    rep = sm.report
    assert rep.extra["pp"] == 2 and rep.extra["collectives"] == "stream" and rep.extra["micro_batches"] == 2
    sent = sum(t[2].nbytes for t in sm.program.transfers) * 2
    assert rep.link_bytes == sent  # ring:2: chip 0 -> chip 1 over one link
    assert [c["op"] for c in rep.collectives] == ["send_recv"] * len(sm.program.transfers)
    assert all(c["time_us"] > 0 for c in rep.collectives)
    pp = compile_pipeline(model, (ids,), load_system("ring:2;chip=tiny"), pp=2, micro_batches=2, cache=False)
    _, direct = run_pipeline_streams(build_pipeline_streams(pp, chunks=2), (ids,))
    assert rep.time_us == pytest.approx(direct.result.finish_ns / 1e3, rel=1e-12)
    assert {e["args"]["name"] for e in events if e.get("name") == "process_name"} == {"chip 0", "chip 1", "links"}
    timing = sm.run(ids, timing_only=True)
    assert timing.shape == ref.shape and sm.report.time_us == pytest.approx(rep.time_us, rel=1e-12)
    # the sanitisers see the receives: stage 1's first load of a received value, its wait
    # on the receives dropped, races with the receive that writes those bytes
    s = sm.program.streams[1]
    first = int(np.flatnonzero((s["opcode"] == Opcode.DMA_LOAD) & (s["wait_sem"][:, 0] >= 0))[0])
    s["wait_sem"][first] = -1
    s["wait_val"][first] = 0
    with pytest.raises(RaceError, match="link.recv"):
        sm.run(ids)


def test_pipeline_stream_cli_and_refusals(capsys):
    from tilecc.cli import main
    from tilecc.frontend.tensor_parallel import ShardingError

    assert main(["run", "examples/llama_tp.py:llama_pipeline", "--system", "ring:2", "--target", "tiny", "--pp", "2",
                 "--micro-batches", "2", "--collectives", "stream", "--chunks", "2", "--no-cache", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["allclose"] is True and d["extra"]["collectives"] == "stream" and d["link_bytes"] > 0
    with pytest.raises(ShardingError, match="not tp x pp"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:4", cache=False,
                       parallel={"tp": 2, "pp": 2, "collectives": "stream"})
    with pytest.raises(ShardingError, match="a pipeline's sends are point to point"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2", cache=False,
                       parallel={"pp": 2, "collectives": "stream", "algorithm": "tree"})
    with pytest.raises(ShardingError, match="runs tp alone or pp alone, not with dp"):
        tilecc.compile(_llama(), (IDS,), target="tiny", system="ring:2", cache=False,
                       parallel={"dp": 2, "collectives": "stream"})
