"""Element types as the hardware stores them: exact bf16 rounding, conversions.

bf16 values are stored as their raw 16 bits (uint16); arithmetic happens in fp32 and
rounds to nearest-even on the way back, exactly as torch does for bfloat16.

i32 values are stored as int32. The vector engine reads them as fp32 (exact up to
2**24 in magnitude) and converts fp32 results to i32 by truncation toward zero, as
torch's float -> int casts do, saturating at the int32 range (NaN becomes 0).

i8 values are stored as int8 (the same conversion, saturating at [-128, 127]); f8e4m3
values as their raw 8 bits (torch.float8_e4m3fn: 4 exponent bits, bias 7, 3 mantissa
bits, no infinities, largest finite 448). fp32 -> f8e4m3 rounds to nearest-even exactly
as torch does and saturates at +-448 (NaN stays NaN); every i8 and f8e4m3 value is exact
in fp32 and bf16.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from tilecc.simulator.isa import STORAGE, DType

if TYPE_CHECKING:
    import torch

    TORCH_DTYPES: dict[torch.dtype, DType]  # built on first use: see __getattr__
    DTYPE_TO_TORCH: dict[DType, torch.dtype]


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round fp32 values to bf16 (nearest-even, NaN preserved as 0x7FC0); return the uint16 bits.

    ``(bits + 0x7FFF + lsb) >> 16`` computed in place in one uint32 temporary (the
    packager converts every bf16 weight of a model here: the formula written with
    operators makes five full-size temporaries and runs ~7x slower on large weights)."""
    shape = np.shape(x)
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    t = bits >> 16
    t &= 1
    t += np.uint32(0x7FFF)
    t += bits
    t >>= 16
    out = t.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.uint16(0x7FC0)
    return out.reshape(shape)


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


def to_i8(x: np.ndarray) -> np.ndarray:
    """Numbers -> int8: truncation toward zero, saturating at [-128, 127], NaN -> 0."""
    return np.clip(to_i32(x), -128, 127).astype(np.int8)


F8E4M3_MAX = 448.0


def f32_to_f8e4m3_bits(x: np.ndarray) -> np.ndarray:
    """Round fp32 values to fp8 e4m3 (nearest-even, saturating at +-448); the uint8 bits."""
    x = np.clip(np.asarray(x, dtype=np.float32), -F8E4M3_MAX, F8E4M3_MAX)  # NaN passes
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float8_e4m3fn)
    return t.view(torch.uint8).numpy().reshape(x.shape).copy()


def f8e4m3_bits_to_f32(b: np.ndarray) -> np.ndarray:
    import torch

    b = np.ascontiguousarray(np.asarray(b, dtype=np.uint8))
    return torch.from_numpy(b).view(torch.float8_e4m3fn).float().numpy().reshape(b.shape)


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
    if dtype == DType.I8:
        return to_i8(x).astype(np.float32)
    if dtype == DType.F8E4M3:
        return f8e4m3_bits_to_f32(f32_to_f8e4m3_bits(x))
    return x


def to_storage(x: np.ndarray, dtype: DType) -> np.ndarray:
    """fp32 values -> the stored representation of `dtype`."""
    if dtype == DType.BF16:
        return f32_to_bf16_bits(np.asarray(x, dtype=np.float32))
    if dtype == DType.I32:
        return to_i32(x)
    if dtype == DType.I8:
        return to_i8(x)
    if dtype == DType.F8E4M3:
        return f32_to_f8e4m3_bits(np.asarray(x, dtype=np.float32))
    return np.asarray(x).astype(STORAGE[dtype])


def from_storage(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Stored representation of `dtype` -> fp32 values."""
    if dtype == DType.BF16:
        return bf16_bits_to_f32(x)
    if dtype == DType.F8E4M3:
        return f8e4m3_bits_to_f32(x)
    return np.asarray(x).astype(np.float32)


@functools.cache
def _torch_dtypes() -> dict[torch.dtype, DType]:
    import torch

    return {
        torch.float32: DType.F32,
        torch.bfloat16: DType.BF16,
        torch.float16: DType.F16,
        torch.int32: DType.I32,
        torch.int8: DType.I8,
        torch.float8_e4m3fn: DType.F8E4M3,
    }


@functools.cache
def _dtype_to_torch() -> dict[DType, torch.dtype]:
    return {v: k for k, v in _torch_dtypes().items()}


def __getattr__(name: str):
    """`TORCH_DTYPES` (torch dtype -> DType) and `DTYPE_TO_TORCH`, built on first use: torch
    is imported only when a tensor is converted, so the IR and the passes (tilecc-opt, the
    FileCheck tests: one process per RUN line) load without it (~1.2 s per process)."""
    if name in ("TORCH_DTYPES", "DTYPE_TO_TORCH"):
        return _torch_dtypes() if name == "TORCH_DTYPES" else _dtype_to_torch()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def torch_to_storage(t: torch.Tensor) -> tuple[np.ndarray, DType]:
    """A torch tensor -> (stored representation, element type), without copying twice."""
    import torch

    TORCH_DTYPES = _torch_dtypes()
    if t.dtype not in TORCH_DTYPES:
        raise TypeError(f"unsupported dtype {t.dtype}")
    dt = TORCH_DTYPES[t.dtype]
    t = t.detach().cpu().contiguous()
    if dt == DType.BF16:
        return t.view(torch.int16).numpy().view(np.uint16).copy(), dt
    if dt == DType.F8E4M3:
        return t.view(torch.uint8).numpy().copy(), dt
    return t.numpy().copy(), dt


def storage_to_torch(x: np.ndarray, dtype: DType) -> torch.Tensor:
    import torch

    x = np.ascontiguousarray(x).reshape(np.shape(x))  # (ascontiguousarray makes 0-d 1-d)
    if dtype == DType.BF16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    if dtype == DType.F8E4M3:
        return torch.from_numpy(x.copy()).view(torch.float8_e4m3fn)
    return torch.from_numpy(x.copy())
