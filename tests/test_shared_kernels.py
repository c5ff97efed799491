"""Kernels shared between identical launches (passes/graph_to_tile/sharing.py, the
`npu.launch` relocation in codegen/expand.py): a repeated layer's kernels are built once,
and the relocated stream is byte-identical to the one built with every kernel on its own."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import run_and_compare
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import npu
from tilecc.runtime.compiler import compile_graph
from tilecc.simulator.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


class Layers(torch.nn.Module):
    """`n` identical pre-norm MLP blocks with residuals (a transformer's repeated shape)."""

    def __init__(self, n: int, d: int = 48, h: int = 96):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d))
            for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return x


def _both(model: torch.nn.Module, inputs: tuple, target: str = "tiny"):
    gp = import_exported_program(export_model(model.eval(), inputs))
    cfg = load_config(target)
    # linking off in both: plan-sram's ring places each *distinct* kernel after the one before when
    # kernels are shared, so linked streams differ in SRAM placement (both correct; the
    # link orders what they share); the relocation itself must give the same bytes
    return (compile_graph(gp, cfg, disabled={"link-kernels"}),
            compile_graph(gp, cfg, disabled={"share-kernels", "link-kernels"}))


def _shared(program) -> list[str]:
    return [r["message"] for r in program.meta["remarks"] if "shared by" in r["message"]]


def _assert_same_program(shared, alone) -> None:
    assert shared.stream.tobytes() == alone.stream.tobytes()
    assert shared.hbm_size == alone.hbm_size
    assert [(s.name, s.offset) for s in shared.weights] == [(s.name, s.offset) for s in alone.weights]
    assert all(np.array_equal(shared.weight_data[k], alone.weight_data[k]) for k in alone.weight_data)
    assert [(a, n) for _, a, n in shared.kernels] == [(a, n) for _, a, n in alone.kernels]


@pytest.mark.parametrize("attn,dtype", [("eager", torch.float32), ("sdpa", torch.bfloat16)])
def test_gpt2_stream_is_byte_identical_with_and_without_sharing(attn, dtype):
    import gpt2

    shared, alone = _both(*gpt2.build(attn, dtype=dtype))
    _assert_same_program(shared, alone)
    remarks = _shared(shared)
    # per layer: the attention, the qkv / projection matmuls, the MLP (one fused MLP
    # kernel, passes/graph_to_tile/mlp/); 2 layers
    assert any("attention shared by 2 launches" in m for m in remarks)
    assert any("fused_matmul" in m for m in remarks)
    assert any("fused_mlp" in m for m in remarks)
    assert not _shared(alone)


def test_a_multi_layer_model_shares_its_kernels_and_matches_eager():
    torch.manual_seed(0)
    model, x = Layers(4), torch.randn(2, 24, 48)
    shared, alone = _both(model, (x,))
    _assert_same_program(shared, alone)
    # the first block reads the program input (another HBM view chain): it has its own
    assert any("shared by 3 launches" in m for m in _shared(shared))
    cm = run_and_compare(model, (x,))
    assert any("shared by 3 launches" in m for m in _shared(cm.program))


def test_the_npu_module_holds_one_kernel_per_distinct_kernel():
    from tilecc.passes.registry import default_pipeline

    torch.manual_seed(0)
    model, x = Layers(3), torch.randn(1, 16, 48)
    gp = import_exported_program(export_model(model.eval(), (x,)))
    cfg = load_config("tiny")
    module = gp.module.clone()
    for _name, run in default_pipeline(cfg, 2, weights=gp.weights):
        run(module)
    kernels = [o for o in module.ops if isinstance(o, npu.KernelOp)]
    launches = [o for o in module.ops if isinstance(o, npu.LaunchOp)]
    names = {k.sym_name.data for k in kernels}
    assert launches and all(launch.kernel.data in names for launch in launches)
    # every re-launch moves at least one argument (other weights, other activations)
    assert all(any(d != 0 for d in launch.delta_list) for launch in launches)
    # the relocated DMAs name the argument their address is relative to
    dmas = [o for k in kernels for o in k.walk() if type(o) in npu.HBM_ADDR_FIELD]
    assert dmas and all(o.hbm_arg is not None for o in dmas)
