"""The model every config, program and call case of the corpus uses (tests/test_bad_inputs.py)."""

import torch


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(24, 19)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


def factory():
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(13, 24),)
