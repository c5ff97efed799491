"""A decode step's RMS norm and the one-row matmul it feeds, as one kernel.

At batch 1 the norm before each projection (`graph.fused "matmul"` of rms_norm, matmul:
the fused-matmul kernel takes no prologue for a one-row matmul) would be its own kernel
(rms_norm_split.py: the row spread over the 128 partitions, 16 elements each for
d = 2,048) whose result the matmul loads back. That layout is exactly the one the
direct matmul (passes/graph_to_tile/matmul.py, `direct_a`) loads its row into, so the
norm is computed in place of that load: the norm kernel's store, the matmul's load and
one kernel boundary (two DMA fixed latencies on the decode critical path) go away.
The numerics are the split norm's, op for op.

Before (graph)::

    %g = graph.fused "matmul" (%x, %w_norm, %W) {
      %n = graph.rms_norm %x, %w_norm eps 1e-05 : tensor<1x1x2048xbf16>, ...
      %y = graph.matmul %n, %W : ... -> tensor<1x1x3072xbf16>
      graph.yield %y }

After (tile, cloud)::

    func.func @k6_matmul(%x: memref<128x16xbf16>, %Wt: memref<...>, %out: memref<1x3072xbf16>,
                         %w: memref<128x16xbf16>, %g: memref<128x128xf32>) {
      tile.load %x ...; tile.load %g ...; tile.load %w ...          // the split norm's body
      ... tile.binary "mul" %n, %wb into %lhsT                        // [128, 16]: the row
      (the direct matmul: weight groups streamed, 1 x 128 matmuls, evacuation, stores)
    }

Not used (the norm and the matmul lower as before): batch or rows > 1, a norm whose
result something else reads, a row that does not split over all partitions into the
matmul's k-tiles, or a schedule that is not direct.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.matmul import (
    BlockedMatmulKernel,
    b_operand,
    choose_schedule,
    direct_a,
    problem_of,
)
from tilecc.passes.graph_to_tile.rms_norm_split import emit_split_norm, split_of, split_operands
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


class _NormGemvKernel(BlockedMatmulKernel):
    """The direct matmul whose row is the RMS norm of its input (args: x, B, out, w, G)."""

    def __init__(self, *args, norm: g.RmsNormOp, **kw):
        super().__init__(*args, direct=True, **kw)
        self.norm = norm
        self.argW, self.argG = self.kb.args[3:5]

    def load_a_direct(self, dst: SSAValue) -> None:
        p, s = self.p, self.s
        emit_split_norm(self.kb, self.norm, self.argA, self.argW, self.argG, 1, p.K, p.TK, dst,
                        queue=s.qa[0], const_queue=s.qb[0])


def lower_norm_gemv(lw: LoweringContext, pro: list[Operation], mm: Operation, loc: str) -> bool:
    """The group's prologue `pro` (one RMS norm, views) and matmul `mm` as one kernel;
    False (nothing emitted) where that does not apply (module docstring)."""
    norms = [o for o in pro if not isinstance(o, (g.ReshapeOp, g.ConstantOp))]
    if len(norms) != 1 or not isinstance(norms[0], g.RmsNormOp):
        return False
    norm = norms[0]
    # A is the norm's result, through views only, and nothing else reads it
    a = mm.operands[0]
    chain = [a]
    while isinstance(a.owner, g.ReshapeOp) and a.owner in pro:
        a = a.owner.operands[0]
        chain.append(a)
    if a is not norm.results[0] or any(sum(1 for _ in v.uses) != 1 for v in chain):
        return False
    got = problem_of(lw, mm)
    if got is None:
        return False
    problem, (res, out_shape, _a, b, M, K, N) = got
    x_shape = shape_of(norm.operands[0].type)
    if M != 1 or problem.batch or not problem.b_weight or x_shape[-1] != K or split_of(lw, 1, K) != problem.TK:
        return False  # (a direct row needs a pre-tiled weight: no schedule is chosen twice)
    sched = choose_schedule(lw, problem)
    if sched is None:
        return False
    if not direct_a(lw, problem, sched, norm.operands[0]):
        return False
    x = lw.materialise(norm.operands[0])
    xv, wv, gmat = split_operands(lw, norm, x, 1, K, problem.TK)
    B = b_operand(lw, b, problem, sched, out_shape[:-2], interleaved=True)
    out = lw.hbm(out_shape, elem_of(res.type))
    args = [xv, B.value, out, wv, gmat]
    kb = KernelBuilder(lw.kernel_name("matmul"), [v.type for v in args], loc)
    ea, eb, eo = elem_of(norm.results[0].type), elem_of(b.type), elem_of(res.type)
    kernel = _NormGemvKernel(kb, problem, sched, lw.cfg, rank=len(out_shape), a_imap=[0, 1], b_imap=B.imap,
                             elems=(ea, eb, eo), norm=norm)
    kernel.emit(out_shape[:-2])
    lw.launch(kb, args)
    lw.values[res] = out
    remarks.emit("lower-graph-to-tile", "passed",
                 lambda: f"rms_norm + matmul 1x{K}x{N}: the norm computes the matmul's row in the partitions "
                         f"(one kernel; the norm's store and the matmul's load removed)")
    return True


__all__ = ["lower_norm_gemv"]
