"""npu-insert-sync: the transitive reduction of the waits and the restructuring that keeps
every instruction within the ISA's `MAX_WAITS`, checked against brute force.

- `_Order.dirty` (does a producer run between y*(x) and x) is decided on the program with
  trips clamped to 2; random loop nests compare it with the full iteration space.
- Random kernels (loop nests of loads, stores, matmuls and vector ops on named buffers)
  are synchronised, expanded and analysed with the sanitiser's happens-before relation:
  every pair of executions on different queues that touch a common buffer (one writing)
  must be ordered, no instruction may wait more than `MAX_WAITS` times, none deadlocks.
- The kernels of the FileCheck test run through the simulator with the sanitisers on.
- The ResNet-18 stem that used to need 5 waits compiles at 224x224 on `cloud`.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.parser import Parser

from tilecc.codegen.expand import expand_kernel, expand_module
from tilecc.ir import npu
from tilecc.opt import make_context
from tilecc.passes.npu.insert_sync import _Order, collect, insert_sync, sync_kernel
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import MAX_WAITS
from tilecc.simulator.machine import simulate
from tilecc.simulator.sanitizers import analyze_sync

CLOUD = load_config("cloud")
HERE = Path(__file__).parent
QUEUES = ("dma0", "dma1", "dma2", "dma3", "matrix", "vector")
BUFFERS = ("a", "b", "c", "d", "e")


def _inst(kind: str, reads: list[str], writes: list[str], part: int = 0) -> npu.InstructionOp:
    """A valid one-element instruction on `kind`'s queue (the sanitiser checks fields);
    a load writes partition `part` of its buffer."""
    sram = {"o_mem": 1, "o_part": 0, "o_addr": 0, "o_dtype": 2}
    if kind.startswith("dma") and writes:  # a load
        f = {"queue": int(kind[3]), "a_addr": 0, "a_dtype": 2, "hbm_rs": 1, "hbm_cs": 1,
             **sram, "o_part": part, "rows": 1, "cols": 1}
        return npu.DmaLoadOp(f, reads=[], writes=writes)
    if kind.startswith("dma"):  # a store
        f = {"queue": int(kind[3]), "a_mem": 1, "a_part": 0, "a_addr": 0, "a_dtype": 2,
             "o_addr": 0, "o_dtype": 2, "hbm_rs": 1, "hbm_cs": 1, "rows": 1, "cols": 1}
        return npu.DmaStoreOp(f, reads=reads, writes=[])
    if kind == "matrix":
        f = {"a_mem": 1, "a_part": 0, "a_addr": 0, "a_dtype": 2, "b_mem": 1, "b_part": 0,
             "b_addr": 0, "b_dtype": 2, "o_mem": 2, "o_part": 0, "o_addr": 0, "o_dtype": 1,
             "rows": 1, "k": 1, "cols": 1, "flags": 0}
        return npu.MatmulOp(f, reads=reads, writes=writes)
    f = {"func": 0, "a_mem": 1, "a_part": 0, "a_addr": 0, "a_dtype": 2, **sram, "rows": 1, "cols": 1}
    return npu.VecUnaryOp(f, reads=reads, writes=writes)


@st.composite
def bodies(draw, depth: int = 0):
    """A loop body: instructions and loops (trips 1-3), at most 3 deep."""
    items = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 3 and draw(st.integers(0, 3)) == 0:
            items.append(("loop", draw(st.integers(1, 3)), draw(bodies(depth + 1))))
            continue
        kind = draw(st.sampled_from(QUEUES))
        part = 0
        if kind.startswith("dma") and draw(st.booleans()):
            reads, writes = [], [draw(st.sampled_from(BUFFERS))]
            part = draw(st.integers(0, 2))  # loads into disjoint rows of one buffer are independent
        elif kind.startswith("dma"):
            reads, writes = [draw(st.sampled_from(BUFFERS))], []
        else:
            reads = draw(st.lists(st.sampled_from(BUFFERS), min_size=1, max_size=5, unique=True))
            writes = draw(st.lists(st.sampled_from(BUFFERS), max_size=1))
        items.append(("inst", kind, reads, writes, part))
    return items


def build(body) -> npu.KernelOp:
    def ops(items):
        out = []
        for it in items:
            if it[0] == "loop":
                out.append(npu.LoopOp(it[1], ops(it[2])))
            else:
                out.append(_inst(*it[1:]))
        return out

    k = npu.KernelOp("k0_random")
    for op in ops(body):
        k.body.block.add_op(op)
    return k


def executions(kernel: npu.KernelOp, clamp: int | None = None) -> list[int]:
    """Static instruction index of each execution, in program order."""
    index = {id(x.op): i for i, x in enumerate(collect(kernel))}
    seq: list[int] = []

    def walk(block):
        for op in block.ops:
            if isinstance(op, npu.LoopOp):
                trip = op.trip.value.data
                for _ in range(trip if clamp is None else min(trip, clamp)):
                    walk(op.body.block)
            elif isinstance(op, npu.InstructionOp):
                seq.append(index[id(op)])

    walk(kernel.body.block)
    return seq


def brute_dirty(seq: list[int], p: int, y: int, x: int) -> bool:
    """Is there an execution of x with an execution of p before it and no y in between?"""
    if p == y:
        return False
    seen_p = False  # a p since the last y
    for s in seq:
        if s == x and seen_p:
            return True
        if s == y:
            seen_p = False
        if s == p:
            seen_p = True
    return False


@settings(max_examples=60, deadline=None)
@given(bodies())
def test_dirty_on_clamped_trips_matches_the_full_iteration_space(body):
    k = build(body)
    insts = collect(k)
    order = _Order(insts, k)
    seq = executions(k)
    n = len(insts)
    for p, y, x in itertools.product(range(n), repeat=3):
        if x != p:
            assert order.dirty(p, y, x) == brute_dirty(seq, p, y, x), (p, y, x)


@settings(max_examples=80, deadline=None)
@given(bodies())
def test_synchronised_random_kernels_order_every_conflict(body):
    k = build(body)
    sync_kernel(k, CLOUD.semaphores)
    insts = collect(k)
    for x in insts:
        assert len(x.op.waits.data) <= MAX_WAITS
    stream = expand_kernel(k)
    seq = executions(k)
    assert len(seq) == len(stream)
    sa = analyze_sync(stream, CLOUD)
    assert sa.deadlock is None
    def part(x):  # the partition a load writes (None: everything else)
        return x.op.field_values()["o_part"] if isinstance(x.op, npu.DmaLoadOp) else None

    for i, j in itertools.combinations(range(len(seq)), 2):
        a, b = insts[seq[i]], insts[seq[j]]
        if a.queue == b.queue:
            continue
        if part(a) is not None and part(b) is not None and part(a) != part(b):
            continue  # two loads into different rows of a buffer touch different bytes
        if a.writes & (b.reads | b.writes) or a.reads & b.writes:
            assert sa.happens_before(i, j), (i, j, a.op.name, b.op.name)


def test_waits_implied_by_the_queue_are_dropped():
    """Of the ~40 waits the producers of a convolution band need, the reduction keeps
    those no other edge implies: the second matmul of a pair keeps only its own operands."""
    text = (HERE / "filecheck" / "passes" / "npu-insert-sync.mlir").read_text()
    module = Parser(make_context(), text).parse_module()
    insert_sync(module, CLOUD)
    kernels = {kk.sym_name.data: kk for kk in module.ops if isinstance(kk, npu.KernelOp)}
    mm = [x.op for x in collect(kernels["k1_conv"]) if isinstance(x.op, npu.MatmulOp)]
    assert [len(m.waits.data) for m in mm] == [3, 2]
    add = [x.op for x in collect(kernels["k2_five"]) if isinstance(x.op, npu.VecBinaryOp)][0]
    assert len(add.waits.data) == MAX_WAITS
    # the whole file runs clean through the simulator's sanitisers (races, uninitialised
    # reads, deadlocks): the dropped and moved waits lose no ordering
    stream, _ = expand_module(module)
    simulate(stream, CLOUD, None, functional=False, sanitize=True)


def test_resnet_stem_compiles_at_224_on_cloud():
    """The 7x7 stride-2 stem at 224x224 (batch norm and relu fused) used to need 5
    semaphore waits on one matmul; it compiles and its schedule passes the sanitisers."""
    import tilecc

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU()
    ).eval().to(torch.bfloat16)
    x = torch.randn(1, 3, 224, 224, dtype=torch.bfloat16)
    cm = tilecc.compile(m, (x,), target="cloud")
    s = cm.program.stream
    assert (s["wait_sem"] >= 0).sum(axis=1).max() <= MAX_WAITS
    simulate(s, CLOUD, None, functional=False, sanitize=True)
