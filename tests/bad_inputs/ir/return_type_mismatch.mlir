// expect: {path}:5: func.return: Expected arguments to have the same types as the function output types: expected [tensor<5x37xbf16>], got [tensor<5x37xf32>]
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>) -> tensor<5x37xbf16> {
    %s = graph.relu %x : tensor<5x37xf32>
    func.return %s : tensor<5x37xf32>
  }
}
