// expect: {path}:4:27: Operation graph.frobnicate is not registered
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<5x37xf32> {
    %s = graph.frobnicate %x : tensor<5x37xf32>
    func.return %s : tensor<5x37xf32>
  }
}
