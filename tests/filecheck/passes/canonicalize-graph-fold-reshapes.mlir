// RUN: tilecc-opt %s -p canonicalize-graph | filecheck %s

// A reshape of a reshape reads the first input: back to the input's own type it is the
// input (%q), elsewhere one reshape (%r); the returned reshape stays a value of its own.
builtin.module {
  func.func @forward(%x: tensor<1x12x16x8xbf16>) -> (tensor<1x12x16x8xbf16>, tensor<12x128xbf16>, tensor<1x12x16x8xbf16>) {
    %x3 = graph.reshape %x : tensor<1x12x16x8xbf16> -> tensor<12x16x8xbf16>
    %q = graph.reshape %x3 : tensor<12x16x8xbf16> -> tensor<1x12x16x8xbf16>
    %e = graph.exp %q : tensor<1x12x16x8xbf16>
    %r = graph.reshape %x3 : tensor<12x16x8xbf16> -> tensor<12x128xbf16>
    %n = graph.neg %r : tensor<12x128xbf16>
    %t = graph.reshape %x3 : tensor<12x16x8xbf16> -> tensor<1x12x16x8xbf16>
    func.return %e, %n, %t : tensor<1x12x16x8xbf16>, tensor<12x128xbf16>, tensor<1x12x16x8xbf16>
  }
}

// CHECK:      func.func @forward(%[[X:.*]]: tensor<1x12x16x8xbf16>)
// CHECK-NEXT:   %[[E:.*]] = graph.exp %[[X]] : tensor<1x12x16x8xbf16>
// CHECK-NEXT:   %[[R:.*]] = graph.reshape %[[X]] : tensor<1x12x16x8xbf16> -> tensor<12x128xbf16>
// CHECK-NEXT:   %[[N:.*]] = graph.neg %[[R]] : tensor<12x128xbf16>
// CHECK-NEXT:   %[[T:.*]] = graph.reshape %[[X]] : tensor<1x12x16x8xbf16> -> tensor<1x12x16x8xbf16>
// CHECK-NEXT:   func.return %[[E]], %[[N]], %[[T]]
