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
from tilecc.ir.buffers import align_up, buffer_bytes
from tilecc.passes import remarks
from tilecc.passes.tile.forward_activations import apply_forwarding, find_forwarding, forwarding_remark, place_slots
from tilecc.passes.tile.resident_constants import (
    MAX_FRACTION,
    Residency,
    apply_residency,
    find_resident,
    is_resident,
    residency_remark,
)
from tilecc.simulator.config import HardwareConfig, load_config

ALIGN = 64


def plan_kernel(kernel: func.FuncOp, cfg: HardwareConfig, sram_capacity: int | None = None) -> dict[str, int]:
    """Assign offsets in place (from the bottom of each memory up); return the bytes
    used per partition by memory space. Resident buffers (`resident_constants.py`) keep
    their slots and count in neither; `sram_capacity`: the bytes below the slots."""
    limits = {
        tile.SRAM: (cfg.sram.partitions, cfg.sram.bytes_per_partition if sram_capacity is None else sram_capacity),
        tile.ACC: (cfg.accumulator.partitions, cfg.accumulator.bytes_per_partition),
    }
    used = {tile.SRAM: 0, tile.ACC: 0}
    placed: dict[str, list[tuple[str, int]]] = {tile.SRAM: [], tile.ACC: []}
    for op in kernel.walk():
        if not isinstance(op, tile.AllocOp) or is_resident(op):
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
    resident: bool = False  # constant buffers resident across kernels (the -O2 pipeline's choice)
    forward: bool = False  # activation tiles kept on chip between kernels (with resident)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        plan_sram(op, load_config(self.target), resident=self.resident, forward=self.forward)


def plan_sram(module: ModuleOp, cfg: HardwareConfig, linked: bool = True, resident: bool = False,
              forward: bool | None = None) -> None:
    """Plan every kernel; with `linked` kernels each kernel's buffers move just above
    the previous kernel's, or to the bottom where they do not fit there (see the module
    docstring; off with unlinked kernels, which gives the barrier-separated layout).
    `resident`: constant buffers get slots at the top of SRAM, loaded once for the
    program (`resident_constants.py`), where every kernel still fits below them;
    `forward` (default: as `resident`; only with it) also keeps activation tiles in
    slots below those between the kernel that stores them and the kernels that load them
    (`forward_activations.py`)."""
    kernels = [f for f in module.ops if isinstance(f, func.FuncOp) and tile.KERNEL_ATTR in f.attributes]
    sram_cap = cfg.sram.bytes_per_partition - cfg.sram.bytes_per_partition % ALIGN
    if resident:
        sram_cap = _place_resident(kernels, module, cfg, sram_cap)
        if forward is None or forward:
            sram_cap = _place_forwarded(kernels, module, sram_cap)
    capacity = {tile.SRAM: sram_cap, tile.ACC: cfg.accumulator.bytes_per_partition}
    prev: dict[str, tuple[int, int]] = {}  # per memory: the previous kernel's [start, end)
    for f in kernels:
        used = plan_kernel(f, cfg, sram_cap)
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


def _place_resident(kernels: list[func.FuncOp], module: ModuleOp, cfg: HardwareConfig, cap: int) -> int:
    """Slots for the resident constant buffers at the top of SRAM where they fit (at
    most `MAX_FRACTION` of it, every kernel's other buffers below them); the bytes left
    below the slots."""
    res = find_resident(module)
    if not res.slots:
        return cap
    top = cap
    slots = res.total
    need = max((_kernel_bytes(f, res) for f in kernels), default=0)
    if slots > MAX_FRACTION * cap or need + slots > cap:
        residency_remark(res, cap, False, f"the largest kernel needs {need:,} bytes per partition besides them"
                         if need + slots > cap else f"more than {MAX_FRACTION:.0%} of SRAM")
        return cap
    apply_residency(res, top)
    residency_remark(res, cap, True)
    return top - slots


def _place_forwarded(kernels: list[func.FuncOp], module: ModuleOp, cap: int) -> int:
    """Slots for the activation tiles kept on chip between kernels
    (`forward_activations.py`) just below `cap`, where every kernel's other buffers
    still fit below them; the bytes left below the slots."""
    fw = find_forwarding(module)
    if not fw.slots:
        return cap
    moving = {i for s in fw.slots for i in s.moved()}
    need = max((_kernel_bytes(f, moving) for f in kernels), default=0)
    place_slots(fw, cap - need)
    kept = {i for s in fw.slots for i in s.moved()}
    if fw.slots and max((_kernel_bytes(f, kept) for f in kernels), default=0) + fw.extent > cap:
        remarks.emit("plan-sram", "missed", "activation tiles not kept on chip: a kernel does not fit below them")
        return cap
    apply_forwarding(fw, cap)
    forwarding_remark(fw)
    return cap - fw.extent


def _kernel_bytes(kernel: func.FuncOp, res: Residency | set[int]) -> int:
    """SRAM bytes per partition of `kernel`'s buffers that stay its own (aligned): all
    but the resident ones and those of `res` (a residency, or alloc ids)."""
    moving = res if isinstance(res, set) else {id(a) for a, _ in res.allocs}
    n = 0
    for op in kernel.walk():
        if (isinstance(op, tile.AllocOp) and tile.space_of(op.result.type) == tile.SRAM and id(op) not in moving
                and not is_resident(op)):
            t = op.result.type
            assert isinstance(t, MemRefType)
            n += align_up(buffer_bytes(t))
    return n


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
        if isinstance(op, tile.AllocOp) and tile.space_of(op.result.type) == space and not is_resident(op):
            off = op.properties["offset"]
            assert isinstance(off, IntegerAttr)
            op.properties["offset"] = IntegerAttr(off.value.data + base, i64)
