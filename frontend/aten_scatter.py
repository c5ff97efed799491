"""Importer handlers for the scatter family: every ATen op that writes slices or
elements of one tensor into a copy of another becomes ``graph.index_scatter``
(`ir/graph_scatter.py`), plus ``copy`` and ``as_strided``.

- ``index_put`` (``x[..., idx] = v``, ``x[..., idx] += v`` with ``accumulate``): the
  index tensors (on adjacent dims after leading ``None`` / full slices) are broadcast
  and linearised over the indexed block of dims, which is merged into one dim of the
  destination; the values broadcast to the indexed shape. Negative indices wrap.
- ``index_copy`` / ``index_add`` (``alpha`` scales the source): one dim, wrapped indices.
- ``slice_scatter`` / ``select_scatter``: a constant index ``range(start, end, step)``.
- ``scatter`` (src and value forms, ``reduce='add' / 'multiply'``), ``scatter_add``,
  ``scatter_reduce`` (sum, prod, amax, amin, mean; ``include_self`` both): element
  granularity, the flat element index ``sum_j coord_j * stride_j`` with the index in
  place of `dim`'s coordinate (i32 arithmetic, exact below 2**24). ``include_self=False``
  first writes the reduction's identity to the targeted elements; ``mean`` divides a
  sum by a count scattered alike.

Functionalised in-place updates (``index_put_``, ``index_copy_``, ``copy_`` of a
registered buffer) import through these; the buffer's new value becomes a program
output (`frontend/torch_export.py`, buffer mutations).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.fx import Node
from xdsl.ir import SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_scatter as gs
from tilecc.simulator.isa import DType

aten = torch.ops.aten

_IDENTITY = {"sum": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf}


def handlers(imp: Any) -> dict[Any, Any]:
    return _ScatterHandlers(imp).table()


def _numel(shape: Any) -> int:
    return int(np.prod(shape, dtype=np.int64))


class _ScatterHandlers:
    def __init__(self, imp: Any):
        from tilecc.frontend import torch_export as te

        self.imp = imp
        self._Unsupported = te._Unsupported
        self._bind = te._bind

    def table(self) -> dict[Any, Any]:
        return {
            aten.index_put.default: self.h_index_put,
            aten._unsafe_index_put.default: self.h_index_put,
            aten.index_copy.default: self.h_index_copy,
            aten.index_add.default: self.h_index_add,
            aten.slice_scatter.default: self.h_slice_scatter,
            aten.select_scatter.default: self.h_select_scatter,
            aten.scatter.src: self.h_scatter,
            aten.scatter.value: self.h_scatter,
            aten.scatter.reduce: self.h_scatter,
            aten.scatter.value_reduce: self.h_scatter,
            aten.scatter_add.default: self.h_scatter_add,
            aten.scatter_reduce.two: self.h_scatter_reduce,
            aten.copy.default: self.h_copy,
            aten.as_strided.default: self.h_as_strided,
        }

    # -- helpers ----------------------------------------------------------------------

    def emit(self, op: Any) -> SSAValue:
        return self.imp.emit(op)

    def const(self, value: float, dt: DType) -> SSAValue:
        return self.emit(g.ConstantOp.make(np.array(value, dtype=np.float32), dt))

    def full(self, shape: list[int], value: float, dt: DType) -> SSAValue:
        c = self.const(value, dt)
        return self.emit(g.ExpandOp.make(c, shape)) if shape else c

    def reshape(self, x: SSAValue, shape: list[int]) -> SSAValue:
        if list(g.shape_of(x)) == list(shape):
            return x
        return self.emit(g.ReshapeOp.make(x, shape))

    def dest(self, node: Node, a: dict[str, Any], zero_d: bool = False) -> tuple[SSAValue, DType]:
        """The destination in the result's dtype; `zero_d`: a 0-d one allowed."""
        _, dt = self.imp.out_meta(node)
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        if not g.shape_of(x) and not zero_d:
            raise self._Unsupported("a scatter into a 0-d tensor")
        return x, dt

    def index(self, a: Any, size: int, wrap: bool = True) -> SSAValue:
        """An i32 index tensor; `wrap`: negative indices count from the end (idx + size * (idx < 0))."""
        idx = self.imp.tensor(a, "index")
        if g.element_dtype(idx.type) != DType.I32:
            raise self._Unsupported("indices must be an integer tensor")
        if not wrap:
            return idx
        neg = self.emit(gi.LtOp.make(idx, self.const(0, DType.I32)))
        shift = self.emit(g.MulOp.make(neg, self.const(size, DType.I32)))
        return self.emit(g.AddOp.make(idx, shift))

    def scatter(self, x: SSAValue, idx: SSAValue, src: SSAValue, dim: int, reduce: str) -> SSAValue:
        return self.emit(gs.IndexScatterOp.make(x, idx, src, dim, reduce))

    # -- slices along one dim ----------------------------------------------------------

    def h_index_put(self, node: Node) -> SSAValue:
        a = self._bind(node)
        x, dt = self.dest(node, a)
        xs = list(g.shape_of(x))
        indices = list(a["indices"])
        given = [i for i, v in enumerate(indices) if v is not None]
        if not given:
            raise self._Unsupported("index_put without an index tensor")
        for d in given:
            t = indices[d].meta.get("val") if isinstance(indices[d], Node) else None
            if isinstance(t, torch.Tensor) and t.dtype == torch.bool:
                raise self._Unsupported("index_put with a boolean mask (a data-dependent set of elements)")
        if given != list(range(given[0], given[-1] + 1)):
            raise self._Unsupported("index_put with index tensors on non-adjacent dims")
        d0, k = given[0], len(given)
        block = xs[d0 : d0 + k]
        idx = [self.index(indices[d], xs[d]) for d in given]
        bshape = list(np.broadcast_shapes(*[tuple(g.shape_of(i)) for i in idx]))
        flat: SSAValue | None = None
        for j, i in enumerate(idx):
            if list(g.shape_of(i)) != bshape:
                i = self.emit(g.ExpandOp.make(i, bshape))
            stride = _numel(block[j + 1 :])
            if stride != 1:
                i = self.emit(g.MulOp.make(i, self.const(stride, DType.I32)))
            flat = i if flat is None else self.emit(g.AddOp.make(flat, i))
        assert flat is not None
        n = _numel(bshape)
        flat = self.reshape(flat, [n])
        indexed = xs[:d0] + bshape + xs[d0 + k :]
        v = self.imp.operand(a["values"], dt)
        if list(g.shape_of(v)) != indexed:
            v = self.emit(g.ExpandOp.make(v, indexed))
        v = self.reshape(v, xs[:d0] + [n] + xs[d0 + k :])
        merged = self.reshape(x, xs[:d0] + [_numel(block)] + xs[d0 + k :])
        reduce = "sum" if a.get("accumulate", False) else "none"
        return self.reshape(self.scatter(merged, flat, v, d0, reduce), xs)

    def one_dim(self, node: Node, reduce: str, scale: Any = 1) -> SSAValue:
        a = self._bind(node)
        x, dt = self.dest(node, a)
        xs = list(g.shape_of(x))
        dim = int(a["dim"]) % len(xs)
        idx = self.index(a["index"], xs[dim])
        idx = self.reshape(idx, [_numel(g.shape_of(idx))])
        src = self.imp.operand(a["source"], dt)
        if scale != 1:
            src = self.emit(g.MulOp.make(src, self.const(float(scale), dt)))
        want = list(xs)
        want[dim] = g.shape_of(idx)[0]
        src = self.reshape(src, want)
        return self.scatter(x, idx, src, dim, reduce)

    def h_index_copy(self, node: Node) -> SSAValue:
        return self.one_dim(node, "none")

    def h_index_add(self, node: Node) -> SSAValue:
        return self.one_dim(node, "sum", self._bind(node).get("alpha", 1))

    def ranged(self, node: Node, x: SSAValue, src: SSAValue, dim: int, rows: range) -> SSAValue:
        xs = list(g.shape_of(x))
        idx = self.emit(g.ConstantOp.make(np.array(list(rows), dtype=np.float32), DType.I32))
        want = list(xs)
        want[dim] = len(rows)
        if not len(rows):
            return x
        return self.scatter(x, idx, self.reshape(src, want), dim, "none")

    def h_slice_scatter(self, node: Node) -> SSAValue:
        a = self._bind(node)
        x, dt = self.dest(node, a)
        xs = list(g.shape_of(x))
        dim = int(a.get("dim", 0)) % len(xs)
        start, end, step = a.get("start"), a.get("end"), int(a.get("step", 1))
        rows = range(*slice(start, end, step).indices(xs[dim]))
        return self.ranged(node, x, self.imp.operand(a["src"], dt), dim, rows)

    def h_select_scatter(self, node: Node) -> SSAValue:
        a = self._bind(node)
        x, dt = self.dest(node, a)
        xs = list(g.shape_of(x))
        dim = int(a["dim"]) % len(xs)
        i = int(a["index"])
        if not -xs[dim] <= i < xs[dim]:
            raise self._Unsupported(f"select_scatter index {i} out of range for dim {dim} of size {xs[dim]}")
        rows = range(i % xs[dim], i % xs[dim] + 1)
        return self.ranged(node, x, self.imp.operand(a["src"], dt), dim, rows)

    # -- elements ------------------------------------------------------------------------

    def elements(
        self, node: Node, x: SSAValue, dim: int, index: Any, src: Any, dt: DType
    ) -> tuple[SSAValue, SSAValue, list[int]]:
        """(flat element index [n], source values [n], x's shape): torch.scatter's target
        of element p of `index` is x[p with dim replaced by index[p]]."""
        xs = list(g.shape_of(x))
        rank = len(xs)
        idx = self.index(index, xs[dim] if xs else 1, wrap=False)
        if not xs:  # a 0-d tensor: a 1-element vector
            xs, rank = [1], 1
            idx = self.reshape(idx, [1])
        ish = list(g.shape_of(idx))
        if len(ish) != rank:
            raise self._Unsupported(f"scatter with an index of rank {len(ish)} into a tensor of rank {rank}")
        strides = [_numel(xs[j + 1 :]) for j in range(rank)]
        flat: SSAValue | None = None
        for j in range(rank):
            if j == dim:
                term = idx
            else:
                pos = np.arange(ish[j], dtype=np.float32).reshape([-1 if t == j else 1 for t in range(rank)])
                term = self.emit(g.ConstantOp.make(pos, DType.I32))
            if strides[j] != 1:
                term = self.emit(g.MulOp.make(term, self.const(strides[j], DType.I32)))
            flat = term if flat is None else self.emit(g.AddOp.make(flat, term))
        assert flat is not None
        if list(g.shape_of(flat)) != ish:
            flat = self.emit(g.ExpandOp.make(flat, ish))
        n = _numel(ish)
        v = self.imp.value(src)
        if isinstance(v, SSAValue):
            v = self.imp.cast_to(v, dt)
            if not g.shape_of(v):
                v = self.reshape(v, [1] * rank)
            for j, size in enumerate(ish):  # torch reads src at the index's positions
                if g.shape_of(v)[j] != size:
                    v = self.emit(gi.SliceOp.make(v, j, 0, size))
        else:
            v = self.full(ish, float(v), dt)
        return self.reshape(flat, [n]), self.reshape(v, [n]), xs

    def element_scatter(self, node: Node, src_key: str, reduce: str, include_self: bool = True) -> SSAValue:
        a = self._bind(node)
        x, dt = self.dest(node, a, zero_d=True)
        shape = list(g.shape_of(x))
        dim = int(a["dim"]) % max(len(shape), 1)
        flat, v, xs = self.elements(node, x, dim, a["index"], a[src_key], dt)
        n = g.shape_of(flat)[0]
        base = self.reshape(x, [_numel(xs)])
        if reduce == "mean":
            if dt == DType.I32:
                raise self._Unsupported("scatter_reduce 'mean' of an integer tensor (floor division)")
            ones = self.full([_numel(xs)], 1.0, dt)
            if not include_self:
                base = self.scatter(base, flat, self.full([n], 0.0, dt), 0, "none")
                ones = self.scatter(ones, flat, self.full([n], 0.0, dt), 0, "none")
            total = self.scatter(base, flat, v, 0, "sum")
            count = self.scatter(ones, flat, self.full([n], 1.0, dt), 0, "sum")
            return self.reshape(self.emit(g.DivOp.make(total, count)), shape)
        if not include_self and reduce != "none":
            base = self.scatter(base, flat, self.full([n], _IDENTITY[reduce], dt), 0, "none")
        return self.reshape(self.scatter(base, flat, v, 0, reduce), shape)

    def h_scatter(self, node: Node) -> SSAValue:
        a = self._bind(node)
        reduce = {None: "none", "add": "sum", "multiply": "prod"}.get(a.get("reduce"))
        if reduce is None:
            raise self._Unsupported(f"scatter reduce={a.get('reduce')!r} (tilecc: 'add', 'multiply')")
        return self.element_scatter(node, "src" if "src" in a else "value", reduce)

    def h_scatter_add(self, node: Node) -> SSAValue:
        return self.element_scatter(node, "src", "sum")

    def h_scatter_reduce(self, node: Node) -> SSAValue:
        a = self._bind(node)
        reduce = str(a["reduce"])
        if reduce not in ("sum", "prod", "amax", "amin", "mean"):
            raise self._Unsupported(f"scatter_reduce reduce={reduce!r}")
        return self.element_scatter(node, "src", reduce, bool(a.get("include_self", True)))

    # -- copies and views ------------------------------------------------------------------

    def h_copy(self, node: Node) -> SSAValue:
        """``copy(self, src)``: src broadcast to self's shape, in self's dtype."""
        a = self._bind(node)
        shape, dt = self.imp.out_meta(node)
        src = self.imp.operand(a["src"], dt)
        return src if list(g.shape_of(src)) == shape else self.emit(g.ExpandOp.make(src, shape))

    def h_as_strided(self, node: Node) -> SSAValue:
        """On the row-major elements of the input (a contiguous tensor in the export:
        ``storage_offset`` counts from its first element)."""
        a = self._bind(node)
        x = self.imp.tensor(a["self"])
        size, stride = [int(s) for s in a["size"]], [int(s) for s in a["stride"]]
        offset = int(a.get("storage_offset") or 0)
        meta = a["self"].meta.get("val") if isinstance(a["self"], Node) else None
        if isinstance(meta, torch.Tensor):
            if not meta.is_contiguous():
                raise self._Unsupported("as_strided of a non-contiguous tensor (its storage order)")
            offset -= int(meta.storage_offset())
        return self.emit(gs.AsStridedOp.make(x, size, stride, offset))
