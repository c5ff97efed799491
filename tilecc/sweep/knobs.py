"""Workload knobs: swept keys that change the model or how it is deployed rather than the
hardware config.

    [sweep.grid]
    "matrix.rows" = [64, 128]        # a config key (tilecc/sweep/spec.py)
    weights = ["native", "int8"]     # a knob: the linear layers' weight format

A knob's value travels with the point into `evaluate.Task.knobs`; points that differ in a
knob never share a compile. Each knob validates its values here, once, so a bad value is
one line naming the key and the value before anything runs.

- `tp`, `pp`, `micro_batches`, `dp` and the system keys `system.*` (with the aliases
  `topology`, `link_bandwidth_gbs`, `link_latency_ns`): how the model is deployed over
  chips, resolved per point by tilecc/sweep/systems.py (its docstring states the rules,
  dp's included). A multi-chip point runs through `tilecc.compile(..., system=,
  parallel=)` (tilecc/system_api.py): every chip and link simulated, compared with eager.
  Its latency is the system's; its energy every chip's and link's, a chip's static power
  counted for the whole run (idle too); its area the sum over every chip (dp x tp x pp);
  its roofline bound the single chip's intrinsic bound of the whole workload over that
  many chips (the work spread evenly, communication free), so `roofline_ratio` also
  charges the communication and the replication.
- `phase`: "forward" (one call of the factory's model on its inputs) or "decode" (the
  factory returns a `transformers` causal LM, as for `tilecc generate`: its prefill and
  decode programs compiled with a static KV cache, `batch` sequences (default 1) of a
  `prompt_len`-token random prompt (default 16), three greedy tokens generated on the
  simulator and compared with eager `model.generate`; a point's figures are one decode
  step's, `tokens` = the batch, so `tpot`, `tokens_per_second` and `joules_per_token`
  are defined). A decode replica runs on one chip (tp = pp = 1; dp replicas allowed).
  Or "train": one training step of the factory's model on its inputs, the loss the
  output's mean (runtime/train_step.py: AOTAutograd's forward and backward graphs
  compiled and simulated on one chip, every gradient compared with eager autograd's);
  the figures are the step's (forward plus backward, operations left on the host at
  their modelled time), its energy and bound the NPU regions' (the bound of each
  compiled forward and backward graph, summed). One chip (tp = pp = dp = 1).
- `weights`: "native" (the model as its factory builds it), "bf16" (model and floating
  inputs cast to bfloat16), "int8" / "fp8" (weight-only quantisation of the linear
  layers by `tilecc.quantize.quantize_weights`, `lm_head` kept). The eager reference is
  the transformed model, so a point checks the compiler, not the quantisation's error.
"""

from __future__ import annotations

from typing import Any

from tilecc.sweep.systems import (
    ALIASES,
    PARALLEL_KNOBS,
    TOPOLOGY_FAMILIES,
    check_parallel_value,
    check_system_value,
    is_system_key,
)

__all__ = ["DECODE_KNOBS", "KNOBS", "MODEL_KNOBS", "PHASES", "WEIGHTS", "apply_knobs", "check_knob",
           "effective_knobs", "is_knob", "to_toml"]

WEIGHTS = ("native", "bf16", "int8", "fp8")
MODEL_KNOBS = ("weights",)  # change the model itself (the rest change how it is deployed)
PHASES = ("forward", "decode", "train")
DECODE_KNOBS = ("phase", "batch", "prompt_len")  # the generation's shape (phase "decode")
KNOBS = ("weights", *PARALLEL_KNOBS, "topology", *ALIASES, *DECODE_KNOBS)


def is_knob(key: str) -> bool:
    """A knob or a system key (`system.*`): anything swept that is not a chip config key."""
    return key in KNOBS or is_system_key(key)


def check_knob(key: str, value: Any) -> str | None:
    """None if `value` is valid for knob `key`, else what is allowed (for the spec's error)."""
    if key == "weights":
        return None if value in WEIGHTS else f"'weights' takes one of {', '.join(WEIGHTS)}"
    if key in PARALLEL_KNOBS:
        return check_parallel_value(key, value)
    if is_system_key(key):
        return check_system_value(key, value)
    if key == "phase":
        return None if value in PHASES else f"'phase' takes one of {', '.join(PHASES)}"
    if key in ("batch", "prompt_len"):
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65536
        return None if ok else f"'{key}' takes a whole number in 1..65536"
    if key == "topology":
        ok = value in TOPOLOGY_FAMILIES
        return None if ok else f"'topology' takes one of {', '.join(TOPOLOGY_FAMILIES)} (or sweep 'system.topology')"
    if key in ALIASES:
        return check_system_value(ALIASES[key], value)
    return f"unknown knob '{key}'"


def effective_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs that change the model or what is run on each chip (the deployment over
    chips is tilecc/sweep/systems.py's): the generation's shape only in a decode point, the
    phase in a training point."""
    phase = knobs.get("phase", "forward")
    decode = phase == "decode"
    return {k: v for k, v in knobs.items()
            if k in MODEL_KNOBS or (decode and k in DECODE_KNOBS) or (k == "phase" and phase == "train")}


def to_toml(data: dict[str, Any]) -> str:
    """A config's TOML tables as text (scalars, strings, lists of them, nested tables):
    the chip file a system spec names."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, float):
            return repr(v)  # 'inf', '-inf' and 'nan' are TOML floats too
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return str(v)

    lines: list[str] = []

    def table(prefix: str, d: dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        if prefix and scalars:
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {value(v)}")
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    return "\n".join(lines) + "\n"


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
