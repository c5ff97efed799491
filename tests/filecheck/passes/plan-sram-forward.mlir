// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true forward=true}' | filecheck %s

// @k1 computes %o and stores it to %h; @k2 loads %h into %x and only reads %x after: the
// two buffers move to one slot at the top of SRAM (tiny: 65,536 bytes per partition, the
// slot 62 bytes, 64 aligned), @k2 reads @k1's buffer in place, and since nothing else
// loads %h (and it is not returned) @k1's store goes too. @k2's %y is stored to the
// program's output and stays the kernel's own.
builtin.module {
  func.func @k1(%a: memref<16x31xbf16>, %h: memref<16x31xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %i = tile.alloc {buffer = "in"} : memref<16x31xbf16, #tile.space<"sram">>
    %o = tile.alloc {buffer = "out"} : memref<16x31xbf16, #tile.space<"sram">>
    tile.load %a[%c0, %c0] into %i sizes(%c16, %c31) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x31xbf16>, memref<16x31xbf16, #tile.space<"sram">>
    tile.scalar "mul" %i, 2.0 : f32 into %o sizes(%c16, %c31) : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>
    tile.store %o into %h[%c0, %c0] sizes(%c16, %c31) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16>
    func.return
  }
  func.func @k2(%h: memref<16x31xbf16>, %out: memref<16x31xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %x = tile.alloc {buffer = "x"} : memref<16x31xbf16, #tile.space<"sram">>
    %y = tile.alloc {buffer = "y"} : memref<16x31xbf16, #tile.space<"sram">>
    tile.load %h[%c0, %c0] into %x sizes(%c16, %c31) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x31xbf16>, memref<16x31xbf16, #tile.space<"sram">>
    tile.unary "relu" %x into %y sizes(%c16, %c31) : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>
    tile.store %y into %out[%c0, %c0] sizes(%c16, %c31) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16>
    func.return
  }
  func.func @main() -> memref<16x31xbf16> {
    %a = tile.hbm_alloc {input = 0 : i64} : memref<16x31xbf16>
    %h = tile.hbm_alloc : memref<16x31xbf16>
    %out = tile.hbm_alloc : memref<16x31xbf16>
    func.call @k1(%a, %h) : (memref<16x31xbf16>, memref<16x31xbf16>) -> ()
    func.call @k2(%h, %out) : (memref<16x31xbf16>, memref<16x31xbf16>) -> ()
    func.return %out : memref<16x31xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {buffer = "in", offset = 0 : i64}
// CHECK-NEXT:  tile.alloc {resident = "fw0", buffer = "out", offset = 65472 : i64}
// CHECK-NEXT:  tile.load %a[%c0, %c0] into %i
// CHECK-NEXT:  tile.scalar "mul" %i, 2.000000e+00 : f32 into %o
// CHECK-NEXT:  func.return
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {resident = "fw0", buffer = "x", offset = 65472 : i64}
// CHECK-NEXT:  tile.alloc {buffer = "y", offset = 64 : i64}
// CHECK-NEXT:  tile.unary "relu" %x into %y
// CHECK-NEXT:  tile.store %y into %out
