"""Activation tiles kept on chip between kernels (`passes/tile/forward_activations.py`):
a kernel reads the tile the kernel before it computed where it is, instead of loading it
back from HBM; the programs match eager with the sanitisers on (a consumer's read of the
slot is ordered after the producer's writes by the link, and a later kernel's writes of
the same bytes after the consumer's reads, or the race / uninitialised-read checks fail)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.helpers import gpt2_block, tolerance
from tests.test_resident_constants import Blocks
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.passes.tile.forward_activations import Forwarding, Slot, find_forwarding, place_slots
from tilecc.runtime.compiler import compile_graph
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import Opcode

# transformers imports torchvision, whose operator registrations fail on this torch build
for _m in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_m, types.ModuleType(_m))

OFF = {"forward-activations"}


def _mlp():
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128),
    ).eval()
    return m, (torch.randn(64, 256),)


def _gpt2_block(embd: int, heads: int) -> torch.nn.Module:
    return gpt2_block(embd, heads, n_positions=512, vocab_size=64, bos_token_id=0, eos_token_id=0)


def _gp(model, inputs):
    with torch.no_grad():
        return import_exported_program(export_model(model.eval(), inputs))


def _count(program, op: Opcode) -> int:
    return int((program.stream["opcode"] == op).sum())


def _said(program) -> list[str]:
    return [r["message"] for r in program.meta["remarks"]
            if r["pass_name"] == "plan-sram" and "activation tiles" in r["message"]]


def _check(program, model, inputs, dtype):
    with torch.no_grad():
        want = model(*inputs)
    (out,), _ = run_program(program, inputs, sanitize=True)
    rtol, atol = tolerance(dtype, float(want.float().abs().max()))
    torch.testing.assert_close(out.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_blocks_read_the_previous_kernels_output_in_place(dtype):
    torch.manual_seed(0)
    model = Blocks().eval().to(dtype)  # one-band 3x3 convs at 14 x 14
    x = torch.randn(1, 8, 14, 14, dtype=dtype)
    gp = _gp(model, (x,))
    cfg = load_config("cloud")
    prog = compile_graph(gp, cfg)
    base = compile_graph(gp, cfg, disabled=OFF)
    said = _said(prog)
    assert said and "loads and" in said[0], prog.meta["remarks"]
    assert _said(base) == []
    assert _count(prog, Opcode.DMA_LOAD) < _count(base, Opcode.DMA_LOAD)
    assert _count(prog, Opcode.DMA_STORE) < _count(base, Opcode.DMA_STORE)
    for p in (prog, base):
        _check(p, model, (x,), dtype)


def test_mlp_intermediates_never_reach_hbm():
    """Each linear kernel holds its whole 64-row output in one buffer: every intermediate
    is read in place by the next kernel, so only the input, the weights and the output
    move through HBM, and the program is faster than with every intermediate in HBM."""
    m, x = _mlp()
    gp = _gp(m, x)
    cfg = load_config("cloud")
    prog = compile_graph(gp, cfg)
    base = compile_graph(gp, cfg, disabled=OFF)
    assert _said(prog), prog.meta["remarks"]
    # one store per program output tile is all that is left
    assert _count(prog, Opcode.DMA_STORE) < _count(base, Opcode.DMA_STORE)
    _, rep = run_program(prog, x, functional=False)
    _, rep0 = run_program(base, x, functional=False)
    assert rep.cycles < rep0.cycles
    _check(prog, m, x, torch.float32)


def test_a_buffer_loaded_twice_forwards_only_its_last_load():
    """The fused MLP kernel of a GPT-2 block loads row tiles into a pair of buffers in
    turn: only the last load of each buffer is forwarded (the ops after it read a new
    buffer at the slot), the earlier loads stay; the block matches eager."""
    torch.manual_seed(0)
    model = _gpt2_block(128, 2)
    x = (torch.randn(1, 512, 128),)
    gp = _gp(model, x)
    cfg = load_config("cloud")
    captured = {}

    def before(name, module):
        if name == "plan-sram":
            captured["m"] = module.clone()

    prog = compile_graph(gp, cfg, before_pass=before)
    fw = find_forwarding(captured["m"])
    retargeted = [c for s in fw.slots for c in s.consumers if not c.whole]
    assert retargeted, "the MLP kernel's row-tile buffers are loaded more than once"
    assert _said(prog)
    _check(prog, model, x, torch.float32)


def test_a_load_of_two_stores_reads_both_buffers_side_by_side():
    """GPT-2's attention kernel stores each row tile of its output as two column blocks
    (six heads each) from two buffers; the projection loads the whole row tile at once.
    The two buffers go side by side into one slot and the projection reads them as one
    buffer; the block matches eager with the sanitisers on."""
    torch.manual_seed(0)
    model = _gpt2_block(768, 12)
    x = (torch.randn(1, 128, 768),)
    gp = _gp(model, x)
    captured = {}

    def before(name, module):
        if name == "plan-sram":
            captured["m"] = module.clone()

    prog = compile_graph(gp, load_config("cloud"), before_pass=before)
    joined = [s for s in find_forwarding(captured["m"]).slots if s.parts]
    assert joined, "the attention output's two column blocks share a slot"
    assert [o for _, o in joined[0].producers] == [0, 384 * 4]  # fp32: the second block 384 columns on
    base = compile_graph(gp, load_config("cloud"), disabled=OFF)
    assert _count(prog, Opcode.DMA_LOAD) < _count(base, Opcode.DMA_LOAD)
    # the two blocks' stores go: no load of the attention output reads them from HBM
    assert _count(prog, Opcode.DMA_STORE) < _count(base, Opcode.DMA_STORE)
    _check(prog, model, x, torch.float32)


def test_slots_share_bytes_between_disjoint_lives_and_leave_out_what_does_not_fit():
    """First fit in launch order among the slots whose lives (producer launch to last
    consumer launch) overlap; a slot past the budget is left out (its tile goes through
    HBM) and counted."""
    def slots():
        return [Slot("a", None, 100, 0, 2), Slot("b", None, 200, 1, 3), Slot("c", None, 100, 3, 5),  # type: ignore[arg-type]
                Slot("d", None, 50, 4, 6)]  # type: ignore[arg-type]

    fw = Forwarding(slots=slots())
    place_slots(fw, 300)
    assert {s.name: s.offset for s in fw.slots} == {"a": 0, "b": 100, "c": 0, "d": 100}
    assert fw.extent == 300 and fw.left_out == 0
    fw = Forwarding(slots=slots())
    place_slots(fw, 250)
    assert {s.name: s.offset for s in fw.slots} == {"a": 0, "c": 0, "d": 100}
    assert fw.extent == 150 and fw.left_out == 1
