"""plan-hbm: give every HBM tensor of the program a byte offset.

Before::

    %x = tile.hbm_alloc {input = 0 : i64} : memref<37x53xf32>
    %w = tile.hbm_alloc {weight = "fc.weight"} : memref<29x53xf32>
    %y = tile.hbm_alloc : memref<37x29xf32>

After::

    %x = tile.hbm_alloc {input = 0 : i64, offset = 0 : i64} : ...
    %w = tile.hbm_alloc {weight = "fc.weight", offset = 7872 : i64} : ...
    %y = tile.hbm_alloc {offset = 14080 : i64} : ...

Tensors are laid out in program order, 64-byte aligned (`tile.view` aliases its
source). Inputs, weights and outputs keep their own space; intermediates do too for
now (liveness-based sharing is a later optimisation). The module gets the attribute
`tile.hbm_size` with the bytes used.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, i64
from xdsl.passes import ModulePass

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.passes.plan_sram import element_size
from tilecc.simulator.config import HardwareConfig, load_config

ALIGN = 64


def tensor_bytes(t: MemRefType) -> int:
    n = 1
    for d in t.get_shape():
        n *= d
    return n * element_size(t.element_type)


@dataclass(frozen=True)
class PlanHbmPass(ModulePass):
    name = "plan-hbm"
    target: str = "tiny"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        plan_hbm(op, load_config(self.target))


def plan_hbm(op: ModuleOp, cfg: HardwareConfig) -> None:
    main = next((f for f in op.ops if isinstance(f, func.FuncOp) and f.sym_name.data == "main"), None)
    if main is None:
        raise CompileError("plan-hbm: the module has no func.func @main")
    offset = 0
    for alloc in main.walk():
        if not isinstance(alloc, tile.HbmAllocOp):
            continue
        t = alloc.result.type
        assert isinstance(t, MemRefType)
        alloc.properties["offset"] = IntegerAttr(offset, i64)
        offset += -(-max(tensor_bytes(t), 1) // ALIGN) * ALIGN
    if offset > cfg.hbm.capacity_bytes:
        raise CompileError(
            f"plan-hbm: the program needs {offset} bytes of HBM, the target has "
            f"{cfg.hbm.capacity_bytes}"
        )
    op.attributes["tile.hbm_size"] = IntegerAttr(offset, i64)
