"""Workload knobs: swept keys that change the model or how it is deployed rather than the
hardware config.

    [sweep.grid]
    "matrix.rows" = [64, 128]        # a config key (tilecc/sweep/spec.py)
    weights = ["native", "int8"]     # a knob: the linear layers' weight format

A knob's value travels with the point into `evaluate.Task.knobs`; points that differ in a
knob never share a compile. Each knob validates its values here, once, so a bad value is
one line naming the key and the value before anything runs.

- `tp` (a whole number >= 1): tensor parallelism over that many chips of the point's
  config (`tilecc.compile(..., system=, parallel={"tp": N})`, tilecc/system_api.py);
  `topology` ("ring" | "switch"), `link_bandwidth_gbs` and `link_latency_ns` describe the
  interconnect (defaults: the system's link preset). A point's latency and energy are
  the system's (every chip and link); its area is the chips' sum; its roofline bound is
  the single chip's intrinsic bound over `tp` (the work spread evenly, communication
  free), so `roofline_ratio` also charges the communication.
- `phase`: "forward" (one call of the factory's model on its inputs) or "decode" (the
  factory returns a `transformers` causal LM, as for `tilecc generate`: its prefill and
  decode programs compiled with a static KV cache, `batch` sequences (default 1) of a
  `prompt_len`-token random prompt (default 16), three greedy tokens generated on the
  simulator and compared with eager `model.generate`; a point's figures are one decode
  step's, `tokens` = the batch, so `tpot`, `tokens_per_second` and `joules_per_token`
  are defined). Decode runs on one chip (a tp > 1 decode point fails, saying so).
- `weights`: "native" (the model as its factory builds it), "bf16" (model and floating
  inputs cast to bfloat16), "int8" / "fp8" (weight-only quantisation of the linear
  layers by `tilecc.quantize.quantize_weights`, `lm_head` kept). The eager reference is
  the transformed model, so a point checks the compiler, not the quantisation's error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DECODE_KNOBS", "KNOBS", "MODEL_KNOBS", "PHASES", "WEIGHTS", "apply_knobs", "check_knob",
           "effective_knobs", "is_knob", "system_spec", "to_toml"]

WEIGHTS = ("native", "bf16", "int8", "fp8")
TOPOLOGIES = ("ring", "switch")
MODEL_KNOBS = ("weights",)  # change the model itself (the rest change how it is deployed)
PHASES = ("forward", "decode")
DECODE_KNOBS = ("phase", "batch", "prompt_len")  # the generation's shape (phase "decode")
KNOBS = ("weights", "tp", "topology", "link_bandwidth_gbs", "link_latency_ns", *DECODE_KNOBS)


def is_knob(key: str) -> bool:
    return key in KNOBS


def check_knob(key: str, value: Any) -> str | None:
    """None if `value` is valid for knob `key`, else what is allowed (for the spec's error)."""
    if key == "weights":
        return None if value in WEIGHTS else f"'weights' takes one of {', '.join(WEIGHTS)}"
    if key == "tp":
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024
        return None if ok else "'tp' takes a whole number of chips in 1..1024"
    if key == "phase":
        return None if value in PHASES else f"'phase' takes one of {', '.join(PHASES)}"
    if key in ("batch", "prompt_len"):
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65536
        return None if ok else f"'{key}' takes a whole number in 1..65536"
    if key == "topology":
        return None if value in TOPOLOGIES else f"'topology' takes one of {', '.join(TOPOLOGIES)}"
    if key in ("link_bandwidth_gbs", "link_latency_ns"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        ok = ok and (value > 0 or key == "link_latency_ns")
        return None if ok else f"'{key}' takes a number {'> 0' if key == 'link_bandwidth_gbs' else '>= 0'}"
    return f"unknown knob '{key}'"


def effective_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs that change a point's result: the interconnect's do not on one chip, the
    generation's shape does not in a forward point."""
    decode = knobs.get("phase", "forward") == "decode"
    keep = {k: v for k, v in knobs.items() if decode or k not in DECODE_KNOBS}
    if keep.get("tp", 1) == 1:
        return {k: v for k, v in keep.items() if k in MODEL_KNOBS or k in DECODE_KNOBS}
    return keep


def system_spec(knobs: dict[str, Any], chip_toml: str) -> str | None:
    """The short-form system spec of a point's knobs (None: one chip, no system)."""
    tp = knobs.get("tp", 1)
    if tp == 1:
        return None
    spec = f"{knobs.get('topology', 'ring')}:{tp};chip={chip_toml}"
    if "link_bandwidth_gbs" in knobs:
        spec += f";bandwidth_gbs={knobs['link_bandwidth_gbs']}"
    if "link_latency_ns" in knobs:
        spec += f";latency_ns={knobs['link_latency_ns']}"
    return spec


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
