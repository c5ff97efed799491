"""Full fidelity for a point deployed over several chips (tilecc/sweep/systems.py): a
tensor- or pipeline-parallel system, dp replicas of it, or dp replicas of one chip.

    figures = run_deployed(deployment, chip_tables, cfg, graph, inputs, model)  # Figures, or why not (str)

A replica runs on its share of the inputs (the first dimension cut in dp; all of them
when dp = 1). A multi-chip replica goes through `tilecc.compile(model, inputs,
target=<the point's chip TOML>, system=<the point's [system] TOML>, parallel=...)`
(tilecc/system_api.py), which simulates every chip and link; a one-chip replica through
the single-chip compile. Either way its outputs are compared with eager on the same share.

The figures (what tilecc/sweep/knobs.py promises):

    latency  = one replica's time (replicas run side by side, the whole batch is done then)
    energy   = dp x (the replica's chips' and links' energy
                     + static_watts x the time each chip idles)
    macs     = the whole workload's
    roofline = the single chip's intrinsic bound of the whole workload / (dp x tp x pp)
    bottleneck: "interconnect" when half the time or more is exposed communication, else
                the bound's resource

The idle term: the system report charges a chip's static power while it computes
(its segments' simulated energy); a chip waiting for a collective or for a pipeline's
fill and drain still leaks, so the sweep adds it. The area (every chip's) is set by
`evaluate.evaluate_task`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from tilecc.errors import InternalError, TileccError
from tilecc.sweep.knobs import to_toml
from tilecc.sweep.objectives import Figures
from tilecc.sweep.systems import Deployment

__all__ = ["DataParallelError", "replica_inputs", "run_deployed"]


class DataParallelError(TileccError):
    """A workload's inputs that cannot be split over the point's dp replicas."""


def replica_inputs(inputs: tuple, dp: int) -> tuple:
    """One replica's share: every input's first dimension cut in `dp` equal parts."""
    import torch

    if dp == 1:
        return inputs
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] % dp:
            size = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else "no batch dimension"
            raise DataParallelError(f"dp = {dp}: input {i} (batch {size}) cannot be split over {dp} replicas")
    return tuple(x.chunk(dp, 0)[0] for x in inputs)


def run_deployed(d: Deployment, chip_tables: dict[str, Any], cfg: Any, graph: Any, inputs: tuple,
                 model: Any) -> Figures | str:
    """`graph`: the whole workload's graph IR (its bound); `inputs`: the whole batch."""
    import torch

    from tilecc.cli import run_eager
    from tilecc.runtime.compare import compare

    share = replica_inputs(inputs, d.dp)
    expected = run_eager(model, share)
    if d.system is None:
        outputs, time_us, energy_j, bottleneck = _one_chip(cfg, model, share)
    else:
        outputs, time_us, energy_j, bottleneck = _system(d, chip_tables, cfg, model, share)
    ok, worst = compare(outputs, [torch.as_tensor(e) for e in expected])
    if not ok:
        return f"the deployed program does not match eager (max abs error {worst:.3g})"
    bounds, macs = _bounds(graph, cfg)
    resource = max(bounds, key=lambda k: bounds[k])
    return Figures(
        cycles=time_us * cfg.clock_ghz * 1e3,
        latency_us=time_us,
        energy_j=d.dp * energy_j,
        roofline_cycles=bounds[resource] / d.chips,
        macs=macs,
        area_mm2=float("nan"),  # every chip's: evaluate.evaluate_task
        bottleneck=bottleneck or resource,
    )


def _one_chip(cfg: Any, model: Any, share: tuple) -> tuple[list, float, float, str]:
    from tilecc.frontend.torch_export import export_model
    from tilecc.runtime.cache import compile_cached
    from tilecc.runtime.executor import run_program

    program = compile_cached(export_model(model, share), cfg, None)
    outputs, report = run_program(program, share, sanitize=os.environ.get("TILECC_SANITIZE", "0") == "1")
    return list(outputs), float(report.time_us), float(report.energy["joules"]), str(report.bottleneck)


def _system(d: Deployment, chip_tables: dict[str, Any], cfg: Any, model: Any,
            share: tuple) -> tuple[list, float, float, str]:
    from tilecc.system_api import compile_for_system

    assert d.system is not None
    with tempfile.TemporaryDirectory() as tmp:
        chip = Path(tmp) / "chip.toml"
        chip.write_text(to_toml(chip_tables), encoding="utf-8")
        system = Path(tmp) / "system.toml"
        system.write_text(to_toml({"system": {**d.system, "chip": str(chip)}}), encoding="utf-8")
        sm = compile_for_system(model, share, target=str(chip), system=str(system), parallel=d.parallel())
        out = sm(*share)
    rep = sm.report
    if rep is None:
        raise InternalError("the system run left no report")
    idle_static = cfg.energy.static_watts * sum(c.idle_us for c in rep.chips) * 1e-6
    bottleneck = "interconnect" if rep.comm_exposed_share >= 0.5 else ""
    outputs = list(out) if isinstance(out, (tuple, list)) else [out]
    return outputs, float(rep.time_us), float(rep.energy_j) + idle_static, bottleneck


def _bounds(graph: Any, cfg: Any) -> tuple[dict[str, float], float]:
    """The single chip's roofline bounds of the whole workload, and its MACs."""
    from tilecc.frontend.dsl.work import dsl_call_work
    from tilecc.ir.graph_work import graph_work
    from tilecc.simulator.roofline import roofline

    work = graph_work(graph, cfg, dsl_call_work)
    return roofline(work.figures(), cfg), float(work.macs_16 + work.macs_fp32 + work.macs_int8 + work.macs_fp8)
