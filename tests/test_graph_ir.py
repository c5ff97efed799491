"""The `graph` dialect: printing / parsing, verification, shape inference, semantics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes
from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float32Type,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    f32,
    i32,
    i64,
)
from xdsl.ir import Block, Region
from xdsl.parser import Parser
from xdsl.utils.exceptions import VerifyException

from tilecc.errors import InputMismatchError, ShapeError
from tilecc.ir import graph as g
from tilecc.ir.graph_interp import (
    round_to,  # shape-preserving for rank 0
    run_graph,
)
from tilecc.simulator.isa import DType

F32, BF16, F16 = DType.F32, DType.BF16, DType.F16


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def build(arg_types, body) -> ModuleOp:
    """A module with ``@forward(args)``; `body(args)` returns the values to return."""
    block = Block(arg_types=arg_types)
    with ImplicitBuilder(block):
        outs = body(*block.args)
        if not isinstance(outs, list | tuple):
            outs = [outs]
        outs = [o.results[0] if hasattr(o, "results") else o for o in outs]
        func.ReturnOp(*outs)
    fn = func.FuncOp("forward", (list(arg_types), [o.type for o in outs]), Region(block))
    return ModuleOp([fn])


def roundtrip(module: ModuleOp) -> ModuleOp:
    module.verify()
    text = str(module)
    parsed = Parser(g.graph_context(), text).parse_module()
    parsed.verify()
    assert parsed.is_structurally_equivalent(module), text
    assert str(parsed) == text
    return parsed


def program(module: ModuleOp, weights=None) -> g.GraphProgram:
    fn = module.ops.first
    n = len(fn.body.block.args)
    return g.GraphProgram(module, weights or {}, [f"x{i}" for i in range(n)], [])


def run1(module: ModuleOp, *inputs, weights=None) -> np.ndarray:
    return run_graph(program(module, weights), list(inputs))[0]


def T(shape, dt=F32) -> TensorType:
    return g.tensor_type(shape, dt)


rng = np.random.default_rng(0)


def rand(*shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------
# one builder per op (used by the round-trip test)
# ---------------------------------------------------------------------------

W = T([4, 6])


def _dt(x):
    return g.element_dtype(x.type)


def _weight(x):
    return g.WeightOp.make("layer.0.weight", T([6, 4], _dt(x)), loc="model.py:3")


def _constant(x):
    return [
        g.ConstantOp.make(np.array(0.1), F32),
        g.ConstantOp.make(np.arange(6, dtype=np.float32).reshape(2, 3) / 3, BF16),
        g.ConstantOp.make(np.full((2, 2), 1.5), F16, loc="c.py:1"),
    ]


def _matmul(x):
    w = g.WeightOp.make("w", T([2, 6, 5], _dt(x)))
    return g.MatmulOp.make(x, w, loc="m.py:10")


def _binary(cls):
    def body(x):
        c = g.ConstantOp.make(np.array(2.0), _dt(x))
        y = cls.make(x, c, loc="b.py:1")
        return cls.make(y, g.WeightOp.make("row", T([6], _dt(x))))

    return body


def _unary(cls):
    return lambda x: cls.make(x, loc="u.py:7")


def _gelu(x):
    return [g.GeluOp.make(x), g.GeluOp.make(x, "tanh", loc="a.py:2")]


def _softmax(x):
    return g.SoftmaxOp.make(x, -1, loc="s.py:5")


def _layer_norm(x):
    w = g.WeightOp.make("ln.w", T([6], _dt(x)))
    b = g.WeightOp.make("ln.b", T([6], _dt(x)))
    y = g.LayerNormOp.make(x, w, b, 1, 1e-5, loc="ln.py:1")
    w2 = g.ConstantOp.make(np.ones((4, 6)), _dt(x))
    b2 = g.ConstantOp.make(np.zeros((4, 6)), _dt(x))
    return [y, g.LayerNormOp.make(x, w2, b2, 2, 1.0 / 3.0e5)]


def _rms_norm(x):
    w = g.WeightOp.make("norm.w", T([6], _dt(x)))
    wf = g.WeightOp.make("norm.w1", T([6], F32))
    return [g.RmsNormOp.make(x, w, 1e-6, x.type, cast_before_weight=True, loc="rms.py:1"),
            g.RmsNormOp.make(x, wf, 1e-5, x.type, loc="rms.py:2")]


def _permute(x):
    return g.PermuteOp.make(x, [1, 0], loc="p.py:1")


def _reshape(x):
    return [g.ReshapeOp.make(x, [2, 12], loc="r.py:1"), g.ReshapeOp.make(x, [-1]),
            g.ReshapeOp.make(g.ConstantOp.make(np.array([3.0]), _dt(x)), [])]


def _expand(x):
    return g.ExpandOp.make(g.ReshapeOp.make(x, [4, 1, 6]), [3, 4, 5, 6], loc="e.py:1")


def _cast(x):
    y = g.CastOp.make(x, BF16, loc="cast.py:1")
    return [y, g.CastOp.make(y, F16), g.CastOp.make(y, Float32Type())]


BUILDERS = {
    "graph.weight": _weight,
    "graph.constant": _constant,
    "graph.matmul": _matmul,
    **{cls.name: _binary(cls) for cls in g.BINARY_OPS},
    **{cls.name: _unary(cls) for cls in g.UNARY_OPS},
    "graph.gelu": _gelu,
    "graph.softmax": _softmax,
    "graph.layer_norm": _layer_norm,
    "graph.rms_norm": _rms_norm,
    "graph.permute": _permute,
    "graph.reshape": _reshape,
    "graph.expand": _expand,
    "graph.cast": _cast,
}
# op families in their own files bring their builders
from test_index_ops import INDEX_BUILDERS  # noqa: E402
from test_nn_ops import NN_BUILDERS  # noqa: E402
from test_rope import ROPE_BUILDERS  # noqa: E402
from test_routing_ops import ROUTING_BUILDERS  # noqa: E402
from test_scatter import SCATTER_BUILDERS  # noqa: E402

BUILDERS.update(INDEX_BUILDERS)
BUILDERS.update(NN_BUILDERS)
BUILDERS.update(ROUTING_BUILDERS)
BUILDERS.update(ROPE_BUILDERS)
BUILDERS.update(SCATTER_BUILDERS)


def test_every_op_has_a_builder_case():
    assert set(BUILDERS) == {op.name for op in g.ALL_OPS}
    ctx = g.graph_context()
    for op in g.ALL_OPS:
        assert ctx.get_optional_op(op.name) is op


@pytest.mark.parametrize("opname", sorted(BUILDERS))
@pytest.mark.parametrize("dt", [F32, BF16, F16])
def test_print_parse_roundtrip(opname, dt):
    module = build([T([4, 6], dt)], BUILDERS[opname])
    parsed = roundtrip(module)
    text = str(parsed)
    assert opname in text
    # the location attribute rides along
    ops = [op for op in parsed.walk() if op.name == opname]
    assert ops
    assert any(g.source_loc(op) != g.UNKNOWN_LOC for op in ops)


def test_sample_text_parses():
    text = """
    builtin.module {
      func.func @forward(%x: tensor<5x37xbf16>) -> tensor<5x53xbf16> {
        %w = graph.weight "fc.weight" {tilecc.loc = "m.py:3"} : tensor<53x37xbf16>
        %wt = graph.permute %w [1, 0] : tensor<53x37xbf16> -> tensor<37x53xbf16>
        %y = graph.matmul %x, %wt {tilecc.loc = "m.py:4"} : tensor<5x37xbf16>, tensor<37x53xbf16> -> tensor<5x53xbf16>
        %c = graph.constant dense<2.0> : tensor<bf16>
        %z = graph.mul %y, %c : tensor<5x53xbf16>, tensor<bf16> -> tensor<5x53xbf16>
        %s = graph.softmax %z dim 1 : tensor<5x53xbf16>
        func.return %s : tensor<5x53xbf16>
      }
    }
    """
    m = Parser(g.graph_context(), text).parse_module()
    m.verify()
    ops = list(m.ops.first.body.block.ops)
    assert isinstance(ops[0], g.WeightOp) and ops[0].weight == "fc.weight"
    assert g.source_loc(ops[0]) == "m.py:3"
    assert g.source_loc(ops[1]) == "<unknown>"
    assert isinstance(ops[2], g.MatmulOp) and g.source_loc(ops[2]) == "m.py:4"
    assert ops[5].axis == 1
    roundtrip(m)


def test_generic_format_roundtrip():
    import io

    from xdsl.printer import Printer

    module = build([T([4, 6])], _layer_norm)
    s = io.StringIO()
    Printer(stream=s, print_generic_format=True).print_op(module)
    parsed = Parser(g.graph_context(), s.getvalue()).parse_module()
    parsed.verify()
    assert parsed.is_structurally_equivalent(module)


# ---------------------------------------------------------------------------
# helpers in ir/graph.py
# ---------------------------------------------------------------------------


def test_type_helpers():
    t = g.tensor_type([2, 3], BF16)
    assert t == TensorType(BFloat16Type(), [2, 3])
    assert g.element_dtype(t) == BF16
    assert g.element_dtype(g.tensor_type([], F16)) == F16
    assert g.element_dtype(f32) == F32
    assert g.element_dtype(TensorType(i32, [2])) == DType.I32  # integer / bool tensors
    assert g.tensor_type([2], DType.I32) == TensorType(i32, [2])
    with pytest.raises(ValueError):
        g.element_dtype(TensorType(i64, [2]))
    op = g.ReluOp.make(g.WeightOp.make("w", t))
    assert g.source_loc(op) == "<unknown>"
    g.set_loc(op, "f.py:9")
    assert g.source_loc(op) == "f.py:9"


def test_program_func():
    m = build([T([2, 2])], lambda x: g.NegOp.make(x))
    p = program(m)
    assert p.func.sym_name.data == "forward"
    with pytest.raises(ValueError):
        _ = g.GraphProgram(ModuleOp([]), {}, [], []).func


# ---------------------------------------------------------------------------
# verifier
# ---------------------------------------------------------------------------


def _verify_fails(op_builder, match: str):
    block = Block(arg_types=[T([4, 6]), T([6, 5]), T([4, 6], BF16)])
    a, b, c = block.args
    op = op_builder(a, b, c)
    block.add_op(op)
    block.add_op(func.ReturnOp())
    fn = func.FuncOp("forward", ([T([4, 6]), T([6, 5]), T([4, 6], BF16)], []), Region(block))
    with pytest.raises(VerifyException, match=match):
        ModuleOp([fn]).verify()


def test_verify_matmul_bad_result():
    _verify_fails(
        lambda a, b, c: g.MatmulOp.create(operands=[a, b], result_types=[T([4, 4])]),
        "graph.matmul: result type tensor<4x4xf32> does not match .*tensor<4x5xf32>",
    )


def test_verify_matmul_bad_contraction():
    _verify_fails(
        lambda a, b, c: g.MatmulOp.create(operands=[a, a], result_types=[T([4, 6])]),
        r"graph.matmul: contraction dims differ: \[4, 6\] @ \[4, 6\]",
    )


def test_verify_binary_mixed_element_types():
    _verify_fails(
        lambda a, b, c: g.AddOp.create(operands=[a, c], result_types=[T([4, 6])]),
        "graph.add: operand element types differ",
    )


def test_verify_binary_not_broadcastable():
    _verify_fails(
        lambda a, b, c: g.MulOp.create(operands=[a, b], result_types=[T([4, 6])]),
        r"graph.mul: shapes \[4, 6\], \[6, 5\] do not broadcast",
    )


def test_verify_unary_type_mismatch():
    _verify_fails(
        lambda a, b, c: g.ExpOp.create(operands=[a], result_types=[T([4, 6], BF16)]),
        "expected from variable 'T'",
    )


def test_verify_unsupported_element_type():
    block = Block(arg_types=[TensorType(i64, [3])])
    block.add_op(g.NegOp.create(operands=[block.args[0]], result_types=[TensorType(i64, [3])]))
    block.add_op(func.ReturnOp())
    fn = func.FuncOp("forward", ([TensorType(i64, [3])], []), Region(block))
    with pytest.raises(VerifyException, match="element type must be f32, bf16, f16 or i32"):
        ModuleOp([fn]).verify()


def test_verify_dynamic_shape():
    dyn = TensorType(f32, [-1, 3])
    block = Block(arg_types=[dyn])
    block.add_op(g.ReluOp.create(operands=[block.args[0]], result_types=[dyn]))
    block.add_op(func.ReturnOp())
    fn = func.FuncOp("forward", ([dyn], []), Region(block))
    with pytest.raises(VerifyException, match="static shape"):
        ModuleOp([fn]).verify()


def test_verify_softmax_dim():
    _verify_fails(
        lambda a, b, c: g.SoftmaxOp.create(
            operands=[a], result_types=[a.type], properties={"dim": IntegerAttr(2, i64)}
        ),
        "graph.softmax: dim 2 out of range",
    )


def test_verify_gelu_approximate():
    _verify_fails(
        lambda a, b, c: g.GeluOp.create(
            operands=[a], result_types=[a.type], properties={"approximate": StringAttr("fast")}
        ),
        "approximate must be 'none' or 'tanh'",
    )


def test_verify_permute():
    from xdsl.dialects.builtin import DenseArrayBase

    _verify_fails(
        lambda a, b, c: g.PermuteOp.create(
            operands=[a], result_types=[T([6, 4])],
            properties={"perm": DenseArrayBase.from_list(i64, [1, 1])},
        ),
        r"not a permutation",
    )
    _verify_fails(
        lambda a, b, c: g.PermuteOp.create(
            operands=[a], result_types=[T([4, 6])],
            properties={"perm": DenseArrayBase.from_list(i64, [1, 0])},
        ),
        r"does not match",
    )


def test_verify_reshape_expand_cast():
    _verify_fails(
        lambda a, b, c: g.ReshapeOp.create(operands=[a], result_types=[T([5, 5])]),
        r"graph.reshape: cannot reshape \[4, 6\] \(24 elements\) to \[5, 5\]",
    )
    _verify_fails(
        lambda a, b, c: g.ReshapeOp.create(operands=[a], result_types=[T([24], BF16)]),
        "does not match",
    )
    _verify_fails(
        lambda a, b, c: g.ExpandOp.create(operands=[a], result_types=[T([4, 7])]),
        r"graph.expand: cannot expand \[4, 6\] to \[4, 7\]",
    )
    _verify_fails(
        lambda a, b, c: g.CastOp.create(operands=[a], result_types=[T([6, 4], BF16)]),
        "does not match",
    )


def test_verify_layer_norm():
    from xdsl.dialects.builtin import FloatAttr, f64

    _verify_fails(
        lambda a, b, c: g.LayerNormOp.create(
            operands=[a, b, b], result_types=[a.type],
            properties={"normalized_ndim": IntegerAttr(1, i64), "eps": FloatAttr(1e-5, f64)},
        ),
        r"graph.layer_norm: weight shape \[6, 5\] must equal the normalised dims \[6\]",
    )


def test_verify_parsed_text_with_wrong_type():
    text = """
    func.func @forward(%a: tensor<4x6xf32>, %b: tensor<6x5xf32>) -> () {
      %y = graph.matmul %a, %b : tensor<4x6xf32>, tensor<6x5xf32> -> tensor<4x6xf32>
      func.return
    }
    """
    m = Parser(g.graph_context(), text).parse_module()
    with pytest.raises(VerifyException, match="graph.matmul"):
        m.verify()


# ---------------------------------------------------------------------------
# builders: shape inference and ShapeError
# ---------------------------------------------------------------------------


def _arg(shape, dt=F32):
    return Block(arg_types=[T(shape, dt)]).args[0]


def test_make_infers_types():
    assert g.shape_of(g.MatmulOp.make(_arg([3, 1, 4, 6]), _arg([2, 6, 5])).result) == (3, 2, 4, 5)
    assert g.shape_of(g.AddOp.make(_arg([4, 1]), _arg([3, 1, 5])).result) == (3, 4, 5)
    assert g.shape_of(g.PermuteOp.make(_arg([2, 3, 4]), [2, -3, 1]).result) == (4, 2, 3)
    assert g.shape_of(g.ReshapeOp.make(_arg([2, 3, 4]), [6, -1]).result) == (6, 4)
    assert g.shape_of(g.ExpandOp.make(_arg([3, 1]), [2, -1, 5]).result) == (2, 3, 5)
    assert g.SoftmaxOp.make(_arg([2, 3]), -1).axis == 1
    c = g.CastOp.make(_arg([2, 3]), BF16)
    assert c.result.type == T([2, 3], BF16)
    assert g.ConstantOp.make(np.float32(2.5), F16).result.type == T([], F16)


@pytest.mark.parametrize(
    "thunk, match",
    [
        (lambda: g.MatmulOp.make(_arg([4, 6]), _arg([5, 6])),
         r"graph.matmul: contraction dims differ: \[4, 6\] @ \[5, 6\]"),
        (lambda: g.MatmulOp.make(_arg([6]), _arg([6, 5])), r"graph.matmul: operands must have rank >= 2"),
        (lambda: g.MatmulOp.make(_arg([2, 4, 6]), _arg([3, 6, 5])),
         r"graph.matmul: batch dims of \[2, 4, 6\] and \[3, 6, 5\] do not broadcast"),
        (lambda: g.MatmulOp.make(_arg([4, 6]), _arg([6, 5], BF16)), "element types differ"),
        (lambda: g.SubOp.make(_arg([4, 6]), _arg([4])), r"graph.sub: shapes \[4, 6\], \[4\] do not broadcast"),
        (lambda: g.DivOp.make(_arg([4]), _arg([4], BF16)), "graph.div: operand element types differ"),
        (lambda: g.PermuteOp.make(_arg([2, 3]), [0, 0]), r"graph.permute: \[0, 0\] is not a permutation"),
        (lambda: g.ReshapeOp.make(_arg([2, 3]), [4, 2]), r"graph.reshape: cannot reshape \[2, 3\]"),
        (lambda: g.ReshapeOp.make(_arg([2, 3]), [-1, -1]), r"graph.reshape: invalid target shape"),
        (lambda: g.ExpandOp.make(_arg([2, 3]), [3]), r"graph.expand: cannot expand \[2, 3\] to fewer dims \[3\]"),
        (lambda: g.ExpandOp.make(_arg([2, 3]), [4, 3]), r"graph.expand: cannot expand \[2, 3\] to \[4, 3\]"),
        (lambda: g.SoftmaxOp.make(_arg([2, 3]), 2), r"graph.softmax: dim 2 out of range for shape \[2, 3\]"),
        (lambda: g.GeluOp.make(_arg([2, 3]), "fast"), r"graph.gelu: approximate must be"),
        (lambda: g.LayerNormOp.make(_arg([2, 3]), _arg([2]), _arg([3]), 1, 1e-5),
         r"graph.layer_norm: weight shape \[2\] must equal the normalised dims \[3\] of input \[2, 3\]"),
        (lambda: g.LayerNormOp.make(_arg([2, 3]), _arg([3]), _arg([3]), 3, 1e-5),
         r"graph.layer_norm: normalized_ndim 3 out of range"),
        (lambda: g.LayerNormOp.make(_arg([2, 3]), _arg([3], BF16), _arg([3]), 1, 1e-5),
         r"graph.layer_norm: operand element types differ"),
        (lambda: g.CastOp.make(_arg([2]), i64), r"graph.cast: unsupported element type"),
        (lambda: g.WeightOp.make("w", TensorType(i64, [2])), r"graph.weight: result element type"),
        (lambda: g.ReluOp.make(Block(arg_types=[TensorType(f32, [-1])]).args[0]),
         r"graph.relu: input must have a static shape"),
    ],
)
def test_make_shape_errors(thunk, match):
    with pytest.raises(ShapeError, match=match):
        thunk()


# ---------------------------------------------------------------------------
# reference semantics vs torch
# ---------------------------------------------------------------------------

UNARY_TORCH = {
    g.ReluOp: torch.relu,
    g.ExpOp: torch.exp,
    g.TanhOp: torch.tanh,
    g.SigmoidOp: torch.sigmoid,
    g.NegOp: torch.neg,
    g.RsqrtOp: torch.rsqrt,
    g.SqrtOp: torch.sqrt,
    g.SiluOp: torch.nn.functional.silu,
}
BINARY_TORCH = {
    g.AddOp: torch.add,
    g.SubOp: torch.sub,
    g.MulOp: torch.mul,
    g.DivOp: torch.div,
    g.MaximumOp: torch.maximum,
}


def _close(a: np.ndarray, b: torch.Tensor, dt=F32):
    b = b.float().numpy()
    assert a.shape == b.shape
    if dt == F32:
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2)


def _to_torch(x: np.ndarray, dt: DType) -> torch.Tensor:
    return torch.from_numpy(x).to({F32: torch.float32, BF16: torch.bfloat16, F16: torch.float16}[dt])


@pytest.mark.parametrize("cls", list(UNARY_TORCH))
@pytest.mark.parametrize("dt", [F32, BF16, F16])
def test_unary_reference(cls, dt):
    x = round_to(rand(7, 13) * 3, dt)
    if cls in (g.RsqrtOp, g.SqrtOp):
        x = round_to(np.abs(x) + 0.1, dt)
    m = build([T(x.shape, dt)], lambda a: cls.make(a))
    _close(run1(m, x), UNARY_TORCH[cls](_to_torch(x, dt)), dt)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dt", [F32, BF16])
def test_gelu_reference(approximate, dt):
    x = round_to(rand(5, 29) * 3, dt)
    m = build([T(x.shape, dt)], lambda a: g.GeluOp.make(a, approximate))
    ref = torch.nn.functional.gelu(_to_torch(x, dt), approximate=approximate)
    _close(run1(m, x), ref, dt)


@settings(max_examples=40, deadline=None)
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=5),
    op=st.sampled_from(list(BINARY_TORCH)),
    dt=st.sampled_from([F32, BF16]),
)
def test_binary_reference_broadcasting(shapes, op, dt):
    sa, sb = shapes.input_shapes
    a, b = round_to(rand(*sa), dt), round_to(rand(*sb), dt)
    if op is g.DivOp:
        b = round_to(np.where(np.abs(b) < 0.1, 1.0, b).astype(np.float32), dt)
    m = build([T(sa, dt), T(sb, dt)], lambda x, y: op.make(x, y))
    assert m.ops.first.function_type.outputs.data[0] == T(shapes.result_shape, dt)
    _close(run1(m, a, b), BINARY_TORCH[op](_to_torch(a, dt), _to_torch(b, dt)), dt)


@settings(max_examples=30, deadline=None)
@given(
    batch=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3),
    mkn=st.tuples(*[st.integers(1, 9)] * 3),
    dt=st.sampled_from([F32, BF16]),
)
def test_matmul_reference_broadcasting(batch, mkn, dt):
    M, K, N = mkn
    sa, sb = (*batch.input_shapes[0], M, K), (*batch.input_shapes[1], K, N)
    a, b = round_to(rand(*sa), dt), round_to(rand(*sb), dt)
    m = build([T(sa, dt), T(sb, dt)], lambda x, y: g.MatmulOp.make(x, y))
    ref = torch.matmul(_to_torch(a, dt), _to_torch(b, dt))
    out = run1(m, a, b)
    assert out.shape == (*batch.result_shape, M, N)
    _close(out, ref, dt)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dt", [F32, BF16])
def test_softmax_reference(dim, dt):
    x = round_to(rand(3, 7, 11) * 4, dt)
    m = build([T(x.shape, dt)], lambda a: g.SoftmaxOp.make(a, dim))
    _close(run1(m, x), torch.softmax(_to_torch(x, dt), dim), dt)


@pytest.mark.parametrize("nd", [1, 2])
@pytest.mark.parametrize("dt", [F32, BF16])
def test_layer_norm_reference(nd, dt):
    x = round_to(rand(3, 5, 37) * 2 + 1, dt)
    norm = x.shape[-nd:]
    w, b = round_to(rand(*norm), dt), round_to(rand(*norm), dt)
    m = build([T(x.shape, dt), T(norm, dt), T(norm, dt)],
              lambda a, ww, bb: g.LayerNormOp.make(a, ww, bb, nd, 1e-5))
    ref = torch.nn.functional.layer_norm(
        _to_torch(x, dt), norm, _to_torch(w, dt), _to_torch(b, dt), 1e-5
    )
    _close(run1(m, x, w, b), ref, dt)


def test_data_movement_reference():
    x = rand(2, 3, 4)
    m = build([T(x.shape)], lambda a: [
        g.PermuteOp.make(a, [2, 0, 1]),
        g.ReshapeOp.make(a, [6, 4]),
        g.ExpandOp.make(g.ReshapeOp.make(a, [2, 1, 3, 4]), [5, 2, 7, 3, 4]),
    ])
    outs = run_graph(program(m), [x])
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(outs[0], t.permute(2, 0, 1).numpy())
    np.testing.assert_array_equal(outs[1], t.reshape(6, 4).numpy())
    np.testing.assert_array_equal(outs[2], t.reshape(2, 1, 3, 4).expand(5, 2, 7, 3, 4).numpy())


def test_cast_and_constant_reference():
    x = rand(4, 5) * 100
    m = build([T(x.shape)], lambda a: [
        g.CastOp.make(a, BF16),
        g.CastOp.make(a, F16),
        g.ConstantOp.make(np.array([[1 / 3, 0.1]]), BF16),
    ])
    bf, hf, c = run_graph(program(m), [x])
    np.testing.assert_array_equal(bf, torch.from_numpy(x).bfloat16().float().numpy())
    np.testing.assert_array_equal(hf, torch.from_numpy(x).half().float().numpy())
    np.testing.assert_array_equal(c, torch.tensor([[1 / 3, 0.1]]).bfloat16().float().numpy())


# ---------------------------------------------------------------------------
# interpreter
# ---------------------------------------------------------------------------


def test_interpreter_rounds_after_every_op_like_eager_bf16():
    r = np.random.default_rng(7)
    x = round_to(r.standard_normal((6, 9)).astype(np.float32), BF16)
    w = round_to(r.standard_normal((9, 9)).astype(np.float32), BF16)

    def body(a):
        wt = g.WeightOp.make("w", T([9, 9], BF16))
        y = g.MatmulOp.make(a, wt)
        y = g.MulOp.make(y, g.ConstantOp.make(np.array(1.75), BF16))  # exact in bf16
        y = g.AddOp.make(y, a)
        return g.TanhOp.make(y)

    m = build([T(x.shape, BF16)], body)
    out, env = run_graph(program(m, {"w": w}), [x], keep=True)
    tx, tw = _to_torch(x, BF16), _to_torch(w, BF16)
    ref = torch.tanh((tx @ tw) * 1.75 + tx)
    np.testing.assert_allclose(out[0], ref.float().numpy(), atol=1e-2, rtol=1e-2)
    # every intermediate is exactly representable in bf16
    for arr in env.values():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, round_to(arr, BF16))
    fn = m.ops.first
    assert len(env) == 1 + len(list(fn.body.block.ops)) - 1


def test_interpreter_keep_returns_intermediates():
    m = build([T([3])], lambda a: g.ExpOp.make(g.NegOp.make(a)))
    x = np.array([0.0, 1.0, 2.0], np.float32)
    outs, env = run_graph(program(m), [x], keep=True)
    neg = m.ops.first.body.block.ops.first
    np.testing.assert_array_equal(env[neg.result], -x)
    np.testing.assert_allclose(outs[0], np.exp(-x), rtol=1e-6)


def test_interpreter_input_mismatch():
    m = build([T([3])], lambda a: g.NegOp.make(a))
    with pytest.raises(InputMismatchError, match="expected shape"):
        run_graph(program(m), [np.zeros(4, np.float32)])
    with pytest.raises(InputMismatchError, match="takes 1 input"):
        run_graph(program(m), [])


def test_interpreter_roundtripped_module():
    m = build([T([4, 6])], _layer_norm)
    parsed = roundtrip(m)
    w = {"ln.w": rand(6), "ln.b": rand(6)}
    x = rand(4, 6)
    a = run_graph(program(m, w), [x])
    b = run_graph(program(parsed, w), [x])
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (6,), torch.from_numpy(w["ln.w"]),
                                         torch.from_numpy(w["ln.b"]))
    np.testing.assert_allclose(a[0], ref.numpy(), rtol=1e-5, atol=1e-5)
    assert math.isclose(parsed.ops.first.body.block.ops.last.prev_op.eps.value.data, 1 / 3.0e5)
