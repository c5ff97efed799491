"""The lowering context of `lower-graph-to-tile`: what every op family reads and builds.

A `LoweringContext` is the typed state of one conversion of a graph function into tile
kernels: the target config and options, the HBM tensors already built for graph values
(`values`) or folded to immediates (`scalars`), the kernels and `@main` ops emitted so
far, the layouts consumers offered their producers, and the compile session's caches.
Op families (`registry.py` lists them) receive it with the op and its source location
and use its public methods to view, copy and allocate HBM tensors and to launch
kernels; they keep their own state in declared fields (`nn` for the CNN family).

    lw.values[op.results[0]] = lw.view(lw.materialise(op.operands[0]), (R, C))
    kb = KernelBuilder(lw.kernel_name("relu"), [...], loc); ...; lw.launch(kb, args)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import MemRefType, NoneAttr, StridedLayoutAttr
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.nn.state import NnState
from tilecc.passes.graph_to_tile.shapes import (
    IndexMap,
    Operand,
    dense_attr,
    elem_of,
    is_memref,
    padded_strides,
    reshape_strides,
    shape_of,
)
from tilecc.passes.graph_to_tile.sharing import KernelMemo
from tilecc.passes.session import CompileSession
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

class DslKernelSource(Protocol):
    """What `graph.dsl_call` needs of the tile-DSL front end (frontend/dsl/graph_call.py)."""

    def params(self, op: Operation) -> list[tuple[str, str, Attribute]]: ...

    def build(
        self, op: Operation, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig
    ) -> tuple[func.FuncOp, list[tuple[np.ndarray, Attribute]]]: ...


# problem -> schedule of an -O2 matmul kernel (autotuning, a forced schedule); its second
# argument is the graph program whose cycles judge a candidate (None: the matmul alone)
MatmulPolicy = Callable[..., Any]

# the (dense) shape of a permute's buffer and the element strides a producer writes it with
LayoutRequest = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(eq=False)
class LoweringContext:
    cfg: HardwareConfig
    opt_level: int = 2  # 0: baseline kernels (fixed tiles, single buffering)
    # problem -> schedule for the -O2 matmul kernels (autotuning), else the cost model's
    matmul_policy: MatmulPolicy | None = None
    session: CompileSession = field(default_factory=CompileSession)
    kernels: list[func.FuncOp] = field(default_factory=list[func.FuncOp])
    main_ops: list[Operation] = field(default_factory=list[Operation])
    values: dict[SSAValue, SSAValue] = field(default_factory=dict[SSAValue, SSAValue])  # graph value -> HBM tensor
    scalars: dict[SSAValue, float] = field(default_factory=dict[SSAValue, float])  # graph value -> immediate
    # store-side layout absorption: a result whose only user is a permute keeping the
    # innermost dim may be written straight into the permute's (dense) buffer through a
    # strided view (`output_buffer`); `absorbed` records where it was
    layout_requests: dict[SSAValue, LayoutRequest] = field(default_factory=dict[SSAValue, LayoutRequest])
    absorbed: dict[SSAValue, SSAValue] = field(default_factory=dict[SSAValue, SSAValue])
    lowering: Operation | None = None  # the graph op being lowered (for remarks and locations)
    # the tile-DSL front end for graph.dsl_call (handed in by the driver; None: not available)
    dsl_kernels: DslKernelSource | None = None
    nn: NnState = field(default_factory=NnState)  # the CNN family's padded layouts and constants
    # kernels shared between identical launches (sharing.py; `enabled` False: share-kernels off)
    memo: KernelMemo = field(default_factory=KernelMemo)
    # (problem, judge program, signature) -> schedule of the fused MLP kernel (autotuning,
    # passes/graph_to_tile/mlp/tuning.py), else the cost model's
    mlp_policy: Callable[..., Any] | None = None

    @property
    def P(self) -> int:
        """SRAM partitions: the most rows of a tile."""
        return self.cfg.sram.partitions

    # ---- @main helpers -------------------------------------------------------------
    def emit(self, op: Operation) -> Operation:
        self.main_ops.append(op)
        if self.lowering is not None and g.LOC_ATTR not in op.attributes:
            g.set_loc(op, g.source_loc(self.lowering))
        return op

    def hbm(self, shape: Sequence[int], elem: Attribute, **kw: Any) -> SSAValue:
        """A new HBM tensor in @main (`kw`: tile.hbm_alloc's input / weight / value / zeroed)."""
        return self.emit(tile.HbmAllocOp(MemRefType(elem, list(shape)), **kw)).results[0]

    def view(self, v: SSAValue, shape: Sequence[int]) -> SSAValue:
        """`v` reshaped: a free view where its strides allow (always for a dense
        tensor), else a dense copy viewed."""
        shape = list(shape)
        if list(shape_of(v.type)) == shape:
            return v
        strides, offset = self.layout(v)
        new = reshape_strides(shape_of(v.type), strides, shape)
        if new is None:
            return self.view(self.dense(v), shape)
        return self.strided(v, shape, new, offset)

    def strided(self, v: SSAValue, shape: Sequence[int], strides: Sequence[int], offset: int) -> SSAValue:
        """A view of `v`'s root with element `strides` and `offset` (tile.view). The
        result has no layout attribute only when it is the whole root, row-major (a
        reshape): a memref without a layout is always dense."""
        shape, strides = [int(x) for x in shape], [int(x) for x in strides]
        root = v  # views chain back to the allocation: view it directly
        while isinstance(root.owner, tile.ViewOp):
            root = root.owner.source
        whole = math.prod(shape) == math.prod(shape_of(root.type))
        if whole and strides == list(tile.row_major(shape)) and offset == 0:
            layout: Attribute = NoneAttr()
        else:
            layout = StridedLayoutAttr(strides, offset)
        t = MemRefType(elem_of(v.type), shape, layout)
        if t == v.type:
            return v
        return self.emit(tile.ViewOp(root, t)).results[0]

    def layout(self, v: SSAValue) -> tuple[tuple[int, ...], int]:
        """(element strides, offset) of HBM value `v` relative to its root allocation."""
        t = v.type
        if not is_memref(t):
            raise CompileError(f"lower-graph-to-tile: {t} is not an HBM tensor")
        if isinstance(t.layout, StridedLayoutAttr):
            return tile.layout_of(t)
        owner = v.owner
        offset = self.layout(owner.source)[1] if isinstance(owner, tile.ViewOp) else 0
        return tile.row_major(t.get_shape()), offset

    def is_dense(self, v: SSAValue) -> bool:
        strides, _ = self.layout(v)
        shape = shape_of(v.type)
        return 0 in shape or all(n == 1 or s == r for n, s, r in zip(shape, strides, tile.row_major(shape)))

    def dense(self, v: SSAValue) -> SSAValue:
        """`v` itself if its elements are dense and row-major, else a copy that is (the
        copy's loads walk `v`'s strides; no vector work)."""
        if self.is_dense(v):
            return v
        from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

        shape = shape_of(v.type)
        full = self.out_shape2(shape)
        strides, offset = self.layout(v)
        src = self.strided(v, full, padded_strides(strides, len(full)), offset)
        ek = ElementwiseKernel(self, "copy", "", full)
        ek.output(ek.leaf_hbm(src, list(range(len(full)))), elem_of(v.type))
        return self.view(ek.build()[0], shape)

    def launch(self, kb: KernelBuilder, args: Sequence[SSAValue]) -> None:
        if not kb.loc and self.lowering is not None:  # a helper kernel (a dense copy): its op's place
            kb.loc = g.source_loc(self.lowering)
        self.kernels.append(kb.finish())
        remarks.emit("lower-graph-to-tile", "passed", lambda: _kernel_remark(kb.func, self.lowering), kb.loc)
        self.emit(func.CallOp(kb.func.sym_name.data, list(args), []))

    def output_buffer(self, res: SSAValue, elem: Attribute | None = None) -> SSAValue:
        """The HBM tensor a kernel writes graph value `res` into: a fresh one, or a
        strided view of its consumer permute's buffer (the permute is then free)."""
        req = self.layout_requests.pop(res, None)
        if req is None:
            return self.hbm(shape_of(res.type), elem if elem is not None else elem_of(res.type))
        out_shape, strides = req
        buf = self.hbm(out_shape, elem_of(res.type))
        self.absorbed[res] = buf
        return self.strided(buf, shape_of(res.type), strides, 0)

    def request_layout(self, op: Operation) -> None:
        """Offer `op`'s result the layout of its only user, a permute that keeps the
        innermost dim (its rows stay contiguous), also through single-use reshapes
        before it whose views that layout allows (sdpa over grouped heads
        ``[b, groups, n, L, D]``, reshaped to ``[b, heads, L, D]``, then permuted)."""
        if len(op.results) != 1 or not op.results[0].has_one_use():
            return
        res = op.results[0]
        chain = [res]
        user = res.get_user_of_unique_use()
        while isinstance(user, g.ReshapeOp) and user.results[0].has_one_use():
            chain.append(user.results[0])
            user = user.results[0].get_user_of_unique_use()
        if not isinstance(user, g.PermuteOp):
            return
        perm = [int(p) for p in user.permutation]
        if len(perm) < 2 or perm[-1] != len(perm) - 1:
            return
        out_shape = shape_of(user.results[0].type)
        row = tile.row_major(out_shape)
        inv = [0] * len(perm)
        for i, p in enumerate(perm):
            inv[p] = i
        strides: Sequence[int] | None = tuple(row[inv[d]] for d in range(len(perm)))
        for later, earlier in zip(chain[::-1], chain[-2::-1]):  # back through the reshapes
            strides = reshape_strides(shape_of(later.type), strides, shape_of(earlier.type))
            if strides is None:
                return
        assert strides is not None
        self.layout_requests[res] = (out_shape, tuple(strides))

    def kernel_name(self, what: str) -> str:
        """The name of the next kernel: ``k<index>_<what>``."""
        return f"k{len(self.kernels)}_{what}"

    def materialise(self, v: SSAValue) -> SSAValue:
        """The HBM tensor of graph value `v` (an immediate becomes a constant tensor)."""
        if v in self.values:
            return self.values[v]
        if v not in self.scalars:
            what = v.owner.name if isinstance(v.owner, Operation) else "a block argument"
            raise CompileError(
                f"lower-graph-to-tile: the value of {what} (type {v.type}) is used before it is lowered"
            )
        shape, elem = shape_of(v.type), elem_of(v.type)
        data = np.full(shape, self.scalars[v], dtype=np.float32)
        out = self.hbm(shape, elem, value=dense_attr(data, elem, shape))
        self.values[v] = out
        return out

    # ---- elementwise family --------------------------------------------------------
    def aligned(self, v: SSAValue, out_shape: Sequence[int]) -> Operand:
        """The operand viewed at the output's rank, with its broadcast index map."""
        src = self.materialise(v)
        shape = shape_of(src.type)
        rank = len(out_shape)
        full = (1,) * (rank - len(shape)) + shape
        src = self.view(src, full)
        imap: IndexMap = [d if full[d] == out_shape[d] else None for d in range(rank)]
        strides, offset = self.layout(src)
        if any(s == 0 and full[d] > 1 for d, s in enumerate(strides)):
            # an expanded view (stride 0): the operand is constant along that dim, so it
            # is a broadcast there (a column operand, loaded once), not a tile read by a
            # DMA that fetches one element per descriptor
            flat = [1 if s == 0 else n for n, s in zip(full, strides)]
            src = self.strided(src, flat, list(strides), offset)
            imap = [None if strides[d] == 0 else m for d, m in enumerate(imap)]
        return Operand(src, imap)

    def out_shape2(self, shape: Sequence[int]) -> tuple[int, ...]:
        return (1,) * (2 - len(shape)) + tuple(shape) if len(shape) < 2 else tuple(shape)

    def col_tile(self, cols: int, n_bufs: int) -> int:
        budget = self.cfg.sram.bytes_per_partition // (2 * 4 * max(n_bufs, 1))
        return max(1, min(cols, budget, 2048))

    def outer_loops(
        self, kb: KernelBuilder, extents: Sequence[int], ivs: list[SSAValue], body: Callable[[], None]
    ) -> None:
        """`body` inside one loop per extent (their induction variables appended to `ivs`)."""
        if not extents:
            body()
            return
        with kb.loop(extents[0]) as i:
            ivs.append(i)
            self.outer_loops(kb, extents[1:], ivs, body)

    def finish_elementwise(self, ek: ElementwiseKernel, res: SSAValue, ref: int) -> None:
        """`res` = value `ref` of `ek`: a scalar when it folded to a constant, else the
        kernel's output."""
        value = ek.constant(ref)
        if value is not None:
            self.scalars[res] = value
            return
        ek.output(ref, elem_of(res.type), value=res)
        self.values[res] = ek.build()[0]

    def aligned_batch(self, v: SSAValue, batch: Sequence[int], mat: tuple[int, int]) -> Operand:
        src = self.materialise(v)
        shape = shape_of(src.type)
        full = (1,) * (len(batch) + 2 - len(shape)) + shape
        src = self.view(src, full)
        imap: IndexMap = [d if full[d] == batch[d] else None for d in range(len(batch))]
        return Operand(src, imap + [len(batch), len(batch) + 1])

    # ---- row-wise: softmax, layer norm --------------------------------------------
    def rows_view(
        self, v: SSAValue | None, loc: str, what: str, row_ndim: int = 1, src: SSAValue | None = None
    ) -> tuple[SSAValue, int, int]:
        """`v` as a 2-D HBM view: rows = the leading dims, a row = the last `row_ndim` dims."""
        if src is None:
            if v is None:
                raise CompileError(f"{what} at {loc}: rows_view needs a graph value or an HBM tensor")
            src = self.materialise(v)
        shape = shape_of(src.type)
        split = max(len(shape) - row_ndim, 0)
        C = int(np.prod(shape[split:])) if shape else 1
        R = int(np.prod(shape[:split])) if split else 1
        if 4 * C * 6 > self.cfg.sram.bytes_per_partition:
            raise TensorTooLargeError(
                f"{what} at {loc}: a row of {C} elements does not fit one SRAM partition "
                f"({self.cfg.sram.bytes_per_partition} bytes) with its working buffers"
            )
        return self.view(src, (R, C)), R, C

    def rowwise_kernel(
        self, kind: str, loc: str, x: SSAValue, R: int, C: int, elem: Attribute,
        extra: Sequence[SSAValue] = (), eps: float = 0.0,
    ) -> SSAValue:
        """A row-wise op on the rows of 2-D HBM view `x` ([R, C]); `extra` are [1, C]
        operands broadcast over the rows (a layer norm's weight and bias)."""
        from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

        ek = ElementwiseKernel(self, kind, loc, (R, C))
        args = [ek.leaf_hbm(x, [0, 1])] + [ek.leaf_hbm(e, [None, 1]) for e in extra]
        ek.output(ek.rowwise(kind, args, elem, eps), elem)
        return ek.build()[0]

    def permuted(self, src: SSAValue, perm: list[int], loc: str) -> SSAValue:
        """A transposed copy of an HBM tensor: out[i] = src[perm-mapped i]."""
        shape = shape_of(src.type)
        out_shape = [shape[p] for p in perm]
        if len(out_shape) < 2:
            return self.view(src, out_shape)

        from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

        ek = ElementwiseKernel(self, "permute", loc, out_shape)
        ek.output(ek.leaf_hbm(src, [int(p) for p in perm]), elem_of(src.type))
        return ek.build()[0]



def _kernel_remark(kernel: func.FuncOp, op: Operation | None) -> str:
    """``kernel k3_fused_matmul for graph.fused "matmul" (matmul, add, gelu): 3 loops, 42 tile ops``."""
    from tilecc.ir.graph_fusion import FusedOp

    what = "" if op is None else op.name
    if isinstance(op, FusedOp):
        inner = [o.name.removeprefix("graph.") for o in op.body.block.ops
                 if not isinstance(o, (g.ReshapeOp, g.ConstantOp)) and o.name != "graph.yield"]
        what = f'graph.fused "{op.kind.data}" ({", ".join(inner)})'
    loops = tiles = 0
    for o in kernel.walk():
        loops += isinstance(o, scf.ForOp)
        tiles += o.name.startswith("tile.")
    return f"kernel {kernel.sym_name.data} for {what}: {loops} loops, {tiles} tile ops"
