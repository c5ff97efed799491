"""Lower `graph.dsl_call` (a tile-DSL kernel called as a torch custom op) by inlining
the kernel's tile IR: the DSL front end builds the kernel at the call's shapes, it joins
the program's kernels, and ``@main`` calls it on the HBM tensors of its operands, a
fresh tensor per result and the kernel's constants::

    %y = graph.dsl_call %a, %b {kernel = "gemm_gelu", ...} : (...) -> tensor<64x48xbf16>
    -->
    func.func @k3_gemm_gelu(%a: memref<64x32xbf16>, ...) attributes {tile.kernel} {...}
    func.call @k3_gemm_gelu(%a_hbm, %b_hbm, %y_hbm) : (...) -> ()
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, MemRefType, StringAttr, TensorType

from tilecc.errors import CompileError
from tilecc.ir.graph_dsl import DslCallOp


def lower_dsl_call(gt: Any, op: DslCallOp, loc: str) -> None:
    from tilecc.frontend.dsl.lower import DTYPES, KernelLowering
    from tilecc.frontend.dsl.parser import parse

    name = op.kernel.data
    kernel = next(k for k in parse(op.source.data, op.file.data) if k.name == name)
    args = []
    for v, p in zip(op.operands, kernel.params, strict=True):
        hbm = gt.dense(gt.materialise(v))
        want = MemRefType(DTYPES[p.type.dtype], list(hbm.type.get_shape()))
        if hbm.type.element_type != want.element_type:
            raise CompileError(f"{name} at {loc}: '{p.name}' is {p.type.dtype}, the call passes {hbm.type.element_type}")
        if hbm.type != want:  # a dense view with a layout attribute: copy to a plain tensor
            hbm = gt.view(hbm, list(hbm.type.get_shape()))
        args.append(hbm)
    shapes = [tuple(a.type.get_shape()) for a in args]
    kl = KernelLowering(kernel, shapes, gt.cfg)
    kfunc = kl.run()
    kfunc.sym_name = StringAttr(gt.kernel_name(name))
    outs = [gt.hbm(list(r.type.get_shape()), r.type.element_type) for r in op.results]
    consts = []
    for data, dtype in kl.consts:
        elem = DTYPES[dtype]
        attr = DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(data.shape)), data.reshape(-1).tolist())
        consts.append(gt.hbm(list(data.shape), elem, value=attr))
    gt.kernels.append(kfunc)
    gt.emit(func.CallOp(kfunc.sym_name.data, args + outs + consts, []))
    for r, o in zip(op.results, outs):
        gt.values[r] = o


LOWERINGS = {DslCallOp: lower_dsl_call}
