"""The progress hook (simulator/progress.py) and the CLI's display of it
(tilecc/progress_display.py): events arrive in order, nothing is printed off a terminal."""

from __future__ import annotations

import io
import sys

import torch
from torch import nn

from tests.helpers import run_and_compare
from tilecc.progress_display import ProgressDisplay
from tilecc.simulator import progress
from tilecc.simulator.progress import Event


def test_events_of_a_compile_and_a_run_arrive_in_order():
    events: list[Event] = []
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    with progress.listen(events.append):
        run_and_compare(model, (torch.randn(4, 16),))
    phases = [e.phase for e in events]
    passes = [p for i, p in enumerate(phases) if p != "simulate" and (i == 0 or phases[i - 1] != p)]
    assert passes == ["fold-norm-affine", "canonicalize-graph", "fold-norm-weight", "merge-linears", "fuse-graph",
                      "lower-graph-to-tile", "plan-sram", "plan-hbm", "lower-tile-to-npu", "npu-insert-sync", "link-kernels"]
    lower = [e for e in events if e.phase == "lower-graph-to-tile" and e.total]
    # one event per op of @forward lowered (the last is func.return, not reported)
    assert [e.done for e in lower] == sorted({e.done for e in lower}) and lower[-1].done < lower[-1].total
    # (linear, GELU, linear: one fused MLP kernel, passes/graph/fuse_mlp.py)
    assert lower[-1].detail == "k0_fused_mlp"
    assert str(lower[-1]) == f"lower-graph-to-tile: op {lower[-1].done}/{lower[-1].total} k0_fused_mlp"
    sim = [e for e in events if e.phase == "simulate"]
    assert sim and phases.index("simulate") > phases.index("link-kernels")
    done = [e.done for e in sim]
    assert done == sorted(done) and sim[-1].done == sim[-1].total > 0 and sim[-1].unit == "instruction"


def test_nothing_listens_outside_a_block():
    got: list[Event] = []
    with progress.listen(got.append):
        assert progress.listening()
        progress.report("a", 1, 2, "k")
    progress.report("b")  # nobody listens: dropped
    assert not progress.listening() and got == [Event("a", 1, 2, "k")]
    assert str(Event("simulate", 50, 200, unit="instruction")) == "simulate: instruction 50/200"
    assert str(Event("plan-sram")) == "plan-sram" and Event("x", 1, 4).fraction == 0.25


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _feed(display: ProgressDisplay) -> None:
    with display:
        progress.report("lower-graph-to-tile", 3, 7, "k2_fused_matmul", unit="op")
        progress.report("simulate", 10, 20, unit="instruction")


def test_display_only_on_a_terminal_and_not_when_quiet():
    off_tty = io.StringIO()
    _feed(ProgressDisplay(stream=off_tty, delay_s=0))
    assert off_tty.getvalue() == ""
    quiet = _Tty()
    _feed(ProgressDisplay(enabled=False, stream=quiet, delay_s=0))
    assert quiet.getvalue() == ""
    tty = _Tty()
    d = ProgressDisplay(stream=tty, delay_s=0)
    _feed(d)
    assert "lower-graph-to-tile: op 3/7 k2_fused_matmul" in tty.getvalue() and d.phase == "simulate"
    late = _Tty()
    _feed(ProgressDisplay(stream=late, delay_s=60))  # a short command prints nothing
    assert late.getvalue() == ""


def test_cli_prints_no_progress_off_a_terminal(tmp_path, capsys, monkeypatch):
    from tilecc.cli import main
    from tilecc.progress_display import ProgressDisplay as Display

    src = tmp_path / "m.py"
    src.write_text("import torch\ndef f():\n    return torch.nn.Linear(8, 4), (torch.randn(2, 8),)\n")
    monkeypatch.setattr(Display, "__init__", _no_delay(Display.__init__))
    assert main(["run", f"{src}:f"]) == 0
    err = capsys.readouterr().err
    assert sys.stderr.isatty() is False and err == ""


def _no_delay(init):
    def wrapped(self, enabled=True, stream=None, delay_s=0.0):
        init(self, enabled, stream, 0.0)
    return wrapped
