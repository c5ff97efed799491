"""Workload knobs: swept keys that change the model or how it is deployed rather than the
hardware config.

    [sweep.grid]
    "matrix.rows" = [64, 128]        # a config key (tilecc/sweep/spec.py)
    weights = ["native", "int8"]     # a knob: the linear layers' weight format

A knob's value travels with the point into `evaluate.Task.knobs`; points that differ in a
knob never share a compile. Each knob validates its values here, once, so a bad value is
one line naming the key and the value before anything runs.

- `weights`: "native" (the model as its factory builds it), "bf16" (model and floating
  inputs cast to bfloat16), "int8" / "fp8" (weight-only quantisation of the linear
  layers by `tilecc.quantize.quantize_weights`, `lm_head` kept). The eager reference is
  the transformed model, so a point checks the compiler, not the quantisation's error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KNOBS", "WEIGHTS", "apply_knobs", "check_knob", "is_knob"]

WEIGHTS = ("native", "bf16", "int8", "fp8")
KNOBS = ("weights",)


def is_knob(key: str) -> bool:
    return key in KNOBS


def check_knob(key: str, value: Any) -> str | None:
    """None if `value` is valid for knob `key`, else what is allowed (for the spec's error)."""
    if key == "weights":
        return None if value in WEIGHTS else f"'weights' takes one of {', '.join(WEIGHTS)}"
    return f"unknown knob '{key}'"


def apply_knobs(model: Any, inputs: tuple, knobs: dict[str, Any]) -> tuple[Any, tuple]:
    """The (model, inputs) a point compiles and compares against: `knobs` applied."""
    import torch

    weights = knobs.get("weights", "native")
    if weights == "bf16":
        model = model.to(torch.bfloat16)
        inputs = tuple(t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                       for t in inputs)
    elif weights in ("int8", "fp8"):
        from tilecc.quantize import quantize_weights

        model = quantize_weights(model, weights, skip=("lm_head",))
    return model, inputs
