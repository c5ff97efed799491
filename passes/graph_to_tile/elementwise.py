"""Elementwise kernels: a DAG of elementwise ops over one iteration space, in one kernel.

Every elementwise graph op (alone, at -O0 and -O2) and every fused elementwise group
(-O2, `graph.fused "elementwise"`) lowers through `ElementwiseKernel`: leaves (HBM
tensors with a broadcast index map, or immediates), nodes (vector steps on tiles), and
outputs (nodes stored to new HBM tensors). Intermediates stay in SRAM::

    %y = graph.fused "elementwise" (%x, %b) {             y = gelu(x + b) * 0.5
      ...
    }
      -> per [TR x TC] tile:  load x, load b (row-broadcast) -> add -> gelu -> mul imm
                              -> store y      (one kernel, x and y touch HBM once)

Tiling (`choose_tiles`, an analytical cost model of the config): rows map to
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
over an input that dies there); buffers a store reads get one per set. Nodes compute
in fp32 and round to their own element type, as eager does op by op.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects.builtin import Float32Type, MemRefType, f32
from xdsl.ir import Attribute, SSAValue

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.shapes import Operand, collapse
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.tile.plan_sram import element_size
from tilecc.passes.vector_fns import elementwise_fn

IndexMap = list[int | None]  # output dim -> operand dim (None: broadcast)
_ALIGN = 64


@dataclass
class Leaf:
    value: SSAValue  # HBM memref in @main, of the iteration space's rank
    imap: IndexMap
    cls: str = "tile"  # "tile" or "column" (broadcast along columns: one value per row)
    given: Attribute | None = None  # element type of a leaf not loaded (an accumulator tile)


@dataclass
class Imm:
    value: float


@dataclass
class Node:
    kind: str  # "unary", "binary", "where", or a row-wise op: ROWWISE
    fn: str  # unary / binary function ("" otherwise)
    args: list[int]
    elem: Attribute
    cls: str = "tile"
    eps: float = 0.0  # layer_norm


# row-wise nodes: whole rows (the last dim) in one tile; scratch they use per tile
# (fp32 tiles, fp32 columns)
ROWWISE = {"layer_norm": (2, 2), "softmax": (1, 2), "log_softmax": (2, 2)}


Value = Leaf | Imm | Node
_RANK = {"imm": 0, "column": 1, "tile": 2}

# folding of immediates (both operands known at compile time)
_FOLD = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
}
_FOLD1 = {
    "copy": lambda x: x, "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "square": np.square,
    "reciprocal": lambda x: 1 / x,
}


def _isz(elem: Attribute) -> int:
    return element_size(elem)


def _cls(v: Value) -> str:
    return "imm" if isinstance(v, Imm) else v.cls


@dataclass
class _Slot:
    """Where a value lives in a tile body: a buffer per set (leaves and stored nodes at
    the buffered level), one buffer, or an immediate."""

    bufs: list[SSAValue] = field(default_factory=list)

    def at(self, s: int) -> SSAValue:
        return self.bufs[s % len(self.bufs)]


class ElementwiseKernel:
    """Build with `leaf`, `imm`, `unary`, `binary`, `where`, `output`; then `build()`."""

    def __init__(self, lw, what: str, loc: str, out_shape: Sequence[int]):
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
        for i, x in enumerate(self.values):
            if isinstance(x, Leaf) and x.value is value and x.imap == imap:
                return i
        self.values.append(Leaf(value, list(imap)))
        return len(self.values) - 1

    def imm(self, value: float) -> int:
        self.values.append(Imm(float(value)))
        return len(self.values) - 1

    def unary(self, fn: str, a: int, elem: Attribute) -> int:
        x = self.values[a]
        if isinstance(x, Imm):
            if fn not in _FOLD1:
                raise CompileError(f"{self.what} at {self.loc}: {fn} of a constant is not folded")
            return self.imm(float(np.float32(_FOLD1[fn](np.float32(x.value)))))
        self.values.append(Node("unary", fn, [a], elem))
        return len(self.values) - 1

    def binary(self, fn: str, a: int, b: int, elem: Attribute) -> int:
        x, y = self.values[a], self.values[b]
        if isinstance(x, Imm) and isinstance(y, Imm) and fn in _FOLD:
            return self.imm(float(np.float32(_FOLD[fn](np.float32(x.value), np.float32(y.value)))))
        self.values.append(Node("binary", fn, [a, b], elem))
        return len(self.values) - 1

    def where(self, c: int, x: int, y: int, elem: Attribute) -> int:
        cv = self.values[c]
        if isinstance(cv, Imm):
            picked = x if cv.value != 0.0 else y
            return self.unary("copy", picked, elem) if not isinstance(self.values[picked], Imm) else picked
        self.values.append(Node("where", "", [c, x, y], elem))
        return len(self.values) - 1

    def rowwise(self, kind: str, args: list[int], elem: Attribute, eps: float = 0.0) -> int:
        """A row-wise op over the last dim: layer_norm (args x, weight, bias), softmax or
        log_softmax (x). Tiles then hold whole rows."""
        assert kind in ROWWISE
        self.values.append(Node(kind, "", list(args), elem, eps=float(eps)))
        return len(self.values) - 1

    @property
    def full_rows(self) -> bool:
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
            n = math.prod(_shape(self.lw.materialise(v).type))
            if n != math.prod(self.shape):
                raise CompileError(f"{self.what} at {self.loc}: a broadcast operand across a reshape")
            view = self.lw.view(self.lw.materialise(v), self.shape)
            return self.leaf_hbm(view, list(range(len(self.shape))))
        o = self.lw.aligned(v, tuple(op_shape))
        keep = [d for d, n in enumerate(op_shape) if n != 1]
        o = self._drop(o, keep)
        pad = len(self.shape) - len(keep)
        if pad:
            shape = _shape(o.value.type)
            strides, offset = self.lw.layout(o.value)
            o = Operand(self.lw.strided(o.value, [1] * pad + list(shape), [0] * pad + list(strides), offset),
                         [None] * pad + [m if m is None else m + pad for m in o.imap])
        return self.leaf_hbm(o.value, o.imap)

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
        if _elem_of(v) != elem or any(r == ref for r, _ in self.outputs):
            ref = self.unary("copy", ref, elem)
        self.outputs.append((ref, elem))
        self.out_values.append(value)

    # ---- lowering ----------------------------------------------------------------
    def build(self) -> list[SSAValue]:
        """Emit and launch the kernel; the HBM tensors of the outputs (at `shape`)."""
        lw = self.lw
        full = self.shape if len(self.shape) >= 2 else lw.out_shape2(self.shape)
        outs = [self._out_buffer(value, elem, full) for (_, elem), value in zip(self.outputs, self.out_values)]
        leaves = [i for i, v in enumerate(self.values) if isinstance(v, Leaf)]
        operands = [Operand(self.values[i].value, self.values[i].imap) for i in leaves]  # type: ignore[union-attr]
        operands += [Operand(lw.view(o, full), list(range(len(full)))) for o in outs]
        kshape, operands = self._kernel_space(full, operands)
        for i, o in zip(leaves, operands):
            leaf = self.values[i]
            assert isinstance(leaf, Leaf)
            leaf.value, leaf.imap = o.value, o.imap
        out_ops = operands[len(leaves):]
        self._classify()
        plan = self._plan(kshape)
        self._emit(kshape, plan, leaves, out_ops)
        return outs

    def _out_buffer(self, value: SSAValue | None, elem: Attribute, full: Sequence[int]) -> SSAValue:
        """An output's HBM tensor at the iteration space's shape: the buffer the graph
        value asks for (`output_buffer`) when it reshapes to the space for free."""
        from tilecc.passes.graph_to_tile.shapes import reshape_strides

        lw = self.lw
        if value is not None and value in lw.layout_requests:
            _, strides = lw.layout_requests[value]
            if reshape_strides(tuple(value.type.get_shape()), strides, self.shape) is not None:  # type: ignore[attr-defined]
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
            operands = [Operand(lw.view(o.value, [1, *_shape(o.value.type)]),
                                 [None] + [m if m is None else m + 1 for m in o.imap]) for o in operands]
        if shape[-2] < lw.P and len(shape) > 2:
            shape, operands = _best_rows(shape, operands)
        R, C = shape[-2], shape[-1]
        f = 1 if self.full_rows else _row_split(R, C, lw.P)
        if f == 1:
            return tuple(shape), operands
        split = [*shape[:-1], f, C // f]
        new_ops = []
        for o in operands:
            oshape = list(_shape(o.value.type))
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
        oshape = list(_shape(o.value.type))
        strides, offset = lw.layout(o.value)
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

    def _classify(self) -> None:
        """Leaves broadcast along columns become column operands where every consumer
        can take one; node classes follow (imm < column < tile); outputs are tiles."""
        for v in self.values:
            if isinstance(v, Leaf):
                v.cls = "column" if v.imap[-1] is None else "tile"
        while True:
            for v in self.values:
                if isinstance(v, Node):
                    v.cls = max((_cls(self.values[a]) for a in v.args), key=_RANK.__getitem__)
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
    def _plan(self, kshape: tuple[int, ...]) -> _Plan:
        lw = self.lw
        cfg = lw.cfg
        rank = len(kshape)
        R, C = kshape[-2], kshape[-1]
        TR = min(lw.P, R)
        stored = {ref for ref, _ in self.outputs}
        temps = _temp_demand(self.values, stored)
        tile_leaves = [v for v in self.values if isinstance(v, Leaf) and v.cls == "tile"]
        stored_isz = [_isz(elem) for _, elem in self.outputs]
        leaf_isz = [_isz(leaf_elem(v)) for v in tile_leaves]
        temp_isz = sum(_isz(e) * n for (e_str, cls), (e, n) in temps.items() if cls == "tile")
        budget = cfg.sram.bytes_per_partition - _ALIGN * (len(self.values) + 8)
        steps = vector_steps(self.values, cfg)
        row_tiles, row_cols = _row_scratch(self.values)
        temp_isz += 4 * row_tiles
        budget -= row_cols * _ALIGN
        best: tuple[float, int, int] | None = None
        for TC in ([C] if self.full_rows else _col_candidates(C)):
            for D in (2, 3, 4):
                sram = D * TC * (sum(leaf_isz) + sum(stored_isz)) + TC * temp_isz
                if sram > budget:
                    continue
                est = _estimate(cfg, kshape, TR, TC, D, leaf_isz, stored_isz, steps)
                if best is None or est < best[0] - 1e-9:
                    best = (est, TC, D)
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
        _, TC, D = best
        extents = list(kshape)
        tiles = [1] * (rank - 2) + [TR, TC]
        trips = [-(-e // t) for e, t in zip(extents, tiles)]
        b = max((lvl for lvl in range(rank) if trips[lvl] >= 2), default=-1)
        if b < 0:
            D = 1
        remarks.emit("lower-graph-to-tile", "passed", lambda: (
            f"kernel {lw.kernel_name(self.what)}: tiles {TR} x {TC} of {list(kshape)}, "
            + (f"loads and stores multi-buffered x{D}" if D > 1 else "one tile, single-buffered")
            + f", estimated {best[0]:,.0f} cycles"), self.loc)
        return _Plan(extents, tiles, trips, b, D)

    def _emit(self, kshape: tuple[int, ...], plan: _Plan, leaves: list[int], out_ops: list[Operand]) -> None:
        lw = self.lw
        rank = len(kshape)
        leaf_args = [self.values[i].value for i in leaves]  # type: ignore[union-attr]
        out_views = [o.value for o in out_ops]
        kb = KernelBuilder(lw.kernel_name(self.what), [v.type for v in leaf_args] + [v.type for v in out_views], self.loc)
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

        def body(idx: list[SSAValue], r, c, s: int, lvl_leaves: list[int]) -> None:
            for i in lvl_leaves:
                tp.load(i, idx, r, c, s)
            tp.compute(r, c, s)
            tp.store(idx, r, c, s)

        def level(lvl: int, idx: list[SSAValue], sizes: list) -> None:
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


class TileProgram:
    """The per-tile work of an `ElementwiseKernel`'s DAG inside some kernel: buffers
    (allocated at construction: a buffer per set for loaded leaves and stored values,
    temps by liveness, scratch), then per tile `load` (a leaf's DMA), `compute` (every
    node), `store` (the outputs). Other kernels (a matmul's epilogue) drive it on their
    own tiles; a leaf marked `acc` is not loaded but given to `compute` (an accumulator
    tile)."""

    def __init__(self, ek: ElementwiseKernel, kb: KernelBuilder, TR: int, TC: int, D: int,
                 leaf_sets: dict[int, int], row_len: int, roots: Sequence[int] = (),
                 external: frozenset[int] = frozenset()):
        """`roots`: values computed besides the outputs; `external`: values whose
        buffers `compute` is given (an accumulator tile, a buffer another kernel reads)."""
        self.ek, self.kb, self.TR, self.TC, self.D, self.row_len = ek, kb, TR, TC, D, row_len
        values = ek.values
        self.stored = {ref: k for k, (ref, _) in enumerate(ek.outputs)}
        slots: dict[int, _Slot] = {}
        for i, n in leaf_sets.items():
            leaf = values[i]
            assert isinstance(leaf, Leaf)
            cols = 1 if leaf.cls == "column" else TC
            slots[i] = _Slot([kb.alloc([TR, cols], leaf_elem(leaf), tile.SRAM, f"in{i}") for _ in range(n)])
        temp_bufs: dict[tuple[str, str, int], SSAValue] = {}
        for ref, key in sorted(_assign_temps(values, set(self.stored), roots, external).items()):
            if key not in temp_bufs:
                cols = 1 if key[1] == "column" else TC
                temp_bufs[key] = kb.alloc([TR, cols], values[ref].elem, tile.SRAM, "t")  # type: ignore[union-attr]
            slots[ref] = _Slot([temp_bufs[key]])
        for ref, k in self.stored.items():
            if (isinstance(values[ref], Leaf) and ref in slots) or ref in external:
                continue  # stored from its load buffer, or from the given buffer
            slots[ref] = _Slot([kb.alloc([TR, TC], ek.outputs[k][1], tile.SRAM, f"out{k}") for _ in range(D)])
        self.slots = slots
        self.scratch = [kb.alloc([TR, TC], f32, tile.SRAM, "w") for _ in range(_where_scratch(values))]
        row_tiles, row_cols = _row_scratch(values)
        self.row_scratch = (
            [kb.alloc([TR, TC], f32, tile.SRAM, "row") for _ in range(row_tiles)],
            [kb.alloc([TR, 1], f32, tile.SRAM, "stat") for _ in range(row_cols)],
        )
        self.order = _order(values, [ref for ref, _ in ek.outputs] + list(roots))
        self.queues = ek.lw.cfg.dma.queues
        self._q = 0

    @staticmethod
    def sram_bytes(ek: ElementwiseKernel, TC: int, D: int, leaf_sets: dict[int, int],
                   roots: Sequence[int] = (), external: frozenset[int] = frozenset()) -> int:
        """Bytes per partition the buffers of a TileProgram of these arguments take."""
        values = ek.values
        stored = {ref for ref, _ in ek.outputs}

        def buf(cols: int, elem) -> int:
            return -(-max(cols * _isz(elem), 1) // _ALIGN) * _ALIGN

        total = 0
        for i, n in leaf_sets.items():
            leaf = values[i]
            assert isinstance(leaf, Leaf)
            total += n * buf(1 if leaf.cls == "column" else TC, leaf_elem(leaf))
        for (_, cls), (elem, n) in _temp_demand(values, stored, roots, external).items():
            total += n * buf(1 if cls == "column" else TC, elem)
        for ref, k in ((r, k) for k, (r, _) in enumerate(ek.outputs)):
            if (isinstance(values[ref], Leaf) and ref in leaf_sets) or ref in external:
                continue
            total += D * buf(TC, ek.outputs[k][1])
        total += _where_scratch(values) * buf(TC, f32)
        row_tiles, row_cols = _row_scratch(values)
        return total + row_tiles * buf(TC, f32) + row_cols * _ALIGN

    def bind(self, leaf_args: dict[int, SSAValue], out_args: list[SSAValue], out_imaps: list[IndexMap]) -> None:
        """The kernel arguments holding each loaded leaf and each output."""
        self.leaf_args, self.out_args, self.out_imaps = leaf_args, out_args, out_imaps

    def next_queue(self) -> int:
        """DMA transfers rotate over the queues in program order."""
        self._q += 1
        return (self._q - 1) % self.queues

    def load(self, i: int, idx: list[SSAValue], r, c, s: int, queue: int | None = None) -> None:
        kb = self.kb
        leaf = self.ek.values[i]
        assert isinstance(leaf, Leaf)
        arg = self.leaf_args[i]
        ind = [kb.const(0)] * len(_shape(arg.type))
        for d, od in enumerate(leaf.imap):
            if od is not None:
                ind[od] = idx[d]
        row_dim = leaf.imap[-2] if leaf.imap[-2] is not None else -1
        col_dim = leaf.imap[-1] if leaf.imap[-1] is not None else -1
        cols = kb.const(1) if leaf.cls == "column" else c
        q = self.next_queue() if queue is None else queue
        kb.add(tile.LoadOp(arg, ind, self.slots[i].at(s), r, cols, row_dim, col_dim, queue=q))

    def compute(self, r, c, s: int, acc: dict[int, SSAValue] | None = None) -> None:
        """Every node on the leading r x c corner of set `s`; `acc` gives the buffers of
        leaves that are not loaded."""
        kb = self.kb
        values = self.ek.values
        one = kb.const(1)

        def buf(a: int) -> SSAValue:
            return acc[a] if acc is not None and a in acc else self.slots[a].at(s)

        for ref in self.order:
            v = values[ref]
            if not isinstance(v, Node):
                continue
            cols = one if v.cls == "column" else c
            ops = [(_cls(values[a]), values[a].value if isinstance(values[a], Imm) else buf(a)) for a in v.args]
            if v.kind in ROWWISE:
                _emit_rowwise(kb, v, ops, buf(ref), r, c, self.row_scratch, self.row_len)
            else:
                _emit_node(kb, v, ops, buf(ref), r, cols, self.scratch)

    def store(self, idx: list[SSAValue], r, c, s: int, queue: int | None = None,
              given: dict[int, SSAValue] | None = None) -> None:
        """The outputs of set `s` (`given`: buffers of external values)."""
        kb = self.kb
        rank = len(idx)
        for ref, k in self.stored.items():
            # outputs are aligned (a None is the unit dim at its position) or permuted
            imap = [d if m is None else m for d, m in enumerate(self.out_imaps[k])]
            ind = [kb.const(0)] * rank
            for d, od in enumerate(imap):
                ind[od] = idx[d]
            src = given[ref] if given is not None and ref in given else self.slots[ref].at(s)
            kb.add(tile.StoreOp(src, self.out_args[k], ind, r, c, imap[-2], imap[-1],
                                queue=self.next_queue() if queue is None else queue))


@dataclass
class _Plan:
    extents: list[int]
    tiles: list[int]
    trips: list[int]
    b: int  # the buffered (unrolled) loop level, -1 for a single tile
    D: int  # buffer sets


def _rc(sizes: list, plan: _Plan, rank: int, lvl: int, kb: KernelBuilder):
    """(rows, cols) sizes of a load issued at loop level `lvl` (inner levels full)."""
    full = sizes + [kb.const(min(plan.tiles[x], plan.extents[x])) for x in range(lvl + 1, rank)]
    return full[-2], full[-1]


def _shape(t: Attribute) -> tuple[int, ...]:
    assert isinstance(t, MemRefType)
    return tuple(t.get_shape())


def leaf_elem(v: Leaf) -> Attribute:
    if v.given is not None:
        return v.given
    t = v.value.type
    assert isinstance(t, MemRefType)
    return t.element_type


def _elem_of(v: Value) -> Attribute | None:
    if isinstance(v, Node):
        return v.elem
    if isinstance(v, Leaf):
        return leaf_elem(v)
    return None


def _best_rows(shape: list[int], operands: list[Operand]) -> tuple[list[int], list[Operand]]:
    """Make the longest outer dim the row (partition) dim when dim -2 is shorter: any
    dim can walk partitions (a DMA's row stride is any stride), only the last one is
    contiguous. The iteration dims are permuted; operand imaps follow."""
    d = max(range(len(shape) - 1), key=lambda i: (shape[i], i))
    if shape[d] <= shape[-2]:
        return shape, operands
    order = [i for i in range(len(shape) - 1) if i != d] + [d, len(shape) - 1]
    return [shape[i] for i in order], [Operand(o.value, [o.imap[i] for i in order]) for o in operands]


def _row_split(R: int, C: int, P: int) -> int:
    """The factor f splitting C so that R * f rows fill the partitions (1: none)."""
    if R >= P or C < 2:
        return 1
    best = 1
    for f in range(2, min(P // max(R, 1), C) + 1):
        if C % f == 0 and C // f >= 1:
            best = f
    return best


def _col_candidates(C: int) -> list[int]:
    out = {C}
    t = 1
    while t < C:
        out.add(t)
        t *= 2
    for k in (2, 3, 4, 6, 8):
        out.add(-(-C // k))
    return sorted(out)


def _order(values: list[Value], roots: list[int]) -> list[int]:
    """Values needed by `roots`, in topological order (each once)."""
    seen: set[int] = set()
    out: list[int] = []

    def visit(i: int) -> None:
        if i in seen:
            return
        seen.add(i)
        v = values[i]
        if isinstance(v, Node):
            for a in v.args:
                visit(a)
        out.append(i)

    for r in roots:
        visit(r)
    return out


def _last_use(values: list[Value], order: list[int]) -> dict[int, int]:
    last: dict[int, int] = {}
    for pos, i in enumerate(order):
        v = values[i]
        if isinstance(v, Node):
            for a in v.args:
                last[a] = pos
    return last


def _assign_temps(
    values: list[Value], stored: set[int], roots: Sequence[int] = (), external: set[int] | frozenset = frozenset()
) -> dict[int, tuple[str, str, int]]:
    """Buffer of each node that is neither stored nor `external` (its buffer comes from
    elsewhere), by liveness: (element type, class, index); a node may take the buffer
    of an input that dies there (not a `where`: it reads its inputs after writing
    scratch). `roots` are values computed besides the stored ones."""
    stored = set(stored) | set(external)
    order = _order(values, sorted(stored | set(roots)))
    last = _last_use(values, order)
    free: dict[tuple[str, str], list[int]] = {}
    count: dict[tuple[str, str], int] = {}
    owner: dict[int, tuple[str, str, int]] = {}
    for pos, i in enumerate(order):
        v = values[i]
        if not isinstance(v, Node):
            continue
        dying = sorted({a for a in v.args if last.get(a) == pos and a in owner})
        if v.kind != "where":
            for a in dying:
                free.setdefault(owner[a][:2], []).append(owner[a][2])
        if i not in stored:
            key = (str(v.elem), v.cls)
            pool = free.setdefault(key, [])
            if pool:
                idx = pool.pop(0)
            else:
                idx = count.get(key, 0)
                count[key] = idx + 1
            owner[i] = (key[0], key[1], idx)
        if v.kind == "where":
            for a in dying:
                free.setdefault(owner[a][:2], []).append(owner[a][2])
        if i in owner and last.get(i) is None and i not in stored:
            free.setdefault(owner[i][:2], []).append(owner[i][2])
    return owner


def _temp_demand(
    values: list[Value], stored: set[int], roots: Sequence[int] = (), external: set[int] | frozenset = frozenset()
) -> dict[tuple[str, str], tuple[Attribute, int]]:
    owner = _assign_temps(values, stored, roots, external)
    out: dict[tuple[str, str], tuple[Attribute, int]] = {}
    for i, (e, cls, idx) in owner.items():
        elem = values[i].elem  # type: ignore[union-attr]
        n = out.get((e, cls), (elem, 0))[1]
        out[(e, cls)] = (elem, max(n, idx + 1))
    return out


def _row_scratch(values: list[Value]) -> tuple[int, int]:
    """(fp32 tile buffers, fp32 column buffers) the row-wise nodes need per tile."""
    need = [ROWWISE[v.kind] for v in values if isinstance(v, Node) and v.kind in ROWWISE]
    return max((t for t, _ in need), default=0), max((c for _, c in need), default=0)


def _emit_rowwise(kb: KernelBuilder, v: Node, ops, out: SSAValue, r, c, scratch, C: int) -> None:
    """A layer norm, softmax or log_softmax of whole rows (`c` = C columns): the row
    statistics are [rows x 1] fp32 columns, the arithmetic fp32, `out` rounded."""
    tiles, cols = scratch
    one = kb.const(1)
    x = ops[0][1]
    if v.kind == "layer_norm":
        xc, sq = tiles[0], tiles[1]
        mean, rstd = cols[0], cols[1]
        kb.add(tile.ReduceOp("sum", x, mean, r, c))
        kb.add(tile.ScalarOp("mul", mean, 1.0 / C, mean, r, one))
        kb.add(tile.BinaryOp("sub", x, mean, xc, r, c, "column"))
        kb.add(tile.UnaryOp("square", xc, sq, r, c))
        kb.add(tile.ReduceOp("sum", sq, rstd, r, c))
        kb.add(tile.ScalarOp("mul", rstd, 1.0 / C, rstd, r, one))
        kb.add(tile.ScalarOp("add", rstd, v.eps, rstd, r, one))
        kb.add(tile.UnaryOp("rsqrt", rstd, rstd, r, one))
        scale = ops[1] != ("imm", 1.0)  # an affine of ones and zeros (folded into the
        shift = ops[2] != ("imm", 0.0)  # next matmul, passes/graph/fold_norm_affine.py) is skipped
        kb.add(tile.BinaryOp("mul", xc, rstd, xc if scale or shift else out, r, c, "column"))
        if scale:
            _binary(kb, "mul", ("tile", xc), ops[1], xc if shift else out, r, c)
        if shift:
            _binary(kb, "add", ("tile", xc), ops[2], out, r, c)
        return
    mx, sm = cols[0], cols[1]
    kb.add(tile.ReduceOp("max", x, mx, r, c))
    if v.kind == "softmax":
        e = tiles[0]
        kb.add(tile.BinaryOp("sub", x, mx, e, r, c, "column"))
        kb.add(tile.UnaryOp("exp", e, e, r, c))
        kb.add(tile.ReduceOp("sum", e, sm, r, c))
        kb.add(tile.UnaryOp("reciprocal", sm, sm, r, one))
        kb.add(tile.BinaryOp("mul", e, sm, out, r, c, "column"))
        return
    shifted, e = tiles[0], tiles[1]
    kb.add(tile.BinaryOp("sub", x, mx, shifted, r, c, "column"))
    kb.add(tile.UnaryOp("exp", shifted, e, r, c))
    kb.add(tile.ReduceOp("sum", e, sm, r, c))
    kb.add(tile.UnaryOp("log", sm, sm, r, one))
    kb.add(tile.BinaryOp("sub", shifted, sm, out, r, c, "column"))


def _where_scratch(values: list[Value]) -> int:
    return 3 if any(isinstance(v, Node) and v.kind == "where" for v in values) else 0


def vector_steps(values: list[Value], cfg) -> list[tuple[float, bool]]:
    """(cost x inputs, column-sized) of every vector instruction of a tile body."""
    costs = cfg.vector.op_cost
    steps: list[tuple[float, bool]] = []
    for v in values:
        if not isinstance(v, Node):
            continue
        col = v.cls == "column"
        if v.kind == "unary":
            steps.append((costs.unary[v.fn], col))
        elif v.kind == "binary":
            two = all(_cls(values[a]) == "tile" for a in v.args)
            steps.append((costs.binary[v.fn] * (2 if two else 1), col))
        elif v.kind == "where":
            steps += [(2 * costs.binary["mask"], col), (costs.binary["eq"], col),
                      (2 * costs.binary["mask"], col), (2 * costs.binary["add"], col)]
        elif v.kind == "layer_norm":
            steps += [(costs.reduce["sum"], False), (costs.binary["sub"], False), (costs.unary["square"], False),
                      (costs.reduce["sum"], False), (costs.binary["mul"], False)] + [(1.0, True)] * 4
            if not (isinstance(values[v.args[1]], Imm) and values[v.args[1]].value == 1.0):
                steps.append((2 * costs.binary["mul"], False))
            if not (isinstance(values[v.args[2]], Imm) and values[v.args[2]].value == 0.0):
                steps.append((2 * costs.binary["add"], False))
        elif v.kind == "softmax":
            steps += [(costs.reduce["max"], False), (costs.binary["sub"], False), (costs.unary["exp"], False),
                      (costs.reduce["sum"], False), (costs.binary["mul"], False)] + [(1.0, True)]
        else:  # log_softmax
            steps += [(costs.reduce["max"], False), (costs.binary["sub"], False), (costs.unary["exp"], False),
                      (costs.reduce["sum"], False), (costs.binary["sub"], False)] + [(1.0, True)]
    return steps


def _estimate(cfg, kshape, TR, TC, D, leaf_isz, stored_isz, steps) -> float:
    """Pipelined time of the kernel for tiles TR x TC and D buffer sets (cycles)."""
    R, C = kshape[-2], kshape[-1]
    outer = math.prod(kshape[:-2]) if len(kshape) > 2 else 1
    n_tiles = outer * -(-R // TR) * -(-C // TC)
    lanes = cfg.vector.lanes
    overhead = cfg.vector.latency_cycles + cfg.vector.access_cycles
    vec = sum(overhead + math.ceil(TR * (1 if col else TC) / lanes) * f for f, col in steps)
    isz = leaf_isz + stored_isz
    n = len(isz)
    bw = cfg.hbm.bytes_per_cycle
    fixed = cfg.dma.latency_cycles + cfg.hbm.latency_cycles + TR * cfg.dma.per_descriptor_cycles
    data = [TR * TC * s / (bw * min(1.0, TC * s / cfg.dma.efficient_chunk_bytes)) for s in isz]
    # transfers in flight: the next D-1 tiles' loads and this tile's stores, one per queue
    n_load = len(leaf_isz)
    in_flight = max(1, min(cfg.dma.queues, n_load * (D - 1) + len(stored_isz)))
    dma = max(sum(data) * 1.0, (n * fixed + sum(data)) / in_flight) if n else 0.0
    per_tile = max(vec, dma)
    load0 = fixed + max(data[: len(leaf_isz)], default=0.0)
    store_last = fixed + max(data[len(leaf_isz):], default=0.0)
    return n_tiles * per_tile + load0 + store_last + vec


def _emit_node(kb: KernelBuilder, v: Node, ops: list[tuple[str, object]], out: SSAValue, r, c, scratch) -> None:
    if v.kind == "unary":
        (cls, a), = ops
        kb.add(tile.UnaryOp(v.fn, a, out, r, c))
        return
    if v.kind == "binary":
        _binary(kb, v.fn, ops[0], ops[1], out, r, c)
        return
    cond, x, y = ops  # where(c, x, y) = mask(x, c) + mask(y, c == 0)

    def scratch_of(k: int, cls: str) -> tuple[str, SSAValue]:
        buf = scratch[k]
        return (cls, _sub(kb, buf, 1) if cls == "column" else buf)

    def top(*ops_: tuple[str, object]) -> str:
        return max((o[0] for o in ops_), key=_RANK.__getitem__)

    t = scratch_of(0, top(x, cond, ("column", None)))
    nc = scratch_of(1, top(cond, ("column", None)))
    u = scratch_of(2, top(y, nc))
    _binary(kb, "mask", x, cond, t[1], r, c if t[0] == "tile" else kb.const(1))
    _binary(kb, "eq", cond, ("imm", 0.0), nc[1], r, c if nc[0] == "tile" else kb.const(1))
    _binary(kb, "mask", y, nc, u[1], r, c if u[0] == "tile" else kb.const(1))
    _binary(kb, "add", t, u, out, r, c)


def _sub(kb: KernelBuilder, buf: SSAValue, cols: int) -> SSAValue:
    rows = _shape(buf.type)[0]
    return kb.add(tile.SubviewOp(buf, kb.const(0), kb.const(0), [rows, cols])).results[0]


def _binary(kb: KernelBuilder, fn: str, a: tuple[str, object], b: tuple[str, object], out: SSAValue, r, c) -> None:
    (ca, va), (cb, vb) = a, b
    if ca == "imm" and cb == "imm":
        raise CompileError(f"binary {fn} of two immediates reached the kernel")
    if cb == "imm":
        kb.add(tile.ScalarOp(fn, va, float(vb), out, r, c))  # type: ignore[arg-type]
    elif ca == "imm":
        kb.add(tile.ScalarOp(fn, vb, float(va), out, r, c, swap=True))  # type: ignore[arg-type]
    elif ca == "tile" and cb == "column":
        kb.add(tile.BinaryOp(fn, va, vb, out, r, c, "column"))
    elif ca == "column" and cb == "tile":
        kb.add(tile.BinaryOp(fn, vb, va, out, r, c, "column", swap=True))
    else:
        kb.add(tile.BinaryOp(fn, va, vb, out, r, c))


__all__ = ["ElementwiseKernel", "Leaf", "Imm", "Node", "Float32Type"]


# ---------------------------------------------------------------------------
# Graph ops as DAG nodes
# ---------------------------------------------------------------------------


def add_graph_op(ek: ElementwiseKernel, op, args: list[int]) -> int:
    """The node computing elementwise graph op `op` from the values `args`."""
    kind, fn = elementwise_fn(op)  # type: ignore[misc]
    elem = op.results[0].type.element_type
    if kind == "unary":
        return ek.unary(fn, args[0], elem)
    if kind == "binary":
        return ek.binary(fn, args[0], args[1], elem)
    return ek.where(args[0], args[1], args[2], elem)
