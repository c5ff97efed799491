import torch

ERROR = "UnsupportedOpError"
EXPECT = "1 unsupported op(s) (aten.digamma.default): aten.digamma.default at unsupported_op.py:{line:digamma}"


class M(torch.nn.Module):
    def forward(self, x):
        return torch.digamma(x) * 2  # digamma


def factory():
    return M(), (torch.randn(3, 4),)
