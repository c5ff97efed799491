"""Indexing, slicing, joining, comparisons, selection, integer tensors and attention:
the ISA's DMA_GATHER and comparison functions, the graph / tile / npu ops, the importer
and each op end to end on the simulator against eager PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run_and_compare
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Region
from xdsl.parser import Parser

import tilecc
from tilecc.codegen import asm as asm_mod
from tilecc.codegen.asm import format_instruction, parse_asm, print_asm
from tilecc.codegen.binary import decode_stream, encode_stream, validate_stream
from tilecc.errors import (
    AsmSyntaxError,
    InputMismatchError,
    MemoryAccessError,
    ProgramFormatError,
    ShapeError,
    SimulatorError,
)
from tilecc.frontend.torch_export import export_model, import_exported_program
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir.graph_interp import run_graph
from tilecc.runtime.program import Program
from tilecc.simulator import numerics
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import OPCODE_ENGINE, BinaryFn, DType, Engine, Mem, Opcode
from tilecc.simulator.machine import simulate

F32, BF16, F16, I32 = DType.F32, DType.BF16, DType.F16, DType.I32
# each case compiles a model (about a second): generate, but do not spend minutes shrinking
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
E2E = settings(
    max_examples=4, deadline=None, phases=NO_SHRINK, suppress_health_check=list(HealthCheck)
)


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# --------------------------------------------------------------------------- ISA: DMA_GATHER

GATHER_LINE = (
    "dma.gather q1 hbm[0x1000 rs=768 bound=1000]:f32, index sram[p0 +0x0]:i32 "
    "-> sram[p2 +0x40]:f32 16x768 wait(s1>=2) signal(s0)"
)


def test_gather_isa_definition():
    assert Opcode.DMA_GATHER == 7 and OPCODE_ENGINE[Opcode.DMA_GATHER] == Engine.DMA
    assert [f.name for f in BinaryFn][7:] == ["EQ", "NE", "LT", "LE", "GT", "GE", "MASK"]


def test_gather_asm_round_trip():
    s = parse_asm(GATHER_LINE + "\n")
    r = s[0]
    assert r["opcode"] == Opcode.DMA_GATHER and r["queue"] == 1
    assert (r["a_mem"], r["a_addr"], r["hbm_rs"], r["k"], r["hbm_cs"]) == (Mem.HBM, 0x1000, 768, 1000, 0)
    assert (r["b_mem"], r["b_part"], r["b_addr"], r["b_dtype"]) == (Mem.SRAM, 0, 0, I32)
    assert (r["o_part"], r["o_addr"], r["rows"], r["cols"]) == (2, 0x40, 16, 768)
    assert format_instruction(r) == GATHER_LINE
    assert asm_mod._parse(GATHER_LINE, fast=False).tobytes() == s.tobytes()
    assert decode_stream(encode_stream(s)).tobytes() == s.tobytes()
    free = "dma.gather  q1 hbm[4096 rs=768 bound=1000]:f32 ,index sram[p0 +0]:i32->sram[p2 +64]:f32 16x768 wait(s1>=2) signal(s0) # c"
    assert parse_asm(free).tobytes() == s.tobytes()
    # negative row strides are allowed (the static check bounds the whole table)
    neg = "dma.gather q0 hbm[0x2000 rs=-4 bound=3]:bf16, index acc[p1 +0x8]:i32 -> sram[p0 +0x0]:bf16 3x4"
    assert print_asm(parse_asm(neg)) == neg + "\n"


def test_comparison_and_mask_asm_names():
    for name in ("eq", "ne", "lt", "le", "gt", "ge", "mask"):
        line = f"vec.{name} sram[p0 +0x0]:f32, imm 0.5 -> sram[p0 +0x40]:i32 4x8"
        assert print_asm(parse_asm(line)) == line + "\n"
        line = f"vec.{name}.swap sram[p0 +0x0]:bf16, col sram[p0 +0x80]:f32 -> sram[p0 +0x40]:f32 4x8"
        assert print_asm(parse_asm(line)) == line + "\n"


@pytest.mark.parametrize(
    "line, message",
    [
        ("dma.gather q0 hbm[0x0 rs=1 cs=1]:f32, index sram[p0 +0x0]:i32 -> sram[p0 +0x0]:f32 1x1",
         "15: the source of dma.gather is an hbm table hbm[ADDR rs=ROW_STRIDE bound=ROWS]"),
        ("dma.load q0 hbm[0x0 rs=1 bound=4]:f32 -> sram[p0 +0x0]:f32 1x1",
         "13: the hbm operand of dma.load is written hbm[ADDR rs=ROW_STRIDE cs=COL_STRIDE]"),
        ("dma.gather q0 hbm[0x0 rs=1 bound=1]:f32, sram[p0 +0x0]:i32 -> sram[p0 +0x0]:f32 1x1",
         "42: expected 'index', got 'sram'"),
        ("dma.gather q0 hbm[0x0 rs=1 bound=1]:f32, index hbm[0x0 rs=1 cs=1]:i32 -> sram[p0 +0x0]:f32 1x1",
         "48: the index operand of dma.gather is on chip (sram or acc), not hbm"),
        ("dma.gather q0 hbm[0x0 rs=1 bound=1]:f32, index sram[p0 +0x0]:i32 -> hbm[0x0 rs=1 cs=1]:f32 1x1",
         "69: the destination of dma.gather is on chip (sram or acc), not hbm"),
        ("dma.gather q0 hbm[0x0 rs=1 bound=x]:f32, index sram[p0 +0x0]:i32 -> sram[p0 +0x0]:f32 1x1",
         "34: expected a number, got 'x'"),
    ],
)
def test_gather_asm_errors(line, message):
    with pytest.raises(AsmSyntaxError) as info:
        parse_asm(line)
    assert str(info.value).splitlines()[0].startswith(f"line 1:{message}")


def test_gather_canonical_form():
    s = parse_asm(GATHER_LINE)
    s["hbm_cs"] = 1  # a gather reads contiguous rows: hbm_cs is unused
    with pytest.raises(ProgramFormatError, match="record 0: hbm_cs = 1, but dma_gather does not use hbm_cs"):
        print_asm(s)
    s = parse_asm(GATHER_LINE)
    s["b_mem"] = Mem.HBM
    with pytest.raises(ProgramFormatError, match="b_mem = HBM, but dma_gather needs this operand on chip"):
        validate_stream(s, strict=True)


# --------------------------------------------------------------------------- simulator

TABLE_AT, INDEX_AT, OUT_AT = 0x1000, 0x8000, 0x9000


def run_gather(table: np.ndarray, index: np.ndarray, col: int, cols: int, *, bound=None):
    """Load `index` onto partitions, gather `cols` columns from `col` of each row, store."""
    cfg = load_config("tiny")
    hbm = np.zeros(1 << 16, np.uint8)
    t = np.ascontiguousarray(table, dtype=np.float32)
    hbm[TABLE_AT : TABLE_AT + t.nbytes] = t.view(np.uint8).ravel()
    idx = np.ascontiguousarray(index, dtype=np.int32)
    hbm[INDEX_AT : INDEX_AT + idx.nbytes] = idx.view(np.uint8)
    n, (V, D) = len(idx), t.shape
    bound = V if bound is None else bound
    text = f"""
    dma.load q0 hbm[{INDEX_AT} rs=1 cs=1]:i32 -> sram[p0 +0x0]:i32 {n}x1 signal(s0)
    dma.gather q1 hbm[{TABLE_AT + 4 * col} rs={D} bound={bound}]:f32, index sram[p0 +0x0]:i32 -> sram[p0 +0x40]:f32 {n}x{cols} wait(s0>=1) signal(s1)
    dma.store q0 sram[p0 +0x40]:f32 -> hbm[{OUT_AT} rs={cols} cs=1]:f32 {n}x{cols} wait(s1>=1)
    barrier
    """
    result = simulate(parse_asm(text), cfg, hbm)
    return hbm[OUT_AT : OUT_AT + 4 * n * cols].view(np.float32).reshape(n, cols), result


def test_gather_copies_indexed_rows():
    table = np.arange(10 * 8, dtype=np.float32).reshape(10, 8)
    index = np.array([3, 0, 9, 3, 5])
    out, result = run_gather(table, index, 2, 5)
    np.testing.assert_array_equal(out, table[index, 2:7])
    assert result.instructions_by_engine["dma"] == 3
    assert result.hbm_bytes_read == 4 * 5 + 4 * 5 * 5  # indices, then the gathered rows


@pytest.mark.parametrize("bad, where", [(10, 2), (-1, 0)])
def test_gather_index_out_of_range(bad, where):
    index = np.array([3, 0, 9, 3])
    index[where] = bad
    with pytest.raises(MemoryAccessError) as info:
        run_gather(np.zeros((10, 8)), index, 0, 8)
    msg = str(info.value)
    assert msg.startswith("instruction 1 (dma1 DMA_GATHER): gather index")
    assert f"index {bad} (row {where} of the index column) out of range for a table of 10 rows" in msg


def test_gather_table_is_checked_statically():
    with pytest.raises(MemoryAccessError, match=r"instruction 1 \(dma1 DMA_GATHER\): table HBM bytes"):
        run_gather(np.zeros((10, 8)), np.array([0]), 0, 8, bound=1 << 20)
    line = GATHER_LINE.replace(" wait(s1>=2) signal(s0)", "")
    s = parse_asm(line)
    s["b_dtype"] = F32
    with pytest.raises(SimulatorError, match="gather indices are i32"):
        simulate(s, load_config("tiny"), np.zeros(1 << 22, np.uint8))
    s = parse_asm(line)
    s["k"] = 0
    with pytest.raises(SimulatorError, match="empty gather table"):
        simulate(s, load_config("tiny"), np.zeros(1 << 22, np.uint8))


def run_vector(line: str, a: np.ndarray, b: np.ndarray | None, out_dtype: str) -> np.ndarray:
    """SRAM a at 0x0 (f32), b at 0x100 (f32), one vector op, output (dtype) at 0x200."""
    cfg = load_config("tiny")
    hbm = np.zeros(1 << 14, np.uint8)
    rows, cols = a.shape
    hbm[0 : a.size * 4] = a.astype(np.float32).view(np.uint8).ravel()
    text = f"dma.load q0 hbm[0x0 rs={cols} cs=1]:f32 -> sram[p0 +0x0]:f32 {rows}x{cols} signal(s0)\n"
    if b is not None:
        hbm[0x1000 : 0x1000 + b.size * 4] = b.astype(np.float32).view(np.uint8).ravel()
        bc = b.shape[1]
        text += f"dma.load q1 hbm[0x1000 rs={bc} cs=1]:f32 -> sram[p0 +0x100]:f32 {rows}x{bc} signal(s1)\n"
    text += line.format(shape=f"{rows}x{cols}") + " wait(s0>=1" + (", s1>=1" if b is not None else "") + ") signal(s2)\n"
    text += f"dma.store q0 sram[p0 +0x200]:{out_dtype} -> hbm[0x2000 rs={cols} cs=1]:{out_dtype} {rows}x{cols} wait(s2>=1)\nbarrier\n"
    simulate(parse_asm(text), cfg, hbm)
    dt = {"f32": np.float32, "i32": np.int32}[out_dtype]
    return hbm[0x2000 : 0x2000 + a.size * 4].view(dt).reshape(a.shape)


SPECIAL = np.array([[0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5]], dtype=np.float32)


@pytest.mark.parametrize(
    "fn, ref",
    [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
     ("gt", np.greater), ("ge", np.greater_equal)],
)
def test_vector_comparisons_follow_ieee(fn, ref):
    a = SPECIAL
    b = SPECIAL[:, ::-1].copy()
    got = run_vector(f"vec.{fn} sram[p0 +0x0]:f32, sram[p0 +0x100]:f32 -> sram[p0 +0x200]:f32 {{shape}}", a, b, "f32")
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, ref(a, b).astype(np.float32))
    got = run_vector(f"vec.{fn}.swap sram[p0 +0x0]:f32, imm 1 -> sram[p0 +0x200]:i32 {{shape}}", a, None, "i32")
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, ref(np.float32(1), a).astype(np.int32))


def test_vector_mask_selects_without_leaking_inf_or_nan():
    a = SPECIAL
    cond = np.array([[1, 0, 1, 0, 0, 1, 0, 1]], dtype=np.float32)
    got = run_vector("vec.mask sram[p0 +0x0]:f32, sram[p0 +0x100]:f32 -> sram[p0 +0x200]:f32 {shape}", a, cond, "f32")
    np.testing.assert_array_equal(got, np.where(cond != 0, a, 0).astype(np.float32))
    got = run_vector("vec.mask.swap sram[p0 +0x0]:f32, imm -inf -> sram[p0 +0x200]:f32 {shape}", cond, None, "f32")
    np.testing.assert_array_equal(got, np.where(cond != 0, -np.inf, 0).astype(np.float32))


def test_i32_outputs_truncate_toward_zero_and_saturate():
    a = np.array([[2.9, -2.9, 0.5, -0.5, 3e9, -3e9, np.nan, 16777217.0]], dtype=np.float32)
    got = run_vector("vec.copy sram[p0 +0x0]:f32 -> sram[p0 +0x200]:i32 {shape}", a, None, "i32")
    assert got.tolist() == [[2, -2, 0, 0, 2**31 - 1, -(2**31), 0, 16777216]]
    assert numerics.round_to(np.array([2.7, -2.7], np.float32), I32).tolist() == [2.0, -2.0]


# --------------------------------------------------------------------------- graph ops

T = g.tensor_type


def _dt(x):
    return g.element_dtype(x.type)


def _gather(x):
    ids = g.ConstantOp.make(np.array([[3, 0, 1], [2, 2, 3]]), I32)
    return gi.GatherRowsOp.make(x, ids, loc="emb.py:1")


def _slice(x):
    return [gi.SliceOp.make(x, 1, 1, None, 2, loc="s.py:1"), gi.SliceOp.make(x, -2, -3, 10)]


def _concat(x):
    return gi.ConcatOp.make([x, x, gi.SliceOp.make(x, 1, 0, 2)], -1, loc="c.py:2")


def _unary(cls):
    return lambda x: cls.make(x, loc="u.py:3")


def _binary(cls):
    def body(x):
        c = g.ConstantOp.make(np.array(2.0), _dt(x))
        y = cls.make(x, c, loc="b.py:1")
        return cls.make(y, g.WeightOp.make("row", T([6], _dt(x))))

    return body


def _compare(cls):
    def body(x):
        c = g.ConstantOp.make(np.array(2.0), _dt(x))
        return [cls.make(x, c, loc="cmp.py:1"), cls.make(x, g.WeightOp.make("row", T([6], _dt(x))))]

    return body


def _where(x):
    c = gi.GtOp.make(x, g.WeightOp.make("row", T([6], _dt(x))))
    # (a -inf graph.constant prints as dense<0xff800000>, which xdsl reads back as an integer)
    return gi.WhereOp.make(c, x, g.ConstantOp.make(np.array(-1e4), _dt(x)), loc="w.py:4")


def _log_softmax(x):
    return gi.LogSoftmaxOp.make(x, -1, loc="l.py:5")


def _sdpa(x):
    q = g.ReshapeOp.make(x, [2, 2, 6])
    mask = g.ConstantOp.make(np.zeros((2, 2)), _dt(x))
    return [
        gi.SdpaOp.make(q, q, q, causal=True, loc="a.py:6"),
        gi.SdpaOp.make(q, q, q, mask, scale=0.25),
    ]


INDEX_BUILDERS = {
    "graph.gather_rows": _gather,
    "graph.slice": _slice,
    "graph.concat": _concat,
    **{cls.name: _unary(cls) for cls in (gi.AbsOp, gi.LogOp, gi.ErfOp)},
    **{cls.name: _binary(cls) for cls in (gi.PowOp, gi.MinimumOp)},
    **{cls.name: _compare(cls) for cls in gi.COMPARE_OPS},
    "graph.where": _where,
    "graph.log_softmax": _log_softmax,
    "graph.sdpa": _sdpa,
}
"""One builder per op of the family (also used by test_graph_ir's round-trip test)."""


def build(arg_types, body) -> ModuleOp:
    block = Block(arg_types=arg_types)
    with ImplicitBuilder(block):
        outs = body(*block.args)
        outs = outs if isinstance(outs, list) else [outs]
        outs = [o.results[0] if hasattr(o, "results") else o for o in outs]
        func.ReturnOp(*outs)
    fn = func.FuncOp("forward", (list(arg_types), [o.type for o in outs]), Region(block))
    return ModuleOp([fn])


def test_every_index_op_has_a_builder():
    assert set(INDEX_BUILDERS) == {op.name for op in gi.INDEX_OPS}
    ctx = g.graph_context()
    for op in gi.INDEX_OPS:
        assert ctx.get_optional_op(op.name) is op


@pytest.mark.parametrize("opname", sorted(INDEX_BUILDERS))
@pytest.mark.parametrize("dt", [F32, BF16])
def test_printed_form_round_trips(opname, dt):
    module = build([T([4, 6], dt)], INDEX_BUILDERS[opname])
    module.verify()
    text = str(module)
    parsed = Parser(g.graph_context(), text).parse_module()
    parsed.verify()
    assert parsed.is_structurally_equivalent(module)
    assert str(parsed) == text
    assert any(g.source_loc(op) != g.UNKNOWN_LOC for op in parsed.walk() if op.name == opname)


def test_sample_text():
    text = """
    builtin.module {
      func.func @forward(%t: tensor<10x8xf32>, %ids: tensor<2x3xi32>) -> tensor<2x3x4xf32> {
        %e = graph.gather_rows %t, %ids : tensor<10x8xf32>, tensor<2x3xi32> -> tensor<2x3x8xf32>
        %s = graph.slice %e dim 2 start 1 end 8 step 2 : tensor<2x3x8xf32> -> tensor<2x3x4xf32>
        %z = graph.constant dense<0.0> : tensor<f32>
        %m = graph.lt %s, %z : tensor<2x3x4xf32>, tensor<f32> -> tensor<2x3x4xi32>
        %w = graph.where %m, %z, %s : tensor<2x3x4xi32>, tensor<f32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32>
        func.return %w : tensor<2x3x4xf32>
      }
    }
    """
    m = Parser(g.graph_context(), text).parse_module()
    m.verify()
    p = g.GraphProgram(m, {}, ["t", "ids"], ["out"])
    t = np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)
    ids = np.array([[1, 9, 0], [4, 4, 2]])
    (out,) = run_graph(p, [t, ids])
    np.testing.assert_array_equal(out, np.maximum(t[ids][..., 1::2], 0))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda x, i: gi.GatherRowsOp.make(x, x), "indices must be i32"),
        (lambda x, i: gi.GatherRowsOp.make(g.ConstantOp.make(np.array(1.0), F32), i), "rank >= 1"),
        (lambda x, i: gi.SliceOp.make(x, 2, 0, 1), "dim 2 out of range for rank 2"),
        (lambda x, i: gi.SliceOp.make(x, 0, 0, 1, 0), "step must be >= 1"),
        (lambda x, i: gi.ConcatOp.make([x, i], 0), "operand element types differ"),
        (lambda x, i: gi.ConcatOp.make([x, g.ReshapeOp.make(x, [6, 4])], 0), "differ outside dim 0"),
        (lambda x, i: gi.LtOp.make(x, g.ReshapeOp.make(x, [6, 4])), "do not broadcast"),
        (lambda x, i: gi.WhereOp.make(i, x, g.CastOp.make(x, BF16)), "operand element types differ"),
        (lambda x, i: gi.LogSoftmaxOp.make(x, 3), "dim 3 out of range"),
        (lambda x, i: gi.SdpaOp.make(x, g.ReshapeOp.make(x, [6, 4]), x), "head sizes differ"),
    ],
)
def test_shape_errors(make, message):
    block = Block(arg_types=[T([4, 6], F32), T([4, 6], I32)])
    with ImplicitBuilder(block):
        with pytest.raises(ShapeError, match=message):
            make(*block.args)


def test_verifier_rejects_wrong_result_type():
    block = Block(arg_types=[T([4, 6], F32)])
    with ImplicitBuilder(block):
        op = gi.SliceOp.make(block.args[0], 1, 0, 3)
        bad = gi.SliceOp.create(operands=[block.args[0]], result_types=[T([4, 2], F32)],
                                properties=dict(op.properties))
        func.ReturnOp()
    from xdsl.utils.exceptions import VerifyException

    with pytest.raises(VerifyException, match="does not match the inferred type"):
        bad.verify()


def test_references_match_torch():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    block = Block(arg_types=[T([4, 6], F32)])
    with ImplicitBuilder(block):
        a = block.args[0]
        outs = [
            gi.LogSoftmaxOp.make(a, 1), gi.ErfOp.make(a), gi.PowOp.make(gi.AbsOp.make(a), a),
            gi.SdpaOp.make(g.ReshapeOp.make(a, [2, 2, 6]), g.ReshapeOp.make(a, [2, 2, 6]),
                           g.ReshapeOp.make(a, [2, 2, 6]), causal=True),
        ]
        func.ReturnOp(*outs)
    fn = func.FuncOp("forward", ([T([4, 6], F32)], [o.results[0].type for o in outs]), Region(block))
    got = run_graph(g.GraphProgram(ModuleOp([fn]), {}, ["x"], []), [x])
    t = torch.from_numpy(x)
    q = t.reshape(2, 2, 6)
    want = [F.log_softmax(t, 1), torch.erf(t), t.abs() ** t,
            F.scaled_dot_product_attention(q, q, q, is_causal=True)]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- tile / npu IR


def test_tile_and_npu_levels_round_trip():
    """The tile kernel of an embedding holds tile.gather, npu.dma_gather after selection;
    both print and parse back."""
    from tilecc.ir.npu import Npu
    from tilecc.ir.tile import Tile
    from tilecc.runtime.compiler import compile_graph

    gp = import_exported_program(export_model(torch.nn.Embedding(20, 40), (torch.randint(0, 20, (3, 7)),)))
    texts = {}

    def grab(name, module):
        texts[name] = str(module)

    compile_graph(gp, load_config("tiny"), after_pass=grab)
    assert "tile.gather" in texts["lower-graph-to-tile"]
    assert "npu.dma_gather" in texts["npu-insert-sync"]
    from xdsl.context import Context
    from xdsl.dialects import arith, scf
    from xdsl.dialects.builtin import Builtin

    for stage in ("plan-hbm", "npu-insert-sync"):
        ctx = Context()
        for d in (Builtin, func.Func, arith.Arith, scf.Scf, Tile, Npu):
            ctx.load_dialect(d)
        m = Parser(ctx, texts[stage]).parse_module()
        m.verify()
        assert str(m) == texts[stage]


# --------------------------------------------------------------------------- end to end

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(dtype):
    emb = torch.nn.Embedding(57, 37).to(dtype)
    run_and_compare(emb, (torch.randint(0, 57, (3, 11)),))


def test_embedding_wide_rows_on_edge():
    # 700 columns: several column tiles per gathered row; 37 indices: a partial row tile
    run_and_compare(torch.nn.Embedding(300, 700), (torch.randint(0, 300, (37,)),), "edge")


def test_embedding_index_out_of_range_is_a_memory_access_error():
    cm = tilecc.compile(torch.nn.Embedding(10, 8), (torch.randint(0, 10, (5,)),))
    with pytest.raises(MemoryAccessError, match=r"DMA_GATHER\): gather index 12 \(row 3"):
        cm(torch.tensor([1, 2, 3, 12, 0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_tensor_and_index_select(dtype):
    x = torch.randn(9, 6, 5, dtype=dtype)
    idx = torch.tensor([[0, -1, 3], [8, -9, 2]])  # negative indices count from the end
    sel = torch.tensor([4, 0, 2, 2])
    run_and_compare(Fn(lambda x, i, s: (x[i], x[:, i[0]], torch.index_select(x, 2, s))), (x, idx, sel))


def test_multi_index_and_torch_gather():
    x = torch.randn(4, 5, 6, 3)
    i = torch.tensor([[0, 3], [-1, 2]])
    j = torch.tensor([1, -2])
    g1 = torch.randint(0, 5, (4, 7, 6, 3))
    g3 = torch.randint(0, 3, (3, 5, 2, 2))

    def f(x, i, j, g1, g3):
        return x[i, j], x[:, i, j], x[:, :, i, j[:1]], x[i[0], j, 2], torch.gather(x, 1, g1), torch.gather(x, 3, g3)

    run_and_compare(Fn(f), (x, i, j, g1, g3))


@E2E
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
)
def test_slice_select_narrow_random(shape, data, dtype):
    dim = data.draw(st.integers(0, len(shape) - 1))
    n = shape[dim]
    start = data.draw(st.integers(-n, n - 1))
    step = data.draw(st.integers(1, 3))
    x = torch.randn(*shape, dtype=dtype)
    i = data.draw(st.integers(-n, n - 1))

    def f(x):
        idx = [slice(None)] * len(shape)
        idx[dim] = slice(start, None, step)
        out = [x[tuple(idx)] * 1, x.select(dim, i) + 0]
        if n > 1:
            out.append(x.narrow(dim, 1, n - 1) * 1)
        return tuple(out)

    run_and_compare(Fn(f), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_slices(dtype):
    x = torch.randn(3, 10, 7, dtype=dtype)  # step 2 divides 10, step 3 divides neither
    run_and_compare(Fn(lambda x: (x[:, 1::2], x[:, ::3, 1:6:3], x[..., ::2])), (x,))


@E2E
@given(
    sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    rows=st.integers(1, 20),
    dim=st.sampled_from([0, 1]),
    dtype=st.sampled_from(DTYPES),
)
def test_cat_and_split_random(sizes, rows, dim, dtype):
    shape = lambda s: (s, rows) if dim == 0 else (rows, s)  # noqa: E731
    xs = [torch.randn(*shape(s), dtype=dtype) for s in sizes]

    def f(*xs):
        y = torch.cat(xs, dim=dim)
        parts = torch.split_with_sizes(y * 2, sizes, dim=dim)
        return (y, *parts, *torch.split(y, 3, dim=dim))

    run_and_compare(Fn(f), tuple(xs))


def _concat_loads(cm) -> list[int]:
    """The DMA loads of each concat kernel of `cm`'s program."""
    from tilecc.simulator.isa import Opcode

    out = []
    for name, a, n in cm.program.kernels:
        if "concat" in name:
            out.append(int((cm.program.stream[a:a + n]["opcode"] == Opcode.DMA_LOAD).sum()))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", ["tiny", "cloud"])
def test_channel_concat_copies_channels_as_rows(dtype, target):
    """A CNN's channel concat at batch 1 (SqueezeNet's fire modules): the inputs viewed
    ``[C_j, H * W]`` are copied a partition's worth of channels a DMA (3 loads on cloud's
    128 partitions), not one [H, W] tile a channel (296 loads); a transposed input takes
    the general path and is still right; so does the first half of each row of an input
    (a view whose H and W do not merge into one run)."""
    a = torch.randn(1, 200, 3, 3, dtype=dtype)
    b = torch.randn(1, 96, 3, 3, dtype=dtype)
    cm = run_and_compare(Fn(lambda a, b: torch.cat((a, b), dim=1)), (a, b), target=target)
    P = cm.program.config.sram.partitions
    assert _concat_loads(cm) == [math.ceil(200 / P) + math.ceil(96 / P)]
    run_and_compare(Fn(lambda a, b: torch.cat((a, b.transpose(2, 3)), dim=1)), (a, b), target=target)
    b6 = torch.randn(1, 96, 3, 6, dtype=dtype)
    cm = run_and_compare(Fn(lambda a, b: torch.cat((a, b[..., :3]), dim=1)), (a, b6), target=target)
    assert _concat_loads(cm)[0] >= 96  # the general path: a DMA per channel of b at least


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_family(dtype):
    x = torch.randn(5, 13, dtype=dtype)
    y = torch.randn(13, dtype=dtype)

    def f(x, y):
        return (
            x.abs(), torch.log(x.abs() + 0.5), torch.erf(x), torch.minimum(x, y),
            x ** 2, x.abs() ** 0.5, (x.abs() + 1) ** -0.5, x ** 3, x ** 0, 2 ** x,
            (x.abs() + 0.1) ** y, x.clamp(-0.5, 0.5), x.clamp(min=0.1),
            F.log_softmax(x, -1),
        )

    run_and_compare(Fn(f), (x, y))


@E2E
@given(
    shape=st.tuples(st.integers(1, 19), st.integers(1, 23)),
    dtype=st.sampled_from(DTYPES),
    fill=st.sampled_from([0.0, -1e4, float("-inf"), 2.5]),
)
def test_comparisons_and_where_random(shape, dtype, fill):
    x = torch.randn(*shape, dtype=dtype)
    y = torch.randn(shape[1], dtype=dtype)

    def f(x, y):
        m = (x > y) | (x <= -1.0)
        return (
            torch.where(m, x, fill), torch.where(x >= 0.5, 1.0, y), torch.where(m, x, y),
            (x == y).to(x.dtype), x != 0.25, x < y, ~m, m & (x >= y), torch.logical_xor(m, x > 0),
        )

    run_and_compare(Fn(f), (x, y))


def test_where_nan_and_inf_do_not_leak():
    x = torch.tensor([[1.0, float("nan"), float("inf"), -2.0]])
    c = torch.tensor([[True, False, False, True]])

    def f(x, c):
        return torch.where(c, x, 0.0), torch.where(c, 7.0, x), torch.where(~c, x, -x)

    got = tilecc.compile(Fn(f), (x, c))(x, c)
    for a, b in zip(got, f(x, c)):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


def test_integer_tensors_and_casts():
    x = torch.randn(4, 9) * 5
    ids = torch.randint(-50, 50, (4, 9))

    def f(x, ids):
        return (
            ids * 2 + 1, ids - 3, x.to(torch.int64), x.int().float(), ids.float() * 0.5,
            x.bool(), (ids > 0).to(torch.float32), torch.cumsum(ids, -1),
        )

    got = tilecc.compile(Fn(f), (x, ids))(x, ids)
    want = f(x, ids)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cumsum(dtype):
    x = torch.randn(3, 5, 17, dtype=dtype)
    run_and_compare(Fn(lambda x: (torch.cumsum(x, -1), torch.cumsum(x, 1), torch.cumsum(x[0, 0], 0))), (x,))


def test_constants_from_runtime_shapes():
    x = torch.randn(4, 7)
    run_and_compare(Fn(lambda x: torch.full_like(x, 3.0) + torch.zeros_like(x) + torch.ones_like(x) * x), (x,))


def test_int64_inputs_are_range_checked_and_typed():
    cm = tilecc.compile(torch.nn.Embedding(10, 8), (torch.randint(0, 10, (5,)),))
    (spec,) = cm.program.inputs
    assert spec.dtype == I32 and spec.torch_dtype == "int64"
    with pytest.raises(InputMismatchError, match=r"input 'input' holds 4294967296, outside the int32 range"):
        cm(torch.tensor([1, 2, 2**32, 0, 0]))
    with pytest.raises(InputMismatchError, match=r"input 'input' has dtype torch.int32, the program expects torch.int64"):
        cm(torch.tensor([1, 2, 3, 0, 0], dtype=torch.int32))
    back = Program.from_bytes(cm.program.to_bytes())
    assert back.inputs[0].torch_dtype == "int64"
    # int32 and bool inputs need no conversion record
    cm32 = tilecc.compile(Fn(lambda i, b: i * 2 + b), (torch.arange(4, dtype=torch.int32), torch.ones(4, dtype=torch.bool)))
    assert [s.torch_dtype for s in cm32.program.inputs] == ["", "bool"]
    out = cm32(torch.arange(4, dtype=torch.int32), torch.tensor([True, False, True, False]))
    assert out.dtype == torch.int32 and out.tolist() == [1, 2, 5, 6]


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_variants(dtype):
    q = torch.randn(2, 3, 6, 8, dtype=dtype)
    k = torch.randn(2, 3, 7, 8, dtype=dtype)
    v = torch.randn(2, 3, 7, 5, dtype=dtype)
    fm = torch.randn(6, 7, dtype=dtype)
    bm = torch.rand(2, 1, 6, 7) > 0.3
    bm[..., 0] = True  # every row keeps a key

    def f(q, k, v, fm, bm):
        return (
            F.scaled_dot_product_attention(q, k, v),
            F.scaled_dot_product_attention(q, q, q, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=fm, scale=0.3),
            F.scaled_dot_product_attention(q, k, v, attn_mask=bm),
        )

    run_and_compare(Fn(f), (q, k, v, fm, bm))


def test_sdpa_grouped_query_and_constant_bool_mask():
    q = torch.randn(1, 4, 6, 8)
    k = torch.randn(1, 2, 6, 8)
    v = torch.randn(1, 2, 6, 8)

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            causal = torch.ones(6, 6, dtype=torch.bool).tril()  # folded: an additive constant
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=True)

    run_and_compare(M(), (q, k, v))
    p = import_exported_program(export_model(M(), (q, k, v)))
    assert "graph.where" not in str(p.module) and "graph.sdpa" in str(p.module)


def test_sdpa_dropout_is_unsupported():
    from tilecc.errors import UnsupportedOpError

    class M(torch.nn.Module):
        def forward(self, q):
            return torch.ops.aten.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    with pytest.raises(UnsupportedOpError, match=r"dropout_p=0.5"):
        import_exported_program(export_model(M(), (torch.randn(1, 2, 4, 8),)))


def test_sdpa_reference_scale_default():
    q = np.random.default_rng(2).standard_normal((1, 3, 5)).astype(np.float32)
    block = Block(arg_types=[T([1, 3, 5], F32)])
    with ImplicitBuilder(block):
        op = gi.SdpaOp.make(block.args[0], block.args[0], block.args[0])
        func.ReturnOp(op)
    assert op.scale.value.data == pytest.approx(1 / math.sqrt(5))
    t = torch.from_numpy(q)
    np.testing.assert_allclose(op.reference(q, q, q), F.scaled_dot_product_attention(t, t, t).numpy(), rtol=1e-5, atol=1e-6)


def test_asm_of_a_compiled_embedding_round_trips():
    cm = tilecc.compile(torch.nn.Embedding(20, 40), (torch.randint(0, 20, (3, 7)),))
    s = cm.program.stream
    assert (s["opcode"] == Opcode.DMA_GATHER).sum() == 2  # 21 indices: two row tiles of 16
    text = print_asm(s)
    assert "dma.gather" in text and "bound=20" in text
    assert parse_asm(text).tobytes() == s.tobytes()


class _AnyNet(torch.nn.Module):
    def forward(self, x):
        rows = (x > 0.5).any(dim=1)  # bool [3, 4]
        cols = torch.any(x < -1.0, dim=(0, 1), keepdim=True)[0]  # bool [1, 4]
        return rows.to(x.dtype) + torch.any(x > 2.0).to(x.dtype) + cols.to(x.dtype)


def test_any_reductions():
    torch.manual_seed(0)
    run_and_compare(_AnyNet(), (torch.randn(3, 5, 4),))
