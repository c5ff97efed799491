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
    """(every output close to its expected tensor, the largest absolute error)."""
    import torch

    ok, worst = True, 0.0
    for y, r in zip(outputs, expected, strict=True):
        r = r.detach()
        rtol, atol = tolerance(r.dtype, float(r.float().abs().max()) if r.numel() else 1.0)
        diff = (y.float() - r.float()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= bool(torch.allclose(y.float(), r.float(), rtol=rtol, atol=atol))
    return ok, worst


__all__ = ["tolerance", "compare"]
