"""Expand structured npu kernels into the flat instruction stream (`isa.RECORD`).

Each static instruction inside loops with trips (t0, ..., t{d-1}) becomes t0*...*t{d-1}
records whose fields are its expressions evaluated over the whole iteration space at
once with numpy. Program order is restored with one lexicographic sort on the key
(position at level 0, i0, position at level 1, i1, ..., position at level d), so a
kernel with a million dynamic instructions costs a few numpy calls, not a million IR
ops. A BARRIER record follows every kernel.

An `npu.launch` (a kernel shared between identical launches) is relocated here, per
launch and before any whole-stream step: the kernel's records, expanded once, are
copied and each DMA's HBM address field gets the delta of the argument it is relative
to (`hbm_arg`), giving the records a separate kernel on those tensors would have.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from tilecc.errors import CompileError
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


class _Expanded(NamedTuple):
    stream: np.ndarray
    origin: np.ndarray
    insts: list
    kernel: npu.KernelOp
    # per relocated field: the records holding an HBM address and the argument of each
    relocs: list[tuple[str, np.ndarray, np.ndarray]]


def _expand_with_relocs(kernel: npu.KernelOp) -> _Expanded:
    stream, origin, insts = expand_kernel_with_origin(kernel)
    arg = np.array([-1 if i.op.hbm_arg is None else i.op.hbm_arg.value.data for i in insts], dtype=np.int64)
    fields = [npu.HBM_ADDR_FIELD.get(type(i.op), "") for i in insts]
    relocs = []
    for name in sorted({f for f in fields if f}):
        of_inst = np.array([f == name for f in fields]) & (arg >= 0)
        rows = np.flatnonzero(of_inst[origin]) if len(origin) else np.zeros(0, dtype=np.int64)
        relocs.append((name, rows, arg[origin[rows]]))
    return _Expanded(stream, origin, insts, kernel, relocs)


def relocate(e: _Expanded, deltas: list[int]) -> np.ndarray:
    """The records of kernel `e` launched with its arguments moved by `deltas` bytes."""
    s = e.stream.copy()
    d = np.asarray(deltas, dtype=np.int64)
    for name, rows, args in e.relocs:
        s[name][rows] += d[args].astype(s[name].dtype)
    return s


def launches(module: ModuleOp) -> Iterator[tuple[str, np.ndarray, np.ndarray, list, npu.KernelOp]]:
    """Per launch in program order: (name, records, origin, static instructions, kernel);
    an `npu.launch` is named ``<kernel>#<n>`` (its n-th re-launch) and relocated."""
    done: dict[str, _Expanded] = {}
    count: dict[str, int] = {}
    for op in module.ops:
        if isinstance(op, npu.KernelOp):
            e = done[op.sym_name.data] = _expand_with_relocs(op)
            yield op.sym_name.data, e.stream, e.origin, e.insts, op
        elif isinstance(op, npu.LaunchOp):
            name = op.kernel.data
            e = done.get(name)
            if e is None:
                raise CompileError(f"npu.launch of {name} before its npu.kernel")
            count[name] = count.get(name, 0) + 1
            yield f"{name}#{count[name]}", relocate(e, op.delta_list), e.origin, e.insts, e.kernel


def expand_module(module: ModuleOp) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """The whole program's stream, and (kernel name, first record, record count) per launch."""
    chunks: list[np.ndarray] = []
    spans: list[tuple[str, int, int]] = []
    start = 0
    for name, s, _origin, _insts, _k in launches(module):
        chunks += [s, barrier()]
        spans.append((name, start, len(s)))
        start += len(s) + 1
    if not chunks:
        return empty_stream(0), spans
    return np.concatenate(chunks), spans


__all__ = ["expand_kernel", "expand_kernel_with_origin", "expand_module", "launches", "relocate", "Affine"]
