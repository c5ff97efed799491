// RUN: tilecc-opt %s -p 'lower-graph-to-tile{target=tiny opt_level=0}' | filecheck %s

// A bias add then a matmul on `tiny` (16 partitions, 16x16 array): two kernels, a @main
// that allocates HBM tensors and launches them. The add's 20 rows tile as 16 + 4 (the
// edge tile peeled statically), with two buffer sets so loads overlap the vector work;
// the bias row does not vary along the row tiles, so it is loaded once.
builtin.module {
  func.func @forward(%x: tensor<20x8xf32>, %b: tensor<8xf32>, %w: tensor<8x5xf32>) -> tensor<20x5xf32> {
    %r = graph.add %x, %b {tilecc.loc = "m.py:3"} : tensor<20x8xf32>, tensor<8xf32> -> tensor<20x8xf32>
    %y = graph.matmul %r, %w {tilecc.loc = "m.py:4"} : tensor<20x8xf32>, tensor<8x5xf32> -> tensor<20x5xf32>
    func.return %y : tensor<20x5xf32>
  }
}

// CHECK:      func.func @k0_add(%{{.*}}: memref<20x8xf32>, %{{.*}}: memref<1x8xf32>, %{{.*}}: memref<20x8xf32>) attributes {tile.kernel, tilecc.loc = "m.py:3"}
// CHECK:        tile.alloc {tilecc.loc = "m.py:3", buffer = "in0"} : memref<16x8xf32, #tile.space<"sram">>
// CHECK:        tile.alloc {tilecc.loc = "m.py:3", buffer = "in01"} : memref<16x8xf32, #tile.space<"sram">>
// CHECK:        tile.load %{{.*}} {tilecc.loc = "m.py:3", row_dim = -1 : i64, col_dim = 1 : i64, queue = 0 : i64} : memref<1x8xf32>
// CHECK-NOT:    scf.for
// CHECK:        tile.load %{{.*}} sizes(%[[R16:.*]], %{{.*}}) {tilecc.loc = "m.py:3", row_dim = 0 : i64, col_dim = 1 : i64, queue = 1 : i64}
// CHECK:        tile.binary "add"
// CHECK:        tile.store
// CHECK:        tile.load %{{.*}} sizes(%[[R4:.*]], %{{.*}}) {{.*}}row_dim = 0 : i64
// CHECK:        tile.binary "add"
// CHECK:        tile.store
// CHECK:      func.func @k1_matmul
// CHECK:          tile.alloc {{.*}}buffer = "acc"} : memref<16x5xf32, #tile.space<"acc">>
// The A operand is loaded transposed at -O0: K (dim 1) on partitions.
// CHECK:          tile.load {{.*}}row_dim = 1 : i64, col_dim = 0 : i64} : memref<20x8xf32>, memref<8x16xf32, #tile.space<"sram">>
// CHECK:          tile.matmul
// CHECK:          tile.unary "copy"
// CHECK:      func.func @main() -> memref<20x5xf32>
// CHECK-NEXT:   tile.hbm_alloc {input = 0 : i64} : memref<20x8xf32>
// CHECK-NEXT:   tile.hbm_alloc {input = 1 : i64} : memref<8xf32>
// CHECK-NEXT:   tile.hbm_alloc {input = 2 : i64} : memref<8x5xf32>
// CHECK-NEXT:   tile.view %{{.*}} {tilecc.loc = "m.py:3"} : memref<8xf32> to memref<1x8xf32>
// CHECK-NEXT:   tile.hbm_alloc {tilecc.loc = "m.py:3"} : memref<20x8xf32>
// CHECK-NEXT:   func.call @k0_add({{.*}}) {tilecc.loc = "m.py:3"}
// CHECK-NEXT:   tile.hbm_alloc {tilecc.loc = "m.py:4"} : memref<20x5xf32>
// CHECK-NEXT:   func.call @k1_matmul({{.*}}) {tilecc.loc = "m.py:4"}
// CHECK-NEXT:   func.return
