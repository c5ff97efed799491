// RUN: tilecc-opt %s -p 'lower-graph-to-tile{target=tiny}' | filecheck %s

// A prefill's KV-cache update at the constant positions 1..36 of a cache of 40: the rows
// of both heads lie side by side in k's [36, 2*4] rows, so partition m takes 3 rows of
// both heads ([12, 24]: one load), the vector engine puts each head's 3 rows side by
// side, and one store per head writes rows 1+3m..3+3m (runs of 12 elements): block
// copies, no indirect store.
builtin.module {
  func.func @forward(%c: tensor<1x2x40x4xf32>, %k: tensor<1x36x8xf32>) -> tensor<1x2x40x4xf32> {
    %p = graph.constant dense<[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36]> : tensor<36xi32>
    %k4 = graph.reshape %k : tensor<1x36x8xf32> -> tensor<1x36x2x4xf32>
    %kt = graph.permute %k4 [0, 2, 1, 3] : tensor<1x36x2x4xf32> -> tensor<1x2x36x4xf32>
    %r = graph.index_scatter %c, %p, %kt dim 2 reduce "none" {tilecc.loc = "m.py:3"} : tensor<1x2x40x4xf32>, tensor<36xi32>, tensor<1x2x36x4xf32> -> tensor<1x2x40x4xf32>
    func.return %r : tensor<1x2x40x4xf32>
  }
}

// CHECK:      func.func @k0_scatter_rows(%{{.*}}: memref<12x24xf32>, %{{.*}}: memref<2x12x12xf32, strided<[160, 12, 1], offset: 4>>)
// CHECK:        tile.load %{{.*}} : memref<12x24xf32>, memref<12x24xf32, #tile.space<"sram">>
// CHECK-COUNT-3: tile.unary "copy"
// CHECK:        tile.store
// CHECK-COUNT-3: tile.unary "copy"
// CHECK:        tile.store
// CHECK-NOT:    tile.scatter
// CHECK:      func.func @main()
// CHECK:        func.call @k0_scatter_rows
