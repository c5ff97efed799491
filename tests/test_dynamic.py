"""Dynamic shapes: one compile serves every shape in the declared ranges."""

import re

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


def test_graph_ir_keeps_symbolic_sizes(compiled):
    """The graph IR names every symbolic size as a sympy expression, with its range."""
    from xdsl.parser import Parser

    from tilecc.ir import graph as g

    _, cm = compiled
    text = str(cm.graph.module)
    # the input shapes name torch.export's size symbols; each has its range and example value
    m = re.search(r'tilecc.input_shapes = \["\[(s\d+), (s\d+), 16\]"\]', text)
    assert m, text
    b, t = m.groups()
    assert f'{b} = "[1, 8] = 2"' in text and f'{t} = "[2, 64] = 5"' in text, text
    # the reshape to (b * t, d) and back, as expressions of the symbols
    assert re.search(rf'tilecc.shape = "\[({b}\*{t}|{t}\*{b}), 16\]"', text)
    assert f'tilecc.shape = "[{b}, {t}, 16]"' in text
    # and it parses back
    assert str(Parser(g.graph_context(), text).parse_module()) == text
