"""Importer handlers for the ATen ops of convolutional networks (convolution, pooling, batch norm, resizing, padding).

`handlers(imp)` maps ATen overloads to functions of an FX node that emit graph ops
through the importer `imp` (see `frontend/torch_export.py`).

- ``convolution`` -> ``graph.conv2d``; a compile-time weight is packed to the ``gihwo``
  layout (output channels innermost) once, at import.
- inference batch norm (``_native_batch_norm_legit_no_training`` and the eval forms of
  ``_native_batch_norm_legit`` / ``native_batch_norm``) -> ``x * scale + shift`` with
  per-channel constants computed here in fp32 (``scale = w / sqrt(var + eps)``,
  ``shift = b - mean * scale``) and rounded to the input's dtype; the lowering fuses them
  into the producing convolution.
- pooling, ``upsample_nearest2d``, ``constant_pad_nd`` -> their graph ops;
  ``max_pool2d_with_indices`` imports the values only (using the indices is reported).
- ``sum`` / ``mean`` / ``amax`` / ``amin`` -> reductions; ``var`` / ``var_mean`` / ``std``
  decompose into them (in fp32).
- ``hardtanh`` / ``hardswish`` / ``hardsigmoid`` -> ``graph.maximum`` / ``graph.minimum``
  and arithmetic (``clamp`` itself is handled with the comparisons, in aten_index).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.fx import Node
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_nn as nn
from tilecc.simulator.isa import DType

aten = torch.ops.aten


def handlers(imp: Any) -> dict[Any, Any]:
    return _Handlers(imp).table()


def _te():
    from tilecc.frontend import torch_export as te

    return te


def _minimum():
    from tilecc.ir import graph_index as gi

    return gi.MinimumOp


class _Handlers:
    def __init__(self, imp: Any):
        self.imp = imp
        te = _te()
        self.bind = te._bind
        self.Unsupported = te._Unsupported
        self.Poison = te._Poison

    def table(self) -> dict[Any, Any]:
        t: dict[Any, Any] = {
            aten.convolution.default: self.h_conv,
            aten._native_batch_norm_legit_no_training.default: self.h_batch_norm,
            aten._native_batch_norm_legit.default: self.h_batch_norm,
            aten.native_batch_norm.default: self.h_batch_norm,
            aten.native_group_norm.default: self.h_group_norm,
            aten.max_pool2d_with_indices.default: self.h_max_pool_indices,
            aten.max_pool2d.default: self.h_max_pool,
            aten.avg_pool2d.default: self.h_avg_pool,
            aten._adaptive_avg_pool2d.default: self.h_adaptive_avg_pool,
            aten.adaptive_avg_pool2d.default: self.h_adaptive_avg_pool,
            aten.upsample_nearest2d.default: self.h_upsample,
            aten.upsample_nearest2d.vec: self.h_upsample,
            aten.constant_pad_nd.default: self.h_pad,
            aten._pad_circular.default: self.mode_pad("circular"),
            **{getattr(aten, f"{kind}_pad{n}d").default: self.mode_pad(mode)
               for kind, mode in (("reflection", "reflect"), ("replication", "replicate")) for n in (1, 2, 3)},
            aten.sum.dim_IntList: self.reduce(nn.SumOp),
            aten.sum.default: self.reduce(nn.SumOp),
            aten.mean.dim: self.reduce(nn.MeanOp),
            aten.mean.default: self.reduce(nn.MeanOp),
            aten.amax.default: self.reduce(nn.AmaxOp),
            aten.amin.default: self.reduce(nn.AminOp),
            aten.var.correction: self.h_var,
            aten.var.dim: self.h_var,
            aten.var_mean.correction: self.h_var_mean,
            aten.std.correction: self.h_std,
            aten.std.dim: self.h_std,
            aten.hardtanh.default: self.h_hardtanh,
            aten.hardswish.default: self.h_hardswish,
            aten.hardsigmoid.default: self.h_hardsigmoid,
        }
        return t

    # -- helpers ----------------------------------------------------------------------

    def emit(self, op: Operation) -> SSAValue:
        return self.imp.emit(op)

    def x_of(self, node: Node, a: Any, dt: DType) -> SSAValue:
        return self.imp.cast_to(self.imp.tensor(a), dt)

    def const(self, value: float, dt: DType) -> SSAValue:
        return self.emit(g.ConstantOp.make(np.array(float(value), dtype=np.float32), dt))

    def known(self, a: Any) -> torch.Tensor | None:
        """The compile-time value of an fx argument (a weight, buffer or folded node)."""
        if isinstance(a, Node):
            v = self.imp.const_values.get(a)
            if isinstance(v, torch.Tensor):
                return v.detach()
        return None

    def name_of(self, a: Any, fallback: str) -> str:
        if isinstance(a, Node):
            return self.imp.const_names.get(a, f"folded.{a.name}")
        return fallback

    def new_weight(self, name: str, data: np.ndarray, dt: DType) -> SSAValue:
        """A graph.weight holding `data` (float32 values, stored as `dt`)."""
        base, i = name, 1
        while name in self.imp.weights and not np.array_equal(self.imp.weights[name], data):
            name, i = f"{base}.{i}", i + 1
        self.imp.weights[name] = np.ascontiguousarray(data, dtype=np.float32)
        return self.emit(g.WeightOp.make(name, g.tensor_type(list(data.shape), dt)))

    # -- convolution ------------------------------------------------------------------

    def h_conv(self, node: Node) -> SSAValue:
        a = self.bind(node)
        stride, padding, dilation = (list(a[k]) for k in ("stride", "padding", "dilation"))
        if a["transposed"] or len(stride) != 2 or len(node.meta["val"].shape) != 4:
            from tilecc.frontend.aten_conv_nd import convolution_nd  # 1-d, unbatched, transposed

            return convolution_nd(self, node, a)
        groups = int(a["groups"])
        shape, dt = self.imp.out_meta(node)
        x = self.x_of(node, a["input"], dt)
        bias = self.imp.value(a["bias"]) if a["bias"] is not None else None
        if bias is not None:
            bias = self.imp.cast_to(bias, dt)
        wdata = self.known(a["weight"])
        if wdata is not None and wdata.dim() == 4:
            packed = self.packed_weight(a["weight"], wdata, groups, dt)
            y = nn.Conv2dOp.make(x, packed, bias, stride, padding, dilation, groups, "gihwo")
        else:
            w = self.x_of(node, a["weight"], dt)
            y = nn.Conv2dOp.make(x, w, bias, stride, padding, dilation, groups, "oihw")
        return self.emit(y)

    def packed_weight(self, wnode: Node, data: torch.Tensor, groups: int, dt: DType) -> SSAValue:
        cache = self.imp.packed_weights
        key = (wnode, groups, dt)
        if key not in cache:
            w = data.to(torch.float32).numpy()
            name = f"{self.name_of(wnode, 'conv.weight')}.gihwo"
            cache[key] = self.new_weight(name, nn.pack_weight(w, groups), dt)
        return cache[key]

    # -- batch norm -------------------------------------------------------------------

    def h_batch_norm(self, node: Node) -> tuple:
        a = self.bind(node)
        if a.get("training"):
            raise self.Unsupported("training-mode batch norm (tilecc compiles inference)")
        shape, dt = self.imp.out_meta_first(node)
        x = self.x_of(node, a["input"], dt)
        rank = len(shape)
        if rank < 2:
            raise self.Unsupported("batch norm of a rank < 2 input")
        C = shape[1]
        cshape = [C] + [1] * (rank - 2)
        eps = float(a["eps"])
        names = ("weight", "bias", "running_mean", "running_var")
        parts = [self.known(a[k]) if a[k] is not None else None for k in names]
        w, b, mean, var = parts
        if a["running_mean"] is None or a["running_var"] is None:
            raise self.Unsupported("batch norm without running statistics")
        known = all(p is not None or a[k] is None for p, k in zip(parts, names))
        if known and mean is not None and var is not None:  # known implies both (checked present above)
            # everything known: per-channel scale and shift, computed like torch in fp32
            mean32, var32 = mean.to(torch.float32), var.to(torch.float32)
            invstd = 1.0 / torch.sqrt(var32 + eps)
            scale = invstd * w.to(torch.float32) if w is not None else invstd
            shift = (b.to(torch.float32) if b is not None else torch.zeros_like(mean32)) - mean32 * scale
            prefix = self.name_of(a["running_mean"], "bn.running_mean")
            prefix = prefix[: -len(".running_mean")] if prefix.endswith(".running_mean") else prefix
            y = self.fold_into_conv(node, a["input"], x, scale, shift, dt, prefix)
            if y is None:
                sw = self.new_weight(f"{prefix}.bn_scale", scale.numpy().reshape(cshape), dt)
                bw = self.new_weight(f"{prefix}.bn_shift", shift.numpy().reshape(cshape), dt)
                y = self.emit(g.AddOp.make(self.emit(g.MulOp.make(x, sw)), bw))
        else:
            # statistics computed at run time: the same formula with graph ops on [C]
            def vec(k: str) -> SSAValue | None:
                if a[k] is None:
                    return None
                return self.emit(g.ReshapeOp.make(self.x_of(node, a[k], dt), cshape))

            wv, bv, mv, vv = vec("weight"), vec("bias"), vec("running_mean"), vec("running_var")
            if mv is None or vv is None:  # checked present above
                raise self.Unsupported("batch norm without running statistics")
            scale = self.emit(g.RsqrtOp.make(self.emit(g.AddOp.make(vv, self.const(eps, dt)))))
            if wv is not None:
                scale = self.emit(g.MulOp.make(scale, wv))
            y = self.emit(g.MulOp.make(self.emit(g.SubOp.make(x, mv)), scale))
            if bv is not None:
                y = self.emit(g.AddOp.make(y, bv))
        return (y, self.Poison("batch norm mean output"), self.Poison("batch norm invstd output"))

    def fold_into_conv(
        self, bn: Node, xnode: Any, x: SSAValue, scale: torch.Tensor, shift: torch.Tensor, dt: DType, prefix: str,
    ) -> SSAValue | None:
        """Inference batch norm right after a convolution it alone uses, whose weights
        (and bias) are known: the scale folds into the packed weights and the shift (plus
        the scaled bias) becomes the bias, ``conv(x, w * s) + (b * s + t)``, computed in
        fp32 and stored in the weights' dtype (as every inference compiler does; the
        result differs from conv-then-normalise only by the rounding of the folded
        weights). None where it does not apply."""
        if not isinstance(xnode, Node) or len(xnode.users) != 1:
            return None
        conv = x.owner
        if not isinstance(conv, nn.Conv2dOp) or conv.parent is None or x.uses:  # nothing uses it yet
            return None
        stride, padding, dilation, groups, layout = conv.params
        wop = conv.weight.owner
        if layout != "gihwo" or not isinstance(wop, g.WeightOp) or not conv.weight.has_one_use():
            return None
        wname = wop.weight
        w = self.imp.weights.get(wname)
        if w is None:
            return None
        bias = None
        if conv.bias is not None:
            bop = conv.bias.owner
            if not isinstance(bop, g.WeightOp) or not conv.bias.has_one_use():
                return None
            bias = self.imp.weights.get(bop.weight)
            if bias is None:
                return None
        G, cig, kh, kw, cog = w.shape
        s32 = scale.to(torch.float32).numpy().reshape(G, 1, 1, 1, cog)
        wf = (w.astype(np.float32) * s32).astype(np.float32)
        bf = shift.to(torch.float32).numpy().reshape(-1)
        if bias is not None:
            bf = bf + bias.astype(np.float32).reshape(-1) * scale.to(torch.float32).numpy().reshape(-1)
        packed = self.new_weight(f"{wname}.bn_folded", wf, g.element_dtype(conv.weight.type))
        bvar = self.new_weight(f"{prefix}.bn_bias", bf.astype(np.float32), dt)
        y = self.emit(nn.Conv2dOp.make(conv.input, packed, bvar, stride, padding, dilation, groups, "gihwo"))
        old_bias = conv.bias
        conv.results[0].replace_all_uses_with(y)
        conv.detach()
        conv.erase()
        for v in (wop.results[0], old_bias):
            if v is not None and not v.uses and isinstance(v.owner, g.WeightOp):
                name = v.owner.weight
                v.owner.detach()
                v.owner.erase()
                if name != f"{wname}.bn_folded":
                    self.imp.weights.pop(name, None)
        cache = self.imp.packed_weights
        for key in [k for k, val in cache.items() if val is wop.results[0]]:
            del cache[key]
        return y

    def h_group_norm(self, node: Node) -> tuple:
        """Group norm as a layer norm over ``[N, G, C/G * HxW]`` (fp32, unit affine), then
        the per-channel affine on ``[N, C, ...]``."""
        a = self.bind(node)
        shape, dt = self.imp.out_meta_first(node)
        groups = int(a["group"])
        if len(shape) < 2 or shape[1] % groups:
            raise self.Unsupported(f"group norm of shape {shape} with {groups} groups")
        N, C = shape[0], shape[1]
        rest = math.prod(shape) // max(N * groups, 1)
        x = self.imp.cast_to(self.imp.tensor(a["input"]), DType.F32)
        xg = self.emit(g.ReshapeOp.make(x, [N, groups, rest]))
        ones = self.emit(g.ConstantOp.make(np.ones([rest], dtype=np.float32), DType.F32))
        zeros = self.emit(g.ConstantOp.make(np.zeros([rest], dtype=np.float32), DType.F32))
        y = self.emit(g.ReshapeOp.make(self.emit(g.LayerNormOp.make(xg, ones, zeros, 1, float(a["eps"]))), shape))
        cshape = [C] + [1] * (len(shape) - 2)
        for k, cls in (("weight", g.MulOp), ("bias", g.AddOp)):
            if a[k] is not None:
                v = self.emit(g.ReshapeOp.make(self.x_of(node, a[k], DType.F32), cshape))
                y = self.emit(cls.make(y, v))
        y = self.imp.cast_to(y, dt)
        return (y, self.Poison("group norm mean output"), self.Poison("group norm rstd output"))

    # -- pooling, resizing, padding ---------------------------------------------------

    def h_max_pool_indices(self, node: Node) -> tuple:
        if not any(u.target is operator.getitem and u.args[1] == 1 for u in node.users):  # values only
            return (self.h_max_pool(node, first=True), self.Poison("max_pool2d indices output"))
        from tilecc.frontend.aten_pool_indices import max_pool_with_indices

        a = self.bind(node)
        _, dt = self.imp.out_meta_first(node)
        x = self.x_of(node, a["self"], dt)
        if len(g.shape_of(x)) not in (3, 4):
            raise self.Unsupported(f"a rank-{len(g.shape_of(x))} input")
        return max_pool_with_indices(
            self.imp, x, a["kernel_size"], a["stride"], a["padding"], a["dilation"], bool(a["ceil_mode"]), dt,
        )

    def h_max_pool(self, node: Node, first: bool = False) -> SSAValue:
        a = self.bind(node)
        _, dt = self.imp.out_meta_first(node) if first else self.imp.out_meta(node)
        x = self.x_of(node, a["self"], dt)
        if len(g.shape_of(x)) == 3:  # unbatched: a batch of one
            y = self.emit(nn.MaxPool2dOp.make(
                self.emit(g.ReshapeOp.make(x, [1, *g.shape_of(x)])), list(a["kernel_size"]),
                list(a["stride"] or []) or None, list(_pair(a["padding"])), list(_pair(a["dilation"])),
                bool(a["ceil_mode"]),
            ))
            return self.emit(g.ReshapeOp.make(y, list(g.shape_of(y))[1:]))
        if len(g.shape_of(x)) != 4:
            raise self.Unsupported("unbatched input")
        return self.emit(nn.MaxPool2dOp.make(
            x, list(a["kernel_size"]), list(a["stride"] or []) or None, list(_pair(a["padding"])),
            list(_pair(a["dilation"])), bool(a["ceil_mode"]),
        ))

    def h_avg_pool(self, node: Node) -> SSAValue:
        a = self.bind(node)
        _, dt = self.imp.out_meta(node)
        x = self.x_of(node, a["self"], dt)
        if len(g.shape_of(x)) != 4:
            raise self.Unsupported("unbatched input")
        return self.emit(nn.AvgPool2dOp.make(
            x, list(a["kernel_size"]), list(a["stride"] or []) or None, list(_pair(a["padding"])),
            bool(a["ceil_mode"]), bool(a["count_include_pad"]), a["divisor_override"],
        ))

    def h_adaptive_avg_pool(self, node: Node) -> SSAValue:
        a = self.bind(node)
        shape, dt = self.imp.out_meta(node)
        x = self.x_of(node, a["self"], dt)
        if len(g.shape_of(x)) != 4:
            raise self.Unsupported("unbatched input")
        return self.emit(nn.AdaptiveAvgPool2dOp.make(x, shape[2:]))

    def h_upsample(self, node: Node) -> SSAValue:
        a = self.bind(node)
        shape, dt = self.imp.out_meta(node)
        x = self.x_of(node, a.get("self", a.get("input")), dt)
        if len(g.shape_of(x)) != 4:
            raise self.Unsupported("unbatched input")
        if "scale_factors" in a:
            sf = a["scale_factors"]
            scales = [float(s) for s in sf] if sf else [0.0, 0.0]
        else:
            scales = [float(a["scales_h"] or 0.0), float(a["scales_w"] or 0.0)]
        return self.emit(nn.UpsampleNearest2dOp.make(x, shape[2:], scales))

    def h_pad(self, node: Node) -> SSAValue:
        a = self.bind(node)
        value = a["value"] if a["value"] is not None else 0.0
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.Unsupported(f"pad value {value!r}")
        return self._pad(node, a["self"], a["pad"], "constant", float(value))

    def mode_pad(self, mode: str) -> Callable[[Node], SSAValue]:
        def handle(node: Node) -> SSAValue:
            a = self.bind(node)
            return self._pad(node, a["self"], a.get("padding", a.get("pad")), mode, 0.0)

        return handle

    def _pad(self, node: Node, xa: Any, pads: Any, mode: str, value: float) -> SSAValue:
        """torch's pad list (last dim first, (before, after) pairs) -> graph.pad."""
        _, dt = self.imp.out_meta(node)
        x = self.x_of(node, xa, dt)
        rank = len(g.shape_of(x))
        pad = [int(p) for p in pads]
        if len(pad) % 2 or len(pad) // 2 > rank:
            raise self.Unsupported(f"pad {pad} for a rank-{rank} input")
        low, high = [0] * rank, [0] * rank
        for i in range(len(pad) // 2):
            low[rank - 1 - i], high[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
        return self.emit(nn.PadOp.make(x, low, high, value, mode))

    # -- reductions -------------------------------------------------------------------

    def reduce(self, cls: Any) -> Callable[[Node], SSAValue]:  # cls: a graph op class
        def handle(node: Node) -> SSAValue:
            a = self.bind(node)
            shape, dt = self.imp.out_meta(node)
            x = self.x_of(node, a["self"], dt)
            dims = a.get("dim")
            y = self.emit(cls.make(x, list(dims) if dims is not None else None, bool(a.get("keepdim"))))
            return y

        return handle

    def var_parts(self, node: Node, first: bool) -> tuple[SSAValue, SSAValue, DType]:
        """(var, mean) of `node`'s input, computed in fp32."""
        a = self.bind(node)
        _, dt = self.imp.out_meta_first(node) if first else self.imp.out_meta(node)
        x = self.imp.tensor(a["self"])
        x32 = self.imp.cast_to(x, DType.F32)
        shape = g.shape_of(x32)
        dims = a.get("dim")
        dims = (list(range(len(shape))) if dims is None or len(dims) == 0
                else [int(d) % max(len(shape), 1) for d in dims])
        keep = bool(a.get("keepdim"))
        if "correction" in a:
            corr = a["correction"] if a["correction"] is not None else 1
        else:
            corr = 1 if a.get("unbiased", True) else 0
        n = math.prod(shape[d] for d in dims)
        m = self.emit(nn.MeanOp.make(x32, dims, True))
        d = self.emit(g.SubOp.make(x32, m))
        s = self.emit(nn.SumOp.make(self.emit(g.MulOp.make(d, d)), dims, keep))
        v = self.emit(g.DivOp.make(s, self.const(max(0, n - float(corr)), DType.F32)))
        if not keep:
            m = self.emit(g.ReshapeOp.make(m, list(g.shape_of(s))))
        return self.imp.cast_to(v, dt), self.imp.cast_to(m, dt), dt

    def h_var(self, node: Node) -> SSAValue:
        return self.var_parts(node, False)[0]

    def h_var_mean(self, node: Node) -> tuple:
        v, m, _ = self.var_parts(node, True)
        return (v, m)

    def h_std(self, node: Node) -> SSAValue:
        _, dt = self.imp.out_meta(node)
        v, _, _ = self.var_parts(node, False)
        return self.imp.cast_to(self.emit(g.SqrtOp.make(self.imp.cast_to(v, DType.F32))), dt)

    # -- activations ------------------------------------------------------------------

    def clamp(self, x: SSAValue, lo: float | None, hi: float | None, dt: DType) -> SSAValue:
        if lo is not None:
            x = self.emit(g.MaximumOp.make(x, self.const(lo, dt)))
        if hi is not None:
            x = self.emit(_minimum().make(x, self.const(hi, dt)))
        return x

    def h_hardtanh(self, node: Node) -> SSAValue:
        a = self.bind(node)
        _, dt = self.imp.out_meta(node)
        return self.clamp(self.x_of(node, a["self"], dt), float(a["min_val"]), float(a["max_val"]), dt)

    def h_hardsigmoid(self, node: Node) -> SSAValue:
        _, dt = self.imp.out_meta(node)
        x = self.x_of(node, node.args[0], dt)
        y = self.clamp(self.emit(g.AddOp.make(x, self.const(3.0, dt))), 0.0, 6.0, dt)
        return self.emit(g.DivOp.make(y, self.const(6.0, dt)))

    def h_hardswish(self, node: Node) -> SSAValue:
        _, dt = self.imp.out_meta(node)
        x = self.x_of(node, node.args[0], dt)
        y = self.clamp(self.emit(g.AddOp.make(x, self.const(3.0, dt))), 0.0, 6.0, dt)
        return self.emit(g.DivOp.make(self.emit(g.MulOp.make(x, y)), self.const(6.0, dt)))


def _pair(v: Any) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    return v * 2 if len(v) == 1 else v
