"""Reorder the tile ops of each straight-line block of a DSL kernel for the engines.

The NPU's engines run their queues in order, and `npu-insert-sync` orders two
instructions only when they touch a common buffer; so the order tile ops are emitted in
is each engine's schedule. Written as the kernel author wrote it, a multi-buffered
loop body (copies with buffers of their own) still runs copy after copy: copy 1's
matmul waits in the matrix queue behind copy 0's last matmul, which waits for copy 0's
vector work. This pass list-schedules each block (the body of every ``scf.for`` and the
kernel's top level, never across a loop): an op may move ahead of any op it shares no
buffer (or HBM tensor) with, as `npu-insert-sync` will see it; among the ready ops the
one that can start first on its engine goes next (within a `slack`, the one with the
highest priority: its longest path to the block's end, the busiest engine's ops
weighted up).

Start times are estimated with the simulator's own timing rules (`simulator.timing`),
so that a straight-line kernel's estimate is its simulated time:

- each op takes its engine for its *occupancy* and has its result after its *latency*:
  a pipelined matmul frees the array after streaming (its successor's preload
  overlaps it) while its result drains; vector ops and DMAs take both for the same time;
- DMAs pay the fixed cost (`dma.latency_cycles + hbm.latency_cycles` + descriptors),
  then transfer at their rate alone (`TimingRules.dma_rate`: the engines the tile's
  rows span, short-chunk-derated, at most the HBM peak), sharing the engines and HBM
  with the transfers in flight as the simulator does (each at ``1 /
  TimingRules.dma_slowdown`` of its alone rate: a new transfer also delays those it
  overlaps); at the top level each DMA goes on the queue the estimate put it on
  (`tile.load`/`tile.store` ``queue``), a loop body keeps the default queues;
- a dependence on an earlier op of the same in-order engine (matrix, vector) orders
  the two without waiting for the result;
- the engines' state carries from one run of ops to the next within a block (the
  prologue's constant loads take the DMA queues first).

Example (one body, two copies; M: matrix, V: vector)::

    before: M s0 = q@k0 ; V p0 = exp(s0) ; M o += p0@v0 ; M s1 = q@k1 ; V p1 = exp(s1) ; ...
    after:  M s0 ; M s1 ; V p0 ; V p1 ; M o += p0@v0 ; ...
"""

from __future__ import annotations

from xdsl.dialects import func, scf
from xdsl.dialects.builtin import IntegerAttr, i64
from xdsl.ir import Block, Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules

BOTTLENECK_WEIGHT = 3.0  # default extra weight of the busiest engine's ops in the priority
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
    c = tile.const_index(v)
    return c if c is not None else 128


class _Cost:
    def __init__(self, cfg: HardwareConfig):
        self.cfg = cfg
        self.rules = TimingRules(cfg)

    def engine(self, op: Operation) -> str | None:
        if isinstance(op, (tile.LoadOp, tile.StoreOp)):
            return "dma"
        if isinstance(op, tile.MatmulOp):
            return "pe"
        if isinstance(op, (tile.UnaryOp, tile.BinaryOp, tile.ScalarOp, tile.ReduceOp)):
            return "vec"
        return None

    def op_cost(self, op: Operation) -> float:
        """Vector-engine cycles per element group (one element on each of up to `lanes`
        partitions; `[vector.op_cost]`, as the simulator)."""
        if isinstance(op, tile.UnaryOp):
            return self.rules.vector_op_cost("unary", op.fn.data, 1)
        if isinstance(op, tile.ReduceOp):
            return self.rules.vector_op_cost("reduce", op.fn.data, 1)
        if isinstance(op, (tile.BinaryOp, tile.ScalarOp)):
            return self.rules.vector_op_cost("binary", op.fn.data, 1)
        return 1

    def dma_fixed(self, op: Operation) -> float:
        if not isinstance(op, (tile.LoadOp, tile.StoreOp)):
            raise CompileError(f"{op.name} is not a DMA")
        return self.rules.dma_fixed(_const(op.rows))  # contiguous rows: one descriptor each

    def dma_sharing(self, op: Operation) -> tuple[float, int]:
        """(fraction of the HBM peak, DMA engines) a DMA takes alone: what sharing counts."""
        if not isinstance(op, (tile.LoadOp, tile.StoreOp)):
            raise CompileError(f"{op.name} is not a DMA")
        rows, cols = _const(op.rows), _const(op.cols)
        rate = self.rules.dma_rate(rows, cols, self._itemsize(op))
        return self.rules.dma_hbm_share(rate), self.rules.dma_engines(rows)

    @staticmethod
    def _itemsize(op: tile.LoadOp | tile.StoreOp) -> int:
        onchip = op.dst if isinstance(op, tile.LoadOp) else op.src
        return ITEM.get(str(getattr(onchip.type, "element_type", "f32")), 4)

    def timing(self, op: Operation) -> tuple[float, float]:
        """(occupancy, latency) of `op` in cycles, the simulator's closed forms: how long
        its engine (queue) is taken, and how long until its result is ready. A pipelined
        matmul frees the array for the next one after streaming (its preload overlaps the
        previous matmul), while its result drains through the array."""
        rules = self.rules
        if isinstance(op, (tile.LoadOp, tile.StoreOp)):
            rows, cols = _const(op.rows), _const(op.cols)
            # contiguous rows (the DSL's loads and stores)
            t = self.dma_fixed(op) + rules.dma_transfer(rows, cols, self._itemsize(op))
            return t, t
        if isinstance(op, tile.MatmulOp):
            fp32 = any("f32" == str(getattr(v.type, "element_type", "")) for v in (op.lhsT, op.rhs))
            m, k, n = (max(_const(x), 1) for x in (op.m, op.k, op.n))
            stream = rules.matmul_stream(m, k, n, fp32)
            return rules.matmul_interval(stream), rules.matmul_latency(stream)
        if isinstance(op, (tile.UnaryOp, tile.BinaryOp, tile.ScalarOp, tile.ReduceOp)):  # engine "vec"
            two = isinstance(op, tile.BinaryOp) and op.rhs_mode.data == "tile"
            t = rules.vector_time(_const(op.rows), _const(op.cols), self.op_cost(op), 2 if two else 1)
            return t, t
        return 0.0, 0.0


def schedule_kernel(kernel: func.FuncOp, cfg: HardwareConfig, slack: float = 0.0,
                    weight: float = BOTTLENECK_WEIGHT) -> float:
    """List-schedule every straight-line block of `kernel`. With `slack` > 0 the op with
    the highest priority goes first among the ready ops that can start within `slack`
    cycles of the earliest (0: the earliest start goes first). The priority of an op is
    its longest path to the block's end, the durations of the busiest engine's ops
    counted ``1 + weight`` times. Returns the estimated
    cycles of the kernel's top-level block (exact for a kernel without `scf.for` loops,
    up to the simulator's sharing of HBM among more transfers than the estimate follows;
    a loop's body counts once)."""
    cost = _Cost(cfg)
    blocks: list[Block] = [kernel.body.block]
    for op in kernel.walk():
        if isinstance(op, scf.ForOp):
            blocks.append(op.body.block)
    top = _schedule_block(blocks[0], cost, slack, weight, True)
    for b in blocks[1:]:
        _schedule_block(b, cost, slack, weight, False)
    return top


def largest_block(kernel: func.FuncOp) -> int:
    """Ops in the kernel's longest straight-line block (where scheduling choices matter)."""
    blocks = [kernel.body.block] + [op.body.block for op in kernel.walk() if isinstance(op, scf.ForOp)]
    return max(len(b.ops) for b in blocks)


def _schedule_block(block: Block, cost: _Cost, slack: float, weight: float, top: bool) -> float:
    ops = list(block.ops)
    # only the run of ops between loops (and before the terminator) moves; the engines'
    # state carries from one run to the next (a prologue's constant loads take DMA
    # queues the body's first loads then wait for), and starts afresh after a loop
    segment: list[Operation] = []
    # the top level's DMAs go on the queues the estimate used; a loop body's keep the
    # defaults (loads alternate, stores on the last queue), since its estimate sees one
    # iteration: a store placed before the next iteration's prefetch would hold it up
    state = _Engines(cost.cfg, top)
    for op in ops:
        if isinstance(op, (scf.ForOp, scf.YieldOp, func.ReturnOp)) or isinstance(op, tile.AllocOp):
            _reorder(block, segment, cost, op, slack, weight, state)
            segment = []
            if isinstance(op, scf.ForOp):  # its body's time is not followed here
                done, state = state.finish, _Engines(cost.cfg, top)
                state.finish = done
        else:
            segment.append(op)
    _reorder(block, segment, cost, None, slack, weight, state)
    return state.finish


_SHARED_WINDOW = 16  # recent transfers whose sharing of HBM the estimate follows


def _shared_finish(jobs: list[tuple[float, float, float, int]], rules: TimingRules) -> list[float]:
    """Finish times of transfers (arrival, work: time alone, HBM share, engines) sharing
    the DMA engines and HBM: those in flight each progress at ``1 / slowdown`` of their
    alone rate (`TimingRules.dma_slowdown`)."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    done = [0.0] * len(jobs)
    left = {i: jobs[i][1] for i in order}
    active: list[int] = []
    t, k = jobs[order[0]][0], 0
    while k < len(order) or active:
        if not active:
            t = max(t, jobs[order[k]][0])
        while k < len(order) and jobs[order[k]][0] <= t:
            active.append(order[k])
            k += 1
        n = rules.dma_slowdown([jobs[i][2] for i in active], [jobs[i][3] for i in active])
        step = min(left[i] for i in active) * n
        if k < len(order):
            step = min(step, jobs[order[k]][0] - t)
        for i in active:
            left[i] -= step / n
        t += step
        for i in [i for i in active if left[i] <= 1e-9]:
            done[i] = t
            active.remove(i)
    return done


def _transfer(state: _Engines, op: Operation, queue: int, t0: float, work: float,
              cost: _Cost) -> list[tuple[Operation, float]]:
    """Put DMA `op` on `queue`, its transfer starting at t0 (after its fixed part). The
    transfers in flight share the engines and HBM (as in the simulator), so this one
    also delays those it overlaps: returns the (op, finish) of each, new ones."""
    if state.assign_queues:  # the queue the estimate assumed (a loop body keeps the defaults)
        op.properties["queue"] = IntegerAttr(queue, i64)
    state.last_on_queue[queue] = op
    state.transfers = [tr for tr in state.transfers if state.fin[tr[0]] > t0][-_SHARED_WINDOW:]
    state.transfers.append((op, t0, work, *cost.dma_sharing(op)))
    ends = _shared_finish([tr[1:] for tr in state.transfers], cost.rules)
    updated = [(tr[0], end) for tr, end in zip(state.transfers, ends)]
    for o, end in updated:
        state.fin[o] = end
    for q, o in state.last_on_queue.items():
        state.free["dma"][q] = state.fin[o]
    return updated


class _Engines:
    """When each engine (each DMA queue) is next free, and the transfers in flight."""

    def __init__(self, cfg: HardwareConfig, assign_queues: bool = False):
        self.assign_queues = assign_queues
        self.free: dict[str, list[float]] = {"dma": [0.0] * max(1, cfg.dma.queues), "pe": [0.0], "vec": [0.0]}
        # recent DMAs: (op, transfer start, work, HBM share, engines)
        self.transfers: list[tuple[Operation, float, float, float, int]] = []
        self.fin: dict[Operation, float] = {}  # DMA finish times
        self.last_on_queue: dict[int, Operation] = {}
        self.finish = 0.0  # the estimated end of everything scheduled so far


def _reorder(block: Block, seg: list[Operation], cost: _Cost, anchor: Operation | None, slack: float,
             weight: float, state: _Engines) -> None:
    if not seg:
        return
    keep = len(seg) < 3  # too short to reorder: only timed
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
    timing = [cost.timing(op) for op in seg]
    occ = [t[0] for t in timing]
    dur = [t[1] for t in timing]
    eng = [cost.engine(op) for op in seg]
    fixed_of = [cost.dma_fixed(op) if e == "dma" else 0.0 for op, e in zip(seg, eng)]
    starts_of = [0.0] * len(seg)
    # priority: the longest path to the block's end, the busiest engine's ops counting
    # `weight` times more (keeping the engine that bounds the block fed first)
    load: dict[str | None, float] = {}
    for e, o in zip(eng, occ):
        load[e] = load.get(e, 0.0) + o
    load["dma"] = load.get("dma", 0.0) / len(state.free["dma"])
    load.pop(None, None)
    busiest = max(load, key=lambda e: load[e]) if load else None
    prio = [0.0] * len(seg)
    for i in reversed(range(len(seg))):
        w = 1.0 + weight * (eng[i] == busiest)
        prio[i] = dur[i] * w + max((prio[s] for s in succs[i]), default=0.0)
    free = state.free
    finish = [0.0] * len(seg)
    waiting = [len(ps) for ps in preds]
    ready = [i for i in range(len(seg)) if waiting[i] == 0]
    order: list[int] = []
    while ready:
        starts = {}
        for i in ready:
            # an engine runs its queue in order: a dependence on an earlier op of the same
            # (non-DMA) engine orders the two, it does not wait for the result
            dep = max((starts_of[p] if eng[p] == eng[i] and eng[i] in ("pe", "vec") else finish[p]
                       for p in preds[i]), default=0.0)
            e = eng[i]
            starts[i] = dep if e is None else max(dep, min(free[e]))
        first = min(starts.values())
        if keep:
            best = min(ready)
        elif slack:
            best = min((i for i in ready if starts[i] <= first + slack), key=lambda i: (-prio[i], starts[i], i))
        else:
            best = min(ready, key=lambda i: (starts[i], -prio[i], i))
        ready.remove(best)
        start = starts[best]
        starts_of[best] = start
        finish[best] = start + dur[best]
        e = eng[best]
        if e is not None:
            lanes = free[e]
            k = min(range(len(lanes)), key=lambda q: lanes[q])
            if eng[best] == "dma":
                work = dur[best] - fixed_of[best]
                for op_, end in _transfer(state, seg[best], k, start + fixed_of[best], work, cost):
                    j = index.get(op_)
                    if j is not None:
                        finish[j] = end
            else:
                lanes[k] = start + occ[best]
        order.append(best)
        for s in succs[best]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    assert len(order) == len(seg)
    state.finish = max(state.finish, max(finish, default=0.0))
    if keep:
        return
    for op in seg:
        op.detach()
    for i in order:
        if anchor is None:
            block.add_op(seg[i])
        else:
            block.insert_op_before(seg[i], anchor)


__all__ = ["schedule_kernel", "largest_block"]
