// RUN: tilecc-opt %s -p canonicalize-graph | filecheck %s

// GPT-2's gelu_new as it exports (bf16 constants), and x * sigmoid(x): each becomes one
// op; the ops it replaced are erased.
builtin.module {
  func.func @forward(%x: tensor<4x8xbf16>) -> (tensor<4x8xbf16>, tensor<4x8xbf16>) {
    %c05 = graph.constant dense<5.000000e-01> : tensor<bf16>
    %h = graph.mul %x, %c05 {tilecc.loc = "act.py:66"} : tensor<4x8xbf16>, tensor<bf16> -> tensor<4x8xbf16>
    %c3 = graph.constant dense<3.000000e+00> : tensor<bf16>
    %p = graph.pow %x, %c3 : tensor<4x8xbf16>, tensor<bf16> -> tensor<4x8xbf16>
    %c1 = graph.constant dense<4.467770e-02> : tensor<bf16>
    %q = graph.mul %p, %c1 : tensor<4x8xbf16>, tensor<bf16> -> tensor<4x8xbf16>
    %s = graph.add %x, %q : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
    %c2 = graph.constant dense<7.968750e-01> : tensor<bf16>
    %u = graph.mul %s, %c2 : tensor<4x8xbf16>, tensor<bf16> -> tensor<4x8xbf16>
    %t = graph.tanh %u : tensor<4x8xbf16>
    %one = graph.constant dense<1.000000e+00> : tensor<bf16>
    %t1 = graph.add %t, %one : tensor<4x8xbf16>, tensor<bf16> -> tensor<4x8xbf16>
    %y = graph.mul %h, %t1 {tilecc.loc = "act.py:66"} : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
    %sg = graph.sigmoid %x : tensor<4x8xbf16>
    %z = graph.mul %sg, %x {tilecc.loc = "act.py:70"} : tensor<4x8xbf16>, tensor<4x8xbf16> -> tensor<4x8xbf16>
    func.return %y, %z : tensor<4x8xbf16>, tensor<4x8xbf16>
  }
}

// CHECK:      func.func @forward(%[[X:.*]]: tensor<4x8xbf16>)
// CHECK-NEXT:   %[[Y:.*]] = graph.gelu %[[X]] approximate "tanh" {tilecc.loc = "act.py:66"} : tensor<4x8xbf16>
// CHECK-NEXT:   %[[Z:.*]] = graph.silu %[[X]] {tilecc.loc = "act.py:70"} : tensor<4x8xbf16>
// CHECK-NEXT:   func.return %[[Y]], %[[Z]]
