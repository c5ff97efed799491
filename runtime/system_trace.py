"""A Perfetto trace of a system run: a process per chip (its engines' tracks, from each
segment's simulator trace, shifted to where the segment ran) and one for the links (a track
per directed link that carried bytes, a slice per collective).

    outs, tl = run_system(sp, inputs, trace_dir=tmp)
    write_system_trace("run.json", tl, sp.system)      # open in ui.perfetto.dev

Flow ids are made unique per chip and segment; a chip's process id is chip + 1, the links'
is chips + 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tilecc.runtime.system_run import SystemTimeline
from tilecc.simulator.interconnect.system import SystemConfig


def write_system_trace(path: str | Path, tl: SystemTimeline, system: SystemConfig) -> Path:
    events: list[dict[str, Any]] = []
    topo = system.topology
    n = system.chips
    for r in range(n):
        events.append({"ph": "M", "name": "process_name", "pid": r + 1, "args": {"name": f"chip {r}"}})
    links_pid = n + 1
    events.append({"ph": "M", "name": "process_name", "pid": links_pid, "args": {"name": "links"}})
    for i, e in enumerate(tl.events):
        if e.kind == "segment":
            events += _chip_events(e, i)
            continue
        for lk, b in enumerate(e.detail["link_bytes"]):
            if b <= 0:
                continue
            events.append({"ph": "X", "name": e.name, "pid": links_pid, "tid": lk + 1, "ts": e.start_ns / 1e3,
                           "dur": (e.end_ns - e.start_ns) / 1e3,
                           "args": {"bytes": float(b), "algorithm": e.detail["algorithm"], "value": e.detail["value"]}})
    for lk in range(len(topo.link_src)):
        if tl.link_bytes[lk] > 0:
            events.append({"ph": "M", "name": "thread_name", "pid": links_pid, "tid": lk + 1,
                           "args": {"name": f"link {int(topo.link_src[lk])}->{int(topo.link_dst[lk])}"}})
    p = Path(path)
    p.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}), encoding="utf-8")
    return p


def _chip_events(e: Any, index: int) -> list[dict[str, Any]]:
    pid = e.chip + 1
    src = e.detail.get("trace")
    if not src:  # no simulator trace: one slice for the segment
        return [{"ph": "X", "name": e.name, "pid": pid, "tid": 1, "ts": e.start_ns / 1e3,
                 "dur": (e.end_ns - e.start_ns) / 1e3}]
    data = json.loads(Path(src).read_text(encoding="utf-8"))
    raw = data["traceEvents"] if isinstance(data, dict) else data
    out = []
    for ev in raw:
        ev = dict(ev)
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            continue
        ev["pid"] = pid
        if "ts" in ev:
            ev["ts"] = ev["ts"] + e.start_ns / 1e3
        if "id" in ev:
            ev["id"] = f"{index}:{ev['id']}"
        out.append(ev)
    return out
