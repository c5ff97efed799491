"""Element types as the hardware stores them: exact bf16 rounding, conversions.

bf16 values are stored as their raw 16 bits (uint16); arithmetic happens in fp32 and
rounds to nearest-even on the way back, exactly as torch does for bfloat16.

i32 values are stored as int32. The vector engine reads them as fp32 (exact up to
2**24 in magnitude) and converts fp32 results to i32 by truncation toward zero, as
torch's float -> int casts do, saturating at the int32 range (NaN becomes 0).
"""

from __future__ import annotations

import numpy as np
import torch

from tilecc.simulator.isa import STORAGE, DType


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round fp32 values to bf16 (nearest-even, NaN preserved); return the uint16 bits."""
    x = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(x).view(np.uint32).reshape(x.shape)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.uint16(0x7FC0)
    return out


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32).reshape(b.shape)


I32_MIN, I32_MAX = -(2**31), 2**31 - 1


def to_i32(x: np.ndarray) -> np.ndarray:
    """Numbers -> int32: truncation toward zero, saturating, NaN -> 0 (exact for ints)."""
    x = np.asarray(x)
    if x.dtype.kind in "iub":
        return np.clip(x.astype(np.int64), I32_MIN, I32_MAX).astype(np.int32)
    x64 = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
    return np.clip(x64, I32_MIN, I32_MAX).astype(np.int32)


def round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    """fp32 values rounded to `dtype` and returned as fp32 (for reference semantics).

    For i32: truncated toward zero and saturated (then back to fp32, so values beyond
    2**24 in magnitude are not exact)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == DType.BF16:
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    if dtype == DType.F16:
        return x.astype(np.float16).astype(np.float32)
    if dtype == DType.I32:
        return to_i32(x).astype(np.float32)
    return x


def to_storage(x: np.ndarray, dtype: DType) -> np.ndarray:
    """fp32 values -> the stored representation of `dtype`."""
    if dtype == DType.BF16:
        return f32_to_bf16_bits(np.asarray(x, dtype=np.float32))
    if dtype == DType.I32:
        return to_i32(x)
    return np.asarray(x).astype(STORAGE[dtype])


def from_storage(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Stored representation of `dtype` -> fp32 values."""
    if dtype == DType.BF16:
        return bf16_bits_to_f32(x)
    return np.asarray(x).astype(np.float32)


TORCH_DTYPES = {
    torch.float32: DType.F32,
    torch.bfloat16: DType.BF16,
    torch.float16: DType.F16,
    torch.int32: DType.I32,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def torch_to_storage(t: torch.Tensor) -> tuple[np.ndarray, DType]:
    """A torch tensor -> (stored representation, element type), without copying twice."""
    if t.dtype not in TORCH_DTYPES:
        raise TypeError(f"unsupported dtype {t.dtype}")
    dt = TORCH_DTYPES[t.dtype]
    t = t.detach().cpu().contiguous()
    if dt == DType.BF16:
        return t.view(torch.int16).numpy().view(np.uint16).copy(), dt
    return t.numpy().copy(), dt


def storage_to_torch(x: np.ndarray, dtype: DType) -> torch.Tensor:
    x = np.ascontiguousarray(x).reshape(np.shape(x))  # (ascontiguousarray makes 0-d 1-d)
    if dtype == DType.BF16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())
