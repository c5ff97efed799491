"""Every semantic error class of the tile DSL, with its exact message."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tilecc
from tilecc.errors import (
    DslError,
    DslMatmulError,
    DslMemoryError,
    DslNameError,
    DslRaceError,
    DslShapeError,
    DslTypeError,
    SramOverflowError,
    TileccError,
)
from tilecc.simulator.config import load_config

DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def _raise(src: str, *shapes, target="tiny") -> DslError:
    k = tilecc.kernel(src)
    arrays = [torch.zeros(s[:-1], dtype=DT[s[-1]]) for s in shapes]
    with pytest.raises(DslError) as e:
        k(*arrays, target=target)
    assert isinstance(e.value, TileccError)
    return e.value


def test_dtype_mismatch():
    e = _raise("""kernel f(a: f32[M, N], b: bf16[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = load(a[m, :]) + load(b[m, :])
""", (8, 4, "f32"), (8, 4, "bf16"))
    assert isinstance(e, DslTypeError)
    assert str(e) == (
        "<string>:3:21: dtype mismatch in '+': f32[8 x 4] in sram and bf16[8 x 4] in sram; "
        "cast one side, e.g. f32(...)\n"
        "            out[m, :] = load(a[m, :]) + load(b[m, :])\n"
        "                        ^"
    )
    assert e.where == ("<string>", 3, 21)


def test_shape_mismatch():
    e = _raise("""kernel f(a: f32[M, N], b: f32[N, M]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = load(a[m, :]) + load(b[:, m])
""", (8, 4, "f32"), (4, 8, "f32"))
    assert isinstance(e, DslShapeError)
    assert e.headline == "<string>:3:21: shape mismatch in '+': f32[8 x 4] in sram and f32[4 x 8] in sram"


def test_shape_mismatch_of_the_arguments():
    e = _raise("""kernel f(a: f32[M, K], b: f32[K, N]) -> f32[M, N]:
    pass
""", (8, 4, "f32"), (5, 8, "f32"))
    assert isinstance(e, DslShapeError)
    assert e.headline == ("<string>:1:24: shape mismatch: 'b' has shape (5, 8) but its type f32[K, N] "
                          "needs K = 4 (bound earlier)")


def test_partition_dimension_larger_than_the_target():
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 32):
        out[m, :] = exp(load(a[m, :]))
""", (40, 4, "f32"))
    assert isinstance(e, DslShapeError)
    assert e.headline == ("<string>:3:25: partition dimension too large: the tile a f32[32 x 4] has 32 rows "
                          "but sram on target 'tiny' has 16 partitions")


def test_matmul_operand_dtypes():
    e = _raise("""kernel f(a: bf16[M, K], b: f32[K, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        acc = zeros(f32[16, 16], acc)
        acc += matmul(load(a[m, :]), load(b[:, :]))
        out[m, :] = acc
""", (8, 4, "bf16"), (4, 8, "f32"))
    assert isinstance(e, DslMatmulError)
    assert e.headline == "<string>:4:16: matmul operands must have one dtype, got bf16 and f32; cast one of them"


def test_matmul_operand_in_the_accumulator():
    e = _raise("""kernel f(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        p = matmul(load(a[m, :]), load(b[:, :]))
        out[m, :] = matmul_t(p, load(b[:, :]))
""", (8, 4, "bf16"), (4, 4, "bf16"))
    assert isinstance(e, DslMatmulError)
    assert e.headline == ("<string>:4:30: the matrix engine reads its operands from SRAM, this one is "
                          "f32[8 x 4] in acc; cast it first, e.g. bf16(...)")


def test_matmul_contraction_larger_than_the_array():
    cfg = load_config("tiny")
    cfg = dataclasses.replace(cfg, matrix=dataclasses.replace(cfg.matrix, rows=8))
    e = _raise("""kernel f(a: bf16[K, M], b: bf16[K, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = matmul_t(load(a[:, m]), load(b[:, :]))
""", (16, 8, "bf16"), (16, 8, "bf16"), target=cfg)
    assert isinstance(e, DslMatmulError)
    assert e.headline == ("<string>:3:21: the contraction tile K = 16 exceeds the matrix engine's 8 rows "
                          "on target 'tiny'; tile K by 8")


def test_matmul_into_a_tile_outside_the_accumulator():
    e = _raise("""kernel f(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        acc = zeros(f32[16, 8])
        acc += matmul(load(a[m, :]), load(b[:, :]))
        out[m, :] = acc
""", (8, 4, "bf16"), (4, 8, "bf16"))
    assert isinstance(e, DslMatmulError)
    assert e.headline == ("<string>:4:9: matmul accumulates into an f32 tile in acc, not into f32 in sram "
                          "(line 3); declare it zeros(f32[..], acc)")


def test_buffers_that_do_not_fit_name_the_buffers_and_lines():
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        t = load(a[m, :])
        u = exp(t)
        out[m, :] = u * t
""", (16, 6000, "f32"))
    assert isinstance(e, DslMemoryError) and isinstance(e, SramOverflowError)
    assert e.headline == (
        "<string>:3:13: on-chip buffers do not fit: sram needs 72000 bytes per partition, target 'tiny' "
        "has 65536; live at the peak: a f32[16 x 6000] (24000 B, line 3), u f32[16 x 6000] (24000 B, line 4), "
        "out f32[16 x 6000] (24000 B, line 5)"
    )


def test_accumulator_that_does_not_fit():
    e = _raise("""kernel f(a: bf16[M, K], b: bf16[K, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        acc = zeros(f32[16, 2048], acc)
        acc += matmul(load(a[m, :]), load(b[:, :]))
        out[m, :] = acc
""", (16, 16, "bf16"), (16, 2048, "bf16"))
    assert isinstance(e, DslMemoryError)
    assert e.headline == ("<string>:3:15: on-chip buffers do not fit: acc needs 8256 bytes per partition, "
                          "target 'tiny' has 4096; live at the peak: acc f32[16 x 2048] (8192 B, line 3), "
                          "tr f32[16 x 16] (64 B, line 4)")


def test_undefined_name():
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = load(a[m, :]) * scale
""", (8, 4, "f32"))
    assert isinstance(e, DslNameError)
    assert e.headline == "<string>:3:37: undefined name 'scale'"


def test_undefined_function_and_tensor():
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = softplus(load(a[m, :]))
""", (8, 4, "f32"))
    assert isinstance(e, DslNameError) and e.headline == "<string>:3:21: undefined function 'softplus'"
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = load(b[m, :])
""", (8, 4, "f32"))
    assert isinstance(e, DslNameError) and e.headline == "<string>:3:26: undefined name 'b'"


def test_write_racing_across_parallel_iterations():
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        for n in tiles(N, 16):
            out[m, :] = load(a[m, :])
""", (8, 40, "f32"))
    assert isinstance(e, DslRaceError)
    assert e.headline == ("<string>:4:13: race: every iteration of the parallel loop 'n' (line 3) writes the "
                          "same elements of out; index the store by 'n' or move it out of the loop")


def test_store_shape_and_dtype_errors():
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = sum(load(a[m, :]))
""", (8, 4, "f32"))
    assert isinstance(e, DslShapeError)
    assert e.headline == ("<string>:3:9: shape mismatch in store: out[...] is [8 x 4] here, "
                          "the value is [8 x 1]")
    e = _raise("""kernel f(a: f32[M, N]) -> f32[M, N]:
    for m in tiles(M, 16):
        out[m, :] = 2
""", (8, 4, "f32"))
    assert isinstance(e, DslTypeError) and e.headline == "<string>:3:21: cannot store a scalar; store a tile"


def test_window_errors():
    """Column windows of on-chip tiles: bounds, the rows, HBM ranges, updating HBM."""
    head = "kernel f(a: f32[M, N]) -> f32[M, N]:\n    for m in tiles(M, 16):\n        t = load(a[m, :])\n"
    e = _raise(head + "        out[m, :] = t[:, 2:9]\n", (8, 4, "f32"))
    assert isinstance(e, DslShapeError)
    assert e.headline == "<string>:4:26: window 2:9 is outside the columns 0:4 of t f32[8 x 4] in sram (line 3)"
    e = _raise(head + "        out[m, :] = t[0:4, :]\n", (8, 4, "f32"))
    assert e.headline == ("<string>:4:21: an on-chip tile is windowed by columns: t[:, a:b] (the rows stay whole)")
    e = _raise(head + "        out[m, :] = t[:, 1]\n", (8, 4, "f32"))
    assert e.headline == "<string>:4:26: a window of t is a column range a:b, not a single column"
    e = _raise("kernel f(a: f32[M, N]) -> f32[M, N]:\n    for m in tiles(M, 16):\n"
               "        out[m, :] = load(a[m, 0:2])\n", (8, 4, "f32"))
    assert e.headline == ("<string>:3:31: HBM tensors are sliced by tiles: index 'a' with a tiles() loop "
                          "variable, ':' or a scalar index")
    e = _raise("kernel f(a: f32[M, N]) -> f32[M, N]:\n    for m in tiles(M, 16):\n"
               "        out[m, :] += load(a[m, :])\n", (8, 4, "f32"))
    assert e.headline == ("<string>:3:9: out[...] += ...: HBM tensors are stored, not updated; load, compute "
                          "and store")
    e = _raise(head + "        for c in tiles(N, 2):\n            u = t[:, c.start:c.end]\n        out[m, :] = t\n",
               (8, 4, "f32"))
    assert isinstance(e, DslTypeError)
    assert e.headline == ("<string>:5:22: a window bound must be a number known when the kernel is compiled "
                          "(sizes, constants, or attributes of an enclosing loop that bounds this one)")
