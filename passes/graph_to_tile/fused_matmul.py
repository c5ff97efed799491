"""A `graph.fused "matmul"` group as one kernel: the -O2 matmul kernel with its epilogue
applied to every accumulator tile as it is evacuated, and its A rows produced on chip.

`FusedMatmulKernel` is a `BlockedMatmulKernel` (passes/graph_to_tile/matmul.py) whose two
extension points run `TileProgram`s (passes/graph_to_tile/elementwise/) of the group's DAGs:

- `evacuate(acc, parity, m0, n0, ms, ns)`: the epilogue DAG reads the accumulator tile
  directly (its first op replaces the copy: ``out = acc + bias`` costs one vector
  instruction, as the copy did), loads the other operands of this output tile (a
  residual tile, a per-row column) into the buffer set `parity`, and stores every
  output of the group at ``(m0, n0)``. Operands that do not vary along the rows (a
  bias row) are loaded once for the whole kernel, full width, and read through a
  column window at ``n0``. Per-tile operands load on the last B queue.
- a bias row the epilogue adds first (``out = acc + bias``, `bias_row`) is added by the
  matrix engine instead: one K=1 matmul ``acc += ones[1 x TM]^T @ bias[1 x TN]`` per
  TN-column block after the k-tiles (`tile_done`), so the evacuation reads one tile
  (GPT-2's c_fc: gelu alone instead of an add reading two tiles, then the gelu).
- `load_a_rows(dst, m0, k0, ms, K, queue)`: the prologue DAG (a layer norm with its own
  prologue, e.g. a residual add) loads its inputs' rows ``m0..m0+ms`` on the A queue and
  writes the layer norm's result straight into `dst`, the natural-layout A buffer the
  kernel then transposes; prologue values the group yields (the residual stream) are
  stored from the same rows. The vector work is emitted after the transposes of the
  m-tile being prepared (`BlockedMatmulKernel.defer`), not ahead of them.

- rotary embeddings reading column ranges of a product yielded alone (the q / k / v
  projection's q and k heads) run in its evacuations instead of as rope kernels
  (`rope/epilogue.py`: `RopeMatmulKernel`).

The matmul's schedule is chosen for the fused kernel: the problem carries the
epilogue's and prologue's vector work and SRAM (`MatmulProblem.evac_*`, `prep_*`,
`fused_sram*`), so the cost model weighs them and only schedules that fit are taken.
Not fused (the caller lowers the group as separate kernels): a matmul with M or N of 1
(its tiles would not map to the epilogue's iteration space), a batched matmul with a
prologue, or a group no schedule fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.dtypes import element_size
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.ir.meta_weights import MetaWeight
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel, Leaf, TileProgram, leaf_elem, vector_steps
from tilecc.passes.graph_to_tile.elementwise.dag import ALIGN
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.matmul import BlockedMatmulKernel
from tilecc.passes.graph_to_tile.matmul_problem import b_operand, choose_schedule, problem_of, weight_of
from tilecc.passes.graph_to_tile.shapes import Operand, dense_attr, elem_of, shape_of
from tilecc.passes.schedule.matmul_schedule import MatmulProblem, MatmulSchedule
from tilecc.passes.vector_fns import elementwise_fn
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


@dataclass
class FusedPart:
    """One DAG of the group (epilogue or prologue) as a TileProgram's inputs."""

    ek: ElementwiseKernel
    root: int  # the value the kernel hands over: the accumulator leaf / the A rows
    values: list[SSAValue]  # graph values of the outputs, in ek.outputs order
    hoisted: list[int] = field(default_factory=list)  # leaves loaded once, full width
    per_tile: list[int] = field(default_factory=list)  # leaves loaded per tile, per set
    bias: SSAValue | None = None  # a bias row the matrix engine adds (`bias_row`), not the DAG

    def split_leaves(self, hoist: bool) -> None:
        """Leaves loaded once (`hoist`: those that do not vary along the rows) or per tile."""
        for i, v in enumerate(self.ek.values):
            if not isinstance(v, Leaf) or v.given is not None:
                continue
            if hoist and v.imap[-2] is None and all(m is None for m in v.imap[:-2]):
                self.hoisted.append(i)
            else:
                self.per_tile.append(i)

    def cost(self) -> tuple[float, int]:
        """(vector cost per element of the tile-sized steps, vector instructions)."""
        steps = vector_steps(self.ek.values, self.ek.lw.cfg)
        return sum(f for f, col in steps if not col), len(steps)


def lower_fused_matmul(lw: LoweringContext, group: FusedOp, mm: Operation, loc: str) -> bool:
    """`group` (its matmul `mm`) as one kernel; False (nothing emitted) where it does not fuse."""
    got = problem_of(lw, mm)
    if got is None:
        return False
    problem, (res, out_shape, a, b, M, K, N) = got
    if M == 1 or N == 1:
        return False
    y = group.block.last_op
    assert isinstance(y, YieldOp)
    ops = [o for o in group.block.ops if not isinstance(o, (YieldOp, g.ConstantOp))]
    pro_ops = ops[: ops.index(mm)]
    if pro_ops and len(out_shape) != 2:
        return False
    yielded = list(y.values)

    # epilogue: on the accumulator tile, over the output's space
    space = tuple(d for d in out_shape if d != 1)
    epi = epilogue_part(lw, group, mm, space, loc, bias_in_acc=True)

    # prologue: the A rows [M, K]
    pro = None
    if pro_ops:
        a_val = mm.operands[0]
        while isinstance(a_val.owner, g.ReshapeOp) and a_val.owner in pro_ops:
            a_val = a_val.owner.operands[0]
        ek = ElementwiseKernel(lw, "prologue", loc, (M, K))
        ref = {}
        _build(ek, lw, pro_ops, ref)
        pro_values = [v for v in yielded if v.owner in pro_ops]
        for v in pro_values:
            ek.output(ref[v], elem_of(v.type), value=v)
        ek.classify()
        pro = FusedPart(ek, ref[a_val], pro_values)
        pro.split_leaves(hoist=True)

    # rotary embeddings of the product's columns, applied in its evacuations (rope/epilogue.py)
    from tilecc.passes.graph_to_tile.rope import epilogue as rope_epi

    alone = len(out_shape) == 2 and not ops[ops.index(mm) + 1:]  # the product yielded, no epilogue
    rope = rope_epi.find(lw, group, mm, problem.TN, loc) if alone else None
    if rope is not None:
        epi = None  # the product alone: the evacuation's copy, then the rotation

    # the schedule, for the fused kernel
    fields: dict[str, Any] = epilogue_fields(epi, N) if epi is not None else \
        rope.fields(lw.cfg, M, N) if rope is not None else {}
    if epi is not None and epi.bias is not None:
        fields.update(bias_mm=True, fused_sram=fields["fused_sram"] + _align(N * problem.ia) + _align(problem.TM
                                                                                                        * problem.ia))
    if pro is not None:
        cost, n_ops = pro.cost()
        fields.update(prep_cost=cost, prep_ops=n_ops, fused_sram=fields.get("fused_sram", 0)
                      + TileProgram.sram_bytes(pro.ek, K, 2, {i: 2 for i in pro.per_tile}, [pro.root],
                                               frozenset({pro.root}))
                      + sum(_hoist_bytes(pro.ek, i, K) for i in pro.hoisted))
    fields["fused_ops"] = ";".join(f"{o.name.removeprefix('graph.')}:{o.results[0].type}" for o in ops)
    problem = dataclasses.replace(problem, **fields)
    sched = choose_schedule(lw, problem, lambda: group_alone(group))
    if sched is None:
        return False

    ea, eb, eo = elem_of(a.type), elem_of(b.type), elem_of(res.type)
    TM = problem.TM
    if pro is not None:  # the kernel's "A" argument: any [M, K] tensor; load_a_rows is ours
        A_val = pro.ek.leaf_of(pro.per_tile[0]).value if pro.per_tile else None
        if A_val is None:
            return False
        A = Operand(A_val, [0, 1])
    else:
        A = lw.aligned_batch(a, out_shape[:-2], (M, K))
    B = b_operand(lw, b, problem, sched, out_shape[:-2])
    ident = lw.hbm([TM, TM], ea, value=dense_attr(np.eye(TM, dtype=np.float32), ea, [TM, TM]))
    epi_outs = epilogue_outputs(lw, epi, space) if epi is not None else []
    pro_outs = [lw.view(o, (M, K)) for o in _outputs(lw, pro, (M, K))] if pro is not None else []
    if epi is not None:
        out = lw.view(epi_outs[0], out_shape)
    else:
        out = lw.output_buffer(res, eo)
    args = [A.value, B.value, ident, out]
    extra = []
    for part, outs in ((epi, epi_outs), (pro, pro_outs)):
        if part is None:
            continue
        extra += [part.ek.leaf_of(i).value for i in part.hoisted + part.per_tile]
        extra += outs
    if epi is not None and epi.bias is not None:  # the bias row and a ones row (its matmul's lhsT)
        extra += [lw.aligned(epi.bias, (M, N)).value,
                  lw.hbm([1, TM], ea, value=dense_attr(np.ones((1, TM), dtype=np.float32), ea, [1, TM]))]
    if rope is not None:
        extra += rope_epi.args(lw, rope, M)
    kb = KernelBuilder(lw.kernel_name("fused_matmul"), [v.type for v in args + extra], loc)
    kw: dict[str, Any] = dict(rank=len(out_shape), a_imap=A.imap, b_imap=B.imap, elems=(ea, eb, eo), epi=epi,
                              pro=pro, out_shape=out_shape)
    kernel = rope_epi.RopeMatmulKernel(kb, problem, sched, lw.cfg, rope=rope, **kw) if rope is not None else \
        FusedMatmulKernel(kb, problem, sched, lw.cfg, **kw)
    kernel.emit(out_shape[:-2])
    lw.launch(kb, args + extra)
    if epi is None:
        lw.values[res] = out
    if rope is not None:
        rope_epi.bind(lw, rope, out, loc)
    for part, outs in ((epi, epi_outs), (pro, pro_outs)):
        if part is None:
            continue
        for v, o in zip(part.values, outs, strict=True):
            lw.values[v] = lw.view(o, shape_of(v.type))
    return True


def epilogue_part(lw: LoweringContext, group: FusedOp, mm: Operation, space: tuple[int, ...], loc: str,
                  operand: Callable[[ElementwiseKernel, SSAValue], int | None] | None = None,
                  bias_in_acc: bool = False) -> FusedPart | None:
    """The group's epilogue (the ops after `mm` whose values it yields, or the product
    itself) as a DAG over `space` rooted at the accumulator tile; None without one (or
    where `operand`, which makes the leaf of each tensor operand the ops read from
    outside, gives None). With `bias_in_acc` a first op adding a bias row to the product
    (`bias_row`) is left to the kernel's matrix engine: the DAG reads its sum from the
    accumulator tile (`FusedPart.bias`)."""
    res = mm.results[0]
    y = group.block.last_op
    assert isinstance(y, YieldOp)
    ops = [o for o in group.block.ops if not isinstance(o, (YieldOp, g.ConstantOp))]
    epi_ops = ops[ops.index(mm) + 1:]
    epi_values = [v for v in y.values if v.owner in epi_ops or v is res]
    if not epi_values:
        return None
    ek = ElementwiseKernel(lw, "epilogue", loc, space)
    acc = ek.given_leaf(elem_of(res.type))
    ref: dict[SSAValue, int] = {res: acc}
    bias = bias_row(lw, mm, epi_ops, epi_values) if bias_in_acc else None
    if bias is not None:
        add = epi_ops.pop(0)
        ref[add.results[0]] = acc
        remarks.emit("lower-graph-to-tile", "passed",
                     "the bias row is added on the matrix engine (one K=1 matmul of a ones row per "
                     "accumulator block), not by the evacuation's vector ops", loc)
    if operand is not None:
        inside = {r for o in epi_ops for r in o.results} | {res}
        for v in [v for o in epi_ops for v in o.operands]:
            if v in inside or v in ref or v in lw.scalars or isinstance(v.owner, g.ConstantOp):
                continue
            leaf = operand(ek, v)
            if leaf is None:
                return None
            ref[v] = leaf
    _build(ek, lw, epi_ops, ref)
    for v in epi_values:
        out = ref[v]
        if out == acc:
            # the raw product is yielded (beside epilogue values, or after a
            # prologue): an explicit copy converts the fp32 accumulator tile (a DMA
            # cannot convert); it is the copy an evacuation makes anyway
            out = ek.unary("copy", acc, elem_of(v.type))
        ek.output(out, elem_of(v.type), value=v)
    ek.classify()
    epi = FusedPart(ek, acc, epi_values, bias=bias)
    epi.split_leaves(hoist=True)
    return epi


def bias_row(lw: LoweringContext, mm: Operation, epi_ops: list[Operation], epi_values: list[SSAValue]
             ) -> SSAValue | None:
    """The bias of an epilogue that starts ``product + bias``: `bias` a group input of
    the product's type whose every dimension but the last is 1 (a row, the same for
    every output row and batch index), the product read by nothing else. The kernel then
    adds it on the matrix engine (``acc += ones[1 x TM]^T @ bias[1 x TN]`` after the
    k-tiles): the vector engine's add, which reads two tiles per element (twice a
    copy's cost), becomes the evacuation's copy or the next op. None where it does not
    apply (the sum is rounded once, in fp32, as a bias epilogue of addmm is)."""
    res = mm.results[0]
    if not epi_ops or res in epi_values or len(list(res.uses)) != 1:
        return None
    add = epi_ops[0]
    if elementwise_fn(add) != ("binary", "add") or res not in add.operands or len(add.operands) != 2:
        return None
    other = add.operands[1] if add.operands[0] is res else add.operands[0]
    shape, out = shape_of(other.type), shape_of(res.type)
    inside = {r for o in epi_ops for r in o.results}
    if other in inside or other in lw.scalars or isinstance(other.owner, g.ConstantOp) or not shape:
        return None
    if shape[-1] != out[-1] or any(d != 1 for d in shape[:-1]) or len(shape) > len(out):
        return None
    if elem_of(other.type) != elem_of(mm.operands[0].type) or elem_of(add.results[0].type) != elem_of(res.type):
        return None  # the ones row and A share a dtype; the sum keeps the product's
    return other


def epilogue_fields(epi: FusedPart, N: int) -> dict[str, Any]:
    """The `MatmulProblem` fields of an epilogue: its vector work per evacuation and its
    SRAM, so the cost model weighs them and only schedules that fit are taken."""
    cost, n_ops = epi.cost()
    return dict(evac_cost=cost, evac_ops=n_ops, fused_sram_per_col=_sram_per_col(epi),
                fused_sram=sum(_hoist_bytes(epi.ek, i, N) for i in epi.hoisted))


def epilogue_outputs(lw: LoweringContext, epi: FusedPart, space: tuple[int, ...]) -> list[SSAValue]:
    """HBM tensors of the epilogue's outputs, viewed at `space`."""
    return [lw.view(o, space) for o in _outputs(lw, epi, space)]


def group_alone(group: FusedOp) -> g.GraphProgram:
    """A graph program computing only this group (its inputs as arguments)."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.ir import Block, Region

    # inputs that are weights stay weights (shapes only: the program is timed, not run),
    # so a matmul may store its B pre-tiled as in the whole program
    weights: dict = {}
    wops = [weight_of(v) for v in group.operands]  # (an mlp group's inner group: through its block)
    is_w = [w is not None for w in wops]
    types = [a.type for a, w in zip(group.block.args, is_w) if not w]
    block = Block(arg_types=types)
    args = iter(block.args)
    mapping: dict[SSAValue, SSAValue] = {}
    for a, wop_of, w in zip(group.block.args, wops, is_w):
        if w and wop_of is not None:
            name = wop_of.weight
            weights[name] = MetaWeight(tuple(shape_of(a.type)), np.dtype(np.float32))
            wop = g.WeightOp.make(name, a.type)  # pyright: ignore[reportArgumentType]
            block.add_op(wop)
            mapping[a] = wop.results[0]
        else:
            mapping[a] = next(args)
    for o in group.block.ops:
        if isinstance(o, YieldOp):
            block.add_op(func.ReturnOp(*[mapping[v] for v in o.values]))
            break
        clone = o.clone(value_mapper=mapping)
        block.add_op(clone)
        mapping.update(zip(o.results, clone.results))
    fn = func.FuncOp("forward", (types, [r.type for r in group.results]), Region(block))
    return g.GraphProgram(ModuleOp([fn]), weights, [f"in{i}" for i in range(len(types))],
                          [f"out{i}" for i in range(len(group.results))])


def _build(ek: ElementwiseKernel, lw: LoweringContext, ops: list[Operation], ref: dict[SSAValue, int]) -> None:
    """The nodes of `ops` in `ek` (`ref`: graph value -> node, given and collected)."""
    from tilecc.passes.graph_to_tile.fused import build_dag

    inside = {r for o in ops for r in o.results} | set(ref)
    args = {v: v for o in ops for v in o.operands if v not in inside}
    build_dag(ek, lw, ops, args, ref)


def _outputs(lw: LoweringContext, part: FusedPart, space: tuple[int, ...]) -> list[SSAValue]:
    """HBM tensors of a part's outputs (at the part's space; layouts consumers ask for)."""
    return [part.ek.out_buffer(v, elem, space) for (_, elem), v in zip(part.ek.outputs, part.values)]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _hoist_bytes(ek: ElementwiseKernel, i: int, width: int) -> int:
    """Bytes per partition of leaf `i` loaded once, `width` columns wide."""
    leaf = ek.values[i]
    assert isinstance(leaf, Leaf)
    cols = 1 if leaf.cls == "column" else width
    return -(-cols * element_size(leaf_elem(leaf)) // ALIGN) * ALIGN


def _sram_per_col(part: FusedPart) -> int:
    """An epilogue's SRAM per column of the chunk (per-tile leaves and outputs in two
    sets, temps), rounded up."""
    one = TileProgram.sram_bytes(part.ek, 64, 2, {i: 2 for i in part.per_tile}, [part.root],
                                 frozenset({part.root}))
    return -(-one // ALIGN) + 1


class FusedMatmulKernel(BlockedMatmulKernel):
    """The matmul kernel with the group's epilogue in `evacuate` and its prologue in
    `load_a_rows` (module docstring)."""

    def __init__(self, kb: KernelBuilder, p: MatmulProblem, s: MatmulSchedule, cfg: HardwareConfig, *,
                 epi: FusedPart | None, pro: FusedPart | None, out_shape: tuple[int, ...], front: int = 0,
                 **kw: Any) -> None:
        """`front`: kernel arguments after the matmul's own (A, B, [identity,] out) that a
        subclass takes before the parts' (the norm's operands of a decode GEMV)."""
        super().__init__(kb, p, s, cfg, **kw)
        self.epi, self.pro = epi, pro
        self.out_shape = out_shape
        args = list(kb.args[(3 if self.direct else 4) + front:])
        self.store_q = cfg.dma.queues - 1
        self.qa0 = s.qa[0]
        # operands loaded once go on the store queue, idle until the first evacuation:
        # the A queue's first job is the first m-tile's rows, the B queues' the weights
        free = [q for q in [self.store_q, *range(cfg.dma.queues)] if q != self.qa0 and q not in s.qb]
        self.hoist_q = free[0] if free else s.qb[-1]
        # operands loaded per output tile (a residual) go on the last B queue, not behind
        # the A rows (a whole m-tile, K wide, per preparation): the B queues carry one
        # chunk per chunk of compute and idle once a block's weights are in (gpt2 block
        # mlp c_proj alone on cloud: 134,928 -> 125,770 cycles; the block 628k -> 601k)
        self.epi_q = s.qb[-1]
        # the prologue's operands first (the first A rows need them), then the epilogue's;
        # kernel arguments come in the order epilogue, prologue
        n_epi = 0 if epi is None else len(epi.hoisted) + len(epi.per_tile) + len(epi.values)
        self.bias_buf = self.ones = None
        if epi is not None and epi.bias is not None:  # the bias row and the ones row, last
            bias_arg, ones_arg = args[-2:]
            del args[-2:]
            self.bias_buf = kb.alloc([1, p.N], self.ea, tile.SRAM, "bias_row")
            self.ones = kb.alloc([1, p.TM], self.ea, tile.SRAM, "ones")
            for arg, buf, cols in ((ones_arg, self.ones, p.TM), (bias_arg, self.bias_buf, p.N)):
                kb.add(tile.LoadOp(arg, [self.c(0), self.c(0)], buf, self.c(1), self.c(cols), 0, 1,
                                   queue=self.hoist_q))
        epi_args, pro_args = args[:n_epi], args[n_epi:]
        self.pro_tp = self._program(pro, p.K, p.K, pro_args, 2) if pro is not None else None
        # a streamed-weight GEMV's tiles are [TN, TNL / TN] of the output viewed [TN, N / TN]
        self.epi_cols = (self.TNL // p.TN, p.N // p.TN) if self.stream_b else (self.TNL, p.N)
        self.epi_tp = self._program(epi, *self.epi_cols, epi_args, 2) if epi is not None else None

    def _program(self, part: FusedPart, TC: int, width: int, args: list[SSAValue], D: int) -> TileProgram:
        """A part's TileProgram on this kernel's tiles; its hoisted leaves loaded now
        (`args`: the kernel arguments left, the part's taken from the front)."""
        kb, TM = self.kb, self.p.TM
        n_hoist = len(part.hoisted)
        leaf_args = args[: n_hoist + len(part.per_tile)]
        del args[: n_hoist + len(part.per_tile)]
        out_args = args[: len(part.values)]
        del args[: len(part.values)]
        tp = TileProgram(part.ek, kb, TM, TC, D, {i: D for i in part.per_tile}, TC, [part.root],
                         frozenset({part.root}))
        tp.bind({i: a for i, a in zip(part.hoisted + part.per_tile, leaf_args)}, out_args,
                [list(range(len(part.ek.shape)))] * len(out_args))
        # operands that do not vary along the rows: loaded once, full width
        part_bufs: dict[int, SSAValue] = {}
        for i, arg in zip(part.hoisted, leaf_args):
            leaf = part.ek.values[i]
            assert isinstance(leaf, Leaf)
            cols = 1 if leaf.cls == "column" else width
            buf = kb.alloc([TM, cols], leaf_elem(leaf), tile.SRAM, f"hoist{i}")
            ind = [self.c(0)] * len(shape_of(arg.type))
            col_dim = leaf.imap[-1] if leaf.imap[-1] is not None else -1
            # a row operand: one row for a direct kernel (its tiles read row 0 only), else
            # broadcast to every row; a streamed-weight GEMV's operands are whole tiles
            row_dim = leaf.imap[-2] if leaf.imap[-2] is not None else -1
            rows = TM if row_dim >= 0 or not self.direct else 1
            kb.add(tile.LoadOp(arg, ind, buf, self.c(rows), self.c(cols), row_dim, col_dim, queue=self.hoist_q))
            part_bufs[i] = buf
        tp.hoist_bufs = part_bufs
        return tp

    def _given(self, tp: TileProgram, part: FusedPart, col0: SSAValue, width: int) -> dict[int, SSAValue]:
        """Column windows at `col0` of the full-width operands (a static offset gets a
        window that ends at the buffer's end)."""
        given: dict[int, SSAValue] = {}
        for i, buf in tp.hoist_bufs.items():
            leaf = part.ek.values[i]
            assert isinstance(leaf, Leaf)
            if leaf.cls == "column":
                given[i] = buf
                continue
            total = shape_of(buf.type)[1]
            off = tile.const_index(col0)
            w = min(width, total) if off is None else min(width, total - off)
            given[i] = self.kb.add(tile.SubviewOp(buf, self.c(0), col0, [self.p.TM, w])).results[0]
        return given

    def _idx(self, m0: SSAValue, n0: SSAValue) -> list[SSAValue]:
        """The output index of the tile at (m0, n0): the batch loops' indices, then m0, n0."""
        batch = [self.ivs[d] for d in range(self.rank - 2) if self.out_shape[d] != 1]
        return [*batch, m0, n0]

    def tile_done(self, q: int, ms: int, n0: Any, cols: list[int]) -> None:
        """The bias row into accumulator `q` (`bias_row`): per TN-column block, a K=1 matmul
        of the ones row by the bias row's columns."""
        if self.bias_buf is None or self.ones is None:
            return
        for t, ns in enumerate(cols):
            rhs = self.window(self.bias_buf, n0 + t * self.p.TN, [1, ns])
            self.kb.add(tile.MatmulOp(self.ones, rhs, self.acc_win[q][t], self.c(ms), self.c(1), self.c(ns),
                                      self.true))

    def evacuate(self, acc: SSAValue, parity: int, m0: SSAValue, n0: SSAValue, ms: int, ns: int) -> None:
        if self.epi_tp is None:
            super().evacuate(acc, parity, m0, n0, ms, ns)
            return
        tp, part = self.epi_tp, self.epi
        assert part is not None
        idx = self._idx(m0, n0)
        r, c = self.c(ms), self.c(ns)
        for i in part.per_tile:
            tp.load(i, idx, r, c, parity, queue=self.epi_q)
        tnl, n = self.epi_cols
        given = self._given(tp, part, n0, tnl if n >= tnl else n)
        given[part.root] = acc
        tp.compute(r, c, parity, given)
        tp.store(idx, r, c, parity, queue=self.store_q, given=given)

    def loads_a_rows(self) -> bool:
        return self.pro_tp is None

    def load_a_rows(self, dst: SSAValue, m0: SSAValue, k0: SSAValue, ms: int, cols: int, queue: int) -> None:
        if self.pro_tp is None:
            super().load_a_rows(dst, m0, k0, ms, cols, queue)
            return
        tp, part = self.pro_tp, self.pro
        assert part is not None
        s = self.a_nat.index(dst)
        idx = [m0, k0]
        r, c = self.c(ms), self.c(cols)
        for i in part.per_tile:
            tp.load(i, idx, r, c, s, queue=queue)

        def produce() -> None:
            given = self._given(tp, part, k0, self.p.K)
            given[part.root] = dst
            tp.compute(r, c, s, given)
            tp.store(idx, r, c, s, queue=self.store_q, given=given)

        self.defer(produce)


__all__ = ["FusedMatmulKernel", "FusedPart", "epilogue_fields", "epilogue_outputs", "epilogue_part",
           "lower_fused_matmul"]
