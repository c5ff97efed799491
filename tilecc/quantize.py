"""Weight-only quantisation of a model's linear layers: int8 and fp8 e4m3.

    model = quantize_weights(model, "int8", skip=("lm_head",))   # in place; returns model

Every `nn.Linear` whose qualified name does not match `skip` (a name, or the last
components of one: "lm_head" matches "lm_head" and "model.lm_head") becomes a
`QuantizedLinear` holding

- `weight_q`: the weight in one byte per parameter, `[out, in]`: int8 (symmetric, per
  output channel: `w ~ weight_q * scale[o]`, `weight_q` in [-127, 127]) or
  `torch.float8_e4m3fn` (per output channel too: `scale[o] = max|w[o]| / 448`, so each
  row uses the format's whole range);
- `scale`: one factor per output channel, in the weight's original dtype (fp32 or bf16);
- `bias`: unchanged.

Its forward is `F.linear(x, weight_q.to(x.dtype) * scale[:, None], bias)`: the eager
reference of a quantised model is exact (the weight the compiler sees is the one eager
multiplies by), and torch.export keeps the pattern `weight_q -> convert -> mul scale ->
linear` that the front end recognises (frontend/lowp_weights.py) to keep the weight one
byte per parameter in HBM and apply `scale` in the matmul's epilogue.

With ``activations="int8"`` (W8A8, SmoothQuant / LLM.int8-style dynamic per-token
quantisation; weights must be "int8") the layer also quantises its input, per row::

    s_x[m] = max_k |x[m, k]| / 127          (fp32)
    x_q    = round(x / s_x)                 (half to even; |x_q| <= 127, int8)
    acc    = x_q @ weight_q^T               (int8 x int8 products, summed in fp32:
                                             exact while |partial sums| < 2**24)
    y      = (acc * s_x * scale[None, :]).to(x.dtype) + bias

so the compiled matmul has two int8 operands (the matrix engine's 8-bit rate,
`matrix.int8_speedup`, and int8 energy per MAC) and the scales are its epilogue
(passes/graph/w8a8_matmul.py). ``ACTIVATIONS`` lists the accepted values.

Models on the `meta` device quantise too (shapes and dtypes only), for timing-only runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tilecc.errors import QuantizationError

__all__ = ["ACTIVATIONS", "FORMATS", "SCHEMES", "QuantizedLinear", "quantize_rows", "quantize_scheme",
           "quantize_tensor", "quantize_weights"]

# format name -> (torch storage dtype, largest magnitude the format represents)
FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "int8": (torch.int8, 127.0),
    "fp8": (torch.float8_e4m3fn, 448.0),
}

# activation formats of `quantize_weights(..., activations=)`: None keeps them float
# (weight-only), "int8" quantises them per row (W8A8, int8 weights only)
ACTIVATIONS: tuple[str | None, ...] = (None, "int8")
# the quantisation schemes the command line and the benchmarks name (`tilecc generate
# --weights`, benchmarks/llm.py --weights): scheme -> (weight format, activations)
SCHEMES: dict[str, tuple[str, str | None]] = {"int8": ("int8", None), "fp8": ("fp8", None), "w8a8": ("int8", "int8")}
TINY = 1e-30  # the smallest per-row absmax quantize_rows divides by (an all-zero row)
ROUND_MAGIC = 1.5 * 2**23  # fp32: (v + M) - M rounds |v| < 2**22 to an integer, half to even


def _check_format(fmt: object) -> str:
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise QuantizationError(
            f"unsupported weight format {fmt!r}: quantize_weights takes one of {', '.join(FORMATS)}"
        )
    return fmt


def _check_activations(act: object, fmt: str) -> str | None:
    if act not in ACTIVATIONS:
        raise QuantizationError(
            f"unsupported activations={act!r}: quantize_weights takes activations=None (weight-only) or \"int8\" (W8A8)"
        )
    if act == "int8" and fmt != "int8":
        raise QuantizationError(
            f"activations={act!r} with weights {fmt!r}: W8A8 needs int8 weights (quantize_weights(model, \"int8\", "
            "activations=\"int8\"))"
        )
    return "int8" if act == "int8" else None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row (per-token) int8 quantisation of activations: `x` [..., K] ->
    (x_q [..., K] int8, s_x [..., 1] fp32) with ``x ~ x_q * s_x``: s_x = max|x| / 127 per
    row, x_q = round(x / s_x), half to even (torch.round's values).

    Written for the vector engine: an all-zero row takes s_x = TINY / 127 (x_q = 0, so
    y = 0 as with any scale), and the rounding is fp32's own: |x / s_x| <= 127 (up to one
    rounding) < 2**22, where ``(v + 1.5 * 2**23) - 1.5 * 2**23`` is v rounded to the
    nearest integer, half to even, exactly (two vector ops, against eight for a general
    `aten.round`: frontend/aten_rounding.py)."""
    x32 = x.float()
    s = x32.abs().amax(dim=-1, keepdim=True).clamp_min(TINY) / 127.0
    v = x32 / s
    return ((v + ROUND_MAGIC) - ROUND_MAGIC).to(torch.int8), s


def quantize_tensor(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` [out, in] -> (one-byte weight [out, in], per-output-channel scale [out] in w's
    dtype) with `w ~ weight_q.to(float) * scale[:, None]`."""
    storage, top = FORMATS[_check_format(fmt)]
    w32 = w.detach().float()
    amax = w32.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    # the scale the forward multiplies by is the one stored (rounded to w's dtype), so
    # the quantised values are computed against it
    scale = scale.to(w.dtype)
    q = w32 / scale.float()[:, None]
    if storage == torch.int8:
        q = q.round().clamp(-top, top).to(torch.int8)
    else:
        q = q.clamp(-top, top).to(storage)
    return q, scale


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is stored in one byte per parameter (int8 or fp8 e4m3)
    with a per-output-channel scale: `y = x @ (weight_q * scale[:, None])^T + bias`; with
    ``activations="int8"`` the input is quantised per row first (W8A8: module docstring)."""

    def __init__(self, linear: nn.Linear, fmt: str, activations: str | None = None):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.format = _check_format(fmt)
        self.activations = _check_activations(activations, self.format)
        q, scale = quantize_tensor(linear.weight, fmt)
        self.weight_q: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("weight_q", q)
        self.register_buffer("scale", scale)
        self.bias = linear.bias

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # `model.to(torch.bfloat16)` converts floating buffers: keep the one-byte weight's
        # format (fp8 -> bf16 -> fp8 is exact), follow the device
        storage = FORMATS[self.format][0]
        super()._apply(fn, recurse)
        if self.weight_q.dtype != storage:
            self.weight_q = self.weight_q.to(storage)
        return self

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.scale.dtype
        return self.weight_q.to(dtype) * self.scale.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activations is None:
            return F.linear(x, self.dequantized_weight(x.dtype), self.bias)
        x_q, s_x = quantize_rows(x)
        acc = F.linear(x_q.float(), self.weight_q.float())  # integer products, fp32 sums
        y = (acc * s_x * self.scale.float()).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        act = f", activations={self.activations}" if self.activations else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.format}{act}")


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def quantize_weights(model: nn.Module, dtype: str, skip: tuple[str, ...] | list[str] = ("lm_head",),
                     activations: str | None = None) -> nn.Module:
    """Replace the linear layers of `model` (in place) by `QuantizedLinear`s in format
    `dtype` ("int8" or "fp8"), except those named in `skip`; return `model`.
    ``activations="int8"`` makes them W8A8 (int8 weights only)."""
    fmt = _check_format(dtype)
    act = _check_activations(activations, fmt)
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    if isinstance(model, nn.Linear):
        raise QuantizationError(
            "quantize_weights replaces the linear layers inside a model in place; wrap a bare nn.Linear in a module"
        )
    targets = [(name, m) for name, m in model.named_modules()
               if type(m) is nn.Linear and not _skipped(name, skip)]
    if not targets:
        raise QuantizationError(
            f"quantize_weights({fmt!r}): the model has no nn.Linear layer to quantise"
            + (f" outside skip={skip}" if skip else "")
        )
    for name, lin in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        with torch.no_grad():
            setattr(parent, attr, QuantizedLinear(lin, fmt, act))
    return model


def quantize_scheme(model: nn.Module, scheme: str, skip: tuple[str, ...] | list[str] = ("lm_head",)) -> nn.Module:
    """`quantize_weights` by scheme name (`SCHEMES`: "int8" / "fp8" weight-only, "w8a8"
    int8 weights and per-row int8 activations)."""
    if scheme not in SCHEMES:
        raise QuantizationError(f"unsupported quantisation scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    fmt, act = SCHEMES[scheme]
    return quantize_weights(model, fmt, skip=skip, activations=act)
