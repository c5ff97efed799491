"""Check a tile-DSL kernel and lower it to the tile dialect, for concrete shapes.

The symbolic sizes of the kernel's parameters are bound from the arrays it is called
with, so every loop trip count and every tile size is known here. A loop
``for m in tiles(M, 128)`` becomes an ``scf.for`` over the full tiles plus a peeled copy
of the body for the partial last tile (so every tile op has static sizes and edges need
no masks); ``buffers=b`` unrolls the loop body b times, each copy with buffers of its
own, so one copy's loads run while another computes (multi-buffering). A loop whose
variable bounds an inner loop (``tiles(m.end, 128)``, a causal triangle) is unrolled.

Values: a ``load(x[...])`` is lazy until its use says how to DMA it (transposed for a
matmul's left operand, broadcast over rows next to a wider tile); ``matmul`` is a
pending product until it is accumulated into (or materialised in) the accumulator; a
``zeros(..., acc)`` whose first use is ``acc += matmul(...)`` costs nothing: the
matmul's accumulate flag is off on the first iteration. Every other expression writes
a fresh on-chip buffer (hoisted to the kernel's entry; plan-sram gives each its bytes),
or the buffer of the variable it is assigned to when that variable outlives the loop.

Every op built carries ``tilecc.loc = "file:line:col"`` of the DSL construct it came
from (the attribute the graph lowering uses for torch source locations).

The lowering's context is `KernelLowering` (`kernel.py`: one kernel's state, its
building blocks, the driver `run`, and `build_module`); the concepts are functions that
take it as `lw`, by module: `statements`, `loops`, `expressions`, `tiles` (HBM slices,
loads, windows), `constants` (fills, ids, resident constants), `matmul`, `transpose`.
The values an expression evaluates to are in `values`, the syntax-tree analyses in
`analysis`.
"""

from tilecc.frontend.dsl.lower.kernel import KernelLowering, build_module, kernel_module
from tilecc.frontend.dsl.lower.values import DTYPES

__all__ = ["build_module", "kernel_module", "KernelLowering", "DTYPES"]
