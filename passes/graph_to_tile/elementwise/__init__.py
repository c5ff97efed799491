"""Elementwise kernels: a DAG of elementwise (and row-wise) ops over one iteration space, in one kernel.

Every elementwise graph op (alone, at -O0 and -O2) and every fused elementwise group
(-O2, `graph.fused "elementwise"`) lowers through `ElementwiseKernel`; intermediates
stay in SRAM. Before::

    %y = graph.fused "elementwise" (%x, %b) {             y = gelu(x + b) * 0.5
      ...
    }

After (one kernel; x and y touch HBM once)::

    func.func @k0_fused_add(%x: memref<..>, %b: memref<..>, %y: memref<..>) {
      scf.for ... {   (per [TR x TC] tile, D buffer sets)
        tile.load %x[..] into %in0 ; tile.load %b[..] into %in1      (b row-broadcast)
        tile.binary "add" %in0, %in1 into %t ; tile.unary "gelu" %t into %t
        tile.scalar "mul" %t, 0.5 into %out0 ; tile.store %out0 into %y[..]
      }
    }

The package, by concept: `dag` (the values of the DAG and their buffers by liveness),
`cost` (the tile shape and buffering depth from the simulator's timing rules),
`tile_program` (one tile's buffers, loads, vector ops and stores, which a matmul's
epilogue also drives), `kernel` (`ElementwiseKernel`: building the DAG, the iteration
space, the loop nest).
"""

from tilecc.passes.graph_to_tile.elementwise.cost import vector_steps
from tilecc.passes.graph_to_tile.elementwise.dag import ROWWISE, Imm, Leaf, Node, Value, leaf_elem
from tilecc.passes.graph_to_tile.elementwise.kernel import ElementwiseKernel, add_graph_op
from tilecc.passes.graph_to_tile.elementwise.tile_program import TileProgram

__all__ = [
    "ROWWISE", "ElementwiseKernel", "Imm", "Leaf", "Node", "TileProgram", "Value", "add_graph_op", "leaf_elem",
    "vector_steps",
]
