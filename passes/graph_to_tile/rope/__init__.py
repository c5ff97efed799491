"""`graph.rope` -> one rotary-embedding kernel (problem -> schedule -> cost model -> emitter).

    %q = graph.rope %x, %cos, %sin : tensor<1x32x2048x64xbf16>, tensor<1x1x2048x64xbf16>, ...
      -> %y = tile.hbm_alloc : memref<1x2048x2048xbf16>          (out [B, S, H*D])
         func.call @k7_rope(%x_rows, %cos4, %sin4, %y)
         %q = tile.view %y : memref<1x32x2048x64xbf16, strided<[4194304, 64, 2048, 1]>>

x arrives as the transposed view of a projection (``[B, H, S, D]`` over ``[B, S, H*D]``
rows); the kernel reads those rows (`problem.py`: heads adjacent), applies cos and sin
loaded once per tile of positions to every head (`kernel.py`) and writes the same
``[B, S, H*D]`` layout, so the result is again a free transposed view, which the
attention and the KV-cache scatter read as they read the projection's view. `schedule.py`
picks the tile, head chunk and buffering by its cost model. A rope of the q / k columns
of a fused projection's product is applied in that kernel's evacuations instead
(`epilogue.py`); its result is then bound before this lowering runs. x with other strides (heads
not adjacent) loads each head separately; cos / sin varying over heads load per head.
A batched decode step (S = 1, B > 1) is seen as one batch of B positions: the sequences
are the rows of one tile (x's rows at its batch stride, each sequence's cos / sin row),
so the 1B Llama's q at batch 32 is one [32 x 2048] DMA instead of 32 tiles of four DMAs
each (the rope kernels of a decode layer: 312 k -> 46 k cycles on the step's chain).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir.graph_rope import RopeOp
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.rope.kernel import RopeKernel
from tilecc.passes.graph_to_tile.rope.problem import RopeProblem, x_strides_adjacent
from tilecc.passes.graph_to_tile.rope.schedule import choose
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


def lower_rope(lw: LoweringContext, op: Operation, loc: str) -> None:
    assert isinstance(op, RopeOp)
    x = lw.materialise(op.x)
    shape = list(shape_of(x.type))
    if not 2 <= len(shape) <= 4:  # passes/graph/rope.py rewrites only these ranks
        raise CompileError(f"graph.rope at {loc}: x of rank {len(shape)}; the kernel takes ranks 2 to 4")
    pad = 4 - len(shape)
    B, H, S, D = [1] * pad + shape
    shape4 = [B, H, S, D]
    strides, off = lw.layout(x)
    strides4 = [0] * pad + list(strides)
    elem = elem_of(x.type)
    # a decode step of several sequences (one position each): the sequences are the
    # positions of one tile, x's rows at its batch stride (one DMA of every row instead
    # of a tile, four DMAs, per sequence); the result's view keeps the original dims
    S0 = S
    fold = S == 1 and B > 1
    if fold:
        shape4, strides4 = [1, H, B, D], [0, strides4[1], strides4[0], strides4[3]]
        B, S = 1, B
    tables, imaps = [], []
    for v in (op.cos, op.sin):
        o = lw.aligned(v, tuple(shape))
        t_strides, t_off = lw.layout(o.value)
        full = [0] * pad + [0 if m is None else st for m, st in zip(o.imap, t_strides)]
        imap = [None] * pad + list(o.imap)
        if fold:
            full, imap = [0, full[1], full[0], full[3]], [None, imap[1], imap[0], imap[3]]
        tables.append(lw.strided(o.value, shape4, full, t_off))
        imaps.append(imap)
    p = RopeProblem(
        B, H, S, D, elem,
        heads_adjacent=x_strides_adjacent(strides4, H, D),
        shared_table=H == 1 or all(m[1] is None for m in imaps),
        table_rows=any(m[2] is not None for m in imaps),
    )
    sch = choose(lw.cfg, p)
    if sch is None:
        raise TensorTooLargeError(f"graph.rope at {loc}: a head of D = {D} elements does not fit one SRAM "
                                  f"partition ({lw.cfg.sram.bytes_per_partition} bytes) with its buffers")
    out = lw.hbm([B, S, H * D], elem)
    if sch.mode == "heads":  # one position per tile, heads on the rows
        x_arg, out_arg = lw.strided(x, shape4, strides4, off), lw.view(out, [B, S, H, D])
    else:
        x_arg = lw.strided(x, [B, S, H * D], [strides4[0], strides4[2], 1], off) if p.heads_adjacent \
            else lw.strided(x, shape4, strides4, off)
        out_arg = out
    kb = KernelBuilder(lw.kernel_name("rope"), [x_arg.type, tables[0].type, tables[1].type, out_arg.type], loc)
    RopeKernel(p, sch, lw.cfg.dma.queues).build(kb)
    remarks.emit("lower-graph-to-tile", "passed", lambda: (
        f"kernel {kb.func.sym_name.data}: rope over [B {B}, S {S}, H {H} x D {D}], "
        + (f"tiles of one position x {sch.hc} heads on the rows" if sch.mode == "heads" else
           f"tiles {sch.TS} positions x {sch.hc} heads ({'one DMA' if p.heads_adjacent else 'a DMA per head'})")
        + f", cos/sin {'once per tile for every head' if p.shared_table else 'per head'}"
        + (f", x * cos over {sch.rep} heads a vector instruction" if sch.rep else
           ", four vector instructions a head" if sch.mode != "heads" else "")
        + f", x{sch.nb} buffered, "
        f"estimated {sch.estimate:,.0f} cycles"), loc)
    lw.launch(kb, [x_arg, *tables, out_arg])
    # the result: the transposed view [B, H, S, D] of the rows written (at x's rank)
    out_strides = [S0 * H * D, D, H * D, 1]
    lw.values[op.result] = lw.strided(out, shape, out_strides[pad:], 0)


LOWERINGS = {RopeOp: lower_rope}
