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
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass

from tilecc.errors import CompileError
from tilecc.ir import npu
from tilecc.ir.affine import Affine
from tilecc.simulator.config import HardwareConfig, load_config
from tilecc.simulator.isa import MAX_WAITS, OPCODE_ENGINE, Engine


@dataclass
class _Inst:
    op: npu.InstructionOp
    path: tuple[int, ...]  # position in the body at each nesting level
    trips: tuple[int, ...]  # trip counts of the enclosing loops, outermost first
    queue: str
    reads: frozenset[str]
    writes: frozenset[str]


def queue_of(op: npu.InstructionOp) -> str:
    if OPCODE_ENGINE[op.OPCODE] == Engine.DMA:  # loads, stores, gathers
        return f"dma{op.field_values()['queue']}"
    if isinstance(op, npu.MatmulOp):
        return "matrix"
    return "vector"


def collect(kernel: npu.KernelOp) -> list[_Inst]:
    out: list[_Inst] = []

    def walk(block, path: tuple[int, ...], trips: tuple[int, ...]) -> None:
        for pos, op in enumerate(block.ops):
            if isinstance(op, npu.LoopOp):
                walk(op.body.block, (*path, pos), (*trips, op.trip.value.data))
            elif isinstance(op, npu.InstructionOp):
                out.append(
                    _Inst(
                        op,
                        (*path, pos),
                        trips,
                        queue_of(op),
                        frozenset(r.data for r in op.reads.data),
                        frozenset(w.data for w in op.writes.data),
                    )
                )

    walk(kernel.body.block, (), ())
    return out


def _common(p: _Inst, c: _Inst) -> int:
    s = 0
    while s < min(len(p.path), len(c.path)) - 1 and p.path[s] == c.path[s]:
        s += 1
    return s


def count_before(p: _Inst, c: _Inst) -> tuple[Affine, tuple[int, bool, int]]:
    """Executions of p that precede c's current execution; and an ordering key."""
    s = _common(p, c)
    lin = Affine()
    for j in range(s):
        stride = 1
        for k in range(j + 1, s):
            stride *= c.trips[k]
        lin = lin + Affine.iv(j).scale(stride)
    per_iter = 1
    for t in p.trips[s:]:
        per_iter *= t
    before = p.path[s] < c.path[s]
    count = (lin + Affine(1)).scale(per_iter) if before else lin.scale(per_iter)
    return count, (s, before, p.path[s])


def conflicts(p: _Inst, c: _Inst) -> bool:
    return bool(p.writes & (c.reads | c.writes) or p.reads & c.writes)


def _undominated(cands: list[tuple[tuple[int, bool, int], int, Affine]]) -> list:
    """The candidates of one queue whose wait is not implied by another's.

    A queue runs in program order, so waiting for producer B's latest preceding
    execution also waits for A's whenever B's comes later in every iteration: a
    same-iteration producer (``before``) at a deeper common loop or a later position
    comes after every other same-iteration producer and after every loop-carried one
    with a common depth not deeper than its own; of loop-carried producers with the
    same common depth the later position comes after.
    """
    before = [x for x in cands if x[0][1]]
    out = []
    if before:
        best = max(before, key=lambda x: (x[0][0], x[0][2], x[1]))  # x[1]: program order
        out.append(best)
        depth = best[0][0]
        carried = [x for x in cands if not x[0][1] and x[0][0] > depth]
    else:
        carried = [x for x in cands if not x[0][1]]
    by_depth: dict[int, tuple] = {}
    for x in carried:
        cur = by_depth.get(x[0][0])
        if cur is None or (x[0][2], x[1]) > (cur[0][2], cur[1]):
            by_depth[x[0][0]] = x
    out.extend(by_depth[d] for d in sorted(by_depth))
    return out


def sync_kernel(kernel: npu.KernelOp, max_semaphores: int) -> int:
    insts = collect(kernel)
    readers: dict[str, list[int]] = {}
    writers: dict[str, list[int]] = {}
    for i, inst in enumerate(insts):
        for b in inst.reads:
            readers.setdefault(b, []).append(i)
        for b in inst.writes:
            writers.setdefault(b, []).append(i)
    sems: dict[int, int] = {}  # producer index -> semaphore
    waits: dict[int, list[tuple[int, Affine]]] = {}
    for ci, c in enumerate(insts):
        # producers that touch c's buffers: writers of what c reads or writes, readers
        # of what c writes
        related: set[int] = set()
        for b in c.reads | c.writes:
            related.update(writers.get(b, ()))
        for b in c.writes:
            related.update(readers.get(b, ()))
        by_queue: dict[str, list[tuple[tuple[int, bool, int], int, Affine]]] = {}
        for pi in sorted(related):
            p = insts[pi]
            if pi == ci or p.queue == c.queue:
                continue
            count, key = count_before(p, c)
            if count.is_const and count.const <= 0:
                continue
            by_queue.setdefault(p.queue, []).append((key, pi, count))
        chosen: list[tuple[int, Affine]] = []
        for cands in by_queue.values():
            chosen.extend((pi, count) for _, pi, count in _undominated(cands))
        if len(chosen) > MAX_WAITS:
            raise CompileError(
                f"{kernel.sym_name.data}: instruction {c.op.name} needs {len(chosen)} waits, "
                f"the ISA allows {MAX_WAITS}"
            )
        for pi, _ in chosen:
            sems.setdefault(pi, len(sems))
        waits[ci] = chosen
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


def _sync_by_queue(kernel: npu.KernelOp, insts: list[_Inst], waits: dict, max_semaphores: int) -> int:
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
    members: dict[str, list[_Inst]] = {q: [x for x in insts if x.queue == q] for q in queues}
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


def insert_sync(module: ModuleOp, cfg: HardwareConfig) -> None:
    for k in module.ops:
        if isinstance(k, npu.KernelOp):
            sync_kernel(k, cfg.semaphores)
