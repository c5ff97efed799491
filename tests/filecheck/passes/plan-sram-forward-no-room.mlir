// RUN: tilecc-opt %s -p 'plan-sram{target=tiny resident=true forward=true}' | filecheck %s

// The two kernels of plan-sram-forward.mlir, and between them @k3, whose buffer takes
// 65,472 of tiny's 65,536 bytes per partition: the 64-byte slot for @k1's %o does not fit
// beside it, so nothing moves: @k1 keeps its store, @k2 its load, both buffers their
// kernels' own places (a remark counts the tile left in HBM).
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
  func.func @k3(%a: memref<16x32737xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c32737 = arith.constant 32737 : index
    %big = tile.alloc {buffer = "big"} : memref<16x32737xbf16, #tile.space<"sram">>
    tile.load %a[%c0, %c0] into %big sizes(%c16, %c32737) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x32737xbf16>, memref<16x32737xbf16, #tile.space<"sram">>
    tile.store %big into %a[%c0, %c0] sizes(%c16, %c32737) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x32737xbf16, #tile.space<"sram">>, memref<16x32737xbf16>
    func.return
  }
  func.func @main() -> memref<16x31xbf16> {
    %a = tile.hbm_alloc {input = 0 : i64} : memref<16x31xbf16>
    %h = tile.hbm_alloc : memref<16x31xbf16>
    %out = tile.hbm_alloc : memref<16x31xbf16>
    %big = tile.hbm_alloc : memref<16x32737xbf16>
    func.call @k1(%a, %h) : (memref<16x31xbf16>, memref<16x31xbf16>) -> ()
    func.call @k3(%big) : (memref<16x32737xbf16>) -> ()
    func.call @k2(%h, %out) : (memref<16x31xbf16>, memref<16x31xbf16>) -> ()
    func.return %out : memref<16x31xbf16>
  }
}

// CHECK-LABEL: func.func @k1
// CHECK:       tile.alloc {buffer = "in", offset = 0 : i64}
// CHECK-NEXT:  tile.alloc {buffer = "out", offset = 64 : i64}
// CHECK:       tile.store %o into %h
// CHECK-LABEL: func.func @k2
// CHECK:       tile.alloc {buffer = "x", offset = {{[0-9]+}} : i64}
// CHECK-NOT:   resident
// CHECK:       tile.load %h[%c0, %c0] into %x
// CHECK-LABEL: func.func @k3
