"""tilecc.compile borrows the model's weights while it compiles (no copy at import) and
the Program keeps its own copy: changing the model's parameters afterwards, in place,
changes nothing in the compiled program (fp32 and bf16 models, folded and plain weights)."""

import pytest
import torch
from torch import nn

import tilecc


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64)  # folded into fc1: a weight the compiler makes
        self.fc1 = nn.Linear(64, 96)
        self.fc2 = nn.Linear(96, 32)  # kept as given: a borrowed weight

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.ln(x))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_program_is_unaffected_by_later_parameter_changes(dtype):
    torch.manual_seed(0)
    model = _Net().to(dtype).eval()
    x = torch.randn(8, 64, dtype=dtype)
    with torch.no_grad():
        want = model(x)
    cm = tilecc.compile(model, (x,), target="tiny", cache=False)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3.0).add_(1.0)  # in place: the storage a borrowed view would see
    got = cm(x)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    with torch.no_grad():
        assert not torch.allclose(model(x).float(), want.float(), rtol=tol, atol=tol)
