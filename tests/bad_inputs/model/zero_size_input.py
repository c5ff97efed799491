import torch

ERROR = "ShapeError"
EXPECT = "input 'x' has shape [3, 0], with a zero-size dimension: tilecc compiles non-empty tensors"


class M(torch.nn.Module):
    def forward(self, x):
        return x * 2


def factory():
    return M(), (torch.randn(3, 0),)
