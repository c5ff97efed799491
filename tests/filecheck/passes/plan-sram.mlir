// RUN: tilecc-opt %s -p 'plan-sram{target=tiny}' | filecheck %s
// RUN: xdsl-opt %s -p 'plan-sram{target=tiny}' | filecheck %s

// Buffers get disjoint, 64-byte aligned offsets per memory space.
builtin.module {
  func.func @k(%x: memref<20x8xf32>) attributes {tile.kernel} {
    %a = tile.alloc {buffer = "lhsT"} : memref<8x16xf32, #tile.space<"sram">>
    %b = tile.alloc {buffer = "rhs"} : memref<8x5xbf16, #tile.space<"sram">>
    %c = tile.alloc {buffer = "acc"} : memref<16x5xf32, #tile.space<"acc">>
    %d = tile.alloc {buffer = "out"} : memref<16x100xf32, #tile.space<"sram">>
    func.return
  }
}

// CHECK:      tile.alloc {buffer = "lhsT", offset = 0 : i64}
// CHECK-NEXT: tile.alloc {buffer = "rhs", offset = 64 : i64}
// CHECK-NEXT: tile.alloc {buffer = "acc", offset = 0 : i64}
// CHECK-NEXT: tile.alloc {buffer = "out", offset = 128 : i64}
