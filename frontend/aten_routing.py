"""Importer handlers for routing ops: topk, sort, argsort, argmax / argmin, max / min
along a dim, kthvalue, histc, bincount.

Every selection becomes ``graph.topk_indices`` (the i32 indices of the k extremes, ties
by the lowest index); values are a gather of the input by those indices (exact), or
``graph.amax`` / ``graph.amin`` for ``max.dim`` / ``min.dim``. ``sort`` is a topk of
the whole dim (``stable=True`` order; an unstable sort may order ties either way, so
this order is one torch allows too), ``topk(sorted=False)`` returns the sorted order
(also one torch allows).

``histc`` computes each element's bin with torch's own rule (``(x - min) * bins /
(max - min)`` truncated, the max edge in the last bin, values outside ``[min, max]``
dropped; ``min == max`` takes the data's range) as elementwise graph ops, then counts
with ``graph.bincount``. ``bincount``'s output length is ``max(input) + 1`` (at least
``minlength``): data-dependent, so only a length torch.export knows statically imports;
otherwise the error says how to write it with a static length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.fx import Node
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_nn as nn
from tilecc.ir import graph_routing as gr
from tilecc.simulator.isa import DType

aten = torch.ops.aten


def handlers(imp: Any) -> dict[Any, Any]:
    return _Handlers(imp).table()


class _Handlers:
    def __init__(self, imp: Any):
        from tilecc.frontend import torch_export as te

        self.imp = imp
        self._Unsupported = te._Unsupported
        self._bind = te._bind

    def table(self) -> dict[Any, Any]:
        t = {
            aten.topk.default: self.h_topk,
            aten.sort.default: self.h_sort,
            aten.sort.stable: self.h_sort,
            aten.argsort.default: self.h_argsort,
            aten.argsort.stable: self.h_argsort,
            aten.argmax.default: self.h_arg(largest=True),
            aten.argmin.default: self.h_arg(largest=False),
            aten.max.dim: self.h_extreme_dim(largest=True),
            aten.min.dim: self.h_extreme_dim(largest=False),
            aten.kthvalue.default: self.h_kthvalue,
            aten.histc.default: self.h_histc,
            aten.bincount.default: self.h_bincount,
            aten._assert_async.msg: self.h_assert_async,
        }
        grouped = _transformers_grouped_mm()
        if grouped is not None:
            t[grouped] = self.h_grouped_mm
        return t

    # -- helpers ----------------------------------------------------------------------

    def emit(self, op: Any) -> SSAValue:
        return self.imp.emit(op)

    def const(self, value: float, dt: DType) -> SSAValue:
        return self.emit(g.ConstantOp.make(np.array(float(value), dtype=np.float32), dt))

    def source(self, a: Any) -> tuple[SSAValue, list[int]]:
        """The input tensor, a rank-0 one viewed as [1]; and its original shape."""
        x = self.imp.tensor(a)
        shape = list(g.shape_of(x))
        if not shape:
            x = self.emit(g.ReshapeOp.make(x, [1]))
        elif math.prod(shape) == 0:
            raise self._Unsupported("an empty input")
        return x, shape

    def select(self, x: SSAValue, dim: int, k: int, largest: bool) -> SSAValue:
        n = g.shape_of(x)[dim]
        if not 1 <= k <= n:
            raise self._Unsupported(f"k = {k} (selects from {n} elements; k = 0 gives an empty result)")
        return self.emit(gr.TopkIndicesOp.make(x, dim, k, largest))

    def take_along(self, x: SSAValue, dim: int, idx: SSAValue) -> SSAValue:
        """``torch.gather(x, dim, idx)`` for an `idx` shaped like `x` but in `dim`: one
        element per row of a gather from `x` viewed as a column (exact)."""
        xs, ish = list(g.shape_of(x)), list(g.shape_of(idx))
        strides = [math.prod(xs[j + 1:]) for j in range(len(xs))]
        offset = np.zeros(ish, dtype=np.float32)
        for j, n in enumerate(ish):
            if j != dim:
                shape = [-1 if t == j else 1 for t in range(len(ish))]
                offset = offset + (np.arange(n, dtype=np.float32) * strides[j]).reshape(shape)
        flat = idx
        if strides[dim] != 1:
            flat = self.emit(g.MulOp.make(flat, self.const(strides[dim], DType.I32)))
        if offset.any():
            flat = self.emit(g.AddOp.make(flat, self.emit(g.ConstantOp.make(offset, DType.I32))))
        col = self.emit(g.ReshapeOp.make(x, [math.prod(xs), 1]))
        y = self.emit(gi.GatherRowsOp.make(col, flat))
        return self.emit(g.ReshapeOp.make(y, ish))

    def finish(self, v: SSAValue, shape: list[int]) -> SSAValue:
        """`v` reshaped to `shape` (the rank-0 case of `source`)."""
        return v if list(g.shape_of(v)) == shape else self.emit(g.ReshapeOp.make(v, shape))

    def values_and_indices(self, node: Node, x: SSAValue, dim: int, k: int, largest: bool) -> tuple[SSAValue, SSAValue]:
        shape, dt = self.imp.out_meta_first(node)
        idx = self.select(x, dim, k, largest)
        vals = self.imp.cast_to(self.take_along(x, dim, idx), dt)
        return self.finish(vals, shape), self.finish(idx, shape)

    def dim_of(self, a: Any, rank: int) -> int:
        d = int(a)
        r = max(rank, 1)
        if not -r <= d < r:
            raise self._Unsupported(f"dim {d} out of range for rank {rank}")
        return d % r

    # -- selection --------------------------------------------------------------------

    def h_topk(self, node: Node) -> tuple[SSAValue, SSAValue]:
        a = self._bind(node)
        x, shape = self.source(a["self"])
        dim = self.dim_of(a.get("dim", -1), len(shape))
        return self.values_and_indices(node, x, dim, int(a["k"]), bool(a.get("largest", True)))

    def h_sort(self, node: Node) -> tuple[SSAValue, SSAValue]:
        a = self._bind(node)
        x, shape = self.source(a["self"])
        dim = self.dim_of(a.get("dim", -1), len(shape))
        return self.values_and_indices(node, x, dim, g.shape_of(x)[dim], bool(a.get("descending", False)))

    def h_argsort(self, node: Node) -> SSAValue:
        a = self._bind(node)
        x, shape = self.source(a["self"])
        dim = self.dim_of(a.get("dim", -1), len(shape))
        return self.finish(self.select(x, dim, g.shape_of(x)[dim], bool(a.get("descending", False))), shape)

    def h_kthvalue(self, node: Node) -> tuple[SSAValue, SSAValue]:
        """The k-th smallest: the last of the k smallest."""
        a = self._bind(node)
        x, shape = self.source(a["self"])
        dim = self.dim_of(a.get("dim", -1), len(shape))
        k = int(a["k"])
        out, dt = self.imp.out_meta_first(node)
        idx = self.select(x, dim, k, largest=False)
        if k > 1:
            idx = self.emit(gi.SliceOp.make(idx, dim, k - 1, k))
        vals = self.imp.cast_to(self.take_along(x, dim, idx), dt)
        return self.finish(vals, out), self.finish(idx, out)

    def h_arg(self, largest: bool):
        def handle(node: Node) -> SSAValue:
            a = self._bind(node)
            out, _ = self.imp.out_meta(node)
            x, shape = self.source(a["self"])
            if a.get("dim") is None:  # over all elements
                x = self.emit(g.ReshapeOp.make(x, [math.prod(g.shape_of(x))]))
                dim = 0
            else:
                dim = self.dim_of(a["dim"], len(shape))
            return self.finish(self.select(x, dim, 1, largest), out)

        return handle

    def h_extreme_dim(self, largest: bool):
        def handle(node: Node) -> tuple[SSAValue, SSAValue]:
            a = self._bind(node)
            out, dt = self.imp.out_meta_first(node)
            x, shape = self.source(a["self"])
            dim = self.dim_of(a["dim"], len(shape))
            idx = self.finish(self.select(x, dim, 1, largest), out)
            red = nn.AmaxOp if largest else nn.AminOp
            vals = self.emit(red.make(x, [dim], True))
            return self.finish(self.imp.cast_to(vals, dt), out), idx

        return handle

    # -- counting ---------------------------------------------------------------------

    def h_histc(self, node: Node) -> SSAValue:
        a = self._bind(node)
        out, dt = self.imp.out_meta(node)
        if dt == DType.I32:
            raise self._Unsupported("histc of an integer tensor (torch takes floats)")
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        bins = int(a.get("bins", 100))
        lo_v, hi_v = float(a.get("min", 0)), float(a.get("max", 0))
        if lo_v > hi_v:
            raise self._Unsupported(f"min {lo_v} > max {hi_v}")
        if not (math.isfinite(lo_v) and math.isfinite(hi_v)):
            raise self._Unsupported(f"range [{lo_v}, {hi_v}] is not finite")
        if lo_v == hi_v:  # torch: the data's range, widened by 1 each way when it is a point
            every = list(range(len(g.shape_of(x))))
            lo = self.emit(nn.AminOp.make(x, every))
            hi = self.emit(nn.AmaxOp.make(x, every))
            same = self.imp.cast_to(self.emit(gi.EqOp.make(lo, hi)), dt)
            lo = self.emit(g.SubOp.make(lo, same))
            hi = self.emit(g.AddOp.make(hi, same))
            width = self.emit(g.SubOp.make(hi, lo))
        else:
            lo, hi = self.const(lo_v, dt), self.const(hi_v, dt)
            f = np.float32
            width = self.const(float(f(f(hi_v) - f(lo_v))), dt)
        pos = self.emit(g.MulOp.make(self.emit(g.SubOp.make(x, lo)), self.const(bins, dt)))
        pos = self.emit(g.CastOp.make(self.emit(g.DivOp.make(pos, width)), DType.I32))
        pos = self.emit(gi.MinimumOp.make(pos, self.const(bins - 1, DType.I32)))  # the max edge
        inside = self.emit(g.MulOp.make(self.emit(gi.GeOp.make(x, lo)), self.emit(gi.LeOp.make(x, hi))))
        pos = self.emit(gi.WhereOp.make(inside, pos, self.const(-1, DType.I32)))
        counts = self.emit(gr.BincountOp.make(pos, bins, result_type=g.element_type(dt)))
        return self.finish(counts, out)

    def h_bincount(self, node: Node) -> SSAValue:
        a = self._bind(node)
        try:
            out, dt = self.imp.out_meta(node)
        except self._Unsupported:
            raise self._Unsupported(
                "its output length is max(input) + 1, known only at run time; give a static length: "
                "torch.histc(x.float(), bins=L, min=0, max=L - 1) or F.one_hot(x, L).sum(0) "
                "(weights: (F.one_hot(x, L) * w[:, None]).sum(0))"
            ) from None
        x = self.imp.tensor(a["self"])
        w = a.get("weights")
        wv = None
        if w is not None:
            wv = self.imp.cast_to(self.imp.tensor(w, "weights"), DType.F32 if dt == DType.I32 else dt)
        counts = self.emit(gr.BincountOp.make(x, out[0], wv, result_type=g.element_type(dt)))
        return counts

    def h_grouped_mm(self, node: Node) -> SSAValue:
        """transformers' ``grouped_mm_fallback(input [S, K], weight [E, K, N], offs [E])``:
        row s of the expert-sorted input times ``weight[e]`` for the group e holding it
        (``offs`` the groups' cumulative ends; rows past ``offs[-1]`` are 0). Here: each
        row's group is ``sum_e (s >= offs[e])``, its expert's weight gathered, one
        batched matmul ``[S, 1, K] @ [S, K, N]`` (the batched_mm implementation's form)."""
        x, w, offs = (self.imp.tensor(a) for a in node.args[:3])
        (S, K), (E, _, N) = g.shape_of(x), g.shape_of(w)
        out, dt = self.imp.out_meta(node)
        offs = self.emit(g.ReshapeOp.make(self.imp.cast_to(offs, DType.I32), [1, E]))
        rows = self.emit(g.ConstantOp.make(np.arange(S, dtype=np.float32).reshape(S, 1), DType.I32))
        ended = self.imp.cast_to(self.emit(gi.GeOp.make(rows, offs)), DType.F32)
        group = self.imp.cast_to(self.emit(nn.SumOp.make(ended, [1])), DType.I32)
        valid = self.imp.cast_to(self.emit(gi.LtOp.make(group, self.const(E, DType.I32))), dt)
        group = self.emit(gi.MinimumOp.make(group, self.const(E - 1, DType.I32)))
        wg = self.emit(gi.GatherRowsOp.make(self.imp.cast_to(w, dt), group))
        xs = self.emit(g.ReshapeOp.make(self.imp.cast_to(x, dt), [S, 1, K]))
        y = self.emit(g.ReshapeOp.make(self.emit(g.MatmulOp.make(xs, wg)), [S, N]))
        y = self.emit(g.MulOp.make(y, self.emit(g.ReshapeOp.make(valid, [S, 1]))))
        return self.finish(y, out)

    def h_assert_async(self, node: Node) -> None:
        """A run-time check on data (one_hot's index range): the device has no way to
        raise; dropped like the importer's other run-time asserts."""
        return None


def _transformers_grouped_mm() -> Any:
    """transformers' ``grouped_mm_fallback`` custom op, when transformers registered it."""
    try:
        return torch.ops.transformers.grouped_mm_fallback.default
    except (AttributeError, RuntimeError):
        return None
