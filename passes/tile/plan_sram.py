"""plan-sram: give every on-chip buffer of a kernel a static byte offset.

Before::

    %a = tile.alloc {buffer = "lhsT"} : memref<16x16xf32, #tile.space<"sram">>
    %b = tile.alloc {buffer = "rhs"} : memref<16x16xf32, #tile.space<"sram">>

After (each buffer spans partitions 0..rows-1 at its offset within every partition)::

    %a = tile.alloc {buffer = "lhsT", offset = 0 : i64} : ...
    %b = tile.alloc {buffer = "rhs", offset = 64 : i64} : ...

Buffers of one kernel are all live for the whole kernel (single buffering), so they get
disjoint ranges, aligned to 64 bytes; SRAM and the accumulator are planned separately.
A kernel whose buffers do not fit raises `SramOverflowError` naming the buffers.

Kernels that follow each other run overlapped (`codegen/link.py` replaces the barrier
between them by waits on the memory they share), so each kernel's buffers move up, as a
block, to just above the previous kernel's (wrapping to the bottom of the memory when
they do not fit there): kernels walk around each memory like a ring, so a kernel's
buffers are disjoint from the previous kernel's and, memory allowing, from the ones a
few kernels back too, and its first loads (the next convolution's weights, say) need
not wait for those kernels' last reads: they run ahead while the kernels before compute.
Where a kernel's buffers and the previous kernel's do not fit side by side the layout is
still valid and the link orders the overlapping buffers (a remark says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, StringAttr, i64
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from tilecc.errors import SramOverflowError
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes import remarks
from tilecc.simulator.config import HardwareConfig, load_config

ALIGN = 64


def buffer_bytes(t: MemRefType) -> int:
    """Bytes per partition of an on-chip buffer (its columns x element size)."""
    rows, cols = t.get_shape()
    return cols * element_size(t.element_type)


def plan_kernel(kernel: func.FuncOp, cfg: HardwareConfig) -> dict[str, int]:
    """Assign offsets in place (from the bottom of each memory up); return the bytes
    used per partition by memory space."""
    limits = {
        tile.SRAM: (cfg.sram.partitions, cfg.sram.bytes_per_partition),
        tile.ACC: (cfg.accumulator.partitions, cfg.accumulator.bytes_per_partition),
    }
    used = {tile.SRAM: 0, tile.ACC: 0}
    placed: dict[str, list[tuple[str, int]]] = {tile.SRAM: [], tile.ACC: []}
    for op in kernel.walk():
        if not isinstance(op, tile.AllocOp):
            continue
        t = op.result.type
        assert isinstance(t, MemRefType)
        space = tile.space_of(t)
        parts, capacity = limits[space]
        rows = t.get_shape()[0]
        name = op.buffer.data
        if rows > parts:
            raise SramOverflowError(
                f"kernel {kernel.sym_name.data}: buffer '{name}' has {rows} rows but {space} "
                f"has {parts} partitions", kernel.sym_name.data,
            )
        size = buffer_bytes(t)
        offset = used[space]
        op.properties["offset"] = IntegerAttr(offset, i64)
        placed[space].append((name, size))
        used[space] = offset + -(-size // ALIGN) * ALIGN
        if offset + size > capacity:
            listing = ", ".join(f"{n} ({s} B)" for n, s in placed[space])
            raise SramOverflowError(
                f"kernel {kernel.sym_name.data}: {space} buffers need {offset + size} bytes per "
                f"partition, the target has {capacity}: {listing}", kernel.sym_name.data,
            )
    remarks.emit("plan-sram", "analysis", lambda: (
        f"kernel {kernel.sym_name.data}: " + ", ".join(
            f"{space} {used[space]:,} of {limits[space][1]:,} bytes per partition "
            f"({used[space] / limits[space][1]:.0%}, {len(placed[space])} buffers)" for space in used)),
        _loc(kernel))
    return used


def _loc(op: Operation) -> str:
    loc = op.attributes.get("tilecc.loc")
    return loc.data if isinstance(loc, StringAttr) else ""  # set by g.set_loc as a string


@dataclass(frozen=True)
class PlanSramPass(ModulePass):
    name = "plan-sram"
    target: str = "tiny"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        plan_sram(op, load_config(self.target))


def plan_sram(module: ModuleOp, cfg: HardwareConfig, linked: bool = True) -> None:
    """Plan every kernel; with `linked` kernels each kernel's buffers move just above
    the previous kernel's, or to the bottom where they do not fit there (see the module
    docstring; off with unlinked kernels, which gives the barrier-separated layout)."""
    kernels = [f for f in module.ops if isinstance(f, func.FuncOp) and tile.KERNEL_ATTR in f.attributes]
    capacity = {tile.SRAM: cfg.sram.bytes_per_partition, tile.ACC: cfg.accumulator.bytes_per_partition}
    prev: dict[str, tuple[int, int]] = {}  # per memory: the previous kernel's [start, end)
    for f in kernels:
        used = plan_kernel(f, cfg)
        if not linked:
            continue
        for space, cap in capacity.items():
            cap -= cap % ALIGN
            size = -(-used[space] // ALIGN) * ALIGN
            lo, hi = prev.get(space, (0, 0))
            base = _ring_base(lo, hi, size, cap)
            if base is None:
                base = 0
                remarks.emit("plan-sram", "missed", (
                    f"kernel {f.sym_name.data}: its {space} buffers ({used[space]:,} bytes per "
                    f"partition) and the previous kernel's ({hi - lo:,}) do not fit side by "
                    f"side in {cap:,}: the link orders the bytes they share"), _loc(f))
            _shift(f, space, base)
            prev[space] = (base, base + size)


def _ring_base(lo: int, hi: int, size: int, cap: int) -> int | None:
    """Where `size` bytes go next to the previous kernel's [lo, hi) in [0, cap): just
    above it, else at the bottom; None where neither is disjoint from it."""
    if hi + size <= cap:
        return hi
    if size <= lo:
        return 0
    return None


def _shift(kernel: func.FuncOp, space: str, base: int) -> None:
    """Move the buffers of `space` in `kernel` up by `base` bytes."""
    if not base:
        return
    for op in kernel.walk():
        if isinstance(op, tile.AllocOp) and tile.space_of(op.result.type) == space:
            off = op.properties["offset"]
            assert isinstance(off, IntegerAttr)
            op.properties["offset"] = IntegerAttr(off.value.data + base, i64)
