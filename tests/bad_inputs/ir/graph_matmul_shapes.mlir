// expect: {path}:4: graph.matmul: contraction dims differ: [5, 37] @ [36, 29] (37 != 36)
builtin.module {
  func.func @forward(%x: tensor<5x37xf32>, %w: tensor<36x29xf32>) -> tensor<5x29xf32> {
    %y = graph.matmul %x, %w : tensor<5x37xf32>, tensor<36x29xf32> -> tensor<5x29xf32>
    func.return %y : tensor<5x29xf32>
  }
}
