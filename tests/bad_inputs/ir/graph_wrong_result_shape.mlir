// expect: {path}:4:43: unexpected '->' in block definition
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<5x36xf32> {
    %y = graph.relu %x : tensor<5x37xf32> -> tensor<5x36xf32>
    func.return %y : tensor<5x36xf32>
  }
}
