"""Hardware configurations: frozen dataclasses loaded from TOML and validated.

A target is a preset name (`tiny`, `edge`, `cloud`, shipped in `presets/`) or the path
of a TOML file. Every key is documented with its unit in the presets, and every
constant of the timing and energy models is a key here (the simulator hard-codes none).
Unknown keys, wrong types and impossible values raise `ConfigError` naming the key, the
value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_args, get_type_hints

from tilecc.errors import ConfigError
from tilecc.simulator.isa import BinaryFn, ReduceFn, UnaryFn

PRESET_DIR = Path(__file__).parent / "presets"

MATRIX_MODES = ("compatible", "pipelined")
DATAFLOWS = ("is", "os", "ws")
# the operation names of `[vector.op_cost.<kind>]`: the ISA's function enums, lower case
VECTOR_OP_NAMES = {
    "unary": tuple(f.name.lower() for f in UnaryFn),
    "binary": tuple(f.name.lower() for f in BinaryFn),
    "reduce": tuple(f.name.lower() for f in ReduceFn),
}


@dataclass(frozen=True)
class HbmConfig:
    bytes_per_cycle: float  # peak bandwidth, bytes per core clock cycle
    latency_cycles: int  # fixed latency of one access
    capacity_bytes: int


@dataclass(frozen=True)
class SramConfig:
    partitions: int  # P: a tile's first dimension maps to partitions
    bytes_per_partition: int


@dataclass(frozen=True)
class AccumulatorConfig:
    partitions: int
    bytes_per_partition: int  # fp32 accumulators


@dataclass(frozen=True)
class DmaConfig:
    queues: int  # independent issue queues; they share the engines and HBM
    engines: int  # DMA engines; a transfer runs on min(engines, partitions it spans)
    engine_bytes_per_cycle: float  # one engine's peak, bytes per core clock cycle
    latency_cycles: int  # fixed cost of one transfer (descriptor fetch, setup), cycles
    per_descriptor_cycles: float  # cycles per descriptor (one per contiguous chunk)
    # core cycles an engine spends per packet before its bytes move (descriptor processing,
    # packet setup): a packet of `chunk` bytes takes packet_overhead_cycles + chunk /
    # engine_bytes_per_cycle, so large packets amortise it (timing.TimingRules.dma_efficiency)
    packet_overhead_cycles: float


@dataclass(frozen=True)
class MatrixConfig:
    clock_ghz: float  # the matrix engine's clock, GHz; its cycle counts below are in it
    rows: int  # R: contraction dimension of one matmul
    cols: int  # C: columns of the stationary operand
    fp32_slowdown: int  # passes per fp32 matmul relative to bf16
    mode: str  # "pipelined" (overlapped preload/fill/drain) or "compatible" (SCALE-Sim)
    dataflow: str  # "ws", "os" or "is": which operand stays in the array
    min_interval_cycles: int  # pipelined mode: shortest issue interval of two matmuls, matrix cycles
    # MACs per PE per cycle relative to 16-bit operands when BOTH operands are int8 / fp8
    # e4m3 (an 8-bit mode packing two element pairs per PE); mixed 8-bit x 16-bit operands
    # run at the 16-bit rate. 1: no such mode.
    int8_speedup: float = 1.0
    fp8_speedup: float = 1.0


@dataclass(frozen=True)
class VectorOpCost:
    """Vector-engine cycles per element group (one element on each of up to `lanes`
    partitions) of each function, by instruction kind."""

    unary: dict[str, float]
    binary: dict[str, float]
    reduce: dict[str, float]

    def __hash__(self) -> int:  # configs stay hashable
        return hash(tuple(tuple(sorted(t.items())) for t in (self.unary, self.binary, self.reduce)))


@dataclass(frozen=True)
class VectorConfig:
    clock_ghz: float  # the vector engine's clock, GHz; its cycle counts below are in it
    lanes: int  # one lane per partition: a cost-1 op does one element per lane per cycle
    latency_cycles: int  # pipeline fill and drain per instruction, vector-engine cycles
    access_cycles: int  # start-up of the instruction's on-chip memory accesses, vector cycles
    op_cost: VectorOpCost


@dataclass(frozen=True)
class EnergyConfig:
    pj_per_mac_bf16: float  # pJ per MAC with bf16/fp16 operands
    pj_per_mac_fp32: float  # pJ per MAC with an fp32 operand
    pj_per_sram_byte: float  # pJ per byte read or written in SRAM
    pj_per_acc_byte: float  # pJ per byte read or written in the accumulator memory
    pj_per_hbm_byte: float  # pJ per byte of HBM traffic (read or written)
    static_watts: float  # leakage and clock tree, W, paid for the whole run
    # pJ per MAC with both operands int8 / fp8 e4m3 (None: pj_per_mac_bf16, the 16-bit figure)
    pj_per_mac_int8: float | None = None
    pj_per_mac_fp8: float | None = None


@dataclass(frozen=True)
class AreaConfig:
    """Silicon area per component (simulator/area.py adds them up), mm^2."""

    mm2_per_mac_bf16: float  # one bf16 processing element of the systolic array
    mm2_per_sram_mib: float  # SRAM (scratchpad and accumulator), per MiB, periphery included
    mm2_per_vector_lane: float  # one vector-engine lane
    mm2_per_hbm_phy: float  # one DRAM PHY (and controller)
    hbm_phy_gbytes_per_s: float  # peak bandwidth of one such PHY, GB/s
    mm2_per_serdes_lane: float  # one chip-to-chip SerDes lane
    serdes_lanes: int  # chip-to-chip SerDes lanes on this core (0: a core without links)
    fixed_mm2: float  # control, DMA engines, on-chip network: area that no swept size scales


@dataclass(frozen=True)
class HardwareConfig:
    name: str
    clock_ghz: float  # the core clock: the time base of every cycle figure (DMA, HBM, reports)
    semaphores: int
    hbm: HbmConfig
    sram: SramConfig
    accumulator: AccumulatorConfig
    dma: DmaConfig
    matrix: MatrixConfig
    vector: VectorConfig
    energy: EnergyConfig
    # optional: a config without an [area] table simulates alike; only the area model
    # (simulator/area.py: perf/mm^2 in sweeps) needs it
    area: AreaConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(
                f"unknown key '{where}{key}' (allowed in this section: {', '.join(sorted(known))})"
            )
    values: dict[str, Any] = {}
    for f in fields(cls):
        key = f"{where}{f.name}"
        typ = hints[f.name]
        optional = [t for t in get_args(typ) if isinstance(t, type) and dataclasses.is_dataclass(t)]
        if f.name not in data:
            if optional:  # an optional table (`X | None = None`) may be left out
                values[f.name] = None
                continue
            if f.default is not dataclasses.MISSING:  # a key with a stated default
                values[f.name] = f.default
                continue
            raise ConfigError(f"missing key '{key}'")
        value = data[f.name]
        if value is None and f.default is None:  # an optional number left unset (a saved config's null)
            values[f.name] = None
            continue
        if optional:
            typ = optional[0]
        elif type(None) in get_args(typ):  # an optional number (`float | None = None`)
            typ = next(t for t in get_args(typ) if t is not type(None))
        if isinstance(typ, type) and dataclasses.is_dataclass(typ):
            if not isinstance(value, dict):
                raise ConfigError(f"'{key}' must be a table, got {value!r}")
            values[f.name] = _build(typ, value, f"{key}.")
            continue
        if typ == dict[str, float]:
            values[f.name] = _check_cost_table(key, value, VECTOR_OP_NAMES[f.name])
            continue
        values[f.name] = _check_scalar(key, value, typ)
        if key in _CHOICES and values[f.name] not in _CHOICES[key]:
            raise ConfigError(
                f"'{key}' = {value!r} is not allowed (allowed: {', '.join(_CHOICES[key])})"
            )
    return cls(**values)


_CHOICES = {"matrix.mode": MATRIX_MODES, "matrix.dataflow": DATAFLOWS}


def _check_cost_table(key: str, value: Any, names: tuple[str, ...]) -> dict[str, float]:
    """A table with one positive number per function name, all names present."""
    if not isinstance(value, dict):
        raise ConfigError(f"'{key}' must be a table, got {value!r}")
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ConfigError(
            f"unknown operation '{key}.{unknown[0]}' (allowed in this table: {', '.join(names)})"
        )
    missing = [n for n in names if n not in value]
    if missing:
        raise ConfigError(f"missing key '{key}.{missing[0]}' (every operation needs a cost)")
    table = {n: _check_scalar(f"{key}.{n}", value[n], float) for n in names}
    for n, cost in table.items():
        if cost <= 0:
            raise ConfigError(f"'{key}.{n}' must be > 0, got {value[n]!r}")
    return table


def _check_scalar(key: str, value: Any, typ: type) -> Any:
    if typ is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"'{key}' must be a non-empty string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"'{key}' must be a number, got {value!r}")
    if typ is int and not isinstance(value, int):
        raise ConfigError(f"'{key}' must be an integer, got {value!r}")
    if value < 0:
        raise ConfigError(f"'{key}' must be >= 0, got {value!r}")
    return typ(value)


_POSITIVE = [
    "clock_ghz",
    "semaphores",
    "hbm.bytes_per_cycle",
    "hbm.capacity_bytes",
    "sram.partitions",
    "sram.bytes_per_partition",
    "accumulator.partitions",
    "accumulator.bytes_per_partition",
    "dma.queues",
    "dma.engines",
    "dma.engine_bytes_per_cycle",
    "matrix.clock_ghz",
    "matrix.rows",
    "matrix.cols",
    "matrix.fp32_slowdown",
    "matrix.min_interval_cycles",
    "matrix.int8_speedup",
    "matrix.fp8_speedup",
    "vector.clock_ghz",
    "vector.lanes",
    "area.mm2_per_mac_bf16",
    "area.mm2_per_sram_mib",
    "area.mm2_per_vector_lane",
    "area.mm2_per_hbm_phy",
    "area.hbm_phy_gbytes_per_s",
]


def _lookup(cfg: HardwareConfig, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def validate(cfg: HardwareConfig) -> HardwareConfig:
    for key in _POSITIVE:
        if key.startswith("area.") and cfg.area is None:
            continue
        if _lookup(cfg, key) <= 0:
            raise ConfigError(f"'{key}' must be > 0, got {_lookup(cfg, key)!r}")
    if cfg.matrix.rows > cfg.sram.partitions:
        raise ConfigError(
            f"'matrix.rows' = {cfg.matrix.rows} exceeds 'sram.partitions' = "
            f"{cfg.sram.partitions} (the contraction dimension lies on SRAM partitions)"
        )
    if cfg.accumulator.partitions > cfg.sram.partitions:
        raise ConfigError(
            f"'accumulator.partitions' = {cfg.accumulator.partitions} exceeds "
            f"'sram.partitions' = {cfg.sram.partitions}"
        )
    if cfg.accumulator.bytes_per_partition < 4 * cfg.matrix.cols:
        raise ConfigError(
            f"'accumulator.bytes_per_partition' = {cfg.accumulator.bytes_per_partition} "
            f"cannot hold one fp32 row of the array's {cfg.matrix.cols} columns "
            f"(need >= {4 * cfg.matrix.cols})"
        )
    if cfg.sram.bytes_per_partition < 4 * cfg.matrix.cols:
        raise ConfigError(
            f"'sram.bytes_per_partition' = {cfg.sram.bytes_per_partition} cannot hold one fp32 row "
            f"of the array's {cfg.matrix.cols} columns (need >= {4 * cfg.matrix.cols})"
        )
    overhead = cfg.dma.packet_overhead_cycles
    if not math.isfinite(overhead):
        raise ConfigError(f"'dma.packet_overhead_cycles' must be a finite number >= 0, got {overhead!r}")
    if cfg.semaphores > 32767:
        raise ConfigError(f"'semaphores' = {cfg.semaphores} exceeds the encodable 32767")
    return cfg


def from_dict(data: dict[str, Any], source: str = "<dict>") -> HardwareConfig:
    try:
        return validate(_build(HardwareConfig, data, ""))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_config(target: str | Path | HardwareConfig) -> HardwareConfig:
    """A preset name, a TOML path, or an already loaded config."""
    if isinstance(target, HardwareConfig):
        return target
    path = Path(target)
    if not str(target).endswith(".toml"):
        path = PRESET_DIR / f"{target}.toml"
        if not path.exists():
            names = ", ".join(preset_names())
            raise ConfigError(
                f"unknown target '{target}' (presets: {names}; or the path of a .toml file)"
            )
    if not path.is_file():
        raise ConfigError(f"hardware config file '{target}' {'is a directory' if path.is_dir() else 'does not exist'}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read as TOML text ({getattr(e, 'strerror', None) or e})") from None
    return from_dict(data, str(path))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))
