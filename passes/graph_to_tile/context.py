"""lower-graph-to-tile: one tile kernel per graph op, tiled to the target's memories.

Before (graph)::

    func.func @forward(%x: tensor<37x53xf32>) -> tensor<37x53xf32> {
      %y = graph.relu %x : tensor<37x53xf32>
      func.return %y : tensor<37x53xf32>
    }

After (tile; `tiny`: 16 partitions)::

    func.func @k0_relu(%x: memref<37x53xf32>, %out: memref<37x53xf32>) attributes {tile.kernel} {
      scf.for %i = %c0 to %c3 step %c1 {          // row tiles of 16, the last one 5 rows
        %r = arith.minsi %c16, %rem : index
        scf.for %j = ... {                          // column tiles
          tile.load %x[%r0, %c0] into %in sizes(%r, %c) ...
          tile.unary "relu" %in into %out_buf sizes(%r, %c) ...
          tile.store %out_buf into %out[%r0, %c0] sizes(%r, %c) ...
    }}}
    func.func @main() -> memref<37x53xf32> {
      %x = tile.hbm_alloc {input = 0 : i64} : memref<37x53xf32>
      %y = tile.hbm_alloc : memref<37x53xf32>
      func.call @k0_relu(%x, %y) : (...) -> ()
      func.return %y : memref<37x53xf32>
    }

Tile shapes come from the hardware config: rows to SRAM partitions, matmul tiles to
the systolic array (K <= rows, N <= columns) and the accumulator, columns to what fits
in a partition. Any size works: edge tiles get `min(tile, extent - start)` sizes.
Reshapes become `tile.view` (free); layout changes (permute, expand) are strided DMA
copies. The program's weights and inputs become `tile.hbm_alloc` with `weight` / `input`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float16Type,
    Float32Type,
    MemRefType,
    ModuleOp,
    NoneAttr,
    StridedLayoutAttr,
    TensorType,
    f32,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass

from tilecc.errors import CompileError, TensorTooLargeError
from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.graph_fusion import FusedOp
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.simulator.config import HardwareConfig, load_config

UNARY = {
    g.ReluOp: "relu",
    g.ExpOp: "exp",
    g.TanhOp: "tanh",
    g.SigmoidOp: "sigmoid",
    g.NegOp: "neg",
    g.RsqrtOp: "rsqrt",
    g.SqrtOp: "sqrt",
    g.SiluOp: "silu",
}
BINARY = {g.AddOp: "add", g.SubOp: "sub", g.MulOp: "mul", g.DivOp: "div", g.MaximumOp: "max"}

IndexMap = list[int | None]  # output dim -> operand dim (None: broadcast)


def shape_of(t: Attribute) -> tuple[int, ...]:
    assert isinstance(t, (TensorType, MemRefType))
    return tuple(t.get_shape())


def elem_of(t: Attribute) -> Attribute:
    assert isinstance(t, (TensorType, MemRefType))
    return t.element_type


def _itemsize(elem: Attribute) -> int:
    return 4 if isinstance(elem, Float32Type) else 2


@dataclass
class Operand:
    value: SSAValue  # HBM memref in @main
    imap: IndexMap


class GraphToTile:
    def __init__(self, cfg: HardwareConfig, opt_level: int = 2, matmul_policy: Callable | None = None):
        self.cfg = cfg
        self.opt_level = opt_level  # 0: baseline kernels (fixed tiles, single buffering)
        # problem -> schedule for the -O2 matmul kernels (autotuning), else the cost model's
        self.matmul_policy = matmul_policy
        self.P = cfg.sram.partitions
        self.kernels: list[func.FuncOp] = []
        self.main_ops: list[Operation] = []
        self.values: dict[SSAValue, SSAValue] = {}
        self.scalars: dict[SSAValue, float] = {}
        # store-side layout absorption: a result whose only user is a permute keeping
        # the innermost dim may be written straight into the permute's (dense) buffer
        # through a strided view (`output_buffer`); `absorbed` records where it was
        self.layout_requests: dict[SSAValue, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.absorbed: dict[SSAValue, SSAValue] = {}
        from tilecc.passes.graph_to_tile import dsl_call as lower_dsl_call
        from tilecc.passes.graph_to_tile import index as lower_index
        from tilecc.passes.graph_to_tile import nn as lower_nn

        # op families lowered in their own files: op class -> fn(lowering, op, loc)
        self.extra = {**lower_nn.LOWERINGS, **lower_index.LOWERINGS, **lower_dsl_call.LOWERINGS}
        self.lowering: Operation | None = None  # the graph op being lowered (for remarks)

    # ---- @main helpers -------------------------------------------------------------
    def emit(self, op: Operation) -> Operation:
        self.main_ops.append(op)
        if self.lowering is not None and g.LOC_ATTR not in op.attributes:
            g.set_loc(op, g.source_loc(self.lowering))
        return op

    def hbm(self, shape: Sequence[int], elem: Attribute, **kw) -> SSAValue:
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
        assert isinstance(t, MemRefType)
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
        src = self.strided(v, full, _padded(strides, len(full)), offset)
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
        innermost dim (its rows stay contiguous)."""
        if len(op.results) != 1 or not op.results[0].has_one_use():
            return
        res = op.results[0]
        user = res.get_user_of_unique_use()
        if not isinstance(user, g.PermuteOp):
            return
        perm = [int(p) for p in user.properties["perm"].get_values()]
        if len(perm) < 2 or perm[-1] != len(perm) - 1:
            return
        out_shape = shape_of(user.results[0].type)
        strides = tile.row_major(out_shape)
        inv = [0] * len(perm)
        for i, p in enumerate(perm):
            inv[p] = i
        self.layout_requests[res] = (out_shape, tuple(strides[inv[d]] for d in range(len(perm))))

    def kernel_name(self, what: str) -> str:
        return f"k{len(self.kernels)}_{what}"

    # ---- the walk ------------------------------------------------------------------
    def run(self, module: ModuleOp) -> None:
        forward = next(
            (op for op in module.ops if isinstance(op, func.FuncOp) and op.sym_name.data == "forward"),
            None,
        )
        if forward is None:
            raise CompileError("lower-graph-to-tile: the module has no func.func @forward")
        for i, arg in enumerate(forward.body.block.args):
            self.values[arg] = self.hbm(shape_of(arg.type), elem_of(arg.type), input=i)
        outputs: list[SSAValue] = []
        # a snapshot: a lowering may fuse later ops into its kernel (erasing them) or lower
        # a later weight / constant ahead of time; both are skipped here
        for op in list(forward.body.block.ops):
            if op.parent is None or (
                op.results and (op.results[0] in self.values or op.results[0] in self.scalars)
            ):
                continue
            if isinstance(op, func.ReturnOp):
                outputs = [self.dense(self.materialise(v)) for v in op.arguments]
                continue
            self.request_layout(op)
            self.lower(op)
            if op.results:
                self.layout_requests.pop(op.results[0], None)
        out_types = [v.type for v in outputs]
        main = func.FuncOp("main", ([], out_types))
        for op in self.main_ops:
            main.body.block.add_op(op)
        main.body.block.add_op(func.ReturnOp(*outputs))
        forward.detach()
        forward.erase()
        for k in self.kernels:
            module.body.block.add_op(k)
        module.body.block.add_op(main)

    def materialise(self, v: SSAValue) -> SSAValue:
        if v in self.values:
            return self.values[v]
        assert v in self.scalars
        shape, elem = shape_of(v.type), elem_of(v.type)
        data = np.full(shape, self.scalars[v], dtype=np.float32)
        out = self.hbm(shape, elem, value=dense_attr(data, elem, shape))
        self.values[v] = out
        return out

    def lower(self, op: Operation) -> None:
        saved, self.lowering = self.lowering, op
        try:
            with remarks.at(g.source_loc(op)):
                self._lower(op)
        finally:
            self.lowering = saved

    def _lower(self, op: Operation) -> None:
        loc = g.source_loc(op)
        res = op.results[0] if op.results else None
        if isinstance(op, g.WeightOp):
            self.values[res] = self.hbm(shape_of(res.type), elem_of(res.type), weight=op.properties["name"].data)
        elif isinstance(op, g.ConstantOp):
            data = _dense_values(op)
            if data.size >= 1 and np.all(data == data.reshape(-1)[0]):  # a splat: an immediate
                self.scalars[res] = float(data.reshape(-1)[0])
            else:
                self.values[res] = self.hbm(
                    shape_of(res.type), elem_of(res.type), value=op.properties["value"]
                )
        elif isinstance(op, g.ReshapeOp):
            self.values[res] = self.view(self.materialise(op.operands[0]), shape_of(res.type))
        elif type(op) in UNARY:
            self.lower_unary(op, UNARY[type(op)], loc)
        elif isinstance(op, g.GeluOp):
            approx = op.properties["approximate"].data
            self.lower_unary(op, "gelu" if approx == "none" else "gelu_tanh", loc)
        elif isinstance(op, g.CastOp):
            self.lower_unary(op, "copy", loc)
        elif type(op) in BINARY:
            self.lower_binary(op, BINARY[type(op)], loc)
        elif isinstance(op, g.ExpandOp):
            self.lower_expand(op)
        elif isinstance(op, g.PermuteOp):
            self.lower_permute(op, loc)
        elif isinstance(op, g.MatmulOp):
            from tilecc.passes.graph_to_tile.matmul import lower_matmul_blocked

            if not (self.opt_level >= 2 and lower_matmul_blocked(self, op, loc)):
                self.lower_matmul(op, loc)
        elif isinstance(op, g.SoftmaxOp):
            self.lower_softmax(op, loc)
        elif isinstance(op, g.LayerNormOp):
            self.lower_layer_norm(op, loc)
        elif isinstance(op, FusedOp):
            from tilecc.passes.graph_to_tile.fused import lower_fused

            lower_fused(self, op, loc)
        elif type(op) in self.extra:
            self.extra[type(op)](self, op, loc)
        else:
            raise CompileError(f"lower-graph-to-tile: no lowering for {op.name} at {loc}")

    # ---- elementwise family --------------------------------------------------------
    def aligned(self, v: SSAValue, out_shape: Sequence[int]) -> Operand:
        """The operand viewed at the output's rank, with its broadcast index map."""
        src = self.materialise(v)
        shape = shape_of(src.type)
        rank = len(out_shape)
        full = (1,) * (rank - len(shape)) + shape
        src = self.view(src, full)
        imap: IndexMap = [d if full[d] == out_shape[d] else None for d in range(rank)]
        return Operand(src, imap)

    def out_shape2(self, shape: Sequence[int]) -> tuple[int, ...]:
        return (1,) * (2 - len(shape)) + tuple(shape) if len(shape) < 2 else tuple(shape)

    def col_tile(self, cols: int, n_bufs: int) -> int:
        budget = self.cfg.sram.bytes_per_partition // (2 * 4 * max(n_bufs, 1))
        return max(1, min(cols, budget, 2048))

    def outer_loops(self, kb: KernelBuilder, extents: Sequence[int], ivs: list[SSAValue], body) -> None:
        if not extents:
            body()
            return
        with kb.loop(extents[0]) as i:
            ivs.append(i)
            self.outer_loops(kb, extents[1:], ivs, body)

    def lower_unary(self, op: Operation, fn: str, loc: str, what: str | None = None) -> None:
        from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

        res = op.results[0]
        ek = ElementwiseKernel(self, what or fn, loc, shape_of(res.type))
        self.finish_elementwise(ek, res, ek.unary(fn, ek.leaf(op.operands[0]), elem_of(res.type)))

    def finish_elementwise(self, ek, res: SSAValue, ref: int) -> None:
        """`res` = value `ref` of `ek`: a scalar when it folded to a constant, else the
        kernel's output."""
        value = ek.constant(ref)
        if value is not None:
            self.scalars[res] = value
            return
        ek.output(ref, elem_of(res.type), value=res)
        self.values[res] = ek.build()[0]

    def lower_binary(self, op: Operation, fn: str, loc: str) -> None:
        from tilecc.passes.graph_to_tile.elementwise import ElementwiseKernel

        res = op.results[0]
        ek = ElementwiseKernel(self, fn, loc, shape_of(res.type))
        self.finish_elementwise(ek, res, ek.binary(fn, ek.leaf(op.operands[0]), ek.leaf(op.operands[1]), elem_of(res.type)))

    def lower_expand(self, op: Operation) -> None:
        """A broadcast view: stride 0 along the expanded dimensions."""
        res = op.results[0]
        src = self.materialise(op.operands[0])
        out_shape = shape_of(res.type)
        shape = shape_of(src.type)
        strides, offset = self.layout(src)
        lead = len(out_shape) - len(shape)
        new = [0] * lead + [0 if n == 1 and m != 1 else s for n, m, s in zip(shape, out_shape[lead:], strides)]
        self.values[res] = self.strided(src, out_shape, new, offset)

    def lower_permute(self, op: Operation, loc: str) -> None:
        """A view when the innermost dimension stays innermost (DMAs still read long
        rows), else a transposing copy."""
        res = op.results[0]
        perm = [int(p) for p in op.properties["perm"].get_values()]
        if op.operands[0] in self.absorbed:  # the producer wrote this permute's layout
            self.values[res] = self.absorbed[op.operands[0]]
            return
        src = self.materialise(op.operands[0])
        out_shape = shape_of(res.type)
        if len(out_shape) < 2 or perm[-1] == len(perm) - 1:
            strides, offset = self.layout(src)
            self.values[res] = self.strided(src, out_shape, [strides[p] for p in perm], offset)
            return
        self.values[res] = self.permuted(src, perm, loc)

    # ---- matmul --------------------------------------------------------------------
    def lower_matmul(self, op: Operation, loc: str) -> None:
        dims = matmul_dims(op)
        if dims is None:
            raise CompileError(f"graph.matmul at {loc}: rank-1 operands are not supported yet")
        res, out_shape, a, b, M, K, N = dims
        rank = len(out_shape)
        A = self.aligned_batch(a, out_shape[:-2], (M, K))
        B = self.aligned_batch(b, out_shape[:-2], (K, N))
        out = self.hbm(out_shape, elem_of(res.type))
        cfg = self.cfg
        TM = min(cfg.accumulator.partitions, self.P, M)
        TK = min(cfg.matrix.rows, K)
        TN = min(cfg.matrix.cols, cfg.accumulator.bytes_per_partition // 4, N)
        kb = KernelBuilder(self.kernel_name("matmul"), [A.value.type, B.value.type, out.type], loc)
        ivs: list[SSAValue] = []

        def body() -> None:
            zero = kb.const(0)

            def batch_idx(o: Operand) -> list[SSAValue]:
                return [ivs[d] if o.imap[d] is not None else zero for d in range(rank - 2)]

            with kb.tiles(M, TM) as (m0, m), kb.tiles(N, TN) as (n0, n):
                acc = kb.alloc([TM, TN], f32, tile.ACC, "acc")
                with kb.tiles(K, TK) as (k0, k):
                    lhsT = kb.alloc([TK, TM], elem_of(a.type), tile.SRAM, "lhsT")
                    kb.add(tile.LoadOp(kb.args[0], [*batch_idx(A), m0, k0], lhsT, k, m, rank - 1, rank - 2))
                    rhs = kb.alloc([TK, TN], elem_of(b.type), tile.SRAM, "rhs")
                    kb.add(tile.LoadOp(kb.args[1], [*batch_idx(B), k0, n0], rhs, k, n, rank - 2, rank - 1))
                    kb.add(tile.MatmulOp(lhsT, rhs, acc, m, k, n, kb.ne_zero(k0)))
                ob = kb.alloc([TM, TN], elem_of(res.type), tile.SRAM, "out")
                kb.add(tile.UnaryOp("copy", acc, ob, m, n))
                kb.add(tile.StoreOp(ob, kb.args[2], [*ivs, m0, n0], m, n, rank - 2, rank - 1))

        self.outer_loops(kb, out_shape[:-2], ivs, body)
        self.launch(kb, [A.value, B.value, out])
        self.values[res] = out

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
        src = self.materialise(v) if src is None else src
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

    def lower_softmax(self, op: Operation, loc: str) -> None:
        """Softmax along the last dim (any other dim: moved last by a transposing copy
        and back): one row-wise kernel."""
        res = op.results[0]
        shape = shape_of(res.type)
        dim = op.properties["dim"].value.data
        src = self.materialise(op.operands[0])
        perm = list(range(len(shape)))
        if shape and dim != len(shape) - 1:
            perm = [d for d in perm if d != dim] + [dim]
            src = self.permuted(src, perm, loc)
        x, R, C = self.rows_view(None, loc, "graph.softmax", src=src)
        out = self.rowwise_kernel("softmax", loc, x, R, C, elem_of(res.type))
        if perm != sorted(perm):
            moved = [shape[d] for d in perm]
            self.values[res] = self.permuted(self.view(out, moved), list(np.argsort(perm)), loc)
        else:
            self.values[res] = self.view(out, shape)

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

    def lower_layer_norm(self, op: Operation, loc: str) -> None:
        res = op.results[0]
        nd = op.properties["normalized_ndim"].value.data
        eps = op.properties["eps"].value.data
        x, R, C = self.rows_view(op.operands[0], loc, "graph.layer_norm", row_ndim=nd)
        w = self.view(self.materialise(op.operands[1]), (1, C))
        b = self.view(self.materialise(op.operands[2]), (1, C))
        out = self.rowwise_kernel("layer_norm", loc, x, R, C, elem_of(res.type), (w, b), float(eps))
        self.values[res] = self.view(out, shape_of(res.type))


def collapse(
    out_shape: Sequence[int], operands: list[Operand], view: Callable[[SSAValue, Sequence[int]], SSAValue],
    layout: Callable[[SSAValue], tuple[tuple[int, ...], int]], keep_last: bool = False,
) -> tuple[tuple[int, ...], list[Operand]]:
    """Merge adjacent output dims that every operand maps to adjacent dims of its own (in
    order, with strides that merge: a strided view's dims merge only where one walks the
    other's extent) or broadcasts; the operands become views of the merged shape.
    `keep_last` keeps the last dim on its own."""
    rank = len(out_shape)
    for o in operands:  # aligned operands (imap d or None) or permutations only
        if len(shape_of(o.value.type)) != rank or not (
            all(m is None or m == d for d, m in enumerate(o.imap))
            or (None not in o.imap and sorted(o.imap) == list(range(rank)))  # type: ignore[type-var]
        ):
            return tuple(out_shape), operands
    groups = [[0]]
    for d in range(1, rank):
        p = groups[-1][-1]
        if keep_last and d == rank - 1:
            groups.append([d])
        elif all((o.imap[p] is None and o.imap[d] is None)
               or (o.imap[p] is not None and o.imap[d] == o.imap[p] + 1 and _merges(o, o.imap[p], layout))
               for o in operands):
            groups[-1].append(d)
        else:
            groups.append([d])
    if len(groups) == rank:
        return tuple(out_shape), operands
    lead = [[]] if len(groups) < 2 else []  # keep rank 2: a leading unit dim
    shape = tuple([1] * len(lead) + [int(np.prod([out_shape[d] for d in g])) for g in groups])
    new_ops = []
    for o in operands:
        oshape = shape_of(o.value.type)
        # operand dims of each output group (a broadcast group: the operand's own unit dims)
        odims = [[d if o.imap[d] is None else o.imap[d] for d in g] for g in groups]
        order = sorted(range(len(groups)), key=lambda i: odims[i][0])
        vshape = [1] * len(lead) + [int(np.prod([oshape[d] for d in odims[i]])) for i in order]
        imap: IndexMap = [None] * len(lead) + [
            None if o.imap[g[0]] is None else len(lead) + order.index(i) for i, g in enumerate(groups)
        ]
        new_ops.append(Operand(view(o.value, vshape), imap))
    return shape, new_ops


def reshape_strides(
    old_shape: Sequence[int], old_strides: Sequence[int], new_shape: Sequence[int]
) -> list[int] | None:
    """Strides that view a tensor of `old_shape`/`old_strides` as `new_shape` without
    moving data, or None when no such strides exist (torch's `computeStride`)."""
    if int(np.prod(old_shape, dtype=np.int64)) == 0 or not len(old_shape):
        return list(tile.row_major(new_shape))
    new = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * chunk):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new[view_d] = view_numel * chunk
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk = old_strides[d - 1]
                tensor_numel = view_numel = 1
    return new if view_d == -1 else None


def _padded(strides: Sequence[int], rank: int) -> list[int]:
    """Strides for leading unit dimensions added to reach `rank`."""
    return [0] * (rank - len(strides)) + list(strides)


def _merges(o: Operand, d: int, layout: Callable[[SSAValue], tuple[tuple[int, ...], int]]) -> bool:
    """Whether operand dims d and d+1 of `o` form one dimension in memory."""
    strides, _ = layout(o.value)
    shape = shape_of(o.value.type)
    return shape[d + 1] == 1 or shape[d] == 1 or strides[d] == strides[d + 1] * shape[d + 1]


def _dense_values(op: Operation) -> np.ndarray:
    attr = op.properties["value"]
    assert isinstance(attr, DenseIntOrFPElementsAttr)
    return np.asarray(attr.get_values(), dtype=np.float32)


def matmul_dims(op: Operation):
    """(result, output shape, a, b, M, K, N) of a graph.matmul; None for rank-1 operands."""
    res = op.results[0]
    a, b = op.operands
    a_shape, b_shape = shape_of(a.type), shape_of(b.type)
    if len(a_shape) < 2 or len(b_shape) < 2:
        return None
    return res, shape_of(res.type), a, b, a_shape[-2], a_shape[-1], b_shape[-1]


def dense_attr(data: np.ndarray, elem: Attribute, shape: Sequence[int]) -> DenseIntOrFPElementsAttr:
    values = data.reshape(-1)
    if not isinstance(elem, (Float32Type, BFloat16Type, Float16Type)):  # i32 constants
        values = values.astype(np.int64)
    return DenseIntOrFPElementsAttr.from_list(TensorType(elem, list(shape)), values.tolist())


@dataclass(frozen=True)
class LowerGraphToTilePass(ModulePass):
    name = "lower-graph-to-tile"
    target: str = "tiny"
    opt_level: int = 2

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        GraphToTile(load_config(self.target), self.opt_level).run(op)


def _kernel_remark(kernel: func.FuncOp, op: Operation | None) -> str:
    """``kernel k3_fused_matmul for graph.fused "matmul" (matmul, add, gelu): 3 loops, 42 tile ops``."""
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
