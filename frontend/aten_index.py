"""Importer handlers for the ATen ops of indexing, slicing, joining, comparisons and
selection, the elementwise ops transformers add, and attention.

`handlers(imp)` maps ATen overloads to functions of an FX node that emit graph ops
through the importer `imp` (see `frontend/torch_export.py`).

Integer tensors (int64 token ids, int32) and bools are ``i32`` graph tensors; bools are
0 / 1. A comparison yields an i32 0 / 1 tensor; logical ops work on 0 / 1 values
(``and`` = mul, ``or`` = maximum, ``not`` = ``eq 0``); a non-bool operand of a logical
op is first compared ``ne 0``. ``_to_copy`` to bool is ``ne 0``; other casts are
``graph.cast`` (float -> int truncates toward zero, as torch does).

``scaled_dot_product_attention`` stays whole as ``graph.sdpa`` (a bool mask becomes an
additive 0 / -inf mask; grouped-query attention repeats the k / v heads).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.fx import Node
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.simulator.isa import DType

aten = torch.ops.aten


def _frontend():
    from tilecc.frontend import torch_export as te

    return te


def handlers(imp: Any) -> dict[Any, Any]:
    return _Handlers(imp).table()


class _Handlers:
    def __init__(self, imp: Any):
        self.imp = imp
        te = _frontend()
        self._Unsupported = te._Unsupported
        self._bind = te._bind
        self._dtype = te._dtype

    # -- helpers ----------------------------------------------------------------------

    def unsupported(self, reason: str) -> Exception:
        return self._Unsupported(reason)

    def emit(self, op: Operation) -> SSAValue:
        return self.imp.emit(op)

    def torch_dtype(self, a: Any) -> torch.dtype | None:
        """The torch dtype of an fx argument (None for Python scalars)."""
        if isinstance(a, Node):
            c = self.imp.const_values.get(a)
            if isinstance(c, torch.Tensor):
                return c.dtype
            v = a.meta.get("val")
            if isinstance(v, torch.Tensor):
                return v.dtype
        return None

    def const(self, value: Any, dt: DType) -> SSAValue:
        """A rank-0 constant (bools as 0 / 1)."""
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int | float):
            raise self.unsupported(f"scalar operand {value!r}")
        return self.emit(g.ConstantOp.make(np.array(float(value), dtype=np.float32), dt))

    def operand(self, a: Any, dt: DType) -> SSAValue:
        v = self.imp.value(a)
        if isinstance(v, SSAValue):
            return self.imp.cast_to(v, dt)
        return self.const(v, dt)

    def full(self, shape: list[int], value: Any, dt: DType) -> SSAValue:
        """A tensor of one value: a rank-0 constant broadcast (no large constant)."""
        c = self.const(value, dt)
        if not shape:
            return c
        return self.emit(g.ExpandOp.make(c, shape))

    def truth(self, a: Any) -> SSAValue:
        """An i32 0 / 1 tensor: a bool tensor as is, anything else ``!= 0``."""
        v = self.imp.value(a)
        if not isinstance(v, SSAValue):
            return self.const(bool(v), DType.I32)
        if self.torch_dtype(a) == torch.bool:
            return v
        zero = self.const(0, g.element_dtype(v.type))
        return self.emit(gi.NeOp.make(v, zero))

    def out(self, node: Node) -> tuple[list[int], DType]:
        return self.imp.out_meta(node)

    # -- the table --------------------------------------------------------------------

    def table(self) -> dict[Any, Any]:
        t: dict[Any, Any] = {
            aten.embedding.default: self.h_embedding,
            aten.index.Tensor: self.h_index,
            aten.index_select.default: self.h_index_select,
            aten.gather.default: self.h_gather,
            aten.slice.Tensor: self.h_slice,
            aten.select.int: self.h_select,
            aten.narrow.default: self.h_narrow,
            aten.cat.default: self.h_cat,
            aten.split_with_sizes.default: self.h_split_with_sizes,
            aten.split.Tensor: self.h_split,
            aten.unbind.int: self.h_unbind,
            aten.pow.Tensor_Scalar: self.h_pow_scalar,
            aten.pow.Tensor_Tensor: self.binary(gi.PowOp),
            aten.pow.Scalar: self.h_pow_scalar_base,
            aten.abs.default: self.unary(gi.AbsOp),
            aten.log.default: self.unary(gi.LogOp),
            aten.erf.default: self.unary(gi.ErfOp),
            aten.minimum.default: self.binary(gi.MinimumOp),
            aten.where.self: self.h_where,
            aten._log_softmax.default: self.h_log_softmax,
            aten.log_softmax.int: self.h_log_softmax,
            aten.logical_not.default: self.h_logical_not,
            aten.bitwise_not.default: self.h_logical_not,
            aten.logical_and.default: self.logical(g.MulOp),
            aten.logical_or.default: self.logical(g.MaximumOp),
            aten.logical_xor.default: self.logical(gi.NeOp),
            aten.bitwise_and.Tensor: self.logical(g.MulOp, bool_only=True),
            aten.bitwise_or.Tensor: self.logical(g.MaximumOp, bool_only=True),
            aten.bitwise_xor.Tensor: self.logical(gi.NeOp, bool_only=True),
            aten.full.default: self.h_full,
            aten.full_like.default: self.h_full_like,
            aten.zeros_like.default: self.h_fill_like(0),
            aten.ones_like.default: self.h_fill_like(1),
            aten.zeros.default: self.h_fill(0),
            aten.ones.default: self.h_fill(1),
            aten.scalar_tensor.default: self.h_scalar_tensor,
            aten.arange.default: self.h_arange,
            aten.arange.start: self.h_arange,
            aten.arange.start_step: self.h_arange,
            aten._to_copy.default: self.h_to_copy,
            aten.cumsum.default: self.h_cumsum,
            aten.any.default: self.h_any,
            aten.any.dim: self.h_any,
            aten.any.dims: self.h_any,
            aten.scaled_dot_product_attention.default: self.h_sdpa,
        }
        for cls, names in (
            (gi.EqOp, "eq"), (gi.NeOp, "ne"), (gi.LtOp, "lt"),
            (gi.LeOp, "le"), (gi.GtOp, "gt"), (gi.GeOp, "ge"),
        ):  # fmt: skip
            packet = getattr(aten, names)
            t[packet.Tensor] = self.compare(cls)
            t[packet.Scalar] = self.compare(cls)
        # clamp only where the CNN op family (frontend/aten_nn.py) does not handle it
        from tilecc.frontend import aten_nn

        nn = aten_nn.handlers(self.imp)
        for key, fn in ((aten.clamp.default, self.h_clamp), (aten.clamp.Tensor, self.h_clamp)):
            if key not in nn:
                t[key] = fn
        return t

    # -- elementwise ------------------------------------------------------------------

    def unary(self, cls: Any) -> Callable[[Node], SSAValue]:  # cls: a graph op class
        def handle(node: Node) -> SSAValue:
            _, dt = self.out(node)
            return self.emit(cls.make(self.imp.cast_to(self.imp.tensor(node.args[0]), dt)))

        return handle

    def binary(self, cls: Any) -> Callable[[Node], SSAValue]:  # cls: a graph op class
        def handle(node: Node) -> SSAValue:
            _, dt = self.out(node)
            return self.emit(cls.make(self.operand(node.args[0], dt), self.operand(node.args[1], dt)))

        return handle

    def h_pow_scalar(self, node: Node) -> SSAValue:
        a = self._bind(node)
        shape, dt = self.out(node)
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        e = a["exponent"]
        if isinstance(e, bool) or not isinstance(e, int | float):
            raise self.unsupported(f"exponent {e!r}")
        if e == 1:
            return x
        if e == 0:
            return self.full(shape, 1, dt)
        if e == 2:
            return self.emit(g.MulOp.make(x, x))
        if e == 0.5 and dt != DType.I32:
            return self.emit(g.SqrtOp.make(x))
        if e == -0.5 and dt != DType.I32:
            return self.emit(g.RsqrtOp.make(x))
        return self.emit(gi.PowOp.make(x, self.const(e, dt)))

    def h_pow_scalar_base(self, node: Node) -> SSAValue:
        a = self._bind(node)
        _, dt = self.out(node)
        return self.emit(gi.PowOp.make(self.const(a["self"], dt), self.operand(a["exponent"], dt)))

    def compare(self, cls: Any) -> Callable[[Node], SSAValue]:  # cls: a graph op class
        def handle(node: Node) -> SSAValue:
            x, y = node.args[0], node.args[1]
            tx, ty = self.torch_dtype(x), self.torch_dtype(y)
            if tx is None:
                raise self.unsupported("first operand is not a tensor")
            if ty is None:  # a Python scalar: torch's promotion rules with a 0-d value
                if not isinstance(y, int | float | bool | complex):
                    raise self.unsupported("second operand is neither a tensor nor a Python number")
                common = torch.result_type(torch.empty((), dtype=tx), y)
            else:
                common = torch.promote_types(tx, ty)
            dt = self._dtype(common)
            return self.emit(cls.make(self.operand(x, dt), self.operand(y, dt)))

        return handle

    def logical(self, cls: Any, bool_only: bool = False) -> Callable[[Node], SSAValue]:
        def handle(node: Node) -> SSAValue:
            x, y = node.args[0], node.args[1]
            if bool_only and not (self.torch_dtype(x) == torch.bool and self.torch_dtype(y) == torch.bool):
                raise self.unsupported("bitwise ops on integers (only bools)")
            return self.emit(cls.make(self.truth(x), self.truth(y)))

        return handle

    def h_logical_not(self, node: Node) -> SSAValue:
        x = node.args[0]
        if node.target == aten.bitwise_not.default and self.torch_dtype(x) != torch.bool:
            raise self.unsupported("bitwise_not on integers (only bools)")
        return self.emit(gi.EqOp.make(self.truth(x), self.const(0, DType.I32)))

    def h_any(self, node: Node) -> SSAValue:
        """``any`` = ``amax(x != 0)`` over the dims, computed on 0 / 1 values in fp32."""
        from tilecc.ir import graph_nn as nn

        a = self._bind(node)
        t = self.truth(a["self"])
        shape = g.shape_of(t)
        dims = a.get("dim")
        if isinstance(dims, int):
            dims = [dims]
        dims = list(range(len(shape))) if dims is None or len(dims) == 0 else [int(d) for d in dims]
        rank = max(len(shape), 1)
        if any(shape[d % rank] == 0 for d in dims if shape):
            raise self.unsupported("any over an empty dimension")
        m = self.emit(nn.AmaxOp.make(self.imp.cast_to(t, DType.F32), dims, bool(a.get("keepdim"))))
        return self.imp.cast_to(m, DType.I32)

    def h_where(self, node: Node) -> SSAValue:
        a = self._bind(node)
        _, dt = self.out(node)
        c = self.truth(a["condition"])
        return self.emit(gi.WhereOp.make(c, self.operand(a["self"], dt), self.operand(a["other"], dt)))

    def h_clamp(self, node: Node) -> SSAValue:
        a = self._bind(node)
        _, dt = self.out(node)
        x = self.operand(a["self"], dt)
        if a.get("min") is not None:
            x = self.emit(g.MaximumOp.make(x, self.operand(a["min"], dt)))
        if a.get("max") is not None:
            x = self.emit(gi.MinimumOp.make(x, self.operand(a["max"], dt)))
        return x

    def h_log_softmax(self, node: Node) -> SSAValue:
        a = self._bind(node)
        if a.get("half_to_float"):
            raise self.unsupported("half_to_float=True")
        _, dt = self.out(node)
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        from tilecc.frontend.softmax_dims import over_any_dim

        return over_any_dim(self.emit, gi.LogSoftmaxOp.make, x, int(a["dim"]))

    def h_to_copy(self, node: Node) -> SSAValue:
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor) and meta.dtype == torch.bool:
            return self.truth(node.args[0])
        return self.imp.h_to_copy(node)

    def h_cumsum(self, node: Node) -> SSAValue:
        """``graph.cumsum`` along any dim (integers summed as f32: exact below 2**24)."""
        from tilecc.ir import graph_routing as gr

        a = self._bind(node)
        _, dt = self.out(node)
        x = self.imp.tensor(a["self"])
        if not g.shape_of(x):
            return self.imp.cast_to(x, dt)
        cdt = DType.F32 if dt == DType.I32 else dt  # the matrix engine takes floats
        y = self.emit(gr.CumsumOp.make(self.imp.cast_to(x, cdt), int(a["dim"])))
        return self.imp.cast_to(y, dt)

    # -- constants that were not folded (shapes from runtime tensors or symbolic sizes) --

    def h_full(self, node: Node) -> SSAValue:
        shape, dt = self.out(node)
        return self.full(shape, self.imp.value(node.args[1]), dt)

    def h_full_like(self, node: Node) -> SSAValue:
        shape, dt = self.out(node)
        return self.full(shape, self.imp.value(node.args[1]), dt)

    def h_fill_like(self, value: int):
        def handle(node: Node) -> SSAValue:
            shape, dt = self.out(node)
            return self.full(shape, value, dt)

        return handle

    def h_fill(self, value: int):
        return self.h_fill_like(value)

    def h_scalar_tensor(self, node: Node) -> SSAValue:
        _, dt = self.out(node)
        return self.const(self.imp.value(node.args[0]), dt)

    def h_arange(self, node: Node) -> SSAValue:
        shape, dt = self.out(node)
        args = [self.imp.value(x) for x in node.args]
        if not all(isinstance(v, int | float) for v in args):
            raise self.unsupported("non-scalar arange bounds")
        values = torch.arange(*args, dtype=torch.float64).numpy().astype(np.float32)
        if list(values.shape) != shape:
            raise self.unsupported(f"arange{tuple(args)} has {values.size} values, expected {shape}")
        return self.emit(g.ConstantOp.make(values, dt))

    # -- indexing ---------------------------------------------------------------------

    def h_embedding(self, node: Node) -> SSAValue:
        a = self._bind(node)
        _, dt = self.out(node)
        w = self.imp.cast_to(self.imp.tensor(a["weight"]), dt)
        idx = self.imp.tensor(a["indices"], "indices")
        if g.element_dtype(idx.type) != DType.I32:
            raise self.unsupported("indices must be an integer tensor")
        return self.emit(gi.GatherRowsOp.make(w, idx))

    def gather_dim(self, x: SSAValue, dim: int, idx: SSAValue, wrap: bool) -> SSAValue:
        """``x.index_select(dim, idx)`` generalised to an N-d index (the result has
        ``x.shape[:dim] + idx.shape + x.shape[dim+1:]``); `wrap`: negative indices count
        from the end (torch indexing)."""
        xs = list(g.shape_of(x))
        rank = len(xs)
        if rank == 0:
            raise self.unsupported("indexing a 0-d tensor")
        dim %= rank
        if g.element_dtype(idx.type) != DType.I32:
            raise self.unsupported("indices must be an integer tensor (bool masks select a data-dependent shape)")
        if wrap:  # idx + n * (idx < 0)
            neg = self.emit(gi.LtOp.make(idx, self.const(0, DType.I32)))
            shift = self.emit(g.MulOp.make(neg, self.const(xs[dim], DType.I32)))
            idx = self.emit(g.AddOp.make(idx, shift))
        if dim != 0:
            perm = [dim] + [d for d in range(rank) if d != dim]
            x = self.emit(g.PermuteOp.make(x, perm))
        y = self.emit(gi.GatherRowsOp.make(x, idx))
        if dim != 0:
            k = len(g.shape_of(idx))
            # y: idx dims, then x's dims without `dim` (those before it first)
            lead = list(range(k, k + dim))
            perm = lead + list(range(k)) + list(range(k + dim, len(g.shape_of(y))))
            y = self.emit(g.PermuteOp.make(y, perm))
        return y

    def h_index(self, node: Node) -> SSAValue:
        a = self._bind(node)
        _, dt = self.out(node)
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        indices = list(a["indices"])
        given = [i for i, v in enumerate(indices) if v is not None]
        if not given:
            return x
        if any(self.torch_dtype(indices[d]) == torch.bool for d in given):
            raise self.unsupported("boolean mask index (data-dependent shape)")
        if given != list(range(given[0], given[-1] + 1)):
            raise self.unsupported("index tensors on non-adjacent dims")
        idx = [self.imp.tensor(indices[d], "index") for d in given]
        if len(idx) == 1:
            return self.gather_dim(x, given[0], idx[0], wrap=True)
        return self.gather_block(x, given[0], idx)

    def gather_block(self, x: SSAValue, d0: int, idx: list[SSAValue]) -> SSAValue:
        """``x[..., i0, i1, ...]`` with index tensors on the adjacent dims d0..d0+k-1: the
        (broadcast) indices linearised, ``sum_j wrap(i_j) * stride_j`` (i32 arithmetic on
        the vector engine, exact below 2**24), gather the rows of x with those dims merged."""
        xs = list(g.shape_of(x))
        k = len(idx)
        block = xs[d0 : d0 + k]
        flat: SSAValue | None = None
        for j, i in enumerate(idx):
            if g.element_dtype(i.type) != DType.I32:
                raise self.unsupported("indices must be integer tensors")
            neg = self.emit(gi.LtOp.make(i, self.const(0, DType.I32)))
            shift = self.emit(g.MulOp.make(neg, self.const(block[j], DType.I32)))
            i = self.emit(g.AddOp.make(i, shift))
            stride = int(np.prod(block[j + 1 :], dtype=np.int64))
            if stride != 1:
                i = self.emit(g.MulOp.make(i, self.const(stride, DType.I32)))
            flat = i if flat is None else self.emit(g.AddOp.make(flat, i))
        if flat is None:
            raise self.unsupported("no index tensor")
        rank = len(xs)
        if d0:
            perm = list(range(d0, d0 + k)) + list(range(d0)) + list(range(d0 + k, rank))
            x = self.emit(g.PermuteOp.make(x, perm))
        rest = xs[:d0] + xs[d0 + k :]
        x = self.emit(g.ReshapeOp.make(x, [int(np.prod(block, dtype=np.int64)), *rest]))
        y = self.emit(gi.GatherRowsOp.make(x, flat))
        if d0:
            nb = len(g.shape_of(flat))
            perm = list(range(nb, nb + d0)) + list(range(nb)) + list(range(nb + d0, nb + len(rest)))
            y = self.emit(g.PermuteOp.make(y, perm))
        return y

    def h_gather(self, node: Node) -> SSAValue:
        """``torch.gather(x, dim, index)``: out[p] = x[p with dim replaced by index[p]],
        one element per row of a gather from x viewed as a column."""
        a = self._bind(node)
        shape, dt = self.out(node)
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        idx = self.imp.tensor(a["index"], "index")
        if not g.shape_of(x):  # a 0-d tensor is a 1-element vector (index 0 or -1)
            x = self.emit(g.ReshapeOp.make(x, [1]))
            idx = self.emit(g.ReshapeOp.make(idx, [1]))
        xs, ish = list(g.shape_of(x)), list(g.shape_of(idx))
        rank = len(xs)
        if rank == 0 or len(ish) != rank:
            raise self.unsupported("gather of a 0-d tensor or with an index of another rank")
        dim = int(a["dim"]) % rank
        strides = [int(np.prod(xs[j + 1 :], dtype=np.int64)) for j in range(rank)]
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
        if flat is None:  # rank > 0, checked above
            raise self.unsupported("gather of a 0-d tensor")
        if g.shape_of(flat) != tuple(ish):
            flat = self.emit(g.ExpandOp.make(flat, ish))
        col = self.emit(g.ReshapeOp.make(x, [int(np.prod(xs, dtype=np.int64)), 1]))
        y = self.emit(gi.GatherRowsOp.make(col, flat))
        return self.emit(g.ReshapeOp.make(y, shape))

    def h_index_select(self, node: Node) -> SSAValue:
        a = self._bind(node)
        _, dt = self.out(node)
        x = self.imp.cast_to(self.imp.tensor(a["self"]), dt)
        idx = self.imp.tensor(a["index"], "index")
        if len(g.shape_of(idx)) == 0:
            idx = self.emit(g.ReshapeOp.make(idx, [1]))
        if not g.shape_of(x):  # a 0-d tensor: a 1-element vector, the result 0-d again
            y = self.gather_dim(self.emit(g.ReshapeOp.make(x, [1])), 0, idx, wrap=False)
            return self.emit(g.ReshapeOp.make(y, list(self.out(node)[0])))
        return self.gather_dim(x, int(a["dim"]), idx, wrap=False)

    # -- slicing and joining ----------------------------------------------------------

    def slice_of(self, x: SSAValue, dim: int, start: Any, end: Any, step: int) -> SSAValue:
        xs = g.shape_of(x)
        dim %= len(xs)
        if step is None:
            step = 1
        if step < 1:
            raise self.unsupported(f"step {step}")
        lo, hi, _ = slice(start, end, step).indices(xs[dim])
        if lo == 0 and hi >= xs[dim] and step == 1:
            return x
        return self.emit(gi.SliceOp.make(x, dim, start, end, step))

    def h_slice(self, node: Node) -> SSAValue:
        a = self._bind(node)
        x = self.imp.tensor(a["self"])
        start, end = self.imp.value(a["start"]), self.imp.value(a["end"])
        return self.slice_of(x, int(a["dim"]), start, end, int(self.imp.value(a["step"]) or 1))

    def h_narrow(self, node: Node) -> SSAValue:
        a = self._bind(node)
        x = self.imp.tensor(a["self"])
        dim = int(a["dim"])
        start = int(self.imp.value(a["start"]))
        size = g.shape_of(x)[dim % len(g.shape_of(x))]
        if start < 0:
            start += size
        return self.slice_of(x, dim, start, start + int(self.imp.value(a["length"])), 1)

    def h_select(self, node: Node) -> SSAValue:
        a = self._bind(node)
        shape, _ = self.out(node)
        x = self.imp.tensor(a["self"])
        xs = g.shape_of(x)
        dim = int(a["dim"]) % len(xs)
        i = int(self.imp.value(a["index"]))
        if i < 0:
            i += xs[dim]
        y = self.slice_of(x, dim, i, i + 1, 1)
        return self.emit(g.ReshapeOp.make(y, shape))

    def h_cat(self, node: Node) -> SSAValue:
        a = self._bind(node)
        shape, dt = self.out(node)
        parts = []
        for t in a["tensors"]:
            v = self.imp.cast_to(self.imp.tensor(t), dt)
            s = g.shape_of(v)
            if s == (0,) and len(shape) != 1:  # legacy: empty 1-d tensors are skipped
                continue
            parts.append(v)
        dim = int(a["dim"]) % len(shape) if shape else 0
        parts = [p for p in parts if g.shape_of(p)[dim] > 0] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        return self.emit(gi.ConcatOp.make(parts, dim))

    def splits(self, x: SSAValue, sizes: list[int], dim: int) -> list[SSAValue]:
        out, start = [], 0
        for s in sizes:
            out.append(self.slice_of(x, dim, start, start + int(s), 1))
            start += int(s)
        return out

    def h_split_with_sizes(self, node: Node) -> list[SSAValue]:
        a = self._bind(node)
        x = self.imp.tensor(a["self"])
        sizes = [int(s) for s in self.imp.value(a["split_sizes"])]
        return self.splits(x, sizes, int(a["dim"]))

    def h_split(self, node: Node) -> list[SSAValue]:
        a = self._bind(node)
        x = self.imp.tensor(a["self"])
        dim = int(a["dim"]) % len(g.shape_of(x))
        n, step = g.shape_of(x)[dim], int(self.imp.value(a["split_size"]))
        sizes = [min(step, n - s) for s in range(0, n, step)] if step > 0 else [n]
        return self.splits(x, sizes, dim)

    def h_unbind(self, node: Node) -> list[SSAValue]:
        a = self._bind(node)
        x = self.imp.tensor(a["self"])
        xs = list(g.shape_of(x))
        dim = int(a["dim"]) % len(xs)
        rest = xs[:dim] + xs[dim + 1 :]
        return [self.emit(g.ReshapeOp.make(p, rest)) for p in self.splits(x, [1] * xs[dim], dim)]

    # -- attention --------------------------------------------------------------------

    def h_sdpa(self, node: Node) -> SSAValue:
        a = self._bind(node)
        shape, dt = self.out(node)
        if a.get("dropout_p"):
            raise self.unsupported(f"dropout_p={a['dropout_p']} (inference takes 0)")
        q = self.imp.cast_to(self.imp.tensor(a["query"]), dt)
        k = self.imp.cast_to(self.imp.tensor(a["key"]), dt)
        v = self.imp.cast_to(self.imp.tensor(a["value"]), dt)
        qs, ks = g.shape_of(q), g.shape_of(k)
        if len(qs) < 2:
            raise self.unsupported("query of rank < 2")
        if a.get("enable_gqa") and len(qs) >= 3 and qs[-3] != ks[-3]:
            k, v = (self.repeat_heads(t, qs[-3]) for t in (k, v))
        causal = bool(a.get("is_causal"))
        mask_arg = a.get("attn_mask")
        mask = None
        if mask_arg is not None:
            if causal:
                raise self.unsupported("attn_mask together with is_causal")
            mask = self.additive_mask(mask_arg, dt)
        scale = a.get("scale")
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(qs[-1])
        return self.emit(gi.SdpaOp.make(q, k, v, mask, scale=scale, causal=causal))

    def repeat_heads(self, t: SSAValue, heads: int) -> SSAValue:
        s = list(g.shape_of(t))
        kv = s[-3]
        if heads % kv:
            raise self.unsupported(f"{heads} query heads are not a multiple of {kv} key/value heads")
        grouped = s[:-2] + [1] + s[-2:]
        t = self.emit(g.ReshapeOp.make(t, grouped))
        wide = s[:-3] + [kv, heads // kv] + s[-2:]
        t = self.emit(g.ExpandOp.make(t, wide))
        return self.emit(g.ReshapeOp.make(t, s[:-3] + [heads] + s[-2:]))

    def additive_mask(self, m: Any, dt: DType) -> SSAValue:
        """A float mask as is; a bool mask as 0 (keep) / the most negative finite value
        of the dtype (drop; like transformers' masks, and equal to torch's -inf unless a
        row masks every key): folded when the mask is a compile-time constant, else
        ``where(mask, 0, min)``."""
        if self.torch_dtype(m) != torch.bool:
            return self.operand(m, dt)
        low = masked_value(dt)
        c = self.imp.const_values.get(m) if isinstance(m, Node) else None
        if isinstance(c, torch.Tensor):
            add = torch.zeros(c.shape, dtype=torch.float32).masked_fill(~c, low)
            return self.emit(g.ConstantOp.make(add.numpy(), dt))
        cond = self.imp.tensor(m, "attn_mask")
        return self.emit(gi.WhereOp.make(cond, self.const(0, dt), self.const(low, dt)))


def masked_value(dt: DType) -> float:
    """The additive mask value of a dropped key (`tilecc.ir.dtypes.masked_value`)."""
    from tilecc.ir.dtypes import masked_value as lowest

    return lowest(dt)
