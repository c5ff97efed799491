// RUN: tilecc-opt %s -p canonicalize-graph | filecheck %s

// HF Llama's apply_rotary_pos_emb as torch.export writes it: q's transposed view, q * cos,
// rotate_half(q) = cat(-q[..., 8:], q[..., :8]) times sin, added (here with the add's and the
// second mul's operands swapped). It becomes one graph.rope on the transposed view; the
// neg, concat, muls and add are erased. The second chain subtracts rotate_half(q) * sin
// (not the rotary embedding) and stays as written.
builtin.module {
  func.func @forward(%p: tensor<1x8x64xf32>, %cos: tensor<1x1x8x16xf32>, %sin: tensor<1x1x8x16xf32>) -> (tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32>) {
    %v = graph.reshape %p : tensor<1x8x64xf32> -> tensor<1x8x4x16xf32>
    %q = graph.permute %v [0, 2, 1, 3] : tensor<1x8x4x16xf32> -> tensor<1x4x8x16xf32>
    %a = graph.mul %q, %cos : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>
    %x1 = graph.slice %q dim 3 start 0 end 8 step 1 : tensor<1x4x8x16xf32> -> tensor<1x4x8x8xf32>
    %x2 = graph.slice %q dim 3 start 8 end 16 step 1 : tensor<1x4x8x16xf32> -> tensor<1x4x8x8xf32>
    %n = graph.neg %x2 : tensor<1x4x8x8xf32>
    %r = graph.concat %n, %x1 dim 3 : tensor<1x4x8x8xf32>, tensor<1x4x8x8xf32> -> tensor<1x4x8x16xf32>
    %b = graph.mul %sin, %r : tensor<1x1x8x16xf32>, tensor<1x4x8x16xf32> -> tensor<1x4x8x16xf32>
    %y = graph.add %b, %a {tilecc.loc = "modeling_llama.py:140"} : tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32> -> tensor<1x4x8x16xf32>
    %a2 = graph.mul %q, %cos : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>
    %n2 = graph.neg %x2 : tensor<1x4x8x8xf32>
    %r2 = graph.concat %n2, %x1 dim 3 : tensor<1x4x8x8xf32>, tensor<1x4x8x8xf32> -> tensor<1x4x8x16xf32>
    %b2 = graph.mul %r2, %sin : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>
    %z = graph.sub %a2, %b2 : tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32> -> tensor<1x4x8x16xf32>
    func.return %y, %z : tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32>
  }
}

// CHECK:      func.func @forward(%[[P:.*]]: tensor<1x8x64xf32>, %[[COS:.*]]: tensor<1x1x8x16xf32>, %[[SIN:.*]]: tensor<1x1x8x16xf32>)
// CHECK:        %[[Q:.*]] = graph.permute
// the second chain's q * cos, neg and concat equal the first chain's: common subexpressions
// keep the first ones (passes/graph/cse.py), which the second chain still reads
// CHECK-NEXT:   %[[A:.*]] = graph.mul %[[Q]], %[[COS]]
// CHECK:        graph.neg
// CHECK-NEXT:   %[[R:.*]] = graph.concat
// CHECK-NEXT:   %[[Y:.*]] = graph.rope %[[Q]], %[[COS]], %[[SIN]] {tilecc.loc = "modeling_llama.py:140"} : tensor<1x4x8x16xf32>, tensor<1x1x8x16xf32>, tensor<1x1x8x16xf32> -> tensor<1x4x8x16xf32>
// CHECK-NEXT:   %[[B:.*]] = graph.mul %[[R]], %[[SIN]]
// CHECK-NEXT:   %[[Z:.*]] = graph.sub %[[A]], %[[B]]
// CHECK-NEXT:   func.return %[[Y]], %[[Z]]
