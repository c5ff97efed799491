"""`tilecc explore --html PAGE`: one self-contained page (no network) of an `Exploration`.

Sections (each a ``<section id=...>``): ``summary`` (target, cycles, roofline ratio,
whether the run matches the reference), ``source`` (the user's file with line anchors
``#L42``; every remark and location links there), ``stages`` (graph, tile, npu and asm
side by side), ``passes`` (per pass: its time and a unified diff, or "no change"),
``remarks``, ``timeline`` (the simulator's engine timeline as inline SVG, one row per
track of the Perfetto trace) and ``roofline`` (each kernel's achieved MACs per cycle
against its arithmetic intensity, under the target's matrix and HBM roofs). A few
lines of inline script count what rendered into ``#render-check`` (the headless
Chromium test reads it back).
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

from tilecc.explore import STAGES, Exploration, pass_diff
from tilecc.simulator.timing import core_cycles_per

MAX_STAGE_LINES = 4000  # per stage column; the rest is summarised
MAX_TIMELINE_RECTS = 20000

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#234;color:#fff;padding:10px 16px}header h1{font-size:18px;margin:0}
nav a{color:#cde;margin-right:12px}section{margin:12px 16px;padding:8px 12px;background:#fff;
border:1px solid #ddd;border-radius:4px}h2{font-size:15px;margin:4px 0 8px}
pre{font:12px/1.35 ui-monospace,monospace;margin:0;white-space:pre;overflow:auto}
.cols{display:flex;gap:8px}.col{flex:1;min-width:0;border:1px solid #eee}
.col h3{font-size:13px;margin:0;padding:4px;background:#eef}.col pre{max-height:600px}
.src span.ln{color:#999;display:inline-block;width:4em;text-align:right;margin-right:8px}
.src div:target{background:#ffa}.add{background:#e6ffed}.del{background:#ffeef0}.hunk{color:#07c}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
.passed{color:#070}.missed{color:#b00}.analysis{color:#05a}details{margin:4px 0}
"""

_SCRIPT = """
(function(){
  var s = document.querySelectorAll('section').length;
  var r = document.querySelectorAll('#timeline svg rect').length;
  var k = document.querySelectorAll('#roofline svg circle').length;
  var box = document.querySelector('#timeline svg');
  var w = box ? Math.round(box.getBoundingClientRect().width) : 0;
  document.getElementById('render-check').textContent =
    'sections=' + s + ' timeline-rects=' + r + ' roofline-points=' + k + ' timeline-width=' + w;
})();
"""


def write_html(ex: Exploration, path: str | Path) -> Path:
    p = Path(path)
    p.write_text(render_html(ex), encoding="utf-8")
    return p


def render_html(ex: Exploration) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tilecc explore: {e(ex.source.name)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>tilecc explore: {e(ex.source.name)}</h1><nav>",
        *(f"<a href='#{s}'>{s}</a>" for s in ("summary", "source", "stages", "passes", "remarks", "timeline",
                                              "roofline")),
        "</nav></header>",
        _summary(ex), _source(ex), _stages(ex), _passes(ex), _remarks(ex), _timeline(ex), _roofline(ex),
        "<footer style='margin:16px;color:#888'>render check: <span id='render-check'>not rendered</span></footer>",
        f"<script>{_SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts)


def _summary(ex: Exploration) -> str:
    rows = [("source", ex.source.name), ("target", ex.target), ("optimisation", f"-O{ex.opt_level}"),
            ("compile", f"{ex.compile_seconds:.2f} s, {len(ex.passes)} passes")]
    r = ex.report
    if r is not None:
        rows += [("cycles", f"{r.cycles:,.0f} ({r.time_us:,.2f} us)"),
                 ("roofline", f"{r.roofline_cycles:,.0f} cycles, set by {r.bottleneck}; ratio {r.roofline_ratio:.2f}x"),
                 ("utilisation", ", ".join(f"{k} {v:.1%}" for k, v in r.utilization.items())),
                 ("matches reference", f"{'yes' if ex.matches else 'NO'} (max abs error {ex.max_abs_error:.3g})")]
    rows.append(("remarks", f"{len(ex.remarks)}"))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<section id='summary'><h2>Summary</h2><table>{body}</table></section>"


def _source(ex: Exploration) -> str:
    lines = ex.source.text.splitlines()
    body = "".join(f"<div id='L{i}'><span class='ln'>{i}</span>{html.escape(t)}</div>"
                   for i, t in enumerate(lines, 1))
    return (f"<section id='source'><h2>Source: {html.escape(ex.source.path or ex.source.name)}</h2>"
            f"<pre class='src'>{body}</pre></section>")


def _link_locs(escaped: str, src_name: str) -> str:
    """``file:line`` of the source's own file in escaped text -> a link to that line
    (an exact-name pattern: linear even on long constants' hex strings)."""
    pat = re.compile(r"(?<![\w.\-])" + re.escape(Path(src_name).name) + r":(\d+)")
    return pat.sub(lambda m: f"<a href='#L{m.group(1)}'>{m.group(0)}</a>", escaped)


def _capped(text: str) -> str:
    lines = text.splitlines()
    if len(lines) <= MAX_STAGE_LINES:
        return text
    return "\n".join(lines[:MAX_STAGE_LINES]) + f"\n... {len(lines) - MAX_STAGE_LINES:,} more lines"


def _stages(ex: Exploration) -> str:
    src = Path(ex.source.path or ex.source.name).name
    cols = []
    for s in STAGES:
        try:
            text = ex.stage(s)
        except Exception:  # a pipeline without that stage
            continue
        cols.append(f"<div class='col'><h3>{s}</h3><pre>{_link_locs(html.escape(_capped(text)), src)}</pre></div>")
    return f"<section id='stages'><h2>Stages</h2><div class='cols'>{''.join(cols)}</div></section>"


def _diff_html(text: str) -> str:
    out = []
    for line in text.splitlines():
        cls = ""
        if line.startswith("+") and not line.startswith("+++"):
            cls = "add"
        elif line.startswith("-") and not line.startswith("---"):
            cls = "del"
        elif line.startswith("@@"):
            cls = "hunk"
        out.append(f"<span class='{cls}'>{html.escape(line)}</span>" if cls else html.escape(line))
    return "\n".join(out)


def _passes(ex: Exploration) -> str:
    items = []
    for p in ex.passes:
        status = "changed" if p.changed else "no change"
        diff = _capped(pass_diff(p)) if p.changed else "no change"
        items.append(f"<details class='pass'><summary>{html.escape(p.name)}: {status}, {p.seconds * 1e3:.1f} ms"
                     f"</summary><pre>{_diff_html(diff)}</pre></details>")
    return f"<section id='passes'><h2>Passes (diff of each)</h2>{''.join(items)}</section>"


def _remarks(ex: Exploration) -> str:
    src = Path(ex.source.path or ex.source.name).name
    rows = "".join(
        f"<tr><td>{_link_locs(html.escape(r.loc), src)}</td><td>{html.escape(r.pass_name)}</td>"
        f"<td class='{r.kind}'>{r.kind}</td><td>{html.escape(r.message)}</td></tr>"
        for r in ex.remarks
    )
    return (f"<section id='remarks'><h2>Remarks ({len(ex.remarks)})</h2><table><tr><th>location</th>"
            f"<th>pass</th><th>kind</th><th>message</th></tr>{rows}</table></section>")


_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _timeline(ex: Exploration) -> str:
    if ex.trace is None:
        return "<section id='timeline'><h2>Engine timeline</h2><p>not simulated (--no-run)</p></section>"
    events = ex.trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    total = max((e["args"].get("start_cycle", 0) + e["args"].get("cycles", 0) for e in spans), default=1) or 1
    tids = sorted(names)
    width, row, left = 1100, 18, 120
    height = row * len(tids) + 30
    scale = (width - left - 10) / total
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img'>"]
    for i, tid in enumerate(tids):
        y = 10 + i * row
        out.append(f"<text x='4' y='{y + 12}' font-size='11'>{html.escape(names[tid])}</text>")
    drawn = 0
    for e in spans:
        if drawn >= MAX_TIMELINE_RECTS or e["tid"] not in names:
            continue
        a = e["args"]
        x = left + a.get("start_cycle", 0) * scale
        w = max(a.get("cycles", 0) * scale, 0.5)
        y = 10 + tids.index(e["tid"]) * row
        color = _COLORS[hash(e.get("cat", "")) % len(_COLORS)] if e.get("cat") != "kernel" else \
            _COLORS[a.get("kernel", 0) % len(_COLORS)]
        out.append(f"<rect x='{x:.2f}' y='{y}' width='{w:.2f}' height='{row - 4}' fill='{color}'>"
                   f"<title>{html.escape(e['name'])}: {a.get('cycles', 0):,.0f} cycles from "
                   f"{a.get('start_cycle', 0):,.0f}{' ' + html.escape(a['asm']) if 'asm' in a else ''}</title></rect>")
        drawn += 1
    out.append(f"<text x='{left}' y='{height - 4}' font-size='11'>0</text>"
               f"<text x='{width - 90}' y='{height - 4}' font-size='11'>{total:,.0f} cycles</text></svg>")
    note = f"<p>{drawn:,} of {len(spans):,} spans drawn.</p>" if drawn < len(spans) else ""
    return (f"<section id='timeline'><h2>Engine timeline ({total:,.0f} cycles; hover for instructions; "
            f"the same trace opens in ui.perfetto.dev via tilecc run --trace)</h2>{''.join(out)}{note}</section>")


def kernel_figures(ex: Exploration) -> list[dict]:
    """Per kernel: cycles (from the trace), MACs, HBM bytes moved, vector element-cycles."""
    from tilecc.runtime.report import stream_work

    cycles = {}
    if ex.trace is not None:
        for e in ex.trace["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "kernel":
                cycles[e["name"]] = cycles.get(e["name"], 0) + e["args"]["cycles"]
    cfg = ex.program.config
    rows = []
    for name, first, count in ex.program.kernels:
        w = stream_work(ex.program.stream[first:first + count], cfg)
        macs = w["macs_16"] + w["macs_fp32"]
        rows.append({"kernel": name, "cycles": float(cycles.get(name, 0)), "macs": macs,
                     "hbm_bytes": w["hbm_bytes"], "fp32": w["macs_fp32"] > 0,
                     "vector_cycles": w["vector_element_cycles"] / cfg.vector.lanes
                     * core_cycles_per(cfg, "vector")})
    return rows


def _roofline(ex: Exploration) -> str:
    cfg = ex.program.config
    rows = kernel_figures(ex)
    peak = cfg.matrix.rows * cfg.matrix.cols / core_cycles_per(cfg, "matrix")  # MACs per core cycle
    peak32 = peak / cfg.matrix.fp32_slowdown
    bw = cfg.hbm.bytes_per_cycle
    pts = [r for r in rows if r["macs"] > 0 and r["hbm_bytes"] > 0 and r["cycles"] > 0]
    W, H, L, B = 640, 360, 60, 40
    x_lo, x_hi = 1e-2, 1e4
    y_lo, y_hi = max(peak / 1e4, 1e-2), peak * 2

    def X(ai: float) -> float:
        return L + (math.log10(max(ai, x_lo)) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (W - L - 10)

    def Y(v: float) -> float:
        return (H - B - (math.log10(max(v, y_lo)) - math.log10(y_lo))
                / (math.log10(y_hi) - math.log10(y_lo)) * (H - B - 10))

    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' role='img'>",
           f"<rect x='{L}' y='10' width='{W - L - 10}' height='{H - B - 10}' fill='none' stroke='#999'/>"]
    for peak_v, dash, label in ((peak, "", "matrix peak (bf16)"), (peak32, "4 3", "matrix peak (fp32)")):
        knee = peak_v / bw
        svg.append(f"<polyline fill='none' stroke='#c33' stroke-dasharray='{dash}' points='{X(x_lo):.1f},"
                   f"{Y(bw * x_lo):.1f} {X(knee):.1f},{Y(peak_v):.1f} {X(x_hi):.1f},{Y(peak_v):.1f}'/>"
                   f"<text x='{X(x_hi) - 130:.1f}' y='{Y(peak_v) - 3:.1f}' font-size='10'>{label} {peak_v:,.0f}</text>")
    for r in pts:
        ai, perf = r["macs"] / r["hbm_bytes"], r["macs"] / r["cycles"]
        svg.append(f"<circle cx='{X(ai):.1f}' cy='{Y(perf):.1f}' r='4' fill='#4e79a7'>"
                   f"<title>{html.escape(r['kernel'])}: "
                   f"{ai:.2f} MACs/byte, {perf:,.1f} MACs/cycle</title></circle>")
    svg.append(f"<text x='{W / 2 - 80}' y='{H - 8}' font-size='11'>arithmetic intensity (MACs per HBM byte, log)</text>"
               f"<text x='4' y='20' font-size='11'>MACs/cycle</text></svg>")
    table = "".join(
        f"<tr><td>{html.escape(r['kernel'])}</td><td>{r['cycles']:,.0f}</td><td>{r['macs']:,.0f}</td>"
        f"<td>{r['hbm_bytes']:,.0f}</td><td>{r['vector_cycles']:,.0f}</td>"
        f"<td>{_bound(r, peak, peak32, bw)}</td></tr>" for r in rows)
    return (f"<section id='roofline'><h2>Roofline of the kernels ({len(pts)} with matrix work plotted)</h2>"
            f"{''.join(svg)}<table><tr><th>kernel</th><th>cycles</th><th>MACs</th><th>HBM bytes</th>"
            f"<th>vector cycles at full rate</th><th>bound (cycles / lower bound)</th></tr>{table}</table></section>")


def _bound(r: dict, peak: float, peak32: float, bw: float) -> str:
    comps = {"matrix": r["macs"] / (peak32 if r["fp32"] else peak), "hbm": r["hbm_bytes"] / bw,
             "vector": r["vector_cycles"]}
    which = max(comps, key=comps.__getitem__)
    lower = comps[which]
    ratio = f", {r['cycles'] / lower:.2f}x" if lower > 0 and r["cycles"] > 0 else ""
    return f"{which}{ratio}"


__all__ = ["kernel_figures", "render_html", "write_html"]
