"""The calibrated timing model: matrix engine modes and dataflows against closed forms and
SCALE-Sim's figures, DMA bandwidth sharing and chunk efficiency, the vector cost table,
stalls, energy, the roofline bound on random programs, and the fast paths (dataflow
scheduler, record=False chunking, gemm())."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilecc.errors import ConfigError, DeadlockError, MemoryAccessError, SimulatorError
from tilecc.runtime.report import make_report, program_work, roofline, stream_work
from tilecc.simulator import decode, energy, isa, machine, scheduler
from tilecc.simulator.config import PRESET_DIR, HardwareConfig, from_dict, load_config
from tilecc.simulator.gemm import gemm
from tilecc.simulator.isa import BinaryFn, DType, Flag, Mem, Opcode, ReduceFn, UnaryFn
from tilecc.simulator.machine import simulate

TINY = load_config("tiny")


def with_matrix(cfg: HardwareConfig, **kw: Any) -> HardwareConfig:
    return dataclasses.replace(cfg, matrix=dataclasses.replace(cfg.matrix, **kw))


def tall(cfg: HardwareConfig, parts: int = 256) -> HardwareConfig:
    """`cfg` with `parts` SRAM and accumulator partitions (matmuls with M up to `parts`)."""
    return dataclasses.replace(
        cfg, sram=dataclasses.replace(cfg.sram, partitions=parts),
        accumulator=dataclasses.replace(cfg.accumulator, partitions=parts),
    )


def timing(stream: np.ndarray, cfg: HardwareConfig = TINY, **kw: Any) -> machine.SimResult:
    return simulate(stream, cfg, None, functional=False, **kw)


# ----------------------------------------------------------------------------- streams


def program(*instrs: dict[str, Any]) -> np.ndarray:
    s = isa.empty_stream(len(instrs))
    for i, fields in enumerate(instrs):
        fields = dict(fields)
        op = fields.pop("opcode")
        s[i]["opcode"] = op
        s[i]["engine"] = isa.OPCODE_ENGINE[op]
        for j, (sem, val) in enumerate(fields.pop("wait", [])):
            s[i]["wait_sem"][j], s[i]["wait_val"][j] = sem, val
        s[i]["signal_sem"] = fields.pop("signal", -1)
        for key, value in fields.items():
            s[i][key] = value
    return s


def load(rows, cols, dtype=DType.BF16, *, cs=1, rs=None, queue=0, addr=0, **kw):
    fields = dict(
        opcode=Opcode.DMA_LOAD, a_mem=Mem.HBM, a_addr=addr, a_dtype=dtype, o_dtype=dtype,
        o_mem=Mem.SRAM, rows=rows, cols=cols, hbm_rs=(cols if rs is None else rs), hbm_cs=cs,
        queue=queue,
    )
    return {**fields, **kw}


def store(rows, cols, dtype=DType.BF16, *, queue=0, **kw):
    fields = dict(
        opcode=Opcode.DMA_STORE, a_mem=Mem.SRAM, a_dtype=dtype, o_dtype=dtype, o_mem=Mem.HBM,
        rows=rows, cols=cols, hbm_rs=cols, hbm_cs=1, queue=queue,
    )
    return {**fields, **kw}


def matmul(m, k, n, dtype=DType.BF16, **kw):
    fields = dict(
        opcode=Opcode.MATMUL, rows=m, cols=n, k=k, a_mem=Mem.SRAM, a_dtype=dtype, b_mem=Mem.SRAM,
        b_dtype=dtype, o_mem=Mem.ACC, o_dtype=DType.F32,
    )
    return {**fields, **kw}


def vector(opcode, func, rows, cols, *, flags=0, **kw):
    fields = dict(
        opcode=opcode, func=func, rows=rows, cols=cols, a_mem=Mem.SRAM, a_dtype=DType.F32,
        b_mem=Mem.SRAM, b_dtype=DType.F32, o_mem=Mem.SRAM, o_dtype=DType.F32, flags=flags,
    )
    return {**fields, **kw}


def barrier():
    return dict(opcode=Opcode.BARRIER)


# ----------------------------------------------------------------------------- config


def _tiny_dict() -> dict:
    return tomllib.loads((PRESET_DIR / "tiny.toml").read_text())


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["matrix"].update(mode="fast"),
         "'matrix.mode' = 'fast' is not allowed (allowed: compatible, pipelined)"),
        (lambda d: d["matrix"].update(dataflow="rs"),
         "'matrix.dataflow' = 'rs' is not allowed (allowed: is, os, ws)"),
        (lambda d: d["matrix"].update(min_interval_cycles=0),
         "'matrix.min_interval_cycles' must be > 0"),
        (lambda d: d["dma"].update(packet_overhead_cycles=-1.5), "'dma.packet_overhead_cycles' must be >= 0, got -1.5"),
        (lambda d: d["dma"].update(packet_overhead_cycles="72"), "'dma.packet_overhead_cycles' must be a number"),
        (lambda d: d["dma"].update(packet_overhead_cycles=math.inf),
         "'dma.packet_overhead_cycles' must be a finite number >= 0, got inf"),
        (lambda d: d["dma"].pop("packet_overhead_cycles"), "missing key 'dma.packet_overhead_cycles'"),
        (lambda d: d["dma"].update(efficient_chunk_bytes=64), "unknown key 'dma.efficient_chunk_bytes'"),
        (lambda d: d["dma"].update(engines=0), "'dma.engines' must be > 0, got 0"),
        (lambda d: d["dma"].update(engines=2.5), "'dma.engines' must be an integer, got 2.5"),
        (lambda d: d["dma"].update(engine_bytes_per_cycle=0.0), "'dma.engine_bytes_per_cycle' must be > 0, got 0.0"),
        (lambda d: d["dma"].pop("engines"), "missing key 'dma.engines'"),
        (lambda d: d["dma"].pop("per_descriptor_cycles"), "missing key 'dma.per_descriptor_cycles'"),
        (lambda d: d["vector"]["op_cost"]["unary"].update(expm1=3),
         "unknown operation 'vector.op_cost.unary.expm1' (allowed in this table: copy, relu"),
        (lambda d: d["vector"]["op_cost"]["binary"].pop("div"),
         "missing key 'vector.op_cost.binary.div'"),
        (lambda d: d["vector"]["op_cost"]["reduce"].update(sum=0),
         "'vector.op_cost.reduce.sum' must be > 0, got 0"),
        (lambda d: d["vector"]["op_cost"]["reduce"].update(sum="1"),
         "'vector.op_cost.reduce.sum' must be a number"),
        (lambda d: d["vector"]["op_cost"].update(ternary={}), "unknown key 'vector.op_cost.ternary'"),
        (lambda d: d["energy"].pop("pj_per_acc_byte"), "missing key 'energy.pj_per_acc_byte'"),
    ],
)
def test_invalid_timing_keys(edit, message):
    d = _tiny_dict()
    edit(d)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_dict(d, "my.toml")


@pytest.mark.parametrize("name", ["tiny", "edge", "cloud"])
def test_presets_default_to_pipelined_weight_stationary(name):
    cfg = load_config(name)
    assert (cfg.matrix.mode, cfg.matrix.dataflow) == ("pipelined", "ws")
    text = (PRESET_DIR / f"{name}.toml").read_text()
    for key in ("mode", "dataflow", "min_interval_cycles", "packet_overhead_cycles", "engines", "engine_bytes_per_cycle",
                "per_descriptor_cycles", "access_cycles", "pj_per_acc_byte"):
        line = next(ln for ln in text.splitlines() if ln.startswith(key))
        assert "#" in line, f"{name}: '{key}' has no comment with its unit or source"
    # the config round-trips through a Program's JSON metadata
    assert from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


# ----------------------------------------------------------------------------- matrix


def fold_cycles(cfg: HardwareConfig, m: int, k: int, n: int, passes: int = 1) -> float:
    """One isolated matmul (one fold): SCALE-Sim's per-fold cycles."""
    R, C = cfg.matrix.rows, cfg.matrix.cols
    t = {"ws": m, "os": k, "is": n}[cfg.matrix.dataflow]
    if cfg.matrix.dataflow == "os":
        return R + C + t * passes - 2
    return 2 * R + C + t * passes - 2


@pytest.mark.parametrize("mode", ["pipelined", "compatible"])
@pytest.mark.parametrize("dataflow", ["ws", "os", "is"])
@pytest.mark.parametrize("dtype, passes", [(DType.BF16, 1), (DType.F32, 4)])
def test_single_matmul_is_one_fold(mode, dataflow, dtype, passes):
    cfg = with_matrix(TINY, mode=mode, dataflow=dataflow)
    for m, k, n in [(16, 16, 16), (7, 3, 5), (16, 1, 16), (9, 16, 2)]:
        r = timing(program(matmul(m, k, n, dtype)), cfg)
        assert r.cycles == fold_cycles(cfg, m, k, n, passes), (m, k, n)
        assert r.start[0] == 0 and r.end[0] == r.cycles


@pytest.mark.parametrize(
    "dataflow, mkn, message",
    [
        ("ws", (4, 17, 4), r"instruction 0 \(matrix MATMUL\): contraction K=17 exceeds the array's 16 rows$"),
        ("ws", (4, 4, 17), r"N=17 exceeds the array's 16 columns$"),
        ("os", (4, 4, 17), r"instruction 0 \(matrix MATMUL\): N=17 exceeds the array's 16 columns \(os dataflow\)"),
        ("is", (4, 17, 4), r"contraction K=17 exceeds the array's 16 rows \(is dataflow\)"),
    ],
)
def test_a_matmul_must_fit_the_array(dataflow, mkn, message):
    cfg = with_matrix(TINY, mode="compatible", dataflow=dataflow)
    with pytest.raises(SimulatorError, match=message):
        timing(program(matmul(*mkn)), cfg)


def test_output_stationary_fold_lays_m_on_rows():
    # OS puts M on the array's rows: M = 17 does not fit a 16-row array; K is streamed
    cfg = with_matrix(dataclasses.replace(TINY, accumulator=dataclasses.replace(
        TINY.accumulator, partitions=16)), dataflow="os")
    with pytest.raises(SimulatorError, match=r"M=17 exceeds the"):
        timing(program(matmul(17, 4, 4)), cfg)
    assert timing(program(matmul(16, 16, 16)), cfg).cycles == 16 + 16 + 16 - 2


def back_to_back(n: int, m: int, k: int = 16, cols: int = 16, dtype=DType.BF16) -> np.ndarray:
    return program(*[matmul(m, k, cols, dtype, flags=Flag.ACCUMULATE if i else 0) for i in range(n)])


@pytest.mark.parametrize("m", [1, 3, 16, 40, 200])
@pytest.mark.parametrize("dtype, passes", [(DType.BF16, 1), (DType.F32, 4)])
def test_pipelined_back_to_back_closed_form(m, dtype, passes):
    """n matmuls in a row: the first preload (R) and the last fill/drain (R + C - 2) are
    paid once; in between they issue every max(S', R) cycles, S' = max(M p, min ii)."""
    cfg = tall(TINY)
    R, C, ii = cfg.matrix.rows, cfg.matrix.cols, cfg.matrix.min_interval_cycles
    n = 9
    s = m * passes
    r = timing(back_to_back(n, m, dtype=dtype), cfg)
    assert r.cycles == R + (n - 1) * max(max(s, ii), R) + s + R + C - 2
    compatible = timing(back_to_back(n, m, dtype=dtype), with_matrix(cfg, mode="compatible"))
    assert compatible.cycles == n * (2 * R + C + s - 2)
    assert r.cycles < compatible.cycles
    macs = n * m * 16 * 16
    assert r.cycles >= macs * passes / (R * C)  # never above R*C MACs per cycle
    # the engine frees at each streaming start, before the result is ready
    assert np.all(r.start[1:] < r.end[:-1])
    assert np.all(np.diff(r.end) > 0)  # results in order


def test_dependants_see_the_result_ready_time():
    """The next matmul starts at the first's streaming start; a vector op waiting on the
    first's semaphore starts when its result is ready (streaming + fill/drain)."""
    cfg = TINY
    R, C = cfg.matrix.rows, cfg.matrix.cols
    stream = program(
        matmul(16, 16, 16, signal=0),
        matmul(16, 16, 16),
        vector(Opcode.VEC_UNARY, UnaryFn.RELU, 16, 16, a_mem=Mem.ACC, wait=[(0, 1)]),
    )
    r = timing(stream, cfg)
    assert r.start[1] == R  # the engine freed when matmul 0 started streaming
    assert r.end[0] == R + 16 + R + C - 2
    assert r.start[2] == r.end[0]
    assert r.stalls["vector"]["semaphore"] == r.end[0]


def test_1024_cubed_on_128x128_weight_stationary():
    r = gemm(1024, 1024, 1024, "cloud", rows=128, cols=128, dataflow="ws", mode="compatible")
    assert r["compute_cycles"] == 89_983 and r["folds"] == 64
    assert r["utilization"] == pytest.approx(1024**3 / (128 * 128 * 89_983) * 100)
    assert r["wall_seconds"] < 1.0
    p = gemm(1024, 1024, 1024, "cloud", rows=128, cols=128, dataflow="ws", mode="pipelined")
    assert p["compute_cycles"] == 128 + 64 * 1024 + 128 + 128 - 2  # 65,918
    assert 65_536 <= p["compute_cycles"] < r["compute_cycles"]


def _scalesim_csv() -> Path | None:
    here = Path(__file__).resolve()
    for base in (here.parents[2] / "shared", here.parents[1] / "../shared"):
        path = base / "data" / "scalesim_gemm.csv"
        if path.exists():
            return path
    return None


def _scalesim_rows() -> list[Any]:
    path = _scalesim_csv()
    if path is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason="shared/data/scalesim_gemm.csv not found"))]
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    return [pytest.param(r, id=f"{r['M']}x{r['N']}x{r['K']}-{r['rows']}x{r['cols']}-{r['dataflow']}") for r in rows]


@pytest.mark.parametrize("row", _scalesim_rows())
def test_compatible_mode_reproduces_scalesim(row):
    # SCALE-Sim's topology columns are M, N, K
    r = gemm(int(row["M"]), int(row["N"]), int(row["K"]), "tiny", rows=int(row["rows"]),
             cols=int(row["cols"]), dataflow=row["dataflow"], mode="compatible")
    assert r["compute_cycles"] == int(row["compute_cycles"])
    printed = row["utilization_percent"]  # as SCALE-Sim rounded it
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    assert r["utilization"] == pytest.approx(float(printed), abs=0.5 * 10**-decimals + 1e-9)


def test_gemm_api():
    r = gemm(100, 70, 50, "tiny")
    assert {"compute_cycles", "utilization", "folds", "macs", "wall_seconds", "mode", "dataflow",
            "rows", "cols"} <= set(r)
    assert (r["mode"], r["dataflow"], r["rows"], r["cols"]) == ("pipelined", "ws", 16, 16)
    assert r["folds"] == math.ceil(50 / 16) * math.ceil(70 / 16) and r["macs"] == 100 * 70 * 50
    assert r["compute_cycles"] >= r["roofline_cycles"]
    fp32 = gemm(100, 70, 50, "tiny", dtype="f32")
    assert fp32["compute_cycles"] > r["compute_cycles"] and fp32["compute_cycles"] >= fp32["roofline_cycles"]
    for flow in ("os", "is"):
        for mode in ("compatible", "pipelined"):
            g = gemm(100, 70, 50, load_config("tiny"), dataflow=flow, mode=mode)
            assert g["compute_cycles"] >= g["roofline_cycles"]
    with pytest.raises(ConfigError, match="dataflow 'xs' is not allowed"):
        gemm(4, 4, 4, "tiny", dataflow="xs")
    with pytest.raises(ConfigError, match="mode 'turbo' is not allowed"):
        gemm(4, 4, 4, "tiny", mode="turbo")
    with pytest.raises(ConfigError, match="M must be a positive integer, got 0"):
        gemm(0, 4, 4, "tiny")
    with pytest.raises(ConfigError, match="dtype 'int4' is not allowed"):
        gemm(4, 4, 4, "tiny", dtype="int4")


# ----------------------------------------------------------------------------- DMA


def dma_alone(cfg: HardwareConfig, rows: int, cols: int, isz: int, pattern: str = "contiguous") -> float:
    """A DMA alone, by hand: its descriptors and contiguous bytes per partition (chunk)
    by access pattern, its rate the engines it spans, each moving a packet of `chunk`
    bytes in ``packet_overhead_cycles + chunk / engine_bytes_per_cycle``, at most the
    HBM peak."""
    descriptors, chunk = {"contiguous": (rows, cols * isz), "transpose": (cols, rows * isz),
                          "strided": (rows * cols, isz)}[pattern]
    engines = min(cfg.dma.engines, rows)
    packet = cfg.dma.packet_overhead_cycles + chunk / cfg.dma.engine_bytes_per_cycle
    rate = min(cfg.hbm.bytes_per_cycle, engines * chunk / packet)
    return (cfg.dma.latency_cycles + cfg.hbm.latency_cycles + descriptors * cfg.dma.per_descriptor_cycles
            + rows * cols * isz / rate)


@pytest.mark.parametrize("preset", ["tiny", "edge", "cloud"])
def test_dma_closed_form(preset):
    cfg = load_config(preset)
    P = cfg.sram.partitions
    for rows, cols, dtype in [(P, 1000, DType.BF16), (3, 7, DType.F32), (1, 4096, DType.BF16)]:
        isz = isa.ITEMSIZE[dtype]
        r = timing(program(load(rows, cols, dtype)), cfg)
        assert r.cycles == pytest.approx(dma_alone(cfg, rows, cols, isz))
        # the same tile read from a transposed view (row stride 1, column stride > 1): a
        # DMA transpose for a 2-byte dtype (one descriptor per column), else one per element
        t = timing(program(load(rows, cols, dtype, cs=max(rows, 2), rs=1)), cfg)
        pattern = "transpose" if isz == 2 else "strided"
        assert t.cycles == pytest.approx(dma_alone(cfg, rows, cols, isz, pattern))
        assert t.cycles > r.cycles


def test_short_chunks_are_slow():
    # 2 engines of 19.2 B/cycle, 0.6666 cycles per packet, HBM 32 B/cycle
    cfg = TINY
    contiguous = timing(program(load(16, 64))).cycles  # 128-byte rows: at the HBM peak
    short = timing(program(load(16, 16))).cycles  # 32-byte rows: the packet rate limits
    fixed = cfg.dma.latency_cycles + cfg.hbm.latency_cycles + 16 * cfg.dma.per_descriptor_cycles
    assert contiguous - fixed == pytest.approx(16 * 128 / 32)  # 2 x 19.2 x 128 / 140.8 = 34.9 > 32
    # 16 packets of 32 B over 2 engines: 8 each of 0.6666 + 32 / 19.2 cycles (27.4 B/cycle)
    assert short - fixed == pytest.approx(8 * (0.6666 + 32 / 19.2))
    # bf16 read from a transposed view: a DMA transpose, one 32-byte column run per
    # descriptor (64 of them); an element-strided view: 1024 descriptors of 2 bytes
    transpose = timing(program(load(16, 64, cs=16, rs=1))).cycles
    strided = timing(program(load(16, 64, cs=16, rs=2))).cycles
    base = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
    assert transpose == pytest.approx(base + 64 * 1.0 + 32 * (0.6666 + 32 / 19.2))  # 32 packets per engine
    assert strided == pytest.approx(base + 1024 * 1.0 + 512 * (0.6666 + 2 / 19.2))  # 512 2-byte packets per engine
    assert contiguous < transpose < strided / 4


def test_two_concurrent_dmas_take_twice_as_long():
    one = timing(program(load(16, 2048, queue=0))).cycles
    both = timing(program(load(16, 2048, queue=0), load(16, 2048, queue=1)))
    fixed = TINY.dma.latency_cycles + TINY.hbm.latency_cycles + 16 * TINY.dma.per_descriptor_cycles
    assert both.cycles - fixed == pytest.approx(2 * (one - fixed))
    assert both.end[0] == both.end[1]
    assert both.stalls["dma0"]["hbm_bandwidth"] == pytest.approx(one - fixed)
    assert both.engine_busy["hbm"] == pytest.approx(2 * (one - fixed))


def test_finish_times_are_recomputed_on_every_join_and_leave():
    """Three transfers of alone-times 100, 200, 300 joining at 0, 30, 60 (after fixed
    parts made equal): shares 1, 1/2, 1/3 as they come and go."""
    # engines as fast as HBM and no packet overhead, so that even the 1-row transfer runs
    # at the HBM peak alone
    # and every transfer in flight gets 1/n (n full-rate transfers)
    cfg = dataclasses.replace(
        tall(TINY), dma=dataclasses.replace(TINY.dma, queues=3, latency_cycles=0, per_descriptor_cycles=1.0,
                                            engine_bytes_per_cycle=TINY.hbm.bytes_per_cycle,
                                            packet_overhead_cycles=0.0),
        hbm=dataclasses.replace(TINY.hbm, latency_cycles=0),
    )
    bpc = cfg.hbm.bytes_per_cycle
    # fixed parts of 1, 31 and 61 cycles (one descriptor per row), efficient rows
    s = program(load(1, 1600, queue=0), load(31, 208, queue=1), load(61, 160, queue=2))
    r = timing(s, cfg)
    joins = [1.0, 31.0, 61.0]
    alone = [1600 * 2 / bpc, 31 * 208 * 2 / bpc, 61 * 160 * 2 / bpc]
    # reference: step the shares
    t, left, ends, active = 0.0, dict(enumerate(alone)), {}, []
    events = sorted(zip(joins, range(3)))
    while len(ends) < 3:
        n = len(active)
        nxt_finish = min((t + left[i] * n, i) for i in active) if active else (math.inf, -1)
        nxt_join = events[0] if events else (math.inf, -1)
        t_next = min(nxt_finish[0], nxt_join[0])
        for i in active:
            left[i] -= (t_next - t) / n
        t = t_next
        if nxt_join[0] < nxt_finish[0]:
            active.append(events.pop(0)[1])
        else:
            ends[nxt_finish[1]] = t
            active.remove(nxt_finish[1])
    for i in range(3):
        assert r.end[i] == pytest.approx(ends[i])
    # work-conserving: HBM busy from the first join to the last end
    assert r.cycles == pytest.approx(1.0 + sum(alone))
    assert r.engine_busy["hbm"] == pytest.approx(sum(alone))
    assert (r.hbm_bytes_read / r.engine_busy["hbm"]) <= cfg.hbm.bytes_per_cycle * (1 + 1e-9)


# ----------------------------------------------------------------------------- vector


def test_vector_cost_table():
    d = _tiny_dict()
    d["vector"]["op_cost"]["unary"]["exp"] = 7
    d["vector"]["op_cost"]["binary"]["mul"] = 3
    d["vector"]["op_cost"]["reduce"]["max"] = 2
    cfg = from_dict(d)
    base = cfg.vector.latency_cycles + cfg.vector.access_cycles
    groups = math.ceil(16 * 40 / cfg.vector.lanes)
    cases = [
        (vector(Opcode.VEC_UNARY, UnaryFn.EXP, 16, 40), base + groups * 7),
        (vector(Opcode.VEC_UNARY, UnaryFn.RELU, 16, 40), base + groups * 1),
        (vector(Opcode.VEC_BINARY, BinaryFn.MUL, 16, 40, b_part=0), base + groups * 3 * 2),
        (vector(Opcode.VEC_BINARY, BinaryFn.MUL, 16, 40, flags=Flag.B_COLUMN), base + groups * 3),
        (vector(Opcode.VEC_BINARY, BinaryFn.MUL, 16, 40, flags=Flag.B_IMM, imm=2.0), base + groups * 3),
        (vector(Opcode.VEC_REDUCE, ReduceFn.MAX, 16, 40), base + groups * 2),
        (vector(Opcode.VEC_REDUCE, ReduceFn.SUM, 16, 40), base + groups * 1),
    ]
    for instr, cycles in cases:
        assert timing(program(instr), cfg).cycles == cycles, instr


# ----------------------------------------------------------------------------- stalls, energy, report


def test_energy_by_hand():
    cfg = TINY
    stream = program(
        load(16, 64, signal=0),  # 2 KiB HBM -> SRAM
        matmul(16, 16, 16, wait=[(0, 1)], signal=1),  # bf16: 4096 MACs
        matmul(8, 16, 16, DType.F32, flags=Flag.ACCUMULATE, o_part=0, signal=1),  # fp32: 2048 MACs
        store(16, 16, DType.F32, a_mem=Mem.ACC, wait=[(1, 2)], queue=1),  # 1 KiB ACC -> HBM
    )
    r = timing(stream, cfg)
    assert r.macs == 4096 + 2048 and r.macs_fp32 == 2048
    sram = 2048 + (16 * 16 * 2) * 2 + (16 * 8 * 4 + 16 * 16 * 4)  # DMA write, operands
    acc = 16 * 16 * 4 + 2 * 8 * 16 * 4 + 16 * 16 * 4  # mm writes (accumulate: read+write), store read
    assert r.acc_bytes == acc and r.sram_bytes == sram + acc
    assert (r.hbm_bytes_read, r.hbm_bytes_written) == (2048, 1024)
    e = energy.from_result(r, cfg)
    pj = cfg.energy
    seconds = r.cycles / (cfg.clock_ghz * 1e9)
    dynamic = (4096 * pj.pj_per_mac_bf16 + 2048 * pj.pj_per_mac_fp32 + sram * pj.pj_per_sram_byte
               + acc * pj.pj_per_acc_byte + 3072 * pj.pj_per_hbm_byte)
    static = pj.static_watts * seconds * 1e12
    assert e.total_pj == pytest.approx(dynamic + static)
    assert e.joules == pytest.approx((dynamic + static) * 1e-12)
    assert e.watts == pytest.approx(e.joules / seconds)
    assert e.tops_per_watt == pytest.approx(2 * 6144 / e.joules / 1e12)


def test_stalls_and_report():
    stream = program(
        load(16, 1024, queue=0, signal=0),
        load(16, 1024, queue=1, signal=1),
        matmul(16, 16, 16, wait=[(0, 1), (1, 1)], signal=2),
        vector(Opcode.VEC_UNARY, UnaryFn.EXP, 16, 16, a_mem=Mem.ACC, wait=[(2, 1)], signal=3),
        store(16, 16, DType.F32, wait=[(3, 1)]),
    )
    r = timing(stream)
    assert r.stalls["matrix"]["semaphore"] == r.start[2] == max(r.end[:2])
    assert r.stalls["vector"]["semaphore"] == r.start[3] == r.end[2]
    assert r.stalls["dma0"]["semaphore"] == r.start[4] - r.end[0]
    assert r.stalls["dma0"]["hbm_bandwidth"] > 0 and r.stalls["dma1"]["hbm_bandwidth"] > 0
    work = {**stream_work(stream, TINY), "compulsory_hbm_bytes": 2 * 16 * 1024 * 2, **program_work(stream, TINY)}
    rep = make_report(r, work, TINY, 0.01)
    assert rep.cycles == r.cycles and rep.roofline_ratio >= 1
    assert rep.bytes_moved["hbm_read"] == 2 * 16 * 1024 * 2 and rep.bytes_moved["accumulator"] == r.acc_bytes
    assert rep.energy["tops_per_watt"] > 0 and rep.stalls["matrix"]["semaphore"] > 0
    text = str(rep)
    assert "stall cycles" in text and "TOPS/W" in text and "roofline ratio" in text
    assert len(text.splitlines()) <= 14
    d = rep.to_dict()
    assert json.loads(json.dumps(d)) == d


# ----------------------------------------------------------------------------- random programs


@st.composite
def random_programs(draw, queues: int = 2):
    """Deadlock-free programs (waits only on signals sent earlier in program order, in
    the same kernel) mixing every engine, contiguous and strided DMAs, both dtypes."""
    instrs, signalled = [], {}
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["load", "store", "matmul", "matmul", "unary", "binary", "reduce", "barrier"]))
        if kind == "barrier":
            instrs.append(barrier())
            signalled = {}
            continue
        rows, cols = draw(st.integers(1, 16)), draw(st.integers(1, 64))
        dtype = draw(st.sampled_from([DType.F32, DType.BF16]))
        if kind == "load":
            strided = draw(st.booleans())
            instr = load(rows, cols, dtype, queue=draw(st.integers(0, queues - 1)),
                         cs=(rows if strided else 1), rs=(1 if strided else None))
        elif kind == "store":
            instr = store(rows, min(cols, 16), dtype, queue=draw(st.integers(0, queues - 1)))
        elif kind == "matmul":
            instr = matmul(rows, draw(st.integers(1, 16)), min(cols, 16), dtype)
        elif kind == "unary":
            instr = vector(Opcode.VEC_UNARY, draw(st.sampled_from(list(UnaryFn))), rows, cols)
        elif kind == "binary":
            flags = draw(st.sampled_from([0, Flag.B_COLUMN, Flag.B_IMM]))
            instr = vector(Opcode.VEC_BINARY, draw(st.sampled_from(list(BinaryFn))), rows, cols, flags=flags)
        else:
            instr = vector(Opcode.VEC_REDUCE, draw(st.sampled_from(list(ReduceFn))), rows, cols)
        sems = sorted(signalled)
        waits = draw(st.lists(st.sampled_from(sems), max_size=isa.MAX_WAITS, unique=True)) if sems else []
        instr["wait"] = [(w, draw(st.integers(1, signalled[w]))) for w in waits]
        sig = draw(st.integers(-1, 5))
        if sig >= 0:
            instr["signal"] = sig
            signalled[sig] = signalled.get(sig, 0) + 1
        instrs.append(instr)
    return program(*instrs)


@pytest.mark.parametrize("mode", ["pipelined", "compatible"])
@settings(max_examples=80, deadline=None)
@given(stream=random_programs())
def test_cycles_never_beat_the_roofline(mode, stream):
    cfg = with_matrix(TINY, mode=mode)
    r = timing(stream, cfg)
    work = stream_work(stream, cfg)
    bound = roofline({**work, "compulsory_hbm_bytes": work["hbm_bytes"]}, cfg)
    assert r.cycles >= max(bound.values()) * (1 - 1e-12)
    assert r.hbm_bytes_read + r.hbm_bytes_written <= cfg.hbm.bytes_per_cycle * r.engine_busy["hbm"] * (1 + 1e-9)
    for name, busy in r.engine_busy.items():
        assert busy <= r.cycles * (1 + 1e-12), name
    for reasons in r.stalls.values():
        assert all(v >= -1e-9 for v in reasons.values())


@pytest.mark.parametrize("mode", ["pipelined", "compatible"])
@settings(max_examples=80, deadline=None)
@given(stream=random_programs())
def test_dataflow_scheduler_equals_the_event_simulation(mode, stream):
    """The heap-free dataflow schedule gives the general event simulation's times and
    totals bit for bit."""
    prog = decode.DecodedProgram(stream, with_matrix(TINY, mode=mode))
    fast, slow = scheduler.schedule(prog), scheduler.schedule(prog, general=True)
    assert np.array_equal(fast.start, slow.start) and np.array_equal(fast.end, slow.end)
    assert fast.busy == slow.busy and fast.semaphore_stall == slow.semaphore_stall
    assert fast.hbm_stall == slow.hbm_stall and fast.hbm_busy == slow.hbm_busy
    assert fast.finish == slow.finish


@settings(max_examples=60, deadline=None)
@given(stream=random_programs(queues=4))
def test_schedulers_agree_with_four_queues_on_two_engines(stream):
    """Four queues over tiny's two DMA engines: transfers in flight are slowed by the
    engines' sum as often as by HBM's; both algorithms still agree bit for bit."""
    cfg = dataclasses.replace(TINY, dma=dataclasses.replace(TINY.dma, queues=4))
    prog = decode.DecodedProgram(stream, cfg)
    fast, slow = scheduler.schedule(prog), scheduler.schedule(prog, general=True)
    assert np.array_equal(fast.start, slow.start) and np.array_equal(fast.end, slow.end)
    assert fast.hbm_stall == slow.hbm_stall and fast.hbm_busy == slow.hbm_busy
    assert fast.finish == slow.finish


def test_multi_engine_semaphores_use_the_event_simulation():
    # semaphore 0 signalled from two queues: the v-th signal is the v-th completion in
    # time, not in program order
    slow, fast = load(16, 1000, queue=0, signal=0), load(1, 4, queue=1, signal=0)
    stream = program(slow, fast, matmul(1, 1, 1, wait=[(0, 1)]), matmul(1, 1, 1, wait=[(0, 2)]))
    r = timing(stream)
    assert r.start[2] == r.end[1] < r.end[0]
    assert r.start[3] >= r.end[0]


# ----------------------------------------------------------------------------- record=False


def long_stream(kernels: int) -> np.ndarray:
    """A double-buffered GEMM pipeline: per kernel, load A^T and B tiles on two queues,
    accumulate 4 matmuls, apply gelu, store."""
    one = []
    for step in range(4):
        one += [
            load(16, 16, cs=16, rs=1, queue=0, signal=0),
            load(16, 16, queue=1, signal=1),
            matmul(16, 16, 16, wait=[(0, step + 1), (1, step + 1)], signal=2,
                   flags=Flag.ACCUMULATE if step else 0),
        ]
    one += [
        vector(Opcode.VEC_UNARY, UnaryFn.GELU, 16, 16, a_mem=Mem.ACC, wait=[(2, 4)], signal=3),
        store(16, 16, DType.F32, wait=[(3, 1)], queue=1),
        barrier(),
    ]
    return np.concatenate([program(*one)] * kernels)


def test_record_false_matches_record_true(monkeypatch):
    monkeypatch.setattr(machine, "_CHUNK", 100)  # many chunks
    stream = long_stream(40)
    full = timing(stream)
    lean = timing(stream, record=False)
    assert lean.start is None and lean.end is None
    assert lean.cycles == pytest.approx(full.cycles)
    for key in ("instructions", "hbm_bytes_read", "hbm_bytes_written", "sram_bytes", "acc_bytes",
                "macs", "macs_fp32", "vector_elements", "kernels", "instructions_by_engine"):
        assert getattr(lean, key) == getattr(full, key), key
    for name in full.engine_busy:
        assert lean.engine_busy[name] == pytest.approx(full.engine_busy[name]), name
    for e in full.stalls:
        for k in full.stalls[e]:
            assert lean.stalls[e][k] == pytest.approx(full.stalls[e][k], abs=1e-6), (e, k)


def test_record_false_errors_name_global_indices(monkeypatch):
    monkeypatch.setattr(machine, "_CHUNK", 50)
    stream = long_stream(10)
    n = len(stream)
    bad = stream.copy()
    bad[n - 3]["wait_val"][0] = 5  # the gelu of the last kernel waits for a 5th matmul
    with pytest.raises(DeadlockError, match=rf"deadlock in kernel 9 at cycle .*instruction {n - 3} \(VEC_UNARY\)"):
        timing(bad, record=False)
    with pytest.raises(DeadlockError, match=rf"instruction {n - 3} \(VEC_UNARY\)"):
        timing(bad)
    oob = stream.copy()
    oob[n - 2]["a_part"] = 15
    with pytest.raises(MemoryAccessError, match=rf"instruction {n - 2} \(dma1 DMA_STORE\)"):
        timing(oob, record=False)


def test_deadlock_and_semaphore_order_still_hold():
    stream = program(
        load(4, 4, signal=1, wait=[(2, 1)]),
        matmul(4, 4, 4, wait=[(1, 1)], signal=2),
    )
    with pytest.raises(DeadlockError, match="dma0 blocked at instruction 0 .*semaphore 2 >= 1 \\(value 0\\)"):
        timing(stream)
    ok = program(load(4, 4, signal=1), matmul(4, 4, 4, wait=[(1, 1)], signal=2),
                 vector(Opcode.VEC_UNARY, UnaryFn.RELU, 4, 4, a_mem=Mem.ACC, wait=[(2, 1)]))
    r = timing(ok)
    assert r.start[1] == r.end[0] and r.start[2] == r.end[1]
