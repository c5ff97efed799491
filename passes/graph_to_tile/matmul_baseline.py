"""graph.matmul: the -O2 blocked kernel (`matmul.py`) where it applies, else the
baseline kernel here (also the whole of -O0): per output tile, the k loop loads A
transposed (K on partitions) with an element-strided DMA and B as it lies, and
accumulates on the matrix engine.

Before (graph)::

    %y = graph.matmul %a, %b : (tensor<37x53xf32>, tensor<53x20xf32>) -> tensor<37x20xf32>

After (tile, baseline; `tiny`)::

    func.func @k0_matmul(%a: memref<37x53xf32>, %b: memref<53x20xf32>, %out: memref<37x20xf32>) {
      scf.for %m0 ... { scf.for %n0 ... {
        %acc = tile.alloc : memref<16x16xf32, #tile.space<"acc">>
        scf.for %k0 ... {
          tile.load %a[%m0, %k0] into %lhsT ... row_dim 1 col_dim 0     // transposed
          tile.load %b[%k0, %n0] into %rhs ...
          tile.matmul %lhsT, %rhs into %acc accumulate(%k0 != 0) ...
        }
        tile.unary "copy" %acc into %o ...; tile.store %o into %out[%m0, %n0] ...
    }}}
"""

from __future__ import annotations

from xdsl.dialects.builtin import f32
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import Operand, elem_of, matmul_dims


def lower_matmul(lw: LoweringContext, op: Operation, loc: str) -> None:
    """-O2: the blocked kernel when a schedule fits; otherwise the baseline kernel."""
    from tilecc.passes.graph_to_tile.matmul import lower_matmul_blocked

    if not (lw.opt_level >= 2 and lower_matmul_blocked(lw, op, loc)):
        lower_matmul_baseline(lw, op, loc)


def lower_matmul_baseline(lw: LoweringContext, op: Operation, loc: str) -> None:
    """The baseline kernel: fixed array-sized tiles, A loaded transposed, single-buffered."""
    dims = matmul_dims(op)
    if dims is None:
        raise CompileError(f"graph.matmul at {loc}: rank-1 operands are not supported yet")
    res, out_shape, a, b, M, K, N = dims
    rank = len(out_shape)
    A = lw.aligned_batch(a, out_shape[:-2], (M, K))
    B = lw.aligned_batch(b, out_shape[:-2], (K, N))
    out = lw.hbm(out_shape, elem_of(res.type))
    cfg = lw.cfg
    TM = min(cfg.accumulator.partitions, lw.P, M)
    TK = min(cfg.matrix.rows, K)
    TN = min(cfg.matrix.cols, cfg.accumulator.bytes_per_partition // 4, N)
    kb = KernelBuilder(lw.kernel_name("matmul"), [A.value.type, B.value.type, out.type], loc)
    ivs: list[SSAValue] = []

    def body() -> None:
        zero = kb.const(0)

        def batch_idx(o: Operand) -> list[SSAValue]:
            return [ivs[d] if o.imap[d] is not None else zero for d in range(rank - 2)]

        with kb.tiles(M, TM) as (m0, m), kb.tiles(N, TN) as (n0, n):
            acc = kb.alloc([TM, TN], f32, tile.ACC, "acc")
            with kb.tiles(K, TK) as (k0, k):
                lhsT = kb.alloc([TK, TM], elem_of(a.type), tile.SRAM, "lhsT")
                kb.add(tile.LoadOp(kb.args[0], [*batch_idx(A), m0, k0], lhsT, k, m, rank - 1, rank - 2))
                rhs = kb.alloc([TK, TN], elem_of(b.type), tile.SRAM, "rhs")
                kb.add(tile.LoadOp(kb.args[1], [*batch_idx(B), k0, n0], rhs, k, n, rank - 2, rank - 1))
                kb.add(tile.MatmulOp(lhsT, rhs, acc, m, k, n, kb.ne_zero(k0)))
            ob = kb.alloc([TM, TN], elem_of(res.type), tile.SRAM, "out")
            kb.add(tile.UnaryOp("copy", acc, ob, m, n))
            kb.add(tile.StoreOp(ob, kb.args[2], [*ivs, m0, n0], m, n, rank - 2, rank - 1))

    lw.outer_loops(kb, out_shape[:-2], ivs, body)
    lw.launch(kb, [A.value, B.value, out])
    lw.values[res] = out


LOWERINGS = {g.MatmulOp: lower_matmul}
