// RUN: tilecc-opt %s --split-input-file -p 'plan-sram{target=tiny}' | filecheck %s

// Each chunk (separated by a line of five dashes after //) is parsed and run on its own; the outputs are separated the same way.
builtin.module {
  func.func @a() attributes {tile.kernel} {
    %x = tile.alloc {buffer = "x"} : memref<16x8xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK:      func.func @a()
// CHECK-NEXT:   tile.alloc {buffer = "x", offset = 0 : i64}
// CHECK:      {{// -{5}$}}
// CHECK:      func.func @b()
// CHECK-NEXT:   tile.alloc {buffer = "y", offset = 0 : i64}
// CHECK-NEXT:   tile.alloc {buffer = "z", offset = 64 : i64}

// -----
builtin.module {
  func.func @b() attributes {tile.kernel} {
    %y = tile.alloc {buffer = "y"} : memref<16x4xf32, #tile.space<"sram">>
    %z = tile.alloc {buffer = "z"} : memref<16x4xf32, #tile.space<"sram">>
    func.return
  }
}
