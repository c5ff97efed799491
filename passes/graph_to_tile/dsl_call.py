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

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, MemRefType, StringAttr, TensorType
from xdsl.ir import Operation

from tilecc.errors import CompileError
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.passes.graph_to_tile.context import LoweringContext


def lower_dsl_call(lw: LoweringContext, op: Operation, loc: str) -> None:
    if not isinstance(op, DslCallOp):
        raise CompileError(f"lower_dsl_call at {loc}: {op.name} is not a graph.dsl_call")
    name = op.kernel.data
    if lw.dsl_kernels is None:
        raise CompileError(
            f"{name} at {loc}: graph.dsl_call needs the tile-DSL front end; compile through "
            "tilecc.compile / compile_graph (a lone lower-graph-to-tile pass has none)"
        )
    args = []
    for v, (pname, dtype, elem) in zip(op.operands, lw.dsl_kernels.params(op), strict=True):
        hbm = lw.dense(lw.materialise(v))
        want = MemRefType(elem, list(hbm.type.get_shape()))
        if hbm.type.element_type != want.element_type:
            raise CompileError(f"{name} at {loc}: '{pname}' is {dtype}, the call passes {hbm.type.element_type}")
        if hbm.type != want:  # a dense view with a layout attribute: copy to a plain tensor
            hbm = lw.view(hbm, list(hbm.type.get_shape()))
        args.append(hbm)
    shapes = [tuple(a.type.get_shape()) for a in args]
    kfunc, kconsts = lw.dsl_kernels.build(op, shapes, lw.cfg)
    kfunc.sym_name = StringAttr(lw.kernel_name(name))
    outs = [lw.hbm(list(r.type.get_shape()), r.type.element_type) for r in op.results]
    consts = []
    for data, elem in kconsts:
        attr = DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(data.shape)), data.reshape(-1).tolist())
        consts.append(lw.hbm(list(data.shape), elem, value=attr))
    lw.kernels.append(kfunc)
    lw.emit(func.CallOp(kfunc.sym_name.data, args + outs + consts, []))
    for r, o in zip(op.results, outs):
        lw.values[r] = o


LOWERINGS = {DslCallOp: lower_dsl_call}
