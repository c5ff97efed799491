// RUN: tilecc-opt %s -p 'lower-graph-to-tile{target=tiny opt_level=0}' | filecheck %s

// Routing ops on `tiny`: a top-2 of rows of 6 (selection by repeated extreme: per pass a
// max-reduce, the lowest index holding it by a min-reduce over an iota that is negative
// where free, the index stored, the winner knocked out with log(0) = -inf), and a
// bincount of 10 values into 5 bins (one-hot compare against an iota row, summed by a
// ones column on the matrix engine), and a running sum of rows of 40 (blocks of 16
// columns: a triangular ones matmul each, the carry added on the vector engine).
builtin.module {
  func.func @forward(%x: tensor<20x6xf32>, %ids: tensor<10xi32>, %y: tensor<4x40xf32>) -> (tensor<20x2xi32>, tensor<5xf32>, tensor<4x40xf32>) {
    %i = graph.topk_indices %x dim 1 k 2 largest true {tilecc.loc = "moe.py:7"} : tensor<20x6xf32> -> tensor<20x2xi32>
    %c = graph.bincount %ids length 5 {tilecc.loc = "moe.py:9"} : tensor<10xi32> -> tensor<5xf32>
    %s = graph.cumsum %y dim 1 {tilecc.loc = "moe.py:11"} : tensor<4x40xf32> -> tensor<4x40xf32>
    func.return %i, %c, %s : tensor<20x2xi32>, tensor<5xf32>, tensor<4x40xf32>
  }
}

// CHECK:      func.func @k0_topk(%{{.*}}: memref<20x6xf32>, %{{.*}}: memref<6xf32>, %{{.*}}: memref<20x2xi32>) attributes {tile.kernel, tilecc.loc = "moe.py:7"}
// CHECK:        scf.for
// CHECK:          tile.load {{.*}}row_dim = -1 : i64, col_dim = 0 : i64} : memref<6xf32>
// CHECK:          scf.for %[[J:.*]] = {{.*}} {
// CHECK-NEXT:       tile.reduce "max"
// CHECK-NEXT:       tile.binary "eq" {{.*}}rhs_mode = "column"
// CHECK-NEXT:       tile.binary "mul"
// CHECK-NEXT:       tile.reduce "min"
// CHECK-NEXT:       tile.scalar "add" %{{.*}}, 6.000000e+00 : f32 into {{.*}} memref<16x1xi32, #tile.space<"sram">>
// CHECK-NEXT:       tile.store %{{.*}} into %{{.*}}[%{{.*}}, %[[J]]]
// CHECK-NEXT:       tile.binary "ne" {{.*}}rhs_mode = "column"
// CHECK-NEXT:       tile.binary "mul"
// CHECK-NEXT:       tile.binary "mask"
// CHECK-NEXT:       tile.unary "log"
// CHECK-NEXT:       tile.binary "add"
// CHECK:      func.func @k1_bincount(%{{.*}}: memref<10x1xi32>, %{{.*}}: memref<64xf32>, %{{.*}}: memref<5xf32>, %{{.*}}: memref<1x5xf32>)
// CHECK:        tile.binary "eq" {{.*}}rhs_mode = "column"
// CHECK:        tile.matmul {{.*}} sizes(%{{.*}}, %{{.*}}, %{{.*}}) accumulate
// CHECK:        tile.unary "copy" {{.*}} : memref<1x5xf32, #tile.space<"acc">>, memref<1x5xf32, #tile.space<"sram">>
// CHECK:      func.func @k2_cumsum(%{{.*}}: memref<4x40xf32>, %{{.*}}: memref<16x16xf32>, %{{.*}}: memref<64xf32>, %{{.*}}: memref<4x40xf32>)
// CHECK:        scf.for
// CHECK:          tile.load {{.*}}row_dim = 1 : i64, col_dim = 0 : i64} : memref<4x40xf32>, memref<16x4xf32, #tile.space<"sram">>
// CHECK:          tile.matmul {{.*}} : memref<16x4xf32, #tile.space<"sram">>, memref<16x16xf32, #tile.space<"sram">>, memref<4x16xf32, #tile.space<"acc">>
// CHECK-NEXT:     tile.alloc {{.*}}buffer = "sums"
// CHECK-NEXT:     tile.binary "add" {{.*}}rhs_mode = "column"
// CHECK-NEXT:     tile.subview
// CHECK-NEXT:     tile.unary "copy" {{.*}} : memref<4x1xf32, #tile.space<"sram">>, memref<4x1xf32, #tile.space<"sram">>
// CHECK-NEXT:     tile.store
// CHECK:      func.func @main()
// CHECK:        tile.hbm_alloc {tilecc.loc = "moe.py:7", value = dense<[-6.000000e+00, -5.000000e+00, -4.000000e+00, -3.000000e+00, -2.000000e+00, -1.000000e+00]> : tensor<6xf32>}
// CHECK:        func.call @k0_topk
// CHECK:        func.call @k1_bincount
// CHECK:        func.call @k2_cumsum
