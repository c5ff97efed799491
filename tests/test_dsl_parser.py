"""The tile DSL's parser: positions on every node, syntax errors with line, column,
the source line, a caret and what was expected in words."""

from __future__ import annotations

import pytest

import tilecc
from tilecc.errors import DslSyntaxError, TileccError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.parser import parse

GEMM = """\
kernel gemm_gelu(a: bf16[M, K], b: bf16[K, N], bias: f32[N]) -> bf16[M, N]:
    for m in tiles(M, 128):
        for n in tiles(N, 512):
            acc = zeros(f32[128, 512], acc)   # the accumulator
            for k in tiles(K, 128):
                acc += matmul(load(a[m, k]), load(b[k, n]))
            out[m, n] = gelu(acc + load(bias[n]))
"""


def test_the_issue_illustration_parses_with_positions():
    (k,) = parse(GEMM, "gemm.tdsl")
    assert k.name == "gemm_gelu" and [p.name for p in k.params] == ["a", "b", "bias"]
    assert k.results[0].name == "out" and k.results[0].type.dims == ["M", "N"]
    loop_m = k.body[0]
    assert isinstance(loop_m, A.For) and loop_m.pos == A.Pos(2, 5)
    loop_n = loop_m.body[0]
    acc, loop_k, store = loop_n.body
    assert isinstance(acc, A.Assign) and acc.pos == A.Pos(4, 13)
    assert isinstance(acc.value, A.Call) and acc.value.pos == A.Pos(4, 19)
    upd = loop_k.body[0]
    assert isinstance(upd, A.AugAssign) and upd.op == "+" and upd.pos == A.Pos(6, 17)
    mm = upd.value
    assert mm.fn == "matmul" and mm.args[1].pos == A.Pos(6, 46)
    assert isinstance(store, A.Store) and store.target == "out" and store.pos == A.Pos(7, 13)


def test_every_node_has_a_position():
    (k,) = parse(GEMM)
    seen = 0
    stack: list = [k]
    while stack:
        x = stack.pop()
        if isinstance(x, A.Node):
            assert x.pos.line >= 1 and x.pos.col >= 1, x
            seen += 1
            stack.extend(v for v in vars(x).values() if isinstance(v, (A.Node, list, dict)))
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    assert seen > 30


def _err(src: str) -> DslSyntaxError:
    with pytest.raises(DslSyntaxError) as e:
        parse(src, "k.tdsl")
    return e.value


def test_missing_colon():
    e = _err("kernel f(a: f32[M]) -> f32[M]\n    pass\n")
    assert str(e) == (
        "k.tdsl:1:30: syntax error: expected ')', ',' or ':', found a new line\n"
        "    kernel f(a: f32[M]) -> f32[M]\n"
        "                                 ^"
    )
    assert e.where == ("k.tdsl", 1, 30) and isinstance(e, TileccError)


def test_unclosed_subscript():
    e = _err("kernel f(a: f32[M]) -> f32[M]:\n    x = load(a[)\n")
    assert e.headline == "k.tdsl:2:16: syntax error: expected an index or an expression, found ')'"
    assert str(e).splitlines()[2] == "                   ^"


def test_bad_character():
    e = _err("kernel f(a: f32[M]) -> f32[M]:\n    x = 1 $ 2\n")
    assert e.headline == "k.tdsl:2:11: syntax error: unexpected character '$'"


def test_bad_dedent():
    e = _err("kernel f(a: f32[M]) -> f32[M]:\n    for m in tiles(M, 4):\n        x = 1\n      y = 2\n")
    assert e.headline == "k.tdsl:4:7: syntax error: unindent does not match any outer indentation level"


def test_missing_body():
    e = _err("kernel f(a: f32[M]) -> f32[M]:\n")
    assert e.headline == "k.tdsl:1:31: syntax error: expected an indented block, found the end of the file"


def test_kernel_keyword_expected():
    e = _err("def f(a):\n    pass\n")
    assert e.headline == "k.tdsl:1:1: syntax error: expected 'kernel' or a new line, found 'def'"


def test_api_raises_syntax_errors_at_creation(tmp_path):
    p = tmp_path / "bad.tdsl"
    p.write_text("kernel f(a: f32[M]) -> f32[M]:\n    out[:] = = 1\n")
    with pytest.raises(DslSyntaxError, match=r"bad.tdsl:2:14: syntax error: expected "):
        tilecc.kernel(str(p))
    with pytest.raises(TileccError, match="tile-DSL file not found"):
        tilecc.kernel(str(tmp_path / "missing.tdsl"))
