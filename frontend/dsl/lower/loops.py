"""Loops: ``for m in tiles(extent, size, buffers=b)`` and ``for i in range(n)``.

    for m in tiles(40, 16):        ->  scf.for %i = %c0 to %c2 step %c1 { body(m.start = %i * 16, size 16) }
        body                           body(m.start = 32, size 8)        // the peeled edge tile

``buffers=b`` unrolls b copies of the body in each iteration, each with buffers of its
own; ``unroll=True``, ``reverse=True`` and loops that bound an inner loop unroll fully.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from xdsl.dialects import scf
from xdsl.dialects.builtin import IndexType
from xdsl.ir import Block, SSAValue

from tilecc.errors import DslNameError, DslShapeError, DslTypeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import expressions, statements
from tilecc.frontend.dsl.lower.values import TileVar

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


def for_(lw: KernelLowering, s: A.For) -> None:
    it = s.iter
    if it.fn not in ("tiles", "range"):
        raise lw.err(DslNameError, it.pos, f"unknown iterator '{it.fn}' (loops run over tiles(extent, size) "
                     "or range(n))")
    is_range = it.fn == "range"
    want = (1,) if is_range else (2, 3)
    if len(it.args) not in want:
        raise lw.err(DslTypeError, it.pos, f"{it.fn}() takes {' or '.join(map(str, want))} arguments, "
                     f"got {len(it.args)}")
    lo = 0
    if len(it.args) == 3:  # tiles(start, stop, size)
        lo = expressions.static_int(lw, it.args[0], "a loop start")
        it = A.Call(it.pos, it.fn, it.args[1:], it.kwargs)
    for kw in it.kwargs:
        if kw not in ("buffers", "unroll", "reverse"):
            raise lw.err(DslNameError, it.pos, f"unknown argument '{kw}' of {it.fn}() (allowed: buffers, "
                         f"unroll, reverse)")
    extent = expressions.static_int(lw, it.args[0], "a loop extent") - lo
    size = 1 if is_range else expressions.static_int(lw, it.args[1], "a tile size")
    bufs = expressions.static_int(lw, it.kwargs["buffers"], "a buffer count") if "buffers" in it.kwargs else 1
    if size < 1 or bufs < 1 or extent < 0:
        raise lw.err(DslShapeError, it.pos, f"{it.fn}(): sizes must be positive, got extent {extent}, "
                     f"size {size}, buffers {bufs}")
    full, rem = divmod(extent, size)

    def body(start: SSAValue | int, n: int, index: SSAValue | int, slot: int) -> None:
        lv = TileVar(s.var, lw.iadd(start, lo), n, size, extent + lo, index, s.pos, is_range)
        saved = lw.slot
        lw.slot = saved + ((id(s), slot),)
        lw.loops.append(lv)
        with lw.scope():
            lw.scopes[-1][s.var] = lv.start if is_range else lv
            statements.stmts(lw, s.body)
        lw.loops.pop()
        lw.slot = saved
        lw.loc = lw.loc_of(s.pos)

    unroll = "unroll" in it.kwargs and bool(expressions.static_int(lw, it.kwargs["unroll"], "unroll"))
    reverse = "reverse" in it.kwargs and bool(expressions.static_int(lw, it.kwargs["reverse"], "reverse"))
    if id(s) in lw.unrolled or unroll or reverse:
        # unrolled; `reverse` runs the tiles last to first (the heaviest first in a
        # causal triangle, as FlashAttention-2 orders its query blocks)
        lw.unroll_depth += 1
        order = range(full + (rem > 0))
        for n, i in enumerate(reversed(order) if reverse else order):
            body(i * size, min(size, extent - i * size), i, n % bufs)
        lw.unroll_depth -= 1
        return
    trip, left = divmod(full, bufs)
    if trip == 1:
        for u in range(bufs):
            body(u * size, size, u, u)
    elif trip > 1:
        with loop(lw, trip) as iv:
            for u in range(bufs):
                index = lw.iadd(lw.imul(iv, bufs), u)
                body(lw.imul(index, size), size, index, u)
    for u in range(left):
        i = trip * bufs + u
        body(i * size, size, i, u)
    if rem:
        body(full * size, rem, full, full % bufs)


@contextmanager
def loop(lw: KernelLowering, trip: int) -> Iterator[SSAValue]:
    blk = Block(arg_types=[IndexType()])
    outer = lw.block
    lw.add(scf.ForOp(lw.idx(0), lw.idx(trip), lw.idx(1), [], blk))
    lw.block = blk
    try:
        with lw.tally.repeated(trip):
            yield blk.args[0]
    finally:
        blk.add_op(scf.YieldOp())
        lw.block = outer
