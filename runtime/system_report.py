"""The report of a system run: per chip, per link, and the communication's share.

    rep = system_report(sp, timeline)
    rep.time_us, rep.comm_us, rep.comm_exposed_share
    rep.chips[r]     # busy_us, idle_us (waiting on the group or the links), energy_j
    rep.links[i]     # src, dst, bytes, utilisation (bytes / (bandwidth x run time))
    print(rep)

With tensor parallelism no communication is hidden today: collectives run between
segments, after the last chip of the group is done (runtime/system_run.py), so every
collective's time is exposed. In a pipeline (runtime/pipeline_run.py) a stage computes the
next micro-batch while the last one travels: the exposed part is the run's time less the
time of the same schedule with free transfers. Energy is the chips' simulated energy plus
the links' (pJ per byte per link crossed, static power per link over the run:
`[system.link]`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tilecc.runtime.system_run import SystemTimeline


@dataclass
class ChipFigures:
    chip: int
    busy_us: float
    idle_us: float
    energy_j: float
    cycles: float


@dataclass
class LinkFigures:
    link: int
    src: int  # chip id, or a switch id >= chips
    dst: int
    bytes: float
    utilisation: float


@dataclass
class SystemReport:
    system: str
    chips_count: int
    tp: int
    time_us: float
    compute_us: float  # the time less the exposed communication
    comm_us: float
    comm_exposed_share: float  # communication time not hidden under compute / total time
    chips: list[ChipFigures]
    links: list[LinkFigures]
    collectives: list[dict[str, Any]]
    energy_j: float
    link_energy_j: float
    segments: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def link_bytes(self) -> float:
        return sum(lk.bytes for lk in self.links)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["link_bytes"] = self.link_bytes
        return d

    def __str__(self) -> str:
        par = ", ".join(f"{k}={v}" for k, v in self.extra.items()) or f"tp={self.tp}"
        lines = [f"system {self.system}: {self.chips_count} chips, {par}, {self.segments} segments",
                 f"  time            {self.time_us:12.2f} us",
                 f"  compute         {self.compute_us:12.2f} us",
                 f"  communication   {self.comm_us:12.2f} us  (exposed: {100 * self.comm_exposed_share:.1f}% of "
                 f"the time)",
                 f"  energy          {self.energy_j * 1e6:12.2f} uJ  (links {self.link_energy_j * 1e6:.2f} uJ)",
                 "  chip   busy us    idle us   energy uJ"]
        lines += [f"  {c.chip:4d} {c.busy_us:9.2f} {c.idle_us:10.2f} {c.energy_j * 1e6:11.2f}" for c in self.chips]
        used = [lk for lk in self.links if lk.bytes > 0]
        lines.append(f"  links used: {len(used)} of {len(self.links)}; bytes {self.link_bytes:.0f}; busiest "
                     + (f"{max(used, key=lambda lk: lk.utilisation).utilisation:.1%}" if used else "-"))
        groups: dict[tuple, int] = {}  # identical collectives on one line, in order of first use
        for c in self.collectives:
            key = (c["op"], c["bytes"], c["algorithm"], round(c["time_us"], 6))
            groups[key] = groups.get(key, 0) + 1
        for (op, nbytes, algo, t_us), count in groups.items():
            lines.append(f"  {op:15s} x{count:<3d} {nbytes:10d} B  {algo:18s} {t_us:9.2f} us each")
        return "\n".join(lines)


def system_report(sp: Any, tl: SystemTimeline) -> SystemReport:
    """`sp`: a SystemProgram or a PipelineProgram (runtime/pipeline_run.py)."""
    topo, link = sp.system.topology, sp.system.link
    total_ns = tl.total_ns
    chips = []
    for r in range(sp.system.chips):
        busy = sum(e.end_ns - e.start_ns for e in tl.events if e.kind == "segment" and e.chip == r)
        reps = tl.chip_reports[r]
        energy = sum(float(rep.energy.get("joules", 0.0)) for rep in reps)
        cycles = sum(rep.cycles for rep in reps)
        chips.append(ChipFigures(r, busy / 1e3, (total_ns - busy) / 1e3, energy, cycles))
    links = []
    for i in range(len(topo.link_src)):
        cap = link.bandwidth_gbs * float(topo.link_scale[i]) * total_ns  # bytes the link could carry
        b = float(tl.link_bytes[i])
        links.append(LinkFigures(i, int(topo.link_src[i]), int(topo.link_dst[i]), b, b / cap if cap > 0 else 0.0))
    comm = [e for e in tl.events if e.kind == "collective"]
    comm_ns = sum(e.end_ns - e.start_ns for e in comm)
    link_static = link.static_watts * len(topo.link_src) * total_ns * 1e-9
    link_energy = float(tl.link_bytes.sum()) * link.pj_per_byte * 1e-12 + link_static
    collectives = [dict(op=e.name, bytes=int(e.detail["bytes"]), algorithm=str(e.detail["algorithm"]),
                        time_us=(e.end_ns - e.start_ns) / 1e3, value=e.detail["value"]) for e in comm]
    exposed = comm_ns if tl.exposed_comm_ns is None else tl.exposed_comm_ns
    return SystemReport(sp.system.topology.spec, sp.system.chips, getattr(sp, "tp", 1), total_ns / 1e3,
                        (total_ns - exposed) / 1e3, comm_ns / 1e3, exposed / total_ns if total_ns > 0 else 0.0, chips,
                        links, collectives, sum(c.energy_j for c in chips) + link_energy, link_energy,
                        len(sp.programs), dict(getattr(sp, "report_extra", {})))
