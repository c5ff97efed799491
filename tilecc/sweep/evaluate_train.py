"""A `phase = "train"` sweep point: one training step of the workload on one chip.

    figures = run_train("examples/llama_tp.py:llama", {"weights": "native"}, cfg)

The factory's model and inputs (the workload knobs applied, tilecc/sweep/knobs.py) run
one step of `runtime/train_step.py`'s `TrainStep` (loss: the output's mean): AOTAutograd's
forward and backward graphs compiled for the point's config and simulated. Every
parameter's gradient is compared with eager autograd's on an untouched copy of the
model; a mismatch (or a gradient the step did not produce) fails the point.

Figures: the latency is the step's (forward plus backward; operations left on the host at
their modelled time, `runtime/graph_clock.py`); energy, MACs and the roofline bound are
the NPU regions' (each compiled graph's intrinsic bound on this config, summed over the
forward and backward graphs); the bottleneck is the resource of the region with the
largest bound.
"""

from __future__ import annotations

import copy
from typing import Any

from tilecc.sweep.objectives import Figures

__all__ = ["run_train"]


def run_train(workload: str, model_knobs: dict[str, Any], cfg: Any) -> Figures | str:
    """The figures of one training step of `workload` on `cfg`, or why the point fails."""

    from tilecc.cli import load_factory
    from tilecc.runtime.compare import compare
    from tilecc.runtime.train_step import TrainStep
    from tilecc.simulator.area import area
    from tilecc.sweep.knobs import apply_knobs

    model, inputs = load_factory(workload)
    model, inputs = apply_knobs(model, inputs, model_knobs)
    reference = copy.deepcopy(model).train()
    out = reference(*inputs)
    out = out[0] if isinstance(out, tuple | list) else out
    out = getattr(out, "logits", out)
    out.float().mean().backward()
    want = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}

    result = TrainStep(model, target=cfg, loss="mean").run(*inputs)
    missing = sorted(set(want) - set(result.grads))
    if missing:
        return f"the training step produced no gradient for '{missing[0]}' (eager autograd has one)"
    names = sorted(want)
    ok, worst = compare([result.grads[k] for k in names], [want[k] for k in names])
    if not ok:
        return f"the training step's gradients do not match eager autograd's (max abs error {worst:.3g})"

    reports = [r for run in result.forward_runs + result.backward_runs for r in run.reports]
    if not reports:
        return "the training step ran no region on the NPU"
    seconds = (result.forward_ns + result.backward_ns) * 1e-9
    biggest = max(reports, key=lambda r: float(r.roofline_cycles))
    return Figures(
        cycles=seconds * cfg.clock_ghz * 1e9,
        latency_us=seconds * 1e6,
        energy_j=sum(float(r.energy["joules"]) for r in reports),
        roofline_cycles=sum(float(r.roofline_cycles) for r in reports),
        macs=sum(float(r.macs) for r in reports),
        area_mm2=area(cfg).total if cfg.area is not None else float("nan"),
        bottleneck=str(biggest.bottleneck),
    )
