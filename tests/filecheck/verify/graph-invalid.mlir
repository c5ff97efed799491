// RUN: tilecc-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Each graph verifier rejects its invalid IR with a message naming the op and the cause.
// (graph.fused's "the region must end with graph.yield" is unreachable from text: the
// parser already rejects a region without a terminator.)

builtin.module {
  func.func @f(%x: tensor<4x8xf32>, %w: tensor<7x5xf32>) -> tensor<4x5xf32> {
    %y = graph.matmul %x, %w : tensor<4x8xf32>, tensor<7x5xf32> -> tensor<4x5xf32>
    func.return %y : tensor<4x5xf32>
  }
}
// CHECK: graph.matmul: contraction dims differ: [4, 8] @ [7, 5] (8 != 7)

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>, %w: tensor<8x5xf32>) -> tensor<4x6xf32> {
    %y = graph.matmul %x, %w : tensor<4x8xf32>, tensor<8x5xf32> -> tensor<4x6xf32>
    func.return %y : tensor<4x6xf32>
  }
}
// CHECK: graph.matmul: result type tensor<4x6xf32> does not match the inferred type tensor<4x5xf32>

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>, %b: tensor<3xf32>) -> tensor<4x8xf32> {
    %y = graph.add %x, %b : tensor<4x8xf32>, tensor<3xf32> -> tensor<4x8xf32>
    func.return %y : tensor<4x8xf32>
  }
}
// CHECK: graph.add: shapes [4, 8], [3] do not broadcast

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xi64>) -> tensor<4x8xi64> {
    %y = graph.relu %x : tensor<4x8xi64>
    func.return %y : tensor<4x8xi64>
  }
}
// CHECK: graph.relu: operand #0 element type must be f32, bf16, f16 or i32, got i64

// -----
builtin.module {
  func.func @f(%x: tensor<4x?xf32>) -> tensor<4x?xf32> {
    %y = graph.exp %x : tensor<4x?xf32>
    func.return %y : tensor<4x?xf32>
  }
}
// CHECK: graph.exp: operand #0 must have a static shape, got tensor<4x?xf32>

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %y = graph.softmax %x dim 2 : tensor<4x8xf32>
    func.return %y : tensor<4x8xf32>
  }
}
// CHECK: graph.softmax: dim 2 out of range for tensor<4x8xf32> (must be in [0, 2))

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>) -> tensor<8x4xf32> {
    %y = graph.permute %x [0, 0] : tensor<4x8xf32> -> tensor<8x4xf32>
    func.return %y : tensor<8x4xf32>
  }
}
// CHECK: graph.permute: [0, 0] is not a permutation of the dims of [4, 8]

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>) -> tensor<5x6xf32> {
    %y = graph.reshape %x : tensor<4x8xf32> -> tensor<5x6xf32>
    func.return %y : tensor<5x6xf32>
  }
}
// CHECK: graph.reshape: cannot reshape [4, 8] (32 elements) to [5, 6] (30 elements)

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>, %g: tensor<7xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
    %y = graph.layer_norm %x, %g, %b normalized_ndim 1 eps 1.000000e-05 : tensor<4x8xf32>, tensor<7xf32>, tensor<8xf32> -> tensor<4x8xf32>
    func.return %y : tensor<4x8xf32>
  }
}
// CHECK: graph.layer_norm: weight shape [7] must equal the normalised dims [8] of input [4, 8]

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %y = graph.fused "nosuch"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
    ^bb0(%a: tensor<4x8xf32>):
      graph.yield %a : tensor<4x8xf32>
    }
    func.return %y : tensor<4x8xf32>
  }
}
// CHECK: graph.fused: unknown kind "nosuch"

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %y = graph.fused "elementwise"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32> {
    ^bb0(%a: tensor<4x8xbf16>):
      graph.yield %a : tensor<4x8xbf16>
    }
    func.return %y : tensor<4x8xf32>
  }
}
// CHECK: graph.fused: block argument types differ from the input types

// -----
builtin.module {
  func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xbf16> {
    %y = graph.fused "elementwise"(%x) : (tensor<4x8xf32>) -> tensor<4x8xbf16> {
    ^bb0(%a: tensor<4x8xf32>):
      graph.yield %a : tensor<4x8xf32>
    }
    func.return %y : tensor<4x8xbf16>
  }
}
// CHECK: graph.fused: graph.yield types differ from the result types

