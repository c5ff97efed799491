// expect: {path}:5:5: Expected '>' after builtin parameter list
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<5x37xf32> {
    %s = graph.relu %x : tensor<5x37xf32
    func.return %s : tensor<5x37xf32>
  }
}
