"""The report of a run with the collectives in the instruction streams (runtime/system_stream.py;
a pipeline's sends: runtime/pipeline_stream.py, through `streams_report`).

    rep = stream_report(ssp, run)      # a runtime/system_report.py SystemReport
    rep.time_us, rep.comm_us, rep.comm_exposed_share, rep.extra["hidden_share"]

Communication time: the union, over all chips, of the intervals a link transfer is in flight
(a send's start to its last byte's arrival). Exposed: the run's time less the time of the
same streams with free links (infinite bandwidth, no latency); hidden share = 1 - exposed /
communication (simulator/multichip.py). Per chip: busy = time with any engine's
instruction in flight. Per link: bytes and utilisation (bytes / (bandwidth x run time)).
Energy: per chip, `simulator/energy.py`'s estimate of its stream's work (MACs, SRAM, ACC
and HBM traffic; the link transfers' HBM reads and writes counted as HBM traffic) with
static power over the whole run; plus the links' (pJ per byte per link crossed, static
power per link).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilecc.runtime.system_report import ChipFigures, LinkFigures, SystemReport
from tilecc.runtime.system_stream import StreamProgram, StreamRun
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.energy import estimate
from tilecc.simulator.interconnect.system import SystemConfig
from tilecc.simulator.isa import ITEMSIZE, DType
from tilecc.simulator.stats import counts

__all__ = ["stream_report", "streams_report"]


def stream_report(ssp: StreamProgram, run: StreamRun) -> SystemReport:
    sp = ssp.system
    extra = {"tp": sp.tp, "collectives": "stream", "chunks": ssp.chunks}
    return streams_report(sp.system, ssp.streams, run, tp=sp.tp, segments=len(sp.programs), extra=extra)


def streams_report(system: SystemConfig, streams: list[np.ndarray], run: StreamRun, *, tp: int, segments: int,
                   extra: dict[str, Any]) -> SystemReport:
    """The report of any co-simulated run of per-chip streams (tensor parallelism's or a
    pipeline's, runtime/pipeline_stream.py); `extra` names the parallelism."""
    res = run.result
    topo, link = system.topology, system.link
    total_ns = res.finish_ns
    ghz = res.clock_ghz
    chips = []
    for r, ct in enumerate(res.chips):
        work = ct.end >= 0
        iv = sorted(zip(ct.start[work].tolist(), ct.end[work].tolist()))
        busy, hi = 0.0, -np.inf
        for a, b in iv:
            if b > hi:
                busy += b - max(a, hi)
                hi = b
        chips.append(ChipFigures(r, busy / ghz / 1e3, (total_ns - busy / ghz) / 1e3,
                                 _chip_energy(system, streams[r], r, total_ns * ghz), ct.finish))
    links = []
    for i in range(len(topo.link_src)):
        cap = link.bandwidth_gbs * float(topo.link_scale[i]) * total_ns
        b = float(res.link_bytes[i])
        links.append(LinkFigures(i, int(topo.link_src[i]), int(topo.link_dst[i]), b, b / cap if cap > 0 else 0.0))
    link_energy = float(res.link_bytes.sum()) * link.pj_per_byte * 1e-12 \
        + link.static_watts * len(topo.link_src) * total_ns * 1e-9
    exposed = run.exposed_ns
    extra = dict(extra, hidden_share=round(run.hidden_share, 4), free_links_us=round(run.free_ns / 1e3, 4))
    return SystemReport(topo.spec, system.chips, tp, total_ns / 1e3, (total_ns - exposed) / 1e3,
                        res.comm_ns / 1e3, exposed / total_ns if total_ns > 0 else 0.0, chips, links,
                        run.collectives, sum(c.energy_j for c in chips) + link_energy, link_energy,
                        segments, extra)


def _chip_energy(system: SystemConfig, stream: np.ndarray, r: int, cycles: float) -> float:
    cfg = system.chip_config(r)
    prog = DecodedProgram(stream, cfg)
    f = counts(prog)
    link = prog.is_link
    isz = np.array([ITEMSIZE[DType(int(d))] for d in prog.col["a_dtype"][link]], np.int64)
    size = prog.rows[link] * prog.cols[link] * isz
    # a send reads its source, a receive writes its destination, a reducing one also reads its addend
    link_hbm = int(size.sum() + size[prog.is_reduce_recv[link]].sum())
    e = estimate(cfg, cycles=cycles, macs=f.get("macs", 0), macs_fp32=f.get("macs_fp32", 0),
                 sram_bytes=f.get("sram_bytes", 0) - f.get("acc_bytes", 0), acc_bytes=f.get("acc_bytes", 0),
                 hbm_bytes=f.get("hbm_bytes_read", 0) + f.get("hbm_bytes_written", 0) + link_hbm)
    return float(e.joules)
