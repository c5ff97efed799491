// RUN: tilecc-opt %s --split-input-file --verify-diagnostics | filecheck %s

// Each tile verifier rejects its invalid IR with a message naming the op and the cause.
// (tile.matmul's "accumulate must be i1" is unreachable from text: its custom form
// types the operand i1.)

builtin.module {
  func.func @k() attributes {tile.kernel} {
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"l2">>
    func.return
  }
}
// CHECK: unknown memory space "l2" (expected "sram" or "acc")

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32>
    func.return
  }
}
// CHECK: tile.alloc: result must live in sram or acc, got hbm (memref<16x64xf32>)

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %a = tile.alloc {buffer = "a"} : memref<2x16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.alloc: on-chip result must be 2-D, got memref<2x16x64xf32, #tile.space<"sram">>

// -----
builtin.module {
  func.func @main() {
    %x = tile.hbm_alloc {input = 0 : i64} : memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.hbm_alloc: result must live in hbm, got sram

// -----
builtin.module {
  func.func @main() {
    %x = tile.hbm_alloc : memref<16x64xf32>
    %v = tile.view %x : memref<16x64xf32> to memref<1024xbf16>
    func.return
  }
}
// CHECK: tile.view: memref<16x64xf32> and memref<1024xbf16> differ in element type

// -----
builtin.module {
  func.func @main() {
    %x = tile.hbm_alloc : memref<16x64xf32>
    %v = tile.view %x : memref<16x64xf32> to memref<1000xf32>
    func.return
  }
}
// CHECK: tile.view: memref<16x64xf32> and memref<1000xf32> differ in element count

// -----
builtin.module {
  func.func @main() {
    %x = tile.hbm_alloc : memref<16x64xf32>
    %v = tile.view %x : memref<16x64xf32> to memref<64x16xf32, strided<[1, 128]>>
    func.return
  }
}
// CHECK: tile.view: memref<64x16xf32, strided<[1, 128]>> reaches elements [0, 1983] outside its source's [0, 1023]

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c8 = arith.constant 8 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    %w = tile.subview %a[%c8, %c0] : memref<16x64xf32, #tile.space<"sram">> to memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.subview: rows [8, 8+16) exceed the source's 16

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    %w = tile.subview %a[%c0, %c0] : memref<16x64xf32, #tile.space<"sram">> to memref<16x8xbf16, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.subview: memref<16x64xf32, #tile.space<"sram">> and memref<16x8xbf16, #tile.space<"sram">> differ in element type or space

// -----
builtin.module {
  func.func @k(%x: memref<37x53xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.load %x[%c0] into %a sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<37x53xf32>, memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.load: 1 indices for a rank-2 tensor

// -----
builtin.module {
  func.func @k(%x: memref<37x53xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.load %x[%c0, %c0] into %a sizes(%c16, %c16) {row_dim = 2 : i64, col_dim = 1 : i64} : memref<37x53xf32>, memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.load: row_dim = 2 out of range for rank 2

// -----
builtin.module {
  func.func @k(%x: memref<37x53xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.load %x[%c0, %c0] into %a sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64, col_step = 0 : i64} : memref<37x53xf32>, memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.load: col_step must be >= 1, got 0

// -----
builtin.module {
  func.func @k(%x: memref<37x53xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.load %a[%c0, %c0] into %a sizes(%c16, %c16) {row_dim = 0 : i64, col_dim = 1 : i64} : memref<16x64xf32, #tile.space<"sram">>, memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.load: source must live in hbm, got sram

// -----
builtin.module {
  func.func @k(%y: memref<37x53xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.store %a into %y[%c0, %c0] sizes(%c16, %c16) {row_dim = -1 : i64, col_dim = 1 : i64} : memref<16x64xf32, #tile.space<"sram">>, memref<37x53xf32>
    func.return
  }
}
// CHECK: tile.store: a store cannot broadcast (row_dim/col_dim -1)

// -----
builtin.module {
  func.func @k(%t: memref<10x4x8xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %i = tile.alloc {buffer = "i"} : memref<16x1xi32, #tile.space<"sram">>
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.gather %t[%c0] by %i into %a sizes(%c16, %c16) : memref<10x4x8xf32>, memref<16x1xi32, #tile.space<"sram">>, memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.gather: the table must be 2-D, got memref<10x4x8xf32>

// -----
builtin.module {
  func.func @k(%t: memref<10x64xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %i = tile.alloc {buffer = "i"} : memref<16x1xf32, #tile.space<"sram">>
    %a = tile.alloc {buffer = "a"} : memref<16x64xf32, #tile.space<"sram">>
    tile.gather %t[%c0] by %i into %a sizes(%c16, %c16) : memref<10x64xf32>, memref<16x1xf32, #tile.space<"sram">>, memref<16x64xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.gather: indices must be i32, got memref<16x1xf32, #tile.space<"sram">>

// -----
builtin.module {
  func.func @k(%t: memref<10x64xf32>) attributes {tile.kernel} {
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %i = tile.alloc {buffer = "i"} : memref<16x1xi32, #tile.space<"sram">>
    %a = tile.alloc {buffer = "a"} : memref<16x64xbf16, #tile.space<"sram">>
    tile.gather %t[%c0] by %i into %a sizes(%c16, %c16) : memref<10x64xf32>, memref<16x1xi32, #tile.space<"sram">>, memref<16x64xbf16, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.gather: table memref<10x64xf32> and destination memref<16x64xbf16, #tile.space<"sram">> element types differ

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %t = arith.constant true
    %a = tile.alloc {buffer = "a"} : memref<4x4xbf16, #tile.space<"sram">>
    %o = tile.alloc {buffer = "o"} : memref<4x4xbf16, #tile.space<"acc">>
    tile.matmul %a, %a into %o sizes(%c, %c, %c) accumulate(%t) : memref<4x4xbf16, #tile.space<"sram">>, memref<4x4xbf16, #tile.space<"sram">>, memref<4x4xbf16, #tile.space<"acc">>
    func.return
  }
}
// CHECK: tile.matmul: accumulator must be f32, got memref<4x4xbf16, #tile.space<"acc">>

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %a = tile.alloc {buffer = "a"} : memref<4x4xf32, #tile.space<"sram">>
    tile.unary "sin" %a into %a sizes(%c, %c) : memref<4x4xf32, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.unary: unknown fn "sin"

// -----
builtin.module {
  func.func @k(%x: memref<4x4xf32>) attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %a = tile.alloc {buffer = "a"} : memref<4x4xf32, #tile.space<"sram">>
    tile.unary "exp" %x into %a sizes(%c, %c) : memref<4x4xf32>, memref<4x4xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.unary: input must live in sram or acc, got hbm (memref<4x4xf32>)

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %a = tile.alloc {buffer = "a"} : memref<4x4xf32, #tile.space<"sram">>
    tile.binary "add" %a, %a into %a sizes(%c, %c) {rhs_mode = "row"} : memref<4x4xf32, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.binary: unknown rhs_mode "row"

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %a = tile.alloc {buffer = "a"} : memref<4x4xf32, #tile.space<"sram">>
    tile.binary "atan2" %a, %a into %a sizes(%c, %c) {rhs_mode = "tile"} : memref<4x4xf32, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.binary: unknown fn "atan2"

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %a = tile.alloc {buffer = "a"} : memref<4x4xf32, #tile.space<"sram">>
    tile.scalar "atan2" %a, 2.0 : f32 into %a sizes(%c, %c) : memref<4x4xf32, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.scalar: unknown fn "atan2"

// -----
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %a = tile.alloc {buffer = "a"} : memref<4x4xf32, #tile.space<"sram">>
    %o = tile.alloc {buffer = "o"} : memref<4x1xf32, #tile.space<"sram">>
    tile.reduce "mean" %a into %o sizes(%c, %c) : memref<4x4xf32, #tile.space<"sram">>, memref<4x1xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: tile.reduce: unknown fn "mean"
