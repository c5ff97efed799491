"""The -O2 attention kernel: ``graph.sdpa`` as one flash-attention kernel.

At ``-O0`` (and where this kernel does not apply) sdpa is the decomposition of
`index.lower_sdpa`: one kernel per graph op, every score matrix round-tripping HBM.
Here the whole attention is one kernel and no score leaves the chip. Before::

    %o = graph.sdpa %q, %k, %v scale 0.35355339059327373 causal true
        : tensor<1x2x16x8xbf16>, tensor<1x2x16x8xbf16>, tensor<1x2x16x8xbf16> -> tensor<1x2x16x8xbf16>

After (``tiny``: 16 x 16 tiles; the kernel's identity and causal pattern are constants)::

    func.func @k0_attention(%q: memref<1x2x16x8xbf16>, %k: ..., %v: ..., %o: ...,
                            %ident: memref<16x16xbf16>, %causal: memref<16x16xbf16>) {
      ... K^T (identity matmuls), Q^T (DMA transposes), S = Q K^T and its row max, exp(S^T - m) -> P^T,
      ... O_aug += P^T^T V_aug, O = O_aug[:, :8] / O_aug[:, 8], tile.store into %o
    }
    func.func @main() -> memref<1x2x16x8xbf16> {
      ... func.call @k0_attention(%q, %k, %v, %o, %ident, %causal)
    }

The package, by concept:

- `plan`: the tiling of a kernel (`AttentionPlan`: tile size, paired rows, head groups,
  D chunks, the row sum, causal patterns, buffer counts within SRAM and the
  accumulator) and the candidates to try;
- `program`: a head's instructions in a body (K / V preparation, per q-tile the two
  passes of the *transposed scores* layout);
- `kernel`: the kernel around them (`AttentionKernel`: arguments, constants, buffers,
  the prologue, the loops of bodies over the heads);
- `scheduler`: the list scheduler that orders each body for the engine queues, and
  its replay with the simulator's timing rules (the kernel's estimate);
- `entry`: the lowering (`lower_attention`), the search over tilings, the session
  caches (`kernel_estimate`).

The decode kernel (a few query rows per head over a KV cache, every (batch, KV head)
problem in one kernel), tried first by `entry`: `decode_plan` (the problem and the
schedule), `decode_cost` (the cost model and the choice), `decode_kernel` (the
emitter), `decode_entry` (the lowering and its fallback remark).
"""

from tilecc.passes.graph_to_tile.attention.entry import kernel_estimate, lower_attention, lower_attention_kernel
from tilecc.passes.graph_to_tile.attention.plan import (
    AttentionPlan,
    Seq,
    causal_pairs,
    contiguous,
    group_sizes,
    heads_adjacent,
    plan_attention,
)

__all__ = [
    "AttentionPlan", "Seq", "causal_pairs", "contiguous", "group_sizes", "heads_adjacent", "kernel_estimate",
    "lower_attention", "lower_attention_kernel", "plan_attention",
]
