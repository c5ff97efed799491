// RUN: tilecc-opt %s -p 'plan-hbm{target=tiny}' | filecheck %s

// Every HBM tensor gets a 64-byte aligned offset; views alias their source.
builtin.module {
  func.func @main() -> memref<37x29xbf16> {
    %x = tile.hbm_alloc {input = 0 : i64} : memref<37x53xf32>
    %w = tile.hbm_alloc {weight = "fc.weight"} : memref<53x29xf32>
    %v = tile.view %w : memref<53x29xf32> to memref<1537xf32>
    %y = tile.hbm_alloc : memref<37x29xbf16>
    func.return %y : memref<37x29xbf16>
  }
}

// CHECK:      builtin.module attributes {tile.hbm_size = 16256 : i64}
// CHECK:      tile.hbm_alloc {input = 0 : i64, offset = 0 : i64}
// CHECK-NEXT: tile.hbm_alloc {weight = "fc.weight", offset = 7872 : i64}
// CHECK-NEXT: tile.view
// CHECK-NEXT: tile.hbm_alloc {offset = 14080 : i64} : memref<37x29xbf16>
