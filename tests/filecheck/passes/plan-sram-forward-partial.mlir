// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true forward=true}' | filecheck %s

// @k1 computes the two row tiles of %h in one buffer in turn, storing each; @k2 loads
// both. Only the second tile is still in the buffer when @k1 ends: @k2's second load
// reads it in place, and its store goes too (the one load left through HBM reads the
// first tile's rows, which that store does not touch); the first tile keeps its store
// and its load.
builtin.module {
  func.func @k1(%a: memref<32x16xbf16>, %h: memref<32x16xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %i = tile.alloc {buffer = "in"} : memref<16x16xbf16, #tile.space<"sram">>
    %o = tile.alloc {buffer = "out"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %a[%c0, %c0] into %i sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<32x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.scalar "mul" %i, 2.0 : f32 into %o sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %o into %h[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<32x16xbf16>
    tile.load %a[%c16, %c0] into %i sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<32x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.scalar "mul" %i, 2.0 : f32 into %o sizes(%c16, %c16) : memref<16x16xbf16, #tile.space<"sram">>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %o into %h[%c16, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<32x16xbf16>
    func.return
  }
  func.func @k2(%h: memref<32x16xbf16>, %out: memref<32x16xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %x0 = tile.alloc {buffer = "x0"} : memref<16x16xbf16, #tile.space<"sram">>
    %x1 = tile.alloc {buffer = "x1"} : memref<16x16xbf16, #tile.space<"sram">>
    tile.load %h[%c0, %c0] into %x0 sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<32x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.load %h[%c16, %c0] into %x1 sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<32x16xbf16>, memref<16x16xbf16, #tile.space<"sram">>
    tile.store %x0 into %out[%c0, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<32x16xbf16>
    tile.store %x1 into %out[%c16, %c0] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x16xbf16, #tile.space<"sram">>, memref<32x16xbf16>
    func.return
  }
  func.func @main() -> memref<32x16xbf16> {
    %a = tile.hbm_alloc {input = 0 : i64} : memref<32x16xbf16>
    %h = tile.hbm_alloc : memref<32x16xbf16>
    %out = tile.hbm_alloc : memref<32x16xbf16>
    func.call @k1(%a, %h) : (memref<32x16xbf16>, memref<32x16xbf16>) -> ()
    func.call @k2(%h, %out) : (memref<32x16xbf16>, memref<32x16xbf16>) -> ()
    func.return %out : memref<32x16xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {resident = "fw0", buffer = "out"
// CHECK:       tile.store %o into %h[%c0, %c0]
// CHECK-NOT:   tile.store
// CHECK:       func.return
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {buffer = "x0"
// CHECK-NEXT:  tile.alloc {resident = "fw0", buffer = "x1"
// CHECK-NEXT:  tile.load %h[%c0, %c0] into %x0
// CHECK-NEXT:  tile.store %x0 into %out[%c0, %c0]
// CHECK-NEXT:  tile.store %x1 into %out[%c16, %c0]
