// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true forward=true}' | filecheck %s

// @k2 loads the 16 columns @k1 stored into the first columns of a 48-column buffer (it
// reads only those): the buffer aliases @k1's, and the slot reserves the consumer's 96
// bytes per partition (128 aligned), not just the producer's 32, so no other slot or
// kernel lands on the columns past the tile.
builtin.module {
  func.func @k1(%a: memref<16x16xbf16>, %h: memref<16x16xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %i = tile.alloc {buffer = "in"} : memref<16x16xbf16, #tile.space<"sram">>
    %o = tile.alloc {buffer = "out"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %a[%c0, %c0] into %i sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.scalar "mul" %i, 2.0 : f32 into %o sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %o into %h[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16>
    func.return
  }
  func.func @k2(%h: memref<16x16xbf16>, %out: memref<16x16xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %x = tile.alloc {buffer = "x"} : memref<16x48xbf16, #tile.space<"sram">>
    %y = tile.alloc {buffer = "y"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %h[%c0, %c0] into %x sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16>, memref<16x48xbf16, #tile.space<"sram">>
    %x0 = tile.subview %x[%c0, %c0] : memref<16x48xbf16, #tile.space<"sram">> to memref<16x16xbf16, #tile.space<"sram">>
    tile.unary "relu" %x0 into %y sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %y into %out[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16>
    func.return
  }
  func.func @main() -> memref<16x16xbf16> {
    %a = tile.hbm_alloc {input = 0 : i64} : memref<16x16xbf16>
    %h = tile.hbm_alloc : memref<16x16xbf16>
    %out = tile.hbm_alloc : memref<16x16xbf16>
    func.call @k1(%a, %h) : (memref<16x16xbf16>, memref<16x16xbf16>) -> ()
    func.call @k2(%h, %out) : (memref<16x16xbf16>, memref<16x16xbf16>) -> ()
    func.return %out : memref<16x16xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {resident = "fw0", buffer = "out", offset = 65408 : i64}
// CHECK-NOT:   tile.store
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {resident = "fw0", buffer = "x", offset = 65408 : i64}
// CHECK-NEXT:  tile.alloc {buffer = "y", offset = {{[0-9]+}} : i64}
// CHECK-NOT:   tile.load
