// RUN: tilecc-opt %s -p 'canonicalize-graph,fuse-graph,lower-graph-to-tile{target=tiny},plan-sram{target=tiny},plan-hbm{target=tiny},lower-tile-to-npu{target=tiny},npu-insert-sync{target=tiny}' | filecheck %s
// RUN: cat %s | tilecc-opt -p 'lower-graph-to-tile{target=edge opt_level=0},plan-sram{target=edge},plan-hbm{target=edge},lower-tile-to-npu{target=edge},npu-insert-sync{target=edge}' -o %t && filecheck %s --check-prefix=O0 < %t

// The whole default pipeline from tilecc-opt: graph in, npu kernels out, every kernel and
// instruction still carrying the user's line (a bias add and GELU fuse into the matmul).
builtin.module {
  func.func @forward(%x: tensor<20x8xf32>, %w: tensor<8x5xf32>, %b: tensor<5xf32>) -> tensor<20x5xf32> {
    %m = graph.matmul %x, %w {tilecc.loc = "m.py:4"} : tensor<20x8xf32>, tensor<8x5xf32> -> tensor<20x5xf32>
    %y = graph.add %m, %b {tilecc.loc = "m.py:5"} : tensor<20x5xf32>, tensor<5xf32> -> tensor<20x5xf32>
    %g = graph.gelu %y approximate "tanh" {tilecc.loc = "m.py:6"} : tensor<20x5xf32>
    func.return %g : tensor<20x5xf32>
  }
}

// CHECK:     builtin.module attributes {tile.hbm_size
// CHECK:       npu.kernel "k0_fused_matmul" attributes {tilecc.loc = "m.py:4"}
// CHECK:         npu.dma_load {tilecc.loc = "m.py:4"
// CHECK:         npu.matmul {tilecc.loc = "m.py:4"
// CHECK-NOT:   npu.kernel
// CHECK:         npu.dma_store {tilecc.loc = "m.py:4"

// O0:          npu.kernel "k0_matmul" attributes {tilecc.loc = "m.py:4"}
// O0:          npu.kernel "k1_add" attributes {tilecc.loc = "m.py:5"}
// O0:          npu.kernel "k2_gelu_tanh" attributes {tilecc.loc = "m.py:6"}
