"""The fused matmul kernel's bias row on the matrix engine, and its layer-norm prologue's
place in the engine queues (passes/graph_to_tile/fused_matmul.py, matmul.py): compiled
programs match eager, and the stream has the structure the lowering promises."""

import numpy as np
import pytest
import torch
from helpers import run_and_compare

from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.passes.schedule.matmul_schedule import MatmulProblem, MatmulSchedule, candidates
from tilecc.runtime.compare import tolerance
from tilecc.runtime.compiler import compile_graph
from tilecc.runtime.executor import run_program
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import Mem, Opcode


class LnFcGelu(torch.nn.Module):
    """GPT-2's MLP up-projection: ln_2, c_fc (with its bias), gelu_new."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.ln, self.fc = torch.nn.LayerNorm(d), torch.nn.Linear(d, h)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(self.ln(x)), approximate="tanh")


class ProjResidual(torch.nn.Module):
    """GPT-2's c_proj: a linear with its bias, then the residual add."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.proj = torch.nn.Linear(h, d)

    def forward(self, h, x):
        return x + self.proj(h)


def _fused(cm) -> np.ndarray:
    """The stream of the program's one fused matmul kernel."""
    (a, c), = [(a, c) for name, a, c in cm.program.kernels if "fused_matmul" in name]
    return cm.program.stream[a:a + c]


def _bias_matmuls(s: np.ndarray) -> int:
    return int(((s["opcode"] == Opcode.MATMUL) & (s["k"] == 1)).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bias_row_is_added_on_the_matrix_engine(dtype):
    """ln -> linear + bias -> gelu: one K=1 matmul (a ones row times the bias) per
    128-column block of every output tile adds the bias in the accumulator, so the
    evacuation is the gelu alone: no vector op reads two tiles (the add of the bias row
    read the accumulator and the bias tile, twice a copy's cost)."""
    torch.manual_seed(0)
    model = LnFcGelu(256, 512).to(dtype)
    x = torch.randn(1, 256, 256, dtype=dtype)
    cm = run_and_compare(model, (x,), target="cloud")
    s = _fused(cm)
    assert _bias_matmuls(s) == (256 // 128) * (512 // 128)
    two_tiles = (s["opcode"] == Opcode.VEC_BINARY) & (s["flags"] & 6 == 0)  # neither B_COLUMN nor B_IMM
    assert not (two_tiles & ((s["a_mem"] == Mem.ACC) | (s["b_mem"] == Mem.ACC))).any()
    assert any("bias row is added on the matrix engine" in r["message"] for r in cm.program.meta["remarks"])


@pytest.mark.parametrize("target", ["cloud", "tiny"])
def test_bias_row_on_edge_tiles(target):
    """Rows, contraction and columns that are not whole tiles, a batch of two: the bias
    matmuls cover the short last m-tile and column block."""
    torch.manual_seed(5)
    model = LnFcGelu(136, 300).to(torch.bfloat16)
    x = torch.randn(2, 100, 136, dtype=torch.bfloat16)
    cm = run_and_compare(model, (x,), target=target)
    assert _bias_matmuls(_fused(cm)) > 0


def test_bias_and_residual_epilogue_matches_eager():
    """linear + bias + residual: the bias goes to the matrix engine, the residual stays
    the evacuation's one vector add."""
    torch.manual_seed(1)
    model = ProjResidual(256, 384).to(torch.bfloat16)
    h, x = torch.randn(1, 256, 384, dtype=torch.bfloat16), torch.randn(1, 256, 256, dtype=torch.bfloat16)
    cm = run_and_compare(model, (h, x), target="cloud")
    s = _fused(cm)
    assert _bias_matmuls(s) == (256 // 128) * (256 // 128)
    evac = (s["opcode"] == Opcode.VEC_BINARY) & ((s["a_mem"] == Mem.ACC) | (s["b_mem"] == Mem.ACC))
    stores = s["opcode"] == Opcode.DMA_STORE
    assert evac.sum() == stores.sum()  # one add per evacuated tile


def test_a_full_tensor_added_to_the_product_stays_on_the_vector_engine():
    """A second operand that varies along the rows is no bias row: no K=1 matmul."""
    torch.manual_seed(2)
    model = ProjResidual(256, 384).to(torch.bfloat16)
    model.proj.bias = None
    h, x = torch.randn(1, 256, 384, dtype=torch.bfloat16), torch.randn(1, 256, 256, dtype=torch.bfloat16)
    cm = run_and_compare(model, (h, x), target="cloud")
    assert _bias_matmuls(_fused(cm)) == 0


def test_next_layer_norm_waits_behind_the_current_transposes():
    """The layer norm of the m-tile loaded ahead runs on the vector engine after the
    copies of the m-tile being transposed (the engines run their queues in order: before
    them, it held the first matmuls back by a whole layer norm)."""
    torch.manual_seed(3)
    model = LnFcGelu(256, 512).to(torch.bfloat16)
    x = torch.randn(1, 256, 256, dtype=torch.bfloat16)
    s = _fused(run_and_compare(model, (x,), target="cloud"))
    vec = s[(s["opcode"] >= Opcode.VEC_UNARY) & (s["opcode"] <= Opcode.VEC_REDUCE)]
    reduces = np.flatnonzero(vec["opcode"] == Opcode.VEC_REDUCE)
    first_copy = np.flatnonzero((vec["opcode"] == Opcode.VEC_UNARY) & (vec["a_mem"] == Mem.ACC))[0]
    assert len(reduces) == 4  # two per m-tile
    assert reduces[1] < first_copy < reduces[2]  # m-tile 0's norm, its transposes, m-tile 1's norm


def test_a_row_producer_does_not_load_on_the_store_queue():
    """With a fused layer norm producing A, no candidate loads A on the store queue
    (behind the stores, waiting for their evacuations); a plain matmul may."""
    cfg = load_config("cloud")
    plain = MatmulProblem.make(cfg, 512, 768, 2304)
    fused = MatmulProblem(**{**plain.__dict__, "prep_cost": 5.0, "prep_ops": 9})
    store = cfg.dma.queues - 1
    assert any(s.qa[0] == store for s in candidates(plain, cfg))
    got = candidates(fused, cfg)
    assert got and all(s.qa[0] != store for s in got)


def test_gpt2_mlp_projection_kernel_cycles():
    """GPT-2-small's mlp c_proj (512 x 3072 -> 768, bias, residual) on cloud: the bias on
    the matrix engine and the residual tiles loaded on a B queue, not behind the A rows
    (whole 3072-wide m-tiles): 168,667 cycles before both, 134,928 with the bias alone,
    125,770 with both."""
    torch.manual_seed(4)
    model = ProjResidual(768, 3072).to(torch.bfloat16)
    h, x = torch.randn(1, 512, 3072, dtype=torch.bfloat16), torch.randn(1, 512, 768, dtype=torch.bfloat16)
    cm = run_and_compare(model, (h, x), target="cloud")
    assert cm.report.cycles < 130_000, cm.report.cycles


class TwoLinears(torch.nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_written_by_an_earlier_kernel_loads_its_first_rows_whole():
    """The first matmul's A is the program input: its first m-tile loads in row pieces
    on the B queues, ahead of the weights. The second's A is the first kernel's output
    (`MatmulProblem.a_produced`): its first rows load whole on the A queue, so its B
    queues fetch the weights while the first kernel still runs instead of waiting
    behind rows that wait for that kernel's stores."""
    torch.manual_seed(6)
    model = TwoLinears(256, 384).to(torch.bfloat16).eval()
    x = torch.randn(1, 256, 256, dtype=torch.bfloat16)
    cfg = load_config("cloud")
    with torch.no_grad():
        gp = import_exported_program(export_model(model, (x,)))
        expected = model(x)
    seen = []

    def policy(problem, program=None):  # two B queues, so the first rows may go in pieces
        seen.append(problem)
        return MatmulSchedule(1, 2, 1, 2, True, (0, 1), (2,))

    # two matmul kernels: without fuse-mlp (the two linears would be one fused MLP kernel)
    prog = compile_graph(gp, cfg, matmul_policy=policy, disabled={"fuse-mlp"})
    (out,), _ = run_program(prog, (x,), sanitize=True)
    rtol, atol = tolerance(expected.dtype, float(expected.float().abs().max()))
    torch.testing.assert_close(out.float(), expected.float(), rtol=rtol, atol=atol)
    assert [p.a_produced for p in seen] == [False, True]
    kernels = [prog.stream[a:a + c] for name, a, c in prog.kernels if "matmul" in name]

    def a_pieces(s: np.ndarray, k: int) -> int:
        return int(((s["opcode"] == Opcode.DMA_LOAD) & (s["rows"] < 128) & (s["cols"] == k)).sum())

    assert len(kernels) == 2 and a_pieces(kernels[0], 256) == 2 and a_pieces(kernels[1], 384) == 0
