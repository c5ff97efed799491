// RUN: tilecc-opt %s --split-input-file --verify-diagnostics -p 'plan-sram{target=tiny}' | filecheck %s
// RUN: not tilecc-opt %s --split-input-file -p 'plan-sram{target=tiny}' 2>&1 | filecheck %s --check-prefix=FAIL

// A pass that refuses its input (a TileccError) reports it like a verifier: printed under
// --verify-diagnostics (exit 0), one `error:` line and exit status 2 otherwise.
builtin.module {
  func.func @big() attributes {tile.kernel} {
    %x = tile.alloc {buffer = "x"} : memref<16x40000xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: error: kernel big: sram buffers need 160000 bytes per partition, the target has {{[0-9]+}}: x (160000 B)
// FAIL: error: kernel big: sram buffers need 160000 bytes per partition

// -----
builtin.module {
  func.func @tall() attributes {tile.kernel} {
    %x = tile.alloc {buffer = "x"} : memref<64x4xf32, #tile.space<"sram">>
    func.return
  }
}
// CHECK: error: kernel tall: buffer 'x' has 64 rows but sram has 16 partitions
