// RUN: tilecc-opt %s | tilecc-opt | filecheck %s
// RUN: tilecc-opt %s --print-op-generic | tilecc-opt | filecheck %s

// Every tile op prints in its custom form and parses back.
builtin.module {
  func.func @k(%x: memref<37x53xbf16>, %y: memref<37x53xbf16>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %t = arith.constant true
    %a = tile.alloc {buffer = "a"} : memref<16x64xbf16, #tile.space<"sram">>
    %f = tile.alloc {buffer = "f"} : memref<16x64xf32, #tile.space<"sram">>
    %col = tile.alloc {buffer = "col"} : memref<16x1xf32, #tile.space<"sram">>
    %acc = tile.alloc {buffer = "acc"} : memref<16x64xf32, #tile.space<"acc">>
    tile.load %x[%c0, %c0] into %a sizes(%c16, %c16) {row_dim = 1 : i64, col_dim = -1 : i64} : memref<37x53xbf16>, memref<16x64xbf16, #tile.space<"sram">>
    tile.matmul %a, %a into %acc sizes(%c16, %c16, %c16) accumulate(%t) : memref<16x64xbf16, #tile.space<"sram">>, memref<16x64xbf16, #tile.space<"sram">>, memref<16x64xf32, #tile.space<"acc">>
    tile.unary "gelu" %acc into %f sizes(%c16, %c16) : memref<16x64xf32, #tile.space<"acc">>, memref<16x64xf32, #tile.space<"sram">>
    tile.reduce "max" %f into %col sizes(%c16, %c16) : memref<16x64xf32, #tile.space<"sram">>, memref<16x1xf32, #tile.space<"sram">>
    tile.binary "sub" %f, %col into %f sizes(%c16, %c16) {rhs_mode = "column"} : memref<16x64xf32, #tile.space<"sram">>, memref<16x1xf32, #tile.space<"sram">>, memref<16x64xf32, #tile.space<"sram">>
    tile.scalar "div" %f, 2.5 : f32 into %a sizes(%c16, %c16) {swap} : memref<16x64xf32, #tile.space<"sram">>, memref<16x64xbf16, #tile.space<"sram">>
    tile.store %a into %y[%c0, %c16] sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x64xbf16, #tile.space<"sram">>, memref<37x53xbf16>
    func.return
  }
}

// CHECK:      tile.load %{{.*}}[%{{.*}}, %{{.*}}] into %{{.*}} sizes(%{{.*}}, %{{.*}}) {row_dim = 1 : i64, col_dim = -1 : i64}
// CHECK:      tile.matmul {{.*}} accumulate(%{{.*}})
// CHECK:      tile.unary "gelu"
// CHECK:      tile.reduce "max"
// CHECK:      tile.binary "sub" {{.*}} {rhs_mode = "column"}
// CHECK:      tile.scalar "div" %{{.*}}, 2.500000e+00 : f32 into {{.*}} {swap}
// CHECK:      tile.store
