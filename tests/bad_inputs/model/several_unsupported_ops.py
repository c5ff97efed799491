import torch

ERROR = "UnsupportedOpError"
EXPECT = ("2 unsupported op(s) (aten.cumprod.default, aten.flip.default): "
          "aten.cumprod.default at several_unsupported_ops.py:{line:cumprod}; "
          "aten.flip.default at several_unsupported_ops.py:{line:flip}")


class M(torch.nn.Module):
    def forward(self, x):
        a = torch.cumprod(x, 0)  # cumprod
        b = torch.flip(x, [0])  # flip
        return a + b


def factory():
    return M(), (torch.randn(4, 5),)
