"""One set of timing rules (`simulator.timing`): the machine charges them, the estimators follow them.

(a) For one instruction of every kind (a DMA load contiguous and strided, a store, a
gather; a matmul per dataflow, mode and operand type; a vector op of each arity), the
cycles the simulator charges equal the closed forms of `TimingRules` evaluated on Python
numbers, bit for bit, on tiny and cloud.

(b) The estimators that predict simulated time, against the simulator on a sample of
kernels of every family. Measured agreement (estimate / simulated cycles) and the
tolerance held here:

- matmul cost model (`passes/schedule/cost_model.py`, the chosen schedule's estimate vs
  the kernel alone, timing-only): 0.91 to 1.20 on the sample; held: 0.85 to 1.30.
- tile-DSL list scheduler (`frontend/dsl/schedule.py`, straight-line kernels): exact on
  tiny (flash attention, one-tile gemm+gelu, softmax, mlp); cloud flash attention 1.061
  (S = 512) and 1.021 (S = 2048); 1.034 and 1.005 before the DMA rules followed the NKI
  guidance. The sharing rule is followed exactly (every transfer here spans all 16
  engines, so n of them get 1/n each); the list schedule's own error on this DMA-heavy
  kernel moves with the DMA parameters: 1.02 to 1.09 at S = 512 over the variants
  tried (1200 or 2280 latency cycles, 512 or 4096 B efficient chunk under the former
  linear chunk rule, engines as fast as HBM). Held: exact (rel 1e-9) on tiny, 7 % on cloud.
- elementwise kernel model (`passes/graph_to_tile/elementwise/`, the "estimated N
  cycles" remark vs the kernel's simulated span): 0.55 to 1.49 (a coarse model that
  only ranks tile sizes: it underestimates multi-input kernels that share HBM, and
  overestimates small single-tile ones); held: 0.5 to 2.
- attention list-scheduler replay (`passes/graph_to_tile/attention/`, `kernel_estimate`):
  exact (rel 1e-9) for a kernel of one loop body (one batch); 1.016 with two batches
  (the replay follows one body); held: rel 1e-9 and 3 %.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tilecc
from tilecc.frontend.dsl.lower import build_module
from tilecc.frontend.dsl.schedule import schedule_kernel
from tilecc.frontend.dsl.work import kernel_work
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.passes.graph_to_tile import attention as la
from tilecc.passes.registry import default_pipeline
from tilecc.passes.schedule import cost_model
from tilecc.passes.schedule.matmul_schedule import MatmulProblem
from tilecc.passes.schedule.matmul_tuning import kernel_alone
from tilecc.passes.session import CompileSession
from tilecc.runtime import kernel as api
from tilecc.runtime.compiler import measure_program
from tilecc.simulator import isa
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.isa import BinaryFn, DType, Flag, Mem, Opcode, ReduceFn, UnaryFn
from tilecc.simulator.machine import simulate
from tilecc.simulator.timing import TimingRules, core_cycles_per, matmul_mapping

KERNELS = Path(__file__).resolve().parent.parent / "examples" / "kernels"
TARGETS = ("tiny", "cloud")


def _config(target: str, **matrix: Any) -> HardwareConfig:
    cfg = load_config(target)
    return dataclasses.replace(cfg, matrix=dataclasses.replace(cfg.matrix, **matrix)) if matrix else cfg


_stream = isa.stream_of


def _charged(stream: np.ndarray, cfg: HardwareConfig) -> tuple[np.ndarray, np.ndarray]:
    r = simulate(stream, cfg, None, functional=False)
    assert r.start is not None and r.end is not None
    return r.start, r.end


# ----------------------------------------------------------------------------- (a) one instruction


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "opcode, cs, dtype",
    [(Opcode.DMA_LOAD, 1, DType.BF16), (Opcode.DMA_LOAD, 3, DType.F32), (Opcode.DMA_STORE, 1, DType.F32),
     (Opcode.DMA_STORE, 2, DType.BF16), (Opcode.DMA_GATHER, 1, DType.BF16)],
)
def test_one_dma_costs_its_closed_form(target: str, opcode: Opcode, cs: int, dtype: DType) -> None:
    cfg = _config(target)
    rules = TimingRules(cfg)
    rows, cols = 7, 40
    isz = isa.ITEMSIZE[dtype]
    fields: dict[str, Any] = dict(opcode=opcode, queue=1, a_dtype=dtype, o_dtype=dtype, rows=rows, cols=cols,
                                  hbm_rs=cols * cs, hbm_cs=cs)
    if opcode == Opcode.DMA_LOAD:
        fields.update(a_mem=Mem.HBM, o_mem=Mem.SRAM)
    elif opcode == Opcode.DMA_STORE:
        fields.update(a_mem=Mem.SRAM, o_mem=Mem.HBM)
    else:  # a gather: `rows` indexed rows of a 50-row table, `cols` contiguous elements each
        fields.update(a_mem=Mem.HBM, hbm_rs=cols, hbm_cs=0, k=50, b_mem=Mem.SRAM, b_dtype=DType.I32,
                      b_addr=1024, o_mem=Mem.SRAM)
    start, end = _charged(_stream(fields), cfg)
    contiguous = cs == 1
    fixed = rules.dma_fixed(rules.dma_descriptors(rows, cols, contiguous))
    want = fixed + rules.dma_transfer(rows, cols, isz, contiguous)
    assert start[0] == 0.0 and end[0] == want == rules.dma_time(rows, cols, isz, contiguous)
    if not contiguous:  # one descriptor and one itemsize-byte chunk per element
        assert fixed == rules.dma_fixed0 + rows * cols * cfg.dma.per_descriptor_cycles


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", ["pipelined", "compatible"])
@pytest.mark.parametrize("dataflow", ["ws", "os", "is"])
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F32])
def test_matmuls_cost_their_closed_forms(target: str, mode: str, dataflow: str, dtype: DType) -> None:
    """Two equal matmuls back to back: the first's result after the latency ``L + S + D``,
    the second's one issue interval later (``max(L, S')`` pipelined, ``L + S + D``
    compatible)."""
    cfg = _config(target, mode=mode, dataflow=dataflow)
    rules = TimingRules(cfg)
    m, k, n = 5, 7, 9
    mm = dict(opcode=Opcode.MATMUL, rows=m, cols=n, k=k, a_mem=Mem.SRAM, a_dtype=dtype, b_mem=Mem.SRAM,
              b_dtype=dtype, b_addr=512, o_mem=Mem.ACC, o_dtype=DType.F32)
    _, end = _charged(_stream(mm, mm), cfg)
    stream = rules.matmul_stream(m, k, n, dtype == DType.F32)
    assert stream == float({"ws": m, "os": k, "is": n}[dataflow] * (cfg.matrix.fp32_slowdown if dtype == DType.F32 else 1))
    assert matmul_mapping(cfg, m, k, n)[2] == {"ws": m, "os": k, "is": n}[dataflow]
    assert end[0] == rules.matmul_latency(stream)
    assert end[1] - end[0] == rules.matmul_interval(stream)


_VECTOR = [
    (Opcode.VEC_UNARY, UnaryFn.EXP, 0, "unary", "exp", 1),
    (Opcode.VEC_BINARY, BinaryFn.ADD, 0, "binary", "add", 2),  # a tile second operand
    (Opcode.VEC_BINARY, BinaryFn.MUL, int(Flag.B_COLUMN), "binary", "mul", 1),
    (Opcode.VEC_BINARY, BinaryFn.SUB, int(Flag.B_IMM), "binary", "sub", 1),
    (Opcode.VEC_REDUCE, ReduceFn.MAX, 0, "reduce", "max", 1),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("opcode, func, flags, kind, name, inputs", _VECTOR)
def test_one_vector_op_costs_its_closed_form(
    target: str, opcode: Opcode, func: int, flags: int, kind: str, name: str, inputs: int
) -> None:
    cfg = _config(target)
    rules = TimingRules(cfg)
    rows, cols = 6, 77
    op = dict(opcode=opcode, func=func, flags=flags, rows=rows, cols=cols, a_mem=Mem.SRAM, a_dtype=DType.F32,
              b_mem=Mem.SRAM, b_dtype=DType.F32, b_addr=2048, o_mem=Mem.SRAM, o_dtype=DType.F32, o_addr=4096)
    if flags & Flag.B_IMM:
        op.update(b_mem=0, b_dtype=0, b_addr=0, imm=0.5)
    _, end = _charged(_stream(op), cfg)
    cost = rules.vector_op_cost(kind, name)
    assert end[0] == rules.vector_time(rows, cols, cost, inputs)
    # the lane rule: ceil(partitions / lanes) * columns groups, in vector cycles converted to core cycles
    per = core_cycles_per(cfg, "vector")
    assert end[0] == rules.vector_overhead + -(-rows // cfg.vector.lanes) * cols * cost * inputs * per


def _exp_on(cfg: HardwareConfig, partitions: int, cols: int, fn: UnaryFn = UnaryFn.EXP) -> float:
    """Simulated cycles of one unary vector instruction over `partitions` x `cols` (SRAM, f32)."""
    op = dict(opcode=Opcode.VEC_UNARY, func=fn, rows=partitions, cols=cols, a_mem=Mem.SRAM, a_dtype=DType.F32,
              o_mem=Mem.SRAM, o_dtype=DType.F32, o_addr=4096)
    return float(_charged(_stream(op), cfg)[1][0])


@pytest.mark.parametrize(
    "target, lanes, partitions, want",
    [
        # cloud: 128 lanes, exp costs 1 VectorE cycle, overhead 16 + 60 VectorE cycles,
        # 2.4 / 0.96 = 2.5 core cycles per VectorE cycle: (76 + 1 * 64 * 1) * 2.5
        ("cloud", None, 1, 350.0),
        ("cloud", None, 32, 350.0),
        ("cloud", None, 128, 350.0),
        # tiny: 16 lanes (and 16 partitions), exp costs 4, overhead 8 + 8, one clock: 16 + 1 * 64 * 4
        ("tiny", None, 1, 272.0),
        ("tiny", None, 8, 272.0),
        ("tiny", None, 16, 272.0),
        # tiny with 8 lanes: 16 partitions take two passes over the lanes, 16 + 2 * 64 * 4
        ("tiny", 8, 1, 272.0),
        ("tiny", 8, 8, 272.0),
        ("tiny", 8, 16, 528.0),
    ],
)
def test_the_lane_rule_one_lane_per_partition(target: str, lanes: int | None, partitions: int, want: float) -> None:
    """A tile on p partitions runs on ceil(p / lanes) passes of the lanes, whatever p
    leaves idle: 1 partition costs what `lanes` partitions cost (per element, `lanes`
    times slower)."""
    cfg = _config(target)
    if lanes is not None:
        cfg = dataclasses.replace(cfg, vector=dataclasses.replace(cfg.vector, lanes=lanes))
    assert _exp_on(cfg, partitions, 64) == want
    assert TimingRules(cfg).vector_time(partitions, 64, cfg.vector.op_cost.unary["exp"]) == want


def test_the_lane_rule_beyond_the_lanes() -> None:
    """The rule itself for more partitions than lanes (tiny has as many of each), by hand:
    32 partitions on 16 lanes are 2 passes: 16 + 2 * 64 * 4; 33 are 3."""
    rules = TimingRules(load_config("tiny"))
    assert rules.vector_groups(32, 64) == 128
    assert rules.vector_time(32, 64, 4.0) == 528.0
    assert rules.vector_time(33, 64, 4.0) == 784.0
    assert rules.vector_time(1, 64, 1.0, inputs=2) == 16.0 + 128.0


def _clocks(target: str, matrix: float | None = None, vector: float | None = None) -> HardwareConfig:
    cfg = load_config(target)
    if matrix is not None:
        cfg = dataclasses.replace(cfg, matrix=dataclasses.replace(cfg.matrix, clock_ghz=matrix))
    if vector is not None:
        cfg = dataclasses.replace(cfg, vector=dataclasses.replace(cfg.vector, clock_ghz=vector))
    return cfg


def test_vector_clock_scales_vector_time_exactly() -> None:
    """cloud exp over 128 x 64: (76 + 64) VectorE cycles; at 0.96 GHz (2.5 core cycles
    each at 2.4 GHz) 350, at 0.48 GHz (5.0) 700, at 1.2 GHz (2.0) 280, at the core clock 140."""
    assert _exp_on(_clocks("cloud"), 128, 64) == 350.0
    assert _exp_on(_clocks("cloud", vector=0.48), 128, 64) == 700.0
    assert _exp_on(_clocks("cloud", vector=1.2), 128, 64) == 280.0
    assert _exp_on(_clocks("cloud", vector=2.4), 128, 64) == 140.0


def test_matrix_time_is_independent_of_the_vector_clock_and_scales_with_its_own() -> None:
    """A compatible-mode cloud matmul (WS, M = 5) holds the array 2R + C - 2 + M = 387
    TensorE cycles: 387 core cycles at 2.4 GHz whatever the vector clock, 774 at 1.2 GHz."""
    mm = dict(opcode=Opcode.MATMUL, rows=5, cols=9, k=7, a_mem=Mem.SRAM, a_dtype=DType.BF16, b_mem=Mem.SRAM,
              b_dtype=DType.BF16, b_addr=512, o_mem=Mem.ACC, o_dtype=DType.F32)

    def matmul_end(**clocks: float) -> float:
        cfg = _clocks("cloud", **clocks)
        cfg = dataclasses.replace(cfg, matrix=dataclasses.replace(cfg.matrix, mode="compatible"))
        return float(_charged(_stream(mm), cfg)[1][0])

    assert matmul_end() == matmul_end(vector=0.3) == 387.0
    assert matmul_end(matrix=1.2) == 774.0
    assert matmul_end(matrix=1.2, vector=0.3) == 774.0
    # pipelined at 1.2 GHz: L = R = 128, S' = max(M, 4) = 5, D = R + C - 2 = 254 TensorE
    # cycles, 2 core cycles each; with M = 1 the 4-cycle minimum interval holds
    rules = TimingRules(_clocks("cloud", matrix=1.2))
    assert (rules.preload, rules.matmul_streaming(rules.matmul_stream(5, 7, 9, False)), rules.drain) == (256.0, 10.0,
                                                                                                        508.0)
    assert rules.matmul_streaming(rules.matmul_stream(1, 7, 9, False)) == 8.0  # min interval 4 TensorE cycles


def test_odd_clocks_keep_the_machine_and_the_rules_equal() -> None:
    """With clocks whose ratios are not whole numbers the machine still charges the rules
    bit for bit (tiny at 1 GHz, matrix 0.7 GHz, vector 0.45 GHz)."""
    cfg = _clocks("tiny", matrix=0.7, vector=0.45)
    rules = TimingRules(cfg)
    mm = dict(opcode=Opcode.MATMUL, rows=5, cols=9, k=7, a_mem=Mem.SRAM, a_dtype=DType.BF16, b_mem=Mem.SRAM,
              b_dtype=DType.BF16, b_addr=512, o_mem=Mem.ACC, o_dtype=DType.F32)
    _, end = _charged(_stream(mm, mm), cfg)
    stream = rules.matmul_stream(5, 7, 9, False)
    L, S1 = rules.preload, rules.matmul_streaming(stream)  # the second streams from max(2L, L + S')
    assert end[0] == rules.matmul_latency(stream)
    assert end[1] == max(L + L, L + S1) + rules.matmul_result_after_streaming(stream)
    assert end[1] - end[0] == pytest.approx(rules.matmul_interval(stream))
    assert _exp_on(cfg, 3, 50) == rules.vector_time(3, 50, cfg.vector.op_cost.unary["exp"])
    assert _exp_on(cfg, 3, 50) == pytest.approx((16 + 50 * 4) / 0.45)


def test_reports_and_traces_count_time_at_the_core_clock() -> None:
    """Cycles are core cycles: the report's and the trace's microseconds divide them by
    the top-level clock_ghz, never by an engine's clock."""
    from tilecc.runtime.report import make_report, program_work, stream_work
    from tilecc.simulator.trace import chrome_trace

    cfg = _clocks("cloud", vector=0.48)
    op = dict(opcode=Opcode.VEC_UNARY, func=UnaryFn.EXP, rows=128, cols=64, a_mem=Mem.SRAM, a_dtype=DType.F32,
              o_mem=Mem.SRAM, o_dtype=DType.F32, o_addr=4096)
    stream = _stream(op)
    sim = simulate(stream, cfg, None, functional=False)
    assert sim.cycles == 700.0  # (76 + 64) VectorE cycles at 0.48 GHz, 5 core cycles each
    rep = make_report(sim, {**stream_work(stream, cfg), "compulsory_hbm_bytes": 0.0, **program_work(stream, cfg)}, cfg, 0.0)
    assert rep.time_us == pytest.approx(700.0 / 2400.0)  # 700 cycles at 2.4 GHz: 0.2917 us
    assert sim.start is not None and sim.end is not None
    trace = chrome_trace(stream, cfg, sim.start, sim.end)
    (slice_,) = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "kernel"]
    assert slice_["dur"] == pytest.approx(0.292, abs=1e-3)  # us, rounded to whole ns


def test_the_rules_take_arrays_and_numbers_alike() -> None:
    rules = TimingRules(load_config("cloud"))
    rows, cols = np.array([1.0, 7.0, 128.0]), np.array([3.0, 64.0, 1000.0])
    got = rules.dma_time(rows, cols, 2.0, np.array([True, False, True]))
    want = [rules.dma_time(1, 3, 2, True), rules.dma_time(7, 64, 2, False), rules.dma_time(128, 1000, 2, True)]
    assert got.tolist() == want
    assert rules.vector_time(rows, cols, 1.5).tolist() == [rules.vector_time(int(r), int(c), 1.5) for r, c in
                                                            zip(rows, cols)]
    assert rules.vector_op_cost("unary", "no such function", 1) == 1


# ----------------------------------------------------------------------------- DMA rules, by hand
# cloud: HBM 151 B/cycle; 16 engines of 11.33 B/cycle (181.28 together), each spending
# 72.3 cycles per packet before its bytes move (a packet of c bytes takes 72.3 + c / 11.33
# cycles: eff = c / (c + 819.159)); fixed part 2280 + 840 cycles plus 0.5 per descriptor


def _load(rows: int, cols: int, queue: int = 0, rs: int | None = None, cs: int = 1,
          dtype: DType = DType.BF16) -> dict[str, Any]:
    return dict(opcode=Opcode.DMA_LOAD, queue=queue, a_mem=Mem.HBM, a_dtype=dtype, o_mem=Mem.SRAM,
                o_dtype=dtype, o_addr=queue * 65536, rows=rows, cols=cols,
                hbm_rs=cols if rs is None else rs, hbm_cs=cs)


@pytest.mark.parametrize(
    "rows, chunk, rate",
    # 16 x c / (72.3 + c / 11.33), at most 151
    [(128, 64, 13.136841723857199), (128, 512, 69.72522440970613), (128, 2048, 129.48756591455165),
     (128, 4096, 151.0), (128, 65536, 151.0),
     # 1 x c / (72.3 + c / 11.33): one engine, never the HBM peak
     (1, 64, 0.8210526077410749), (1, 512, 4.357826525606633), (1, 2048, 8.092972869659478),
     (1, 4096, 9.44174542471566), (1, 65536, 11.1901303710236)],
)
def test_dma_rate_grows_with_the_payload_per_partition(rows: int, chunk: int, rate: float) -> None:
    """A fixed overhead per packet that large payloads amortise: bandwidth grows with the
    payload per partition (64 B: 7 % of an engine's peak, 512 B: 38 %, 4 KiB: 83 %, 64 KiB:
    99 %); over all 16 engines the HBM peak is reached from 4 KiB on."""
    cfg = load_config("cloud")
    rules = TimingRules(cfg)
    cols = chunk // 2  # bf16
    assert rules.dma_rate(rows, cols, 2) == pytest.approx(rate, rel=1e-12)
    _, end = _charged(_stream(_load(rows, cols)), cfg)
    assert end[0] == pytest.approx(3120 + 0.5 * rows + rows * chunk / rate, rel=1e-12)


def test_dma_engines_cap_a_transfer_by_the_partitions_it_spans() -> None:
    """4 KiB per partition: one partition runs on one engine (one packet in 72.3 + 4096 /
    11.33 = 433.8 cycles: 9.44 B/cycle), 8 on eight (75.53), 16 would reach 151.07 and are
    capped at the HBM peak (151)."""
    rules = TimingRules(load_config("cloud"))
    assert [rules.dma_engines(r) for r in (1, 8, 16, 128)] == [1, 8, 16, 16]
    assert rules.dma_rate(1, 2048, 2) == pytest.approx(9.44174542471566)
    assert rules.dma_rate(8, 2048, 2) == pytest.approx(75.53396339772527)
    assert rules.dma_rate(16, 2048, 2) == 151.0
    assert rules.dma_transfer(1, 2048, 2) == pytest.approx(72.3 + 4096 / 11.33)  # 433.8 cycles
    assert rules.dma_transfer(16, 2048, 2) == pytest.approx(16 * 4096 / 151)  # 434.0 cycles


def test_cloud_reaches_the_hbm_peak_at_4_kib_per_partition() -> None:
    """The cloud preset's packet overhead is calibrated to the NKI DMA guide: over 128
    partitions (all 16 engines) 4096 B per partition reaches exactly the HBM peak, 2048 B
    does not (129.5 of 151 B/cycle); the saturating payload is 819.159 x r / (1 - r) with
    r = 151 / 181.28, 4085.0 B."""
    rules = TimingRules(load_config("cloud"))
    assert rules.dma_rate(128, 2048, 2) == 151.0  # 4096 B per partition
    assert rules.dma_rate(128, 1024, 2) < 151.0  # 2048 B per partition
    assert rules.dma_rate(128, 1024, 2) == pytest.approx(129.48756591455165)
    sat = rules.dma_saturating_chunk()
    assert sat == pytest.approx(72.3 * 11.33 * 151 / (181.28 - 151)) == pytest.approx(4084.97, abs=0.01)
    assert 2048 < sat <= 4096
    assert rules.dma_rate(128, sat / 2, 2) == pytest.approx(151.0)


@pytest.mark.parametrize("preset, chunk", [("cloud", 4096), ("tiny", 64), ("edge", 128)])
def test_presets_saturate_hbm_at_their_named_payload(preset: str, chunk: int) -> None:
    """Each preset's packet overhead is calibrated (rounded down) so a transfer over all
    its engines reaches the HBM peak at the payload per partition its comment names, and
    not at half of it."""
    cfg = load_config(preset)
    rules = TimingRules(cfg)
    P = cfg.sram.partitions
    assert rules.dma_rate(P, chunk, 1) == cfg.hbm.bytes_per_cycle
    assert rules.dma_rate(P, chunk // 2, 1) < cfg.hbm.bytes_per_cycle
    assert 0.99 * chunk < rules.dma_saturating_chunk() <= chunk


def test_saturating_chunk_when_the_engines_cannot_fill_hbm() -> None:
    """Engines that together stay below the HBM peak: the saturating payload is where an
    engine reaches 90 % of its own peak, 9 x the overhead bytes; no overhead: 0."""
    cfg = load_config("tiny")
    slow = dataclasses.replace(cfg, dma=dataclasses.replace(cfg.dma, engine_bytes_per_cycle=10.0,
                                                            packet_overhead_cycles=2.0))
    rules = TimingRules(slow)
    assert rules.dma_saturating_chunk() == 9 * 2.0 * 10.0
    assert rules.dma_efficiency(180.0) == pytest.approx(0.9)
    free = dataclasses.replace(cfg, dma=dataclasses.replace(cfg.dma, packet_overhead_cycles=0.0))
    assert TimingRules(free).dma_saturating_chunk() == 0.0
    assert TimingRules(free).dma_efficiency(2.0) == 1.0


def test_dma_transpose_moves_a_column_per_descriptor() -> None:
    """A bf16 128 x 512 tile read from a transposed HBM view (row stride 1, column stride
    128) is a DMA transpose: 512 descriptors of 256 contiguous bytes (16 x 256 / (72.3 +
    256 / 11.33) = 43.16 B/cycle); with a row stride of 2 it is element-strided: 65536
    descriptors of 2 bytes (16 x 2 / (72.3 + 2 / 11.33) = 0.44 B/cycle); an f32 transposed
    view is element-strided too."""
    cfg = load_config("cloud")
    rules = TimingRules(cfg)
    assert rules.dma_pattern(1, 128, 2) == 2 and rules.dma_pattern(2, 128, 2) == 0
    assert rules.dma_pattern(1, 128, 4) == 0 and rules.dma_pattern(512, 1, 2) == 1
    assert rules.dma_pattern(512, 0, 4, True) == 1  # a gather's indexed rows are contiguous
    _, end = _charged(_stream(_load(128, 512, rs=1, cs=128)), cfg)
    # 512 packets of 256 B over 16 engines: 32 each of 72.3 + 256 / 11.33 cycles
    assert end[0] == pytest.approx(3120 + 512 * 0.5 + 32 * (72.3 + 256 / 11.33), rel=1e-12)  # 6412.7
    _, end = _charged(_stream(_load(128, 512, rs=2, cs=128)), cfg)
    # 65536 packets of 2 B: 4096 per engine
    assert end[0] == pytest.approx(3120 + 65536 * 0.5 + 4096 * (72.3 + 2 / 11.33), rel=1e-12)
    _, end = _charged(_stream(_load(128, 512, rs=1, cs=128, dtype=DType.F32)), cfg)
    assert end[0] == pytest.approx(3120 + 65536 * 0.5 + 4096 * (72.3 + 4 / 11.33), rel=1e-12)


def test_dma_sharing_of_engines_and_hbm() -> None:
    """Two full-rate transfers take twice as long (each at 1/2); two 1-partition ones (one
    engine, 0.063 of HBM each) run side by side at their own rate; two full-partition
    short-chunk ones (all 16 engines each, 0.46 of HBM) share the engines: 1/2 each."""
    cfg = load_config("cloud")
    fixed = 3120 + 128 * 0.5
    _, end = _charged(_stream(_load(128, 2048, 0), _load(128, 2048, 1)), cfg)
    assert end[0] == end[1] == pytest.approx(fixed + 2 * 128 * 4096 / 151)
    _, end = _charged(_stream(_load(1, 2048, 0), _load(1, 2048, 1)), cfg)
    assert end[0] == end[1] == pytest.approx(3120 + 0.5 + 72.3 + 4096 / 11.33)
    _, end = _charged(_stream(_load(128, 256, 0), _load(128, 256, 1)), cfg)
    # 128 packets of 512 B on 16 engines, 8 each, at half speed
    assert end[0] == end[1] == pytest.approx(fixed + 2 * 8 * (72.3 + 512 / 11.33))
    rules = TimingRules(cfg)
    assert rules.dma_slowdown([1.0, 1.0, 1.0], [16, 16, 16]) == 3.0  # n full-rate: exactly 1/n
    assert rules.dma_slowdown([0.075] * 4, [1] * 4) == 1.0
    assert rules.dma_slowdown([0.15, 0.15], [16, 16]) == 2.0


def test_both_schedulers_agree_on_mixed_dma_sharing() -> None:
    """Engine-limited, short-chunk, transposed and full-rate transfers overlapping on four
    queues, with waits between them: the dataflow and the event schedulers give the same
    times bit for bit."""
    from tilecc.simulator import decode, scheduler

    cfg = load_config("cloud")
    loads = [_load(1, 2048, 0), _load(128, 256, 1), _load(128, 512, 2, rs=1, cs=128), _load(128, 2048, 3),
             _load(7, 3000, 0), _load(64, 100, 1), _load(128, 4096, 2), _load(3, 50, 3, rs=2, cs=9)]
    loads[4]["wait_sem"] = [0, -1, -1, -1]
    loads[4]["wait_val"] = [1, 0, 0, 0]
    loads[1]["signal_sem"] = 0
    for ld in loads:
        ld.setdefault("signal_sem", -1)
        ld.setdefault("wait_sem", [-1, -1, -1, -1])
    prog = decode.DecodedProgram(_stream(*loads), cfg)
    fast, slow = scheduler.schedule(prog), scheduler.schedule(prog, general=True)
    assert fast.start is not None and slow.start is not None and fast.end is not None and slow.end is not None
    assert np.array_equal(fast.start, slow.start) and np.array_equal(fast.end, slow.end)
    assert fast.hbm_stall == slow.hbm_stall and fast.hbm_busy == slow.hbm_busy
    assert fast.start[4] == fast.end[1]  # the wait
    assert all(x > 0 for x in fast.hbm_stall)


# ----------------------------------------------------------------------------- (b) estimators


def _kernel_cycles(program: Any, cfg: HardwareConfig) -> dict[str, float]:
    """Each kernel's simulated span (first start to last end), by kernel name."""
    start, end = _charged(program.stream, cfg)
    return {name: float(end[a : a + n].max() - start[a : a + n].min()) for name, a, n in program.kernels}


@pytest.mark.parametrize(
    "target, shape, dtype",
    [("tiny", (150, 90, 140), "f32"), ("tiny", (1, 64, 200), "f32"), ("tiny", (64, 48, 80), "bf16"),
     ("edge", (300, 200, 130), "f32"), ("edge", (128, 256, 64), "bf16"), ("cloud", (256, 1024, 512), "bf16"),
     ("cloud", (1, 2048, 2048), "bf16")],
)
def test_matmul_cost_model_tracks_the_simulator(target: str, shape: tuple[int, int, int], dtype: str) -> None:
    cfg = load_config(target)
    p = MatmulProblem.make(cfg, *shape, a_dtype=dtype, b_dtype=dtype)
    s = cost_model.choose(p, cfg)
    assert s is not None
    ratio = cost_model.estimate(p, s, cfg) / measure_program(kernel_alone(p, cfg), s, cfg)
    assert 0.85 < ratio < 1.30, (ratio, s)


@pytest.mark.parametrize(
    "target, name, shapes, rel",
    [("tiny", "flash_attention", [(1, 200, 16)] * 3, 1e-9), ("tiny", "gemm_gelu", [(16, 16), (16, 64), (64,)], 1e-9),
     ("tiny", "softmax", [(16, 64)], 1e-9), ("tiny", "mlp", [(16, 16), (16, 16), (16,), (16, 16), (16,)], 1e-9),
     ("cloud", "flash_attention", [(1, 512, 64)] * 3, 0.07)],
)
def test_dsl_scheduler_estimate_is_the_simulated_time(target: str, name: str, shapes: list, rel: float) -> None:
    cfg = load_config(target)
    kern = tilecc.kernel(KERNELS / f"{name}.tdsl")
    module = build_module(kern.ast, shapes, cfg, target, schedule=False)
    estimate = schedule_kernel(api._kernel_func(module, name), cfg, 0.0, 0.0)
    program = api._finish(kern.ast, module, cfg, False, kernel_work(kern.ast, shapes, cfg)).program
    cycles = simulate(program.stream, cfg, None, functional=False, record=False).cycles
    assert estimate == pytest.approx(cycles, rel=rel)


class _Elementwise(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + y) - torch.tanh(y)


class _Softmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class _LayerNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:])


@pytest.mark.parametrize(
    "target, model, shapes",
    [("tiny", _Elementwise(), [(64, 100)] * 2), ("cloud", _Elementwise(), [(512, 1000)] * 2),
     ("tiny", _Elementwise(), [(7, 33)] * 2), ("tiny", _Softmax(), [(40, 64)]), ("cloud", _Softmax(), [(256, 512)]),
     ("tiny", _LayerNorm(), [(3, 17, 48)])],
)
def test_elementwise_estimate_tracks_the_simulator(target: str, model: torch.nn.Module, shapes: list) -> None:
    torch.manual_seed(0)
    program = tilecc.compile(model, tuple(torch.randn(*s) for s in shapes), target=target, cache=False).program
    estimates = {}
    for remark in program.meta.get("remarks", []):
        found = re.search(r"kernel (\S+): tiles .* estimated ([\d,]+) cycles", str(remark))
        if found:
            estimates[found.group(1)] = float(found.group(2).replace(",", ""))
    cycles = _kernel_cycles(program, load_config(target))
    assert estimates and set(estimates) <= set(cycles), (estimates, cycles)
    for name, estimate in estimates.items():
        assert 0.5 < estimate / cycles[name] < 2.0, (name, estimate, cycles[name])


class _Sdpa(torch.nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize(
    "target, batch, heads, L, S, D, dtype, causal, rel",
    [("tiny", 1, 2, 50, 45, 24, torch.bfloat16, True, 1e-9), ("tiny", 1, 2, 64, 64, 16, torch.bfloat16, False, 1e-9),
     ("cloud", 1, 4, 256, 256, 64, torch.bfloat16, True, 1e-9), ("tiny", 2, 2, 17, 40, 16, torch.float32, False, 0.03)],
)
def test_attention_replay_is_the_simulated_time(
    target: str, batch: int, heads: int, L: int, S: int, D: int, dtype: torch.dtype, causal: bool, rel: float
) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, D, generator=g).to(dtype) for n in (L, S, S))
    program = tilecc.compile(_Sdpa(causal), (q, k, v), target=target, cache=False).program
    cycles = _kernel_cycles(program, load_config(target))
    names = [n for n in cycles if "attention" in n]
    # the estimates of the same lowering, from its compile session
    module = import_exported_program(export_model(_Sdpa(causal), (q, k, v))).module.clone()
    session = CompileSession()
    for stage, run in default_pipeline(load_config(target), 2, None, session):
        run(module)
        if stage == "lower-graph-to-tile":
            break
    estimates = {n: la.kernel_estimate(session, n) for n in names}
    assert names and all(e is not None for e in estimates.values()), estimates
    for name in names:
        assert estimates[name] == pytest.approx(cycles[name], rel=rel)
