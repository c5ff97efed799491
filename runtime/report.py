"""The performance report of one program run: cycles against the roofline bound.

The roofline bound is the workload's, never the program's: `simulator.roofline.roofline`
of the intrinsic work that `ir/graph_work.py` counts on the imported graph before any
pass (or the tile-DSL kernel's own work), the largest of
- matrix:  (16-bit MACs + fp32 MACs * fp32_slowdown) / (R*C)
- hbm:     compulsory HBM bytes (inputs, the user's weights, outputs, once) / bytes per cycle
- vector:  irreducible element work (sum of elements * op cost * inputs) / lanes
in core-clock cycles, and `roofline_ratio = cycles / roofline_cycles >= 1` (1.0 is the
physical limit). Beside it, `program_work_cycles` is the same formula over the compiled
program's own work (its stream's MACs and vector element-cycles, the HBM bytes its DMAs
move): how much work the compiler added over the bound.

Beside it the report gives the time at the clock, each engine's busy cycles and
utilisation, why engines lost cycles (`stalls`: waiting on semaphores; for DMA queues,
transfer time lost to sharing HBM bandwidth), the bytes moved at each memory level, and
the energy, average power and TOPS/W of `simulator.energy`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tilecc.simulator import energy as energy_model
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import ITEMSIZE, DType, Opcode
from tilecc.simulator.roofline import LOWP_WORK_KEYS, WORK_KEYS, roofline
from tilecc.simulator.stats import SimResult
from tilecc.simulator.timing import vector_cost_factors

__all__ = ["Report", "critical_path_lines", "make_report", "program_work", "roofline", "stream_work"]


def stream_work(stream: np.ndarray, cfg: HardwareConfig) -> dict[str, float]:
    """The work figures of an instruction stream: 16-bit and fp32 MACs (fp32 when either
    operand is), vector element-cycles (elements * op cost * inputs), and the HBM bytes
    its DMAs move (`hbm_bytes`)."""
    op = stream["opcode"]
    mm = stream[op == Opcode.MATMUL]
    macs = mm["rows"].astype(np.int64) * mm["cols"] * mm["k"]
    fp32 = (mm["a_dtype"] == DType.F32) | (mm["b_dtype"] == DType.F32)
    i8 = (mm["a_dtype"] == DType.I8) & (mm["b_dtype"] == DType.I8)
    f8 = (mm["a_dtype"] == DType.F8E4M3) & (mm["b_dtype"] == DType.F8E4M3)
    vec = stream[(op == Opcode.VEC_UNARY) | (op == Opcode.VEC_BINARY) | (op == Opcode.VEC_REDUCE)]
    elems = vec["rows"].astype(np.float64) * vec["cols"]
    factor = vector_cost_factors(
        cfg, vec["opcode"].astype(np.int64), vec["func"].astype(np.int64),
        vec["flags"].astype(np.int64),
    )
    indirect = (op == Opcode.DMA_GATHER) | (op == Opcode.DMA_SCATTER)
    dma = stream[(op == Opcode.DMA_LOAD) | (op == Opcode.DMA_STORE) | indirect]
    isz = np.zeros(256, dtype=np.int64)
    for d in DType:
        isz[int(d)] = ITEMSIZE[d]
    hbm = dma["rows"].astype(np.int64) * dma["cols"] * isz[dma["a_dtype"]]
    return {
        "macs_16": float(macs[~fp32 & ~i8 & ~f8].sum()),
        "macs_fp32": float(macs[fp32].sum()),
        "macs_int8": float(macs[i8].sum()),
        "macs_fp8": float(macs[f8].sum()),
        "vector_element_cycles": float((elems * factor).sum()),
        "hbm_bytes": float(hbm.sum()),
    }


def program_work(stream: np.ndarray, cfg: HardwareConfig) -> dict[str, float]:
    """`stream_work` under the `program_*` keys a Program's `work` keeps them by."""
    return {f"program_{k}": v for k, v in stream_work(stream, cfg).items()}


def _as_work(program: dict[str, float]) -> dict[str, float]:
    """A program's own figures in `roofline`'s keys (the bytes it moves as its HBM work)."""
    return {
        "macs_16": program["program_macs_16"],
        "macs_fp32": program["program_macs_fp32"],
        "macs_int8": program.get("program_macs_int8", 0.0),
        "macs_fp8": program.get("program_macs_fp8", 0.0),
        "vector_element_cycles": program["program_vector_element_cycles"],
        "compulsory_hbm_bytes": program["program_hbm_bytes"],
    }


@dataclass
class Report:
    target: str
    cycles: float
    time_us: float
    roofline_cycles: float
    roofline_ratio: float
    bottleneck: str
    roofline_components: dict[str, float]
    utilization: dict[str, float]
    engine_busy: dict[str, float]
    hbm_bytes: int
    compulsory_hbm_bytes: int
    instructions: int
    instructions_by_engine: dict[str, int]
    macs: int
    kernels: int  # barrier-separated groups the simulator ran (linked kernels form one)
    simulate_seconds: float
    clock_ghz: float = 0.0  # the core clock: the time base of every cycle figure
    # the roofline formula over the program's own work (max over resources) and its parts
    program_work_cycles: float = 0.0
    program_work_components: dict[str, float] = field(default_factory=dict)
    # engine -> reason ("semaphore", DMA queues also "hbm_bandwidth") -> cycles lost
    stalls: dict[str, dict[str, float]] = field(default_factory=dict)
    # bytes moved per memory level: hbm_read, hbm_written, sram, accumulator
    bytes_moved: dict[str, int] = field(default_factory=dict)
    # simulator.energy.Energy as a dict: *_pj components, total_pj, joules, watts, ...
    energy: dict[str, float] = field(default_factory=dict)
    # HBM footprint (bytes): size, persistent (inputs, weights, constants), and the
    # intermediates' peak (shared by liveness, plan-hbm) against their sum
    hbm_plan: dict[str, int] = field(default_factory=dict)
    # the compiler's optimisation remarks (passes/remarks.py: pass_name, kind, message, loc)
    remarks: list[dict[str, str]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    launches: int = 0  # kernel launches of the program (0: not known, a bare stream)
    # the chain of instructions that set `cycles` (simulator/critical_path.py, `to_dict`);
    # empty unless asked for (`run_program(..., critical_path=True)`, `tilecc run --critical-path`)
    critical_path: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        b, en = self.bytes_moved, self.energy
        lines = [
            f"target            {self.target}",
            f"cycles            {self.cycles:,.0f} (core clock {self.clock_ghz:g} GHz: {self.time_us:,.2f} us)",
            f"roofline bound    {self.roofline_cycles:,.0f} cycles, set by {self.bottleneck} "
            "(the workload's intrinsic work)",
            f"roofline ratio    {self.roofline_ratio:.2f}x  (1.00 is the physical limit)",
            "bound by resource " + ", ".join(f"{k} {v:,.0f}" for k, v in self.roofline_components.items()),
            f"program work      {self.program_work_cycles:,.0f} cycles "
            f"({self.program_work_cycles / max(self.roofline_cycles, 1.0):.2f} of the bound): the compiler's "
            "added work (" + ", ".join(f"{k} {v:,.0f}" for k, v in self.program_work_components.items()) + ")",
            "utilisation       " + ", ".join(f"{k} {v:.1%}" for k, v in self.utilization.items()),
        ]
        stalls = [
            f"{eng} " + " ".join(f"{_SHORT.get(k, k)} {v:,.0f}" for k, v in reasons.items() if v > 0)
            for eng, reasons in self.stalls.items()
            if any(v > 0 for v in reasons.values())
        ]
        if self.stalls:
            lines.append("stall cycles      " + (", ".join(stalls) if stalls else "none"))
        lines.append(
            f"HBM traffic       {self.hbm_bytes:,} bytes (compulsory {self.compulsory_hbm_bytes:,})"
        )
        hp = self.hbm_plan
        if hp:
            lines.append(
                f"HBM footprint     {hp['size']:,} bytes: inputs, weights and constants "
                f"{hp['persistent']:,}, intermediates {hp['intermediate_peak']:,} at peak "
                f"(sum {hp['intermediate_total']:,})"
            )
        if b:
            lines.append(
                f"memory traffic    HBM read {b.get('hbm_read', 0):,} written {b.get('hbm_written', 0):,}, "
                f"SRAM {b.get('sram', 0):,}, accumulator {b.get('accumulator', 0):,} bytes"
            )
        lines += [
            f"instructions      {self.instructions:,} ("
            + ", ".join(f"{k} {v:,}" for k, v in self.instructions_by_engine.items())
            + (f") in {self.launches} kernel launches, {self.kernels} barrier-separated "
               f"group{'s' if self.kernels != 1 else ''}" if self.launches else f") in {self.kernels} kernels"),
            f"MACs              {self.macs:,}",
        ]
        if self.remarks:
            kinds = [r["kind"] for r in self.remarks]
            lines.append(
                f"remarks           {len(kinds)} (" + ", ".join(f"{k} {kinds.count(k)}" for k in dict.fromkeys(kinds))
                + "; `tilecc explore --remarks` lists them)"
            )
        f64 = [r for r in self.remarks if r["message"].startswith("float64 computed in fp32")]
        if f64:
            lines.append(f"float64           {len(f64)} ops / inputs computed in fp32 (tilecc's float64 policy)")
        if self.critical_path:
            lines += critical_path_lines(self.critical_path)
        if en:
            lines.append(
                f"energy            {en['total_pj'] * 1e-6:,.3f} uJ "
                f"(static {en['static_pj'] * 1e-6:,.3f}), {en['watts']:.3g} W average, "
                f"{en['tops_per_watt']:.3g} TOPS/W"
            )
        return "\n".join(lines)


_SHORT = {"semaphore": "sem", "hbm_bandwidth": "hbm"}


def critical_path_lines(cp: dict[str, Any], top: int = 5) -> list[str]:
    """Report lines of a `CriticalPath.to_dict()`: the chain's cycles by kind, then the
    kernels it spends most in (each shared kernel's launches summed, ``name xN``, when a
    kernel runs more than once on the chain: a model of identical layers)."""
    total = max(float(cp["cycles"]), 1.0)
    kinds = sorted(((k, v) for k, v in cp["by_kind"].items() if v > 0), key=lambda kv: -kv[1])
    lines = [f"critical path     {cp['instructions']:,} instructions set the cycles: "
             + ", ".join(f"{k} {v / total:.1%}" for k, v in kinds)]
    families = cp.get("by_family", [])
    shared = any(row["launches"] > 1 for row in families)
    for row in (families if shared else cp["by_kernel"])[:top]:
        d = row["by_kind"]
        main = max(d, key=lambda k: d[k])
        name = f"{row['kernel']} x{row['launches']}" if shared else row["kernel"]
        lines.append(f"  {name[:36]:36s} {row['cycles']:>12,.0f} cycles {row['cycles'] / total:6.1%} "
                     f"(most {main}: {d[main] / total:.1%})")
    return lines


def make_report(
    sim: SimResult, work: dict[str, float], cfg: HardwareConfig, simulate_seconds: float,
    hbm_plan: dict[str, int] | None = None,
    remarks: list[dict[str, str]] | None = None,
    launches: int = 0,
) -> Report:
    """The report of `sim`, a run of a program whose `work` holds the intrinsic figures
    (`WORK_KEYS`, the bound's) and its own (`program_*`, see `program_work`)."""
    # the 8-bit MACs too (W8A8, fp8 x fp8): without them an int8 x int8 matmul's array
    # time was missing from the bound (older programs have no such keys: 0)
    comps = roofline({**{k: work[k] for k in WORK_KEYS}, **{k: work.get(k, 0.0) for k in LOWP_WORK_KEYS}}, cfg)
    bottleneck = max(comps, key=lambda k: comps[k])
    bound = max(max(comps.values()), 1.0)
    own = roofline(_as_work(work), cfg)
    cycles = float(sim.cycles)
    energy = energy_model.from_result(sim, cfg)
    return Report(
        target=cfg.name,
        cycles=cycles,
        time_us=cycles / (cfg.clock_ghz * 1e3),
        roofline_cycles=bound,
        roofline_ratio=cycles / bound if bound else float("inf"),
        bottleneck=bottleneck,
        roofline_components=comps,
        utilization={k: sim.utilization[k] for k in ("dma", "matrix", "vector") if k in sim.utilization},
        engine_busy=dict(sim.engine_busy),
        hbm_bytes=int(sim.hbm_bytes_read + sim.hbm_bytes_written),
        compulsory_hbm_bytes=int(work["compulsory_hbm_bytes"]),
        instructions=int(sim.instructions),
        instructions_by_engine=dict(sim.instructions_by_engine),
        macs=int(sim.macs),
        kernels=int(sim.kernels),
        launches=int(launches),
        simulate_seconds=simulate_seconds,
        clock_ghz=cfg.clock_ghz,
        program_work_cycles=max(own.values()),
        program_work_components=own,
        stalls={e: dict(r) for e, r in getattr(sim, "stalls", {}).items()},
        bytes_moved={
            "hbm_read": int(sim.hbm_bytes_read),
            "hbm_written": int(sim.hbm_bytes_written),
            "sram": int(sim.sram_bytes) - int(getattr(sim, "acc_bytes", 0)),
            "accumulator": int(getattr(sim, "acc_bytes", 0)),
        },
        energy=energy.to_dict(),
        hbm_plan=dict(hbm_plan or {}),
        remarks=list(remarks or []),
    )
