"""The tile-DSL front end as the graph lowering's kernel source for `graph.dsl_call`.

`lower-graph-to-tile` lowers a DSL kernel called from a graph by inlining the kernel's
tile IR, but passes never import a front end: the driver hands the lowering this
object (`LoweringContext.dsl_kernels`), which parses the call's source and builds the
kernel at the call's shapes.

    kernels = DslKernels()
    kernels.params(op)                         -> [("a", "bf16", bf16), ...]  (one per parameter)
    kernels.build(op, [(64, 32), ...], cfg)   -> (func.func @gemm_gelu, [(data, f32), ...])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Attribute, Operation

from tilecc.errors import CompileError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import DTYPES, KernelLowering
from tilecc.frontend.dsl.parser import parse
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.simulator.config import HardwareConfig


class DslKernels:
    """Builds the tile kernels of `graph.dsl_call` ops from their DSL source."""

    def _kernel(self, op: Operation) -> A.Kernel:
        if not isinstance(op, DslCallOp):
            raise CompileError(f"the tile DSL builds graph.dsl_call ops, not {op.name}")
        name = op.kernel.data
        return next(k for k in parse(op.source.data, op.file.data) if k.name == name)

    def params(self, op: Operation) -> list[tuple[str, str, Attribute]]:
        """(name, dtype as written, element type) of each of the called kernel's parameters."""
        return [(p.name, p.type.dtype, DTYPES[p.type.dtype]) for p in self._kernel(op).params]

    def build(
        self, op: Operation, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig
    ) -> tuple[func.FuncOp, list[tuple[np.ndarray, Attribute]]]:
        """The kernel at `shapes` and its constants (data, element type)."""
        kl = KernelLowering(self._kernel(op), list(shapes), cfg)
        kfunc = kl.run()
        return kfunc, [(data, DTYPES[dtype]) for data, dtype in kl.consts]
