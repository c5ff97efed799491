"""Real transformers through torch.export: GPT-2 and BERT from `transformers` (small
random-weight configs, see examples/gpt2.py and examples/bert.py) compiled, run on the
simulator and compared with eager.

Tolerance: `tilecc.runtime.compare.tolerance` (what `tilecc run` uses): fp32 rtol 1e-4, atol 1e-5 x
the largest |output| (observed max abs error ~1.5e-6 on hidden states of magnitude ~4-5:
fp32 matmuls sum in another order than torch's kernels); bf16 rtol 2e-2, atol 2e-2 x
the largest |output| (observed <= 0.03, one bf16 ulp of values around 4-8).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import run_and_compare

import tilecc

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import bert as bert_example  # noqa: E402
import gpt2 as gpt2_example  # noqa: E402

from tilecc.frontend.torch_export import export_model, import_exported_program  # noqa: E402

BUILD = {"gpt2": gpt2_example.build, "bert": bert_example.build}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_fp32_matches_eager(name, attn):
    model, inputs = BUILD[name](attn)
    (ids,) = inputs
    assert ids.dtype == torch.int64 and ids.shape == (1, 16)
    cm = run_and_compare(model, inputs, "tiny")
    r = cm.report
    assert r.roofline_ratio >= 1.0 and r.cycles > 0
    assert r.instructions_by_engine["matrix"] > 0
    spec = cm.program.inputs[0]
    assert spec.torch_dtype == "int64"  # token ids cross the boundary as int32


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_bf16_matches_eager_on_edge(name):
    model, inputs = BUILD[name]("eager", dtype=torch.bfloat16)
    run_and_compare(model, inputs, "edge")


def test_graph_keeps_attention_whole_and_gathers_embeddings():
    model, inputs = gpt2_example.gpt2_sdpa()
    p = import_exported_program(export_model(model, inputs))
    names = [op.name for op in p.func.body.block.ops]
    assert names.count("graph.sdpa") == 2  # one per layer
    assert names.count("graph.gather_rows") == 1  # token embedding; positions are folded
    assert names.count("graph.slice") == 6  # q, k, v split per layer


def test_other_sequence_length_and_a_second_input():
    model, inputs = bert_example.build("sdpa", seq=23)
    cm = run_and_compare(model, inputs, "edge")
    other = torch.randint(0, 1000, (1, 23))
    with torch.no_grad():
        want = model(other)
    torch.testing.assert_close(cm(other), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", pytest.param("bert", marks=pytest.mark.slow)])
def test_dynamic_sequence_length(name):
    """Exported with a symbolic sequence length: the masks and positions are computed
    at run time (comparisons, cumsum, multi-tensor indexing, torch.gather), compiled once
    per length."""
    from torch.export import Dim

    model, inputs = BUILD[name]("eager")
    cm = tilecc.compile(model, inputs, dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=64)}})
    for n in (5, 23):
        ids = torch.randint(0, 1000, (1, n))
        with torch.no_grad():
            want = model(ids)
        torch.testing.assert_close(cm(ids), want, rtol=1e-4, atol=1e-4)
    assert len(cm.programs) == 2


@pytest.mark.parametrize(
    "factory", ["gpt2.py:gpt2", pytest.param("bert.py:bert_sdpa", marks=pytest.mark.slow)]
)
def test_cli_prints_the_report(factory):
    p = subprocess.run(
        [sys.executable, "-m", "tilecc.cli", "run", f"examples/{factory}"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "matches eager     yes" in p.stdout
    assert "roofline ratio" in p.stdout
