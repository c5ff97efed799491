// RUN: tilecc-opt %s -p canonicalize-graph | filecheck %s

// The importer's wrap of negative indices (index + (index < 0) * size) over a constant
// index: folded to one graph.constant, so no kernel recomputes it and the scatter's
// lowering sees the values (a contiguous range: block copies).
builtin.module {
  func.func @forward(%c: tensor<1x2x8x4xf32>, %k: tensor<1x2x3x4xf32>) -> tensor<1x2x8x4xf32> {
    %p = graph.constant dense<[2, 3, -1]> : tensor<3xi32>
    %z = graph.constant dense<0> : tensor<i32>
    %n = graph.constant dense<8> : tensor<i32>
    %l = graph.lt %p, %z : tensor<3xi32>, tensor<i32> -> tensor<3xi32>
    %w = graph.mul %l, %n : tensor<3xi32>, tensor<i32> -> tensor<3xi32>
    %i = graph.add %p, %w : tensor<3xi32>, tensor<3xi32> -> tensor<3xi32>
    %r = graph.index_scatter %c, %i, %k dim 2 reduce "none" : tensor<1x2x8x4xf32>, tensor<3xi32>, tensor<1x2x3x4xf32> -> tensor<1x2x8x4xf32>
    func.return %r : tensor<1x2x8x4xf32>
  }
}

// CHECK:      %[[I:.*]] = graph.constant dense<[2, 3, 7]> : tensor<3xi32>
// CHECK-NOT:  graph.lt
// CHECK-NOT:  graph.add
// CHECK:      graph.index_scatter %{{.*}}, %[[I]], %{{.*}} dim 2
