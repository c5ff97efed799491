// RUN: tilecc-opt %s | tilecc-opt | filecheck %s
// RUN: tilecc-opt %s --print-op-generic | tilecc-opt | filecheck %s

builtin.module {
  func.func @forward(%x: tensor<2x3x5x6xf32>) -> tensor<2x3x8x9xf32> {
    %c = graph.pad %x low [0, 0, 1, 0] high [0, 0, 0, 2] value 5.000000e-01 : f64 : tensor<2x3x5x6xf32> -> tensor<2x3x6x8xf32>
    %r = graph.pad %c low [0, 0, 1, 1] high [0, 0, 1, 0] value 0.000000e+00 : f64 mode "reflect" : tensor<2x3x6x8xf32> -> tensor<2x3x8x9xf32>
    func.return %r : tensor<2x3x8x9xf32>
  }
}

// CHECK:      %c = graph.pad %x low [0, 0, 1, 0] high [0, 0, 0, 2] value 5.000000e-01 : f64 : tensor<2x3x5x6xf32> -> tensor<2x3x6x8xf32>
// CHECK-NEXT: %r = graph.pad %c low [0, 0, 1, 1] high [0, 0, 1, 0] value 0.000000e+00 : f64 mode "reflect" : tensor<2x3x6x8xf32> -> tensor<2x3x8x9xf32>
