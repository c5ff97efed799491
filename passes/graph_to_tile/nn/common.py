"""Small helpers of the CNN family's kernels: index arithmetic, on-chip windows, tile
loops, shared HBM constants and a kernel whose HBM arguments are known up front.

    k = HbmKernel(lw, "conv2d", loc, [src, weights, out])     # k0_conv2d(src, weights, out)
    with tiles(k.kb, C, TC) as (_, c0, c):                    # channel tiles, the last partial
        slab = sub(k.kb, buf, 0, lin(k.kb, off, (Wq, oh)), [TC, L])   # buf[:, off + Wq*oh :]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import numpy as np
from xdsl.dialects.builtin import AnyFloat, DenseIntOrFPElementsAttr, IntegerType, TensorType
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def value_shape(v: SSAValue | Attribute) -> tuple[int, ...]:
    """The shape of a tensor / memref value or type (`shapes.shape_of` on its type)."""
    return shape_of(v.type if isinstance(v, SSAValue) else v)


def value_elem(v: SSAValue | Attribute) -> Attribute:
    """The element type of a tensor / memref value or type (`shapes.elem_of` on its type)."""
    return elem_of(v.type if isinstance(v, SSAValue) else v)


def present(v: SSAValue | None, what: str) -> SSAValue:
    """`v`, which the kernel's plan guarantees exists (a step's operand, a buffer of a
    column / tile step, a padded epilogue's mask); CompileError if it does not."""
    if v is None:
        raise CompileError(f"internal: {what} missing")
    return v


def _float_tensor(elem: Attribute, shape: list[int]) -> TensorType[AnyFloat]:
    """The tensor type of an HBM constant; cast: the constants are float (masks,
    selections, fill values) and from_list packs by `elem` at run time either way."""
    return cast(TensorType[AnyFloat], TensorType(elem, shape))


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


ALIGN = 64


def partition_bytes(cols: int, isz: int) -> int:
    """Bytes per partition of a buffer, with plan-sram's alignment."""
    return cdiv(cols * isz, ALIGN) * ALIGN


def sram_budget(lw: LoweringContext) -> int:
    """Bytes of one SRAM partition."""
    return lw.cfg.sram.bytes_per_partition


def lin(kb: KernelBuilder, c: int, *terms: tuple[int, SSAValue]) -> SSAValue:
    """The index ``c + sum(k * v)`` (k constant)."""
    acc: SSAValue | None = None
    for k, v in terms:
        if k == 0:
            continue
        t = v if k == 1 else kb.muli(v, kb.const(k))
        acc = t if acc is None else kb.addi(acc, t)
    if acc is None:
        return kb.const(c)
    return acc if c == 0 else kb.addi(acc, kb.const(c))


def as_index(kb: KernelBuilder, v: int | SSAValue) -> SSAValue:
    """`v` as an index value (a constant for an int)."""
    return kb.const(v) if isinstance(v, int) else v


def sub(kb: KernelBuilder, buf: SSAValue, row: int | SSAValue, col: int | SSAValue, shape: Sequence[int]) -> SSAValue:
    """A window of an on-chip buffer (`tile.subview`); its static shape is clipped to the
    buffer (and to a constant offset), the sizes of the ops using it are the real extents."""
    src = value_shape(buf)
    offs = [row if isinstance(row, int) else None, col if isinstance(col, int) else None]
    shape = [max(1, min(s, lim - (o or 0))) for s, lim, o in zip(shape, src, offs)]
    if shape == list(src) and row == 0 and col == 0:
        return buf
    return kb.add(tile.SubviewOp(buf, as_index(kb, row), as_index(kb, col), shape)).results[0]


def true_i1(kb: KernelBuilder) -> SSAValue:
    """The i1 constant true (one per kernel, at its entry)."""
    return kb.bool_const(True)


@contextmanager
def tiles(kb: KernelBuilder, extent: int, size: int) -> Iterator[tuple[SSAValue, SSAValue, SSAValue]]:
    """Loop over `extent` in tiles of `size`: yields (tile index, start, size of this tile)."""
    trip = cdiv(extent, size)
    with kb.loop(trip) as i:
        start = kb.muli(i, kb.const(size)) if trip > 1 else kb.const(0)
        if extent % size == 0 or trip == 1:
            n = kb.const(min(size, extent))
        else:
            n = kb.mini(kb.const(size), kb.subi(kb.const(extent), start))
        yield i, start, n


def const_hbm(lw: LoweringContext, data: np.ndarray | float, elem: Attribute) -> SSAValue:
    """An HBM constant of `data`, one per distinct value (kernels share identity,
    selection and mask matrices of the same shape)."""
    arr = np.asarray(data, dtype=np.float32)
    cache = lw.nn.consts
    key = (arr.tobytes(), str(elem), arr.shape)
    if key in cache:
        return cache[key]
    shape = list(arr.shape) or [1]
    attr = DenseIntOrFPElementsAttr.from_list(_float_tensor(elem, shape), arr.reshape(-1).tolist())
    v = lw.hbm(shape, elem, value=attr)
    cache[key] = v
    return v


def fill_row(lw: LoweringContext, value: float, elem: Attribute, length: int) -> SSAValue:
    """An HBM constant row of at least `length` copies of `value` (shared by kernels)."""
    cache = lw.nn.fill_rows
    key = (np.float32(value).tobytes(), str(elem))
    have = cache.get(key)
    if have is None or value_shape(have)[0] < length:
        n = max(length, 64)
        data = np.full((n,), value, dtype=np.float32)
        vals = data.astype(np.int64).tolist() if isinstance(elem, IntegerType) else data.tolist()  # i32 pads
        attr = DenseIntOrFPElementsAttr.from_list(_float_tensor(elem, [n]), vals)
        cache[key] = lw.hbm([n], elem, value=attr)
    return cache[key]


def fill(kb: KernelBuilder, buf: SSAValue, rows: SSAValue, cols: int, row_arg: SSAValue) -> None:
    """``buf[:rows, :cols] = value``: one row-broadcast DMA of the constant row `row_arg`
    (a `fill_row` kernel argument)."""
    kb.add(tile.LoadOp(row_arg, [kb.const(0)], sub(kb, buf, 0, 0, [value_shape(buf)[0], cols]), rows,
                       kb.const(cols), -1, 0))


class HbmKernel:
    """A kernel under construction whose HBM arguments are collected up front."""

    def __init__(self, lw: LoweringContext, what: str, loc: str, args: Sequence[SSAValue]) -> None:
        self.lw = lw
        self.hbm_args = list(args)
        self.kb = KernelBuilder(lw.kernel_name(what), [a.type for a in args], loc)

    def arg(self, v: SSAValue) -> SSAValue:
        return self.kb.args[self.hbm_args.index(v)]

    def launch(self) -> None:
        self.lw.launch(self.kb, self.hbm_args)


def false_i1(kb: KernelBuilder) -> SSAValue:
    """An i1 false (`0 != 0`: overwrite, not accumulate)."""
    return kb.ne_zero(kb.const(0))


def consts_2d(
    lw: LoweringContext, blocks: list[np.ndarray], width: int, height: int, elem: Attribute,
) -> tuple[SSAValue, int]:
    """One HBM constant [height, len(blocks) * width] holding the blocks side by side
    (each zero-padded to height x width); returns it and its column count."""
    data = np.zeros((height, max(1, len(blocks)) * width), dtype=np.float32)
    for i, blk in enumerate(blocks):
        data[: blk.shape[0], i * width: i * width + blk.shape[1]] = blk
    return const_hbm(lw, data, elem), data.shape[1]


def band_loop(kb: KernelBuilder, OH: int, RB: int, body: Callable[[SSAValue, int], None]) -> None:
    """`body(oh0, RB)` for the OH / RB bands of RB output rows."""
    assert OH % RB == 0
    with kb.loop(OH // RB) as bi:
        body(lin(kb, 0, (RB, bi)), RB)

