// RUN: tilecc-opt %s -p 'lower-graph-to-tile{target=tiny opt_level=0}' | filecheck %s

// A KV-cache update `cache[:, :, pos] = k` whose destination is an input used only by
// the scatter: no copy, the kernel stores the rows of k (viewed [heads, dim]) through one
// indirect DMA into the cache's own HBM tensor (viewed [heads*length, dim]); the row
// index of head h is pos (broadcast, stride 0) plus the constant offset h*length.
builtin.module {
  func.func @forward(%c: tensor<1x2x8x4xf32>, %p: tensor<1xi32>, %k: tensor<1x2x1x4xf32>) -> tensor<1x2x8x4xf32> {
    %r = graph.index_scatter %c, %p, %k dim 2 reduce "none" {tilecc.loc = "m.py:3"} : tensor<1x2x8x4xf32>, tensor<1xi32>, tensor<1x2x1x4xf32> -> tensor<1x2x8x4xf32>
    func.return %r : tensor<1x2x8x4xf32>
  }
}

// CHECK:      func.func @k0_scatter(%{{.*}}: memref<2x4xf32>, %{{.*}}: memref<2x1xi32, strided<[0, 0]>>, %{{.*}}: memref<2x1xi32>, %{{.*}}: memref<16x4xf32>) attributes {tile.kernel, tilecc.loc = "m.py:3"}
// CHECK-NOT:    scf.for
// CHECK:        tile.load %{{.*}} : memref<2x1xi32, strided<[0, 0]>>, memref<2x1xi32, #tile.space<"sram">>
// CHECK:        tile.load %{{.*}} : memref<2x1xi32>, memref<2x1xi32, #tile.space<"sram">>
// CHECK:        tile.binary "add"
// CHECK:        tile.load %{{.*}} : memref<2x4xf32>, memref<2x4xf32, #tile.space<"sram">>
// CHECK:        tile.scatter %{{.*}} by %{{.*}} into %{{.*}}[%{{.*}}] sizes(%{{.*}}, %{{.*}}) {tilecc.loc = "m.py:3"} : memref<2x4xf32, #tile.space<"sram">>, memref<2x1xi32, #tile.space<"sram">>, memref<16x4xf32>
// CHECK-NOT:  scatter_copy
// CHECK:      func.func @main() -> memref<1x2x8x4xf32>
// CHECK:        %[[C:.*]] = tile.hbm_alloc {input = 0 : i64} : memref<1x2x8x4xf32>
// CHECK:        tile.hbm_alloc {tilecc.loc = "m.py:3", value = dense<[[0], [8]]> : tensor<2x1xi32>}
// CHECK:        func.call @k0_scatter
// CHECK:        func.return %[[C]] : memref<1x2x8x4xf32>
