// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true forward=true}' | filecheck %s

// @k1 stores the two column blocks of %h from two buffers; @k2 loads all of %h at once.
// The two buffers go side by side into one slot (%lo at its start, %hi 16 bf16 columns =
// 32 bytes on), @k2's buffer reads them as one, and both stores and the load go.
builtin.module {
  func.func @k1(%a: memref<16x32xbf16>, %h: memref<16x32xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c32 = arith.constant 32 : index
    %i = tile.alloc {buffer = "in"} : memref<16x32xbf16, #tile.space<"sram">>
    %lo = tile.alloc {buffer = "lo"} : memref<16x16xbf16, #tile.space<"sram">>
    %hi = tile.alloc {buffer = "hi"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %a[%c0, %c0] into %i sizes(%c16, %c32) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x32xbf16>, memref<16x32xbf16, #tile.space<"sram">>
    %i0 = tile.subview %i[%c0, %c0] : memref<16x32xbf16, #tile.space<"sram">> to memref<16x16xbf16, #tile.space<"sram">>
    %i1 = tile.subview %i[%c0, %c16] : memref<16x32xbf16, #tile.space<"sram">> to memref<16x16xbf16, #tile.space<"sram">>
    tile.scalar "mul" %i0, 2.0 : f32 into %lo sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.scalar "mul" %i1, 3.0 : f32 into %hi sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %lo into %h[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<16x32xbf16>
    tile.store %hi into %h[%c0, %c16] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<16x32xbf16>
    func.return
  }
  func.func @k2(%h: memref<16x32xbf16>, %out: memref<16x32xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c32 = arith.constant 32 : index
    %x = tile.alloc {buffer = "x"} : memref<16x32xbf16, #tile.space<"sram">>
    %y = tile.alloc {buffer = "y"} : memref<16x32xbf16, #tile.space<"sram">>
    tile.load %h[%c0, %c0] into %x sizes(%c16, %c32) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x32xbf16>, memref<16x32xbf16, #tile.space<"sram">>
    tile.unary "relu" %x into %y sizes(%c16, %c32) : memref<16x32xbf16, #tile.space<"sram">>, memref<16x32xbf16, #tile.space<"sram">>
    tile.store %y into %out[%c0, %c0] sizes(%c16, %c32) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x32xbf16, #tile.space<"sram">>, memref<16x32xbf16>
    func.return
  }
  func.func @main() -> memref<16x32xbf16> {
    %a = tile.hbm_alloc {input = 0 : i64} : memref<16x32xbf16>
    %h = tile.hbm_alloc : memref<16x32xbf16>
    %out = tile.hbm_alloc : memref<16x32xbf16>
    func.call @k1(%a, %h) : (memref<16x32xbf16>, memref<16x32xbf16>) -> ()
    func.call @k2(%h, %out) : (memref<16x32xbf16>, memref<16x32xbf16>) -> ()
    func.return %out : memref<16x32xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {buffer = "in", offset = 0 : i64}
// CHECK-NEXT:  tile.alloc {resident = "fw0", buffer = "lo", offset = 65472 : i64}
// CHECK-NEXT:  tile.alloc {resident = "fw0", buffer = "hi", offset = 65504 : i64}
// CHECK-NOT:   tile.store
// CHECK:       func.return
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {resident = "fw0", buffer = "x", offset = 65472 : i64}
// CHECK-NOT:   tile.load
// CHECK:       tile.unary "relu" %x into %y
