"""Reorder the tile ops of each straight-line block of a DSL kernel for the engines.

The NPU's engines run their queues in order, and `npu-insert-sync` orders two
instructions only when they touch a common buffer; so the order tile ops are emitted in
is each engine's schedule. Written as the kernel author wrote it, a multi-buffered
loop body (copies with buffers of their own) still runs copy after copy: copy 1's
matmul waits in the matrix queue behind copy 0's last matmul, which waits for copy 0's
vector work. This pass list-schedules each block (the body of every ``scf.for`` and the
kernel's top level, never across a loop): an op may move ahead of any op it shares no
buffer (or HBM tensor) with, as `npu-insert-sync` will see it; among the ready ops the
one that can start first on its engine goes next (ties: the longest path to the end of
the block), with each engine's time estimated from the target's timing figures.

Example (one body, two copies; M: matrix, V: vector)::

    before: M s0 = q@k0 ; V p0 = exp(s0) ; M o += p0@v0 ; M s1 = q@k1 ; V p1 = exp(s1) ; ...
    after:  M s0 ; M s1 ; V p0 ; V p1 ; M o += p0@v0 ; ...
"""

from __future__ import annotations

from xdsl.dialects import func, scf
from xdsl.ir import Block, Operation, SSAValue

from tilecc.ir import tile
from tilecc.simulator.config import HardwareConfig

ITEM = {"f32": 4, "bf16": 2, "f16": 2}


def _root(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, (tile.SubviewOp, tile.ViewOp)):
        v = v.owner.source
    return v


def _access(op: Operation) -> tuple[set[SSAValue], set[SSAValue]]:
    """(reads, writes): the root buffers / HBM tensors of a tile op."""
    if isinstance(op, tile.LoadOp):
        return {_root(op.src)}, {_root(op.dst)}
    if isinstance(op, tile.StoreOp):
        return {_root(op.src)}, {_root(op.dst)}
    if isinstance(op, tile.MatmulOp):
        acc = _root(op.acc)
        return {_root(op.lhsT), _root(op.rhs), acc}, {acc}
    if isinstance(op, tile.BinaryOp):
        return {_root(op.lhs), _root(op.rhs)}, {_root(op.output)}
    if isinstance(op, (tile.UnaryOp, tile.ScalarOp, tile.ReduceOp)):
        return {_root(op.input)}, {_root(op.output)}
    return set(), set()


def _const(v: SSAValue) -> int:
    c = tile._const_index(v)
    return c if c is not None else 128


class _Cost:
    def __init__(self, cfg: HardwareConfig):
        self.cfg = cfg

    def engine(self, op: Operation) -> str | None:
        if isinstance(op, (tile.LoadOp, tile.StoreOp)):
            return "dma"
        if isinstance(op, tile.MatmulOp):
            return "pe"
        if isinstance(op, (tile.UnaryOp, tile.BinaryOp, tile.ScalarOp, tile.ReduceOp)):
            return "vec"
        return None

    def op_cost(self, op: Operation) -> float:
        """Cycles per group of `lanes` elements (`[vector.op_cost]`, as the simulator)."""
        table = self.cfg.vector.op_cost
        if isinstance(op, tile.UnaryOp):
            return table.unary.get(op.fn.data, 1)
        if isinstance(op, tile.ReduceOp):
            return table.reduce.get(op.fn.data, 1)
        if isinstance(op, (tile.BinaryOp, tile.ScalarOp)):
            return table.binary.get(op.fn.data, 1)
        return 1

    def cycles(self, op: Operation) -> float:
        cfg = self.cfg
        if isinstance(op, (tile.LoadOp, tile.StoreOp)):
            nbytes = _const(op.rows) * _const(op.cols) * 4
            return cfg.dma.latency_cycles + nbytes / cfg.hbm.bytes_per_cycle
        if isinstance(op, tile.MatmulOp):
            return max(_const(op.m), cfg.matrix.min_interval_cycles) + cfg.matrix.rows
        if self.engine(op) == "vec":
            v = cfg.vector
            n = _const(op.rows) * _const(op.cols)
            two = isinstance(op, tile.BinaryOp) and op.rhs_mode.data == "tile"
            return v.latency_cycles + v.access_cycles + -(-n // v.lanes) * self.op_cost(op) * (2 if two else 1)
        return 0.0


def schedule_kernel(kernel: func.FuncOp, cfg: HardwareConfig, slack: float = 0.0) -> None:
    """List-schedule every straight-line block of `kernel`. With `slack` > 0 the op with
    the longest path to the block's end goes first among the ready ops that can start
    within `slack` cycles of the earliest (0: the earliest start goes first)."""
    cost = _Cost(cfg)
    blocks: list[Block] = [kernel.body.block]
    for op in kernel.walk():
        if isinstance(op, scf.ForOp):
            blocks.append(op.body.block)
    for b in blocks:
        _schedule_block(b, cost, slack)


def largest_block(kernel: func.FuncOp) -> int:
    """Ops in the kernel's longest straight-line block (where scheduling choices matter)."""
    blocks = [kernel.body.block] + [op.body.block for op in kernel.walk() if isinstance(op, scf.ForOp)]
    return max(len(b.ops) for b in blocks)


def _schedule_block(block: Block, cost: _Cost, slack: float) -> None:
    ops = list(block.ops)
    # only the run of ops between loops (and before the terminator) moves
    segment: list[Operation] = []
    for op in ops:
        if isinstance(op, (scf.ForOp, scf.YieldOp, func.ReturnOp)) or isinstance(op, tile.AllocOp):
            _reorder(block, segment, cost, op, slack)
            segment = []
        else:
            segment.append(op)
    _reorder(block, segment, cost, None, slack)


def _reorder(block: Block, seg: list[Operation], cost: _Cost, anchor: Operation | None, slack: float) -> None:
    if len(seg) < 3:
        return
    index = {op: i for i, op in enumerate(seg)}
    preds: list[set[int]] = [set() for _ in seg]
    last_write: dict[SSAValue, int] = {}
    reads_since: dict[SSAValue, list[int]] = {}
    for i, op in enumerate(seg):
        for v in op.operands:
            j = index.get(v.owner) if isinstance(v.owner, Operation) else None
            if j is not None:
                preds[i].add(j)
        reads, writes = _access(op)
        for r in reads:
            if r in last_write:
                preds[i].add(last_write[r])
        for w in writes:
            if w in last_write:
                preds[i].add(last_write[w])
            preds[i].update(reads_since.get(w, ()))
        for r in reads:
            reads_since.setdefault(r, []).append(i)
        for w in writes:
            last_write[w] = i
            reads_since[w] = []
    preds = [{p for p in ps if p != i} for i, ps in enumerate(preds)]
    succs: list[list[int]] = [[] for _ in seg]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    dur = [cost.cycles(op) for op in seg]
    eng = [cost.engine(op) for op in seg]
    prio = [0.0] * len(seg)
    for i in reversed(range(len(seg))):
        prio[i] = dur[i] + max((prio[s] for s in succs[i]), default=0.0)
    dma_queues = max(1, cost.cfg.dma.queues)
    free: dict[str, list[float]] = {"dma": [0.0] * dma_queues, "pe": [0.0], "vec": [0.0]}
    finish = [0.0] * len(seg)
    waiting = [len(ps) for ps in preds]
    ready = [i for i in range(len(seg)) if waiting[i] == 0]
    order: list[int] = []
    while ready:
        starts = {}
        for i in ready:
            dep = max((finish[p] for p in preds[i]), default=0.0)
            starts[i] = dep if eng[i] is None else max(dep, min(free[eng[i]]))
        first = min(starts.values())
        best = min((i for i in ready if starts[i] <= first + slack), key=lambda i: (-prio[i], starts[i], i)) if slack \
            else min(ready, key=lambda i: (starts[i], -prio[i], i))
        ready.remove(best)
        start = starts[best]
        finish[best] = start + dur[best]
        if eng[best] is not None:
            lanes = free[eng[best]]
            k = min(range(len(lanes)), key=lambda q: lanes[q])
            lanes[k] = finish[best]
        order.append(best)
        for s in succs[best]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    assert len(order) == len(seg)
    for op in seg:
        op.detach()
    for i in order:
        if anchor is None:
            block.add_op(seg[i])
        else:
            block.insert_op_before(seg[i], anchor)


__all__ = ["schedule_kernel", "largest_block"]
