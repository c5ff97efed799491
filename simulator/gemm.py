"""How many cycles does one GEMM layer take on a systolic array? (SCALE-Sim's question.)

`gemm(M, N, K, cfg)` times ``A[M x K] @ B[K x N]`` on the config's R x C matrix engine
with no memory stalls: the cycles the timing-only simulator gives a matmul-only
instruction stream, one MATMUL per fold of the array, every operand already in SRAM and
the accumulator (`simulate_folds`), computed in closed form from `simulator.timing`'s
rules (every fold streams the same T), in O(1) time and memory for any sizes.

Folds. The dataflow lays two operand dimensions (Sr, Sc) on the array's rows and
columns and streams the third, T, in time: WS (K, N, M), OS (M, N, K), IS (K, M, N).
There are ``ceil(Sr / R) * ceil(Sc / C)`` folds; fold (a, b) covers rows
``[a R, min((a + 1) R, Sr))`` and columns ``[b C, min((b + 1) C, Sc))`` and streams
all of T.

Cycles. In ``mode="compatible"`` each fold takes ``2R + C + T - 2`` cycles (WS, IS) or
``R + C + T - 2`` (OS), folds in sequence, and `compute_cycles` is SCALE-Sim's "compute
cycles": the simulated total minus one (SCALE-Sim reports the index of the last busy
cycle; SCALE-Sim 3.0.0 agrees exactly, see tests/test_timing.py). In ``"pipelined"``
mode folds overlap (machine's module docstring); `compute_cycles` is the simulated total:
for n WS folds, ``R + (n - 1) * max(T', R) + T + R + C - 2`` with ``T' = max(T,
matrix.min_interval_cycles)`` (65,918 for 1024^3 on 128 x 128; the bound is 65,536).
`utilization` is SCALE-Sim's: ``M * K * N / (R * C * compute_cycles) * 100`` (percent).
These counts are matrix-engine cycles; every figure returned is in core cycles (the
simulator's time base: ``clock_ghz / matrix.clock_ghz`` core cycles per matrix cycle,
1 on every preset), so they equal SCALE-Sim's when the two clocks are equal.

    >>> gemm(1024, 1024, 1024, "cloud", mode="compatible")["compute_cycles"]
    89983
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.errors import ConfigError
from tilecc.simulator import isa
from tilecc.simulator.config import (
    DATAFLOWS,
    MATRIX_MODES,
    HardwareConfig,
    load_config,
    validate,
)
from tilecc.simulator.isa import DType, Mem, Opcode
from tilecc.simulator.machine import simulate
from tilecc.simulator.timing import TimingRules, core_cycles_per

__all__ = ["gemm", "fold_shapes", "simulate_folds", "GEMM_DTYPES"]

GEMM_DTYPES = {"bf16": DType.BF16, "f16": DType.F16, "fp16": DType.F16, "f32": DType.F32,
               "fp32": DType.F32}


def _mapping(M: int, N: int, K: int, dataflow: str) -> tuple[int, int, int]:
    """(Sr, Sc, T): the dimensions laid on the array's rows and columns, the one streamed."""
    if dataflow == "ws":
        return K, N, M
    if dataflow == "os":
        return M, N, K
    return K, M, N


def _unmap(a: int, b: int, t: int, dataflow: str) -> tuple[int, int, int]:
    """(m, k, n) of a fold covering `a` array rows and `b` columns and streaming `t`."""
    if dataflow == "ws":
        return t, a, b  # m = T, k = Sr, n = Sc
    if dataflow == "os":
        return a, t, b  # m = Sr, k = T, n = Sc
    return b, a, t  # is: m = Sc, k = Sr, n = T


def fold_shapes(
    M: int, N: int, K: int, rows: int, cols: int, dataflow: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, k, n) of each fold's matmul, int64 arrays in fold order (row folds outer): the
    instruction stream whose simulation `gemm` computes in closed form (tests compare)."""
    sr, sc, t = _mapping(M, N, K, dataflow)
    fr, fc = math.ceil(sr / rows), math.ceil(sc / cols)
    r_sizes = np.minimum(rows, sr - rows * np.arange(fr, dtype=np.int64))
    c_sizes = np.minimum(cols, sc - cols * np.arange(fc, dtype=np.int64))
    a = np.repeat(r_sizes, fc)
    b = np.tile(c_sizes, fr)
    tt = np.full(fr * fc, t, dtype=np.int64)
    return _unmap(a, b, tt, dataflow)  # type: ignore[arg-type]  # numpy arrays, elementwise


def _cycles(rules: TimingRules, folds: int, m: int, k: int, n: int, fp32: bool) -> int | float:
    """Simulated cycles of `folds` back-to-back matmuls that all stream the same T (a
    fold's size on the array changes neither its preload L, nor its streaming S, nor its
    fill and drain D: `simulator.timing`), in closed form: compatible mode runs them in
    sequence, ``folds * (L + S + D)``; pipelined mode issues one every ``max(L, S')``
    and pays L once before and ``S + D`` once after, ``L + (folds - 1) * max(L, S') + S
    + D`` (`simulator.scheduler`). `simulate_folds` is the same on the simulator."""
    stream = rules.matmul_stream(m, k, n, fp32)
    interval = _exact(rules.matmul_interval(stream))  # an int on integral clocks: exact past 2**53
    if not rules.pipelined:
        return folds * interval
    return _exact(rules.preload) + (folds - 1) * interval + _exact(rules.matmul_result_after_streaming(stream))


def _exact(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def simulate_folds(
    M: int, N: int, K: int, cfg: HardwareConfig, *, dtype: str = "bf16"
) -> float:
    """The timing-only simulator's cycles for the fold stream of `gemm` on `cfg` (its
    ``[matrix]`` as given; per-fold arrays, O(folds) memory): the reference of the
    closed form, for tests."""
    d = GEMM_DTYPES[dtype]
    mx = cfg.matrix
    m, k, n = fold_shapes(M, N, K, mx.rows, mx.cols, mx.dataflow)
    config = _array_config(cfg, mx.rows, mx.cols, mx.dataflow, mx.mode, int(m.max()), int(k.max()), int(n.max()), d)
    stream = isa.empty_stream(len(m))
    stream["opcode"] = Opcode.MATMUL
    stream["engine"] = isa.Engine.MATRIX
    stream["rows"], stream["k"], stream["cols"] = m, k, n
    stream["a_mem"] = stream["b_mem"] = Mem.SRAM
    stream["o_mem"] = Mem.ACC
    stream["a_dtype"] = stream["b_dtype"] = d
    stream["o_dtype"] = DType.F32
    return float(simulate(stream, config, None, functional=False, record=False).cycles)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"gemm: {name} must be a positive integer, got {value!r}")
    return int(value)


def gemm(
    M: int,
    N: int,
    K: int,
    cfg: str | Path | HardwareConfig = "cloud",
    *,
    rows: int | None = None,
    cols: int | None = None,
    dataflow: str | None = None,
    mode: str | None = None,
    dtype: str = "bf16",
) -> dict[str, Any]:
    """Cycles of the GEMM ``A[M x K] @ B[K x N]`` on the matrix engine of `cfg` (a
    config, preset name or TOML path), without memory stalls.

    `rows`, `cols`, `dataflow` (``"ws"``, ``"os"``, ``"is"``) and `mode`
    (``"compatible"``, ``"pipelined"``) override the config's ``[matrix]`` keys; `dtype`
    is the operand type (``"bf16"``, ``"f16"``, ``"f32"``: fp32 streams
    ``matrix.fp32_slowdown`` passes). Returns a dict with ``compute_cycles``,
    ``utilization`` (percent), ``folds``, ``macs``, ``wall_seconds`` (of this call),
    ``mode``, ``dataflow``, ``rows``, ``cols``, and also ``M``, ``N``, ``K``,
    ``dtype``, ``cycles`` (the simulated total), ``roofline_cycles`` (MACs at R*C per
    matrix cycle, in core cycles), ``time_us`` (``compute_cycles`` at the config's clock) and ``clock_ghz``.
    Invalid arguments raise `ConfigError`.
    """
    t_start = time.perf_counter()
    M, N, K = (_positive_int(n, v) for n, v in (("M", M), ("N", N), ("K", K)))
    base = load_config(cfg)
    R = _positive_int("rows", rows) if rows is not None else base.matrix.rows
    C = _positive_int("cols", cols) if cols is not None else base.matrix.cols
    flow = base.matrix.dataflow if dataflow is None else dataflow
    how = base.matrix.mode if mode is None else mode
    if flow not in DATAFLOWS:
        raise ConfigError(f"gemm: dataflow {flow!r} is not allowed (allowed: {', '.join(DATAFLOWS)})")
    if how not in MATRIX_MODES:
        raise ConfigError(f"gemm: mode {how!r} is not allowed (allowed: {', '.join(MATRIX_MODES)})")
    if dtype not in GEMM_DTYPES:
        raise ConfigError(
            f"gemm: dtype {dtype!r} is not allowed (allowed: {', '.join(GEMM_DTYPES)})"
        )
    d = GEMM_DTYPES[dtype]
    sr, sc, t = _mapping(M, N, K, flow)
    folds = math.ceil(sr / R) * math.ceil(sc / C)
    m, k, n = _unmap(min(sr, R), min(sc, C), t, flow)  # the largest fold
    config = _array_config(base, R, C, flow, how, m, k, n, d)
    exact = _cycles(TimingRules(config), folds, m, k, n, d == DType.F32)
    cycles = float(exact)
    compute = exact - 1 if how == "compatible" else exact
    macs = M * N * K
    passes = base.matrix.fp32_slowdown if d == DType.F32 else 1
    return {
        "M": M,
        "N": N,
        "K": K,
        "rows": R,
        "cols": C,
        "dataflow": flow,
        "mode": how,
        "dtype": dtype,
        "folds": folds,
        "macs": macs,
        "cycles": cycles,
        "compute_cycles": compute,
        "utilization": macs / (R * C * compute) * 100 if compute > 0 else 0.0,
        "roofline_cycles": macs * passes / (R * C) * core_cycles_per(base, "matrix"),
        "time_us": compute / (base.clock_ghz * 1e3),
        "clock_ghz": base.clock_ghz,
        "wall_seconds": time.perf_counter() - t_start,
    }


def _array_config(
    base: HardwareConfig, R: int, C: int, dataflow: str, mode: str, m: int, k: int, n: int,
    dtype: DType,
) -> HardwareConfig:
    """`base` with the array overridden and memories just large enough to hold one
    fold's operands (lhsT k x m, rhs k x n in SRAM, the m x n fp32 output in the
    accumulator): the GEMM is timed without memory limits or stalls."""
    isz = isa.ITEMSIZE[dtype]
    parts = max(R, k, m, base.sram.partitions)
    matrix = dataclasses.replace(base.matrix, rows=R, cols=C, dataflow=dataflow, mode=mode)
    sram = dataclasses.replace(
        base.sram, partitions=parts, bytes_per_partition=max(max(m, n) * isz, 4 * C)
    )
    acc = dataclasses.replace(
        base.accumulator, partitions=parts, bytes_per_partition=4 * max(n, C)
    )
    return validate(dataclasses.replace(base, matrix=matrix, sram=sram, accumulator=acc))
