"""Comparing a compiled program's outputs with torch eager: the tolerance per dtype.

    rtol, atol = tolerance(torch.bfloat16, scale=float(expected.abs().max()))
    ok, worst = compare(outputs, expected)      # every output within its tolerance?

`tilecc run`, `tilecc bisect`, the benchmarks and the tests all judge a program by these
two functions, so "matches eager" means one thing everywhere.
"""

from __future__ import annotations

from typing import Any


def tolerance(dtype: Any, scale: float = 1.0) -> tuple[float, float]:
    """(rtol, atol) used to compare with eager for an output dtype.

    `scale` is the largest magnitude of the expected output: in bf16 a small result
    computed from large cancelling values carries the rounding step of those values.
    """
    import torch

    scale = max(1.0, scale)
    if dtype == torch.bfloat16:
        return 2e-2, 2e-2 * scale
    if dtype == torch.float16:
        return 2e-3, 2e-3 * scale
    return 1e-4, 1e-5 * scale


def compare(outputs: list, expected: list) -> tuple[bool, float]:
    """(every output close to its expected tensor, the largest absolute error).

    A NaN where eager also has a NaN (and an infinity where eager has the same one)
    counts as equal; a NaN on one side only is a mismatch with error ``inf``. The
    tolerance scales with the largest finite expected magnitude."""
    import torch

    ok, worst = True, 0.0
    for y, r in zip(outputs, expected, strict=True):
        dtype = r.dtype
        y, r = y.detach().float(), r.detach().float()
        if y.shape != r.shape:
            return False, float("inf")
        finite = r[r.isfinite()]
        rtol, atol = tolerance(dtype, float(finite.abs().max()) if finite.numel() else 1.0)
        same = (y == r) | (y.isnan() & r.isnan())
        diff = torch.where(same, torch.zeros_like(y), (y - r).abs()).nan_to_num(nan=float("inf"), posinf=float("inf"))
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= bool(torch.allclose(y, r, rtol=rtol, atol=atol, equal_nan=True))
    return ok, worst


__all__ = ["tolerance", "compare"]
