// expect: {path}:4: graph.softmax: dim 2 out of range for tensor<5x37xf32> (must be in [0, 2))
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<5x37xf32> {
    %s = graph.softmax %x dim 2 : tensor<5x37xf32>
    func.return %s : tensor<5x37xf32>
  }
}
