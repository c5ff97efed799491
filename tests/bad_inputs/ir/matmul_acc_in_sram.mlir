// expect: {path}:8: tile.matmul: acc must live in acc, got sram (memref<4x4xf32, #tile.space<"sram">>)
builtin.module {
  func.func @k() attributes {tile.kernel} {
    %c = arith.constant 4 : index
    %t = arith.constant true
    %a = tile.alloc {buffer = "a"} : memref<4x4xbf16, #tile.space<"sram">>
    %o = tile.alloc {buffer = "o"} : memref<4x4xf32, #tile.space<"sram">>
    tile.matmul %a, %a into %o sizes(%c, %c, %c) accumulate(%t) : memref<4x4xbf16, #tile.space<"sram">>, memref<4x4xbf16, #tile.space<"sram">>, memref<4x4xf32, #tile.space<"sram">>
    func.return
  }
}
