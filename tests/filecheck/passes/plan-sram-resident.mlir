// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true}' | filecheck %s

// Two kernels fill a buffer from the same constant and only read it afterwards: the
// buffer moves to a slot at the top of SRAM (tiny: 65,536 bytes per partition) and only
// the first launch loads it. %w is written in place by @k1, so it stays the kernel's own,
// and so does @k2's %v: only @k2 fills a buffer from %z2 (a slot would save no load).
builtin.module {
  func.func @k1(%z: memref<64xbf16>, %y: memref<16x31xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %b = tile.alloc {buffer = "zeros"} : memref<16x31xbf16, #tile.space<"sram">>
    %o = tile.alloc {buffer = "out"} : memref<16x31xbf16, #tile.space<"sram">>
    %w = tile.alloc {buffer = "scratch"} : memref<16x31xbf16, #tile.space<"sram">>
    tile.load %z[%c0] into %b sizes(%c16, %c31) {row_dim = -1 : i64, col_dim = 0 : i64} : memref<64xbf16>, memref<16x31xbf16, #tile.space<"sram">>
    tile.load %z[%c0] into %w sizes(%c16, %c31) {row_dim = -1 : i64, col_dim = 0 : i64} : memref<64xbf16>, memref<16x31xbf16, #tile.space<"sram">>
    tile.scalar "mul" %w, 2.0 : f32 into %w sizes(%c16, %c31) : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>
    tile.binary "add" %b, %w into %o sizes(%c16, %c31) {rhs_mode = "tile"} : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>
    tile.store %o into %y[%c0, %c0] sizes(%c16, %c31) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16>
    func.return
  }
  func.func @k2(%z: memref<64xbf16>, %z2: memref<64xbf16>, %y: memref<16x31xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c31 = arith.constant 31 : index
    %o = tile.alloc {buffer = "out"} : memref<16x31xbf16, #tile.space<"sram">>
    %b = tile.alloc {buffer = "zeros"} : memref<16x31xbf16, #tile.space<"sram">>
    %v = tile.alloc {buffer = "ones"} : memref<16x31xbf16, #tile.space<"sram">>
    tile.load %z[%c0] into %b sizes(%c16, %c31) {row_dim = -1 : i64, col_dim = 0 : i64} : memref<64xbf16>, memref<16x31xbf16, #tile.space<"sram">>
    tile.load %z2[%c0] into %v sizes(%c16, %c31) {row_dim = -1 : i64, col_dim = 0 : i64} : memref<64xbf16>, memref<16x31xbf16, #tile.space<"sram">>
    tile.binary "add" %b, %v into %o sizes(%c16, %c31) {rhs_mode = "tile"} : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16, #tile.space<"sram">>
    tile.store %o into %y[%c0, %c0] sizes(%c16, %c31) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x31xbf16, #tile.space<"sram">>, memref<16x31xbf16>
    func.return
  }
  func.func @main() -> memref<16x31xbf16> {
    %z = tile.hbm_alloc {value = dense<0.0> : tensor<64xbf16>} : memref<64xbf16>
    %z2 = tile.hbm_alloc {value = dense<1.0> : tensor<64xbf16>} : memref<64xbf16>
    %y1 = tile.hbm_alloc : memref<16x31xbf16>
    %y2 = tile.hbm_alloc : memref<16x31xbf16>
    func.call @k1(%z, %y1) : (memref<64xbf16>, memref<16x31xbf16>) -> ()
    func.call @k2(%z, %z2, %y2) : (memref<64xbf16>, memref<64xbf16>, memref<16x31xbf16>) -> ()
    func.return %y2 : memref<16x31xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {resident = "rc0", buffer = "zeros", offset = 65472 : i64}
// CHECK-NEXT:  tile.alloc {buffer = "out", offset = 0 : i64}
// CHECK-NEXT:  tile.alloc {buffer = "scratch", offset = 64 : i64}
// CHECK-NEXT:  tile.load %z[%c0] into %b sizes
// CHECK-NEXT:  tile.load %z[%c0] into %w sizes
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {buffer = "out", offset = 128 : i64}
// CHECK-NEXT:  tile.alloc {resident = "rc0", buffer = "zeros", offset = 65472 : i64}
// CHECK-NEXT:  tile.alloc {buffer = "ones", offset = 192 : i64}
// CHECK-NEXT:  tile.load %z2[%c0] into %v sizes
// CHECK-NEXT:  tile.binary "add" %b, %v
