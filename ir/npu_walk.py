"""The static instructions of an npu kernel, in program order, with where each sits.

An npu kernel keeps its loops structured (`npu.loop`); `collect` walks them once and
gives every instruction op with its position at each nesting level, the trip counts of
the loops around it, the engine queue it runs on and the buffers it reads and writes.
Both the sync insertion (`passes/npu/insert_sync.py`: dependences between queues) and
the expansion to the flat stream (`codegen/expand.py`: program order over the whole
iteration space) read a kernel this way.

    npu.kernel @k {
      npu.dma_load {queue = 0, writes = ["a"]}          Inst(path=(0,), trips=(), queue="dma0")
      npu.loop {trip = 3} {
        npu.matmul {reads = ["a"], writes = ["acc"]}    Inst(path=(1, 0), trips=(3,), queue="matrix")
      }
    }
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import Block

from tilecc.ir import npu
from tilecc.simulator.isa import OPCODE_ENGINE, Engine


@dataclass
class Inst:
    """One static instruction of a kernel and its place in the loop nest."""

    op: npu.InstructionOp
    path: tuple[int, ...]  # position in the body at each nesting level
    trips: tuple[int, ...]  # trip counts of the enclosing loops, outermost first
    queue: str
    reads: frozenset[str]
    writes: frozenset[str]
    load_rows: tuple[int, int] | None = None  # constant partitions a DMA load writes


def queue_of(op: npu.InstructionOp) -> str:
    """The engine queue `op` runs on: "dma<n>", "matrix" or "vector"."""
    if OPCODE_ENGINE[op.OPCODE] == Engine.DMA:  # loads, stores, gathers
        return f"dma{op.field_values()['queue']}"
    if isinstance(op, npu.MatmulOp):
        return "matrix"
    return "vector"


def collect(kernel: npu.KernelOp) -> list[Inst]:
    """The kernel's instruction ops in program order (loops walked once, not unrolled)."""
    out: list[Inst] = []

    def walk(block: Block, path: tuple[int, ...], trips: tuple[int, ...]) -> None:
        for pos, op in enumerate(block.ops):
            if isinstance(op, npu.LoopOp):
                walk(op.body.block, (*path, pos), (*trips, op.trip.value.data))
            elif isinstance(op, npu.InstructionOp):
                reads = frozenset(r.data for r in op.reads.data)
                writes = frozenset(w.data for w in op.writes.data)
                out.append(Inst(op, (*path, pos), trips, queue_of(op), reads, writes,
                                _load_rows(op, reads, writes)))

    walk(kernel.body.block, (), ())
    return out


def _load_rows(op: npu.InstructionOp, reads: frozenset[str], writes: frozenset[str]) -> tuple[int, int] | None:
    """The constant partition range a DMA load writes (its one buffer), if static."""
    if not isinstance(op, npu.DmaLoadOp) or reads or len(writes) != 1:
        return None
    f = op.field_values()
    part, rows = f.get("o_part", 0), f.get("rows")
    if not isinstance(part, int) or not isinstance(rows, int):
        return None
    return part, part + rows


__all__ = ["Inst", "collect", "queue_of"]
