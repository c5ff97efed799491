"""The decode-attention lowering: a decode-shaped `graph.sdpa` as one decode kernel.

Tried by `entry.lower_attention_kernel` before the flash kernel's search. Before::

    %o = graph.sdpa %q, %k, %v, %mask scale 0.125 causal false
        : tensor<32x8x4x64xbf16>, tensor<32x8x130x64xbf16>, tensor<32x8x130x64xbf16>,
          tensor<32x1x1x130xbf16> -> tensor<32x8x4x64xbf16>

After (views of the operands as rows; the identity and the mask-row selection are constants)::

    %qr = tile.view %q : memref<1024x64xbf16>          %kr = tile.view %k : memref<6656x320xbf16>
    %vr = tile.view %v : memref<6656x320xbf16>         %mr = tile.view %mask : memref<32x130xbf16>
    func.call @k0_decode_attention(%qr, %kr, %vr, %mr, %or, %ident, %sel)

Where the sdpa is decode-shaped (a few query rows per head) but the kernel does not
apply, a ``missed`` remark says why and the flash kernel lowers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.dialects.builtin import Float32Type
from xdsl.ir import Operation

from tilecc.ir import graph_index as gi
from tilecc.ir.dtypes import element_size, masked_value
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.attention.decode_cost import rank
from tilecc.passes.graph_to_tile.attention.decode_kernel import DecodeAttentionKernel
from tilecc.passes.graph_to_tile.attention.decode_plan import decode_problem
from tilecc.passes.graph_to_tile.shapes import elem_of, reshape_strides, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext
    from tilecc.simulator.isa import DType

PASS = "lower-graph-to-tile"
DECODE_ROWS = 16  # query rows per head up to which an sdpa counts as decode-shaped
REPLAYED = 3  # the cost model's best schedules built dry and compared by their list schedules


def lower_decode_attention(lw: LoweringContext, op: Operation, mask_shape: tuple[int, ...] | None,
                           dt: DType, loc: str) -> bool:
    """`op` as one decode-attention kernel; False (nothing emitted) where it does not apply."""
    assert isinstance(op, gi.SdpaOp)
    res = op.results[0]
    elem = elem_of(res.type)
    q_s, k_s, v_s, o_s = (shape_of(x.type) for x in (op.q, op.k, op.v, res))
    if q_s[-2] > DECODE_ROWS:
        return False
    cfg = lw.cfg
    parts = min(cfg.sram.partitions, cfg.matrix.rows, cfg.matrix.cols, cfg.accumulator.partitions)
    prob, why = decode_problem(q_s, k_s, v_s, o_s, mask_shape, bool(op.is_causal), element_size(elem),
                               isinstance(elem, Float32Type), parts)
    ranked = rank(prob, lw.cfg) if prob is not None else []
    choice = None
    if prob is not None and ranked:
        dt_low = masked_value(dt)
        scale = float(op.scale.value.data)
        tries = [(DecodeAttentionKernel(lw, prob, sc, elem, scale, dt_low, loc, None).build(), i)
                 for i, (sc, _) in enumerate(ranked[:REPLAYED])]
        _, best = min(tries)
        choice = (*ranked[best], len(ranked))
    if prob is not None and choice is None:
        why = "no grouping of the problems fits SRAM and the accumulator (a long cache)"
    if prob is not None and choice is not None and res in lw.layout_requests:
        _, strides = lw.layout_requests[res]
        if reshape_strides(o_s, strides, [prob.P * prob.L, prob.Dv]) is None:
            why, choice = f"the output is written through a layout {list(strides)} that is not rows", None
    if prob is None or choice is None:
        remarks.emit(PASS, "missed", f"decode-shaped attention {list(q_s)} x {list(k_s)} uses the flash kernel: "
                     f"{why}", loc)
        return False
    s, cost, tried = choice
    P, L, S, R = prob.P, prob.L, prob.S, s.R(prob)
    q, k, v = (lw.materialise(x) for x in (op.q, op.k, op.v))
    views = [lw.view(q, [P * L, prob.D]), lw.view(k, [P * R, s.f * prob.D]), lw.view(v, [P * R, s.f * prob.Dv])]
    mask = None
    if op.mask is not None:
        mask = lw.view(lw.materialise(op.mask), [prob.mask_count, S])
    out = lw.output_buffer(res, elem)
    out_rows = lw.view(out, [P * L, prob.Dv])
    kernel = DecodeAttentionKernel(lw, prob, s, elem, float(op.scale.value.data), masked_value(dt), loc,
                                   (views[0], views[1], views[2], mask, out_rows))
    est = kernel.build()
    remarks.emit(PASS, "passed", lambda: (
        f"decode attention {list(q_s)} x {list(k_s)}: {P} problems of {L} rows in groups of {s.n}, {s.f} positions "
        f"per row ({s.m} problems per K / V transfer"
        + (f"; the cache in {len(s.chunks(prob))} blocks of {s.f * s.rc} positions, online softmax" if s.online else "")
        + ("; the mask rows by DMA transposes, one per row" if s.mask_t else "")
        + f"), estimated {cost.total:,.0f} cycles "
        f"(engines per group: DMA {cost.dma:,.0f}, matrix {cost.matrix:,.0f}, vector {cost.vector:,.0f}; "
        f"schedule {est:,.0f}; the fastest list schedule of the model's best {min(REPLAYED, tried)} of {tried} "
        f"schedules)"), loc)
    lw.values[res] = out
    return True

