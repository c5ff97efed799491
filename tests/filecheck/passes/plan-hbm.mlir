// RUN: tilecc-opt %s -p 'plan-hbm{target=tiny}' | filecheck %s

// Inputs and weights first (64-byte aligned, views alias their source); intermediates
// share bytes when their live ranges (first to last launch using them) do not overlap.
builtin.module {
  func.func @k(%a: memref<37x29xbf16>, %b: memref<37x29xbf16>) attributes {tile.kernel} {
    func.return
  }
  func.func @main() -> memref<37x29xbf16> {
    %x = tile.hbm_alloc {input = 0 : i64} : memref<37x53xf32>
    %w = tile.hbm_alloc {weight = "fc.weight"} : memref<53x29xf32>
    %v = tile.view %w : memref<53x29xf32> to memref<1537xf32>
    %t = tile.hbm_alloc : memref<37x29xbf16>
    %u = tile.hbm_alloc : memref<37x29xbf16>
    %s = tile.hbm_alloc : memref<37x29xbf16>
    %y = tile.hbm_alloc : memref<37x29xbf16>
    func.call @k(%t, %u) : (memref<37x29xbf16>, memref<37x29xbf16>) -> ()
    func.call @k(%u, %s) : (memref<37x29xbf16>, memref<37x29xbf16>) -> ()
    func.call @k(%s, %y) : (memref<37x29xbf16>, memref<37x29xbf16>) -> ()
    func.return %y : memref<37x29xbf16>
  }
}

// %t (launch 0) and %s (launches 1-2) share bytes; %u (0-1) and %y (2-end) too.
// CHECK:      builtin.module attributes {tile.hbm_size = 18432 : i64, tile.hbm_intermediate_peak = 4352 : i64, tile.hbm_intermediate_total = 8704 : i64}
// CHECK:      tile.hbm_alloc {input = 0 : i64, offset = 0 : i64}
// CHECK-NEXT: tile.hbm_alloc {weight = "fc.weight", offset = 7872 : i64}
// CHECK-NEXT: tile.view
// CHECK-NEXT: tile.hbm_alloc {offset = 14080 : i64} : memref<37x29xbf16>
// CHECK-NEXT: tile.hbm_alloc {offset = 16256 : i64} : memref<37x29xbf16>
// CHECK-NEXT: tile.hbm_alloc {offset = 14080 : i64} : memref<37x29xbf16>
// CHECK-NEXT: tile.hbm_alloc {offset = 16256 : i64} : memref<37x29xbf16>
