"""Import a `torch.export.ExportedProgram` into the `graph` dialect.

    ep = export_model(model, (x,))
    program = import_exported_program(ep)      # GraphProgram

The program is decomposed to Core ATen first (with ``scaled_dot_product_attention``
kept whole: it is reported as unsupported rather than decomposed). Parameters,
buffers and lifted constants become ``graph.weight`` ops whose float32 values go to
`GraphProgram.weights`; user inputs become the arguments of ``@forward``. Every op
carries ``"tilecc.loc"``: its layer and the user's line, ``"fc1 (Linear) @ model.py:12"``
(`frontend.export.node_location`).

Every node tilecc cannot import is collected, and one `UnsupportedOpError` lists all
of them with their locations.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputKind
from torch.fx import Node
from torch.fx.node import map_arg
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Block, Operation, Region, SSAValue

from tilecc.errors import ExportError, ShapeError, TileccError, UnsupportedOpError
from tilecc.frontend import aten_rounding as rounding
from tilecc.frontend import lowp_weights
from tilecc.frontend.decompositions import decomposition_table  # noqa: F401 (shared table)
from tilecc.frontend.export import export_model, node_location  # noqa: F401 (this module's API)
from tilecc.frontend.torch_values import (  # noqa: F401 (TORCH_*_DTYPES, _Unsupported: this module's API)
    TORCH_FLOAT_DTYPES,
    TORCH_INT_DTYPES,
    _on_meta_device,
    _Unsupported,
    _weight_values,
)
from tilecc.ir import float64
from tilecc.ir import graph as g
from tilecc.simulator.isa import DType

aten = torch.ops.aten

# A registered buffer that forward() updates in place (a static KV cache) is program
# state: an input and an output named STATE_PREFIX + its name (its value before and
# after the call; the API keeps it between calls). A user input forward() updates in
# place gives an output named MUTATED_INPUT_PREFIX + the input's name (its new value).
STATE_PREFIX = "buffer:"
MUTATED_INPUT_PREFIX = "mutated:"

# ---------------------------------------------------------------------------
# Importer
# ---------------------------------------------------------------------------


# tensors whose values torch leaves unspecified (folded as zeros: deterministic, in range)
_UNINITIALISED = frozenset({
    aten.empty.memory_format, aten.empty_like.default, aten.empty_permuted.default,
    aten.empty_strided.default, aten.new_empty.default,
})


class _Poison:
    """The value of a node that could not be imported (or of its dependants)."""

    def __init__(self, what: str = ""):
        self.what = what


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(target)
    return getattr(target, "__name__", str(target))


def _bind(node: Node) -> dict[str, Any]:
    """Arguments of an ATen call by schema name, defaults filled in."""
    if not isinstance(node.target, torch._ops.OpOverload):
        raise _Unsupported(f"{_op_name(node.target)} is not an ATen operator")
    schema = node.target._schema
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def _meta_tensor(node: Node) -> torch.Tensor | None:
    v = node.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def _static_shape(t: torch.Tensor, bindings: dict | None = None) -> list[int]:
    """The shape of `t` with symbolic sizes evaluated under `bindings` (symbol -> int)."""
    shape = []
    for d in t.shape:
        if isinstance(d, torch.SymInt):
            if not bindings:
                raise _Unsupported(f"dynamic shape {list(t.shape)} (compile per concrete shape)")
            d = int(d.node.expr.subs(bindings))
        shape.append(int(d))
    return shape


# symbolic sizes of a program exported with torch.export `Dim`s, kept in the graph IR:
# on the function, each symbol with its declared range and the user inputs' shapes; on
# each op whose result has a symbolic size, that shape as sympy expressions
SYMBOLS_ATTR = "tilecc.symbols"
INPUT_SHAPES_ATTR = "tilecc.input_shapes"
SHAPE_ATTR = "tilecc.shape"


def symbolic_shape(t: torch.Tensor) -> str:
    """``"[s0, 8*s1, 48]"``: a fake tensor's sizes as sympy expressions."""
    return "[" + ", ".join(str(d.node.expr) if isinstance(d, torch.SymInt) else str(int(d)) for d in t.shape) + "]"


def _touches_float64(node: Node) -> bool:
    """Whether `node` produces or reads a float64 tensor (the float64 policy)."""
    vals = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
    flat = [x for v in vals for x in (v if isinstance(v, list | tuple) else [v])]
    return any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in flat)


def _dtype(t: torch.dtype) -> DType:
    try:
        return TORCH_FLOAT_DTYPES.get(t) or TORCH_INT_DTYPES[t]
    except KeyError:
        raise _Unsupported(f"dtype {t}") from None


def torch_dtype_name(t: torch.dtype) -> str:
    """'int64' for torch.int64: the user-facing dtype a Program records for its inputs."""
    return str(t).removeprefix("torch.")


class _Importer:
    def __init__(self, ep: ExportedProgram, bindings: dict | None = None, borrow_weights: bool = False):
        self.ep = ep
        self.bindings = bindings  # symbolic size -> concrete value of this specialisation
        self.borrow_weights = borrow_weights  # weights as views of the model's tensors (torch_values.py)
        self.block = Block()
        self.env: dict[Node, Any] = {}
        self.unsupported: list[tuple[str, str]] = []
        self.weights: dict[str, np.ndarray] = {}
        self.lowp: dict[Node, lowp_weights.LowpWeight] = {}  # folded dequantisations
        self.input_names: list[str] = []
        self.output_names: list[str] = []
        self.input_dtypes: list[str] = []  # user-facing torch dtypes ("int64", "float32")
        self.output_dtypes: list[str] = []
        self.input_types: list[TensorType | None] = []  # None: an input that cannot be imported
        self.loc = "<unknown>"  # location of the node being converted
        # nodes whose value is known at compile time (weights, and ops on them only):
        # folded in eager torch, emitted as graph.weight only where a runtime op uses them
        self.const_values: dict[Node, Any] = {}
        self.const_names: dict[Node, str] = {}
        # per call_function node: "folded", "npu", "unsupported" or "blocked" (an input is
        # unsupported); read by `tilecc coverage`
        self.status: dict[Node, str] = {}
        # conv weights packed at import (gihwo), per (weight node, groups, dtype): frontend/aten_nn.py
        self.packed_weights: dict[tuple[Node, int, DType], SSAValue] = {}
        self.handlers: dict[Any, Callable[[Node], Any]] = self._handlers()
        self.float64_ops: list[tuple[str, str]] = []  # (what, loc) computed in fp32: ir/float64.py

    # -- helpers ----------------------------------------------------------------

    def emit(self, op: Operation) -> SSAValue:
        g.set_loc(op, self.loc)
        self.block.add_op(op)
        return op.results[0]

    def value(self, a: Any) -> Any:
        """fx argument -> SSAValue / python value (recursively for lists)."""
        if isinstance(a, Node):
            if a not in self.env and a in self.const_values:
                self.env[a] = self.materialise(a)
            return self.env[a]
        if isinstance(a, list | tuple):
            return type(a)(self.value(x) for x in a)
        return a

    def tensor(self, a: Any, what: str = "operand") -> SSAValue:
        v = self.value(a)
        if not isinstance(v, SSAValue):
            raise _Unsupported(f"{what} is not a tensor")
        return v

    def out_meta(self, node: Node) -> tuple[list[int], DType]:
        t = _meta_tensor(node)
        if t is None:
            raise _Unsupported("result is not a tensor")
        return _static_shape(t, self.bindings), _dtype(t.dtype)

    def cast_to(self, v: SSAValue, dt: DType) -> SSAValue:
        if g.element_dtype(v.type) == dt:
            return v
        return self.emit(g.CastOp.make(v, dt))

    def scalar(self, x: Any, dt: DType) -> SSAValue:
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise _Unsupported(f"scalar operand {x!r}")
        return self.emit(g.ConstantOp.make(np.array(float(x), dtype=np.float32), dt))

    def operand(self, a: Any, dt: DType) -> SSAValue:
        """Tensor (cast to `dt`) or Python scalar (a rank-0 constant of `dt`)."""
        v = self.value(a)
        if isinstance(v, SSAValue):
            return self.cast_to(v, dt)
        return self.scalar(v, dt)

    # -- handlers ---------------------------------------------------------------

    def _handlers(self) -> dict[Any, Callable[[Node], Any]]:
        h: dict[Any, Callable[[Node], Any]] = {
            aten.mm.default: self.h_matmul,
            aten.bmm.default: self.h_matmul,
            aten.matmul.default: self.h_matmul,
            aten.addmm.default: self.h_addmm,
            aten.add.Tensor: self.binary(g.AddOp, alpha=True),
            aten.add.Scalar: self.binary(g.AddOp, alpha=True),
            aten.sub.Tensor: self.binary(g.SubOp, alpha=True),
            aten.sub.Scalar: self.binary(g.SubOp, alpha=True),
            aten.rsub.Tensor: self.binary(g.SubOp, alpha=True, swap=True),
            aten.rsub.Scalar: self.binary(g.SubOp, alpha=True, swap=True),
            aten.mul.Tensor: self.binary(g.MulOp),
            aten.mul.Scalar: self.binary(g.MulOp),
            aten.div.Tensor: self.binary(g.DivOp),
            aten.div.Scalar: self.binary(g.DivOp),
            aten.div.Tensor_mode: rounding.div_mode(self, _bind, _Unsupported),
            aten.div.Scalar_mode: rounding.div_mode(self, _bind, _Unsupported),
            **{getattr(aten, m).default: rounding.unary_rounding(self, _bind, m)
               for m in ("floor", "trunc", "ceil", "round")},
            aten.maximum.default: self.binary(g.MaximumOp),
            aten.relu.default: self.unary(g.ReluOp),
            aten.exp.default: self.unary(g.ExpOp),
            aten.tanh.default: self.unary(g.TanhOp),
            aten.sigmoid.default: self.unary(g.SigmoidOp),
            aten.neg.default: self.unary(g.NegOp),
            aten.rsqrt.default: self.unary(g.RsqrtOp),
            aten.sqrt.default: self.unary(g.SqrtOp),
            aten.silu.default: self.unary(g.SiluOp),
            aten.gelu.default: self.h_gelu,
            aten._softmax.default: self.h_softmax,
            aten.softmax.int: self.h_softmax,
            aten.native_layer_norm.default: self.h_layer_norm,
            aten.permute.default: self.h_permute,
            aten.t.default: self.h_t,
            aten.transpose.int: self.h_transpose,
            aten.view.default: self.h_reshape,
            aten.reshape.default: self.h_reshape,
            aten._unsafe_view.default: self.h_reshape,
            aten.unsqueeze.default: self.h_reshape,
            aten.squeeze.default: self.h_reshape,
            aten.squeeze.dim: self.h_reshape,
            aten.squeeze.dims: self.h_reshape,
            aten.expand.default: self.h_expand,
            aten.clone.default: self.h_identity,
            aten.alias.default: self.h_identity,
            aten.detach.default: self.h_identity,
            aten.lift_fresh_copy.default: self.h_identity,
            aten._to_copy.default: self.h_to_copy,
            operator.getitem: self.h_getitem,
            aten._assert_tensor_metadata.default: self.h_drop,
            aten.sym_size.int: self.h_sym_size,
            aten._assert_scalar.default: self.h_drop,
            aten.sym_constrain_range_for_size.default: self.h_drop,
            operator.add: self.size_arith(operator.add),
            operator.sub: self.size_arith(operator.sub),
            operator.mul: self.size_arith(operator.mul),
            operator.floordiv: self.size_arith(operator.floordiv),
            operator.mod: self.size_arith(operator.mod),
            operator.neg: self.size_arith(operator.neg),
        }
        from tilecc.frontend import aten_index, aten_nn, aten_routing, aten_scatter

        h.update(aten_nn.handlers(self))
        h.update(aten_index.handlers(self))
        h.update(aten_routing.handlers(self))
        h.update(aten_scatter.handlers(self))
        return h

    def binary(self, cls: type[g.BinaryElementwiseOp], alpha: bool = False, swap: bool = False):
        """``self op other`` (``other op self`` for rsub); ``alpha`` scales `other`."""

        def handle(node: Node) -> SSAValue:
            a = _bind(node)
            _, dt = self.out_meta(node)
            x, y = self.value(a["self"]), self.value(a["other"])
            al = a.get("alpha", 1) if alpha else 1
            if al is not None and al != 1:
                if swap:
                    x = self.scaled(x, al, dt)
                else:
                    y = self.scaled(y, al, dt)
            if swap:
                x, y = y, x
            return self.emit(cls.make(self.operand_v(x, dt), self.operand_v(y, dt)))

        return handle

    def scaled(self, v: Any, factor: Any, dt: DType) -> Any:
        if isinstance(v, SSAValue):
            return self.emit(g.MulOp.make(self.cast_to(v, dt), self.scalar(factor, dt)))
        return v * factor

    def operand_v(self, v: Any, dt: DType) -> SSAValue:
        if isinstance(v, SSAValue):
            return self.cast_to(v, dt)
        return self.scalar(v, dt)

    def unary(self, cls: type[g.UnaryElementwiseOp]):
        def handle(node: Node) -> SSAValue:
            _, dt = self.out_meta(node)
            return self.emit(cls.make(self.cast_to(self.tensor(node.args[0]), dt)))

        return handle

    def h_matmul(self, node: Node) -> SSAValue:
        shape, dt = self.out_meta(node)
        a = self.cast_to(self.tensor(node.args[0]), dt)
        b = self.cast_to(self.tensor(node.args[1]), dt)
        sa, sb = g.shape_of(a), g.shape_of(b)
        if len(sa) == 0 or len(sb) == 0:
            raise _Unsupported("rank-0 operand")
        if len(sa) == 1:
            a = self.emit(g.ReshapeOp.make(a, [1, sa[0]]))
        if len(sb) == 1:
            b = self.emit(g.ReshapeOp.make(b, [sb[0], 1]))
        r = self.emit(g.MatmulOp.make(a, b))
        if g.shape_of(r) != tuple(shape):
            r = self.emit(g.ReshapeOp.make(r, shape))
        return r

    def h_addmm(self, node: Node) -> SSAValue:
        """beta * self + alpha * (mat1 @ mat2); beta = 0 ignores `self` (even NaNs), as torch does."""
        a = _bind(node)
        beta, alpha = a.get("beta", 1), a.get("alpha", 1)
        _, dt = self.out_meta(node)
        mm = self.emit(
            g.MatmulOp.make(
                self.cast_to(self.tensor(a["mat1"]), dt), self.cast_to(self.tensor(a["mat2"]), dt)
            )
        )
        if alpha != 1:
            mm = self.emit(g.MulOp.make(mm, self.scalar(alpha, dt)))
        if beta == 0:
            return mm
        bias = self.operand(a["self"], dt)
        if beta != 1:
            bias = self.emit(g.MulOp.make(bias, self.scalar(beta, dt)))
        return self.emit(g.AddOp.make(mm, bias))

    def h_gelu(self, node: Node) -> SSAValue:
        a = _bind(node)
        _, dt = self.out_meta(node)
        approx = a["approximate"] or "none"
        if approx not in ("none", "tanh"):
            raise _Unsupported(f"approximate={approx!r}")
        return self.emit(g.GeluOp.make(self.cast_to(self.tensor(a["self"]), dt), approx))

    def h_softmax(self, node: Node) -> SSAValue:
        a = _bind(node)
        if a.get("half_to_float"):
            raise _Unsupported("half_to_float=True")
        _, dt = self.out_meta(node)
        x = self.cast_to(self.tensor(a["self"]), dt)
        from tilecc.frontend.softmax_dims import over_any_dim

        return over_any_dim(self.emit, g.SoftmaxOp.make, x, int(a["dim"]))

    def h_layer_norm(self, node: Node) -> tuple:
        a = _bind(node)
        shape, dt = self.out_meta_first(node)
        x = self.cast_to(self.tensor(a["input"]), dt)
        norm = [int(d) for d in a["normalized_shape"]]
        w, b = self.value(a["weight"]), self.value(a["bias"])
        w = self.cast_to(w, dt) if isinstance(w, SSAValue) else self.emit(
            g.ConstantOp.make(np.ones(norm, dtype=np.float32), dt)
        )
        b = self.cast_to(b, dt) if isinstance(b, SSAValue) else self.emit(
            g.ConstantOp.make(np.zeros(norm, dtype=np.float32), dt)
        )
        y = self.emit(g.LayerNormOp.make(x, w, b, len(norm), float(a["eps"])))
        return (y, _Poison("mean output"), _Poison("rstd output"))

    def out_meta_first(self, node: Node) -> tuple[list[int], DType]:
        v = node.meta.get("val")
        if isinstance(v, list | tuple) and v and isinstance(v[0], torch.Tensor):
            return _static_shape(v[0], self.bindings), _dtype(v[0].dtype)
        raise _Unsupported("unexpected result")

    def h_permute(self, node: Node) -> SSAValue:
        x = self.tensor(node.args[0])
        return self.emit(g.PermuteOp.make(x, [int(d) for d in _bind(node)["dims"]]))

    def h_t(self, node: Node) -> SSAValue:
        x = self.tensor(node.args[0])
        if len(g.shape_of(x)) < 2:
            return x
        return self.emit(g.PermuteOp.make(x, [1, 0]))

    def h_transpose(self, node: Node) -> SSAValue:
        x = self.tensor(node.args[0])
        rank = len(g.shape_of(x))
        if rank == 0:
            return x
        a = _bind(node)
        d0, d1 = (int(a[k]) % rank for k in ("dim0", "dim1"))
        if d0 == d1:
            return x
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.emit(g.PermuteOp.make(x, perm))

    def h_reshape(self, node: Node) -> SSAValue:
        shape, dt = self.out_meta(node)
        x = self.tensor(node.args[0])
        if g.shape_of(x) == tuple(shape):
            return x
        return self.emit(g.ReshapeOp.make(x, shape))

    def h_expand(self, node: Node) -> SSAValue:
        shape, dt = self.out_meta(node)
        x = self.tensor(node.args[0])
        if g.shape_of(x) == tuple(shape):
            return x
        return self.emit(g.ExpandOp.make(x, shape))

    def h_identity(self, node: Node) -> SSAValue:
        self.out_meta(node)  # result must be a float tensor
        return self.tensor(node.args[0])

    def h_to_copy(self, node: Node) -> SSAValue:
        a = _bind(node)
        layout = a.get("layout")
        if layout is not None and layout != torch.strided:
            raise _Unsupported(f"layout={layout}")
        _, dt = self.out_meta(node)
        x = self.tensor(a["self"])
        if a.get("dtype") == torch.int8 and g.element_dtype(x.type) != DType.I32:
            # int8 values (a W8A8 activation: tilecc/quantize.py) pass through an i8 tensor,
            # then live as i32 like every integer tensor (passes/graph/w8a8_matmul.py
            # finds the i8 one)
            x = self.cast_to(x, DType.I8)
        return self.cast_to(x, dt)

    def h_getitem(self, node: Node) -> Any:
        src, idx = node.args
        v = self.value(src)
        if not isinstance(v, list | tuple):
            raise _Unsupported("getitem on a non-tuple")
        if not isinstance(idx, int):
            raise _Unsupported(f"getitem with a non-integer index {idx!r}")
        item = v[idx]
        if isinstance(item, _Poison) and node.users:
            # e.g. the mean / rstd outputs of native_layer_norm
            producer = src.target if isinstance(src, Node) else None
            name = _op_name(producer) if producer is not None else "getitem"
            self.unsupported.append((f"{name} ({item.what})", self.loc))
        return item

    def h_sym_size(self, node: Node) -> int:
        """A symbolic size, concrete in this specialisation."""
        return g.shape_of(self.tensor(node.args[0]))[int(_bind(node)["dim"])]

    def size_arith(self, fn: Callable[..., Any]) -> Callable[[Node], int]:
        def handle(node: Node) -> int:
            args = [self.value(a) for a in node.args]
            if not all(isinstance(a, int) for a in args):
                raise _Unsupported("arithmetic on non-integer values")
            return fn(*args)

        return handle

    def h_drop(self, node: Node) -> None:
        return None

    # -- graph walk -------------------------------------------------------------

    def record(self, node: Node, reason: str = "") -> None:
        name = _op_name(node.target) if node.op == "call_function" else f"{node.op} {node.name}"
        self.unsupported.append((f"{name} ({reason})" if reason else name, node_location(node)))

    def first_user_loc(self, node: Node) -> str:
        for u in node.users:
            if u.op == "call_function":
                return node_location(u)
        return node.name

    def placeholder(self, node: Node, spec: InputSpec) -> None:
        mutated = set(self.ep.graph_signature.buffers_to_mutate.values())
        if spec.kind == InputKind.USER_INPUT or (spec.kind == InputKind.BUFFER and spec.target in mutated):
            # a buffer the program updates is state: an input named "buffer:<name>" (its
            # value before the call) and an output of that name (after it), see STATE_PREFIX
            name = node.name if spec.kind == InputKind.USER_INPUT else f"{STATE_PREFIX}{spec.target}"
            self.input_names.append(name)
            t = _meta_tensor(node)
            try:
                if t is None:
                    raise _Unsupported(f"non-tensor input {node.meta.get('val')!r}")
                shape = _static_shape(t, self.bindings)
                if 0 in shape:
                    raise ShapeError(f"input '{name}' has shape {shape}, with a zero-size dimension: "
                                     "tilecc compiles non-empty tensors")
                ty = g.tensor_type(shape, _dtype(t.dtype))
                self.input_dtypes.append(torch_dtype_name(t.dtype))
                if t.dtype == torch.float64:
                    self.float64_ops.append((f"input '{name}'", "<input>"))
            except _Unsupported as e:
                self.unsupported.append(
                    (f"input '{name}' ({e.reason}; tilecc takes float32, bfloat16, "
                     "float16, integer and bool tensors)", "<input>")
                )
                self.env[node] = _Poison("input")
                self.input_types.append(None)
                return
            self.input_types.append(ty)
            self.env[node] = self.block.insert_arg(ty, len(self.block.args))
            return
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            target = spec.target
            if target is None:  # torch.export names every parameter, buffer and constant
                raise ExportError(f"{spec.kind.name.lower()} input '{node.name}' has no name")
            if not node.users:
                self.env[node] = _Poison("unused")
                return
            data = self.ep.state_dict.get(target)
            if data is None:
                data = self.ep.constants.get(target)
            if not isinstance(data, torch.Tensor):
                loc = self.first_user_loc(node)
                self.unsupported.append((f"{spec.kind.name.lower()} '{target}' (not a tensor)", loc))
                self.env[node] = _Poison("weight")
                return
            self.const_values[node] = data.detach()
            self.const_names[node] = target
            return
        self.unsupported.append((f"{spec.kind.name.lower()} input '{node.name}'", "<input>"))
        self.env[node] = _Poison("input")

    def materialise(self, node: Node) -> Any:
        """A compile-time value used by a runtime op: a graph.weight (or a Python scalar)."""
        data = self.const_values[node]
        if not isinstance(data, torch.Tensor):
            return data
        name = self.const_names.get(node, f"folded.{node.name}")
        saved, self.loc = self.loc, self.first_user_loc(node)
        try:
            lowp = lowp_weights.materialise(self, node)
            if lowp is not None:
                return lowp
            try:
                shape, dt = _static_shape(data), _dtype(data.dtype)
            except _Unsupported as e:
                kind = "constant" if node.op == "call_function" else "weight"
                raise _Unsupported(f"{kind} '{name}' of dtype {data.dtype} ({e.reason})") from None
            if name not in self.weights:
                self.weights[name] = _weight_values(data, name, self.borrow_weights)
            return self.emit(g.WeightOp.make(name, g.tensor_type(shape, dt)))
        finally:
            self.loc = saved

    def try_fold(self, node: Node) -> bool:
        """Evaluate `node` at compile time if every input is known; True if folded."""
        if not all(n in self.const_values for n in node.all_input_nodes):
            return False
        if not (isinstance(node.target, torch._ops.OpOverload) or node.target is operator.getitem):
            return False
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            return False  # in-place ops are not evaluated at compile time
        meta = _meta_tensor(node)
        if meta is not None and any(isinstance(d, torch.SymInt) for d in meta.shape):
            return False
        if meta is not None and node.all_input_nodes:
            numel_in = sum(
                v.numel() for n in node.all_input_nodes
                if isinstance(v := self.const_values[n], torch.Tensor)
            )
            if meta.numel() > max(4 * numel_in, 1 << 16):
                return False  # do not blow a small constant up into a large one
        target = node.target
        if isinstance(target, str):  # a call_function node's target is a callable
            return False
        args = map_arg(node.args, lambda n: self.const_values[n])
        kwargs = map_arg(node.kwargs, lambda n: self.const_values[n])
        args, kwargs = _on_meta_device(args, kwargs)
        try:
            with torch.no_grad():
                self.const_values[node] = target(*args, **kwargs)
        except Exception:  # not evaluable here (e.g. needs a device): import it normally
            return False
        if target in _UNINITIALISED:  # unspecified values: zeros, not whatever memory held
            self.const_values[node] = torch.zeros_like(self.const_values[node])
        parent = next((self.const_names[n] for n in node.all_input_nodes if n in self.const_names), None)
        if parent is not None:  # e.g. "fc1.weight.permute": a weight pre-transposed at compile time
            self.const_names[node] = f"{parent}.{_op_name(node.target).split('.')[1]}"
        lowp_weights.track(self, node)  # a one-byte weight's dequantisation, kept apart
        return True

    def call(self, node: Node) -> None:
        self.loc = node_location(node)
        if self.try_fold(node):
            self.status[node] = "folded"
            return
        handler = self.handlers.get(node.target)
        if handler is None:  # a tile-DSL kernel registered as a custom op (frontend/dsl/torch_op.py)
            from tilecc.frontend.dsl.torch_op import import_handler

            handler = import_handler(self, node.target)
        deps = [self.env.get(n) for n in node.all_input_nodes]
        if any(isinstance(d, _Poison) for d in deps):
            # an input could not be imported: only check that the op itself is known
            if handler is None:
                self.record(node)
            self.status[node] = "unsupported" if handler is None else "blocked"
            self.env[node] = _Poison("dependency")
            return
        self.status[node] = "unsupported"
        if handler is None:
            self.record(node)
            self.env[node] = _Poison("unsupported")
            return
        try:
            self.env[node] = handler(node)
            self.status[node] = "npu"
            if _touches_float64(node):
                self.float64_ops.append((_op_name(node.target), self.loc))
            if self.bindings:
                self.annotate_symbolic(node, self.env[node])
        except _Unsupported as e:
            self.record(node, e.reason)
            self.env[node] = _Poison("unsupported")
        except ShapeError as e:
            self.record(node, str(e))
            self.env[node] = _Poison("unsupported")
        except TileccError:
            raise
        except Exception as e:  # noqa: BLE001 (a handler's bug still names the op and its place)
            text = str(e).splitlines()[0] if str(e) else ""
            self.record(node, f"internal error in its importer: {type(e).__name__}{': ' + text if text else ''}")
            self.env[node] = _Poison("unsupported")

    def annotate_symbolic(self, node: Node, v: Any) -> None:
        """Record the node's symbolic sizes (sympy, e.g. ``"[s0, 8*s1, 48]"``) on the op
        that computes it, next to the concrete sizes of this specialisation."""
        t = _meta_tensor(node)
        if t is None or not isinstance(v, SSAValue) or not isinstance(v.owner, Operation):
            return
        if any(isinstance(d, torch.SymInt) for d in t.shape):
            v.owner.attributes.setdefault(SHAPE_ATTR, StringAttr(symbolic_shape(t)))

    def symbols_attr(self, bindings: dict) -> DictionaryAttr:
        """``{s0 = "[1, 64] = 4", ...}``: each size symbol, its declared range and its value
        in this specialisation."""
        out = {}
        for sym, value in sorted(bindings.items(), key=lambda kv: str(kv[0])):
            vr = self.ep.range_constraints.get(sym)
            rng = f"[{vr.lower}, {vr.upper}]" if vr is not None else "[?, ?]"
            out[str(sym)] = StringAttr(f"{rng} = {value}")
        return DictionaryAttr(out)

    def run(self) -> g.GraphProgram:
        ep = self.ep
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        out_node = None
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, specs[node.name])
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                out_node = node
            else:
                self.record(node)
                self.env[node] = _Poison("unsupported")

        results: list[SSAValue] = []
        outs = list(out_node.args[0]) if out_node is not None else []
        for spec, a in zip(ep.graph_signature.output_specs, outs):
            name = getattr(spec.arg, "name", str(spec.arg))
            if spec.kind == OutputKind.BUFFER_MUTATION:
                name = f"{STATE_PREFIX}{spec.target}"
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                name = f"{MUTATED_INPUT_PREFIX}{spec.target}"
            elif spec.kind != OutputKind.USER_OUTPUT:
                self.unsupported.append(
                    (f"{spec.kind.name.lower()} '{spec.target or name}'", "<output>")
                )
                continue
            self.output_names.append(name)
            meta = _meta_tensor(a) if isinstance(a, Node) else None
            self.output_dtypes.append(torch_dtype_name(meta.dtype) if meta is not None else "")
            try:
                v = self.value(a) if isinstance(a, Node) else a
            except _Unsupported as e:
                self.unsupported.append((f"output '{name}' ({e.reason})", "<output>"))
                continue
            if isinstance(v, SSAValue):
                results.append(v)
            elif not isinstance(v, _Poison):
                self.unsupported.append((f"output '{name}' (not a tensor: {v!r})", "<output>"))

        if self.unsupported:
            raise UnsupportedOpError(self.unsupported)

        self.block.add_op(func.ReturnOp(*results))
        inputs = [t for t in self.input_types if t is not None]  # all of them, none being unsupported
        fn = func.FuncOp("forward", (inputs, [r.type for r in results]), Region(self.block))
        if self.float64_ops:
            fn.attributes[float64.ATTR] = float64.demotion_attr(self.float64_ops)
        if self.bindings:
            fn.attributes[SYMBOLS_ATTR] = self.symbols_attr(self.bindings)
            shapes = []
            for node in ep.graph.nodes:
                if node.op == "placeholder" and node.name in self.input_names:
                    t = _meta_tensor(node)
                    shapes.append(StringAttr(symbolic_shape(t) if t is not None else "[]"))
            fn.attributes[INPUT_SHAPES_ATTR] = ArrayAttr(shapes)
        module = ModuleOp([fn])
        module.verify()
        return g.GraphProgram(
            module=module,
            weights=self.weights,
            input_names=self.input_names,
            output_names=self.output_names,
            input_dtypes=self.input_dtypes,
            output_dtypes=self.output_dtypes,
        )


def import_exported_program(
    ep: ExportedProgram, bindings: dict | None = None, *, decomposed: bool = False, borrow_weights: bool = False
) -> g.GraphProgram:
    """Decompose `ep` to Core ATen (sdpa kept whole) and import it as a `GraphProgram`.

    A program with symbolic sizes (torch.export `Dim`s) is specialised by `bindings`
    (sympy symbol -> int). Raises one `UnsupportedOpError` listing every node that
    cannot be imported.

    The graph program's weights are copies of the model's tensors, so it does not change
    when they do. `borrow_weights` holds bf16 and float32 ones as read-only views instead
    (no copy): for a graph program compiled at once and then dropped (`compile_cached`),
    whose Program copies what it keeps (`runtime/compiler.py` `read_layout`).
    """
    return _Importer(ep if decomposed else decompose(ep), bindings, borrow_weights).run()


def decompose(ep: ExportedProgram) -> ExportedProgram:
    """`ep` decomposed to Core ATen with tilecc's table (sdpa kept whole)."""
    try:
        core = ep.run_decompositions(decomposition_table())
    except TileccError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise ExportError(
            f"decomposing the exported program failed: {type(e).__name__}: {msg[0] if msg else ''}"
        ) from e
    return core


def supported_targets() -> set[Any]:
    """The fx targets the importer knows (some with conditions on their arguments)."""
    return set(_Importer.__new__(_Importer)._handlers())
