"""Constant buffers resident in SRAM across kernels (`passes/tile/resident_constants.py`):
loaded once by the first kernel that needs them, read in place by the later ones; the
programs match eager with the sanitisers on (a later kernel's read of a slot is ordered
after the first kernel's load by the link, or the race / uninitialised-read checks fail)."""

from __future__ import annotations

import pytest
import torch
from xdsl.dialects import func

from tests.helpers import random_batch_norm, tolerance
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.tile.plan_sram import _kernel_bytes, plan_sram
from tilecc.passes.tile.resident_constants import MAX_FRACTION, Residency, find_resident, is_resident
from tilecc.runtime.compiler import compile_graph
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import from_dict, load_config
from tilecc.simulator.isa import Opcode


class Blocks(torch.nn.Module):
    """A stem conv and two ResNet basic blocks of `c` channels: four 3x3 convolutions of
    one shape, each with its padded output's zero and mask rows."""

    def __init__(self, c: int = 128, cin: int = 8):
        super().__init__()
        self.stem = torch.nn.Conv2d(cin, c, 3, 1, 1)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(c, c, 3, 1, 1, bias=False) for _ in range(4))
        self.bns = torch.nn.ModuleList(random_batch_norm(c) for _ in range(4))

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for i in (0, 2):
            y = torch.relu(self.bns[i](self.convs[i](x)))
            x = torch.relu(self.bns[i + 1](self.convs[i + 1](y)) + x)
        return x


def _compile(model, inputs, target="cloud", **kw):
    with torch.no_grad():
        gp = import_exported_program(export_model(model.eval(), inputs))
    return compile_graph(gp, load_config(target), **kw)


def _loads(program) -> int:
    return int((program.stream["opcode"] == Opcode.DMA_LOAD).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_load_their_constants_once_and_match_eager(dtype):
    torch.manual_seed(0)
    model = Blocks().eval().to(dtype)
    x = torch.randn(1, 8, 14, 13, dtype=dtype)
    with torch.no_grad():
        want = model(x)
    prog = _compile(model, (x,))
    base = _compile(model, (x,), disabled={"resident-constants"})
    said = [r["message"] for r in prog.meta["remarks"] if r["pass_name"] == "plan-sram" and "resident" in r["message"]]
    assert said and "loads of later kernels removed" in said[0], said
    assert _loads(prog) < _loads(base)
    for p in (prog, base):
        (out,), _ = run_program(p, (x,), sanitize=True)
        rtol, atol = tolerance(dtype, float(want.float().abs().max()))
        torch.testing.assert_close(out.float(), want.float(), rtol=rtol, atol=atol)


def test_residency_leaves_a_full_sram_alone():
    """On an SRAM just large enough for the largest kernel the slots do not fit beside it
    (or would take more than `MAX_FRACTION` of it): nothing moves, every load stays, and
    a remark says why; on `cloud`'s SRAM the same module gets its slots."""
    torch.manual_seed(0)
    model = Blocks(c=32, cin=4).eval()
    x = torch.randn(1, 4, 9, 11)
    with torch.no_grad():
        gp = import_exported_program(export_model(model, (x,)))
    cfg = load_config("cloud")
    captured = {}

    def after(name, module):
        if name == "lower-graph-to-tile":
            captured["m"] = module.clone()

    compile_graph(gp, cfg, after_pass=after)
    lowered = captured["m"]
    res = find_resident(lowered)
    assert res.slots, "the blocks' kernels fill buffers from constants"
    kernels = [f for f in lowered.ops if isinstance(f, func.FuncOp) and tile.KERNEL_ATTR in f.attributes]
    own = max(_kernel_bytes(f, res) for f in kernels)  # without the buffers that would move
    full = max(_kernel_bytes(f, Residency()) for f in kernels)  # with them
    assert own + res.total > full or res.total > full * MAX_FRACTION, "the slots must not fit"
    data = cfg.to_dict()
    for size, moved in ((full, False), (cfg.sram.bytes_per_partition, True)):
        data["sram"]["bytes_per_partition"] = size
        m = lowered.clone()
        with remarks.collecting() as got:
            plan_sram(m, from_dict(data), resident=True)
        said = [r for r in got.remarks if r.pass_name == "plan-sram" and "resident" in r.message]
        assert len(said) == 1 and (said[0].kind == "passed") == moved, said
        assert any(is_resident(op) for op in m.walk() if isinstance(op, tile.AllocOp)) == moved
        loads = sum(1 for op in m.walk() if isinstance(op, tile.LoadOp))
        before = sum(1 for op in lowered.walk() if isinstance(op, tile.LoadOp))
        assert (loads < before) == moved
