"""`tilecc explore --html`: one self-contained page, rendered by headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tilecc.cli import main
from tilecc.explore import explore, load_source
from tilecc.explore_html import kernel_figures, render_html

ROOT = Path(__file__).resolve().parent.parent
MLP = f"{ROOT}/examples/mlp.py:mlp"
SECTIONS = ("summary", "source", "stages", "passes", "remarks", "timeline", "roofline")


@pytest.fixture(scope="module")
def mlp():
    return explore(load_source(MLP), "tiny", 2)


def test_page_is_self_contained(mlp):
    page = render_html(mlp)
    for s in SECTIONS:
        assert f"<section id='{s}'>" in page
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page)  # nothing fetched
    assert "<script src" not in page and "<link" not in page
    assert "<div id='L20'><span class='ln'>20</span>" in page  # the source, line-anchored
    assert re.search(r"<a href='#L\d+'>mlp\.py:\d+</a>", page)  # locations link to it
    for p in mlp.passes:
        assert f"<summary>{p.name}: " in page
    assert page.count("<rect x=") >= len(mlp.program.stream)  # one span per instruction (+ kernels)


def test_kernel_figures_add_up(mlp):
    rows = kernel_figures(mlp)
    assert [r["kernel"] for r in rows] == [k for k, _, _ in mlp.program.kernels]
    assert sum(r["macs"] for r in rows) == mlp.report.macs
    assert all(r["cycles"] > 0 for r in rows)
    # linked kernels (codegen/link.py) overlap in time: each lies within the run
    assert all(r["cycles"] <= mlp.report.cycles for r in rows)


def test_page_renders_in_headless_chromium(mlp, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    page = tmp_path / "mlp.html"
    page.write_text(render_html(mlp))
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    m = re.search(r"<span id=\"render-check\">([^<]*)</span>", out.stdout)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    check = dict(kv.split("=") for kv in m.group(1).split())
    assert int(check["sections"]) == len(SECTIONS)
    n_spans = sum(1 for e in mlp.trace["traceEvents"] if e.get("ph") == "X")
    assert int(check["timeline-rects"]) == n_spans > 0
    plotted = sum(1 for r in kernel_figures(mlp) if r["macs"] > 0)
    assert int(check["roofline-points"]) == plotted > 0
    assert int(check["timeline-width"]) == 1100  # laid out at its size


def test_no_run_page_has_no_timeline(tmp_path, capsys):
    page = tmp_path / "p.html"
    assert main(["explore", MLP, "--html", str(page), "--no-run"]) == 0
    text = page.read_text()
    assert "not simulated (--no-run)" in text and "<section id='roofline'>" in text
    assert f"// wrote {page}" in capsys.readouterr().out
