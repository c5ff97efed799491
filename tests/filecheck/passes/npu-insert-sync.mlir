// RUN: tilecc-opt %s -p 'npu-insert-sync{target=tiny}' | filecheck %s

// load (dma0) -> relu (vector) -> store (dma1), one buffer each, in a loop of 2:
// RAW waits in the same iteration, WAR waits on the previous iteration.
builtin.module {
  npu.kernel "k0_relu" {
    npu.loop attributes {trip = 2 : i64} {
      npu.dma_load {fields = {queue = 0 : i64, a_addr = "512*i0", a_dtype = 1 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["in0"]}
      npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["in0"], writes = ["out"]}
      npu.dma_store {fields = {queue = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 64 : i64, a_dtype = 1 : i64, o_addr = "640 + 512*i0", o_dtype = 1 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["out"], writes = []}
    }
  }
}

// The load waits for the relu of the previous iteration to have read in0 (WAR):
// CHECK:      npu.dma_load {{.*}} waits = ["s0 >= i0"], reads = [], writes = ["in0"], signal = 1 : i64}
// The relu waits for this iteration's load (RAW) and the previous store (WAR on out):
// CHECK-NEXT: npu.vec_unary {{.*}} waits = ["s1 >= 1 + i0", "s2 >= i0"], reads = ["in0"], writes = ["out"], signal = 0 : i64}
// The store waits for this iteration's relu (RAW):
// CHECK-NEXT: npu.dma_store {{.*}} waits = ["s0 >= 1 + i0"], reads = ["out"], writes = [], signal = 2 : i64}
