"""The elementwise kernel: a DAG of elementwise ops over one iteration space, in one kernel.

Every elementwise graph op (alone, at -O0 and -O2) and every fused elementwise group
(-O2, `graph.fused "elementwise"`) lowers through `ElementwiseKernel`: leaves (HBM
tensors with a broadcast index map, or immediates), nodes (vector steps on tiles), and
outputs (nodes stored to new HBM tensors). Intermediates stay in SRAM::

    %y = graph.fused "elementwise" (%x, %b) {             y = gelu(x + b) * 0.5
      ...
    }
      -> per [TR x TC] tile:  load x, load b (row-broadcast) -> add -> gelu -> mul imm
                              -> store y      (one kernel, x and y touch HBM once)

Tiling (`cost.choose_tiles`, an analytical cost model of the config): rows map to
partitions (a tensor with fewer rows than partitions has its last dimension split so
tiles fill them), columns are chosen with the multi-buffering depth D (2-4 sets of the
loaded and stored buffers, within SRAM) by estimating the pipelined kernel time:
tiles x max(vector time, DMA time: fixed latency spread over the queues, bytes over
the bandwidth) plus the exposed first load and last store. The innermost loop with
more than one tile is unrolled D times, one buffer set per copy, so the loads of the
next tiles and the stores of the previous ones overlap the vector work on the current
one; DMA transfers rotate over all queues. A leaf that does not vary along that loop
(a bias row, a per-row column) is loaded once per iteration of the loop it varies in.
A leaf broadcast along columns becomes a ``[TR x 1]`` column operand of the vector
ops (one element per partition) instead of a broadcast tile.

Temporaries are assigned buffers by liveness within the tile body (an op may write
over an input that dies there; `dag.assign_temps`); buffers a store reads get one per
set (`tile_program.TileProgram`). Nodes compute in fp32 and round to their own element
type, as eager does op by op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from xdsl.ir import Attribute, Operation, SSAValue

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir import graph as g
from tilecc.ir.dtypes import element_size
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.elementwise.cost import choose_tiles, col_candidates, vector_steps
from tilecc.passes.graph_to_tile.elementwise.dag import (
    ALIGN,
    CLASS_RANK,
    FOLD_BINARY,
    FOLD_UNARY,
    ROWWISE,
    Imm,
    Leaf,
    Node,
    Value,
    leaf_elem,
    row_scratch,
    temp_demand,
    value_class,
    value_elem,
)
from tilecc.passes.graph_to_tile.elementwise.tile_program import TileProgram
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.shapes import IndexMap, Operand, collapse, elem_of, reshape_strides, shape_of
from tilecc.passes.vector_fns import elementwise_fn

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


class ElementwiseKernel:
    """Build with `leaf`, `imm`, `unary`, `binary`, `where`, `output`; then `build()`."""

    def __init__(self, lw: LoweringContext, what: str, loc: str, out_shape: Sequence[int]) -> None:
        self.lw, self.what, self.loc = lw, what, loc
        self.shape = tuple(int(d) for d in out_shape)
        self.values: list[Value] = []
        self.outputs: list[tuple[int, Attribute]] = []
        self.out_values: list[SSAValue | None] = []

    # ---- building the DAG --------------------------------------------------------
    def leaf(self, v: SSAValue) -> int:
        """An operand: graph value `v` (lowered), broadcast to the iteration space."""
        if v in self.lw.scalars:
            return self.imm(self.lw.scalars[v])
        op = self.lw.aligned(v, self.shape if len(self.shape) >= 2 else self.lw.out_shape2(self.shape))
        return self.leaf_hbm(op.value, op.imap)

    def given_leaf(self, elem: Attribute) -> int:
        """A tile of the whole iteration space that is not loaded: `TileProgram.compute`
        is given its buffer (a matmul's accumulator tile)."""
        self.values.append(Leaf(None, list(range(len(self.shape))), "tile", elem))  # type: ignore[arg-type]
        return len(self.values) - 1

    def leaf_hbm(self, value: SSAValue, imap: IndexMap) -> int:
        """An operand: HBM tensor `value` at the iteration space's rank, with its index map
        (one leaf per tensor and map)."""
        for i, x in enumerate(self.values):
            if isinstance(x, Leaf) and x.value is value and x.imap == imap:
                return i
        self.values.append(Leaf(value, list(imap)))
        return len(self.values) - 1

    def imm(self, value: float) -> int:
        """An immediate."""
        self.values.append(Imm(float(value)))
        return len(self.values) - 1

    def unary(self, fn: str, a: int, elem: Attribute) -> int:
        """``fn(a)`` rounded to `elem` (folded when `a` is an immediate)."""
        x = self.values[a]
        if isinstance(x, Imm):
            if fn not in FOLD_UNARY:
                raise CompileError(f"{self.what} at {self.loc}: {fn} of a constant is not folded")
            return self.imm(float(np.float32(FOLD_UNARY[fn](np.float32(x.value)))))
        self.values.append(Node("unary", fn, [a], elem))
        return len(self.values) - 1

    def binary(self, fn: str, a: int, b: int, elem: Attribute) -> int:
        """``fn(a, b)`` rounded to `elem` (folded when both are immediates)."""
        x, y = self.values[a], self.values[b]
        if isinstance(x, Imm) and isinstance(y, Imm) and fn in FOLD_BINARY:
            return self.imm(float(np.float32(FOLD_BINARY[fn](np.float32(x.value), np.float32(y.value)))))
        self.values.append(Node("binary", fn, [a, b], elem))
        return len(self.values) - 1

    def where(self, c: int, x: int, y: int, elem: Attribute) -> int:
        """``x where c else y`` (a constant condition picks one)."""
        cv = self.values[c]
        if isinstance(cv, Imm):
            picked = x if cv.value != 0.0 else y
            return self.unary("copy", picked, elem) if not isinstance(self.values[picked], Imm) else picked
        self.values.append(Node("where", "", [c, x, y], elem))
        return len(self.values) - 1

    def rowwise(self, kind: str, args: list[int], elem: Attribute, eps: float = 0.0) -> int:
        """A row-wise op over the last dim: layer_norm (args x, weight, bias), rms_norm
        (x, weight), softmax or
        log_softmax (x). Tiles then hold whole rows."""
        assert kind in ROWWISE
        self.values.append(Node(kind, "", list(args), elem, eps=float(eps)))
        return len(self.values) - 1

    @property
    def full_rows(self) -> bool:
        """Tiles hold whole rows (a row-wise node reduces along the last dim)."""
        return any(isinstance(v, Node) and v.kind in ROWWISE for v in self.values)

    def leaf_at(self, v: SSAValue, op_shape: Sequence[int]) -> int:
        """Graph value `v` as an operand of an op of shape `op_shape`, which is the
        kernel's space up to unit dims (a fused group)."""
        if v in self.lw.scalars:
            return self.imm(self.lw.scalars[v])
        if tuple(d for d in op_shape if d != 1) != tuple(d for d in self.shape if d != 1):
            # an op after a reshape in the group: `v` is a whole tensor, viewed here, or
            # a row vector along a last dim the reshape kept
            o = self.lw.aligned(v, tuple(op_shape))
            if op_shape and op_shape[-1] == self.shape[-1] and all(m is None for m in o.imap[:-1]) \
                    and o.imap[-1] is not None:
                row = self.lw.view(self.lw.materialise(v), [1] * (len(self.shape) - 1) + [self.shape[-1]])
                return self.leaf_hbm(row, [None] * (len(self.shape) - 1) + [len(self.shape) - 1])
            n = math.prod(shape_of(self.lw.materialise(v).type))
            if n != math.prod(self.shape):
                raise CompileError(f"{self.what} at {self.loc}: a broadcast operand across a reshape")
            view = self.lw.view(self.lw.materialise(v), self.shape)
            return self.leaf_hbm(view, list(range(len(self.shape))))
        o = self.lw.aligned(v, tuple(op_shape))
        keep = [d for d, n in enumerate(op_shape) if n != 1]
        o = self._drop(o, keep)
        pad = len(self.shape) - len(keep)
        if pad:
            shape = shape_of(o.value.type)
            strides, offset = self.lw.layout(o.value)
            o = Operand(self.lw.strided(o.value, [1] * pad + list(shape), [0] * pad + list(strides), offset),
                         [None] * pad + [m if m is None else m + pad for m in o.imap])
        return self.leaf_hbm(o.value, o.imap)

    def leaf_of(self, i: int) -> Leaf:
        """Value `i`, a leaf."""
        leaf = self.values[i]
        assert isinstance(leaf, Leaf), f"value {i} of {self.what} is not a leaf"
        return leaf

    def constant(self, ref: int) -> float | None:
        """The value of `ref` when it folded to a compile-time constant."""
        v = self.values[ref]
        return v.value if isinstance(v, Imm) else None

    def output(self, ref: int, elem: Attribute, value: SSAValue | None = None) -> None:
        """Store value `ref` as an output of element type `elem` (a leaf of that type is
        stored straight from its load buffer: a copy without vector work). `value` is
        the graph value it computes, whose buffer `GraphToTile.output_buffer` picks."""
        v = self.values[ref]
        if isinstance(v, Imm):
            raise CompileError(f"{self.what} at {self.loc}: a constant output has no elementwise kernel")
        if value_elem(v) != elem or any(r == ref for r, _ in self.outputs):
            ref = self.unary("copy", ref, elem)
        self.outputs.append((ref, elem))
        self.out_values.append(value)

    # ---- lowering ----------------------------------------------------------------
    def build(self) -> list[SSAValue]:
        """Emit and launch the kernel; the HBM tensors of the outputs (at `shape`)."""
        lw = self.lw
        full = self.shape if len(self.shape) >= 2 else lw.out_shape2(self.shape)
        outs = [self.out_buffer(value, elem, full) for (_, elem), value in zip(self.outputs, self.out_values)]
        leaves = [i for i, v in enumerate(self.values) if isinstance(v, Leaf)]
        operands = [Operand(self.values[i].value, self.values[i].imap) for i in leaves]  # type: ignore[union-attr]
        operands += [Operand(lw.view(o, full), list(range(len(full)))) for o in outs]
        kshape, operands = self._kernel_space(full, operands)
        for i, o in zip(leaves, operands):
            leaf = self.values[i]
            assert isinstance(leaf, Leaf)
            leaf.value, leaf.imap = o.value, o.imap
        out_ops = operands[len(leaves):]
        self.classify()
        plan = self._plan(kshape)
        self._emit(kshape, plan, leaves, out_ops)
        return outs

    def out_buffer(self, value: SSAValue | None, elem: Attribute, full: Sequence[int]) -> SSAValue:
        """An output's HBM tensor at the iteration space's shape: the buffer the graph
        value asks for (`output_buffer`) when it reshapes to the space for free."""
        lw = self.lw
        if value is not None and value in lw.layout_requests:
            _, strides = lw.layout_requests[value]
            if reshape_strides(shape_of(value.type), strides, self.shape) is not None:
                return lw.view(lw.output_buffer(value, elem), self.shape)
        return lw.hbm(self.shape, elem)

    def _kernel_space(self, full: Sequence[int], operands: list[Operand]) -> tuple[tuple[int, ...], list[Operand]]:
        """The iteration space the kernel walks: unit dims dropped, dims every operand
        walks alike merged, and the last dim split when rows are fewer than partitions
        so that tiles fill them."""
        lw = self.lw
        # a row-wise kernel reduces along the last dim: it stays, even of size 1 (a softmax
        # over a unit dim is 1.0 everywhere, not a softmax over the dim before it)
        keep = [d for d, n in enumerate(full) if n != 1 or (self.full_rows and d == len(full) - 1)]
        shape = [full[d] for d in keep]
        operands = [self._drop(o, keep) for o in operands]
        if len(shape) >= 2:
            kshape, operands = collapse(shape, operands, lw.view, lw.layout, keep_last=self.full_rows)
            shape = list(kshape)
        while len(shape) < 2:
            shape = [1, *shape]
            operands = [Operand(lw.view(o.value, [1, *shape_of(o.value.type)]),
                                 [None] + [m if m is None else m + 1 for m in o.imap]) for o in operands]
        if shape[-2] < lw.P and len(shape) > 2:
            shape, operands = best_rows(shape, operands)
        R, C = shape[-2], shape[-1]
        f = 1 if self.full_rows else row_split(R, C, lw.P)
        if f == 1:
            return tuple(shape), operands
        split = [*shape[:-1], f, C // f]
        new_ops = []
        for o in operands:
            oshape = list(shape_of(o.value.type))
            strides, offset = lw.layout(o.value)
            if o.imap[-1] is None:
                v = lw.strided(o.value, [*oshape, 1], [*strides, 0], offset)
                imap = [*o.imap, None]
            else:
                d = o.imap[-1]
                sh = oshape[:d] + [f, C // f] + oshape[d + 1 :]
                st = list(strides[:d]) + [strides[d] * (C // f), strides[d]] + list(strides[d + 1 :])
                v = lw.strided(o.value, sh, st, offset)
                imap = [m if m is None or m < d else m + 1 for m in o.imap[:-1]] + [d, d + 1]
            new_ops.append(Operand(v, imap))
        if split[0] == 1:  # R was a leading unit dim: the split rows are the rows
            new_ops = [self._drop(o, list(range(1, len(split)))) for o in new_ops]
            return tuple(split[1:]), new_ops
        kshape, new_ops = collapse(split, new_ops, lw.view, lw.layout, keep_last=True)
        if kshape[-2] <= R:  # the split rows did not merge into more rows: keep [R, C]
            return tuple(shape), operands
        return tuple(kshape), new_ops

    def _drop(self, o: Operand, keep: list[int]) -> Operand:
        """Operand `o` without the iteration dims not in `keep` (unit dims). Operands
        are aligned (imap[d] is d or None, a unit dim) or permutations."""
        lw = self.lw
        oshape = list(shape_of(o.value.type))
        strides, offset = lw.layout(o.value)
        imap: IndexMap
        if all(m is None or m == d for d, m in enumerate(o.imap)):
            kept_dims = list(keep)
            imap = [None if o.imap[d] is None else i for i, d in enumerate(keep)]
        else:
            gone = {o.imap[d] for d in range(len(o.imap)) if d not in keep}
            kept_dims = [d for d in range(len(oshape)) if d not in gone]
            renum = {d: i for i, d in enumerate(kept_dims)}
            imap = [renum[o.imap[d]] for d in keep]  # type: ignore[index]
        v = lw.strided(o.value, [oshape[d] for d in kept_dims], [strides[d] for d in kept_dims], offset)
        return Operand(v, imap)

    def classify(self) -> None:
        """Leaves broadcast along columns become column operands where every consumer
        can take one; node classes follow (imm < column < tile); outputs are tiles."""
        for v in self.values:
            if isinstance(v, Leaf):
                v.cls = "column" if v.imap[-1] is None else "tile"
        while True:
            for v in self.values:
                if isinstance(v, Node):
                    v.cls = max((value_class(self.values[a]) for a in v.args), key=CLASS_RANK.__getitem__)
                    if v.cls == "imm":
                        v.cls = "column"
            demote = set()
            for ref, _ in self.outputs:
                if self.values[ref].cls != "tile":  # type: ignore[union-attr]
                    demote |= self._column_leaves(ref)
            if not demote:
                return
            for i in demote:
                self.values[i].cls = "tile"  # type: ignore[union-attr]

    def _column_leaves(self, ref: int) -> set[int]:
        """The column leaves value `ref` depends on."""
        v = self.values[ref]
        if isinstance(v, Leaf):
            return {ref} if v.cls == "column" else set()
        if isinstance(v, Node):
            out: set[int] = set()
            for a in v.args:
                out |= self._column_leaves(a)
            return out
        return set()

    # ---- buffers and tiles -------------------------------------------------------
    def _plan(self, kshape: tuple[int, ...]) -> TilePlan:
        """The tiles and buffer sets of the kernel over `kshape` (`cost.choose_tiles`)."""
        lw = self.lw
        cfg = lw.cfg
        rank = len(kshape)
        R, C = kshape[-2], kshape[-1]
        TR = min(lw.P, R)
        stored = {ref for ref, _ in self.outputs}
        temps = temp_demand(self.values, stored)
        tile_leaves = [v for v in self.values if isinstance(v, Leaf) and v.cls == "tile"]
        stored_isz = [element_size(elem) for _, elem in self.outputs]
        leaf_isz = [element_size(leaf_elem(v)) for v in tile_leaves]
        temp_isz = sum(element_size(e) * n for (e_str, cls), (e, n) in temps.items() if cls == "tile")
        budget = cfg.sram.bytes_per_partition - ALIGN * (len(self.values) + 8)
        steps = vector_steps(self.values, cfg)
        row_tiles, row_cols = row_scratch(self.values)
        temp_isz += 4 * row_tiles
        budget -= row_cols * ALIGN
        widths = [C] if self.full_rows else col_candidates(C)
        best = choose_tiles(cfg, kshape, TR, widths, budget, leaf_isz, stored_isz, temp_isz, steps)
        if best is None:
            if self.full_rows:
                raise TensorTooLargeError(
                    f"{self.what} at {self.loc}: a row of {C} elements does not fit one SRAM "
                    f"partition ({cfg.sram.bytes_per_partition} bytes) with its working buffers"
                )
            raise CompileError(
                f"{self.what} at {self.loc}: even one-column tiles of its {len(self.values)} "
                f"values do not fit SRAM"
            )
        est, TC, D = best
        extents = list(kshape)
        tiles = [1] * (rank - 2) + [TR, TC]
        trips = [-(-e // t) for e, t in zip(extents, tiles)]
        b = max((lvl for lvl in range(rank) if trips[lvl] >= 2), default=-1)
        if b < 0:
            D = 1
        remarks.emit("lower-graph-to-tile", "passed", lambda: (
            f"kernel {lw.kernel_name(self.what)}: tiles {TR} x {TC} of {list(kshape)}, "
            + (f"loads and stores multi-buffered x{D}" if D > 1 else "one tile, single-buffered")
            + f", estimated {est:,.0f} cycles"), self.loc)
        return TilePlan(extents, tiles, trips, b, D)

    def _emit(self, kshape: tuple[int, ...], plan: TilePlan, leaves: list[int], out_ops: list[Operand]) -> None:
        """The kernel: its loop nest over the tiles (the buffered level unrolled D times),
        a `TileProgram` for each tile's loads, vector ops and stores."""
        lw = self.lw
        rank = len(kshape)
        leaf_args = [self.leaf_of(i).value for i in leaves]
        out_views = [o.value for o in out_ops]
        kb = KernelBuilder(lw.kernel_name(self.what), [v.type for v in [*leaf_args, *out_views]], self.loc)
        TR, TC = plan.tiles[-2], plan.tiles[-1]

        # depth of each leaf: the innermost loop with >= 2 tiles whose index it uses
        def depth(i: int) -> int:
            leaf = self.values[i]
            assert isinstance(leaf, Leaf)
            used = [lvl for lvl in range(rank) if leaf.imap[lvl] is not None and plan.trips[lvl] >= 2]
            return max(used, default=-1)

        sets = {i: plan.D if depth(i) == plan.b and plan.b >= 0 else 1 for i in leaves}
        tp = TileProgram(self, kb, TR, TC, max(plan.D, 1), sets, plan.extents[-1])
        tp.bind(dict(zip(leaves, kb.args)), list(kb.args[len(leaves):]), [o.imap for o in out_ops])
        by_depth: dict[int, list[int]] = {}
        for i in leaves:
            by_depth.setdefault(depth(i), []).append(i)

        def body(idx: list[SSAValue], r: SSAValue, c: SSAValue, s: int, lvl_leaves: list[int]) -> None:
            for i in lvl_leaves:
                tp.load(i, idx, r, c, s)
            tp.compute(r, c, s)
            tp.store(idx, r, c, s)

        def level(lvl: int, idx: list[SSAValue], sizes: list[SSAValue]) -> None:
            E, T = plan.extents[lvl], plan.tiles[lvl]
            if lvl < plan.b:
                with kb.tiles(E, T) as (start, size):
                    for i in by_depth.get(lvl, []):
                        tp.load(i, idx + [start] + [kb.const(0)] * (rank - lvl - 1),
                                *(_rc(sizes + [size], plan, rank, lvl, kb)), 0)
                    level(lvl + 1, idx + [start], sizes + [size])
                return
            # the buffered level: D sets, statically peeled tail
            F, p = divmod(E, T)
            D = plan.D
            main, rest = divmod(F, D)

            def tile_at(start: SSAValue, size: int, s: int) -> None:
                inner_idx = idx + [start] + [kb.const(0)] * (rank - lvl - 1)
                inner_sizes = sizes + [kb.const(size)] + [kb.const(plan.extents[x]) for x in range(lvl + 1, rank)]
                r, c = inner_sizes[-2], inner_sizes[-1]
                body(inner_idx, r, c, s, by_depth.get(lvl, []))

            if main:
                with kb.loop(main) as u:
                    base = kb.muli(u, kb.const(D * T)) if main > 1 else kb.const(0)
                    for s in range(D):
                        tile_at(kb.addi(base, kb.const(s * T)) if s else base, T, s)
            for s in range(rest):
                tile_at(kb.const((main * D + s) * T), T, s)
            if p:
                tile_at(kb.const(F * T), p, F % D)

        for i in by_depth.get(-1, []):
            tp.load(i, [kb.const(0)] * rank, kb.const(min(TR, plan.extents[-2])),
                    kb.const(min(TC, plan.extents[-1])), 0)
        if plan.b < 0:  # one tile: every leaf was loaded above
            zeros = [kb.const(0)] * rank
            body(zeros, kb.const(plan.extents[-2]), kb.const(plan.extents[-1]), 0, [])
        else:
            level(0, [], [])
        lw.launch(kb, [*leaf_args, *out_views])


@dataclass
class TilePlan:
    """The loop nest of an elementwise kernel: per iteration dim its extent, tile and trips."""

    extents: list[int]
    tiles: list[int]
    trips: list[int]
    b: int  # the buffered (unrolled) loop level, -1 for a single tile
    D: int  # buffer sets


def _rc(sizes: list[SSAValue], plan: TilePlan, rank: int, lvl: int, kb: KernelBuilder) -> tuple[SSAValue, SSAValue]:
    """(rows, cols) sizes of a load issued at loop level `lvl` (inner levels full)."""
    full = sizes + [kb.const(min(plan.tiles[x], plan.extents[x])) for x in range(lvl + 1, rank)]
    return full[-2], full[-1]


def best_rows(shape: list[int], operands: list[Operand]) -> tuple[list[int], list[Operand]]:
    """Make the longest outer dim the row (partition) dim when dim -2 is shorter: any
    dim can walk partitions (a DMA's row stride is any stride), only the last one is
    contiguous. The iteration dims are permuted; operand imaps follow."""
    d = max(range(len(shape) - 1), key=lambda i: (shape[i], i))
    if shape[d] <= shape[-2]:
        return shape, operands
    order = [i for i in range(len(shape) - 1) if i != d] + [d, len(shape) - 1]
    return [shape[i] for i in order], [Operand(o.value, [o.imap[i] for i in order]) for o in operands]


def row_split(R: int, C: int, P: int) -> int:
    """The factor f splitting C so that R * f rows fill the partitions (1: none)."""
    if R >= P or C < 2:
        return 1
    best = 1
    for f in range(2, min(P // max(R, 1), C) + 1):
        if C % f == 0 and C // f >= 1:
            best = f
    return best


def add_graph_op(ek: ElementwiseKernel, op: Operation, args: list[int]) -> int:
    """The node computing elementwise graph op `op` from the values `args`."""
    got = elementwise_fn(op)
    if got is None:
        raise CompileError(f"{op.name} at {g.source_loc(op)}: not an elementwise op (passes/vector_fns.py)")
    kind, fn = got
    elem = elem_of(op.results[0].type)
    if kind == "unary":
        return ek.unary(fn, args[0], elem)
    if kind == "binary":
        return ek.binary(fn, args[0], args[1], elem)
    return ek.where(args[0], args[1], args[2], elem)
