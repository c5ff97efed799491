"""graph.pad: padding of any dimensions in torch's four modes.

    %z = graph.pad %u low [0, 0, 1, 0] high [0, 0, 0, 2] value 0.5 : f64
           : tensor<1x64x6x6xf32> -> tensor<1x64x7x8xf32>
    %r = graph.pad %u low [0, 0, 2, 2] high [0, 0, 2, 2] value 0.0 : f64 mode "reflect"
           : tensor<1x64x6x6xf32> -> tensor<1x64x10x10xf32>

``low[d]`` / ``high[d]`` elements go before / after dim d. Modes (torch.nn.functional.pad):

- ``constant`` (the default, not printed): the fill `value`. In every mode negative
  amounts crop.
- ``reflect``: the mirror image without the edge element (``x[1], x[0] | x[0] ...``),
  each amount < the dim's size.
- ``replicate``: the edge element repeated.
- ``circular``: the other end of the dim (``x[-p:] | x | x[:p]``), each amount <= the size
  left after any crop (torch reads uninitialised memory beyond that).

Every mode is separable: an output index of a dim maps to one input index of that dim
(`source_index`), independently of the other dims, so corners compose.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    FloatAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, prop_def, result_def

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import GraphOp, as_value, check_tensor, set_loc

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _ints(attr: DenseArrayBase[IntegerType]) -> tuple[int, ...]:
    return tuple(int(v) for v in attr.get_values())


def source_index(mode: str, size: int, low: int, high: int, out: int) -> int | None:
    """The input index that output index `out` of a dim of `size` padded by `low` /
    `high` reads (None: the fill value; constant mode only). Negative amounts crop; in
    circular mode the wrap is around the cropped range (torch's order: crop, then pad)."""
    i = out - low
    if 0 <= i < size and (mode != "circular" or i < size - max(0, -high)):
        return i
    if mode == "constant":
        return None
    if mode == "replicate":
        return min(max(i, 0), size - 1)
    if mode == "circular":
        c0, kept = max(0, -low), size - max(0, -low) - max(0, -high)
        return c0 + (out - max(0, low)) % kept
    return -i if i < 0 else 2 * (size - 1) - i  # reflect


@irdl_op_definition
class PadOp(GraphOp):
    """Padding (torch constant_pad_nd / reflection_pad / replication_pad / _pad_circular):
    ``low[d]`` / ``high[d]`` elements before / after dim d."""

    name = "graph.pad"
    input = operand_def(TensorType)
    low = prop_def(DenseArrayBase.constr(I64))
    high = prop_def(DenseArrayBase.constr(I64))
    value = prop_def(FloatAttr)
    mode = opt_prop_def(StringAttr)  # absent: "constant"
    result = result_def(TensorType)

    assembly_format = (
        "$input `low` $low `high` $high `value` $value (`mode` $mode^)? attr-dict `:` type($input) `->` "
        "type($result)"
    )

    @staticmethod
    def infer(x: Attribute, low: Sequence[int], high: Sequence[int], mode: str = "constant") -> TensorType:
        op = PadOp.name
        x = check_tensor(x, op, "input")
        shape = list(x.get_shape())
        if mode not in PAD_MODES:
            raise ShapeError(f"{op}: mode {mode!r} is not one of {list(PAD_MODES)}")
        if len(low) != len(shape) or len(high) != len(shape):
            raise ShapeError(
                f"{op}: low {list(low)} and high {list(high)} must have one value per dim of {shape}"
            )
        out = [s + lo + hi for s, lo, hi in zip(shape, low, high)]
        if any(d < 0 for d in out):
            raise ShapeError(f"{op}: padding {list(low)}/{list(high)} of {shape} gives {out}")
        for d, (s, lo, hi) in enumerate(zip(shape, low, high)):
            if mode == "constant" or not (lo or hi):
                continue
            kept = s + min(lo, 0) + min(hi, 0)  # circular wraps around the cropped range
            limit = {"reflect": s - 1, "circular": kept, "replicate": None}[mode]
            if s == 0 or (limit is not None and max(lo, hi) > limit) or s + min(lo, 0) + min(hi, 0) <= 0:
                raise ShapeError(
                    f"{op}: {mode} padding {lo}/{hi} of dim {d} (size {s}) must keep part of a "
                    "non-empty dim" + ("" if limit is None else f" and be at most {limit}")
                )
        return TensorType(x.get_element_type(), out)

    @property
    def pad_mode(self) -> str:
        return "constant" if self.mode is None else self.mode.data

    def infer_result_type(self) -> TensorType:
        if not isinstance(self.value.type, type(f64)):
            raise ShapeError(f"{self.name}: value must be an f64 attribute")
        return self.infer(self.input.type, _ints(self.low), _ints(self.high), self.pad_mode)

    @classmethod
    def make(
        cls, x: SSAValue | Operation, low: Sequence[int], high: Sequence[int], value: float = 0.0,
        mode: str = "constant", *, loc: str | None = None,
    ) -> PadOp:
        x = as_value(x)
        t = cls.infer(x.type, low, high, mode)
        props: dict[str, Attribute] = {
            "low": DenseArrayBase.from_list(i64, [int(v) for v in low]),
            "high": DenseArrayBase.from_list(i64, [int(v) for v in high]),
            "value": FloatAttr(float(value), f64),
        }
        if mode != "constant":
            props["mode"] = StringAttr(mode)
        op = cls.create(operands=[x], result_types=[t], properties=props)
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        low, high = _ints(self.low), _ints(self.high)
        oshape = tuple(self.result.type.get_shape())
        mode = self.pad_mode
        out = np.full(oshape, np.float32(self.value.value.data), np.float32)
        src: list[np.ndarray] = []  # per dim: the source index of each output index (-1: fill)
        for size, lo, hi, n in zip(x.shape, low, high, oshape):
            idx = [source_index(mode, size, lo, hi, o) for o in range(n)]
            src.append(np.array([-1 if i is None else i for i in idx], np.int64))
        keep = np.ix_(*[s >= 0 for s in src]) if src else ()
        sel = np.ix_(*[s[s >= 0] for s in src]) if src else ()
        if all((s >= 0).any() for s in src):
            out[keep] = x[sel]
        return out
