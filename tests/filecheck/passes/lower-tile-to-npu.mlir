// RUN: tilecc-opt %s -p 'lower-tile-to-npu{target=tiny}' | filecheck %s

// A relu kernel over 20 x 8 rows in tiles of 16: the loop stays structured, the edge
// tile's size and the per-iteration addresses become affine expressions.
builtin.module {
  func.func @k0_relu(%0: memref<20x8xf32>, %1: memref<20x8xf32>) attributes {tile.kernel} {
    %c8 = arith.constant 8 : index
    %c20 = arith.constant 20 : index
    %c16 = arith.constant 16 : index
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %c0 = arith.constant 0 : index
    scf.for %i = %c0 to %c2 step %c1 {
      %r0 = arith.muli %i, %c16 : index
      %rem = arith.subi %c20, %r0 : index
      %r = arith.minsi %c16, %rem : index
      %in = tile.alloc {buffer = "in0", offset = 0 : i64} : memref<16x8xf32, #tile.space<"sram">>
      tile.load %0[%r0, %c0] into %in sizes(%r, %c8) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<20x8xf32>, memref<16x8xf32, #tile.space<"sram">>
      %out = tile.alloc {buffer = "out", offset = 64 : i64} : memref<16x8xf32, #tile.space<"sram">>
      tile.unary "relu" %in into %out sizes(%r, %c8) : memref<16x8xf32, #tile.space<"sram">>, memref<16x8xf32, #tile.space<"sram">>
      tile.store %out into %1[%r0, %c0] sizes(%r, %c8) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x8xf32, #tile.space<"sram">>, memref<20x8xf32>
    }
    func.return
  }
  func.func @main() -> memref<20x8xf32> {
    %x = tile.hbm_alloc {input = 0 : i64, offset = 0 : i64} : memref<20x8xf32>
    %y = tile.hbm_alloc {offset = 640 : i64} : memref<20x8xf32>
    func.call @k0_relu(%x, %y) : (memref<20x8xf32>, memref<20x8xf32>) -> ()
    func.return %y : memref<20x8xf32>
  }
}

// CHECK:      npu.kernel "k0_relu" {
// CHECK-NEXT:   npu.loop attributes {trip = 2 : i64} {
// CHECK-NEXT:     npu.dma_load {fields = {queue = 0 : i64, a_addr = "512*i0", a_dtype = 1 : i64, hbm_rs = 8 : i64, hbm_cs = 1 : i64, o_mem = 1 : i64, o_part = 0 : i64, o_addr = 0 : i64, o_dtype = 1 : i64, rows = "min(16, 20 - 16*i0)", cols = 8 : i64}, waits = [], reads = [], writes = ["in0"], hbm_arg = 0 : i64}
// CHECK-NEXT:     npu.vec_unary {fields = {func = 1 : i64, {{.*}} o_addr = 64 : i64, {{.*}}}, waits = [], reads = ["in0"], writes = ["out"]}
// CHECK-NEXT:     npu.dma_store {fields = {queue = 1 : i64, {{.*}} o_addr = "640 + 512*i0", {{.*}}}, waits = [], reads = ["out"], writes = [], hbm_arg = 1 : i64}
// CHECK-NOT:  func.func
