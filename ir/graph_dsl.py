"""`graph.dsl_call`: a tile-DSL kernel called from a graph (a torch custom op made with
``tilecc.Kernel.as_torch_op``). It carries the kernel's source; lower-graph-to-tile
inlines the kernel's tile IR at the call's shapes (`passes/graph_to_tile/dsl_call.py`)::

    %y = graph.dsl_call %a, %b {kernel = "gemm_gelu", source = "kernel gemm_gelu(...", file = "g.tdsl"}
        : (tensor<64x32xbf16>, tensor<32x48xbf16>) -> tensor<64x48xbf16>
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xdsl.dialects.builtin import StringAttr, TensorType
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, prop_def, var_operand_def, var_result_def


@irdl_op_definition
class DslCallOp(IRDLOperation):
    name = "graph.dsl_call"
    ins = var_operand_def(TensorType)
    outs = var_result_def(TensorType)
    kernel = prop_def(StringAttr)
    source = prop_def(StringAttr)
    file = prop_def(StringAttr)

    def __init__(self, inputs: Sequence[SSAValue], result_types: Sequence[Attribute], kernel: Any):
        super().__init__(
            operands=[list(inputs)], result_types=[list(result_types)],
            properties={"kernel": StringAttr(kernel.name), "source": StringAttr(kernel.ast.source),
                        "file": StringAttr(kernel.ast.filename)},
        )
