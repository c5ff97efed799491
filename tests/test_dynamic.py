"""Dynamic shapes: one compile serves every shape in the declared ranges."""

import pytest
import torch
from torch.export import Dim

import tilecc
from tilecc.errors import InputMismatchError


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):
        b, t, d = x.shape
        y = torch.nn.functional.gelu(self.fc(x)).reshape(b * t, d)
        return torch.softmax(self.ln(y), -1).reshape(b, t, d) + x


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    model = _Block().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=64)
    cm = tilecc.compile(
        model, (torch.randn(2, 5, 16),), target="tiny",
        dynamic_shapes={"x": {0: batch, 1: seq}},
    )
    return model, cm


def test_three_shapes_from_one_compile(compiled):
    model, cm = compiled
    for shape in [(1, 3, 16), (2, 17, 16), (5, 40, 16)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(cm(x), model(x).detach(), rtol=1e-4, atol=1e-5)
        assert cm.report.cycles > 0
    assert len(cm.programs) == 3
    cm(torch.randn(2, 17, 16))  # cached: no new program
    assert len(cm.programs) == 3


def test_shape_outside_range_is_a_clear_error(compiled):
    _, cm = compiled
    with pytest.raises(InputMismatchError, match=r"input 'x' dimension 1 is 65, outside the range \[2, 64\]"):
        cm(torch.randn(2, 65, 16))
    with pytest.raises(InputMismatchError, match="input 'x' dimension 2 is 15, the program was exported with the static size 16"):
        cm(torch.randn(2, 5, 15))
    with pytest.raises(InputMismatchError, match="input 'x' has 2 dimensions, the program takes 3"):
        cm(torch.randn(2, 5))
