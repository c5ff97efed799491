"""Weights of a bf16 model held as bf16: half the bytes of float32 values, no rounding later.

`GraphProgram.weights` holds a weight's values as the importer read them: float32 (or
int32). A bf16 model's weights imported that way double in size (GPT-2 small: 250 MB of
bf16 parameters become 500 MB of float32 in the graph program) and the packager rounds
them back to bf16 bits, one full pass over every weight. The importer therefore keeps a
bf16 tensor as a `Bf16Weight`: its 16-bit patterns, in the weight's shape.

- It reads as float32 wherever values are needed (`np.asarray(w)` converts exactly:
  every bf16 value is a float32 value), so passes that compute with weights (compile-time
  constants, `fold-norm-affine`, the graph interpreter, pre-tiled layouts) work unchanged;
  each such read is a temporary, not a second copy held by the program.
- The packager (`runtime/compiler.py` `read_layout`) stores a `Bf16Weight` placed in a
  bf16 HBM tensor as its bits directly; a weight placed in another dtype converts.
- `dtype` is float32, the type its values read as (like `MetaWeight`'s).
- `borrowed`: its bits are a read-only view of the model's own tensor, not a copy (the
  importer borrows for a graph program that lives only as long as one compile:
  `runtime/cache.py` `compile_cached`); the packager copies a borrowed weight into the
  Program and shares an owned one, so a Program never changes with the model's
  parameters either way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["Bf16Weight", "bf16_weight"]


class Bf16Weight:
    """A weight whose values are bf16, held as its uint16 bit patterns."""

    __slots__ = ("bits", "borrowed")
    dtype = np.dtype(np.float32)

    def __init__(self, bits: np.ndarray, *, borrowed: bool = False):
        if bits.dtype != np.uint16:
            raise TypeError(f"Bf16Weight holds uint16 bit patterns, not {bits.dtype}")
        self.bits = bits
        self.borrowed = borrowed

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)

    @property
    def ndim(self) -> int:
        return self.bits.ndim

    @property
    def size(self) -> int:
        return math.prod(self.bits.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the values as float32 (what `np.asarray` gives), like `MetaWeight`'s."""
        return self.size * 4

    def __len__(self) -> int:
        return len(self.bits)

    def reshape(self, *shape: Any) -> Bf16Weight:
        return Bf16Weight(self.bits.reshape(*shape), borrowed=self.borrowed)

    def astype(self, dtype: Any) -> np.ndarray:
        return np.asarray(self).astype(dtype)

    def __getitem__(self, index: Any) -> np.ndarray:
        """The values of a slice (only the slice is converted)."""
        return np.asarray(Bf16Weight(np.asarray(self.bits[index])))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        wide = self.bits.astype(np.uint32, order="C")  # one float32-sized array, shifted in place
        wide <<= 16
        values = wide.view(np.float32)
        return values if dtype is None else values.astype(dtype)

    def __repr__(self) -> str:
        return f"Bf16Weight(shape={list(self.shape)})"


def bf16_weight(bits: np.ndarray) -> Bf16Weight:
    """A `Bf16Weight` of `bits` (uint16 patterns, any shape)."""
    return Bf16Weight(np.ascontiguousarray(bits))
