"""Locations that name the layer: every graph op's ``tilecc.loc`` is
``"<module path> (<Class>) @ <file>:<line>"`` (frontend/export.py `node_location`),
shown by the explorer, coverage, remarks, bisect and the unsupported-op errors."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from tilecc.cli import main
from tilecc.errors import UnsupportedOpError
from tilecc.frontend.export import _module_path, node_layer, node_location
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import graph as g

SEQUENTIAL = """import torch
from torch import nn


def factory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    return model, (torch.randn(4, 16),)
"""

NESTED = """import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cumprod(self.query(x), 0)  # unsupported inside a layer


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([Attn(), Attn()])

    def forward(self, x):
        for blk in self.layer:
            x = blk(x)
        return x


def factory():
    return M(), (torch.randn(4, 8),)
"""


def test_explore_sequential_names_three_distinct_matmul_layers(tmp_path, capsys):
    """Every frame of an exported nn.Sequential is inside torch: the layer names the op."""
    src = tmp_path / "seq.py"
    src.write_text(SEQUENTIAL)
    assert main(["explore", f"{src}:factory", "--stage", "graph", "--remarks", "--quiet"]) == 0
    out = capsys.readouterr().out
    locs = re.findall(r'graph\.matmul .*\{tilecc\.loc = "([^"]+)"\}', out)
    assert locs == ["0 (Linear)", "2 (Linear)", "4 (Linear)"]
    assert "linear.py" not in out and "activation.py" not in out  # no line inside torch
    assert re.search(r"^2 \(Linear\): remark \[fuse-graph\] passed", out, re.M)


def test_asm_listing_and_html_show_the_layer(tmp_path, capsys):
    src = tmp_path / "seq.py"
    src.write_text(SEQUENTIAL)
    page = tmp_path / "seq.html"
    assert main(["explore", f"{src}:factory", "--stage", "asm", "--html", str(page), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^matmul .*# 4 \(Linear\)$", out, re.M)
    assert "4 (Linear)" in page.read_text()


def test_layer_and_user_line_of_a_nested_model(tmp_path):
    src = tmp_path / "nested.py"
    src.write_text(NESTED.replace("torch.cumprod(self.query(x), 0)", "torch.relu(self.query(x))"))
    from tilecc.cli import load_factory

    model, inputs = load_factory(f"{src}:factory")
    p = import_exported_program(export_model(model, inputs))
    mm = [g.source_loc(op) for op in p.func.body.block.ops if isinstance(op, g.MatmulOp)]
    assert mm == ["layer.0.query (Linear) @ nested.py:11", "layer.1.query (Linear) @ nested.py:11"]
    relu = [g.source_loc(op) for op in p.func.body.block.ops if op.name == "graph.relu"]
    assert relu == ["layer.0 (Attn) @ nested.py:11", "layer.1 (Attn) @ nested.py:11"]


def test_unsupported_op_error_and_coverage_name_the_layer(tmp_path, capsys):
    src = tmp_path / "nested.py"
    src.write_text(NESTED)
    from tilecc.cli import load_factory

    model, inputs = load_factory(f"{src}:factory")
    with pytest.raises(UnsupportedOpError) as info:
        import_exported_program(export_model(model, inputs))
    assert ("aten.cumprod.default", "layer.0 (Attn) @ nested.py:11") in info.value.ops
    assert "layer.1 (Attn) @ nested.py:11" in str(info.value)
    assert main(["coverage", f"{src}:factory"]) == 1
    out = capsys.readouterr().out
    assert "at layer.0 (Attn) @ nested.py:11" in out and "at layer.1 (Attn) @ nested.py:11" in out


def test_root_module_ops_keep_the_line_only():
    class M(nn.Module):
        def forward(self, x):
            return x * 2.0  # root-line

    ep = export_model(M(), (torch.randn(3),))
    (mul,) = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert node_layer(mul) == ""
    assert re.fullmatch(r"test_locations\.py:\d+", node_location(mul))


def test_torch_compile_graphs_carry_the_layer():
    """The AOTAutograd graph of torch.compile keeps dynamo's nn_module_stack."""
    from tilecc.runtime.partition import Fallback

    class Sin(nn.Module):
        def forward(self, x):
            return torch.sin(x)  # no NPU lowering: falls back to torch

    model = nn.Sequential(nn.Linear(8, 8), Sin(), nn.Linear(8, 4))
    plans: list = []
    compiled = torch.compile(model, backend="tilecc", options={"plans": plans, "cost_aware": False})
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    fallbacks: list[Fallback] = [f for p in plans for f in p.fallbacks]
    assert fallbacks and all(re.fullmatch(r"1 \(Sin\) @ test_locations\.py:\d+", f.location) for f in fallbacks)


@given(st.lists(st.sampled_from(["enc", "layer", "0", "12", "self", "q_proj"]), min_size=1, max_size=5),
       st.sampled_from(["export", "dynamo-index", "dynamo-key"]))
def test_module_paths_of_export_and_dynamo_agree(parts, style):
    """torch.export writes ``a.0.b``; dynamo ``L['self'].a[0].b`` or ``L['fn'].a['0']``."""
    path = ".".join(parts)
    if style == "export":
        raw = path
    else:
        quote = "'" if style == "dynamo-key" else ""
        raw = "L['self']" + "".join(f"[{quote}{p}{quote}]" if p.isdigit() else f".{p}" for p in parts)
    assert _module_path(raw) == path
