// RUN: tilecc-opt %s -p canonicalize-graph | filecheck %s

// LlamaRMSNorm in bf16 (upcast, mean of squares, rsqrt, cast back, then the weight)
// becomes one graph.rms_norm with the cast before the weight; Gemma's order (the fp32
// weight, then the cast) one without; a mean over dim 0 stays decomposed.
builtin.module {
  func.func @forward(%x: tensor<2x5x64xbf16>, %w: tensor<64xbf16>, %wg: tensor<64xf32>, %z: tensor<4x8xf32>)
      -> (tensor<2x5x64xbf16>, tensor<2x5x64xbf16>, tensor<4x8xf32>) {
    %h = graph.cast %x : tensor<2x5x64xbf16> -> tensor<2x5x64xf32>
    %s = graph.mul %h, %h : tensor<2x5x64xf32>, tensor<2x5x64xf32> -> tensor<2x5x64xf32>
    %m = graph.mean %s dims [2] keepdim true : tensor<2x5x64xf32> -> tensor<2x5x1xf32>
    %e = graph.constant dense<1.000000e-06> : tensor<f32>
    %a = graph.add %m, %e : tensor<2x5x1xf32>, tensor<f32> -> tensor<2x5x1xf32>
    %r = graph.rsqrt %a : tensor<2x5x1xf32>
    %n = graph.mul %h, %r : tensor<2x5x64xf32>, tensor<2x5x1xf32> -> tensor<2x5x64xf32>
    %c = graph.cast %n : tensor<2x5x64xf32> -> tensor<2x5x64xbf16>
    %y = graph.mul %w, %c : tensor<64xbf16>, tensor<2x5x64xbf16> -> tensor<2x5x64xbf16>
    %h2 = graph.cast %x : tensor<2x5x64xbf16> -> tensor<2x5x64xf32>
    %s2 = graph.mul %h2, %h2 : tensor<2x5x64xf32>, tensor<2x5x64xf32> -> tensor<2x5x64xf32>
    %m2 = graph.mean %s2 dims [2] keepdim true : tensor<2x5x64xf32> -> tensor<2x5x1xf32>
    %e2 = graph.constant dense<1.000000e-05> : tensor<f32>
    %a2 = graph.add %m2, %e2 : tensor<2x5x1xf32>, tensor<f32> -> tensor<2x5x1xf32>
    %r2 = graph.rsqrt %a2 : tensor<2x5x1xf32>
    %n2 = graph.mul %h2, %r2 : tensor<2x5x64xf32>, tensor<2x5x1xf32> -> tensor<2x5x64xf32>
    %g2 = graph.mul %n2, %wg : tensor<2x5x64xf32>, tensor<64xf32> -> tensor<2x5x64xf32>
    %y2 = graph.cast %g2 : tensor<2x5x64xf32> -> tensor<2x5x64xbf16>
    %s3 = graph.mul %z, %z : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x8xf32>
    %m3 = graph.mean %s3 dims [0] keepdim true : tensor<4x8xf32> -> tensor<1x8xf32>
    %a3 = graph.add %m3, %e : tensor<1x8xf32>, tensor<f32> -> tensor<1x8xf32>
    %r3 = graph.rsqrt %a3 : tensor<1x8xf32>
    %y3 = graph.mul %z, %r3 : tensor<4x8xf32>, tensor<1x8xf32> -> tensor<4x8xf32>
    func.return %y, %y2, %y3 : tensor<2x5x64xbf16>, tensor<2x5x64xbf16>, tensor<4x8xf32>
  }
}

// CHECK:      %[[Y:.*]] = graph.rms_norm %x, %w eps 9.99999{{[0-9]+}}e-07 cast_before_weight {{.*}}: tensor<2x5x64xbf16>, tensor<64xbf16> -> tensor<2x5x64xbf16>
// CHECK-NEXT: %[[Y2:.*]] = graph.rms_norm %x, %wg eps 9.99999{{[0-9]+}}e-06 {{.*}}: tensor<2x5x64xbf16>, tensor<64xf32> -> tensor<2x5x64xbf16>
// CHECK:      graph.mean %{{.*}} dims [0] keepdim true
// CHECK:      graph.rsqrt
// CHECK:      func.return %[[Y]], %[[Y2]], %{{.*}}
// CHECK-NOT:  graph.cast
