// RUN: tilecc-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Each npu verifier rejects its invalid IR with a message naming the op and the cause.

builtin.module {
  npu.kernel "k0" {
    npu.loop attributes {trip = 0 : i64} {
      npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["a"], writes = ["b"]}
    }
  }
}
// CHECK: npu.loop: trip count must be >= 1, got 0

// -----
builtin.module {
  npu.kernel "k0" {
    npu.vec_unary {fields = {func = 1 : i64, opcode = 3 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["a"], writes = ["b"]}
  }
}
// CHECK: npu.vec_unary: 'opcode' is not a settable instruction field

// -----
builtin.module {
  npu.kernel "k0" {
    npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = "4 * + i0", a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["a"], writes = ["b"]}
  }
}
// CHECK: npu.vec_unary: field a_addr: expected a number or i<N>, got '+' in '4 * + i0'

// -----
builtin.module {
  npu.kernel "k0" {
    npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["a"], writes = ["b"]}
  }
}
// CHECK: npu.vec_unary: missing fields o_mem, o_part, o_addr, o_dtype

// -----
builtin.module {
  npu.kernel "k0" {
    npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = ["s1 > 2"], reads = ["a"], writes = ["b"]}
  }
}
// CHECK: npu.vec_unary: bad wait 's1 > 2' (expected 's<N> >= <expr>')

// -----
builtin.module {
  npu.kernel "k0" {
    npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = ["s1 >= 2 *"], reads = ["a"], writes = ["b"]}
  }
}
// CHECK: npu.vec_unary: wait 's1 >= 2 *': expected a number or i<N>, got '<end>' in '2 *'
