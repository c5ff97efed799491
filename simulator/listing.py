"""Instruction listing: the assembly text of instruction records, for messages and traces.

The simulator names instructions in its errors and timelines by their assembly line
(``matmul sram[p0 +0x0]:bf16, sram[p0 +0x400]:bf16 -> acc[p0 +0x0]:f32 m=16 k=16
n=16``); `codegen.asm` prints whole programs with the same lines (after validating the
stream) and parses them back. Only the fields an opcode uses are written. An imm value
is written in the shortest decimal form that reads back to the same float32, else as a
hex float, and a NaN with a payload as ``nan(0xBITS)``.

`instruction_lines` formats every record of a stream (raising on a field that has no
name, e.g. an unknown opcode); `instruction_text` formats one record and never raises;
`describe` gives the ``instruction 17 (matrix): <asm text>`` form of the sanitisers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from tilecc.simulator.isa import (
    DTYPE_NAMES,
    OPCODE_ENGINE,
    RECORD,
    BinaryFn,
    Engine,
    Flag,
    Mem,
    Opcode,
    ReduceFn,
    UnaryFn,
)

__all__ = [
    "BINARY_NAMES",
    "DT_NAMES",
    "MEM_NAMES",
    "REDUCE_NAMES",
    "UNARY_NAMES",
    "describe",
    "engine_name",
    "format_imm",
    "imm_bits",
    "instruction_lines",
    "instruction_text",
]

MEM_NAMES = {int(m): m.name.lower() for m in Mem}  # hbm, sram, acc
DT_NAMES = {int(d): n for d, n in DTYPE_NAMES.items()}

UNARY_NAMES = {int(f): f.name.lower() for f in UnaryFn}
BINARY_NAMES = {int(f): f.name.lower() for f in BinaryFn}
REDUCE_NAMES = {int(f): "reduce_" + f.name.lower() for f in ReduceFn}

_F32_OVERFLOW = 3.4028235677973366e38  # (2 - 2**-24) * 2**127
_QNAN = 0x7FC00000
_NEG_QNAN = 0xFFC00000


def imm_bits(text: str) -> int:
    """The float32 bits of an imm literal (as the grammar's FLOAT accepts it).

    Raises ValueError with a reason for values that are not float32."""
    s = text
    sign = ""
    if s[:1] in "+-":
        sign, s = s[0], s[1:]
    if s.startswith("nan"):
        if s == "nan":
            return _NEG_QNAN if sign == "-" else _QNAN
        if sign:
            raise ValueError("a nan(0xBITS) literal carries its sign in BITS")
        bits = int(s[4:-1], 16)
        if bits > 0xFFFF_FFFF or (bits & 0x7F800000) != 0x7F800000 or not (bits & 0x7FFFFF):
            raise ValueError(f"0x{bits:x} is not the bit pattern of a float32 NaN")
        return bits
    value = float.fromhex(sign + s) if s.startswith("0x") else float(sign + s)
    # values from half an ulp above the largest float32 on would round to infinity
    if not math.isinf(value) and abs(value) >= _F32_OVERFLOW:
        raise ValueError(f"{text} is out of the float32 range")
    f32 = np.float32(value)
    if s.startswith("0x") and float(f32) != value:
        raise ValueError(f"{text} is not exactly a float32 value")
    return int(f32.view(np.uint32))


@functools.lru_cache(maxsize=1 << 14)
def format_imm(bits: int) -> str:
    x = np.uint32(bits).view(np.float32)
    if np.isnan(x):
        return "nan" if bits == _QNAN else f"nan(0x{bits:08x})"
    s = str(x)  # numpy's shortest round-trip float32 repr: 0.5, 1e-45, -inf, ...
    try:
        if imm_bits(s) == bits:
            return s
    except ValueError:
        pass
    return float(x).hex()  # exact


def _chip(mem: int, part: int, addr: int, dt: int) -> str:
    return f"{MEM_NAMES[mem]}[p{part} +0x{addr:x}]:{DT_NAMES[dt]}"


def _hbm(addr: int, rs: int, cs: int, dt: int) -> str:
    return f"hbm[0x{addr:x} rs={rs} cs={cs}]:{DT_NAMES[dt]}"


def _table(addr: int, rs: int, bound: int, dt: int) -> str:
    return f"hbm[0x{addr:x} rs={rs} bound={bound}]:{DT_NAMES[dt]}"


def _sync(sems: list[int], vals: list[int], signal: int) -> str:
    last = -1
    for i, s in enumerate(sems):
        if s >= 0:
            last = i
    out = ""
    if last >= 0:
        slots = [
            f"s{sems[i]}>={vals[i]}" if sems[i] >= 0 else "-" for i in range(last + 1)
        ]
        out = " wait(" + ", ".join(slots) + ")"
    if signal >= 0:
        out += f" signal(s{signal})"
    return out


_COLUMNS = (
    "opcode", "queue", "func", "flags", "a_dtype", "b_dtype", "o_dtype", "a_mem", "b_mem",
    "o_mem", "a_part", "b_part", "o_part", "signal_sem", "wait_sem", "wait_val", "rows",
    "cols", "k", "a_addr", "b_addr", "o_addr", "hbm_rs", "hbm_cs",
)  # fmt: skip


def instruction_lines(stream: np.ndarray) -> Iterator[str]:
    """The assembly line of each record of `stream` (no validation)."""
    cols = [stream[name].tolist() for name in _COLUMNS]
    imm_bits = stream["imm"].view(np.uint32).tolist()
    load, store, matmul = int(Opcode.DMA_LOAD), int(Opcode.DMA_STORE), int(Opcode.MATMUL)
    unary, binary, reduce = int(Opcode.VEC_UNARY), int(Opcode.VEC_BINARY), int(Opcode.VEC_REDUCE)
    gather, scatter = int(Opcode.DMA_GATHER), int(Opcode.DMA_SCATTER)
    f_acc, f_col = int(Flag.ACCUMULATE), int(Flag.B_COLUMN)
    f_imm, f_swap = int(Flag.B_IMM), int(Flag.SWAP)
    for (
        op, queue, func, flags, adt, bdt, odt, amem, bmem, omem, apart, bpart, opart,
        signal, wsem, wval, rows, ncols, k, aaddr, baddr, oaddr, rs, cs,
    ), imm in zip(zip(*cols), imm_bits):  # fmt: skip
        if op == load:
            yield (
                f"dma.load q{queue} {_hbm(aaddr, rs, cs, adt)} -> {_chip(omem, opart, oaddr, odt)}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == store:
            yield (
                f"dma.store q{queue} {_chip(amem, apart, aaddr, adt)} -> {_hbm(oaddr, rs, cs, odt)}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == gather:
            yield (
                f"dma.gather q{queue} {_table(aaddr, rs, k, adt)}, index "
                f"{_chip(bmem, bpart, baddr, bdt)} -> {_chip(omem, opart, oaddr, odt)}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == scatter:
            yield (
                f"dma.scatter q{queue} {_chip(amem, apart, aaddr, adt)}, index "
                f"{_chip(bmem, bpart, baddr, bdt)} -> {_table(oaddr, rs, k, odt)}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == matmul:
            acc = " accumulate" if flags & f_acc else ""
            yield (
                f"matmul {_chip(amem, apart, aaddr, adt)}, {_chip(bmem, bpart, baddr, bdt)}"
                f" -> {_chip(omem, opart, oaddr, odt)} m={rows} k={k} n={ncols}{acc}"
                f"{_sync(wsem, wval, signal)}"
            )
        elif op == unary or op == reduce:
            name = UNARY_NAMES[func] if op == unary else REDUCE_NAMES[func]
            yield (
                f"vec.{name} {_chip(amem, apart, aaddr, adt)} -> {_chip(omem, opart, oaddr, odt)}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == binary:
            if flags & f_imm:
                b = "imm " + format_imm(imm)
            else:
                b = _chip(bmem, bpart, baddr, bdt)
                if flags & f_col:
                    b = "col " + b
            swap = ".swap" if flags & f_swap else ""
            yield (
                f"vec.{BINARY_NAMES[func]}{swap} {_chip(amem, apart, aaddr, adt)}, {b}"
                f" -> {_chip(omem, opart, oaddr, odt)} {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == int(Opcode.LINK_SEND):
            yield (
                f"link.send l{queue} {_hbm(aaddr, rs, cs, adt)} -> chip{k}:{DT_NAMES[odt]}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        elif op == int(Opcode.LINK_RECV):
            add = f" + {_hbm(aaddr, rs, cs, adt)}" if flags & int(Flag.REDUCE) else ""
            yield (
                f"link.recv l{queue} chip{k}:{DT_NAMES[adt]}{add} -> {_hbm(oaddr, rs, cs, odt)}"
                f" {rows}x{ncols}{_sync(wsem, wval, signal)}"
            )
        else:  # barrier
            yield "barrier"


_DMA_OPCODES = tuple(int(o) for o, e in OPCODE_ENGINE.items() if e == Engine.DMA)


def engine_name(record: np.void) -> str:
    """The engine queue of a record: ``dma1``, ``matrix``, ``vector``, ``all`` (a barrier)."""
    op = int(record["opcode"])
    if op == Opcode.BARRIER:
        return "all"
    if op in _DMA_OPCODES:
        return f"dma{int(record['queue'])}"
    if op == Opcode.MATMUL:
        return "matrix"
    if op in (Opcode.VEC_UNARY, Opcode.VEC_BINARY, Opcode.VEC_REDUCE):
        return "vector"
    return f"engine {int(record['engine'])}"


def instruction_text(record: np.void) -> str:
    """The assembly line of one record, or ``<opcode N>`` when it has none."""
    arr = np.asarray(record, dtype=RECORD).reshape(1)
    try:
        return next(instruction_lines(arr))
    except Exception:  # noqa: BLE001 - a record with no assembly form
        return f"<opcode {int(record['opcode'])}>"


def describe(stream: np.ndarray, i: int) -> str:
    """'instruction 17 (matrix): matmul sram[p0 +0x0]:bf16, ... m=16 k=16 n=16'."""
    record = stream[int(i)]
    return f"instruction {int(i)} ({engine_name(record)}): {instruction_text(record)}"
