"""Tiles in and out of HBM and windows of on-chip tiles: slices stay lazy (`Lazy`) until
their use picks the layout, loads of read-only tensors at static indices are shared
within an unrolled body, and ``x[:, a:b]`` is a subview.

    a = load(x[m, :])            ->  (nothing yet)
    y = a + 1.0                  ->  tile.load %x[%m0, %c0] into %a sizes(...) {row_dim = 0, col_dim = 1}
                                     tile.scalar "add" %a, 1.0 into %y ...
    w = acc[:, 0:64]             ->  %w = tile.subview %acc[%c0, %c0] [128, 64]
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from xdsl.ir import SSAValue

from tilecc.errors import DslShapeError, DslTypeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import constants, expressions, matmul
from tilecc.frontend.dsl.lower.values import FLOATS, Const, Lazy, Product, TileVar, Value
from tilecc.ir import tile

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


def tile_window(lw: KernelLowering, name: str, indices: list[A.Expr], pos: A.Pos) -> Value:
    """``x[:, a:b]``: columns [a, b) of the on-chip tile x (a, b known when the kernel
    is compiled), a view of x's buffer."""
    v = lw.lookup(name, pos)
    if not isinstance(v, Value):
        raise lw.err(DslTypeError, pos, f"'{name}' cannot be indexed (only HBM tensors and on-chip tiles can)")
    if len(indices) != 2 or not isinstance(indices[0], A.FullSlice):
        raise lw.err(DslShapeError, pos, f"an on-chip tile is windowed by columns: {name}[:, a:b] "
                     f"(the rows stay whole)")
    ix = indices[1]
    if isinstance(ix, A.FullSlice):
        return v
    if not isinstance(ix, A.RangeSlice):
        raise lw.err(DslShapeError, ix.pos, f"a window of {name} is a column range a:b, not a single column")
    lo = expressions.static_int(lw, ix.lo, "a window bound")
    hi = expressions.static_int(lw, ix.hi, "a window bound")
    limit = v.shape[1]
    if not 0 <= lo < hi <= limit:
        raise lw.err(DslShapeError, ix.pos, f"window {lo}:{hi} is outside the columns 0:{limit} of "
                     f"{name} {v.describe()} (line {v.pos.line})")
    return window(lw, v, lo, hi - lo, hi - lo)


def slice(lw: KernelLowering, name: str, indices: list[A.Expr], pos: A.Pos) -> Lazy:
    tensor, p = lw.tensors[name]
    shape = lw.dims(p)
    if len(indices) != len(shape):
        raise lw.err(DslShapeError, pos, f"'{name}' has {len(shape)} dimension(s), indexed with {len(indices)}")
    starts: list[SSAValue | int] = []
    kept, sizes, tiles = [], [], []
    for d, (ix, n) in enumerate(zip(indices, shape)):
        if isinstance(ix, A.FullSlice):
            starts.append(0)
            kept.append(d)
            sizes.append(n)
            tiles.append(n)
            continue
        if isinstance(ix, A.RangeSlice):
            raise lw.err(DslShapeError, ix.pos, f"HBM tensors are sliced by tiles: index '{name}' with a "
                         f"tiles() loop variable, ':' or a scalar index")
        v = expressions.ev(lw, ix)
        if isinstance(v, TileVar):
            if v.extent > n:
                raise lw.err(DslShapeError, ix.pos, f"shape mismatch: '{v.name}' runs over {v.extent} elements "
                             f"but dimension {d} of '{name}' has {n}")
            starts.append(v.start)
            kept.append(d)
            sizes.append(v.size)
            tiles.append(v.tile)
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, int):
            if not 0 <= v < n:
                raise lw.err(DslShapeError, ix.pos, f"index {v} out of range for dimension {d} of '{name}' (size {n})")
        elif not isinstance(v, SSAValue):
            raise lw.err(DslTypeError, ix.pos, f"an index of '{name}' must be a loop tile, an index or ':'")
        starts.append(v)
    if len(kept) > 2:
        raise lw.err(DslShapeError, pos, f"a tile has at most 2 dimensions; {name}[...] keeps {len(kept)} "
                     "(index the others with a number or a loop index)")
    return Lazy(name, tensor, p.type.dtype, starts, kept, sizes, tiles, pos)


def load_into(lw: KernelLowering, lz: Lazy, buf: SSAValue, layout: str, sizes: tuple[int, int],
              bcast_rows: int | None = None) -> None:
    idx = [lw.idx(i) for i in lz.indices]
    kept = lz.kept
    if len(kept) == 2:
        rd, cd = (kept[0], kept[1]) if layout == "normal" else (kept[1], kept[0])
    elif len(kept) == 1:
        rd, cd = (-1 if bcast_rows is not None else kept[0]), kept[0]
    else:
        rd, cd = (-1 if bcast_rows is not None else len(idx) - 1), len(idx) - 1
    lw.add(tile.LoadOp(lz.tensor, idx, buf, lw.idx(sizes[0]), lw.idx(sizes[1]), rd, cd))


def cse_key(lw: KernelLowering, v: Lazy, layout: str, bcast: Value | None) -> tuple | None:
    """Loads of tensors the kernel never writes are loaded once per execution of the
    innermost scf.for body (unrolled loops reading the same tile share it; indices
    are static or values fixed in that body, such as a head loop's index)."""
    # an index may be a run-time value (a `range` loop's index): it is the same
    # throughout one execution of the block the key names
    if not lw.cse or not lw.unroll_depth or v.param in lw.outputs:
        return None
    if v.tensor not in {a for a, _ in lw.tensors.values()}:
        return None
    # valid within the innermost scf.for body (a loop body reloads on every iteration)
    return (id(lw.block), v.param, tuple(v.indices), tuple(v.kept), tuple(v.sizes), tuple(v.tiles),
            layout, v.cast_to, None if bcast is None else bcast.rows)


def cse_node(lw: KernelLowering, key: tuple, pos: A.Pos) -> A.Node:
    if key not in lw.cse_node_of:
        lw.cse_node_of[key] = A.Node(pos)
    return lw.cse_node_of[key]


def materialise(lw: KernelLowering, v: object, node: A.Node, bcast: Value | None = None, layout: str = "normal",
                cse: bool = True) -> Value:
    if isinstance(v, Value):
        return v
    if isinstance(v, Product):
        buf = lw.buffer(node, v.shape, "f32", tile.ACC, "prod")
        out = Value(buf, "f32", tile.ACC, v.shape, v.m, v.n, node.pos)
        matmul.emit_matmul(lw, v, out, accumulate=False)
        return out
    key = cse_key(lw, v, layout, bcast) if isinstance(v, Lazy) and cse else None
    if isinstance(v, Lazy) and key is not None:
        if key not in lw.cse_values:
            saved, lw.slot = lw.slot, ()
            shared = dataclasses.replace(v, node=cse_node(lw, key, v.pos))
            lw.cse_values[key] = materialise(lw, shared, node, bcast, layout, cse=False)
            lw.slot = saved
        return lw.cse_values[key]
    if isinstance(v, Lazy):
        if v.dtype not in FLOATS:
            raise lw.err(DslTypeError, v.pos, f"tiles of {v.dtype} tensors are not supported")
        if bcast is not None:
            shape, sizes = (bcast.shape[0], v.shape[1]), (bcast.rows, v.actual[1])
            buf = lw.buffer(node, shape, v.dtype, tile.SRAM, v.param)
            load_into(lw, v, buf, "normal", sizes, bcast_rows=bcast.rows)
            out = Value(buf, v.dtype, tile.SRAM, shape, sizes[0], sizes[1], v.pos)
            return out if v.cast_to is None else expressions.cast(lw, out, v.cast_to, v.node or node)
        shape, sizes = v.shape, v.actual
        if layout == "transposed":
            shape, sizes = (shape[1], shape[0]), (sizes[1], sizes[0])
        buf = lw.buffer(v.node or node, shape, v.dtype, tile.SRAM, v.param + ("T" if layout == "transposed" else ""))
        load_into(lw, v, buf, layout, sizes)
        out = Value(buf, v.dtype, tile.SRAM, shape, sizes[0], sizes[1], v.pos)
        return out if v.cast_to is None else expressions.cast(lw, out, v.cast_to, v.node or node)
    if isinstance(v, Const):
        return constants.const_value(lw, v, bcast, node)
    if isinstance(v, TileVar):
        raise lw.err(DslTypeError, node.pos, f"'{v.name}' is a loop tile, not a tile of data")
    raise lw.err(DslTypeError, node.pos, "expected a tile, got a number or an index")


def tile_type(lw: KernelLowering, e: A.Expr, fn: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
    """(dtype, static shape, actual sizes): a size ``m.size`` is m's tile size, with
    the partial size of this copy as the actual one."""
    if not isinstance(e, A.TypeExpr):
        raise lw.err(DslTypeError, e.pos, f"{fn}() takes a tile type first, e.g. {fn}(f32[128, 512])")
    dims, actual = [], []
    for d in e.dims:
        lv = expressions.ev(lw, d.value) if isinstance(d, A.Attr) and d.attr == "size" else None
        if isinstance(lv, TileVar):
            dims.append(lv.tile)
            actual.append(lv.size)
            continue
        dims.append(expressions.static_int(lw, d, "a tile size"))
        actual.append(dims[-1])
    if len(dims) not in (1, 2):
        raise lw.err(DslShapeError, e.pos, f"a tile has 1 or 2 dimensions, got {len(dims)}")
    if e.dtype not in FLOATS:
        raise lw.err(DslTypeError, e.pos, f"tiles of {e.dtype} are not supported")
    return (e.dtype, (dims[0], dims[1] if len(dims) == 2 else 1),
            (actual[0], actual[1] if len(actual) == 2 else 1))


def window(lw: KernelLowering, v: Value, c0: int, width: int, actual: int) -> Value:
    """Columns [c0, c0 + width) of an on-chip tile (a tile.subview)."""
    sub = lw.add(tile.SubviewOp(v.buf, lw.idx(0), lw.idx(c0), [v.shape[0], width])).results[0]
    return Value(sub, v.dtype, v.space, (v.shape[0], width), v.rows, actual, v.pos)


def sub_lazy(lw: KernelLowering, lz: Lazy, r0: int, static: int, actual: int, i: int) -> Lazy:
    """Rows [r0, r0 + static) of a lazily loaded 2-D slice."""
    idx = list(lz.indices)
    idx[lz.kept[0]] = lw.iadd(idx[lz.kept[0]], r0)
    return dataclasses.replace(lz, indices=idx, sizes=[actual, lz.sizes[1]], tiles=[static, lz.tiles[1]],
                               param=f"{lz.param}_{i}")
