// expect: {path}:8:1: values used but not defined: [%q]
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<5x37xf32> {
    %s = graph.relu %q : tensor<5x37xf32>
    func.return %s : tensor<5x37xf32>
  }
}
