// RUN: tilecc-opt %s -p fuse-graph | filecheck %s

builtin.module {
  // @rowwise: the residual add feeds a layer norm whose result has two users, so the
  // layer norm is a kernel of its own: a row-wise group whose prologue value (the
  // residual stream) is a second output.
  func.func @rowwise(%x: tensor<8x16xf32>, %r: tensor<8x16xf32>, %g: tensor<16xf32>, %beta: tensor<16xf32>)
      -> (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) {
    %h = graph.add %x, %r {tilecc.loc = "m.py:1"} : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x16xf32>
    %n = graph.layer_norm %h, %g, %beta normalized_ndim 1 eps 1.000000e-05 {tilecc.loc = "m.py:2"} : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>
    %e = graph.exp %n {tilecc.loc = "m.py:3"} : tensor<8x16xf32>
    func.return %h, %n, %e : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
  }
  // @mlp: the layer norm only feeds the matmul, so it becomes the matmul's prologue
  // (A rows computed on chip); bias, GELU and the residual add from outside (after a
  // reshape that only adds a unit dim) form its epilogue.
  func.func @mlp(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<16xf32>, %g: tensor<16xf32>,
                 %beta: tensor<16xf32>, %res: tensor<1x8x16xf32>) -> tensor<1x8x16xf32> {
    %n = graph.layer_norm %x, %g, %beta normalized_ndim 1 eps 1.000000e-05 {tilecc.loc = "m.py:10"} : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>
    %m = graph.matmul %n, %w {tilecc.loc = "m.py:11"} : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
    %y = graph.add %m, %b {tilecc.loc = "m.py:11"} : tensor<8x16xf32>, tensor<16xf32> -> tensor<8x16xf32>
    %a = graph.gelu %y approximate "tanh" {tilecc.loc = "m.py:12"} : tensor<8x16xf32>
    %a3 = graph.reshape %a {tilecc.loc = "m.py:13"} : tensor<8x16xf32> -> tensor<1x8x16xf32>
    %o = graph.add %a3, %res {tilecc.loc = "m.py:13"} : tensor<1x8x16xf32>, tensor<1x8x16xf32> -> tensor<1x8x16xf32>
    func.return %o : tensor<1x8x16xf32>
  }
  // @gate_up: the layer norm's result is the A rows of two matmuls: it joins the first
  // one's group as its prologue, which yields it for the second (computed once).
  func.func @gate_up(%x: tensor<8x16xf32>, %wg: tensor<16x32xf32>, %wu: tensor<16x32xf32>, %g: tensor<16xf32>,
                     %beta: tensor<16xf32>) -> tensor<8x32xf32> {
    %n = graph.layer_norm %x, %g, %beta normalized_ndim 1 eps 1.000000e-05 {tilecc.loc = "m.py:20"} : tensor<8x16xf32>, tensor<16xf32>, tensor<16xf32> -> tensor<8x16xf32>
    %a = graph.matmul %n, %wg {tilecc.loc = "m.py:21"} : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    %u = graph.matmul %n, %wu {tilecc.loc = "m.py:22"} : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
    %o = graph.mul %a, %u {tilecc.loc = "m.py:23"} : tensor<8x32xf32>, tensor<8x32xf32> -> tensor<8x32xf32>
    func.return %o : tensor<8x32xf32>
  }

}

// CHECK-LABEL: func.func @rowwise
// CHECK:      %[[H:.*]], %[[N:.*]], %[[E:.*]] = graph.fused "rowwise"(%x, %r, %g, %beta) {tilecc.loc = "m.py:2"}
// CHECK-NEXT: ^{{.*}}(%[[X1:.*]]: tensor<8x16xf32>, %{{.*}}: tensor<8x16xf32>, %{{.*}}: tensor<16xf32>, %{{.*}}: tensor<16xf32>):
// CHECK-NEXT:   %[[H1:.*]] = graph.add %[[X1]]
// CHECK-NEXT:   %[[N1:.*]] = graph.layer_norm %[[H1]]
// CHECK-NEXT:   %[[E1:.*]] = graph.exp %[[N1]]
// CHECK-NEXT:   graph.yield %[[H1]], %[[N1]], %[[E1]] : tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
// CHECK:      func.return %[[H]], %[[N]], %[[E]]

// CHECK-LABEL: func.func @mlp
// CHECK:      %[[MM:.*]] = graph.fused "matmul"(%x, %g, %beta, %w, %b, %res) {tilecc.loc = "m.py:11"}
// CHECK-NEXT: ^{{.*}}(
// CHECK-NEXT:   graph.layer_norm
// CHECK-NEXT:   graph.matmul
// CHECK-NEXT:   graph.add
// CHECK-NEXT:   graph.gelu
// CHECK-NEXT:   graph.reshape
// CHECK-NEXT:   graph.add
// CHECK-NEXT:   graph.yield
// CHECK:      func.return %[[MM]] : tensor<1x8x16xf32>

// CHECK-LABEL: func.func @gate_up
// CHECK:      %[[N:.*]], %[[A:.*]] = graph.fused "matmul"(%x, %g, %beta, %wg) {tilecc.loc = "m.py:21"}
// CHECK:        %[[N1:.*]] = graph.layer_norm
// CHECK-NEXT:   %[[A1:.*]] = graph.matmul %[[N1]]
// CHECK-NEXT:   graph.yield %[[N1]], %[[A1]]
// CHECK:      %[[O:.*]] = graph.fused "matmul"(%[[N]], %wu, %[[A]])
// CHECK-NOT:    graph.layer_norm
// CHECK:        graph.matmul
// CHECK:      func.return %[[O]]
