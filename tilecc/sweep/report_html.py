"""`DIR/report.html`: one self-contained page (no network) of a finished sweep.

Sections (each a ``<section id=...>``): ``summary`` (spec, fidelity, points, failures),
``fronts`` (per workload, one matplotlib scatter plot per pair of objectives: every
point in grey, the Pareto points (of all the objectives) in red, and the pair's own
front as a dashed step line; embedded as SVG data URIs),
``pareto`` (each Pareto point: its swept values, objectives and bottleneck, the
roofline bound's resource) and ``table`` (every row of results.csv, Pareto rows marked,
failures with their reason). A few lines of inline script count what rendered into
``#render-check`` (the headless Chromium test reads it back).

matplotlib is an optional dependency (``pip install 'tilecc[sweep]'``), checked before
the sweep starts.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
from pathlib import Path

from tilecc.sweep.backends import require
from tilecc.sweep.objectives import OBJECTIVES
from tilecc.sweep.pareto import pareto_mask
from tilecc.sweep.results import columns, write_file
from tilecc.sweep.spec import SweepSpec

__all__ = ["render_report", "write_report", "MAX_PLOTS"]

MAX_PLOTS = 12  # pairs of objectives plotted per workload

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#234;color:#fff;padding:10px 16px}header h1{font-size:18px;margin:0}
section{margin:12px 16px;padding:8px 12px;background:#fff;border:1px solid #ddd;border-radius:4px}
h2{font-size:15px;margin:4px 0 8px}table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}tr.pareto{background:#fff0f0}
td.fail{color:#b00;text-align:left}.plots img{width:420px;height:315px;margin:4px}
"""
_SCRIPT = """
(function(){
  var s = document.querySelectorAll('section').length;
  var imgs = document.querySelectorAll('#fronts img');
  var ok = 0; imgs.forEach(function(i){ if (i.complete && i.naturalWidth > 0) ok++; });
  var rows = document.querySelectorAll('#table tbody tr').length;
  var p = document.querySelectorAll('#pareto tbody tr').length;
  document.getElementById('render-check').textContent =
    'sections=' + s + ' plots=' + imgs.length + ' plots-rendered=' + ok + ' rows=' + rows + ' pareto=' + p;
})();
"""


def write_report(spec: SweepSpec, rows: list[dict[str, str]], out_dir: str | Path, fidelity: str) -> Path:
    path = Path(out_dir) / "report.html"
    write_file(path, render_report(spec, rows, fidelity).encode(), ".report-")
    return path


def render_report(spec: SweepSpec, rows: list[dict[str, str]], fidelity: str) -> str:
    e = html.escape
    title = f"tilecc sweep: {Path(spec.path).name}"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{e(title)}</h1></header>",
        _summary(spec, rows, fidelity), _fronts(spec, rows), _pareto(spec, rows), _table(spec, rows),
        "<footer style='margin:16px;color:#888'>render check: <span id='render-check'>not rendered</span></footer>",
        f"<script>{_SCRIPT}</script></body></html>",
    ]
    return "\n".join(parts)


def _label(name: str) -> str:
    o = OBJECTIVES[name]
    return f"{name} ({o.unit}, {'higher' if o.maximise else 'lower'} is better)"


def _summary(spec: SweepSpec, rows: list[dict[str, str]], fidelity: str) -> str:
    e = html.escape
    failed = sum(1 for r in rows if r["failure"])
    items = [("workloads", ", ".join(spec.workloads)), ("base", spec.base), ("strategy", spec.strategy),
             ("fidelity", fidelity), ("swept", ", ".join(f"{k} in {v}" for k, v in spec.grid.items())),
             ("objectives", ", ".join(_label(o) for o in spec.objectives)),
             ("points", f"{len(rows)}, {failed} failed, {sum(r['pareto'] == 'true' for r in rows)} Pareto")]
    body = "".join(f"<tr><th>{e(k)}</th><td style='text-align:left'>{e(v)}</td></tr>" for k, v in items)
    return f"<section id='summary'><h2>summary</h2><table>{body}</table></section>"


def _svg(fig: object) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg")  # type: ignore[attr-defined]
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fronts(spec: SweepSpec, rows: list[dict[str, str]]) -> str:
    require("matplotlib", "the sweep's report")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objs = list(spec.objectives)
    pairs = list(itertools.combinations(objs, 2))[:MAX_PLOTS] if len(objs) > 1 else [("point", objs[0])]
    out = ["<section id='fronts'><h2>Pareto fronts</h2>"]
    for w in dict.fromkeys(r.get("workload", "") for r in rows):
        mine = [r for r in rows if r.get("workload", "") == w and not r["failure"]]
        if w:
            out.append(f"<h3>{html.escape(w)}</h3>")
        out.append("<div class='plots'>")
        for x, y in pairs:
            fig, ax = plt.subplots(figsize=(5.6, 4.2))
            xs = [_num(r, x) for r in mine]
            ys = [_num(r, y) for r in mine]
            ax.scatter(xs, ys, s=14, c="#999", label="points")
            pts = [(a, b) for a, b, r in zip(xs, ys, mine) if r["pareto"] == "true"]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=30, c="#c22", label="Pareto (all objectives)",
                       zorder=3)
            if x != "point":  # this pair's own front, a step line (the same points with 2 objectives)
                two = pareto_mask([[a, b] for a, b in zip(xs, ys)], [OBJECTIVES[x].maximise, OBJECTIVES[y].maximise])
                front = sorted((a, b) for a, b, on in zip(xs, ys, two) if on)
                ax.step([p[0] for p in front], [p[1] for p in front], where="post", c="#c22", ls="--", lw=1,
                        label=f"front of {x}, {y}")
            ax.set_xlabel(_label(x) if x != "point" else "point")
            ax.set_ylabel(_label(y))
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize=8)
            fig.tight_layout()
            out.append(f"<img alt='{html.escape(f'{y} against {x}')}' src='{_svg(fig)}'>")
            plt.close(fig)
        out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


def _num(row: dict[str, str], key: str) -> float:
    try:
        return float(row[key])
    except (KeyError, ValueError):
        return math.nan


def _head(cols: list[str]) -> str:
    return "<thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr></thead>"


def _short(text: str) -> str:
    """A number at 4 significant digits (results.csv keeps every digit)."""
    try:
        v = float(text)
    except ValueError:
        return text
    return text if v.is_integer() and "e" not in text.lower() else f"{v:.4g}"


def _cells(row: dict[str, str], cols: list[str], objectives: tuple[str, ...]) -> str:
    return "".join(f"<td{' class=fail' if c == 'failure' else ''}>"
                   f"{html.escape(_short(row.get(c, '')) if c in objectives else row.get(c, ''))}</td>" for c in cols)


def _cols(spec: SweepSpec, rows: list[dict[str, str]]) -> list[str]:
    return columns(spec)


def _pareto(spec: SweepSpec, rows: list[dict[str, str]]) -> str:
    cols = [c for c in _cols(spec, rows) if c not in ("pareto", "failure")]
    body = "".join(f"<tr>{_cells(r, cols, spec.objectives)}</tr>" for r in rows if r["pareto"] == "true")
    return (f"<section id='pareto'><h2>Pareto points and their bottleneck</h2><p>bottleneck: the resource that "
            f"sets the workload's roofline bound on that design (matrix, hbm or vector)</p>"
            f"<table>{_head(cols)}<tbody>{body}</tbody></table></section>")


def _table(spec: SweepSpec, rows: list[dict[str, str]]) -> str:
    cols = _cols(spec, rows)
    body = "".join(f"<tr{' class=pareto' if r['pareto'] == 'true' else ''}>{_cells(r, cols, spec.objectives)}</tr>"
                   for r in rows)
    return f"<section id='table'><h2>all points</h2><table>{_head(cols)}<tbody>{body}</tbody></table></section>"
