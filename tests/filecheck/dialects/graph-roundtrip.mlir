// RUN: tilecc-opt %s | tilecc-opt | filecheck %s
// RUN: tilecc-opt %s --print-op-generic | tilecc-opt | filecheck %s

builtin.module {
  func.func @forward(%x: tensor<5x37xbf16>) -> tensor<5x29xbf16> {
    %w = graph.weight "fc.weight" {tilecc.loc = "model.py:12"} : tensor<29x37xbf16>
    %t = graph.permute %w [1, 0] {tilecc.loc = "model.py:12"} : tensor<29x37xbf16> -> tensor<37x29xbf16>
    %y = graph.matmul %x, %t {tilecc.loc = "model.py:12"} : tensor<5x37xbf16>, tensor<37x29xbf16> -> tensor<5x29xbf16>
    %g = graph.gelu %y approximate "tanh" {tilecc.loc = "model.py:13"} : tensor<5x29xbf16>
    %s = graph.softmax %g dim 1 : tensor<5x29xbf16>
    func.return %s : tensor<5x29xbf16>
  }
}

// CHECK:      graph.weight "fc.weight" {tilecc.loc = "model.py:12"} : tensor<29x37xbf16>
// CHECK-NEXT: graph.permute %{{.*}} [1, 0] {tilecc.loc = "model.py:12"}
// CHECK-NEXT: graph.matmul
// CHECK-NEXT: graph.gelu %{{.*}} approximate "tanh" {tilecc.loc = "model.py:13"}
// CHECK-NEXT: graph.softmax %{{.*}} dim 1
