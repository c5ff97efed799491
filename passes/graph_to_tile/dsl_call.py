"""Lower `graph.dsl_call` (a tile-DSL kernel called as a torch custom op) by inlining
the kernel's tile IR: the DSL front end builds the kernel at the call's shapes, it joins
the program's kernels, and ``@main`` calls it on the HBM tensors of its operands, a
fresh tensor per result and the kernel's constants::

    %y = graph.dsl_call %a, %b {kernel = "gemm_gelu", ...} : (...) -> tensor<64x48xbf16>
    -->
    func.func @k3_gemm_gelu(%a: memref<64x32xbf16>, ...) attributes {tile.kernel} {...}
    func.call @k3_gemm_gelu(%a_hbm, %b_hbm, %y_hbm) : (...) -> ()

The front end reaches the lowering as `LoweringContext.dsl_kernels` (the driver hands
it `frontend/dsl/graph_call.DslKernels()`): passes never import a front end.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    IntegerType,
    MemRefType,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.passes.graph_to_tile.context import LoweringContext
from tilecc.passes.graph_to_tile.shapes import elem_of, shape_of


def lower_dsl_call(lw: LoweringContext, op: Operation, loc: str) -> None:
    if not isinstance(op, DslCallOp):
        raise CompileError(f"lower_dsl_call at {loc}: {op.name} is not a graph.dsl_call")
    name = op.kernel.data
    if lw.dsl_kernels is None:
        raise CompileError(
            f"{name} at {loc}: graph.dsl_call needs the tile-DSL front end; compile through "
            "tilecc.compile / compile_graph (a lone lower-graph-to-tile pass has none)"
        )
    args: list[SSAValue] = []
    for v, (pname, dtype, elem) in zip(op.operands, lw.dsl_kernels.params(op), strict=True):
        hbm = lw.dense(lw.materialise(v))
        want = MemRefType(elem, list(shape_of(hbm.type)))
        if elem_of(hbm.type) != want.element_type:
            raise CompileError(f"{name} at {loc}: '{pname}' is {dtype}, the call passes {elem_of(hbm.type)}")
        if hbm.type != want:  # a dense view with a layout attribute: copy to a plain tensor
            hbm = lw.view(hbm, list(shape_of(hbm.type)))
        args.append(hbm)
    shapes = [shape_of(a.type) for a in args]
    kfunc, kconsts = lw.dsl_kernels.build(op, shapes, lw.cfg)
    kfunc.sym_name = StringAttr(lw.kernel_name(name))
    outs = [lw.hbm(list(shape_of(r.type)), elem_of(r.type)) for r in op.results]
    consts: list[SSAValue] = []
    for data, elem in kconsts:
        consts.append(lw.hbm(list(data.shape), elem, value=_constant(data, elem, name, loc)))
    lw.kernels.append(kfunc)
    lw.emit(func.CallOp(kfunc.sym_name.data, args + outs + consts, []))
    for r, o in zip(op.results, outs):
        lw.values[r] = o


def _constant(data: np.ndarray, elem: Attribute, name: str, loc: str) -> DenseIntOrFPElementsAttr:
    """A kernel constant's values as a dense attribute of its element type."""
    values = data.reshape(-1).tolist()
    if isinstance(elem, Float32Type | BFloat16Type | Float16Type):
        return DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(data.shape)), values)
    if isinstance(elem, IntegerType):
        return DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(data.shape)), values)
    raise CompileError(f"{name} at {loc}: a kernel constant of element type {elem}")


LOWERINGS = {DslCallOp: lower_dsl_call}
