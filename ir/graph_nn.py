"""graph ops for convolutional networks: convolution, pooling, batch norm, resizing, padding.

They build on the base classes of `tilecc.ir.graph` and join the `graph` dialect there.
Batch norm has no op of its own: the importer decomposes inference batch norm into ``graph.mul`` /
``graph.add`` with per-channel constants; hardtanh is ``graph.maximum`` and
``graph.minimum`` (`graph_index`) with scalar constants.

Samples::

    %y = graph.conv2d %x, %w, %b stride [2, 2] padding [3, 3] dilation [1, 1] groups 1
           layout "gihwo" : tensor<1x3x32x32xf32>, tensor<1x3x7x7x64xf32>, tensor<64xf32>
           -> tensor<1x64x16x16xf32>
    %p = graph.max_pool2d %y kernel [3, 3] stride [2, 2] padding [1, 1] dilation [1, 1]
           ceil_mode false : tensor<1x64x16x16xf32> -> tensor<1x64x8x8xf32>
    %a = graph.avg_pool2d %p kernel [2, 2] stride [2, 2] padding [0, 0] ceil_mode false
           count_include_pad true divisor 0 : tensor<1x64x8x8xf32> -> tensor<1x64x4x4xf32>
    %q = graph.adaptive_avg_pool2d %a size [3, 3] : tensor<1x64x4x4xf32> -> tensor<1x64x3x3xf32>
    %u = graph.upsample_nearest2d %q scales [2.0, 2.0] : tensor<1x64x3x3xf32> -> tensor<1x64x6x6xf32>
    %z = graph.pad %u low [0, 0, 1, 0] high [0, 0, 0, 2] value 0.5 : f64
           : tensor<1x64x6x6xf32> -> tensor<1x64x7x8xf32>
    %s = graph.mean %z dims [2, 3] keepdim true : tensor<1x64x7x8xf32> -> tensor<1x64x1x1xf32>

Convolution weights come in one of two layouts (`layout`): ``"oihw"``, torch's
``[Co, Ci/groups, KH, KW]``, or ``"gihwo"``, ``[groups, Ci/groups, KH, KW, Co/groups]``:
output channels innermost, so a tile of (input channel x output channel) for one tap is
a contiguous DMA. The importer packs compile-time weights to ``"gihwo"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Self

import numpy as np
from xdsl.dialects.builtin import (
    I64,
    BoolAttr,
    DenseArrayBase,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
)

from tilecc.errors import ShapeError
from tilecc.ir.graph_base import (
    GraphOp,
    as_value,
    check_tensor,
    fmt_type,
    same_element,
    set_loc,
)
from tilecc.ir.graph_pad import PadOp  # its own file (graph_pad.py); one of NN_OPS

if TYPE_CHECKING:
    import torch

WEIGHT_LAYOUTS = ("oihw", "gihwo")
Ints = Sequence[int] | int  # one value per spatial dim, or one for both


def int_tuple(attr: DenseArrayBase[IntegerType]) -> tuple[int, ...]:
    return tuple(int(v) for v in attr.get_values())


def _pair(op: str, what: str, v: Ints, minimum: int) -> tuple[int, int]:
    vals = (v, v) if isinstance(v, int) else tuple(int(x) for x in v)
    if len(vals) == 1:
        vals = (vals[0], vals[0])
    if len(vals) != 2:
        raise ShapeError(f"{op}: {what} must have 2 values, got {list(vals)}")
    if any(x < minimum for x in vals):
        raise ShapeError(f"{op}: {what} must be >= {minimum}, got {list(vals)}")
    return vals[0], vals[1]


def _arr(v: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, [int(x) for x in v])


def _nchw(op: str, t: TensorType, what: str = "input") -> tuple[int, int, int, int]:
    check_tensor(t, op, what)
    shape = tuple(t.get_shape())
    if len(shape) != 4:
        raise ShapeError(f"{op}: {what} must be 4-D (N, C, H, W), got {fmt_type(t)}")
    return shape


def _torch():  # torch is imported on first use (the references run on torch's CPU kernels)
    import torch

    return torch


def _t64(x: np.ndarray) -> torch.Tensor:
    arr = np.ascontiguousarray(x, dtype=np.float64)
    return _torch().from_numpy(arr)  # pyright: ignore[reportUnknownMemberType]  # torch's stub leaves from_numpy's parameter untyped


# ---------------------------------------------------------------------------
# Convolution
# ---------------------------------------------------------------------------


def conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def weight_oihw(w: np.ndarray, layout: str, groups: int) -> np.ndarray:
    """A convolution weight in torch's [Co, Ci/g, KH, KW] layout."""
    if layout == "oihw":
        return w
    g, cig, kh, kw, cog = w.shape
    return np.ascontiguousarray(np.transpose(w, (0, 4, 1, 2, 3)).reshape(g * cog, cig, kh, kw))


def pack_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """torch [Co, Ci/g, KH, KW] -> ``gihwo`` [g, Ci/g, KH, KW, Co/g]."""
    co, cig, kh, kw = w.shape
    return np.ascontiguousarray(np.transpose(w.reshape(groups, co // groups, cig, kh, kw), (0, 2, 3, 4, 1)))


@irdl_op_definition
class Conv2dOp(GraphOp):
    """2-D convolution (torch.nn.functional.conv2d) with optional bias."""

    name = "graph.conv2d"
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    bias = opt_operand_def(TensorType)
    stride = prop_def(DenseArrayBase.constr(I64))
    padding = prop_def(DenseArrayBase.constr(I64))
    dilation = prop_def(DenseArrayBase.constr(I64))
    groups = prop_def(IntegerAttr[I64])
    layout = prop_def(StringAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $weight (`,` $bias^)? `stride` $stride `padding` $padding `dilation` "
        "$dilation `groups` $groups `layout` $layout attr-dict `:` type($input) `,` "
        "type($weight) (`,` type($bias)^)? `->` type($result)"
    )

    @staticmethod
    def infer(
        x: Attribute,
        w: Attribute,
        b: Attribute | None,
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        groups: int,
        layout: str,
    ) -> TensorType:
        op = Conv2dOp.name
        x = check_tensor(x, op, "input")
        n, c, h, wd = _nchw(op, x)
        w = check_tensor(w, op, "weight")
        b = check_tensor(b, op, "bias") if b is not None else None
        types = [x, w] + ([b] if b is not None else [])
        et = same_element(op, *types)
        sh, sw = _pair(op, "stride", stride, 1)
        ph, pw = _pair(op, "padding", padding, 0)
        dh, dw = _pair(op, "dilation", dilation, 1)
        if groups < 1 or c % groups:
            raise ShapeError(f"{op}: groups {groups} must divide the {c} input channels")
        ws = tuple(w.get_shape())
        if layout == "oihw":
            if len(ws) != 4:
                raise ShapeError(f"{op}: an oihw weight must be 4-D, got {fmt_type(w)}")
            co, cig, kh, kw = ws
            if co % groups:
                raise ShapeError(f"{op}: groups {groups} must divide the {co} output channels")
        elif layout == "gihwo":
            if len(ws) != 5:
                raise ShapeError(f"{op}: a gihwo weight must be 5-D, got {fmt_type(w)}")
            g, cig, kh, kw, cog = ws
            if g != groups:
                raise ShapeError(f"{op}: weight {fmt_type(w)} has {g} groups, the op {groups}")
            co = g * cog
        else:
            raise ShapeError(f"{op}: layout must be one of {', '.join(WEIGHT_LAYOUTS)}, got {layout!r}")
        if cig * groups != c:
            raise ShapeError(
                f"{op}: weight {fmt_type(w)} expects {cig * groups} input channels, input {fmt_type(x)} has {c}"
            )
        if b is not None and tuple(b.get_shape()) != (co,):
            raise ShapeError(f"{op}: bias must have shape [{co}], got {fmt_type(b)}")
        oh = conv_out_size(h, kh, sh, ph, dh)
        ow = conv_out_size(wd, kw, sw, pw, dw)
        if oh < 1 or ow < 1 or kh < 1 or kw < 1:
            raise ShapeError(
                f"{op}: kernel {kh}x{kw} (dilation {dh}x{dw}) does not fit input {h}x{wd} with "
                f"padding {ph}x{pw}"
            )
        return TensorType(et, [n, co, oh, ow])

    @property
    def params(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int, str]:
        return (
            _pair(self.name, "stride", int_tuple(self.stride), 1),
            _pair(self.name, "padding", int_tuple(self.padding), 0),
            _pair(self.name, "dilation", int_tuple(self.dilation), 1),
            self.groups.value.data, self.layout.data,
        )

    def infer_result_type(self) -> TensorType:
        s, p, d, g, lay = self.params
        b = self.bias.type if self.bias is not None else None
        return self.infer(self.input.type, self.weight.type, b, s, p, d, g, lay)

    @classmethod
    def make(
        cls,
        x: SSAValue | Operation,
        w: SSAValue | Operation,
        b: SSAValue | Operation | None = None,
        stride: Ints = 1,
        padding: Ints = 0,
        dilation: Ints = 1,
        groups: int = 1,
        layout: str = "oihw",
        *,
        loc: str | None = None,
    ) -> Conv2dOp:
        x, w = as_value(x), as_value(w)
        b = as_value(b) if b is not None else None
        op = cls.name
        s, p, d = _pair(op, "stride", stride, 1), _pair(op, "padding", padding, 0), _pair(op, "dilation", dilation, 1)
        t = cls.infer(x.type, w.type, b.type if b else None, s, p, d, int(groups), layout)
        new = cls.create(
            operands=[x, w] + ([b] if b is not None else []),
            result_types=[t],
            properties={
                "stride": _arr(s), "padding": _arr(p), "dilation": _arr(d),
                "groups": IntegerAttr(int(groups), i64), "layout": StringAttr(layout),
            },
        )
        set_loc(new, loc)
        return new

    def reference(self, *args: np.ndarray) -> np.ndarray:
        x, w, *rest = args  # input, weight and the bias when the op has one
        b = rest[0] if rest else None
        torch = _torch()
        s, p, d, g, lay = self.params
        w = weight_oihw(np.asarray(w), lay, g)
        y = torch.nn.functional.conv2d(
            _t64(x), _t64(w), _t64(b) if b is not None else None, s, p, d, g
        )
        return y.numpy().astype(np.float32)


# ---------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_shape(op: str, x: Attribute, k: Ints, s: Ints, p: Ints, d: Ints, ceil_mode: bool) -> TensorType:
    x = check_tensor(x, op, "input")
    n, c, h, w = _nchw(op, x)
    kh, kw = _pair(op, "kernel", k, 1)
    sh, sw = _pair(op, "stride", s, 1)
    ph, pw = _pair(op, "padding", p, 0)
    dh, dw = _pair(op, "dilation", d, 1)
    for pad, kk, dd in ((ph, kh, dh), (pw, kw, dw)):
        if pad * 2 > (kk - 1) * dd + 1:
            raise ShapeError(
                f"{op}: padding {[ph, pw]} must be at most half the effective kernel size"
            )
    oh = pool_out_size(h, kh, sh, ph, dh, ceil_mode)
    ow = pool_out_size(w, kw, sw, pw, dw, ceil_mode)
    if oh < 1 or ow < 1:
        raise ShapeError(f"{op}: kernel {kh}x{kw} does not fit input {h}x{w} (output {oh}x{ow})")
    return TensorType(x.get_element_type(), [n, c, oh, ow])


@irdl_op_definition
class MaxPool2dOp(GraphOp):
    """torch.nn.functional.max_pool2d (values only)."""

    name = "graph.max_pool2d"
    input = operand_def(TensorType)
    kernel = prop_def(DenseArrayBase.constr(I64))
    stride = prop_def(DenseArrayBase.constr(I64))
    padding = prop_def(DenseArrayBase.constr(I64))
    dilation = prop_def(DenseArrayBase.constr(I64))
    ceil_mode = prop_def(BoolAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$input `kernel` $kernel `stride` $stride `padding` $padding `dilation` $dilation "
        "`ceil_mode` $ceil_mode attr-dict `:` type($input) `->` type($result)"
    )

    @property
    def params(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int], bool]:
        return (
            _pair(self.name, "kernel", int_tuple(self.kernel), 1),
            _pair(self.name, "stride", int_tuple(self.stride), 1),
            _pair(self.name, "padding", int_tuple(self.padding), 0),
            _pair(self.name, "dilation", int_tuple(self.dilation), 1),
            bool(self.ceil_mode.value.data),
        )

    def infer_result_type(self) -> TensorType:
        return _pool_shape(self.name, self.input.type, *self.params)

    @classmethod
    def make(
        cls, x: SSAValue | Operation, kernel: Ints, stride: Ints | None = None, padding: Ints = 0,
        dilation: Ints = 1, ceil_mode: bool = False, *, loc: str | None = None,
    ) -> MaxPool2dOp:
        x = as_value(x)
        k = _pair(cls.name, "kernel", kernel, 1)
        s = _pair(cls.name, "stride", stride if stride else k, 1)
        p, d = _pair(cls.name, "padding", padding, 0), _pair(cls.name, "dilation", dilation, 1)
        t = _pool_shape(cls.name, x.type, k, s, p, d, bool(ceil_mode))
        op = cls.create(
            operands=[x], result_types=[t],
            properties={
                "kernel": _arr(k), "stride": _arr(s), "padding": _arr(p), "dilation": _arr(d),
                "ceil_mode": BoolAttr.from_bool(bool(ceil_mode)),
            },
        )
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        k, s, p, d, ceil = self.params
        y = _torch().nn.functional.max_pool2d(_t64(x), k, s, p, d, ceil_mode=ceil)
        return y.numpy().astype(np.float32)


def avg_pool_divisors(
    h: int, w: int, oh: int, ow: int, k: Sequence[int], s: Sequence[int], p: Sequence[int],
    count_include_pad: bool, divisor: int,
) -> np.ndarray:
    """[oh, ow] divisor of each output of avg_pool2d (torch's CPU kernel)."""
    out = np.empty((oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            pool = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            if divisor:
                out[i, j] = divisor
            elif count_include_pad:
                out[i, j] = pool
            else:
                out[i, j] = (he - hs) * (we - ws)
    return out


@irdl_op_definition
class AvgPool2dOp(GraphOp):
    """torch.nn.functional.avg_pool2d; ``divisor`` 0 means no divisor_override."""

    name = "graph.avg_pool2d"
    input = operand_def(TensorType)
    kernel = prop_def(DenseArrayBase.constr(I64))
    stride = prop_def(DenseArrayBase.constr(I64))
    padding = prop_def(DenseArrayBase.constr(I64))
    ceil_mode = prop_def(BoolAttr)
    count_include_pad = prop_def(BoolAttr)
    divisor = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `kernel` $kernel `stride` $stride `padding` $padding `ceil_mode` $ceil_mode "
        "`count_include_pad` $count_include_pad `divisor` $divisor attr-dict `:` type($input) "
        "`->` type($result)"
    )

    @property
    def params(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], bool, bool, int]:
        return (
            _pair(self.name, "kernel", int_tuple(self.kernel), 1),
            _pair(self.name, "stride", int_tuple(self.stride), 1),
            _pair(self.name, "padding", int_tuple(self.padding), 0),
            bool(self.ceil_mode.value.data), bool(self.count_include_pad.value.data),
            self.divisor.value.data,
        )

    def infer_result_type(self) -> TensorType:
        k, s, p, ceil, _, div = self.params
        if div < 0:
            raise ShapeError(f"{self.name}: divisor must be >= 0 (0: none), got {div}")
        return _pool_shape(self.name, self.input.type, k, s, p, (1, 1), ceil)

    @classmethod
    def make(
        cls, x: SSAValue | Operation, kernel: Ints, stride: Ints | None = None, padding: Ints = 0,
        ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None,
        *, loc: str | None = None,
    ) -> AvgPool2dOp:
        x = as_value(x)
        k = _pair(cls.name, "kernel", kernel, 1)
        s = _pair(cls.name, "stride", stride if stride else k, 1)
        p = _pair(cls.name, "padding", padding, 0)
        div = int(divisor_override or 0)
        if div < 0:
            raise ShapeError(f"{cls.name}: divisor_override must be positive, got {div}")
        t = _pool_shape(cls.name, x.type, k, s, p, (1, 1), bool(ceil_mode))
        op = cls.create(
            operands=[x], result_types=[t],
            properties={
                "kernel": _arr(k), "stride": _arr(s), "padding": _arr(p),
                "ceil_mode": BoolAttr.from_bool(bool(ceil_mode)),
                "count_include_pad": BoolAttr.from_bool(bool(count_include_pad)),
                "divisor": IntegerAttr(div, i64),
            },
        )
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        k, s, p, ceil, cip, div = self.params
        y = _torch().nn.functional.avg_pool2d(
            _t64(x), k, s, p, ceil_mode=ceil, count_include_pad=cip, divisor_override=div or None
        )
        return y.numpy().astype(np.float32)


def adaptive_windows(size: int, out: int) -> list[tuple[int, int]]:
    """[start, end) of each output of adaptive pooling along one dim (torch's formula)."""
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


@irdl_op_definition
class AdaptiveAvgPool2dOp(GraphOp):
    """torch.nn.functional.adaptive_avg_pool2d."""

    name = "graph.adaptive_avg_pool2d"
    input = operand_def(TensorType)
    size = prop_def(DenseArrayBase.constr(I64))
    result = result_def(TensorType)

    assembly_format = "$input `size` $size attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, size: Sequence[int]) -> TensorType:
        op = AdaptiveAvgPool2dOp.name
        x = check_tensor(x, op, "input")
        n, c, _, _ = _nchw(op, x)
        oh, ow = _pair(op, "output size", size, 1)
        return TensorType(x.get_element_type(), [n, c, oh, ow])

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, int_tuple(self.size))

    @classmethod
    def make(
        cls, x: SSAValue | Operation, size: Sequence[int] | int, *, loc: str | None = None
    ) -> AdaptiveAvgPool2dOp:
        x = as_value(x)
        pair = _pair(cls.name, "output size", size, 1)
        t = cls.infer(x.type, pair)
        op = cls.create(operands=[x], result_types=[t], properties={"size": _arr(pair)})
        set_loc(op, loc)
        return op

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        size = _pair(self.name, "output size", int_tuple(self.size), 1)
        y = _torch().nn.functional.adaptive_avg_pool2d(_t64(x), size)
        return y.numpy().astype(np.float32)


# ---------------------------------------------------------------------------
# Resizing (padding: ir/graph_pad.py)
# ---------------------------------------------------------------------------


def nearest_index(out: int, size: int, scale: float) -> np.ndarray:
    """Source index of each output index of nearest resizing (torch's nearest_idx).

    `scale` is the user's scale factor (0: none, then size / out is used), computed in
    fp32 like torch's CPU kernel.
    """
    dst = np.arange(out)
    if out == size:
        return dst
    if out == 2 * size:
        return dst >> 1
    s = np.float32(1.0 / scale) if scale > 0 else np.float32(size) / np.float32(out)
    src = np.floor(dst.astype(np.float32) * s).astype(np.int64)
    return np.minimum(src, size - 1)


@irdl_op_definition
class UpsampleNearest2dOp(GraphOp):
    """Nearest-neighbour resizing of the last two dims to the result's size.

    ``scales`` are torch's ``scales_h`` / ``scales_w`` (0.0: none); they change the
    source index when the output size is not an exact multiple.
    """

    name = "graph.upsample_nearest2d"
    input = operand_def(TensorType)
    scales = prop_def(DenseArrayBase.constr(f64))
    result = result_def(TensorType)

    assembly_format = "$input `scales` $scales attr-dict `:` type($input) `->` type($result)"

    @staticmethod
    def infer(x: Attribute, size: Sequence[int], scales: Sequence[float]) -> TensorType:
        op = UpsampleNearest2dOp.name
        x = check_tensor(x, op, "input")
        n, c, _, _ = _nchw(op, x)
        oh, ow = _pair(op, "output size", size, 1)
        if len(scales) != 2 or any(not (s >= 0) for s in scales):
            raise ShapeError(f"{op}: scales must be 2 values >= 0 (0: none), got {list(scales)}")
        return TensorType(x.get_element_type(), [n, c, oh, ow])

    @property
    def scale_values(self) -> tuple[float, float]:
        vals = tuple(float(v) for v in self.scales.get_values())
        if len(vals) != 2:
            raise ShapeError(f"{self.name}: scales must be 2 values >= 0 (0: none), got {list(vals)}")
        return vals

    def infer_result_type(self) -> TensorType:
        res = check_tensor(self.result.type, self.name, "result")
        return self.infer(self.input.type, res.get_shape()[2:], self.scale_values)

    @classmethod
    def make(
        cls, x: SSAValue | Operation, size: Sequence[int], scales: Sequence[float | None] = (0.0, 0.0),
        *, loc: str | None = None,
    ) -> UpsampleNearest2dOp:
        x = as_value(x)
        sc = [float(s or 0.0) for s in scales]
        t = cls.infer(x.type, size, sc)
        op = cls.create(
            operands=[x], result_types=[t], properties={"scales": DenseArrayBase.from_list(f64, sc)}
        )
        set_loc(op, loc)
        return op

    def index_maps(self) -> tuple[np.ndarray, np.ndarray]:
        _, _, h, w = check_tensor(self.input.type, self.name, "input").get_shape()
        _, _, oh, ow = self.result.type.get_shape()
        sh, sw = self.scale_values
        return nearest_index(oh, h, sh), nearest_index(ow, w, sw)

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        rows, cols = self.index_maps()
        return np.ascontiguousarray(x[:, :, rows][:, :, :, cols])


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------


class ReduceOp(GraphOp):
    """Reduction over `dims` (sorted, non-negative; empty: no dim) with keepdim."""

    input = operand_def(TensorType)
    dims = prop_def(DenseArrayBase.constr(I64))
    keepdim = prop_def(BoolAttr)
    result = result_def(TensorType)

    assembly_format = (
        "$input `dims` $dims `keepdim` $keepdim attr-dict `:` type($input) `->` type($result)"
    )
    FN: ClassVar[str] = ""

    @classmethod
    def infer(cls, x: Attribute, dims: Sequence[int], keepdim: bool) -> TensorType:
        x = check_tensor(x, cls.name, "input")
        shape = list(x.get_shape())
        if list(dims) != sorted(set(dims)) or any(not 0 <= d < len(shape) for d in dims):
            raise ShapeError(
                f"{cls.name}: dims {list(dims)} must be sorted, distinct and in [0, {len(shape)})"
            )
        if cls.FN in ("max", "min") and any(shape[d] == 0 for d in dims):
            raise ShapeError(f"{cls.name}: cannot reduce an empty dim of {shape}")
        out = [1 if i in dims else s for i, s in enumerate(shape)] if keepdim else [
            s for i, s in enumerate(shape) if i not in dims
        ]
        return TensorType(x.get_element_type(), out)

    @property
    def axes(self) -> tuple[int, ...]:
        return int_tuple(self.dims)

    def infer_result_type(self) -> TensorType:
        return self.infer(self.input.type, self.axes, bool(self.keepdim.value.data))

    @classmethod
    def make(
        cls, x: SSAValue | Operation, dims: Sequence[int] | None, keepdim: bool = False, *, loc: str | None = None
    ) -> Self:
        x = as_value(x)
        rank = check_tensor(x.type, cls.name, "input").get_num_dims()
        if dims is None or (len(dims) == 0 and cls.ALL_WHEN_EMPTY):
            dims = range(rank)
        norm: list[int] = []
        for d in dims:
            d = int(d)
            if not -max(rank, 1) <= d < max(rank, 1):
                raise ShapeError(f"{cls.name}: dim {d} out of range for rank {rank}")
            norm.append(d % max(rank, 1) if rank else 0)
        norm = sorted(set(norm)) if rank else []
        t = cls.infer(x.type, norm, bool(keepdim))
        op = cls.create(
            operands=[x], result_types=[t],
            properties={"dims": _arr(norm), "keepdim": BoolAttr.from_bool(bool(keepdim))},
        )
        set_loc(op, loc)
        return op

    ALL_WHEN_EMPTY: ClassVar[bool] = True  # torch: sum(dim=[]) reduces every dim

    def reference(self, *args: np.ndarray) -> np.ndarray:
        (x,) = args
        x64 = np.asarray(x, dtype=np.float64)
        axes = self.axes
        keep = bool(self.keepdim.value.data)
        with np.errstate(all="ignore"):
            y = self.compute(x64, axes, keep)
        return np.asarray(y, dtype=np.float32).reshape(tuple(self.result.type.get_shape()))

    @staticmethod
    def compute(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        raise NotImplementedError


@irdl_op_definition
class SumOp(ReduceOp):
    name = "graph.sum"
    FN: ClassVar[str] = "sum"

    @staticmethod
    def compute(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.sum(x, axis=axes, keepdims=keep)


@irdl_op_definition
class MeanOp(ReduceOp):
    name = "graph.mean"
    FN: ClassVar[str] = "mean"

    @staticmethod
    def compute(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        n = math.prod(x.shape[a] for a in axes)
        total: np.ndarray = np.sum(x, axis=axes, keepdims=keep)
        return total / n if n else np.full(total.shape, np.nan, dtype=np.float64)


@irdl_op_definition
class AmaxOp(ReduceOp):
    name = "graph.amax"
    FN: ClassVar[str] = "max"

    @staticmethod
    def compute(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.max(x, axis=axes, keepdims=keep) if axes else x


@irdl_op_definition
class AminOp(ReduceOp):
    name = "graph.amin"
    FN: ClassVar[str] = "min"

    @staticmethod
    def compute(x: np.ndarray, axes: tuple[int, ...], keep: bool) -> np.ndarray:
        return np.min(x, axis=axes, keepdims=keep) if axes else x


REDUCE_OPS: tuple[type[ReduceOp], ...] = (SumOp, MeanOp, AmaxOp, AminOp)


NN_OPS: tuple[type[GraphOp], ...] = (
    Conv2dOp, MaxPool2dOp, AvgPool2dOp, AdaptiveAvgPool2dOp, UpsampleNearest2dOp, PadOp,
    *REDUCE_OPS,
)
