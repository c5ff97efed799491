// RUN: tilecc-opt %s -p 'lower-graph-to-tile{target=tiny}' | filecheck %s

// graph.rope on the transposed view [1, 4, 8, 16] of a projection's rows [1, 8, 64]: one
// kernel reads the rows (one DMA of 8 positions x 64 columns, all four heads), loads cos
// and sin once for every head, computes x * cos over several heads an instruction, the
// two rotated halves times -sin / sin per head, and one sum for the four heads, and
// stores the same [1, 8, 64] rows; the result is the free transposed view of them
// (strides [512, 16, 64, 1]).
builtin.module {
  func.func @forward(%p: tensor<1x8x64xf32>, %cos: tensor<1x1x8x16xf32>, %sin: tensor<1x1x8x16xf32>) -> tensor<1x4x8x16xf32> {
    %v = graph.reshape %p : tensor<1x8x64xf32> -> tensor<1x8x4x16xf32>
    %q = graph.permute %v [0, 2, 1, 3] : tensor<1x8x4x16xf32> -> tensor<1x4x8x16xf32>
    %y = graph.rope %q, %cos, %sin {tilecc.loc = "rope.py:7"} : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32>, tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>
    func.return %y : tensor<1x4x8x16xf32>
  }
}

// CHECK:      func.func @k0_rope(%[[X:.*]]: memref<1x8x64xf32>, %[[C:.*]]: memref<1x4x8x16xf32, strided<[128, 0, 16, 1]>>, %[[S:.*]]: memref<1x4x8x16xf32, strided<[128, 0, 16, 1]>>, %[[O:.*]]: memref<1x8x64xf32>)
// CHECK:        tile.load %[[C]]{{.*}} row_dim = 2 : i64, col_dim = 3 : i64
// CHECK:        tile.load %[[S]]{{.*}} row_dim = 2 : i64, col_dim = 3 : i64
// CHECK:        tile.unary "neg"
// CHECK:        tile.load %[[X]]{{.*}} sizes(%{{.*}}, %{{.*}}) {{.*}}row_dim = 1 : i64, col_dim = 2 : i64{{.*}} : memref<1x8x64xf32>, memref<8x64xf32, #tile.space<"sram">>
// CHECK-NOT:    tile.load
// CHECK:        tile.binary "mul"
// CHECK-NOT:    tile.load
// CHECK:        tile.binary "add" {{.*}} : memref<8x64xf32, #tile.space<"sram">>, memref<8x64xf32, #tile.space<"sram">>, memref<8x64xf32, #tile.space<"sram">>
// CHECK-NOT:    tile.binary "add"
// CHECK-NOT:    tile.load
// CHECK:        tile.store %{{.*}} into %[[O]]{{.*}} : memref<8x64xf32, #tile.space<"sram">>, memref<1x8x64xf32>
// CHECK-NEXT:   func.return
// CHECK:      func.func @main()
// CHECK:        func.call @k0_rope
// CHECK-NEXT:   tile.view %{{.*}} : memref<1x8x64xf32> to memref<1x4x8x16xf32, strided<[512, 16, 64, 1]>>
