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
from tilecc.frontend.dsl.lower.values import TileVar

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


class Loops:
    """`for` statements."""

    def for_(self: KernelLowering, s: A.For) -> None:
        it = s.iter
        if it.fn not in ("tiles", "range"):
            raise self.err(DslNameError, it.pos, f"unknown iterator '{it.fn}' (loops run over tiles(extent, size) "
                           "or range(n))")
        is_range = it.fn == "range"
        want = (1,) if is_range else (2, 3)
        if len(it.args) not in want:
            raise self.err(DslTypeError, it.pos, f"{it.fn}() takes {' or '.join(map(str, want))} arguments, "
                           f"got {len(it.args)}")
        lo = 0
        if len(it.args) == 3:  # tiles(start, stop, size)
            lo = self.static_int(it.args[0], "a loop start")
            it = A.Call(it.pos, it.fn, it.args[1:], it.kwargs)
        for kw in it.kwargs:
            if kw not in ("buffers", "unroll", "reverse"):
                raise self.err(DslNameError, it.pos, f"unknown argument '{kw}' of {it.fn}() (allowed: buffers, "
                               f"unroll, reverse)")
        extent = self.static_int(it.args[0], "a loop extent") - lo
        size = 1 if is_range else self.static_int(it.args[1], "a tile size")
        bufs = self.static_int(it.kwargs["buffers"], "a buffer count") if "buffers" in it.kwargs else 1
        if size < 1 or bufs < 1 or extent < 0:
            raise self.err(DslShapeError, it.pos, f"{it.fn}(): sizes must be positive, got extent {extent}, "
                           f"size {size}, buffers {bufs}")
        full, rem = divmod(extent, size)

        def body(start, n, index, slot):
            lv = TileVar(s.var, self.iadd(start, lo), n, size, extent + lo, index, s.pos, is_range)
            saved = self.slot
            self.slot = saved + ((id(s), slot),)
            self.loops.append(lv)
            with self.scope():
                self.scopes[-1][s.var] = lv.start if is_range else lv
                self.stmts(s.body)
            self.loops.pop()
            self.slot = saved
            self.loc = self.loc_of(s.pos)

        unroll = "unroll" in it.kwargs and bool(self.static_int(it.kwargs["unroll"], "unroll"))
        reverse = "reverse" in it.kwargs and bool(self.static_int(it.kwargs["reverse"], "reverse"))
        if id(s) in self.unrolled or unroll or reverse:
            # unrolled; `reverse` runs the tiles last to first (the heaviest first in a
            # causal triangle, as FlashAttention-2 orders its query blocks)
            self.unroll_depth += 1
            order = range(full + (rem > 0))
            for n, i in enumerate(reversed(order) if reverse else order):
                body(i * size, min(size, extent - i * size), i, n % bufs)
            self.unroll_depth -= 1
            return
        trip, left = divmod(full, bufs)
        if trip == 1:
            for u in range(bufs):
                body(u * size, size, u, u)
        elif trip > 1:
            with self.loop(trip) as iv:
                for u in range(bufs):
                    index = self.iadd(self.imul(iv, bufs), u)
                    body(self.imul(index, size), size, index, u)
        for u in range(left):
            i = trip * bufs + u
            body(i * size, size, i, u)
        if rem:
            body(full * size, rem, full, full % bufs)

    @contextmanager
    def loop(self: KernelLowering, trip: int) -> Iterator[SSAValue]:
        blk = Block(arg_types=[IndexType()])
        outer = self.block
        self.add(scf.ForOp(self.idx(0), self.idx(trip), self.idx(1), [], blk))
        self.block = blk
        try:
            yield blk.args[0]
        finally:
            blk.add_op(scf.YieldOp())
            self.block = outer
