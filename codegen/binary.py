"""The binary encoding of an instruction stream (``.tlc`` files) and stream validation.

A file is a 32-byte little-endian header followed by the records, exactly as
``isa.RECORD`` lays them out in memory (see docs/isa.md, "Binary format")::

    offset size field
         0    8 magic           b"TLCCNPU\\0"
         8    2 version         u16, FORMAT_VERSION
        10    2 record size     u16, must equal RECORD.itemsize
        12    4 flags           u32, 0 (none are defined)
        16    8 record count    u64
        24    4 payload CRC-32  u32, zlib.crc32 of the payload
        28    4 reserved        u32, 0
        32    … payload         count * record size bytes

Decoding is one ``np.frombuffer`` (plus a copy, so the result is writable) after the
header, length and checksum checks; every malformed input raises `ProgramFormatError`
with a one-line message saying what is wrong.

`validate_stream` checks the enum-valued fields of every record (used by the decoder,
the encoder and the assembler). With ``strict=True`` it also checks that the record is
in canonical form: every field an opcode does not use holds its cleared value (as
``isa.empty_stream`` leaves it) -- the form the assembly printer requires.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tilecc.errors import ProgramFormatError
from tilecc.simulator.isa import FUNC_ENUM, OPCODE_ENGINE, RECORD, DType, Engine, Flag, Mem, Opcode

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "USED_FIELDS",
    "decode_stream",
    "encode_stream",
    "read_stream",
    "validate_stream",
    "write_stream",
]

MAGIC = b"TLCCNPU\0"
# 2: the link opcodes LINK_SEND / LINK_RECV (engine LINK, flag REDUCE), same record
# layout. A stream without them is written as version 1, so single-chip files and their
# hashes do not change; both versions are read (a version-1 file holding a link opcode
# is refused).
FORMAT_VERSION = 2
_READABLE = (1, 2)
_HEADER = struct.Struct("<8sHHIQII")
HEADER_SIZE = _HEADER.size  # 32
assert HEADER_SIZE == 32

_SYNC = ("signal_sem", "wait_sem", "wait_val")
_A = ("a_dtype", "a_mem", "a_part", "a_addr")
_B = ("b_dtype", "b_mem", "b_part", "b_addr")
_O = ("o_dtype", "o_mem", "o_part", "o_addr")

# The fields each opcode uses (besides opcode and engine). Every other field of a
# canonical record holds its cleared value: -1 for signal_sem and wait_sem, else 0.
# VEC_BINARY uses imm instead of the b_* fields when it has flag B_IMM.
USED_FIELDS: dict[Opcode, frozenset[str]] = {
    Opcode.BARRIER: frozenset(),
    Opcode.DMA_LOAD: frozenset(
        ("queue", "a_dtype", "a_mem", "a_addr", "hbm_rs", "hbm_cs", *_O, "rows", "cols", *_SYNC)
    ),
    Opcode.DMA_STORE: frozenset(
        ("queue", *_A, "o_dtype", "o_mem", "o_addr", "hbm_rs", "hbm_cs", "rows", "cols", *_SYNC)
    ),
    Opcode.MATMUL: frozenset(("flags", *_A, *_B, *_O, "rows", "cols", "k", *_SYNC)),
    Opcode.VEC_UNARY: frozenset(("func", *_A, *_O, "rows", "cols", *_SYNC)),
    Opcode.VEC_BINARY: frozenset(("func", "flags", *_A, *_B, "imm", *_O, "rows", "cols", *_SYNC)),
    Opcode.VEC_REDUCE: frozenset(("func", *_A, *_O, "rows", "cols", *_SYNC)),
    # a: the HBM table (base, row stride, k rows); b: the on-chip i32 index column
    Opcode.DMA_GATHER: frozenset(
        ("queue", "a_dtype", "a_mem", "a_addr", "hbm_rs", *_B, *_O, "rows", "cols", "k", *_SYNC)
    ),
    # a: the on-chip source tile; b: the on-chip i32 index column; o: the HBM table
    Opcode.DMA_SCATTER: frozenset(
        ("queue", *_A, *_B, "o_dtype", "o_mem", "o_addr", "hbm_rs", "rows", "cols", "k", *_SYNC)
    ),
    # (format version 2) a: the local HBM source; k: the peer chip; o_dtype: the data's type
    Opcode.LINK_SEND: frozenset(
        ("queue", "a_dtype", "a_mem", "a_addr", "o_dtype", "hbm_rs", "hbm_cs", "rows", "cols", "k", *_SYNC)
    ),
    # o: the local HBM destination; a: the local addend (flag REDUCE); k: the sending chip
    Opcode.LINK_RECV: frozenset(
        ("queue", "flags", "a_dtype", "a_mem", "a_addr", "o_dtype", "o_mem", "o_addr", "hbm_rs", "hbm_cs",
         "rows", "cols", "k", *_SYNC)
    ),
}

# flags each opcode may carry
_ALLOWED_FLAGS = {
    Opcode.MATMUL: int(Flag.ACCUMULATE),
    Opcode.VEC_BINARY: int(Flag.B_COLUMN | Flag.B_IMM | Flag.SWAP),
    Opcode.LINK_RECV: int(Flag.REDUCE),
}

_ENUM_FIELDS = (
    ("opcode", Opcode),
    ("engine", Engine),
    ("a_mem", Mem),
    ("b_mem", Mem),
    ("o_mem", Mem),
)
_DTYPE_FIELDS = ("a_dtype", "b_dtype", "o_dtype")


def _table(values: Iterable[int], size: int = 256) -> np.ndarray:
    t = np.zeros(size, dtype=bool)
    t[[int(v) for v in values]] = True
    return t


_VALID = {name: _table(enum) for name, enum in _ENUM_FIELDS}
_VALID_DTYPE_OR_0 = _table([0, *DType])
_ENGINE_OF = np.full(256, -1, dtype=np.int16)
for _op, _eng in OPCODE_ENGINE.items():
    _ENGINE_OF[int(_op)] = int(_eng)
_FUNC_COUNT = {op: len(enum) for op, enum in FUNC_ENUM.items()}
_ALL_FLAGS = int(Flag.ACCUMULATE | Flag.B_COLUMN | Flag.B_IMM | Flag.SWAP | Flag.REDUCE)


def _fail(i: int, what: str) -> None:
    raise ProgramFormatError(f"record {i}: {what}")


def _first(mask: np.ndarray) -> int | None:
    """Index of the first record where `mask` holds (any() along extra axes), or None."""
    if mask.ndim > 1:
        mask = np.asarray(mask.any(axis=tuple(range(1, mask.ndim))))
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def _opname(op: int) -> str:
    return Opcode(op).name.lower()


def _check_dtype(stream: np.ndarray) -> None:
    if not isinstance(stream, np.ndarray) or stream.dtype != RECORD:
        got = stream.dtype if isinstance(stream, np.ndarray) else type(stream).__name__
        raise ProgramFormatError(f"an instruction stream must be an array of isa.RECORD, got {got}")
    if stream.ndim != 1:
        raise ProgramFormatError(
            f"an instruction stream must be a 1-D array of records, got shape {stream.shape}"
        )


def validate_stream(stream: np.ndarray, *, strict: bool = False) -> np.ndarray:
    """Check every record's enum fields; raise `ProgramFormatError` naming the first bad one.

    Checks: opcode, engine, a/b/o_mem are values of their enums; the engine is the one
    the opcode runs on (``isa.OPCODE_ENGINE``); a/b/o_dtype are 0 (unused) or a `DType`;
    func is a value of the opcode's function enum (vector opcodes); flags has only
    defined bits. With ``strict=True`` the record must also be canonical: the fields the
    opcode uses (`USED_FIELDS`) are meaningful (dtypes set, memories on the right side of
    a DMA, wait slots either active or cleared, a single B_COLUMN/B_IMM choice) and every
    other field holds its cleared value. Returns `stream` (for chaining).
    """
    _check_dtype(stream)
    if stream.size == 0:
        return stream
    opcode = stream["opcode"]
    for name, enum in _ENUM_FIELDS:
        bad = _first(~_VALID[name][stream[name]])
        if bad is not None:
            value = int(stream[name][bad])
            known = ", ".join(f"{e.value} ({e.name})" for e in enum)
            _fail(bad, f"unknown {name.replace('_', ' ')} {value} (known: {known})")
    bad = _first(_ENGINE_OF[opcode] != stream["engine"])
    if bad is not None:
        op = Opcode(int(opcode[bad]))
        _fail(
            bad,
            f"opcode {op.name} runs on engine {OPCODE_ENGINE[op].name}, "
            f"but the record names engine {Engine(int(stream['engine'][bad])).name}",
        )
    for name in _DTYPE_FIELDS:
        bad = _first(~_VALID_DTYPE_OR_0[stream[name]])
        if bad is not None:
            known = ", ".join(f"{d.value} ({d.name})" for d in DType)
            _fail(bad, f"unknown {name.replace('_', ' ')} {int(stream[name][bad])} (known: {known})")
    func = stream["func"]
    for op, count in _FUNC_COUNT.items():
        bad = _first((opcode == op) & (func >= count))
        if bad is not None:
            fenum = FUNC_ENUM[op]
            _fail(
                bad,
                f"unknown func {int(func[bad])} for {op.name} "
                f"(known {fenum.__name__}: 0..{count - 1})",
            )
    bad = _first((stream["flags"] & np.uint8(0xFF ^ _ALL_FLAGS)) != 0)
    if bad is not None:
        unknown = int(stream["flags"][bad]) & (0xFF ^ _ALL_FLAGS)
        _fail(bad, f"unknown flag bits 0x{unknown:x}")
    if strict:
        _validate_canonical(stream)
    return stream


def _cleared(name: str) -> int:
    return -1 if name in ("signal_sem", "wait_sem") else 0


def _validate_canonical(stream: np.ndarray) -> None:
    opcode = stream["opcode"]
    flags = stream["flags"]
    # fields an opcode does not use hold their cleared value
    all_fields = [n for n in RECORD.names or () if n not in ("opcode", "engine")]  # a structured dtype: names
    for op, used in USED_FIELDS.items():
        sel = opcode == op
        if not sel.any():
            continue
        for name in all_fields:
            if name in used:
                continue
            col = stream[name]
            if name == "imm":
                col = col.view(np.uint32)
            bad = _first(sel[(...,) + (None,) * (col.ndim - 1)] & (col != _cleared(name)))
            if bad is not None:
                value = stream[name][bad]
                value = value.tolist() if isinstance(value, np.ndarray) else value.item()
                _fail(
                    bad,
                    f"{name} = {value!r}, but {_opname(op)} does not use {name} "
                    f"(it must be {_cleared(name)})",
                )
        allowed = _ALLOWED_FLAGS.get(op, 0)
        bad = _first(sel & ((flags & np.uint8(0xFF ^ allowed)) != 0))
        if bad is not None:
            _fail(bad, f"flags 0x{int(flags[bad]):x} not allowed on {_opname(op)} "
                  f"(allowed: 0x{allowed:x})")
    # used dtypes are set
    for op, used in USED_FIELDS.items():
        for name in _DTYPE_FIELDS:
            if name not in used:
                continue
            sel = opcode == op
            if op == Opcode.VEC_BINARY and name == "b_dtype":
                sel = sel & ((flags & Flag.B_IMM) == 0)
            bad = _first(sel & (stream[name] == 0))
            if bad is not None:
                _fail(bad, f"{name} is 0, but {_opname(op)} needs an element type there")
    # memories: the HBM side of a DMA, on-chip everywhere else
    hbm = int(Mem.HBM)
    is_bin_tile_b = (opcode == Opcode.VEC_BINARY) & ((flags & Flag.B_IMM) == 0)
    gather = opcode == Opcode.DMA_GATHER
    scatter = opcode == Opcode.DMA_SCATTER
    send, recv = opcode == Opcode.LINK_SEND, opcode == Opcode.LINK_RECV
    compute = (opcode >= Opcode.MATMUL) & ~gather & ~scatter & ~send & ~recv
    rules = [
        ("a_mem", opcode == Opcode.DMA_LOAD, True),
        ("o_mem", opcode == Opcode.DMA_LOAD, False),
        ("a_mem", opcode == Opcode.DMA_STORE, False),
        ("o_mem", opcode == Opcode.DMA_STORE, True),
        ("a_mem", compute, False),
        ("o_mem", compute, False),
        ("b_mem", (opcode == Opcode.MATMUL) | is_bin_tile_b, False),
        ("a_mem", gather, True),
        ("b_mem", gather, False),
        ("o_mem", gather, False),
        ("a_mem", scatter, False),
        ("b_mem", scatter, False),
        ("o_mem", scatter, True),
        ("a_mem", send, True),
        ("o_mem", recv, True),
        ("a_mem", recv, True),
    ]
    for name, sel, want_hbm in rules:
        bad = _first(sel & ((stream[name] == hbm) != want_hbm))
        if bad is not None:
            where = "in HBM" if want_hbm else "on chip (SRAM or ACC)"
            _fail(
                bad,
                f"{name} = {Mem(int(stream[name][bad])).name}, but {_opname(int(opcode[bad]))} "
                f"needs this operand {where}",
            )
    # a LINK_RECV without REDUCE has no addend
    bad = _first(recv & ((flags & Flag.REDUCE) == 0) & (stream["a_addr"] != 0))
    if bad is not None:
        _fail(bad, f"a_addr = {int(stream['a_addr'][bad])}, but a link_recv without REDUCE has no addend "
              "(it must be 0)")
    # B_IMM: imm instead of b_*; otherwise imm is unused
    binary = opcode == Opcode.VEC_BINARY
    b_imm = binary & ((flags & Flag.B_IMM) != 0)
    bad = _first(b_imm & ((flags & Flag.B_COLUMN) != 0))
    if bad is not None:
        _fail(bad, "vec_binary has both B_COLUMN and B_IMM (choose one form of operand b)")
    for name in _B:
        bad = _first(b_imm & (stream[name] != 0))
        if bad is not None:
            _fail(bad, f"{name} = {stream[name][bad].item()}, but a vec_binary with B_IMM "
                  f"does not use {name} (it must be 0)")
    bad = _first(binary & ~b_imm & (stream["imm"].view(np.uint32) != 0))
    if bad is not None:
        _fail(bad, f"imm = {stream['imm'][bad].item()!r}, but a vec_binary without B_IMM "
              "does not use imm (it must be 0.0)")
    # synchronisation: inactive slots are exactly (-1, 0)
    sem, val = stream["wait_sem"], stream["wait_val"]
    bad = _first((sem < -1) | ((sem < 0) & (val != 0)))
    if bad is not None:
        _fail(bad, f"wait slots ({sem[bad].tolist()}, {val[bad].tolist()}) are not canonical: "
              "an unused slot has wait_sem -1 and wait_val 0")
    bad = _first(stream["signal_sem"] < -1)
    if bad is not None:
        _fail(bad, f"signal_sem = {int(stream['signal_sem'][bad])} (no signal is -1)")


def encode_stream(stream: np.ndarray) -> bytes:
    """A validated stream -> the bytes of a ``.tlc`` file (header + records)."""
    validate_stream(stream)
    payload = np.ascontiguousarray(stream).tobytes()
    has_link = bool(np.isin(stream["opcode"], (int(Opcode.LINK_SEND), int(Opcode.LINK_RECV))).any())
    header = _HEADER.pack(
        MAGIC, FORMAT_VERSION if has_link else 1, RECORD.itemsize, 0, len(stream), zlib.crc32(payload), 0
    )
    return header + payload


def decode_stream(data: bytes | bytearray | memoryview) -> np.ndarray:
    """The bytes of a ``.tlc`` file -> a writable stream; `ProgramFormatError` if malformed."""
    view = memoryview(data).cast("B")
    size = view.nbytes
    if size < HEADER_SIZE:
        raise ProgramFormatError(
            f"truncated: {size} bytes, shorter than the {HEADER_SIZE}-byte header"
        )
    magic, version, rec_size, flags, count, crc, reserved = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise ProgramFormatError(
            f"not a tilecc instruction stream (magic {magic!r}, expected {MAGIC!r})"
        )
    if version not in _READABLE:
        raise ProgramFormatError(
            f"format version {version}, this tilecc reads versions {', '.join(map(str, _READABLE))}"
        )
    if rec_size != RECORD.itemsize:
        raise ProgramFormatError(
            f"record size {rec_size} bytes, this tilecc's records are {RECORD.itemsize} bytes"
        )
    if flags != 0:
        raise ProgramFormatError(f"unknown header flags 0x{flags:x} (version 1 defines none)")
    if reserved != 0:
        raise ProgramFormatError(f"reserved header field is 0x{reserved:x}, expected 0")
    expected = count * rec_size
    payload = size - HEADER_SIZE
    if payload < expected:
        raise ProgramFormatError(
            f"truncated: the header declares {count} records ({expected} bytes) "
            f"but the payload has {payload} bytes ({expected - payload} missing)"
        )
    if payload > expected:
        raise ProgramFormatError(
            f"trailing bytes: the header declares {count} records ({expected} bytes) "
            f"but the payload has {payload} bytes ({payload - expected} trailing)"
        )
    actual = zlib.crc32(view[HEADER_SIZE:])
    if actual != crc:
        raise ProgramFormatError(
            f"checksum mismatch: header CRC-32 0x{crc:08x}, payload CRC-32 0x{actual:08x}; "
            "the stream is corrupt"
        )
    stream = np.frombuffer(view, dtype=RECORD, count=count, offset=HEADER_SIZE).copy()
    if version < 2:
        link = _first(stream["opcode"] >= int(Opcode.LINK_SEND))
        if link is not None:
            raise ProgramFormatError(f"record {link}: opcode {int(stream['opcode'][link])} is a link "
                                     "opcode, which format version 1 does not have")
    return validate_stream(stream)


def write_stream(path: str | os.PathLike[str], stream: np.ndarray) -> None:
    """Encode `stream` into the file `path`."""
    Path(path).write_bytes(encode_stream(stream))


def read_stream(path: str | os.PathLike[str]) -> np.ndarray:
    """Decode the file `path`; a `ProgramFormatError` message starts with the path."""
    data = Path(path).read_bytes()
    try:
        return decode_stream(data)
    except ProgramFormatError as e:
        raise ProgramFormatError(f"{path}: {e}") from None
