// RUN: tilecc-opt %s -p 'npu-insert-sync{target=tiny}' | filecheck %s
// RUN: tilecc-opt %s -p 'npu-insert-sync{target=cloud}' | filecheck %s --check-prefix=CLOUD

// load (dma0) -> relu (vector) -> store (dma1), one buffer each, in a loop of 2:
// RAW waits in the same iteration, WAR waits on the previous iteration.
builtin.module {
  npu.kernel "k0_relu" {
    npu.loop attributes {trip = 2 : i64} {
      npu.dma_load {fields = {queue = 0 : i64, a_addr = "512*i0", a_dtype = 1 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["in0"]}
      npu.vec_unary {fields = {func = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["in0"], writes = ["out"]}
      npu.dma_store {fields = {queue = 1 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 64 : i64, a_dtype = 1 : i64, o_addr = "2048 + 512*i0", o_dtype = 1 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = ["out"], writes = []}
    }
  }
  // Two convolution taps accumulating into acc, their operands on all four DMA queues,
  // and an epilogue reading acc. The second matmul depends on 5 producers (q0..q3 and
  // the WAR on acc after the previous epilogue), one more than an instruction can wait
  // on; but the first matmul, on the same queue, already waits for q0, q1 and the
  // epilogue with nothing of theirs in between, so those waits are implied.
  npu.kernel "k1_conv" {
    npu.loop attributes {trip = 2 : i64} {
      npu.dma_load {fields = {queue = 0 : i64, a_addr = "256*i0", a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 2 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["w"]}
      npu.dma_load {fields = {queue = 1 : i64, a_addr = "4096 + 256*i0", a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 2 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["s0"]}
      npu.dma_load {fields = {queue = 2 : i64, a_addr = "8192 + 256*i0", a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 128 : i64, o_dtype = 2 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["s1"]}
      npu.dma_load {fields = {queue = 3 : i64, a_addr = "12288 + 256*i0", a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 192 : i64, o_dtype = 2 : i64, rows = 16 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["w2"]}
      npu.matmul {fields = {a_mem = 1 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 2 : i64, b_mem = 1 : i64, b_part = 0 : i64, b_addr = 64 : i64, b_dtype = 2 : i64, o_mem = 2 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = 8 : i64, k = 16 : i64, cols = 8 : i64, flags = 0 : i64}, waits = [], reads = ["w", "s0", "acc"], writes = ["acc"]}
      npu.matmul {fields = {a_mem = 1 : i64, a_part = 0 : i64, a_addr = 192 : i64, a_dtype = 2 : i64, b_mem = 1 : i64, b_part = 0 : i64, b_addr = 128 : i64, b_dtype = 2 : i64, o_mem = 2 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = 8 : i64, k = 16 : i64, cols = 8 : i64, flags = 1 : i64}, waits = [], reads = ["w", "s0", "s1", "w2", "acc"], writes = ["acc"]}
      npu.vec_unary {fields = {func = 1 : i64, a_mem = 2 : i64, a_part = 0 : i64, a_addr = 0 : i64, a_dtype = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 256 : i64, o_dtype = 2 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = ["acc"], writes = ["out"]}
      npu.dma_store {fields = {queue = 3 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 256 : i64, a_dtype = 2 : i64, o_addr = "16384 + 128*i0", o_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = ["out"], writes = []}
    }
  }
  // An instruction that needs producers on all five other queues and none of whose
  // waits is implied: the wait on q0 is chained through the matmul (which now waits for
  // the load of a; no execution of that load runs between the matmul and the add).
  npu.kernel "k2_five" {
    npu.dma_load {fields = {queue = 0 : i64, a_addr = 0 : i64, a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 2 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["a"]}
    npu.dma_load {fields = {queue = 1 : i64, a_addr = 128 : i64, a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 64 : i64, o_dtype = 2 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["b"]}
    npu.dma_load {fields = {queue = 2 : i64, a_addr = 256 : i64, a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 128 : i64, o_dtype = 2 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["c"]}
    npu.dma_load {fields = {queue = 3 : i64, a_addr = 384 : i64, a_dtype = 2 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 192 : i64, o_dtype = 2 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = [], writes = ["d"]}
    npu.matmul {fields = {a_mem = 1 : i64, a_part = 0 : i64, a_addr = 256 : i64, a_dtype = 2 : i64, b_mem = 1 : i64, b_part = 0 : i64, b_addr = 256 : i64, b_dtype = 2 : i64, o_mem = 2 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = 8 : i64, k = 8 : i64, cols = 8 : i64, flags = 0 : i64}, waits = [], reads = ["e"], writes = ["acc"]}
    npu.vec_binary {fields = {func = 0 : i64, flags = 0 : i64, a_mem = 1 : i64, a_part = 0 : i64, a_addr = 128 : i64, a_dtype = 2 : i64, b_mem = 1 : i64, b_part = 0 : i64, b_addr = 192 : i64, b_dtype = 2 : i64, o_mem = 2 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = 8 : i64, cols = 8 : i64}, waits = [], reads = ["a", "b", "c", "d", "acc"], writes = ["acc"]}
  }
}

// The load waits for the relu of the previous iteration to have read in0 (WAR):
// CHECK:      npu.dma_load {{.*}} waits = ["s0 >= i0"], reads = [], writes = ["in0"], signal = 1 : i64}
// The relu waits for this iteration's load (RAW) and the previous store (WAR on out):
// CHECK-NEXT: npu.vec_unary {{.*}} waits = ["s1 >= 1 + i0", "s2 >= i0"], reads = ["in0"], writes = ["out"], signal = 0 : i64}
// The store waits for this iteration's relu (RAW):
// CHECK-NEXT: npu.dma_store {{.*}} waits = ["s0 >= 1 + i0"], reads = ["out"], writes = [], signal = 2 : i64}

// Transitive reduction (cloud: 4 DMA queues). The loads wait for the last reader of
// their buffer in the previous iteration (WAR), except the load of w2: the store on
// its queue in the previous iteration already waited (through the epilogue) for the
// second matmul.
// CLOUD-LABEL: npu.kernel "k1_conv"
// CLOUD:      npu.dma_load {{.*}} waits = ["s0 >= i0"], reads = [], writes = ["w"], signal = 1 : i64}
// CLOUD-NEXT: npu.dma_load {{.*}} waits = ["s0 >= i0"], reads = [], writes = ["s0"], signal = 2 : i64}
// CLOUD-NEXT: npu.dma_load {{.*}} waits = ["s0 >= i0"], reads = [], writes = ["s1"], signal = 4 : i64}
// CLOUD-NEXT: npu.dma_load {{.*}} waits = [], reads = [], writes = ["w2"], signal = 5 : i64}
// The first matmul: w (q0), s0 (q1) of this iteration, the epilogue of the previous one.
// CLOUD-NEXT: npu.matmul {{.*}} waits = ["s1 >= 1 + i0", "s2 >= 1 + i0", "s3 >= i0"], reads = ["w", "s0", "acc"], writes = ["acc"]}
// The second: only s1 (q2) and w2 (q3); the other three are implied by the first.
// CLOUD-NEXT: npu.matmul {{.*}} waits = ["s4 >= 1 + i0", "s5 >= 1 + i0"], reads = ["w", "s0", "s1", "w2", "acc"], writes = ["acc"], signal = 0 : i64}
// CLOUD-NEXT: npu.vec_unary {{.*}} waits = ["s0 >= 1 + i0"], reads = ["acc"], writes = ["out"], signal = 3 : i64}
// CLOUD-NEXT: npu.dma_store {{.*}} waits = ["s3 >= 1 + i0"], reads = ["out"], writes = []}

// Restructuring: the add keeps 4 waits (b, c, d, acc); the matmul waits for a.
// CLOUD-LABEL: npu.kernel "k2_five"
// CLOUD:      npu.matmul {{.*}} waits = ["s0 >= 1"], reads = ["e"], writes = ["acc"], signal = 4 : i64}
// CLOUD-NEXT: npu.vec_binary {{.*}} waits = ["s1 >= 1", "s2 >= 1", "s3 >= 1", "s4 >= 1"], reads = ["a", "b", "c", "d", "acc"], writes = ["acc"]}
