"""The compiler explorer (`tilecc explore`): stages, locations, diffs, timing, remarks."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tilecc.cli import main
from tilecc.explore import STAGES, explore, load_source, render_text
from tilecc.passes import remarks

ROOT = Path(__file__).resolve().parent.parent
BLOCK = f"{ROOT}/examples/transformer_block.py:block"

# ops that carry no user location by design: the module, the functions that hold
# kernels (@forward, @main), terminators, and @main's program inputs
_NO_LOC = re.compile(r"^\s*(builtin\.module|func\.func @(forward|main)|func\.return|scf\.yield|graph\.yield|\}|\^bb)")


@pytest.fixture(scope="module")
def block():
    return explore(load_source(BLOCK), "tiny", 2)


def _op_lines(ir: str) -> list[str]:
    return [ln for ln in ir.splitlines() if ln.strip() and not _NO_LOC.match(ln) and "input = " not in ln]


def test_block_every_stage_with_locations(block):
    assert block.matches is True  # the simulated program equals torch eager
    names = block.pass_names()
    assert names == ["fold-norm-affine", "canonicalize-graph", "fold-norm-weight", "merge-linears", "fuse-graph",
                     "lower-graph-to-tile", "plan-sram", "plan-hbm", "lower-tile-to-npu", "npu-insert-sync"]
    text = render_text(block, print_after_all=True, remarks=True)
    for n in names:
        assert f"// -----// IR Dump After {n} //----- //" in text
    for stage in ("graph", "tile", "npu"):
        lines = _op_lines(block.stage(stage))
        assert lines
        # scf.for prints its attributes after its region: its location is on the closing line
        # and xDSL's custom form of arith.cmpi prints its predicate only, never other
        # attributes (the op has its location: KernelBuilder.finish gives every op one)
        missing = [ln for ln in lines if "tilecc.loc" not in ln and not ln.lstrip().startswith("scf.for")
                   and " = arith.cmpi " not in ln]
        assert not missing, f"{stage}: ops without a location: {missing[:3]}"
        assert all("transformer_block.py:" in ln for ln in lines if "tilecc.loc" in ln)
    # every asm instruction ends in the model line that caused it
    asm = [ln for ln in block.asm.splitlines() if ln and not ln.startswith(("#", "barrier"))]
    assert len(asm) == sum(n for _, _, n in block.program.kernels)
    lines_used = {int(m.group(1)) for ln in asm for m in [re.search(r"transformer_block\.py:(\d+)$", ln)] if m}
    # "# attn.q (Linear) @ transformer_block.py:22": the layer, then the line
    assert all(re.search(r"# ([\w.]+ \(\w+\) @ )?transformer_block\.py:\d+$", ln) for ln in asm)
    assert any("# attn.proj (Linear) @ transformer_block.py:29" in ln for ln in asm)
    src = Path(ROOT / "examples/transformer_block.py").read_text().splitlines()
    # q/k/v (one merged matmul, ln1 its prologue: passes/graph/merge_linears.py), the explicit
    # attention (scores, softmax, probs @ v: recognised as one flash kernel, which carries the
    # softmax's line), proj, the second residual
    assert {22, 27, 29, 42} <= lines_used
    assert "softmax" in src[27 - 1] and "self.proj" in src[29 - 1]


def test_block_remarks_one_per_decision(block):
    text = render_text(block, remarks=True)
    # the MLP's two matmul groups are wrapped in one "mlp" group (passes/graph/fuse_mlp.py)
    mlp_groups = block.stage("graph").count('graph.fused "mlp"')
    fused_ops = block.stage("graph").count("graph.fused") - mlp_groups
    by = lambda p, k: [r for r in block.remarks if r.pass_name == p and r.kind == k]  # noqa: E731
    assert len(by("fuse-graph", "passed")) == fused_ops == 4
    assert len(by("fuse-mlp", "passed")) == mlp_groups == 1
    assert all(re.fullmatch(r"([\w.]+ \(\w+\) @ )?transformer_block\.py:\d+", r.loc) for r in by("fuse-graph", "passed"))
    # the explicit attention (matmul, scale, softmax, matmul) is one graph.sdpa
    (attn,) = by("canonicalize-graph", "passed")
    assert "explicit attention" in attn.message and "graph.sdpa" in attn.message
    # ln2 and the second residual add stay out of attn.proj's group; mlp.2's "did not
    # fuse into mlp.0's group" is withdrawn, since fuse-mlp joins the two groups
    missed = by("fuse-graph", "missed")
    assert missed and all("attn.proj" in r.message for r in missed)
    (merged,) = by("merge-linears", "passed")  # q, k and v: one matmul, so ln1 has one reader
    assert "merged 3 linears" in merged.message
    # one schedule remark per -O2 matmul kernel, one tiling remark per elementwise kernel
    tile = block.stage("tile")
    matmul_kernels = len(re.findall(r"func\.func @k\d+_(fused_)?matmul\(", tile))
    sched = [r for r in by("lower-graph-to-tile", "passed") if "chose tile" in r.message]
    # q, k and v merged (one launch), proj: 2 matmul kernels; the MLP's two linears one
    # fused MLP kernel (passes/graph_to_tile/mlp/), which says so
    assert len(sched) == matmul_kernels == 2
    assert len(re.findall(r"func\.func @k\d+_fused_mlp\(", tile)) == 1
    assert len([r for r in by("lower-graph-to-tile", "passed") if "hidden computed transposed" in r.message]) == 1
    assert all(re.search(r"estimated [\d,]+ cycles \(best of \d+ schedules\)", r.message) for r in sched)
    buffering = [r for r in block.remarks if "multi-buffered x" in r.message]
    assert buffering and all(r.loc for r in buffering)
    kernels = len({name.split("#")[0] for name, _, _ in block.program.kernels})  # planned once each
    assert len(by("plan-sram", "analysis")) == kernels
    assert len(by("plan-hbm", "analysis")) == 1
    hbm = by("plan-hbm", "analysis")[0].message
    plan = block.program.meta["hbm"]
    assert f"HBM {plan['size']:,} bytes" in hbm and f"peak at {plan['intermediate_peak']:,}" in hbm
    assert f"// -----// Remarks ({len(block.remarks)}) //----- //" in text
    # the report keeps them
    assert block.report.remarks == block.program.meta["remarks"]
    assert f"remarks           {len(block.remarks)} (" in str(block.report)


def test_asm_listing_parses_back(block):
    from tilecc.codegen.asm import parse_asm

    assert np.array_equal(parse_asm(block.asm), block.program.stream)


def test_diff_and_unchanged_passes(block):
    text = render_text(block, diff=True)
    for p in block.passes:
        if p.changed:
            assert f"// -----// Diff {p.name} //----- //" in text
        else:
            assert f"// -----// {p.name}: no change //----- //" in text
    assert next(p for p in block.passes if p.name == "canonicalize-graph").changed  # the attention
    diff = text.split("// -----// Diff fuse-graph //----- //")[1].split("// -----//")[0]
    assert "--- before fuse-graph" in diff and "+++ after fuse-graph" in diff
    assert re.search(r'^\+.*graph\.fused "matmul"', diff, re.M)


def test_timing_table(block):
    text = render_text(block, timing=True)
    assert "... Execution time report ..." in text and "----Wall Time----  ----Name----" in text
    rows = re.findall(r"^\s+(\d+\.\d+) \(\s*([\d.]+)%\)  (\S+)$", text, re.M)
    names = [n for _, _, n in rows]
    assert names == ["torch.export", "import", *block.pass_names(), "Total"]
    total = float(rows[-1][0])
    assert abs(sum(float(s) for s, _, _ in rows[:-1]) - total) < 1e-3 + 1e-6 * len(rows)


def test_print_before_after_and_stages(block):
    text = render_text(block, print_before=("plan-sram",), print_after=("plan-sram",))
    before = text.split("// -----// IR Dump Before plan-sram //----- //")[1].split("// -----//")[0]
    after = text.split("// -----// IR Dump After plan-sram //----- //")[1]
    assert "offset = " not in before.split("func.func @main")[0]  # buffers unplanned before
    assert re.search(r'tile\.alloc \{[^}]*offset = \d+', after)
    assert "IR Dump After fuse-graph" not in text
    assert render_text(block, stage="asm").startswith("# kernel k0_")
    assert render_text(block, stage="graph").startswith("builtin.module")
    assert "npu.kernel" in render_text(block, stage="npu") and "tile.alloc" in render_text(block, stage="tile")
    assert set(STAGES) == {"graph", "tile", "npu", "asm"}


def test_cli_explore_one_line_errors(capsys):
    assert main(["explore", BLOCK, "--print-ir-after", "nosuch-pass", "--no-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown pass 'nosuch-pass'") and err.count("\n") == 1
    assert main(["explore", "model.onnx"]) == 2
    assert "expected FILE.py:FACTORY" in capsys.readouterr().err
    assert main(["explore", str(ROOT / "examples/mlp.py")]) == 2
    assert "expected FILE.py:FACTORY" in capsys.readouterr().err


def test_cli_explore_mlp_o0(capsys):
    assert main(["explore", f"{ROOT}/examples/mlp.py:mlp", "-O0", "--stage", "asm", "--remarks"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# kernel k0_")
    assert re.search(r"^matmul .*# \w+ \(Linear\) @ mlp\.py:\d+$", out, re.M)
    assert "remark [lower-graph-to-tile]" in out and "remark [fuse-graph]" not in out  # no fusion at -O0


_IR = """
builtin.module {
  func.func @forward(%x: tensor<20x8xf32>) -> tensor<20x5xf32> {
    %w = graph.weight "fc.weight" {tilecc.loc = "toy.mlir:4"} : tensor<8x5xf32>
    %m = graph.matmul %x, %w {tilecc.loc = "toy.mlir:5"} : tensor<20x8xf32>, tensor<8x5xf32> -> tensor<20x5xf32>
    %r = graph.relu %m {tilecc.loc = "toy.mlir:6"} : tensor<20x5xf32>
    func.return %r : tensor<20x5xf32>
  }
}
"""


def test_explore_ir_file(tmp_path, capsys):
    path = tmp_path / "toy.mlir"
    path.write_text(_IR)
    ex = explore(load_source(str(path)), "tiny", 2)
    assert ex.matches is True  # against the graph interpreter on the same seeded data
    assert any(r.pass_name == "fuse-graph" and "matmul, relu" in r.message for r in ex.remarks)
    assert re.search(r"# toy\.mlir:5$", ex.asm, re.M)
    assert main(["explore", str(path), "--stage", "tile"]) == 0
    assert "tile.matmul" in capsys.readouterr().out
    tile_ir = tmp_path / "tile.mlir"
    tile_ir.write_text("builtin.module {\n}\n")
    assert main(["explore", str(tile_ir)]) == 2
    assert "graph-level IR" in capsys.readouterr().err
    bad = tmp_path / "bad.mlir"
    bad.write_text("builtin.module { func.func @forward() { fuc.return } }")
    assert main(["explore", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:1:") and "fuc.return is not registered" in err


def test_tile_dsl_source(capsys):
    """A tile-DSL file (with its input shapes) explores like a model: the kernel is
    inlined by lower-graph-to-tile, every stage and asm line points at the .tdsl line,
    and the run matches the kernel run directly."""
    src = str(ROOT / "examples" / "kernels" / "softmax.tdsl")
    assert main(["explore", f"{src}:40x17", "--print-ir-after-all", "--remarks"]) == 0
    out = capsys.readouterr().out
    assert "lower-graph-to-tile" in out and "npu-insert-sync" in out
    assert "softmax.tdsl:6:" in out
    asm = [ln for ln in out.splitlines() if ln.startswith(("dma.", "vec.", "mm."))]
    assert asm and all("# " in ln and "softmax.tdsl:" in ln for ln in asm)
    assert main(["explore", src]) == 2
    err = capsys.readouterr().err
    assert "needs its input shapes" in err and f"{src}:64x64" in err


def test_remarks_scopes():
    remarks.emit("p", "passed", lambda: 1 / 0)  # no collector: a no-op, the message never built
    assert not remarks.enabled()
    with remarks.collecting() as outer:
        remarks.emit("p", "passed", "a", "m.py:1")
        with remarks.collecting() as inner:  # a nested compile keeps its own
            with remarks.at("m.py:7"):
                remarks.emit("q", "missed", lambda: "b")
        remarks.emit("p", "analysis", "c")
        with pytest.raises(ValueError, match="remark kind 'bogus'"):
            remarks.emit("p", "bogus", "d")
    assert [(r.pass_name, r.kind, r.message, r.loc) for r in outer.remarks] == [
        ("p", "passed", "a", "m.py:1"), ("p", "analysis", "c", "")]
    assert [str(r) for r in inner.remarks] == ["m.py:7: remark [q] missed: b"]
    assert remarks.Remark.from_dict(inner.to_json()[0]) == inner.remarks[0]


def test_diff_without_gnu_diff_matches(block, monkeypatch):
    """difflib (where GNU diff is absent) and GNU diff agree on a small pass's diff."""
    import tilecc.explore as explore_mod

    p = next(p for p in block.passes if p.name == "fuse-graph")
    with_gnu = explore_mod.pass_diff(p)
    monkeypatch.setattr(explore_mod.shutil, "which", lambda _name: None)
    without = explore_mod.pass_diff(p)
    changed = lambda d: sorted(ln for ln in d.splitlines() if ln[:1] in "+-")  # noqa: E731
    assert changed(with_gnu) == changed(without)


def test_location_links_are_linear():
    import time

    from tilecc.explore_html import _link_locs

    text = "dense<\"0x" + "0A1B2C3D." * 40000 + "\"> at model.py:12 and other.py:3"
    t0 = time.perf_counter()
    out = _link_locs(text, "examples/model.py")
    assert time.perf_counter() - t0 < 1.0
    assert out.endswith("<a href='#L12'>model.py:12</a> and other.py:3")
