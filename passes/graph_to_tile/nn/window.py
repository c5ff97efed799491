"""Window ops on the vector engine: depthwise convolution and pooling, one kernel shape.

Channels on partitions, output positions along the free dimension: per band of output
rows, one slab per phase image, one vector op per tap into an fp32 accumulator, then
the epilogue (compaction to NCHW rows, fused steps, store). The op-specific parts are
callbacks (`WindowOps`):

    graph.max_pool2d %x 3x3 s2 p1  ->  k3_max_pool2d_pad(%x, %xq)   (phase images)
    k4_max_pool2d(%xq, ..., %out):
      scf.for %n, %c0 (channel tiles), %band:
        tile.load %xq[n, c0, phase, p0] -> %slab_p            (per phase)
        tile.binary "max" %slab_0[off0], %slab_1[off1] -> %acc; "max" %acc, %slab_p[off] -> %acc ...
        tile.unary "copy" %acc -> %out_buf; tile.store %out_buf -> %out[n, c0, 0, oh0 * OW]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import TensorTooLargeError
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.common import (
    HbmKernel,
    band_loop,
    lin,
    partition_bytes,
    sram_budget,
    sub,
    tiles,
)
from tilecc.passes.graph_to_tile.nn.epilogue import Epilogue, Step, epilogue_bytes
from tilecc.passes.graph_to_tile.nn.geometry import Geometry, pick_band
from tilecc.passes.graph_to_tile.nn.state import PadInfo

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext

Bufs = dict[str, SSAValue]  # a window kernel's op-specific buffers (and values) by name
# tap_op(kb, tap, slab window, accumulator, rows, cols, bufs, multiplier index)
TapOp = Callable[[KernelBuilder, int, SSAValue, SSAValue, SSAValue, SSAValue, Bufs, SSAValue], None]
# compact_fn(kb, kernel, bufs, c0, multiplier index) -> compact(src, dst, rows, cols[, r])
CompactFn = Callable[[KernelBuilder, HbmKernel, Bufs, SSAValue, SSAValue], Callable[..., None]]


def _no_setup(kb: KernelBuilder, k: HbmKernel, c0: SSAValue, c: SSAValue, TC: int, bufs: Bufs) -> None:
    return None


def _no_bufs(kb: KernelBuilder, TC: int, Lmax: int) -> Bufs:
    return {}


def _no_bytes(rb: int) -> int:
    return 0


@dataclass
class WindowIO:
    """What a window kernel reads and writes: the phase images `src`, the output `out`
    (natural, or `pad`'s padded tensor), the fused epilogue `steps`, the depthwise
    channel multiplier `mult` and further HBM arguments (weights, divisors)."""

    src: SSAValue
    out: SSAValue
    elem: Attribute
    out_elem: Attribute
    steps: list[Step] = field(default_factory=list)
    mult: int = 1
    extra_args: list[SSAValue] = field(default_factory=list)
    pad: PadInfo | None = None


@dataclass
class WindowOps:
    """The op-specific parts of a window kernel: `tap_op` per tap, `compact_fn` for the
    epilogue's compaction, `per_tile` once per channel tile (loading weights),
    `extra_bufs` and their SRAM bytes per band of rb rows (`extra_bytes`); `row_aware`:
    compact takes the band's row `r` (per-row divisors)."""

    tap_op: TapOp
    compact_fn: CompactFn
    per_tile: Callable[[KernelBuilder, HbmKernel, SSAValue, SSAValue, int, Bufs], None] = _no_setup
    extra_bufs: Callable[[KernelBuilder, int, int], Bufs] = _no_bufs
    extra_bytes: Callable[[int], int] = _no_bytes
    row_aware: bool = False


def window_kernel(lw: LoweringContext, loc: str, what: str, geo: Geometry, io: WindowIO, ops: WindowOps) -> None:
    """A vector-engine window op: channels (of the input) on partitions; for each band,
    per phase slab, `tap_op` per tap into an fp32 accumulator, then the epilogue."""
    src, out, steps, mult, elem, out_elem, pad = io.src, io.out, io.steps, io.mult, io.elem, io.out_elem, io.pad
    extra_args, per_tile, tap_op, compact_fn = io.extra_args, ops.per_tile, ops.tap_op, ops.compact_fn
    extra_bufs, extra_bytes, row_aware = ops.extra_bufs, ops.extra_bytes, ops.row_aware
    N, OH, OW, Wq = geo.N, geo.OH, geo.OW, geo.Wq
    Cp = geo.C  # partition channels (groups for depthwise)
    TC = min(lw.P, Cp)
    isz, osz = element_size(elem), element_size(out_elem)
    budget = sram_budget(lw)

    def fits(rb: int) -> bool:
        need = sum(partition_bytes(geo.slab(rb, p), isz) for p in range(geo.nph)) + partition_bytes(geo.lp(rb), 4)
        need += epilogue_bytes([st.kind for st in steps], rb * OW, osz, 1, pad.Wp if pad is not None else None, OW)
        need += extra_bytes(rb)
        return need <= budget

    RB = pick_band(geo, fits)
    if not RB:
        raise TensorTooLargeError(f"{what} at {loc}: one output row of {OW} positions does not fit SRAM")
    single = OH // RB == 1
    epi = Epilogue(lw, steps, out, N, Cp * mult, OH, OW, mult, pad=pad, loc=loc, rb=RB)
    k = HbmKernel(lw, what, loc, [src, *extra_args, *epi.hbm_args()])
    kb = k.kb
    sa = k.arg(src)
    Lmax = geo.lp(RB)
    slabs = [kb.alloc([TC, geo.slab(RB, p)], elem, tile.SRAM, f"slab{p}") for p in range(geo.nph)]
    accb = kb.alloc([TC, Lmax], f32, tile.SRAM, "acc")
    epi.alloc(kb, TC, RB * OW, out_elem)
    epi.init(k)
    bufs = extra_bufs(kb, TC, Lmax)
    with kb.loop(N) as n, tiles(kb, Cp, TC) as (_, c0, c):
        per_tile(kb, k, c0, c, TC, bufs)
        if pad is not None and not single:  # a single band's store covers the ring
            with kb.loop(mult) as j:
                epi.emit_ring(k, n, c0, j, c)

        def band(oh0: SSAValue, rb: int) -> None:
            lp = geo.lp(rb)
            p0 = lin(kb, 0, (Wq, oh0))
            for p in range(geo.nph):
                L = geo.slab(rb, p)
                kb.add(tile.LoadOp(sa, [n, c0, kb.const(p), p0], sub(kb, slabs[p], 0, 0, [TC, L]),
                                   c, kb.const(L), 1, 3))
            accv = sub(kb, accb, 0, 0, [TC, lp])
            with kb.loop(mult) as j:  # depthwise channel multiplier (1 for pooling)
                for t, (_, _, p, off) in enumerate(geo.taps):
                    tap_op(kb, t, sub(kb, slabs[p], 0, off, [TC, lp]), accv, c, kb.const(lp), bufs, j)
                bufs["oh0"] = oh0
                epi.emit(k, accv, c, n, c0, j, oh0, rb, Wq, compact_fn(kb, k, bufs, c0, j), row_aware,
                         first=single, last=single)

        band_loop(kb, OH, RB, band)
    k.launch()


