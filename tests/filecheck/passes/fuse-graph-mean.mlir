// RUN: tilecc-opt %s -p fuse-graph | filecheck %s

builtin.module {
  // @head: a CNN's classifier head at batch 1. The global average pool produces the
  // one-row matmul's A row (through the flatten), so it joins the matmul's group as
  // its prologue (the GEMV kernel sums the map into the row on chip); the bias add is
  // the epilogue. One group, no mean kernel before it.
  func.func @head(%x: tensor<1x64x7x7xf32>, %w: tensor<64x10xf32>, %b: tensor<10xf32>) -> tensor<1x10xf32> {
    %m = graph.mean %x dims [2, 3] keepdim true {tilecc.loc = "m.py:1"} : tensor<1x64x7x7xf32> -> tensor<1x64x1x1xf32>
    %r = graph.reshape %m {tilecc.loc = "m.py:2"} : tensor<1x64x1x1xf32> -> tensor<1x64xf32>
    %y = graph.matmul %r, %w {tilecc.loc = "m.py:3"} : tensor<1x64xf32>, tensor<64x10xf32> -> tensor<1x10xf32>
    %o = graph.add %y, %b {tilecc.loc = "m.py:3"} : tensor<1x10xf32>, tensor<10xf32> -> tensor<1x10xf32>
    func.return %o : tensor<1x10xf32>
  }
  // @batch2: two images: the matmul has two rows, so the pool stays an op of its own
  // (a reduction kernel) and only the bias add joins the matmul.
  func.func @batch2(%x: tensor<2x64x7x7xf32>, %w: tensor<64x10xf32>, %b: tensor<10xf32>) -> tensor<2x10xf32> {
    %m = graph.mean %x dims [2, 3] keepdim true {tilecc.loc = "m.py:10"} : tensor<2x64x7x7xf32> -> tensor<2x64x1x1xf32>
    %r = graph.reshape %m {tilecc.loc = "m.py:11"} : tensor<2x64x1x1xf32> -> tensor<2x64xf32>
    %y = graph.matmul %r, %w {tilecc.loc = "m.py:12"} : tensor<2x64xf32>, tensor<64x10xf32> -> tensor<2x10xf32>
    %o = graph.add %y, %b {tilecc.loc = "m.py:12"} : tensor<2x10xf32>, tensor<10xf32> -> tensor<2x10xf32>
    func.return %o : tensor<2x10xf32>
  }
  // @channel_mean: a mean over the channels is no spatial pool: not a prologue.
  func.func @channel_mean(%x: tensor<1x7x7x64xf32>, %w: tensor<7x10xf32>) -> tensor<1x7x10xf32> {
    %m = graph.mean %x dims [3] keepdim false {tilecc.loc = "m.py:20"} : tensor<1x7x7x64xf32> -> tensor<1x7x7xf32>
    %y = graph.matmul %m, %w {tilecc.loc = "m.py:21"} : tensor<1x7x7xf32>, tensor<7x10xf32> -> tensor<1x7x10xf32>
    %o = graph.relu %y {tilecc.loc = "m.py:22"} : tensor<1x7x10xf32>
    func.return %o : tensor<1x7x10xf32>
  }
}

// CHECK-LABEL: func.func @head
// CHECK-NOT:  graph.mean %x
// CHECK:      %[[G:.*]] = graph.fused "matmul"(%x, %w, %b) {tilecc.loc = "m.py:3"}
// CHECK-NEXT: ^{{.*}}(%[[X1:.*]]: tensor<1x64x7x7xf32>, %{{.*}}: tensor<64x10xf32>, %{{.*}}: tensor<10xf32>):
// CHECK-NEXT:   %[[M1:.*]] = graph.mean %[[X1]] dims [2, 3] keepdim true
// CHECK-NEXT:   %[[R1:.*]] = graph.reshape %[[M1]]
// CHECK-NEXT:   %[[Y1:.*]] = graph.matmul %[[R1]]
// CHECK-NEXT:   %[[O1:.*]] = graph.add %[[Y1]]
// CHECK-NEXT:   graph.yield %[[O1]] : tensor<1x10xf32>
// CHECK:      func.return %[[G]] : tensor<1x10xf32>

// CHECK-LABEL: func.func @batch2
// CHECK:      %[[M:.*]] = graph.mean %x dims [2, 3] keepdim true
// CHECK:      graph.fused "matmul"
// CHECK-NOT:    graph.mean
// CHECK:        graph.matmul
// CHECK-NEXT:   graph.add
// CHECK-NEXT:   graph.yield

// CHECK-LABEL: func.func @channel_mean
// CHECK:      graph.mean %x dims [3] keepdim false
// CHECK:      graph.fused "matmul"
// CHECK-NOT:    graph.mean
// CHECK:        graph.matmul
