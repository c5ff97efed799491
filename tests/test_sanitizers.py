"""The simulator's sanitisers: races, uninitialised reads, deadlocks, out-of-bounds
accesses (each error type and its message), and planted bugs in compiled programs
(mutation tests) checked against an independent brute-force oracle."""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tilecc
from tilecc.errors import (
    DeadlockError,
    MemoryAccessError,
    RaceError,
    SimulatorError,
    UninitializedReadError,
)
from tilecc.simulator import isa, numerics
from tilecc.simulator import races as race_detector
from tilecc.simulator.config import load_config
from tilecc.simulator.isa import ITEMSIZE, DType, Flag, Mem, Opcode, UnaryFn
from tilecc.simulator.machine import simulate
from tilecc.simulator.sanitizers import (
    analyze_sync,
    check_races,
    check_uninitialized,
    describe,
    redundant_waits,
    sanitize,
)

sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
import mlp as mlp_example  # noqa: E402
import transformer_block as block_example  # noqa: E402

TINY = load_config("tiny")

# ----------------------------------------------------------------------------- builders


def program(*instrs: dict[str, Any]) -> np.ndarray:
    """A stream from dicts of fields; `wait=[(sem, value)]`, `signal=sem`; engine derived."""
    s = isa.empty_stream(len(instrs))
    for i, fields in enumerate(instrs):
        fields = dict(fields)
        op = fields.pop("opcode")
        s[i]["opcode"] = op
        s[i]["engine"] = isa.OPCODE_ENGINE.get(op, 0)
        for j, (sem, val) in enumerate(fields.pop("wait", [])):
            s[i]["wait_sem"][j] = sem
            s[i]["wait_val"][j] = val
        s[i]["signal_sem"] = fields.pop("signal", -1)
        for key, value in fields.items():
            s[i][key] = value
    return s


def load(hbm_addr, rows, cols, dtype=DType.F32, *, part=0, addr=0, mem=Mem.SRAM, rs=None,
         cs=1, queue=0, **kw):
    return dict(
        opcode=Opcode.DMA_LOAD, a_mem=Mem.HBM, a_addr=hbm_addr, a_dtype=dtype, o_dtype=dtype,
        o_mem=mem, o_part=part, o_addr=addr, rows=rows, cols=cols,
        hbm_rs=cols if rs is None else rs, hbm_cs=cs, queue=queue, **kw,
    )


def store(hbm_addr, rows, cols, dtype=DType.F32, *, part=0, addr=0, mem=Mem.SRAM, rs=None,
          cs=1, queue=0, **kw):
    return dict(
        opcode=Opcode.DMA_STORE, a_mem=mem, a_part=part, a_addr=addr, a_dtype=dtype,
        o_dtype=dtype, o_mem=Mem.HBM, o_addr=hbm_addr, rows=rows, cols=cols,
        hbm_rs=cols if rs is None else rs, hbm_cs=cs, queue=queue, **kw,
    )


def matmul(m, k, n, dtype=DType.F32, *, a=(0, 0), b=(0, 0), o=(0, 0), accumulate=False, **kw):
    return dict(
        opcode=Opcode.MATMUL, rows=m, cols=n, k=k, a_mem=Mem.SRAM, a_part=a[0], a_addr=a[1],
        a_dtype=dtype, b_mem=Mem.SRAM, b_part=b[0], b_addr=b[1], b_dtype=dtype,
        o_mem=Mem.ACC, o_part=o[0], o_addr=o[1], o_dtype=DType.F32,
        flags=Flag.ACCUMULATE if accumulate else 0, **kw,
    )


def copy(rows, cols, *, a=(Mem.SRAM, 0, 0), o=(Mem.SRAM, 0, 0), dtype=DType.F32, **kw):
    return dict(
        opcode=Opcode.VEC_UNARY, func=UnaryFn.COPY, rows=rows, cols=cols, a_mem=a[0],
        a_part=a[1], a_addr=a[2], a_dtype=dtype, o_mem=o[0], o_part=o[1], o_addr=o[2],
        o_dtype=dtype, **kw,
    )


def gather(table, rows, cols, k, dtype=DType.F32, *, index=(0, 0), part=0, addr=0, rs=None,
           queue=0, **kw):
    return dict(
        opcode=Opcode.DMA_GATHER, a_mem=Mem.HBM, a_addr=table, a_dtype=dtype, b_mem=Mem.SRAM,
        b_part=index[0], b_addr=index[1], b_dtype=DType.I32, o_mem=Mem.SRAM, o_part=part,
        o_addr=addr, o_dtype=dtype, rows=rows, cols=cols, k=k, hbm_rs=cols if rs is None else rs,
        queue=queue, **kw,
    )


def barrier() -> dict[str, Any]:
    return dict(opcode=Opcode.BARRIER)


def timed(stream: np.ndarray):
    res = simulate(stream, TINY, None, functional=False)
    return res.start, res.end


def full_sanitize(stream: np.ndarray, config=TINY) -> None:
    """What `simulate(..., sanitize=True)` will do: time the program, then sanitise."""
    res = simulate(stream, config, None, functional=False)
    sanitize(stream, config, res.start, res.end)


def instr_re(stream: np.ndarray, i: int) -> str:
    return re.escape(describe(stream, i))


# ----------------------------------------------------------------------------- describe


def test_describe_names_index_engine_and_asm():
    s = program(load(0x100, 16, 16, queue=1, signal=2), matmul(16, 16, 16, wait=[(2, 1)]),
                barrier())
    assert describe(s, 0) == (
        "instruction 0 (dma1): dma.load q1 hbm[0x100 rs=16 cs=1]:f32 -> sram[p0 +0x0]:f32 "
        "16x16 signal(s2)"
    )
    assert describe(s, 1) == (
        "instruction 1 (matrix): matmul sram[p0 +0x0]:f32, sram[p0 +0x0]:f32 -> "
        "acc[p0 +0x0]:f32 m=16 k=16 n=16 wait(s2>=1)"
    )
    assert describe(s, 2) == "instruction 2 (all): barrier"


# ----------------------------------------------------------------------------- races


def test_two_engines_writing_the_same_sram_bytes_race():
    s = program(
        load(0x400, 16, 16, addr=0x0, signal=0),                          # dma0
        load(0, 16, 16, addr=0x100),                                      # dma0 writes 0x100..
        copy(12, 16, a=(Mem.SRAM, 0, 0x0), o=(Mem.SRAM, 4, 0x120), wait=[(0, 1)]),  # vector too
    )
    with pytest.raises(RaceError) as e:
        check_races(s, TINY)
    assert e.value.instructions == (1, 2)
    assert re.fullmatch(
        "race between " + instr_re(s, 1) + " and " + instr_re(s, 2)
        + r": dma0 writes destination and vector writes output overlapping SRAM "
        r"partitions \[4, 16\) bytes \[0x120, 0x140\), with no ordering between them "
        r"\(no queue order, semaphore wait or barrier\)",
        str(e.value),
    ), str(e.value)


def test_dma_load_while_the_matrix_engine_reads_the_buffer_races():
    # iteration 2's load overwrites lhsT while iteration 1's matmul may still read it:
    # the matmul waits for the loads, but the second load does not wait for the matmul
    s = program(
        load(0, 16, 16, addr=0x0, signal=0),
        load(0x400, 16, 16, addr=0x40, queue=1, signal=1),
        matmul(16, 16, 16, a=(0, 0x0), b=(0, 0x40), wait=[(0, 1), (1, 1)], signal=2),
        load(0x800, 16, 16, addr=0x0, signal=0),  # missing wait(s2>=1)
        matmul(16, 16, 16, a=(0, 0x0), b=(0, 0x40), wait=[(0, 2)], accumulate=True),
    )
    with pytest.raises(RaceError) as e:
        check_races(s, TINY)
    assert e.value.instructions == (2, 3)
    assert "matrix reads lhsT and dma0 writes destination overlapping SRAM partitions " \
        "[0, 16) bytes [0x0, 0x40)" in str(e.value)
    fixed = s.copy()
    fixed[3]["wait_sem"][0], fixed[3]["wait_val"][0] = 2, 1
    check_races(fixed, TINY)
    full_sanitize(fixed)


def test_same_queue_is_ordered_and_reads_do_not_conflict():
    s = program(
        load(0, 16, 16),
        load(0x400, 16, 16, signal=0),              # same bytes, same queue: ordered after 0
        copy(16, 16, a=(Mem.SRAM, 0, 0), o=(Mem.SRAM, 0, 0x100), wait=[(0, 1)]),
        store(0x800, 16, 16, addr=0, queue=1, wait=[(0, 1)]),  # reads like the copy
    )
    full_sanitize(s)


def test_race_on_hbm_is_exact_for_strided_sets():
    # a store writes the even f32 elements of a row, a load on another queue reads the
    # odd ones: the bounding ranges overlap, the bytes do not
    s = program(
        load(0x0, 4, 4, queue=0, signal=0),
        store(0x1000, 1, 8, addr=0x0, cs=2, queue=1, wait=[(0, 1)]),  # 0x1000, 0x1008, ..
        load(0x1004, 1, 8, addr=0x100, cs=2, queue=0),                # 0x1004, 0x100c, ..
    )
    check_races(s, TINY)
    bad = s.copy()
    bad[2]["a_addr"] = 0x1008  # now reads elements the store writes
    with pytest.raises(RaceError) as e:
        check_races(bad, TINY)
    assert e.value.instructions == (1, 2)
    assert "dma1 writes destination and dma0 reads source overlapping HBM bytes " \
        "[0x1008, 0x103c) (28 bytes in that range)" in str(e.value)


def test_gather_reads_its_index_column_and_may_read_any_table_row():
    table = 0x2000  # 10 rows of 8 f32
    s = program(
        load(0x0, 4, 1, DType.I32, addr=0x0, signal=0),                 # the indices
        gather(table, 4, 8, 10, index=(0, 0x0), addr=0x40, queue=1, wait=[(0, 1)]),
        load(0x100, 1, 8, addr=0x100, signal=1),
        store(table + 9 * 32, 1, 8, addr=0x100, queue=0, wait=[(1, 1)]),  # writes row 9
    )
    with pytest.raises(RaceError) as e:  # the indices are data: row 9 may be gathered
        check_races(s, TINY)
    assert e.value.instructions == (1, 3)
    assert "dma1 reads table and dma0 writes destination overlapping HBM bytes " \
        "[0x2120, 0x2140)" in str(e.value)
    s[3]["o_addr"] = table + 10 * 32  # just past the table
    full_sanitize(s)
    s[1]["wait_sem"][0] = -1  # the gather no longer waits for its indices
    with pytest.raises(RaceError, match="dma0 writes destination and dma1 reads index column "
                       r"overlapping SRAM partitions \[0, 4\) bytes \[0x0, 0x4\)"):
        check_races(s, TINY)


def test_semaphore_with_signallers_on_several_queues():
    # s0 is signalled by dma0 and dma1; whichever finishes first makes s0 >= 1
    base = [
        load(0x0, 16, 16, addr=0x0, queue=0, signal=0),
        load(0x400, 16, 16, addr=0x40, queue=1, signal=0),
    ]
    reads_both = matmul(16, 16, 16, a=(0, 0x0), b=(0, 0x40), wait=[(0, 1)])
    with pytest.raises(RaceError):
        check_races(program(*base, reads_both), TINY)
    reads_both["wait"] = [(0, 2)]  # both must have finished
    full_sanitize(program(*base, reads_both))


def test_wait_on_a_later_signal_is_ordered_not_reported():
    # program order is not a topological order: the vector op waits for a later load
    s = program(
        copy(16, 16, a=(Mem.SRAM, 0, 0x0), o=(Mem.SRAM, 0, 0x100), wait=[(1, 1)], signal=0),
        load(0, 16, 16, addr=0x0, signal=1),
        store(0x800, 16, 16, addr=0x100, queue=1, wait=[(0, 1)]),
    )
    full_sanitize(s)
    sync = analyze_sync(s, TINY)
    assert sync.happens_before(1, 0) and sync.happens_before(0, 2)
    assert sync.happens_before(1, 2) and not sync.happens_before(0, 1)


def test_barrier_orders_everything():
    s = program(
        load(0, 16, 16, addr=0x0),
        barrier(),
        copy(16, 16, a=(Mem.SRAM, 0, 0x0), o=(Mem.SRAM, 0, 0x0)),
    )
    full_sanitize(s)


def test_sanitize_reports_the_lowest_instruction_index():
    body = [
        load(0, 16, 16, addr=0x0, signal=0),
        copy(16, 16, a=(Mem.SRAM, 0, 0x0), o=(Mem.SRAM, 0, 0x100), wait=[(0, 1)]),
        load(0x400, 16, 16, addr=0x0),  # overwrites what the copy reads: no wait, a race
    ]
    uninit = copy(4, 4, a=(Mem.SRAM, 0, 0x800), o=(Mem.SRAM, 0, 0x900))  # reads nothing written
    with pytest.raises(RaceError) as e:
        full_sanitize(program(*body, uninit))
    assert e.value.instructions == (1, 2)
    with pytest.raises(UninitializedReadError) as e:
        full_sanitize(program(uninit, *body))
    assert e.value.instruction == 0


# ----------------------------------------------------------------------------- uninitialised


def test_read_of_never_written_sram():
    s = program(
        load(0, 16, 8, addr=0x0, signal=0),
        matmul(16, 16, 16, a=(0, 0x0), b=(0, 0x0), wait=[(0, 1)]),  # reads 64 bytes, 32 written
    )
    start, end = timed(s)
    with pytest.raises(UninitializedReadError) as e:
        check_uninitialized(s, TINY, start, end)
    assert e.value.instruction == 1
    assert re.fullmatch(
        instr_re(s, 1) + r": reads uninitialised SRAM partitions \[0, 16\) bytes "
        r"\[0x20, 0x40\) \(lhsT\): nothing wrote those bytes before cycle [\d.]+",
        str(e.value),
    ), str(e.value)


def test_accumulate_reads_the_accumulator_and_overwrite_does_not():
    s = program(
        load(0, 16, 16, signal=0),
        matmul(16, 16, 16, wait=[(0, 1)]),                     # writes acc[0:16, 0:64)
        matmul(4, 16, 16, o=(8, 0x40), accumulate=True),       # reads acc[8:12, 0x40:0x80)
    )
    start, end = timed(s)
    with pytest.raises(UninitializedReadError) as e:
        check_uninitialized(s, TINY, start, end)
    assert "reads uninitialised ACC partitions [8, 12) bytes [0x40, 0x80) (output " \
        "(accumulate reads it))" in str(e.value)
    s[2]["flags"] = 0
    check_uninitialized(s, TINY, *timed(s))


def test_pipelined_matmuls_accumulate_when_they_end():
    # back to back on a pipelined matrix engine the second matmul starts before the
    # first ends, but it reads the accumulator (accumulate) only when it writes it
    cfg = dataclasses.replace(TINY, matrix=dataclasses.replace(TINY.matrix, mode="pipelined"))
    s = program(
        load(0, 16, 16, signal=0),
        matmul(16, 16, 16, wait=[(0, 1)]),
        matmul(16, 16, 16, accumulate=True, signal=1),
        copy(16, 16, a=(Mem.ACC, 0, 0), o=(Mem.SRAM, 0, 0x100), wait=[(1, 1)]),
    )
    res = simulate(s, cfg, None, functional=False)
    assert res.start[2] < res.end[1]
    check_uninitialized(s, cfg, res.start, res.end)
    sanitize(s, cfg, res.start, res.end)
    assert oracle_uninitialized(s, res.start, res.end, cfg) == set()
    s[1]["flags"] = Flag.ACCUMULATE  # now the first one reads it uninitialised
    res = simulate(s, cfg, None, functional=False)
    with pytest.raises(UninitializedReadError, match=r"reads uninitialised ACC partitions "
                       r"\[0, 16\) bytes \[0x0, 0x40\) \(output \(accumulate reads it\)\)"):
        sanitize(s, cfg, res.start, res.end)


def test_read_before_the_write_in_simulated_time_is_uninitialised():
    # the store waits for nothing: it reads the tile before the load has written it
    s = program(load(0, 16, 16), store(0x800, 16, 16, queue=1))
    with pytest.raises((UninitializedReadError, RaceError)):
        full_sanitize(s)
    with pytest.raises(UninitializedReadError):
        check_uninitialized(s, TINY, *timed(s))


def test_on_chip_memory_persists_across_barriers():
    s = program(load(0, 16, 16, signal=0), barrier(), store(0x800, 16, 16, queue=1))
    full_sanitize(s)


# ----------------------------------------------------------------------------- deadlock


def test_deadlock_names_each_blocked_engine_and_the_semaphores():
    s = program(
        load(0, 16, 16, wait=[(1, 1)], signal=0),
        copy(16, 16, o=(Mem.SRAM, 0, 0x100), wait=[(0, 1)], signal=1),
        barrier(),
    )
    with pytest.raises(DeadlockError) as e:
        sanitize(s, TINY)
    assert str(e.value) == (
        "deadlock in kernel 0: waits that can never be met (semaphore values once every "
        "runnable instruction has finished): dma0 blocked at " + describe(s, 0)
        + " waiting on semaphore 1 >= 1 (value 0); vector blocked at " + describe(s, 1)
        + " waiting on semaphore 0 >= 1 (value 0)"
    )
    # the simulator's own message names index, engine, opcode and semaphore values
    with pytest.raises(DeadlockError) as e:
        simulate(s, TINY, None, functional=False)
    msg = str(e.value)
    assert "dma0 blocked at instruction 0" in msg and "vector blocked at instruction 1" in msg
    assert "semaphore 1 >= 1 (value 0)" in msg and "semaphore 0 >= 1 (value 0)" in msg


def test_deadlock_on_a_count_never_reached():
    s = program(load(0, 16, 16, signal=3), copy(16, 16, o=(Mem.SRAM, 0, 0x100), wait=[(3, 2)]))
    with pytest.raises(DeadlockError, match=r"vector blocked at instruction 1 \(vector\): "
                       r"vec\.copy .* waiting on semaphore 3 >= 2 \(value 1\)"):
        check_races(s, TINY)


# ----------------------------------------------------------------------------- bounds


def test_out_of_bounds_names_the_instruction_and_the_range():
    s = program(load(0, 16, 16), load(0, 4, 16, part=14, addr=0x40))
    with pytest.raises(MemoryAccessError) as e:
        sanitize(s, TINY)
    assert str(e.value) == (
        describe(s, 1) + ": destination SRAM partitions [14, 18) out of bounds "
        "(SRAM has 16 partitions)"
    )
    with pytest.raises(MemoryAccessError, match=r"instruction 1 \(dma0 DMA_LOAD\): destination "
                       r"SRAM partitions \[14, 18\) out of bounds"):
        simulate(s, TINY, None, functional=False)
    s = program(store(TINY.hbm.capacity_bytes - 32, 2, 16, queue=1))
    with pytest.raises(MemoryAccessError) as e:
        sanitize(s, TINY)
    assert str(e.value) == (
        describe(s, 0) + ": destination HBM bytes [0x3fffffe0, 0x40000060) out of bounds "
        "(HBM has 0x40000000 bytes; 2 x 16 elements, strides 16, 1 elements)"
    )


# ----------------------------------------------------------------------------- oracle


def _footprints(stream: np.ndarray) -> list[list[tuple]]:
    """Independent of the sanitiser: per instruction, (mem, write, part range, byte set or
    byte range) of each access, from the ISA definitions."""
    out: list[list[tuple]] = []
    for r in stream:
        op, acc = int(r["opcode"]), []
        rows, cols, k = int(r["rows"]), int(r["cols"]), int(r["k"])

        def chip(slot, nr, nc, write, at_end=False):
            isz = ITEMSIZE[DType(int(r[f"{slot}_dtype"]))]
            p, a = int(r[f"{slot}_part"]), int(r[f"{slot}_addr"])
            acc.append((int(r[f"{slot}_mem"]), write, (p, p + nr), (a, a + nc * isz), at_end))

        def hbm(slot, write, nr=rows, cs=int(r["hbm_cs"])):
            isz = ITEMSIZE[DType(int(r[f"{slot}_dtype"]))]
            rr = np.arange(nr)[:, None, None] * int(r["hbm_rs"]) * isz
            cc = np.arange(cols)[None, :, None] * cs * isz
            b = np.unique((int(r[f"{slot}_addr"]) + rr + cc + np.arange(isz)).ravel())
            acc.append((int(Mem.HBM), write, (0, 1), b))

        if op == Opcode.DMA_GATHER:  # any row of the table may be read
            hbm("a", False, nr=k, cs=1)
            chip("b", rows, 1, False)
            chip("o", rows, cols, True)
        elif op == Opcode.DMA_LOAD:
            hbm("a", False)
            chip("o", rows, cols, True)
        elif op == Opcode.DMA_STORE:
            chip("a", rows, cols, False)
            hbm("o", True)
        elif op == Opcode.MATMUL:
            chip("a", k, rows, False)
            chip("b", k, cols, False)
            chip("o", rows, cols, True)
            if int(r["flags"]) & Flag.ACCUMULATE:  # read-modify-write when it ends
                chip("o", rows, cols, False, at_end=True)
        elif op != Opcode.BARRIER:
            chip("a", rows, cols, False)
            f = int(r["flags"])
            if op == Opcode.VEC_BINARY and not f & Flag.B_IMM:
                chip("b", rows, 1 if f & Flag.B_COLUMN else cols, False)
            chip("o", rows, 1 if op == Opcode.VEC_REDUCE else cols, True)
        out.append(acc)
    return out


def _touch(x: tuple, y: tuple) -> bool:
    if x[0] != y[0] or not (x[1] or y[1]):
        return False
    if x[2][0] >= y[2][1] or y[2][0] >= x[2][1]:
        return False
    if x[0] == Mem.HBM:
        return np.intersect1d(x[3], y[3], assume_unique=True).size > 0
    return x[3][0] < y[3][1] and y[3][0] < x[3][1]


def oracle(stream: np.ndarray, queues: int = TINY.dma.queues, fps: list | None = None):
    """Brute force: ('deadlock', None) or ('races', {(i, j), ...}) from explicit edges
    (queue order, v-th signaller of single-queue semaphores), Kahn's algorithm,
    bitset reachability and all-pairs footprint overlap within each kernel."""
    n = len(stream)
    op = stream["opcode"].tolist()
    dma = (int(Opcode.DMA_LOAD), int(Opcode.DMA_STORE), int(Opcode.DMA_GATHER))
    qs = [
        q if o in dma else queues if o == Opcode.MATMUL else queues + 1
        for o, q in zip(op, stream["queue"].tolist())
    ]
    queue = qs.__getitem__
    signal = stream["signal_sem"].tolist()
    wait_sem, wait_val = stream["wait_sem"].tolist(), stream["wait_val"].tolist()

    fps = _footprints(stream) if fps is None else fps
    races: set[tuple[int, int]] = set()
    cuts = [-1, *[i for i, o in enumerate(op) if o == Opcode.BARRIER], n]
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        idx = list(range(lo + 1, hi))
        preds: dict[int, set[int]] = {i: set() for i in idx}
        last: dict[int, int] = {}
        sigs: dict[int, list[int]] = collections.defaultdict(list)
        for i in idx:
            if signal[i] >= 0:
                sigs[signal[i]].append(i)
        for i in idx:
            q = queue(i)
            if q in last:
                preds[i].add(last[q])
            last[q] = i
            for w, v in zip(wait_sem[i], wait_val[i]):
                if w < 0 or v == 0:
                    continue
                assert len({queue(x) for x in sigs[w]}) <= 1, "oracle: single-queue sems only"
                if v > len(sigs[w]):
                    return "deadlock", None
                preds[i].add(sigs[w][v - 1])
        succ: dict[int, list[int]] = collections.defaultdict(list)
        indeg = {i: len(p) for i, p in preds.items()}
        for i, p in preds.items():
            for x in p:
                succ[x].append(i)
        ready = [i for i in idx if indeg[i] == 0]
        reach: dict[int, int] = {}  # bitset of instructions (offset lo+1) before i
        done = 0
        while ready:
            i = ready.pop()
            done += 1
            bits = 0
            for x in preds[i]:
                bits |= reach[x] | (1 << (x - lo - 1))
            reach[i] = bits
            for y in succ[i]:
                indeg[y] -= 1
                if indeg[y] == 0:
                    ready.append(y)
        if done < len(idx):
            return "deadlock", None
        for a_pos, a in enumerate(idx):
            for b in idx[a_pos + 1 :]:
                if queue(a) == queue(b):
                    continue
                if reach[b] >> (a - lo - 1) & 1 or reach[a] >> (b - lo - 1) & 1:
                    continue
                if any(_touch(x, y) for x in fps[a] for y in fps[b]):
                    races.add((a, b))
    return "races", races


def test_oracle_agrees_on_the_hand_built_races():
    s = program(load(0, 16, 16, signal=0), load(0x400, 16, 16, addr=0x40, queue=1, signal=1),
                matmul(16, 16, 16, a=(0, 0x0), b=(0, 0x40), wait=[(0, 1)]))
    assert oracle(s) == ("races", {(1, 2)})
    with pytest.raises(RaceError) as e:
        check_races(s, TINY)
    assert e.value.instructions == (1, 2)


def _random_program(rng: np.random.Generator) -> np.ndarray:
    """Small programs with many overlapping footprints and random waits; each semaphore
    is signalled from one queue only (what the oracle supports)."""
    n = int(rng.integers(4, 16))
    instrs: list[dict[str, Any]] = []
    sem_queue: dict[int, int] = {}
    signalled: collections.Counter = collections.Counter()  # signals so far in the kernel

    def tile():
        return int(rng.choice([0, 4, 8])), int(rng.choice([0, 0x20, 0x40, 0x60]))

    for _ in range(n):
        kind = rng.integers(5)
        rows, cols = int(rng.choice([4, 8])), int(rng.choice([4, 8]))
        hbm_addr = int(rng.choice([0, 0x40, 0x80]))
        queue = int(rng.integers(2))
        part, addr = tile()
        # HBM layouts: row-major, transposed, every other element, broadcast rows
        rs, cs = [(cols, 1), (1, rows), (2 * cols, 2), (0, 1)][int(rng.integers(4))]
        if kind == 0:
            ins = load(hbm_addr, rows, cols, part=part, addr=addr, queue=queue, rs=rs, cs=cs)
            q = queue
        elif kind == 1:
            ins = store(hbm_addr, rows, cols, part=part, addr=addr, queue=queue, rs=rs, cs=cs)
            q = queue
        elif kind == 2:
            ins, q = matmul(rows, 4, cols, a=tile(), b=tile(), o=(part, addr),
                            accumulate=bool(rng.integers(2))), 2
        elif kind == 3:
            ins, q = copy(rows, cols, a=(Mem.SRAM, *tile()), o=(Mem.SRAM, part, addr)), 3
        else:
            instrs.append(barrier())
            signalled.clear()
            continue
        waits = []
        for _ in range(int(rng.integers(0, 3))):
            w = int(rng.integers(6))
            # mostly satisfiable by earlier signals; sometimes a later one (or never)
            top = signalled[w] + (1 if rng.random() < 0.15 else 0)
            if top > 0:
                waits.append((w, int(rng.integers(1, top + 1))))
        if waits:
            ins["wait"] = waits
        if rng.random() < 0.6:
            w = int(rng.integers(6))
            if sem_queue.setdefault(w, q) == q:
                ins["signal"] = w
                signalled[w] += 1
        instrs.append(ins)
    return program(*instrs)


@pytest.mark.parametrize("chunk", [None, 3])
def test_random_programs_agree_with_the_oracles(chunk, monkeypatch):
    if chunk is not None:  # the race detector's chunks of kernels, tiny
        monkeypatch.setattr(race_detector, "_CHUNK_FOOTPRINTS", chunk)
    rng = np.random.default_rng(7)
    seen = collections.Counter()
    for _ in range(400):
        s = _random_program(rng)
        verdict, races = oracle(s)
        sync = analyze_sync(s, TINY)
        if verdict == "deadlock":
            assert sync.deadlock is not None
            with pytest.raises(DeadlockError):
                simulate(s, TINY, None, functional=False)
            seen["deadlock"] += 1
            continue
        assert sync.deadlock is None
        if races:
            with pytest.raises(RaceError) as e:
                check_races(s, TINY)
            assert e.value.instructions in races
            if np.all(np.diff(sync.rank) > 0):
                # program order is topological (no wait on a later signal): the reported
                # race is the one whose later instruction comes first
                assert e.value.instructions[1] == min(b for _, b in races)
            seen["race"] += 1
        else:
            check_races(s, TINY)
            seen["race-free"] += 1
        start, end = timed(s)
        uninit = oracle_uninitialized(s, start, end)
        if uninit:
            with pytest.raises(UninitializedReadError) as e:
                check_uninitialized(s, TINY, start, end)
            assert e.value.instruction == min(uninit)
            seen["uninitialised"] += 1
        else:
            check_uninitialized(s, TINY, start, end)
    assert min(seen["deadlock"], seen["race"], seen["race-free"], seen["uninitialised"]) >= 20, seen


# ----------------------------------------------------------------------------- compiled programs

MODELS = {
    "embedding_f32": lambda: (
        _Embed(), (torch.randint(0, 50, (3, 7)),),
    ),
    "mlp_f32": lambda: (mlp_example.MLP(53, 29, 31), (torch.randn(37, 53),)),
    "mlp_bf16": lambda: (
        mlp_example.MLP(53, 29, 31).to(torch.bfloat16),
        (torch.randn(37, 53, dtype=torch.bfloat16),),
    ),
    "block_f32": lambda: (block_example.Block(), (torch.randn(2, 19, 48),)),
    "block_bf16": lambda: (
        block_example.Block().to(torch.bfloat16),
        (torch.randn(2, 19, 48, dtype=torch.bfloat16),),
    ),
}
MUTANTS_PER_KIND = 30


class _Embed(torch.nn.Module):
    """Gathers (DMA_GATHER) feeding a linear layer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 24)
        self.fc = torch.nn.Linear(24, 20)

    def forward(self, ids):
        return torch.relu(self.fc(self.emb(ids)))
CAUGHT = (RaceError, UninitializedReadError, DeadlockError, MemoryAccessError)
RESULTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
EQUIVALENT: list[str] = []  # shifted-address mutants that leave the HBM image unchanged


def oracle_uninitialized(stream: np.ndarray, start: np.ndarray, end: np.ndarray,
                         config=TINY, fps: list | None = None) -> set[int]:
    """Brute force: instructions reading on-chip bytes whose earliest write comes after
    the read: reads happen at the start (a write ending then counts: writes go first),
    an accumulating matmul's read of its output at its end (after writes ending earlier,
    or at the same time by an earlier instruction)."""
    shape = {
        int(Mem.SRAM): (config.sram.partitions, config.sram.bytes_per_partition),
        int(Mem.ACC): (config.accumulator.partitions, config.accumulator.bytes_per_partition),
    }
    first = {m: np.full(sh, np.inf) for m, sh in shape.items()}  # earliest write's end
    first_by = {m: np.full(sh, len(stream)) for m, sh in shape.items()}  # its index
    fps = _footprints(stream) if fps is None else fps
    chip = [[x for x in acc if x[0] != Mem.HBM] for acc in fps]
    for i, acc in enumerate(chip):
        for mem, write, (p0, p1), (b0, b1), _ in acc:
            if write:
                t, by = first[mem][p0:p1, b0:b1], first_by[mem][p0:p1, b0:b1]
                better = (end[i] < t) | ((end[i] == t) & (i < by))
                t[better], by[better] = end[i], i
    out = set()
    for i, acc in enumerate(chip):
        for mem, write, (p0, p1), (b0, b1), at_end in acc:
            if write:
                continue
            t, by = first[mem][p0:p1, b0:b1], first_by[mem][p0:p1, b0:b1]
            if at_end:
                bad = (t > end[i]) | ((t == end[i]) & (by >= i))
            else:
                bad = t > start[i]
            if bad.any():
                out.add(i)
    return out


class Compiled:
    def __init__(self, name: str):
        torch.manual_seed(0)
        model, inputs = MODELS[name]()
        cm = tilecc.compile(model.eval(), inputs, target="tiny")
        self.name, self.program, self.inputs = name, cm.program, inputs
        self.stream, self.config = cm.program.stream, cm.program.config
        self.footprints = _footprints(self.stream)
        self.clock = analyze_sync(self.stream, self.config).clock
        self.image = self.run(self.stream)

    def run(self, stream: np.ndarray) -> np.ndarray:
        """The HBM image after a functional simulation of `stream` on this program's
        inputs (outputs and intermediates)."""
        hbm = self.program.hbm_image()
        for spec, t in zip(self.program.inputs, self.inputs):
            if t.dtype in (torch.int64, torch.bool):  # stored as i32 on the device
                t = t.to(torch.int32)
            data, _ = numerics.torch_to_storage(t)
            raw = data.reshape(-1).view(np.uint8)
            hbm[spec.offset : spec.offset + raw.size] = raw
        simulate(stream, self.config, hbm)
        return hbm

    def outputs_changed(self, stream: np.ndarray) -> str:
        image = self.run(stream)
        for o in self.program.outputs:
            sl = slice(o.offset, o.offset + o.nbytes)
            if not np.array_equal(image[sl], self.image[sl]):
                return "wrong outputs"
        if not np.array_equal(image, self.image):
            return "same outputs, other HBM bytes differ"
        return "equivalent (identical HBM image)"

    def caught(self, stream: np.ndarray) -> SimulatorError | None:
        try:
            full_sanitize(stream, self.config)
        except CAUGHT as e:
            return e
        return None


@pytest.fixture(scope="module", params=list(MODELS))
def compiled(request) -> Compiled:
    return Compiled(request.param)


def test_compiled_programs_are_clean(compiled):
    s = compiled.stream
    res = simulate(s, compiled.config, None, functional=False)
    t = time.perf_counter()
    sanitize(s, compiled.config, res.start, res.end)
    assert time.perf_counter() - t < 1.0, "sanitize on a ~2k-instruction program"
    assert oracle(s, fps=compiled.footprints) == ("races", set())
    assert oracle_uninitialized(s, res.start, res.end) == set()
    sanitize(s, compiled.config)  # times the program itself


def check_mutant(c: Compiled, mutant: np.ndarray, kind: str, fps: list | None = None) -> str:
    """The sanitiser must flag a mutant exactly when the independent checks find a
    problem: the simulator's deadlock or bounds error, or a race or uninitialised read
    by the brute-force oracles (and what it names must be one of theirs). A mutant
    without any is race-free and deterministic: its effect (wrong outputs or none) is
    recorded. Returns the verdict."""
    err = c.caught(mutant)
    try:
        res = simulate(mutant, c.config, None, functional=False)
    except (DeadlockError, MemoryAccessError) as e:
        assert type(err) is type(e), (err, e)
        if isinstance(e, DeadlockError):  # the static check agrees with the simulator
            try:
                check_races(mutant, c.config)
            except DeadlockError:
                pass
            except RaceError as r:
                # a mutant whose waits deadlock may race first (a dropped signaller shifts
                # the counts that ordered other pairs, before the waits that never come):
                # flagged either way; where the brute force finds races, it is one of them
                found, races = oracle(mutant, fps=_footprints(mutant) if fps is None else fps)
                assert found == "deadlock" or r.instructions in races, (found, r.instructions, races)
            else:
                pytest.fail(f"{kind} mutant deadlocks in the simulator, the static check finds nothing")
        verdict = f"caught {type(e).__name__}"
    else:
        fps = _footprints(mutant) if fps is None else fps
        _, races = oracle(mutant, fps=fps)
        uninit = oracle_uninitialized(mutant, res.start, res.end, c.config, fps)
        if races or uninit:
            assert err is not None, f"{kind} mutant not caught: races {races}, uninit {uninit}"
            if isinstance(err, RaceError):
                assert err.instructions in races, (err.instructions, races)
            else:
                assert isinstance(err, UninitializedReadError), err
                assert err.instruction in uninit, (err.instruction, uninit)
            verdict = f"caught {type(err).__name__}"
        else:
            assert err is None, f"false positive on a clean {kind} mutant: {err}"
            verdict = c.outputs_changed(mutant)
    RESULTS[kind][verdict] += 1
    return verdict


def test_removed_waits_are_caught_unless_redundant(compiled):
    c, rng = compiled, np.random.default_rng(1)
    red = redundant_waits(c.stream, c.config)
    slots = np.argwhere(c.stream["wait_sem"] >= 0)
    RESULTS["remove wait"]["(waits in the programs)"] += len(slots)
    RESULTS["remove wait"]["(of which redundant)"] += int(red.sum())
    for i, j in slots[rng.choice(len(slots), min(MUTANTS_PER_KIND, len(slots)), replace=False)]:
        m = c.stream.copy()
        m["wait_sem"][i, j], m["wait_val"][i, j] = -1, 0
        clock = analyze_sync(m, c.config).clock
        if red[i, j]:
            # implied by the other waits: happens-before is unchanged, nothing to catch
            assert np.array_equal(clock, c.clock)
            assert check_mutant(c, m, "remove wait", c.footprints) == "equivalent (identical HBM image)"
            RESULTS["remove wait"]["(redundant mutants)"] += 1
        else:
            assert not np.array_equal(clock, c.clock)
            check_mutant(c, m, "remove wait", c.footprints)


def test_swapped_semaphores_are_caught(compiled):
    c, rng = compiled, np.random.default_rng(2)
    s = c.stream
    kernel = np.cumsum(s["opcode"] == Opcode.BARRIER)
    waiting = np.flatnonzero((s["wait_sem"] >= 0).any(axis=1))
    done = 0
    for i in rng.permutation(waiting):
        if done == MUTANTS_PER_KIND:
            break
        m = s.copy()
        used = np.flatnonzero(m["wait_sem"][i] >= 0)
        pairs = [(a, b) for a in used for b in used
                 if a < b and s["wait_sem"][i, a] != s["wait_sem"][i, b]
                 and s["wait_val"][i, a] != s["wait_val"][i, b]]
        if pairs:  # swap the semaphore ids of two of its waits
            a, b = pairs[rng.integers(len(pairs))]
            m["wait_sem"][i, a], m["wait_sem"][i, b] = s["wait_sem"][i, b], s["wait_sem"][i, a]
        else:  # wait on another semaphore signalled in the same kernel instead
            j = used[rng.integers(len(used))]
            same = (kernel == kernel[i]) & (s["signal_sem"] >= 0)
            others = sorted(set(s["signal_sem"][same].tolist()) - {int(s["wait_sem"][i, j])})
            if not others:
                continue
            m["wait_sem"][i, j] = rng.choice(others)
        done += 1
        check_mutant(c, m, "swap semaphores", c.footprints)
        if not np.array_equal(analyze_sync(m, c.config).clock, c.clock):
            RESULTS["swap semaphores"]["(happens-before changed)"] += 1


def test_shifted_addresses_are_caught_or_change_the_outputs(compiled):
    c, rng = compiled, np.random.default_rng(3)
    s = c.stream
    op = s["opcode"]
    slots = []
    for i in np.flatnonzero(op != Opcode.BARRIER).tolist():
        o = int(op[i])
        chip = ["o"] if o == Opcode.DMA_LOAD else ["a"] if o == Opcode.DMA_STORE else ["a", "o"]
        if o == Opcode.MATMUL or (o == Opcode.VEC_BINARY and not s["flags"][i] & Flag.B_IMM):
            chip.append("b")
        slots += [(i, slot) for slot in chip]
    for k, pick in enumerate(rng.choice(len(slots), MUTANTS_PER_KIND, replace=False)):
        i, slot = slots[pick]
        m = s.copy()
        if k % 2:
            m[f"{slot}_part"][i] += 1
            kind = "shift address +1 partition"
        else:
            m[f"{slot}_addr"][i] += 64
            kind = "shift address +64 bytes"
        fps = list(c.footprints)
        fps[i] = _footprints(m[i : i + 1])[0]
        if check_mutant(c, m, kind, fps).startswith("equivalent"):
            EQUIVALENT.append(f"{c.name}: {slot} of {describe(s, i)}: {kind}")


def test_dropped_stores_are_caught_or_change_the_outputs(compiled):
    c, rng = compiled, np.random.default_rng(4)
    stores = np.flatnonzero(c.stream["opcode"] == Opcode.DMA_STORE)
    for i in rng.choice(stores, min(MUTANTS_PER_KIND, len(stores)), replace=False):
        verdict = check_mutant(c, np.delete(c.stream, i), "drop store")
        assert verdict != "equivalent (identical HBM image)", describe(c.stream, i)


def test_zz_report_mutation_results(capsys):
    with capsys.disabled():
        print("\nmutation results (all compiled programs):")
        for kind, counts in sorted(RESULTS.items()):
            print(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for line in EQUIVALENT:
            print(f"  equivalent: {line}")


# ----------------------------------------------------------------------------- scale


@pytest.mark.slow
def test_sanitize_scales_to_100k_instructions():
    torch.manual_seed(0)
    model, inputs = MODELS["block_bf16"]()
    p = tilecc.compile(model.eval(), inputs, target="tiny").program
    reps = -(-100_000 // len(p.stream))
    big = np.concatenate([p.stream] * reps)
    res = simulate(big, p.config, None, functional=False)
    t = time.perf_counter()
    sanitize(big, p.config, res.start, res.end)
    seconds = time.perf_counter() - t
    print(f"\nsanitize: {len(big)} instructions in {seconds:.2f} s")
    assert seconds < 30
