"""Torch tensors as the importer's values: dtypes, weight values, the meta device.

    TORCH_FLOAT_DTYPES[torch.bfloat16]       -> DType.BF16 (the device dtype of a torch dtype)
    _weight_values(param, "fc.weight")       -> float32 / int32 numpy array, or a MetaWeight
    _on_meta_device(args, kwargs)            -> an op's arguments for constant folding

Split from `torch_export.py` (the importer) so that the importer stays one concept; the
exception an op's importer raises for a node it cannot convert (`_Unsupported`) lives here
because reading a weight can raise it too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tilecc.ir.bf16_weights import Bf16Weight
from tilecc.ir.meta_weights import MetaWeight
from tilecc.simulator.isa import DType

TORCH_FLOAT_DTYPES: dict[torch.dtype, DType] = {
    torch.float32: DType.F32,
    torch.bfloat16: DType.BF16,
    torch.float16: DType.F16,
    torch.float64: DType.F32,  # the float64 policy: computed in fp32 (ir/float64.py)
}
# integer and bool tensors live as i32 (bools as 0 / 1); int64 values must fit int32
TORCH_INT_DTYPES: dict[torch.dtype, DType] = {
    torch.int64: DType.I32,
    torch.int32: DType.I32,
    torch.int16: DType.I32,
    torch.int8: DType.I32,
    torch.uint8: DType.I32,
    torch.bool: DType.I32,
}


class _Unsupported(Exception):
    """A node the importer cannot convert (reason appended to the op name)."""

    def __init__(self, reason: str = ""):
        super().__init__(reason)
        self.reason = reason


def _on_meta_device(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """A model built on the meta device makes its compile-time constants (positions,
    causal masks) on that device: a factory's values need no weights, so they are made
    on the CPU and keep their values; an op mixing such constants with weights that have
    none (meta) runs on the meta device."""
    from torch.utils import _pytree

    meta = torch.device("meta")
    flat = [a for a in _pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    if any(a.is_meta for a in flat):
        if not all(a.is_meta for a in flat):
            args, kwargs = _pytree.tree_map(
                lambda a: a.to(meta) if isinstance(a, torch.Tensor) else a, (args, kwargs))
        return args, kwargs
    if isinstance(kwargs, dict) and kwargs.get("device") == meta:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    return args, kwargs


def _weight_values(data: torch.Tensor, name: str, borrow: bool = False) -> np.ndarray:
    """A weight's values: float32, or int32 for integer / bool tensors (checked to fit); a
    tensor on the meta device (no values) is a `MetaWeight` (ir/meta_weights.py), a bf16
    one a `Bf16Weight` (its bits; it reads as float32: ir/bf16_weights.py).

    A copy, unless `borrow`: then a bf16 or float32 CPU tensor's values are a read-only
    view of its memory (no copy; a bf16 one a `Bf16Weight` marked borrowed, which the
    packager copies into the Program), for a graph program that lives only during one
    compile. Other dtypes convert, which copies anyway."""
    if data.is_meta:
        return MetaWeight(tuple(int(d) for d in data.shape),  # type: ignore[return-value]
                          np.dtype(np.int32 if data.dtype in TORCH_INT_DTYPES else np.float32))
    data = data.detach().to("cpu")
    if data.dtype in TORCH_INT_DTYPES:
        wide = data.to(torch.int64)
        if wide.numel() and (wide.min() < -(2**31) or wide.max() >= 2**31):
            raise _Unsupported(f"integer constant '{name}' has values outside the int32 range")
        return wide.to(torch.int32).contiguous().numpy().copy()
    if data.dtype == torch.bfloat16:  # kept as bf16 bits: half the bytes (ir/bf16_weights.py)
        bits = data.view(torch.int16).numpy().view(np.uint16)  # a view, strided as `data` is
        if borrow:
            return Bf16Weight(_read_only(bits), borrowed=True)  # type: ignore[return-value]
        return Bf16Weight(np.array(bits, order="C"))  # type: ignore[return-value]  # one copy, contiguous
    if borrow and data.dtype == torch.float32:
        return _read_only(data.numpy())
    return data.to(torch.float32).contiguous().numpy().copy()


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of `a` (a pass that wrote into a borrowed weight would change the model)."""
    view = a.view()
    view.flags.writeable = False
    return view
