// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true forward=true}' | filecheck %s

// A copy kernel between: @k2 loads @k1's tile and stores it again, @k3 loads the copy.
// @k2's buffer reads @k1's slot; @k3's load, whose producer buffer is that consumer, reads
// the same slot (which then lives until @k3), instead of @k2's buffer moving to a second
// slot, which would leave it without the tile. Every store and load of %h and %h2 goes.
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
  func.func @k2(%h: memref<16x16xbf16>, %h2: memref<16x16xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %x = tile.alloc {buffer = "x"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %h[%c0, %c0] into %x sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %x into %h2[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16>
    func.return
  }
  func.func @k3(%h2: memref<16x16xbf16>, %out: memref<16x16xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %y = tile.alloc {buffer = "y"} : memref<16x16xbf16, #tile.space<"sram">>
    %z = tile.alloc {buffer = "z"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %h2[%c0, %c0] into %y sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.unary "relu" %y into %z sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %z into %out[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16>
    func.return
  }
  func.func @main() -> memref<16x16xbf16> {
    %a = tile.hbm_alloc {input = 0 : i64} : memref<16x16xbf16>
    %h = tile.hbm_alloc : memref<16x16xbf16>
    %h2 = tile.hbm_alloc : memref<16x16xbf16>
    %out = tile.hbm_alloc : memref<16x16xbf16>
    func.call @k1(%a, %h) : (memref<16x16xbf16>, memref<16x16xbf16>) -> ()
    func.call @k2(%h, %h2) : (memref<16x16xbf16>, memref<16x16xbf16>) -> ()
    func.call @k3(%h2, %out) : (memref<16x16xbf16>, memref<16x16xbf16>) -> ()
    func.return %out : memref<16x16xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {resident = "fw0", buffer = "out", offset = [[OFF:[0-9]+]] : i64}
// CHECK-NOT:   tile.store
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {resident = "fw0", buffer = "x", offset = [[OFF]] : i64}
// CHECK-NOT:   tile.load
// CHECK-NOT:   tile.store
// CHECK-LABEL: func.func @k3
// CHECK:       tile.alloc {resident = "fw0", buffer = "y", offset = [[OFF]] : i64}
// CHECK-NOT:   tile.load
// CHECK:       tile.unary "relu" %y into %z
