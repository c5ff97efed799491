"""Expand structured npu kernels into the flat instruction stream (`isa.RECORD`).

Each static instruction inside loops with trips (t0, ..., t{d-1}) becomes t0*...*t{d-1}
records whose fields are its expressions evaluated over the whole iteration space at
once with numpy. Program order is restored with one lexicographic sort on the key
(position at level 0, i0, position at level 1, i1, ..., position at level d), so a
kernel with a million dynamic instructions costs a few numpy calls, not a million IR
ops. A BARRIER record follows every kernel.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tilecc.ir import npu
from tilecc.ir.affine import Affine, Expr
from tilecc.ir.npu_walk import collect
from tilecc.simulator.isa import MAX_WAITS, OPCODE_ENGINE, Engine, Opcode, empty_stream


def _eval(e: int | float | Expr, ivs: list[np.ndarray], n: int) -> np.ndarray:
    if isinstance(e, (int, float)):
        return np.full(n, e)
    return np.broadcast_to(np.asarray(e.evaluate(ivs)), (n,))


def expand_kernel(kernel: npu.KernelOp) -> np.ndarray:
    return expand_kernel_with_origin(kernel)[0]


def expand_kernel_with_origin(kernel: npu.KernelOp) -> tuple[np.ndarray, np.ndarray, list]:
    """The kernel's records, the index of the static instruction each came from, and
    those instructions (`ir/npu_walk.py`): the explorer's asm leads each record
    back to its instruction op and so to the op's source location."""
    insts = collect(kernel)
    if not insts:
        return empty_stream(0), np.zeros(0, dtype=np.int64), insts
    width = 2 * max(len(i.trips) for i in insts) + 1
    parts: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    for inst in insts:
        n = int(np.prod(inst.trips)) if inst.trips else 1
        ivs = list(np.unravel_index(np.arange(n), inst.trips)) if inst.trips else []
        rec = empty_stream(n)
        op = inst.op
        rec["opcode"] = int(op.OPCODE)
        rec["engine"] = int(OPCODE_ENGINE[op.OPCODE])
        for name, value in op.field_exprs().items():
            rec[name] = _eval(value, ivs, n)
        waits = op.wait_list()
        for slot, (sem, expr) in enumerate(waits[:MAX_WAITS]):
            val = _eval(expr, ivs, n).astype(np.int64)
            active = val > 0
            rec["wait_sem"][:, slot] = np.where(active, sem, -1)
            rec["wait_val"][:, slot] = np.where(active, val, 0)
        if op.signal is not None:
            rec["signal_sem"] = op.signal.value.data
        key = np.zeros((n, width), dtype=np.int64)
        for level, pos in enumerate(inst.path):
            key[:, 2 * level] = pos
            if level < len(ivs):
                key[:, 2 * level + 1] = ivs[level]
        parts.append(rec)
        keys.append(key)
    stream = np.concatenate(parts)
    key = np.concatenate(keys)
    order = np.lexsort(key.T[::-1])
    origin = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    return stream[order], origin[order], insts


def barrier() -> np.ndarray:
    rec = empty_stream(1)
    rec["opcode"] = int(Opcode.BARRIER)
    rec["engine"] = int(Engine.ALL)
    return rec


def expand_module(module: ModuleOp) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """The whole program's stream, and (kernel name, first record, record count) per kernel."""
    chunks: list[np.ndarray] = []
    spans: list[tuple[str, int, int]] = []
    start = 0
    for k in module.ops:
        if not isinstance(k, npu.KernelOp):
            continue
        s = expand_kernel(k)
        chunks += [s, barrier()]
        spans.append((k.sym_name.data, start, len(s)))
        start += len(s) + 1
    if not chunks:
        return empty_stream(0), spans
    return np.concatenate(chunks), spans


__all__ = ["expand_kernel", "expand_kernel_with_origin", "expand_module", "Affine"]
