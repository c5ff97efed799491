"""npu-insert-sync: semaphores from the data dependences between engine queues.

Every engine queue (each DMA queue, the matrix engine, the vector engine) runs its
instructions in order, so only dependences between different queues need semaphores.
Two instructions depend on each other when one writes an on-chip buffer the other
reads or writes (RAW, WAR, WAW; buffers named in `reads` / `writes`).

Each producer P that somebody waits on signals its own semaphore; a semaphore counts
P's completed executions. A consumer C waits until P has completed every execution
that comes before C's current one in program order. With s loops enclosing both
(induction variables i0..i{s-1}, trips t0..t{s-1}), ``lin`` the linear index of the
current iteration of those loops, and E the number of executions of P per iteration
of the innermost common loop:

    count = (lin + 1) * E    if P comes before C in the common loop body
    count =  lin      * E    if P comes after C (the dependence is loop-carried)

an affine expression, kept structured like everything else at this level.

Before::

    npu.loop {trip = 3} {
      npu.dma_load {..., writes = ["lhsT"]}
      npu.matmul {..., reads = ["lhsT", "rhs", "acc"], writes = ["acc"]}
    }

After::

    npu.loop {trip = 3} {
      npu.dma_load {..., waits = ["s1 >= i0"], signal = 0}       // WAR: previous matmul
      npu.matmul {..., waits = ["s0 >= i0 + 1"], signal = 1}      // RAW: this load
    }

Of several producers on one queue only the latest is awaited where that is exact
(same nesting and direction); a wait with count <= 0 is dropped at expansion.

An instruction may depend on producers on every other queue (4 DMA queues, the matrix
and the vector engine on `cloud`: 5), but the ISA has `MAX_WAITS` = 4 wait slots. So the
waits are then reduced transitively (`_reduce`): a wait is dropped when the orderings
it gives are implied by other waits or queue order (producer X completes before Y's
awaited execution, or an earlier instruction on the consumer's own queue already
waited for X, with no execution of X in between). The test "no execution of X between
two program points" is exact for these counts (decided on the program with trips
clamped to 2, `_Order`). Where an instruction still needs more than `MAX_WAITS` waits,
one of them is chained through an instruction it already waits on or that precedes it
on its queue (that instruction waits instead; no deadlock is possible since every wait
is for executions that precede the waiter in program order).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass

from tilecc.errors import CompileError
from tilecc.ir import npu
from tilecc.ir.affine import Affine
from tilecc.ir.npu_walk import Inst, collect
from tilecc.passes.session import CompileSession
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.isa import MAX_WAITS


def _common(p: Inst, c: Inst) -> int:
    s = 0
    while s < min(len(p.path), len(c.path)) - 1 and p.path[s] == c.path[s]:
        s += 1
    return s


def order_key(p: Inst, c: Inst) -> tuple[int, bool, int] | None:
    """`count_before`'s ordering key (common loop depth, whether p comes before c in the
    common body, p's position there) without building the count; None where the count
    is a constant <= 0 (no execution of p precedes c: p has a zero-trip loop of its own,
    or p comes after c outside every common loop)."""
    s = _common(p, c)
    before = p.path[s] < c.path[s]
    if (not before and s == 0) or 0 in p.trips[s:]:
        return None
    return s, before, p.path[s]


def count_before(p: Inst, c: Inst) -> tuple[Affine, tuple[int, bool, int]]:
    """Executions of p that precede c's current execution; and an ordering key."""
    s = _common(p, c)
    per_iter = 1
    for t in p.trips[s:]:
        per_iter *= t
    before = p.path[s] < c.path[s]
    # lin = sum_j i_j * (trips of c's loops j+1 .. s-1), scaled by per_iter
    terms: dict[int, int] = {}
    stride = per_iter
    for j in range(s - 1, -1, -1):
        terms[j] = stride
        stride *= c.trips[j]
    return Affine.of(per_iter if before else 0, terms), (s, before, p.path[s])


def conflicts(p: Inst, c: Inst) -> bool:
    return bool(p.writes & (c.reads | c.writes) or p.reads & c.writes) and not _disjoint_loads(p, c)


def _disjoint_loads(p: Inst, c: Inst) -> bool:
    """Two DMA loads into one buffer, into disjoint partitions (rows of a contraction
    tile filled by several DMAs): they do not depend on each other."""
    a, b = p.load_rows, c.load_rows
    return a is not None and b is not None and p.writes == c.writes and (a[1] <= b[0] or b[1] <= a[0])


def _latest(insts: list[Inst], paths: list[tuple[int, ...]], lists: list[list[int]], ci: int) -> list[int]:
    """The producers of one queue that c = insts[ci] must wait on: of the candidates in
    `lists` (instruction indices in program order, one list per buffer c shares with
    them), those whose wait is not implied by another's.

    A queue runs in program order, so waiting for producer B's latest preceding
    execution also waits for A's whenever B's comes later in every iteration: a
    same-iteration producer (one before c in program order) at a deeper common loop or
    a later position comes after every other same-iteration producer and after every
    loop-carried one (after c) with a common depth not deeper than its own; of
    loop-carried producers with the same common depth the later position comes after.

    Program order is the lexicographic order of the paths, so the producer before c
    sharing the deepest loop with it, at the latest position, is simply the last one
    before c; and the latest loop-carried producer sharing exactly s loops with c is the
    last one inside c's enclosing loop at depth s, when its common depth is s (its
    indices: a range ending where that loop ends). Each is found by bisection, not by
    comparing every candidate with c."""
    c = insts[ci]

    def last_usable(lo: int, hi: int) -> int:
        """The last candidate in lo < index < hi with a positive count, or -1."""
        best = -1
        for lst in lists:
            j = bisect_left(lst, hi) - 1
            while j >= 0 and lst[j] > lo and lst[j] > best:
                p = insts[lst[j]]
                if not _disjoint_loads(p, c) and order_key(p, c) is not None:
                    best = lst[j]
                    break
                j -= 1
        return best

    out: list[int] = []
    depth = 0
    pi = last_usable(-1, ci)
    if pi >= 0:
        out.append(pi)
        depth = _common(insts[pi], c)
    for s in range(depth + 1, len(c.path)):
        end = bisect_left(paths, (*c.path[:s - 1], c.path[s - 1] + 1))  # past c's loop at depth s
        pi = last_usable(ci, end)
        if pi >= 0 and _common(insts[pi], c) == s:
            out.append(pi)
    return out


class _Order:
    """Which executions of a kernel's static instructions come between which.

    ``dirty(p, y, x)``: is there an execution of x and an execution of p before it in
    program order with no execution of y in between? If not, the executions of p that
    precede any execution of x all precede y*(x), the last execution of y before it (or
    there are none), so what is known at y*(x) about p's executions that precede it
    holds at x for all that precede x.

    Only whether each loop runs once or more matters (the next execution of an
    instruction after an execution of p is in the same iteration of the loops it
    shares with p, or in the lexicographically next one: which, and how two of them
    compare, depends only on which of p's loop indices are at their last value), so the
    question is decided exactly on the program with every trip count clamped to 2.
    """

    def __init__(self, insts: list[Inst], kernel: npu.KernelOp):
        index = {id(x.op): i for i, x in enumerate(insts)}
        self.positions: list[list[int]] = [[] for _ in insts]
        self.queue_pred: list[set[int]] = [set() for _ in insts]
        last_on: dict[str, int] = {}
        pos = 0

        def walk(block) -> None:
            nonlocal pos
            for op in block.ops:
                if isinstance(op, npu.LoopOp):
                    for _ in range(min(op.trip.value.data, 2)):
                        walk(op.body.block)
                elif isinstance(op, npu.InstructionOp):
                    i = index[id(op)]
                    q = insts[i].queue
                    if q in last_on:  # the execution before this one on its queue
                        self.queue_pred[i].add(last_on[q])
                    last_on[q] = i
                    self.positions[i].append(pos)
                    pos += 1

        walk(kernel.body.block)
        self._memo: dict[tuple[int, int, int], bool] = {}

    def dirty(self, p: int, y: int, x: int) -> bool:
        if p == y:
            return False
        key = (p, y, x)
        hit = self._memo.get(key)
        if hit is None:
            hit = False
            px, py = self.positions[x], self.positions[y]
            for at in self.positions[p]:
                j = bisect_right(px, at)
                if j == len(px):
                    continue
                k = bisect_right(py, at)
                if k == len(py) or py[k] >= px[j]:
                    hit = True
                    break
            self._memo[key] = hit
        return hit


class _Knowledge:
    """What an instruction's start is known to follow, given the waits `waits`
    (consumer -> set of producers).

    ``knows(x, p)``: every execution of x starts only after every execution of p that
    precedes it in program order has completed. A wait of x on p gives it directly;
    otherwise it is derived (to a bounded depth) from

    - a wait of x on y: y's queue completes in order, so every execution on y's queue up
      to y*(x) has completed, and so has what y*(x) itself is known to follow;
    - an instruction y whose execution comes right before one of x's on x's own queue:
      y*(x) started before x (in-order issue), so what is known at y*(x) holds at x;

    each for producers p with no execution between y*(x) and x (``_Order.dirty``).
    """

    DEPTH = 4

    def __init__(self, insts: list[Inst], order: _Order, waits: dict[int, set[int]]):
        self.insts, self.order, self.waits = insts, order, waits
        self._memo: dict[tuple[int, int, int], bool] = {}

    def knows(self, x: int, p: int, depth: int = DEPTH) -> bool:
        if p in self.waits.get(x, ()):
            return True
        if depth == 0:
            return False
        key = (x, p, depth)
        hit = self._memo.get(key)
        if hit is None:
            hit = self.implied(x, p, self.waits.get(x, set()), depth)
            self._memo[key] = hit
        return hit

    def implied(self, x: int, p: int, waits: set[int], depth: int = DEPTH) -> bool:
        """Whether x, waiting on `waits` (without p), is ordered after p's executions."""
        insts, order = self.insts, self.order
        pq = insts[p].queue
        for y in sorted(waits):
            if y != p and (insts[y].queue == pq or self.knows(y, p, depth - 1)) and not order.dirty(p, y, x):
                return True
        for y in sorted(order.queue_pred[x]):
            if self.knows(y, p, depth - 1) and not order.dirty(p, y, x):
                return True
        return False

    def add_wait(self, x: int, p: int) -> None:
        self.waits.setdefault(x, set()).add(p)
        self._memo.clear()


def _reduce(insts: list[Inst], kernel: npu.KernelOp, chosen: dict[int, list[tuple[int, Affine]]]) -> None:
    """Drop the waits implied by the others (transitively), then chain the dependence
    through another instruction where an instruction still needs more than `MAX_WAITS`.

    Transitive reduction: a wait of x on p is redundant when every execution of it is
    implied by other happens-before edges (``_Knowledge.implied`` from x's other waits
    and its queue predecessors). The happens-before graph of the executions is acyclic
    (every edge points forward in program order), so dropping every redundant edge at
    once keeps every ordering: an edge's alternative path may use dropped edges, which
    have alternative paths of their own, shorter ones.

    Restructuring: a wait of x on p moves to a host h that x waits on or that comes
    right before x on its queue, when no execution of p runs between h*(x) and x; h
    waits for the executions of p before it (all of them precede x) and x inherits the
    ordering. Every wait is for executions that precede the waiter in program order,
    so no wait added this way can deadlock.
    """
    if not chosen:
        return
    order = _Order(insts, kernel)
    waits = {ci: {pi for pi, _ in lst} for ci, lst in chosen.items()}
    kn = _Knowledge(insts, order, waits)
    counts = {(ci, pi): cnt for ci, lst in chosen.items() for pi, cnt in lst}
    redundant = [
        (ci, pi)
        for ci in sorted(waits)
        for pi in sorted(waits[ci])
        if kn.implied(ci, pi, waits[ci] - {pi})
    ]
    for ci, pi in redundant:
        waits[ci].discard(pi)  # what kn has derived still holds: the orderings are the same
    for ci in sorted(waits):
        while len(waits[ci]) > MAX_WAITS:
            if not _chain_one(insts, kn, counts, ci):
                c = insts[ci]
                raise CompileError(
                    f"{kernel.sym_name.data}: instruction {c.op.name} (body position "
                    f"{'.'.join(map(str, c.path))}) depends on producers on {len(waits[ci])} "
                    f"other queues and no wait can be chained through another instruction; "
                    f"the ISA allows {MAX_WAITS} waits"
                )
    chosen.clear()
    for ci in sorted(waits):
        if waits[ci]:
            chosen[ci] = [(pi, counts[(ci, pi)]) for pi in sorted(waits[ci])]


def _chain_one(insts: list[Inst], kn: _Knowledge, counts: dict, ci: int) -> bool:
    waits = kn.waits
    hosts_q = sorted(kn.order.queue_pred[ci] - {ci}, reverse=True)
    for pi in sorted(waits[ci]):  # the earliest producer first: the likeliest to be done
        p = insts[pi]
        others = sorted((y for y in waits[ci] if y != pi), reverse=True)
        for hi in hosts_q + others:
            h = insts[hi]
            if h.queue == p.queue or len(waits.get(hi, set()) | {pi}) > MAX_WAITS:
                continue
            if kn.order.dirty(pi, hi, ci):
                continue
            count, _ = count_before(p, h)
            if count.is_const and count.const <= 0:
                continue
            counts[(hi, pi)] = count
            waits[ci].discard(pi)
            kn.add_wait(hi, pi)
            assert kn.implied(ci, pi, waits[ci]), (insts[ci].op.name, pi, hi)
            return True
    return False


# the session's memo: kernel structure -> (semaphores used, per-instruction (waits,
# signal)); the result is a function of the instructions' positions, trip counts, queues
# and buffers alone, so the structurally identical kernels of a model's repeated layers
# are synchronised once
MEMO = "insert-sync"
MEMO_SIZE = 512


def sync_kernel(kernel: npu.KernelOp, max_semaphores: int, session: CompileSession | None = None) -> int:
    """Give `kernel`'s instructions their waits and signals; the semaphores used.
    Kernels already synchronised in `session` (same structure) reuse its result."""
    memo = (session or CompileSession()).cache(MEMO, MEMO_SIZE)
    insts = collect(kernel)
    sig = (max_semaphores, tuple((x.path, x.trips, x.queue, x.reads, x.writes, x.load_rows) for x in insts))
    hit = memo.get(sig)
    if hit is not None:
        for inst, (waits, signal) in zip(insts, hit[1]):
            inst.op.properties["waits"] = waits
            if signal is not None:
                inst.op.properties["signal"] = signal
            elif "signal" in inst.op.properties:
                del inst.op.properties["signal"]
        return hit[0]
    used = _sync_kernel(kernel, insts, max_semaphores)
    memo.put(sig, (used, [(x.op.properties["waits"], x.op.properties.get("signal")) for x in insts]))
    return used


def _sync_kernel(kernel: npu.KernelOp, insts: list[Inst], max_semaphores: int) -> int:
    # per buffer and queue, the instructions reading / writing it, in program order
    readers: dict[str, dict[str, list[int]]] = {}
    writers: dict[str, dict[str, list[int]]] = {}
    for i, inst in enumerate(insts):
        for b in inst.reads:
            readers.setdefault(b, {}).setdefault(inst.queue, []).append(i)
        for b in inst.writes:
            writers.setdefault(b, {}).setdefault(inst.queue, []).append(i)
    paths = [x.path for x in insts]
    waits: dict[int, list[tuple[int, Affine]]] = {}
    for ci, c in enumerate(insts):
        # producers on other queues that touch c's buffers: writers of what c reads or
        # writes, readers of what c writes
        by_queue: dict[str, list[list[int]]] = {}
        for b in c.reads | c.writes:
            for q, lst in writers.get(b, {}).items():
                if q != c.queue:
                    by_queue.setdefault(q, []).append(lst)
        for b in c.writes:
            for q, lst in readers.get(b, {}).items():
                if q != c.queue:
                    by_queue.setdefault(q, []).append(lst)
        chosen = [(pi, count_before(insts[pi], c)[0])
                  for lists in by_queue.values() for pi in _latest(insts, paths, lists, ci)]
        if chosen:
            waits[ci] = sorted(chosen, key=lambda x: x[0])
    _reduce(insts, kernel, waits)
    sems: dict[int, int] = {}  # producer index -> semaphore
    for ci in sorted(waits):
        for pi, _ in waits[ci]:
            sems.setdefault(pi, len(sems))
    if len(sems) > max_semaphores:
        return _sync_by_queue(kernel, insts, waits, max_semaphores)
    for i, inst in enumerate(insts):
        w = [f"s{sems[pi]} >= {count}" for pi, count in waits.get(i, [])]
        inst.op.properties["waits"] = ArrayAttr([StringAttr(x) for x in w])
        if i in sems:
            inst.op.properties["signal"] = IntegerAttr(sems[i], i64)
        elif "signal" in inst.op.properties:
            del inst.op.properties["signal"]
    return len(sems)


def _sync_by_queue(kernel: npu.KernelOp, insts: list[Inst], waits: dict, max_semaphores: int) -> int:
    """One semaphore per engine queue, for kernels with more producers than semaphores
    (long unrolled bodies): every instruction of an awaited queue signals the queue's
    semaphore, and a consumer waits until every execution of that queue that precedes
    it in program order has completed (the queue runs in order, so this includes the
    producers it depends on)."""
    needed: dict[int, set[str]] = {
        ci: {insts[pi].queue for pi, _ in chosen} for ci, chosen in waits.items() if chosen
    }
    queues = sorted({q for qs in needed.values() for q in qs})
    if len(queues) > max_semaphores:
        raise CompileError(
            f"{kernel.sym_name.data}: needs {len(queues)} semaphores, the target has {max_semaphores}"
        )
    sem = {q: i for i, q in enumerate(queues)}
    members: dict[str, list[Inst]] = {q: [x for x in insts if x.queue == q] for q in queues}
    for ci, c in enumerate(insts):
        w = []
        for q in sorted(needed.get(ci, ())):
            total = Affine()
            for x in members[q]:
                total = total + count_before(x, c)[0]
            w.append(f"s{sem[q]} >= {total}")
        c.op.properties["waits"] = ArrayAttr([StringAttr(x) for x in w])
        if c.queue in sem:
            c.op.properties["signal"] = IntegerAttr(sem[c.queue], i64)
        elif "signal" in c.op.properties:
            del c.op.properties["signal"]
    return len(queues)


@dataclass(frozen=True)
class InsertSyncPass(ModulePass):
    name = "npu-insert-sync"
    target: str = "tiny"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        insert_sync(op, load_config(self.target))


def insert_sync(module: ModuleOp, cfg: HardwareConfig, session: CompileSession | None = None) -> None:
    """Synchronise every kernel of `module`; `session` (a fresh one when None) memoises
    the kernels of one structure."""
    session = session or CompileSession()
    for k in module.ops:
        if isinstance(k, npu.KernelOp):
            sync_kernel(k, cfg.semaphores, session)
