import torch

ERROR = "ExportError"
EXPECT = ("torch.export failed on M: GuardOnDataDependentSymNode: Could not guard on data-dependent "
          "expression Eq(u0, 1) (unhinted: Eq(u0, 1)).  (Size-like symbols: none)")


class M(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


def factory():
    return M(), (torch.randn(3),)
