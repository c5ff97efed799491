// expect: {path}:4: graph.permute: [1, 1] is not a permutation of the dims of [5, 37]
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<37x5xf32> {
    %t = graph.permute %x [1, 1] : tensor<5x37xf32> -> tensor<37x5xf32>
    func.return %t : tensor<37x5xf32>
  }
}
