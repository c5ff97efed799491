import torch

ERROR = "UnsupportedOpError"
EXPECT = "1 unsupported op(s) (aten.sort.default): aten.sort.default at unsupported_op.py:{line:sort}"


class M(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x, -1).values * 2  # sort


def factory():
    return M(), (torch.randn(3, 4),)
