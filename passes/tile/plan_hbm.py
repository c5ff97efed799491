"""plan-hbm: give every HBM tensor of the program a byte offset; intermediates share
space by liveness.

Before::

    %x = tile.hbm_alloc {input = 0 : i64} : memref<37x53xf32>
    %w = tile.hbm_alloc {weight = "fc.weight"} : memref<29x53xf32>
    %t = tile.hbm_alloc : memref<37x29xf32>          // written by k0, read by k1
    %y = tile.hbm_alloc : memref<37x29xf32>          // written by k1 (an output)
    %u = tile.hbm_alloc : memref<37x29xf32>          // written by k2, read by k3

After::

    %x = tile.hbm_alloc {input = 0 : i64, offset = 0 : i64} : ...
    %w = tile.hbm_alloc {weight = "fc.weight", offset = 7872 : i64} : ...
    %t = tile.hbm_alloc {offset = 14080 : i64} : ...  // dead after k1:
    %u = tile.hbm_alloc {offset = 14080 : i64} : ...  // %u reuses its bytes

Inputs, weights, constants and tensors marked `zeroed` (the program relies on their
initial zeros) are laid out first, in program order (each lives for the whole program;
the inputs are never overwritten). An intermediate lives from the first
kernel launch that touches it to the last (views alias their root allocation; an
output lives to the end), and kernels are separated by barriers, so two intermediates
whose live ranges do not overlap may share bytes. Offsets are assigned greedily,
largest tensor first, at the lowest 64-byte aligned address free over its live range.
The module gets `tile.hbm_size` (bytes used), `tile.hbm_intermediate_peak` (the
intermediates' footprint) and `tile.hbm_intermediate_total` (their sum without
sharing).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, i64
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from tilecc.errors import CompileError, HbmOverflowError
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes import remarks
from tilecc.simulator.config import HardwareConfig, load_config

ALIGN = 64


def tensor_bytes(t: MemRefType) -> int:
    n = 1
    for d in t.get_shape():
        n *= d
    return n * element_size(t.element_type)


def _aligned(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


@dataclass(frozen=True)
class PlanHbmPass(ModulePass):
    name = "plan-hbm"
    target: str = "tiny"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        plan_hbm(op, load_config(self.target))


def _root(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, tile.ViewOp):
        v = v.owner.source
    return v


def live_ranges(main: func.FuncOp) -> dict[SSAValue, tuple[int, int]]:
    """[first, last] kernel launch using each intermediate allocation (outputs: to the
    end; an intermediate no launch uses: none)."""
    ranges: dict[SSAValue, tuple[int, int]] = {}
    n = 0
    for op in main.body.block.ops:
        if isinstance(op, func.CallOp):
            for a in op.arguments:
                r = _root(a)
                lo, _ = ranges.get(r, (n, n))
                ranges[r] = (lo, n)
            n += 1
        elif isinstance(op, func.ReturnOp):
            for a in op.arguments:
                r = _root(a)
                lo, _ = ranges.get(r, (n, n))
                ranges[r] = (lo, n)
    return ranges


def plan_hbm(op: ModuleOp, cfg: HardwareConfig) -> None:
    main = next((f for f in op.ops if isinstance(f, func.FuncOp) and f.sym_name.data == "main"), None)
    if main is None:
        raise CompileError("plan-hbm: the module has no func.func @main")
    allocs = [a for a in main.walk() if isinstance(a, tile.HbmAllocOp)]
    offset = 0
    temps: list[tile.HbmAllocOp] = []
    for alloc in allocs:
        if alloc.input is None and alloc.weight is None and alloc.value is None and alloc.zeroed is None:
            temps.append(alloc)
            continue
        alloc.properties["offset"] = IntegerAttr(offset, i64)
        offset += _aligned(tensor_bytes(alloc.result.type))
    base = offset
    ranges = live_ranges(main)
    placed: list[tuple[int, int, int, int]] = []  # (start, end, first, last)
    total = 0
    order = sorted(range(len(temps)), key=lambda i: (-tensor_bytes(temps[i].result.type), i))
    for i in order:
        alloc = temps[i]
        size = _aligned(tensor_bytes(alloc.result.type))
        total += size
        first, last = ranges.get(alloc.result, (-1, -1))
        busy = sorted((s, e) for s, e, f, lst in placed if not (last < f or lst < first))
        addr = base
        for s, e in busy:
            if addr + size <= s:
                break
            addr = max(addr, e)
        placed.append((addr, addr + size, first, last))
        alloc.properties["offset"] = IntegerAttr(addr, i64)
    peak = max((e for _, e, _, _ in placed), default=base) - base
    size = base + peak
    if size > cfg.hbm.capacity_bytes:
        raise HbmOverflowError(
            f"plan-hbm: the program needs {size} bytes of HBM ({base} for inputs, weights "
            f"and constants, {peak} for intermediates), the target has {cfg.hbm.capacity_bytes}"
        )
    remarks.emit("plan-hbm", "analysis", lambda: (
        f"HBM {size:,} bytes: inputs, weights and constants {base:,}; {len(temps)} intermediates "
        f"peak at {peak:,} bytes of {total:,} (sharing by liveness saves {total - peak:,}, "
        f"{sum(1 for i, a in enumerate(placed) if any(_shares(a, b) for b in placed[:i]))} reuse earlier bytes)"))
    op.attributes["tile.hbm_size"] = IntegerAttr(size, i64)
    op.attributes["tile.hbm_intermediate_peak"] = IntegerAttr(peak, i64)
    op.attributes["tile.hbm_intermediate_total"] = IntegerAttr(total, i64)


def _shares(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether two placed intermediates (start, end, first, last) overlap in bytes."""
    return a[0] < b[1] and b[0] < a[1]
