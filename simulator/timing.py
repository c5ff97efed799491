"""The timing rules of the NPU: the closed forms every duration comes from, read from the config.

One set of formulas, shared by the simulator (`simulator.scheduler` charges each
instruction with them, vectorised over the stream) and by every estimator that predicts
the simulated time (the matmul cost model, the attention list scheduler, the tile-DSL
scheduler, the elementwise kernel model). Each rule is a method of `TimingRules` (or a
function of the config) that takes Python numbers or numpy arrays alike and evaluates
its float expression in one fixed order, so an estimate and the machine agree bit for
bit. Every constant is a config key. In cycles:

- **DMA** of ``rows x cols`` elements of ``itemsize`` bytes, ``rows`` on as many SRAM
  partitions: a fixed part ``(dma.latency_cycles + hbm.latency_cycles) + descriptors *
  dma.per_descriptor_cycles`` (`dma_fixed`), then the transfer ``rows * cols * itemsize
  / rate`` (`dma_transfer`) at the transfer's rate alone (`dma_rate`)::

      rate = min(hbm.bytes_per_cycle, n_eng * dma.engine_bytes_per_cycle * eff(chunk))
      n_eng = min(dma.engines, rows)
      eff(chunk) = chunk / (chunk + dma.packet_overhead_cycles * dma.engine_bytes_per_cycle)

  An engine moving a packet of ``chunk`` bytes spends ``dma.packet_overhead_cycles``
  before its bytes move, then ``chunk / dma.engine_bytes_per_cycle``: a fixed per-packet
  overhead that large packets amortise (`dma_efficiency`). (NKI DMA bandwidth guide: a
  transfer is spread over up to 16 DMA engines, one packet per engine per group of
  partitions; with small payloads the packet rate, not HBM, limits, and >= 4 KiB per
  partition amortises the per-packet overhead.) `dma_saturating_chunk` is the payload
  per partition at which a transfer over all the engines reaches the HBM peak.
  The access pattern (`dma_pattern`, a `DmaPattern`) sets ``chunk`` (contiguous bytes
  per partition) and the descriptors: *contiguous* rows (HBM column stride 1, and a
  gather's indexed rows) move ``cols * itemsize`` per row, one descriptor per row; a
  *transpose* (a 2-byte dtype whose HBM view is transposed: row stride 1, column
  stride > 1; the DGE transpose of ``nki.isa.dma_transpose``) reads one contiguous run
  of ``rows * itemsize`` bytes per tile column, one descriptor per column (no published
  throughput beyond this exists); any other *strided* pattern moves one element per
  descriptor (``rows * cols`` of them, ``itemsize``-byte chunks). The simulator shares
  the engines and HBM among concurrent transfers (`simulator.scheduler`); the times
  here are a transfer's time alone.
- **MATMUL** ``[M x K] @ [K x N]``: `matmul_mapping` lays (Sr, Sc) on the array and
  streams T (WS (K, N, M), OS (M, N, K), IS (K, M, N)); streaming takes ``S = T * p``
  (``p = matrix.fp32_slowdown`` with an fp32 operand, ``1 / matrix.int8_speedup`` or
  ``1 / matrix.fp8_speedup`` with both operands int8 or both fp8 e4m3 (`lowp_speedup`:
  an 8-bit mode packing two element pairs per PE, Trainium2's ``double_row``), else 1:
  `matmul_stream`), the
  stationary operand's preload ``L = R`` (WS, IS; OS: 0), fill and drain ``D = R + C -
  2``. The result is ready ``L + S + D`` after the start (`matmul_latency`). Compatible
  mode holds the engine that long; pipelined mode holds the array for ``S' = max(S,
  matrix.min_interval_cycles)`` of streaming (`matmul_streaming`) and overlaps the next
  preload, so back-to-back matmuls issue every ``max(L, S')`` (`matmul_interval`).
- **VECTOR** over a tile of ``p`` partitions (rows) and ``c`` columns: one lane per
  partition, each lane one element per cycle of a cost-1 op, so ``(vector.latency_cycles
  + vector.access_cycles) + ceil(p / lanes) * c * cost * inputs`` (`vector_time`; the
  part after the overhead is `vector_work`, ``ceil(p / lanes) * c`` the element groups,
  `vector_groups`): a 1-partition tile runs on one lane, 128 times slower per element
  than a 128-partition one on 128 lanes. ``cost`` comes from
  ``[vector.op_cost.<unary|binary|reduce>]`` by function name (`vector_op_cost`; per
  instruction of a stream: `vector_cost_factors`), ``inputs`` is 2 for a binary op with
  a tile second operand, else 1.

Clocks. The constants above are in each engine's own cycles: matrix keys in cycles of
the matrix engine's clock (``matrix.clock_ghz``), vector keys in the vector engine's
(``vector.clock_ghz``), DMA and HBM keys in core cycles. Every duration a rule returns
is in core cycles (the top-level ``clock_ghz``, the time base of every report, trace and
stream figure): an engine's cycles times `core_cycles_per` ``= clock_ghz /
<engine>.clock_ghz``, applied to the whole matrix figures (``L``, ``S``, ``S'``, ``D``)
and to the vector overhead and work.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

import numpy as np

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import BinaryFn, DType, Flag, Opcode, ReduceFn, UnaryFn

__all__ = ["DmaPattern", "TimingRules", "core_cycles_per", "matmul_mapping", "vector_cost_factors"]

# a number or a numpy array of them: every rule takes either
Num = Any


def _where(cond: Num, a: Num, b: Num) -> Num:
    # a scalar condition picks a whole operand, number or array
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else (a if cond else b)


def _minimum(a: Num, b: Num) -> Num:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)


def _maximum(a: Num, b: Num) -> Num:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def _ceil(x: Num) -> Num:
    return np.ceil(x) if isinstance(x, np.ndarray) else math.ceil(x)


def _float(x: Num) -> Num:
    return x.astype(np.float64) if isinstance(x, np.ndarray) else float(x)


class DmaPattern(IntEnum):
    """How a DMA walks HBM (see the module docstring). The codes make a bool
    ``contiguous`` read as before: True is CONTIGUOUS, False STRIDED."""

    STRIDED = 0  # one element per descriptor
    CONTIGUOUS = 1  # one descriptor per row of cols * itemsize bytes
    TRANSPOSE = 2  # 2-byte dtype, transposed HBM view: one descriptor per column of rows * itemsize


def core_cycles_per(config: HardwareConfig, engine: str) -> float:
    """Core-clock cycles per cycle of `engine` ("matrix", "vector", "dma"): the factor that
    converts an engine's own cycles to the time base every report uses, ``clock_ghz /
    <engine>.clock_ghz`` (DMA and HBM figures are in core cycles already: 1.0)."""
    if engine == "matrix":
        return config.clock_ghz / config.matrix.clock_ghz
    if engine == "vector":
        return config.clock_ghz / config.vector.clock_ghz
    if engine == "dma":
        return 1.0
    raise ValueError(f"core_cycles_per: unknown engine {engine!r} (allowed: matrix, vector, dma)")


def matmul_mapping(config: HardwareConfig, m: Num, k: Num, n: Num) -> tuple[Num, Num, Num]:
    """(Sr, Sc, T) of a matmul ``[M x K] @ [K x N]`` under the configured dataflow: the
    operand dimensions laid on the array's rows and columns, and the one streamed in time
    (SCALE-Sim's mapping: WS (K, N, M), OS (M, N, K), IS (K, M, N))."""
    flow = config.matrix.dataflow
    if flow == "ws":
        return k, n, m
    if flow == "os":
        return m, n, k
    return k, m, n


def vector_cost_factors(
    config: HardwareConfig, opcode: np.ndarray, func: np.ndarray, flags: np.ndarray
) -> np.ndarray:
    """``cost * n_inputs`` of each instruction (0 for non-vector ones): vector-engine
    cycles per element group (one element on each of up to `lanes` partitions), from
    ``[vector.op_cost]``; a binary op with a tile second operand
    reads two inputs, one with a column or immediate operand reads one."""
    table = config.vector.op_cost
    factor = np.zeros(len(opcode), dtype=np.float64)
    for op, enum, costs in (
        (Opcode.VEC_UNARY, UnaryFn, table.unary),
        (Opcode.VEC_BINARY, BinaryFn, table.binary),
        (Opcode.VEC_REDUCE, ReduceFn, table.reduce),
    ):
        lut = np.zeros(256, dtype=np.float64)
        for f in enum:
            lut[int(f)] = costs[f.name.lower()]
        sel = opcode == op
        factor[sel] = lut[func[sel]]
    two = (opcode == Opcode.VEC_BINARY) & ((flags & (Flag.B_IMM | Flag.B_COLUMN)) == 0)
    factor[two] *= 2
    return factor


class TimingRules:
    """The closed forms of one config (see the module docstring); every method takes
    Python numbers or numpy arrays.

    Every figure is in core cycles. `preload` (L) and `drain` (D) are the matrix
    engine's constant parts, `vector_overhead` a vector instruction's fixed part
    (latency + access); `matrix_cycle` / `vector_cycle` the core cycles per cycle of
    each engine (`core_cycles_per`); `dma_fixed0` the fixed DMA cost before
    descriptors; `bw` the HBM peak bandwidth.
    """

    def __init__(self, cfg: HardwareConfig):
        self.cfg = cfg
        mx = cfg.matrix
        self.matrix_cycle = core_cycles_per(cfg, "matrix")
        self.vector_cycle = core_cycles_per(cfg, "vector")
        self.preload = (float(mx.rows) if mx.dataflow in ("ws", "is") else 0.0) * self.matrix_cycle
        self.drain = float(mx.rows + mx.cols - 2) * self.matrix_cycle
        self.bw = cfg.hbm.bytes_per_cycle
        self.dma_fixed0 = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
        self.vector_overhead = float(cfg.vector.latency_cycles + cfg.vector.access_cycles) * self.vector_cycle
        self.pipelined = mx.mode == "pipelined"
        # the config values the rules read, looked up once (estimators call them often)
        self._per_descriptor = cfg.dma.per_descriptor_cycles
        self._overhead_bytes = cfg.dma.packet_overhead_cycles * cfg.dma.engine_bytes_per_cycle
        self._engines = cfg.dma.engines
        self._engine_bw = cfg.dma.engine_bytes_per_cycle
        self._fp32_slowdown = mx.fp32_slowdown
        self._min_interval = mx.min_interval_cycles * self.matrix_cycle
        self._lanes = cfg.vector.lanes

    # -- DMA ----------------------------------------------------------------------------

    def dma_pattern(self, row_stride: Num, col_stride: Num, itemsize: Num, gather: Num = False) -> Num:
        """The `DmaPattern` of a DMA from its HBM element strides between tile rows and
        columns: column stride 1 (or a gather) is contiguous; row stride 1 and column
        stride > 1 with a 2-byte dtype is a DMA transpose; anything else is strided."""
        transpose = (row_stride == 1) & (col_stride > 1) & (itemsize == 2)
        contiguous = (col_stride == 1) | gather
        return _where(contiguous, int(DmaPattern.CONTIGUOUS),
                      _where(transpose, int(DmaPattern.TRANSPOSE), int(DmaPattern.STRIDED)))

    def dma_descriptors(self, rows: Num, cols: Num, pattern: Num = DmaPattern.CONTIGUOUS) -> Num:
        """Descriptors of a DMA: one per row (contiguous), per column (transpose), else
        one per element."""
        return _where(pattern == DmaPattern.CONTIGUOUS, rows,
                      _where(pattern == DmaPattern.TRANSPOSE, cols, rows * cols))

    def dma_chunk(self, rows: Num, cols: Num, itemsize: Num, pattern: Num = DmaPattern.CONTIGUOUS) -> Num:
        """Contiguous bytes per descriptor: a row (contiguous), a column (transpose), an
        element (strided)."""
        return _where(pattern == DmaPattern.CONTIGUOUS, cols * itemsize,
                      _where(pattern == DmaPattern.TRANSPOSE, rows * itemsize, itemsize))

    def dma_fixed(self, descriptors: Num) -> Num:
        """The fixed part of a DMA: DMA and HBM latency, plus its descriptors."""
        return self.dma_fixed0 + descriptors * self._per_descriptor

    def dma_engines(self, rows: Num) -> Num:
        """DMA engines a transfer spanning `rows` partitions runs on: ``min(dma.engines, rows)``."""
        return _minimum(self._engines, rows)

    def dma_efficiency(self, chunk_bytes: Num) -> Num:
        """The fraction of an engine's peak reached with packets of `chunk_bytes`
        (contiguous bytes per partition): a packet takes ``dma.packet_overhead_cycles +
        chunk / dma.engine_bytes_per_cycle``, so ``eff = chunk / (chunk +
        dma.packet_overhead_cycles * dma.engine_bytes_per_cycle)``."""
        return chunk_bytes / (chunk_bytes + self._overhead_bytes)

    def dma_saturating_chunk(self) -> float:
        """The contiguous bytes per partition at which a transfer over all the DMA engines
        reaches the HBM peak: with ``r = hbm.bytes_per_cycle / (dma.engines *
        dma.engine_bytes_per_cycle) < 1``, ``overhead_bytes * r / (1 - r)`` (``overhead_bytes
        = dma.packet_overhead_cycles * dma.engine_bytes_per_cycle``). When the engines
        together cannot saturate HBM (``r >= 1``), the payload at which an engine reaches
        90% of its own peak, ``9 * overhead_bytes``. 0 without a packet overhead."""
        r = self.bw / (self._engines * self._engine_bw)
        if r < 1.0:
            return self._overhead_bytes * r / (1.0 - r)
        return 9.0 * self._overhead_bytes

    def dma_rate(self, rows: Num, cols: Num, itemsize: Num, pattern: Num = DmaPattern.CONTIGUOUS) -> Num:
        """Bytes per cycle of a transfer alone: its engines at the chunk-derated engine
        peak, at most the HBM peak."""
        chunk = self.dma_chunk(rows, cols, itemsize, pattern)
        engines = self.dma_engines(rows) * self._engine_bw * self.dma_efficiency(chunk)
        return _minimum(self.bw, engines)

    def dma_transfer(self, rows: Num, cols: Num, itemsize: Num, pattern: Num = DmaPattern.CONTIGUOUS) -> Num:
        """A transfer's time alone: its bytes at `dma_rate`."""
        return rows * cols * itemsize / self.dma_rate(rows, cols, itemsize, pattern)

    def dma_time(self, rows: Num, cols: Num, itemsize: Num, pattern: Num = DmaPattern.CONTIGUOUS) -> Num:
        """A DMA's whole time alone: fixed part plus transfer."""
        fixed = self.dma_fixed(self.dma_descriptors(rows, cols, pattern))
        return fixed + self.dma_transfer(rows, cols, itemsize, pattern)

    def dma_hbm_share(self, rate: Num) -> Num:
        """The fraction of the HBM peak a transfer of `rate` bytes per cycle takes alone
        (exactly 1 for a full-rate one)."""
        return rate / self.bw

    def dma_occupancy(self, rows: Num, cols: Num, itemsize: Num, pattern: Num = DmaPattern.CONTIGUOUS) -> Num:
        """The cycles of the shared DMA system (HBM or the engines, whichever the transfer
        fills more) a transfer takes: its time alone times ``max(rate / hbm.bytes_per_cycle,
        n_eng / dma.engines)``. Transfers in flight together take at least the sum of
        theirs (the transfer time alone for a full-rate one)."""
        rate = self.dma_rate(rows, cols, itemsize, pattern)
        fill = _maximum(self.dma_hbm_share(rate), self.dma_engines(rows) / self._engines)
        return rows * cols * itemsize / rate * fill

    def dma_slowdown(self, hbm_shares: list[float], engines: list[int]) -> float:
        """How many times slower than alone the transfers in flight all progress, from
        their `dma_hbm_share` and `dma_engines`: ``max(1, sum(rate_i) / hbm.bytes_per_cycle,
        sum(n_eng_i) / dma.engines)`` (``n`` for n full-rate transfers). The sums are
        exact, so the result does not depend on the transfers' order."""
        return max(1.0, math.fsum(hbm_shares), sum(engines) / self._engines)

    # -- matrix -------------------------------------------------------------------------

    def matmul_stream(self, m: Num, k: Num, n: Num, fp32: Num, speedup: Num = 1.0) -> Num:
        """S: cycles streaming the dataflow's T dimension (slower with an fp32 operand,
        `speedup` times faster with both operands 8-bit: `lowp_speedup`)."""
        _, _, t = matmul_mapping(self.cfg, m, k, n)
        passes = _where(fp32, self._fp32_slowdown, 1)
        return _float(t * passes) / speedup * self.matrix_cycle

    def lowp_speedup(self, a_dtype: Num, b_dtype: Num) -> Num:
        """The 8-bit rate of a matmul from its operands' `DType` codes: ``matrix.int8_speedup``
        when both are int8, ``matrix.fp8_speedup`` when both are fp8 e4m3, else 1."""
        i8, f8 = int(DType.I8), int(DType.F8E4M3)
        return _where((a_dtype == i8) & (b_dtype == i8), self.cfg.matrix.int8_speedup,
                      _where((a_dtype == f8) & (b_dtype == f8), self.cfg.matrix.fp8_speedup, 1.0))

    def matmul_streaming(self, stream: Num) -> Num:
        """S': cycles a pipelined matmul holds the array streaming (the shortest interval
        between two matmuls' streaming starts)."""
        return _maximum(stream, self._min_interval)

    def matmul_interval(self, stream: Num) -> Num:
        """Issue interval of back-to-back matmuls: ``max(L, S')`` pipelined, ``L + S + D``
        compatible."""
        if not self.pipelined:
            return self.preload + stream + self.drain
        return _maximum(self.preload, self.matmul_streaming(stream))

    def matmul_latency(self, stream: Num) -> Num:
        """Cycles from a matmul's start to its result, alone: ``L + S + D``."""
        return self.preload + stream + self.drain

    def matmul_result_after_streaming(self, stream: Num) -> Num:
        """Cycles from a pipelined matmul's streaming start to its result: ``S + D``."""
        return stream + self.drain

    # -- vector -------------------------------------------------------------------------

    def vector_op_cost(self, kind: str, fn: str, default: float | None = None) -> float:
        """``[vector.op_cost.<kind>]`` of function `fn` (kind: unary, binary, reduce);
        `default` for a function the table lacks (else KeyError)."""
        table = getattr(self.cfg.vector.op_cost, kind)
        return table[fn] if default is None else table.get(fn, default)

    def vector_groups(self, rows: Num, cols: Num) -> Num:
        """Element groups of a vector instruction over `rows` partitions x `cols` columns:
        ``ceil(rows / lanes) * cols`` (a group is one element on each of up to `lanes`
        partitions; a cost-1 op processes one group per vector-engine cycle)."""
        return _ceil(rows / self._lanes) * cols

    def vector_work(self, rows: Num, cols: Num, cost: Num, inputs: Num = 1) -> Num:
        """A vector instruction's time after its fixed overhead, in core cycles:
        ``vector_groups * cost * inputs`` vector-engine cycles."""
        return self.vector_groups(rows, cols) * cost * inputs * self.vector_cycle

    def vector_time(self, rows: Num, cols: Num, cost: Num, inputs: Num = 1) -> Num:
        """One vector instruction over rows x cols, `cost` vector-engine cycles per group
        and input, in core cycles: overhead plus work."""
        return self.vector_overhead + self.vector_work(rows, cols, cost, inputs)
