"""Tile-DSL kernels as torch custom ops.

``k.as_torch_op("mylib::gemm_gelu")`` registers ``torch.ops.mylib.gemm_gelu`` with
`torch.library.custom_op` (schema from the kernel's parameters) and a fake
implementation that computes the result shapes from the kernel's result types, so
`torch.export` traces through it and keeps it as one node. Eager calls (and any other
backend) run the kernel on the simulator (its reference implementation). The tilecc
importer turns the node into ``graph.dsl_call`` (`ir/graph_dsl.py`) and lower-graph-to-tile
inlines the kernel's tile IR at the call's shapes (`passes/graph_to_tile/dsl_call.py`).

Which ops are DSL kernels is recorded in `REGISTRY` (op overload -> kernel), beside
torch's own global operator registry that it mirrors.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from tilecc.errors import TileccError
from tilecc.frontend.dsl import ast as A

TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32}


class Kernel(Protocol):
    """What an op needs of a kernel (`tilecc.Kernel`, `runtime/kernel.py`): its syntax
    tree, its name, and a call that runs it."""

    ast: A.Kernel
    name: str

    def __call__(self, *arrays: Any, target: str = "tiny") -> Any: ...


REGISTRY: dict[Any, Kernel] = {}


def _result_shape(kernel: Kernel, p: A.Param, args: tuple) -> list:
    sizes: dict[str, Any] = {}
    for q, a in zip(kernel.ast.params, args):
        for d, n in zip(q.type.dims, a.shape):
            if isinstance(d, str):
                sizes.setdefault(d, n)
    return [_size(d, sizes) for d in p.type.dims]


def _size(d: Any, sizes: dict[str, Any]) -> Any:
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return sizes[d]
    if isinstance(d, A.Name):
        return sizes[d.id]
    if isinstance(d, A.Number):
        return int(d.value)
    if isinstance(d, A.BinOp) and d.op in "+-*":
        a, b = _size(d.lhs, sizes), _size(d.rhs, sizes)
        return a + b if d.op == "+" else a - b if d.op == "-" else a * b
    raise TileccError(f"result size {d} cannot be computed for torch (use +, - and *)")


def register(kernel: Kernel, qualname: str, target: str = "tiny"):
    """Register `kernel` as the torch custom op `qualname` ("namespace::name")."""
    if "::" not in qualname:
        raise TileccError(f"custom op name '{qualname}' must be 'namespace::name'")
    params = kernel.ast.params
    results = kernel.ast.results
    ret = "Tensor" if len(results) == 1 else "(" + ", ".join("Tensor" for _ in results) + ")"
    schema = "(" + ", ".join(f"Tensor {p.name}" for p in params) + ") -> " + ret

    def eager(*args: torch.Tensor):
        out = kernel(*(a.contiguous() for a in args), target=target)
        return out if isinstance(out, tuple) or len(results) == 1 else tuple(out)

    op = torch.library.custom_op(qualname, eager, mutates_args=(), schema=schema)

    def fake(*args: torch.Tensor):
        outs = tuple(args[0].new_empty(_result_shape(kernel, p, args), dtype=TORCH_DTYPE[p.type.dtype])
                     for p in results)
        return outs[0] if len(outs) == 1 else outs

    op.register_fake(fake)
    ns, name = qualname.split("::")
    overload = getattr(getattr(torch.ops, ns), name).default
    REGISTRY[overload] = kernel
    return op


def import_handler(importer: Any, target: Any):
    """The importer's handler for a DSL custom op node (None for any other target)."""
    kernel = REGISTRY.get(target)
    if kernel is None:
        return None

    def handle(node):
        from tilecc.ir import graph as g
        from tilecc.ir.graph_dsl import DslCallOp

        ins = [importer.tensor(a, f"argument {i} of {kernel.name}") for i, a in enumerate(node.args)]
        metas = node.meta.get("val")
        metas = list(metas) if isinstance(metas, (tuple, list)) else [metas]
        types = [g.tensor_type(list(int(n) for n in m.shape), _dtype(m.dtype)) for m in metas]
        op = DslCallOp(ins, types, kernel)
        g.set_loc(op, importer.loc)
        importer.block.add_op(op)
        return op.results[0] if len(op.results) == 1 else tuple(op.results)

    return handle


def _dtype(dt: torch.dtype):
    from tilecc.frontend.torch_export import _dtype as conv

    return conv(dt)
