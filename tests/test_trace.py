"""Timeline traces (simulator/trace.py): Chrome trace-event JSON for ui.perfetto.dev."""

from __future__ import annotations

import gzip
import json
import math
import time
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

import tilecc
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import DType, Engine, Mem, Opcode, UnaryFn, empty_stream
from tilecc.simulator.machine import simulate
from tilecc.simulator.trace import DEFAULT_MAX_EVENTS, chrome_trace, write_trace

# ----------------------------------------------------------------------------- validation

PHASES = {"M", "X", "C", "s", "f"}


def ns(x: float) -> int:
    """A trace time (us) as Perfetto reads it: llround(ts * 1000) nanoseconds."""
    return int(math.floor(x * 1000.0 + 0.5))


def validate(trace: dict, max_events: int = DEFAULT_MAX_EVENTS) -> dict:
    """Check the trace-event format and Perfetto's import rules; return the events by
    phase, the X slices by track and the track names."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    assert isinstance(events, list) and 0 < len(events) <= max_events
    by_ph: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and not isinstance(e["pid"], bool), e
        assert isinstance(e["tid"], int) and not isinstance(e["tid"], bool), e
        # Perfetto treats pid/tid 0 as the kernel's swapper
        assert e["pid"] > 0 and e["tid"] > 0, e
        # Perfetto's tokenizer rejects events holding arrays (it scans them for "ts")
        assert not any(isinstance(v, list) for v in e.values()), e
        assert not any(isinstance(v, list) for v in e.get("args", {}).values()), e
        assert isinstance(e["ts"], float) and math.isfinite(e["ts"]) and e["ts"] >= 0, e
        # times are whole nanoseconds: Perfetto's llround(ts * 1000) reads them exactly
        assert abs(e["ts"] * 1000 - ns(e["ts"])) < 1e-6, e
        assert isinstance(e["name"], str) and e["name"], e
        if e["ph"] == "X":
            assert isinstance(e["dur"], float) and e["dur"] >= 0, e
            assert abs(e["dur"] * 1000 - ns(e["dur"])) < 1e-6, e
            assert isinstance(e["cat"], str) and isinstance(e["args"], dict)
        if e["ph"] == "C":
            assert isinstance(e["args"], dict) and e["args"]
            for v in e["args"].values():
                assert isinstance(v, (int, float)) and not isinstance(v, bool), e
                assert math.isfinite(v) and v >= 0, e
        if e["ph"] == "M":
            assert isinstance(e["args"], dict)
        by_ph[e["ph"]].append(e)

    # tracks: every thread used by a slice or flow is named
    names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in by_ph["M"] if e["name"] == "thread_name"
    }
    assert len(set(names.values())) == len(names), "track names are unique"
    assert any(e["name"] == "process_name" for e in by_ph["M"])

    # slices on one track are disjoint or nested (Perfetto drops partial overlaps)
    tracks: dict[tuple[int, int], list[tuple[int, int, dict]]] = defaultdict(list)
    for e in by_ph["X"]:
        assert (e["pid"], e["tid"]) in names, f"unnamed track {e['tid']}"
        t0 = ns(e["ts"])
        tracks[(e["pid"], e["tid"])].append((t0, t0 + ns(e["dur"]), e))
    for key, slices in tracks.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        for t0, t1, e in slices:
            while stack and stack[-1] <= t0:
                stack.pop()
            assert not stack or t1 <= stack[-1], f"partial overlap on track {key}: {e}"
            stack.append(t1)

    # flows: ids pair up, s before f, f binds to its enclosing slice ("bp": "e"), and
    # each end lies inside a slice of its track
    starts = {e["id"]: e for e in by_ph["s"]}
    ends = {e["id"]: e for e in by_ph["f"]}
    assert len(starts) == len(by_ph["s"]) and len(ends) == len(by_ph["f"]), "duplicate flow ids"
    assert set(starts) == set(ends), "unpaired flow events"
    for fid, f in ends.items():
        s = starts[fid]
        assert f.get("bp") == "e", f
        assert f["ts"] >= s["ts"], (s, f)
        assert s["cat"] == f["cat"] and s["name"] == f["name"]
        for ev in (s, f):
            t = ns(ev["ts"])
            track = tracks[(ev["pid"], ev["tid"])]
            assert any(t0 <= t < t1 or t0 == t == t1 for t0, t1, _ in track), (
                f"flow event outside every slice of its track: {ev}"
            )
    return {"by_ph": by_ph, "tracks": tracks, "names": names}


def roundtrip(trace: dict) -> dict:
    """The Perfetto-compat check: plain JSON (no NaN/Infinity), equal after a round trip."""
    text = json.dumps(trace, allow_nan=False)
    back = json.loads(text)
    assert back == trace
    return back


def instructions(trace: dict) -> dict[int, dict]:
    """Instruction slices by instruction index."""
    out = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] != "kernel":
            out[int(e["name"].rsplit("#", 1)[1])] = e
    return out


def flows(trace: dict) -> set[tuple[int, int]]:
    """(source instruction, waiting instruction) of every flow arrow, from the slices the
    flow ends bind to."""
    ev = trace["traceEvents"]
    slices = defaultdict(list)
    for e in ev:
        if e["ph"] == "X" and e["cat"] != "kernel":
            t0, index = ns(e["ts"]), int(e["name"].rsplit("#", 1)[1])
            slices[e["tid"]].append((t0, t0 + ns(e["dur"]), index))

    def bound(e: dict) -> int:
        t = ns(e["ts"])
        hits = [i for t0, t1, i in slices[e["tid"]] if t0 <= t < t1 or t0 == t == t1]
        assert len(hits) == 1, e
        return hits[0]

    starts = {e["id"]: bound(e) for e in ev if e["ph"] == "s"}
    return {(starts[e["id"]], bound(e)) for e in ev if e["ph"] == "f"}


def expected_waits(stream: np.ndarray) -> list[tuple[int, int, int]]:
    """(instruction, semaphore, value) of every wait that needs a signal (value >= 1)."""
    out = []
    for i in np.flatnonzero(stream["opcode"] != Opcode.BARRIER).tolist():
        for w, v in zip(stream["wait_sem"][i].tolist(), stream["wait_val"][i].tolist()):
            if w >= 0 and v >= 1:
                out.append((i, w, v))
    return out


# ----------------------------------------------------------------------------- programs


@pytest.fixture(scope="module")
def tiny():
    return load_config("tiny")


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 16)
    ).eval()
    x = torch.randn(20, 32)
    program = tilecc.compile(model, (x,), target="tiny").program
    sim = simulate(program.stream, program.config, program.hbm_image(), functional=False)
    return program, sim


def _load(s, i, q, part, addr, rows, cols, signal=-1, waits=(), hbm=0, dtype=DType.F32):
    s["opcode"][i], s["engine"][i], s["queue"][i] = Opcode.DMA_LOAD, Engine.DMA, q
    s["a_mem"][i], s["o_mem"][i] = Mem.HBM, Mem.SRAM
    s["a_dtype"][i] = s["o_dtype"][i] = dtype
    s["a_addr"][i], s["hbm_rs"][i], s["hbm_cs"][i] = hbm, cols, 1
    s["o_part"][i], s["o_addr"][i] = part, addr
    s["rows"][i], s["cols"][i] = rows, cols
    _sync(s, i, signal, waits)


def _store(s, i, q, addr, rows, cols, signal=-1, waits=(), hbm=1 << 20):
    s["opcode"][i], s["engine"][i], s["queue"][i] = Opcode.DMA_STORE, Engine.DMA, q
    s["a_mem"][i], s["o_mem"][i] = Mem.SRAM, Mem.HBM
    s["a_dtype"][i] = s["o_dtype"][i] = DType.F32
    s["a_addr"][i], s["o_addr"][i], s["hbm_rs"][i], s["hbm_cs"][i] = addr, hbm, cols, 1
    s["rows"][i], s["cols"][i] = rows, cols
    _sync(s, i, signal, waits)


def _exp(s, i, a_addr, o_addr, rows, cols, signal=-1, waits=()):
    s["opcode"][i], s["engine"][i], s["func"][i] = Opcode.VEC_UNARY, Engine.VECTOR, UnaryFn.EXP
    s["a_mem"][i] = s["o_mem"][i] = Mem.SRAM
    s["a_dtype"][i] = s["o_dtype"][i] = DType.F32
    s["a_addr"][i], s["o_addr"][i] = a_addr, o_addr
    s["rows"][i], s["cols"][i] = rows, cols
    _sync(s, i, signal, waits)


def _matmul(s, i, signal=-1, waits=()):
    s["opcode"][i], s["engine"][i] = Opcode.MATMUL, Engine.MATRIX
    s["a_mem"][i] = s["b_mem"][i] = Mem.SRAM
    s["o_mem"][i] = Mem.ACC
    s["a_dtype"][i] = s["b_dtype"][i] = DType.BF16
    s["o_dtype"][i] = DType.F32
    s["b_addr"][i] = 0x400
    s["rows"][i] = s["cols"][i] = s["k"][i] = 16
    _sync(s, i, signal, waits)


def _barrier(s, i):
    s["opcode"][i], s["engine"][i] = Opcode.BARRIER, Engine.ALL


def _sync(s, i, signal, waits):
    s["signal_sem"][i] = signal
    for j, (w, v) in enumerate(waits):
        s["wait_sem"][i, j], s["wait_val"][i, j] = w, v


def timing(stream, cfg):
    r = simulate(stream, cfg, None, functional=False)
    return r.start, r.end


# ----------------------------------------------------------------------------- tests


def test_compiled_mlp_trace(mlp):
    program, sim = mlp
    stream = program.stream
    trace = chrome_trace(stream, program.config, sim.start, sim.end, program.kernels)
    v = validate(roundtrip(trace))
    by_ph = v["by_ph"]

    # one slice per non-barrier instruction, each on its engine's track, named by op
    work = np.flatnonzero(stream["opcode"] != Opcode.BARRIER)
    slices = instructions(trace)
    assert sorted(slices) == work.tolist()
    names = v["names"]
    for i, e in slices.items():
        op = Opcode(int(stream["opcode"][i]))
        track = names[(e["pid"], e["tid"])]
        if op in (Opcode.DMA_LOAD, Opcode.DMA_STORE):
            assert track == f"dma{int(stream['queue'][i])}"
        else:
            assert track.split(" overlap")[0] == ("matrix" if op == Opcode.MATMUL else "vector")  # pipelined matmuls overlap on sub-tracks
        assert e["cat"] == ("dma" if track.startswith("dma") else track.split(" overlap")[0])
        op_name = e["name"].split(" ")[0]
        assert op_name in ("dma.load", "dma.store", "matmul") or op_name.startswith("vec.")
        assert e["args"]["cycles"] == pytest.approx(sim.end[i] - sim.start[i])
        assert e["args"]["start_cycle"] == pytest.approx(sim.start[i])
        assert e["ts"] == pytest.approx(sim.start[i] / program.config.clock_ghz / 1000, abs=1e-3)
        assert e["args"]["asm"].startswith(e["name"].split(" ")[0])
    assert set(names.values()) >= {"kernels", "dma0", "dma1", "matrix", "vector"}
    # DMA and vector queues never overlap themselves; pipelined back-to-back matmuls do
    # (the next streams while the previous drains) and take the matrix overflow lanes;
    # linked kernels (codegen/link.py) overlap too and take the kernels' overflow lanes
    assert {n for n in names.values() if "overlap" not in n} == {"kernels", "dma0", "dma1", "matrix", "vector"}
    assert all(n.startswith(("matrix overlap ", "kernels overlap ")) for n in names.values() if "overlap" in n)

    # one kernel slice per kernel span, in order
    kernel_slices = [e for e in by_ph["X"] if e["cat"] == "kernel"]
    assert [e["name"] for e in kernel_slices] == [k[0] for k in program.kernels if k[2] > 0]
    for e, (_name, first, count) in zip(kernel_slices, [k for k in program.kernels if k[2] > 0]):
        assert e["args"]["first"] == first and e["args"]["count"] == count
        span = slice(first, first + count)
        assert ns(e["ts"]) == round(sim.start[span].min() / program.config.clock_ghz)

    # every wait that needed a signal has its arrow, from the right instruction
    arrows = flows(trace)
    waits = expected_waits(stream)
    assert waits and {(i) for _, i in arrows} == {i for i, _, _ in waits}
    for src, dst in arrows:
        assert sim.end[src] <= sim.start[dst]
        assert stream["signal_sem"][src] in stream["wait_sem"][dst]
    assert len(arrows) == len({(i, w) for i, w, _ in waits})  # one source per semaphore
    for i, e in slices.items():
        n_waits = sum(1 for j, _, _ in waits if j == i)
        assert e["args"].get("waits", "").count("<- #") == n_waits

    # counters: on-chip bytes and HBM bandwidth
    counters = Counter(e["name"] for e in by_ph["C"])
    assert set(counters) == {"SRAM bytes", "ACC bytes", "HBM bandwidth (GB/s)"}
    sram = [e["args"]["used"] for e in by_ph["C"] if e["name"] == "SRAM bytes"]
    assert max(sram) > 0 and sram[-1] == 0
    assert max(sram) <= program.config.sram.partitions * program.config.sram.bytes_per_partition
    acc = [e["args"]["used"] for e in by_ph["C"] if e["name"] == "ACC bytes"]
    assert max(acc) > 0  # the matmul kernels use the accumulator
    bw = [e for e in by_ph["C"] if e["name"] == "HBM bandwidth (GB/s)"]
    assert max(e["args"]["load"] for e in bw) > 0 and max(e["args"]["store"] for e in bw) > 0
    assert bw[-1]["args"] == {"load": 0.0, "store": 0.0}
    assert trace["otherData"]["truncated"] is False
    assert trace["otherData"]["events_kept"] == len(trace["traceEvents"])


def test_flow_comes_from_the_completion_that_satisfied_the_wait(tiny):
    s = empty_stream(5)
    _load(s, 0, 0, 0, 0x0, 16, 256, signal=0)  # long: completes second
    _load(s, 1, 1, 0, 0x1000, 16, 4, signal=0, hbm=0x8000)  # short: completes first
    _exp(s, 2, 0x1000, 0x2000, 16, 4, waits=[(0, 1)])  # the first completion: #1
    _exp(s, 3, 0x0, 0x3000, 16, 256, waits=[(0, 2)])  # the second: #0
    _store(s, 4, 1, 0x3000, 16, 256, waits=[(0, 2)])
    start, end = timing(s, tiny)
    assert end[1] < end[0]
    trace = chrome_trace(s, tiny, start, end)
    validate(roundtrip(trace))
    assert flows(trace) == {(1, 2), (0, 3), (0, 4)}
    inst = instructions(trace)
    assert inst[2]["args"]["waits"] == "s0>=1 <- #1"
    assert inst[3]["args"]["waits"] == "s0>=2 <- #0"
    assert "waits" not in inst[0]["args"]


def test_semaphores_reset_at_barriers(tiny):
    s = empty_stream(5)
    _load(s, 0, 0, 0, 0x0, 16, 16, signal=3)
    _exp(s, 1, 0x0, 0x100, 16, 16, waits=[(3, 1)])
    _barrier(s, 2)
    _load(s, 3, 1, 0, 0x0, 16, 16, signal=3)
    _exp(s, 4, 0x0, 0x100, 16, 16, waits=[(3, 1)])
    start, end = timing(s, tiny)
    trace = chrome_trace(s, tiny, start, end)  # kernels from the barriers
    validate(roundtrip(trace))
    assert flows(trace) == {(0, 1), (3, 4)}
    kernels = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"]
    assert [(k["name"], k["args"]["first"], k["args"]["count"]) for k in kernels] == [
        ("kernel 0", 0, 2),
        ("kernel 1", 3, 2),
    ]
    assert len(instructions(trace)) == 4  # barriers get no slice


def test_on_chip_and_bandwidth_counters(tiny):
    s = empty_stream(4)
    _load(s, 0, 0, 0, 0x0, 16, 16, signal=0)  # sram p0..16 x [0, 64)
    _load(s, 1, 1, 0, 0x40, 16, 16, signal=1, hbm=0x4000)  # p0..16 x [64, 128)
    _exp(s, 2, 0x0, 0x0, 16, 32, signal=2, waits=[(0, 1), (1, 1)])  # [0, 128) in place
    _store(s, 3, 1, 0x200, 8, 4, waits=[(2, 1)])  # p0..8 x [512, 528)
    start, end = timing(s, tiny)
    trace = chrome_trace(s, tiny, start, end, [("k", 0, 4)])
    v = validate(roundtrip(trace))
    counters = v["by_ph"]["C"]
    sram = [(e["ts"], e["args"]["used"]) for e in counters if e["name"] == "SRAM bytes"]
    assert [u for _, u in sram] == [16 * 128 + 8 * 16, 0]  # the union, not the sum
    assert [ns(t) for t, _ in sram] == [round(start[:4].min()), round(end[:4].max())]
    acc = [e["args"]["used"] for e in counters if e["name"] == "ACC bytes"]
    assert acc == [0, 0]
    # HBM: each DMA's bytes / its duration (GB/s at 1 GHz = bytes per cycle), summed
    bw = {ns(e["ts"]): e["args"] for e in counters if e["name"] == "HBM bandwidth (GB/s)"}
    rate = [16 * 16 * 4 / (end[i] - start[i]) for i in range(2)]
    assert bw[0]["load"] == pytest.approx(rate[0] + rate[1], rel=1e-5)
    first, last = sorted((0, 1), key=lambda i: end[i])
    if end[first] < end[last]:  # after the first load ends, only the other one's rate
        assert bw[round(end[first])]["load"] == pytest.approx(rate[last], rel=1e-5)
    store_rate = 8 * 4 * 4 / (end[3] - start[3])
    assert bw[round(start[3])] == {"load": 0.0, "store": pytest.approx(store_rate, rel=1e-5)}
    assert bw[max(bw)] == {"load": 0.0, "store": 0.0}


def test_overlapping_slices_go_to_overflow_lanes(tiny):
    """A pipelined matrix engine issues before the previous result is ready: start/end
    overlap on one queue. Slices then take the first lane where they fit."""
    s = empty_stream(6)
    for i in range(5):
        _matmul(s, i, signal=0)
    _exp(s, 5, 0x0, 0x800, 16, 16, waits=[(0, 5)])
    start = np.array([0, 30, 60, 90, 200, 300], dtype=np.float64)
    end = np.array([100, 130, 160, 190, 250, 310], dtype=np.float64)
    trace = chrome_trace(s, tiny, start, end)
    v = validate(roundtrip(trace))
    names = v["names"]
    inst = instructions(trace)
    lane = {i: names[(e["pid"], e["tid"])] for i, e in inst.items()}
    assert lane == {
        0: "matrix", 1: "matrix overlap 1", 2: "matrix overlap 2", 3: "matrix overlap 3",
        4: "matrix", 5: "vector",
    }
    # overflow lanes sit right after their engine's track
    tids = {name: tid for (_, tid), name in names.items()}
    assert tids["matrix"] + 1 == tids["matrix overlap 1"] < tids["vector"]
    assert flows(trace) == {(4, 5)}  # the 5th completion (by end time)
    assert len(inst) == 6


def test_any_overlap_pattern_gets_the_fewest_lanes(tiny):
    """Random intervals on one queue: no partial overlap on any track, and first-fit
    by start time needs exactly as many lanes as the most intervals in flight."""
    rng = np.random.default_rng(1)
    n = 300
    s = empty_stream(n)
    for i in range(n):
        _matmul(s, i)
    start = np.sort(rng.integers(0, 2000, n)).astype(np.float64)
    end = start + rng.integers(1, 120, n)
    trace = chrome_trace(s, tiny, start, end)
    v = validate(trace)
    lanes = {e["tid"] for e in instructions(trace).values()}
    depth = peak = 0
    for _, step in sorted([(t, -1) for t in end] + [(t, 1) for t in start]):
        depth += step  # at equal times ends go first: an end at t frees a lane for t
        peak = max(peak, depth)
    assert len(lanes) == peak
    names = sorted(v["names"][(1, t)] for t in lanes)
    assert names[0] == "matrix" and all(x.startswith("matrix overlap ") for x in names[1:])


def test_fractional_clock_rounds_to_nanoseconds(tiny):
    """At 1.4 GHz cycles are not whole nanoseconds; touching slices must still touch."""
    from dataclasses import replace

    cfg = replace(tiny, clock_ghz=1.4)
    s = empty_stream(4)
    for i in range(4):
        _exp(s, i, 0x0, 0x100, 16, 16 + i)
    start = np.array([0.0, 7.0, 14.0, 21.0])
    end = np.array([7.0, 14.0, 21.0, 29.0])
    trace = chrome_trace(s, cfg, start, end)
    validate(trace)
    inst = instructions(trace)
    assert len({e["tid"] for e in inst.values()}) == 1
    for i in range(3):
        assert ns(inst[i]["ts"]) + ns(inst[i]["dur"]) == ns(inst[i + 1]["ts"])
    assert inst[3]["args"]["cycles"] == 8


def test_truncation_keeps_a_valid_bounded_trace(mlp, tmp_path):
    program, sim = mlp
    full = chrome_trace(program.stream, program.config, sim.start, sim.end, program.kernels)
    for cap in (40, len(full["traceEvents"]) // 2):
        trace = chrome_trace(
            program.stream, program.config, sim.start, sim.end, program.kernels, max_events=cap
        )
        v = validate(roundtrip(trace), max_events=cap)
        other = trace["otherData"]
        assert other["truncated"] is True and other["max_events"] == cap
        assert other["events_total"] == len(full["traceEvents"])
        assert other["events_kept"] == len(trace["traceEvents"]) <= cap
        labels = [e for e in v["by_ph"]["M"] if e["name"] == "process_labels"]
        assert labels and "TRUNCATED" in labels[0]["args"]["labels"]
        # the earliest events are kept
        cutoff = other["cutoff_us"]
        kept = instructions(trace)
        for i, e in instructions(full).items():
            if e["ts"] < cutoff:
                assert i in kept
        path = tmp_path / f"t{cap}.json"
        write_trace(
            path, program.stream, program.config, sim.start, sim.end, program.kernels,
            max_events=cap,
        )
        assert len(json.loads(path.read_text())["traceEvents"]) <= cap


def test_write_trace_json_and_gzip(mlp, tmp_path):
    program, sim = mlp
    trace = chrome_trace(program.stream, program.config, sim.start, sim.end, program.kernels)
    args = (program.stream, program.config, sim.start, sim.end, program.kernels)
    p = write_trace(tmp_path / "t.json", *args)
    assert json.loads(p.read_text()) == trace
    gz = write_trace(tmp_path / "t.json.gz", *args)
    assert json.loads(gzip.decompress(gz.read_bytes())) == trace
    assert not list(tmp_path.glob("*.tmp"))


def test_empty_and_barrier_only_streams(tiny):
    trace = chrome_trace(empty_stream(0), tiny, np.zeros(0), np.zeros(0))
    v = validate(roundtrip(trace))
    assert not v["by_ph"]["X"] and not v["by_ph"]["C"]
    s = empty_stream(2)
    _barrier(s, 0)
    _barrier(s, 1)
    trace = chrome_trace(s, tiny, np.zeros(2), np.zeros(2))
    assert not validate(trace)["by_ph"]["X"]


def test_asm_text_of_non_canonical_records(tiny):
    s = empty_stream(2)
    _load(s, 0, 0, 0, 0x0, 16, 16)
    _exp(s, 1, 0x0, 0x100, 16, 16)
    s["imm"][0] = 2.0  # a field the load does not use: print_asm rejects the stream
    trace = chrome_trace(s, tiny, np.array([0.0, 300.0]), np.array([300.0, 400.0]))
    inst = instructions(trace)
    assert inst[0]["args"]["asm"].startswith("dma.load q0 hbm[0x0 rs=16 cs=1]:f32")
    assert inst[1]["args"]["asm"].startswith("vec.exp sram[p0 +0x0]:f32")


def test_bad_inputs(tiny):
    s = empty_stream(2)
    _exp(s, 0, 0, 0x100, 16, 16)
    _exp(s, 1, 0, 0x100, 16, 16)
    ok = np.array([0.0, 50.0]), np.array([50.0, 100.0])
    with pytest.raises(ValueError, match="one cycle per record"):
        chrome_trace(s, tiny, np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="instruction 1"):
        chrome_trace(s, tiny, ok[0], np.array([50.0, 10.0]))
    with pytest.raises(ValueError, match="outside the stream"):
        chrome_trace(s, tiny, *ok, [("k", 1, 5)])
    with pytest.raises(ValueError, match="max_events"):
        chrome_trace(s, tiny, *ok, max_events=0)
    with pytest.raises(ValueError, match="metadata events"):
        chrome_trace(s, tiny, *ok, max_events=5)
    with pytest.raises(ValueError, match="pid"):
        chrome_trace(s, tiny, *ok, pid=0)
    with pytest.raises(ValueError, match="RECORD"):
        chrome_trace(np.zeros(2), tiny, *ok)
    bad = s.copy()
    bad["opcode"][1] = 200
    with pytest.raises(ValueError, match="unknown opcode"):
        chrome_trace(bad, tiny, *ok)


def _pipeline(reps: int) -> np.ndarray:
    """reps x (load q0, load q1, matmul, vec.exp, store): 5 * reps instructions with
    RAW and WAR semaphores."""
    s = empty_stream(5 * reps)
    i = np.arange(reps)
    for j, q, sem in ((0, 0, 1), (1, 1, 2)):
        idx = 5 * i + j
        s["opcode"][idx], s["engine"][idx], s["queue"][idx] = Opcode.DMA_LOAD, Engine.DMA, q
        s["a_mem"][idx], s["o_mem"][idx] = Mem.HBM, Mem.SRAM
        s["a_dtype"][idx] = s["o_dtype"][idx] = DType.BF16
        s["rows"][idx], s["cols"][idx], s["hbm_rs"][idx], s["hbm_cs"][idx] = 16, 16, 16, 1
        s["a_addr"][idx], s["o_addr"][idx] = 0x1000 * q, 0x400 * q
        s["signal_sem"][idx] = sem
        s["wait_sem"][idx, 0], s["wait_val"][idx, 0] = 0, i  # WAR: the previous matmul
    mm = 5 * i + 2
    _matmul(s, mm, signal=0)
    s["wait_sem"][mm, 0], s["wait_val"][mm, 0] = 1, i + 1
    s["wait_sem"][mm, 1], s["wait_val"][mm, 1] = 2, i + 1
    s["wait_sem"][mm, 2], s["wait_val"][mm, 2] = 3, i  # WAR: the previous vec read of acc
    v = 5 * i + 3
    s["opcode"][v], s["engine"][v], s["func"][v] = Opcode.VEC_UNARY, Engine.VECTOR, UnaryFn.EXP
    s["a_mem"][v], s["o_mem"][v] = Mem.ACC, Mem.SRAM
    s["a_dtype"][v], s["o_dtype"][v] = DType.F32, DType.BF16
    s["o_addr"][v], s["rows"][v], s["cols"][v] = 0x800, 16, 16
    s["wait_sem"][v, 0], s["wait_val"][v, 0] = 0, i + 1
    s["wait_sem"][v, 1], s["wait_val"][v, 1] = 4, i  # WAR: the previous store
    s["signal_sem"][v] = 3
    st = 5 * i + 4
    s["opcode"][st], s["engine"][st], s["queue"][st] = Opcode.DMA_STORE, Engine.DMA, 1
    s["a_mem"][st], s["o_mem"][st] = Mem.SRAM, Mem.HBM
    s["a_dtype"][st] = s["o_dtype"][st] = DType.BF16
    s["a_addr"][st], s["o_addr"][st] = 0x800, 0x10000 + 512 * i
    s["hbm_rs"][st], s["hbm_cs"][st], s["rows"][st], s["cols"][st] = 16, 1, 16, 16
    s["wait_sem"][st, 0], s["wait_val"][st, 0] = 3, i + 1
    s["signal_sem"][st] = 4
    return s


def test_100k_instructions_written_quickly(tiny, tmp_path):
    s = _pipeline(20_000)
    start, end = timing(s, tiny)
    t = time.perf_counter()
    path = write_trace(tmp_path / "big.json", s, tiny, start, end)
    seconds = time.perf_counter() - t
    print(f"100k-instruction trace: {seconds:.2f} s, {path.stat().st_size / 1e6:.1f} MB")
    assert seconds < 15  # ~2-3 s on an idle core; generous for loaded CI machines
    trace = json.loads(path.read_text())
    counts = Counter(e["cat"] if e["ph"] == "X" else e["ph"] for e in trace["traceEvents"])
    assert counts["dma"] + counts["matrix"] + counts["vector"] == 100_000 and counts["kernel"] == 1
    assert counts["s"] == counts["f"] == len({(i, w) for i, w, _ in expected_waits(s)})
    assert trace["otherData"]["truncated"] is False
    # a cap far below the size keeps the file bounded
    small = write_trace(tmp_path / "small.json", s, tiny, start, end, max_events=10_000)
    assert len(json.loads(small.read_text())["traceEvents"]) <= 10_000
    assert small.stat().st_size < path.stat().st_size / 20
