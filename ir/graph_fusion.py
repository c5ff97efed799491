"""Fusion groups of the graph dialect: `graph.fused` and its terminator `graph.yield`.

The `fuse-graph` pass (passes/graph/fuse.py) wraps the ops that become one kernel in a
`graph.fused` op: its region holds the ops on block arguments (the group's inputs),
`graph.yield` returns the values used outside (the group's outputs, which are the only
tensors of the group that reach HBM). `kind` names the kernel template that lowers it:

- ``elementwise``: a DAG of elementwise ops over one iteration space;
- ``rowwise``: a layer norm, softmax or log_softmax with an elementwise prologue
  (producing its input) and epilogue (consuming its result);
- ``matmul``: a matmul with an epilogue on its result (bias, activation, residual,
  scale, cast) and, optionally, a row-wise prologue producing its A operand;
- ``mlp``: two ``matmul`` groups (and the reshapes between them) whose first one's only
  output, the hidden activation, is only the second one's A operand
  (passes/graph/fuse_mlp.py); lowered as one kernel that keeps the hidden on chip
  (passes/graph_to_tile/mlp/), or as its inner groups.

Example::

    %y = graph.fused "elementwise" (%x, %b) : (tensor<512x768xbf16>, tensor<768xbf16>)
        -> tensor<512x768xbf16> {
    ^bb0(%x1: tensor<512x768xbf16>, %b1: tensor<768xbf16>):
      %s = graph.add %x1, %b1 : tensor<512x768xbf16>, tensor<768xbf16> -> tensor<512x768xbf16>
      %g = graph.gelu %s approximate "tanh" : tensor<512x768xbf16>
      graph.yield %g : tensor<512x768xbf16>
    }
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import StringAttr, TensorType
from xdsl.ir import Attribute, Block, BlockArgument, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator
from xdsl.utils.exceptions import VerifyException

FUSION_KINDS = ("elementwise", "rowwise", "matmul", "mlp")


@irdl_op_definition
class FusedOp(IRDLOperation):
    """A fusion group lowered as one kernel; intermediates of the region stay on chip."""

    name = "graph.fused"
    kind = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    outputs = var_result_def(TensorType)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove())
    assembly_format = "$kind `(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs) $body"

    def __init__(self, kind: str, inputs: Sequence[SSAValue], result_types: Sequence[Attribute], body: Region):
        super().__init__(
            operands=[list(inputs)], result_types=[list(result_types)],
            properties={"kind": StringAttr(kind)}, regions=[body],
        )

    @property
    def block(self) -> Block:
        return self.body.block

    def verify_(self) -> None:
        if self.kind.data not in FUSION_KINDS:
            raise VerifyException(
                f'graph.fused: unknown kind "{self.kind.data}" (expected {", ".join(FUSION_KINDS)})'
            )
        args = self.block.args
        if [a.type for a in args] != [v.type for v in self.inputs]:
            raise VerifyException("graph.fused: block argument types differ from the input types")
        last = self.block.last_op
        if not isinstance(last, YieldOp):
            raise VerifyException("graph.fused: the region must end with graph.yield")
        if [v.type for v in last.values] != [r.type for r in self.outputs]:
            raise VerifyException("graph.fused: graph.yield types differ from the result types")


@irdl_op_definition
class YieldOp(IRDLOperation):
    """The values a `graph.fused` region returns."""

    name = "graph.yield"
    values = var_operand_def(TensorType)
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(FusedOp)))
    assembly_format = "($values^ `:` type($values))? attr-dict"

    def __init__(self, *values: SSAValue):
        super().__init__(operands=[list(values)])


FUSION_OPS = (FusedOp, YieldOp)

def outer_value(v: SSAValue) -> SSAValue:
    """The value behind `v` through the block arguments of fused groups (nested ones
    included: an mlp group's matmul groups): the operand each argument stands for, up to
    a value no group's argument (an op's result, or an argument of the function)."""
    while isinstance(v, BlockArgument):
        parent = v.owner.parent_op()
        if parent is None or v.index >= len(parent.operands):
            return v
        v = parent.operands[v.index]
    return v


__all__ = ["FusedOp", "YieldOp", "FUSION_OPS", "FUSION_KINDS", "outer_value"]
