"""Weights without values: a model built on the `meta` device.

An architecture engineer evaluates a Llama-3-8B- or 70B-shaped model without its
weights: `torch.device("meta")` builds the module with shapes and dtypes only. The
importer turns each such tensor into a `MetaWeight` (shape and dtype, no data) in
`GraphProgram.weights`; every pass that only needs shapes works unchanged, a
compile-time rewrite of weight values (`fold-norm-affine`) produces a `MetaWeight` of
the result's shape, a compile-time mask without values is not recognised (as for any
unknown mask), and the Program holds no bytes for them: it is *timing-only*
(`Program.meta["timing_only"]`), simulated with `functional=False`.

Reading a `MetaWeight`'s values (`np.asarray`) is a `TimingOnlyError`, so nothing can
compute with made-up numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilecc.errors import TimingOnlyError


@dataclass(frozen=True)
class MetaWeight:
    """A weight of `shape` and numpy `dtype` (float32 or int32, as imported) with no values."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def reshape(self, *shape: int | tuple[int, ...]) -> MetaWeight:
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        dims = tuple(int(d) for d in dims)  # type: ignore[union-attr]
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            dims = tuple(self.size // max(known, 1) if d == -1 else d for d in dims)
        return MetaWeight(dims, self.dtype)

    def astype(self, dtype: object) -> MetaWeight:
        return MetaWeight(self.shape, np.dtype(dtype))  # type: ignore[arg-type]

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        raise TimingOnlyError(
            f"a weight of shape {list(self.shape)} has no values (the model was built on the meta "
            "device): it can be compiled and timed (CompiledModel.simulate), not computed with")


def is_meta(w: object) -> bool:
    return isinstance(w, MetaWeight)


def any_meta(weights: dict[str, object]) -> bool:
    return any(isinstance(w, MetaWeight) for w in weights.values())


__all__ = ["MetaWeight", "any_meta", "is_meta"]
