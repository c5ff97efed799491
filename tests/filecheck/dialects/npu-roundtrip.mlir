// RUN: tilecc-opt %s | tilecc-opt | filecheck %s
// RUN: tilecc-opt %s --print-op-generic | tilecc-opt | filecheck %s

// npu kernels keep loops structured; fields are constants or affine expressions.
builtin.module {
  npu.kernel "k0" {
    npu.loop attributes {trip = 3 : i64} {
      npu.dma_load {fields = {queue = 0 : i64, a_addr = "4096 + 212*i0", a_dtype = 2 : i64, hbm_rs = 53 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 2 : i64, rows = "min(16, 37 - 16*i0)", cols = 53 : i64}, waits = ["s1 >= i0"], reads = [], writes = ["x"], signal = 0 : i64}
      npu.vec_binary {fields = {func = 2 : i64, flags = 4 : i64, imm = 5.000000e-01 : f32, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 2 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 128 : i64, o_dtype = 2 : i64, rows = "min(16, 37 - 16*i0)", cols = 53 : i64}, waits = ["s0 >= 1 + i0"], reads = ["x"], writes = ["y"], signal = 1 : i64}
    }
  }
}

// CHECK:      npu.kernel "k0" {
// CHECK-NEXT:   npu.loop attributes {trip = 3 : i64} {
// CHECK-NEXT:     npu.dma_load {fields = {{{.*}}a_addr = "4096 + 212*i0"{{.*}}rows = "min(16, 37 - 16*i0)"{{.*}}}, waits = ["s1 >= i0"], reads = [], writes = ["x"], signal = 0 : i64}
// CHECK-NEXT:     npu.vec_binary {fields = {{{.*}}imm = 5.000000e-01 : f32{{.*}}}, waits = ["s0 >= 1 + i0"], reads = ["x"], writes = ["y"], signal = 1 : i64}
