"""A Perfetto trace of a run with the collectives in the streams (runtime/system_stream.py):
a process per chip with a track per engine (its DMA queues, matrix, vector, link queues:
a slice per instruction, named by its opcode and kernel), and one process for the links
(a track per directed link that carried bytes: a slice per transfer while it streams).

    write_stream_trace("run.json", ssp, run)       # open in ui.perfetto.dev

A chip's process id is chip + 1, the links' is chips + 1; times in microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tilecc.runtime.system_stream import StreamProgram, StreamRun
from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.interconnect.routing import route
from tilecc.simulator.interconnect.system import SystemConfig
from tilecc.simulator.isa import Opcode

__all__ = ["write_stream_trace", "write_streams_trace"]


def write_stream_trace(path: str | Path, ssp: StreamProgram, run: StreamRun) -> Path:
    return write_streams_trace(path, ssp.system.system, ssp.streams, ssp.kernels, run)


def write_streams_trace(path: str | Path, system: SystemConfig, streams: list[np.ndarray],
                        kernels: list[list[tuple[str, int, int]]], run: StreamRun) -> Path:
    """The trace of any co-simulated run of per-chip streams; `kernels`: per chip, the
    (name, first instruction, count) spans that name its slices."""
    res = run.result
    topo = system.topology
    n = len(streams)
    to_us = 1.0 / (res.clock_ghz * 1e3)
    events: list[dict[str, Any]] = []
    links_pid = n + 1
    used: set[int] = set()
    for r in range(n):
        pid = r + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"chip {r}"}})
        prog = DecodedProgram(streams[r], system.chip_config(r))
        for e, name in enumerate(prog.engine_names):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": e + 1, "args": {"name": name}})
        kernel_of = np.full(prog.n, -1, np.int64)
        names = [k for k, _, _ in kernels[r]]
        for k, (_, start, count) in enumerate(kernels[r]):
            kernel_of[start: start + count] = k
        start, end = res.chips[r].start, res.chips[r].end
        for i in np.flatnonzero(~prog.is_barrier).tolist():
            op = Opcode(int(prog.op[i])).name
            k = int(kernel_of[i])
            events.append({"ph": "X", "name": op, "pid": pid, "tid": int(prog.eng[i]) + 1,
                           "ts": float(start[i]) * to_us, "dur": float(end[i] - start[i]) * to_us,
                           "args": {"instruction": i, "kernel": names[k] if k >= 0 else ""}})
            if prog.is_send[i]:
                peer = int(prog.col["k"][i])
                nbytes = int(prog.rows[i] * prog.cols[i])
                for lk in route(topo, r, peer):
                    used.add(lk)
                    events.append({"ph": "X", "name": f"chip {r} -> chip {peer}", "pid": links_pid, "tid": lk + 1,
                                   "ts": float(start[i]) * to_us, "dur": float(end[i] - start[i]) * to_us,
                                   "args": {"elements": nbytes, "instruction": i}})
    events.append({"ph": "M", "name": "process_name", "pid": links_pid, "args": {"name": "links"}})
    for lk in sorted(used):
        events.append({"ph": "M", "name": "thread_name", "pid": links_pid, "tid": lk + 1,
                       "args": {"name": f"link {int(topo.link_src[lk])}->{int(topo.link_dst[lk])}"}})
    p = Path(path)
    p.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}), encoding="utf-8")
    return p
