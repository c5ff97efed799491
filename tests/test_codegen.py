"""The instruction stream's binary encoding (codegen/binary.py) and assembly text
(codegen/asm.py, codegen/asm.lark): round trips, every rejected input, pinned formats."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilecc.codegen import asm as asm_mod
from tilecc.codegen.asm import format_instruction, parse_asm, print_asm
from tilecc.codegen.binary import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    USED_FIELDS,
    decode_stream,
    encode_stream,
    read_stream,
    validate_stream,
    write_stream,
)
from tilecc.errors import AsmSyntaxError, ProgramFormatError
from tilecc.simulator.isa import (
    MAX_WAITS,
    OPCODE_ENGINE,
    RECORD,
    BinaryFn,
    DType,
    Flag,
    Mem,
    Opcode,
    ReduceFn,
    UnaryFn,
    empty_stream,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "isa.md"

# --------------------------------------------------------------------------- strategies

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
sem = st.integers(0, 0x7FFF)
dtypes = st.sampled_from(list(DType))
on_chip = st.sampled_from([Mem.SRAM, Mem.ACC])
# imm bits: any float32 pattern (NaN payloads, subnormals, -0.0, inf) or "nice" values
imm_bits = st.one_of(
    u32,
    st.floats(width=32, allow_nan=False).map(lambda f: int(np.float32(f).view(np.uint32))),
    st.sampled_from([0x7FC00000, 0xFFC00000, 0x7F800001, 0x80000000, 0x00000001, 0x3DCCCCCD]),
)


@st.composite
def records(draw, opcode=None) -> np.ndarray:
    """One canonical record (a length-1 stream) with random values in every used field."""
    op = draw(st.sampled_from(list(Opcode))) if opcode is None else opcode
    r = empty_stream(1)
    r["opcode"] = op
    r["engine"] = OPCODE_ENGINE[op]
    if op == Opcode.BARRIER:
        return r

    def operand(prefix: str, mem_strategy=on_chip) -> None:
        r[f"{prefix}_dtype"] = draw(dtypes)
        r[f"{prefix}_mem"] = mem = draw(mem_strategy)
        r[f"{prefix}_addr"] = draw(u64)
        if mem != Mem.HBM:  # HBM operands have no partition
            r[f"{prefix}_part"] = draw(u16)

    hbm = st.just(Mem.HBM)
    if op in (Opcode.DMA_LOAD, Opcode.DMA_STORE):
        r["queue"] = draw(u8)
        load = op == Opcode.DMA_LOAD
        operand("a", hbm if load else on_chip)
        operand("o", on_chip if load else hbm)
        r["hbm_rs"], r["hbm_cs"] = draw(i64), draw(i64)
    elif op == Opcode.DMA_GATHER:
        r["queue"] = draw(u8)
        operand("a", hbm)
        operand("b")
        operand("o")
        r["hbm_rs"], r["k"] = draw(i64), draw(u32)
    elif op == Opcode.DMA_SCATTER:
        r["queue"] = draw(u8)
        operand("a")
        operand("b")
        operand("o", hbm)
        r["hbm_rs"], r["k"] = draw(i64), draw(u32)
    elif op in (Opcode.LINK_SEND, Opcode.LINK_RECV):
        r["queue"], r["k"] = draw(u8), draw(u32)
        r["a_dtype"], r["o_dtype"] = draw(dtypes), draw(dtypes)
        r["hbm_rs"], r["hbm_cs"] = draw(i64), draw(i64)
        if op == Opcode.LINK_SEND:
            r["a_addr"] = draw(u64)
        else:
            r["o_addr"] = draw(u64)
            if draw(st.booleans()):
                r["flags"] = Flag.REDUCE
                r["a_addr"] = draw(u64)
                r["o_dtype"] = r["a_dtype"]
    elif op == Opcode.MATMUL:
        for p in "abo":
            operand(p)
        r["k"] = draw(u32)
        r["flags"] = Flag.ACCUMULATE if draw(st.booleans()) else 0
    else:
        enum = {Opcode.VEC_UNARY: UnaryFn, Opcode.VEC_BINARY: BinaryFn, Opcode.VEC_REDUCE: ReduceFn}
        r["func"] = draw(st.sampled_from(list(enum[op])))
        operand("a")
        operand("o")
        if op == Opcode.VEC_BINARY:
            form = draw(st.sampled_from(["tile", "col", "imm"]))
            flags = Flag.SWAP if draw(st.booleans()) else Flag.NONE
            if form == "imm":
                flags |= Flag.B_IMM
                r["imm"] = np.array([draw(imm_bits)], dtype=np.uint32).view(np.float32)
            else:
                operand("b")
                if form == "col":
                    flags |= Flag.B_COLUMN
            r["flags"] = flags
    r["rows"], r["cols"] = draw(u32), draw(u32)
    slots = draw(st.lists(st.one_of(st.none(), st.tuples(sem, u32)), max_size=MAX_WAITS))
    for i, slot in enumerate(slots):
        if slot is not None:
            r["wait_sem"][0, i], r["wait_val"][0, i] = slot
    if draw(st.booleans()):
        r["signal_sem"] = draw(sem)
    return r


streams = st.lists(records(), max_size=25).map(
    lambda rs: np.concatenate(rs) if rs else empty_stream(0)
)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- round trips

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(streams)
def test_binary_round_trip(stream):
    data = encode_stream(stream)
    assert len(data) == HEADER_SIZE + stream.size * RECORD.itemsize
    back = decode_stream(data)
    assert same(back, stream)
    assert back.flags.writeable
    back[:0] = back[:0]  # writable, and not a view of the bytes
    assert same(decode_stream(bytearray(data)), stream)
    assert same(decode_stream(memoryview(data)), stream)


@SETTINGS
@given(streams)
def test_asm_round_trip(stream):
    text = print_asm(stream)
    assert text.count("\n") == stream.size
    assert same(parse_asm(text), stream)
    # the LALR parser alone (no regex fast path) reads the same records
    assert same(asm_mod._parse(text, fast=False), stream)
    assert print_asm(parse_asm(text)) == text


@pytest.mark.parametrize("op", list(Opcode), ids=lambda o: o.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_asm_round_trip_each_opcode(op, data):
    r = data.draw(records(op))
    line = format_instruction(r[0])
    assert "\n" not in line
    assert same(parse_asm(line), r)
    assert same(asm_mod._parse(line, fast=False), r)


@settings(max_examples=300, deadline=None)
@given(imm_bits)
def test_imm_round_trips_every_float32(bits):
    r = empty_stream(1)
    r["opcode"], r["engine"] = Opcode.VEC_BINARY, OPCODE_ENGINE[Opcode.VEC_BINARY]
    r["flags"] = Flag.B_IMM
    r["a_mem"] = r["o_mem"] = Mem.SRAM
    r["a_dtype"] = r["o_dtype"] = DType.F32
    r["imm"].view(np.uint32)[:] = bits
    text = print_asm(r)
    assert same(parse_asm(text), r)
    assert same(asm_mod._parse(text, fast=False), r)


def test_empty_stream():
    s = empty_stream(0)
    assert same(decode_stream(encode_stream(s)), s)
    assert print_asm(s) == ""
    assert same(parse_asm(""), s)
    assert same(parse_asm("\n  # nothing\n; still nothing\n\n"), s)


def test_file_helpers(tmp_path):
    s = parse_asm(GOLDEN_TEXT)
    path = tmp_path / "prog.tlc"
    write_stream(path, s)
    assert same(read_stream(path), s)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ProgramFormatError, match=re.escape(f"{path}: truncated: ")):
        read_stream(path)


# --------------------------------------------------------------------------- golden


def put(s: np.ndarray, i: int, op: Opcode, waits=(), **fields) -> None:
    """Set record i: its opcode (and engine), waits [(sem, val) or None per slot], fields."""
    s["opcode"][i], s["engine"][i] = op, OPCODE_ENGINE[op]
    for slot, w in enumerate(waits):
        if w is not None:
            s["wait_sem"][i, slot], s["wait_val"][i, slot] = w
    for name, value in fields.items():
        s[name][i] = value


def golden_stream() -> np.ndarray:
    s = empty_stream(9)
    F32, BF16, SRAM, ACC, HBM = DType.F32, DType.BF16, Mem.SRAM, Mem.ACC, Mem.HBM
    put(s, 0, Opcode.DMA_LOAD, waits=[(3, 2), (4, 1)], queue=0, signal_sem=1,
        a_dtype=F32, a_mem=HBM, a_addr=0x1000, hbm_rs=53, hbm_cs=1,
        o_dtype=F32, o_mem=SRAM, o_part=0, o_addr=0x200, rows=16, cols=53)
    put(s, 1, Opcode.MATMUL, flags=Flag.ACCUMULATE, rows=16, k=16, cols=16,
        a_dtype=BF16, a_mem=SRAM, a_addr=0x0, b_dtype=BF16, b_mem=SRAM, b_addr=0x400,
        o_dtype=F32, o_mem=ACC, o_addr=0x0)
    put(s, 2, Opcode.VEC_UNARY, waits=[None, (7, 3)], func=UnaryFn.EXP, rows=16, cols=64,
        a_dtype=F32, a_mem=ACC, a_addr=0x0, o_dtype=BF16, o_mem=SRAM, o_part=8, o_addr=0x100)
    put(s, 3, Opcode.VEC_BINARY, func=BinaryFn.ADD, flags=Flag.B_COLUMN, rows=16, cols=64,
        a_dtype=F32, a_mem=SRAM, a_addr=0x0, b_dtype=F32, b_mem=SRAM, b_addr=0x800,
        o_dtype=F32, o_mem=SRAM, o_addr=0x0)
    put(s, 4, Opcode.VEC_BINARY, func=BinaryFn.MUL, flags=Flag.B_IMM, imm=0.1, rows=16, cols=64,
        a_dtype=F32, a_mem=SRAM, o_dtype=F32, o_mem=SRAM, o_addr=0x100)
    put(s, 5, Opcode.VEC_BINARY, func=BinaryFn.SUB, flags=Flag.B_IMM | Flag.SWAP, imm=-1.5,
        signal_sem=2, rows=16, cols=64, a_dtype=DType.F16, a_mem=SRAM, o_dtype=DType.F16,
        o_mem=SRAM)
    put(s, 6, Opcode.VEC_REDUCE, func=ReduceFn.MAX, rows=16, cols=64,
        a_dtype=F32, a_mem=SRAM, a_addr=0x0, o_dtype=F32, o_mem=SRAM, o_addr=0x900)
    put(s, 7, Opcode.DMA_STORE, waits=[(2, 1)], queue=1, rows=16, cols=64,
        a_dtype=DType.I32, a_mem=SRAM, a_part=2, a_addr=0x900,
        o_dtype=DType.I32, o_mem=HBM, o_addr=0x8000, hbm_rs=-64, hbm_cs=1)
    put(s, 8, Opcode.BARRIER)
    return s  # fmt: skip


GOLDEN_TEXT = """\
dma.load q0 hbm[0x1000 rs=53 cs=1]:f32 -> sram[p0 +0x200]:f32 16x53 wait(s3>=2, s4>=1) signal(s1)
matmul sram[p0 +0x0]:bf16, sram[p0 +0x400]:bf16 -> acc[p0 +0x0]:f32 m=16 k=16 n=16 accumulate
vec.exp acc[p0 +0x0]:f32 -> sram[p8 +0x100]:bf16 16x64 wait(-, s7>=3)
vec.add sram[p0 +0x0]:f32, col sram[p0 +0x800]:f32 -> sram[p0 +0x0]:f32 16x64
vec.mul sram[p0 +0x0]:f32, imm 0.1 -> sram[p0 +0x100]:f32 16x64
vec.sub.swap sram[p0 +0x0]:f16, imm -1.5 -> sram[p0 +0x0]:f16 16x64 signal(s2)
vec.reduce_max sram[p0 +0x0]:f32 -> sram[p0 +0x900]:f32 16x64
dma.store q1 sram[p2 +0x900]:i32 -> hbm[0x8000 rs=-64 cs=1]:i32 16x64 wait(s2>=1)
barrier
"""


def test_golden_text():
    s = golden_stream()
    assert print_asm(s) == GOLDEN_TEXT
    assert same(parse_asm(GOLDEN_TEXT), s)


def test_golden_binary_header():
    s = golden_stream()
    data = encode_stream(s)
    payload = s.tobytes()
    assert data[:8] == b"TLCCNPU\0" == MAGIC
    assert struct.unpack_from("<HHIQII", data, 8) == (
        1, RECORD.itemsize, 0, 9, zlib.crc32(payload), 0)  # fmt: skip  (no link opcodes: version 1)
    assert data[HEADER_SIZE:] == payload


def test_parse_accepts_free_form():
    """Comments, blank lines, any spacing, tabs, CRLF, decimal or hex numbers."""
    text = (
        "# a kernel\r\n"
        "\n"
        "  dma.load   q0\thbm[ 4096 rs = +53 cs=0x1 ] : f32->sram[p00 + 512]:f32 16x53 "
        "wait( s3 >= 2 , s4>=0x1 ) signal( s1 ) ; first\r\n"
        "matmul sram[p0+0]:bf16,sram[p0 +1024]:bf16 -> acc[p0 +0]:f32 m = 16 k=16 n=0x10 "
        "accumulate # acc\n"
        ";\n"
        "vec.exp acc[p0 +0x0]:f32 -> sram[p8 +0x100]:bf16 16x64 wait(-,s7>=3)\n"
        "vec.add sram[p0 +0x0]:f32, col sram[p0 +0x800]:f32 -> sram[p0 +0x0]:f32 16x64\n"
        "vec.mul sram[p0 +0x0]:f32, imm 1e-1 -> sram[p0 +0x100]:f32 16x64\n"
        "vec.sub.swap sram[p0 +0x0]:f16, imm -0x1.8p+0 -> sram[p0 +0x0]:f16 16x64 signal(s2)\n"
        "vec.reduce_max sram[p0 +0x0]:f32 -> sram[p0 +0x900]:f32 16x64\n"
        "dma.store q1 sram[p2 +0x900]:i32 -> hbm[0x8000 rs=-0x40 cs=1]:i32 16x64 wait(s2>=1)\n"
        "barrier"
    )
    assert same(parse_asm(text), golden_stream())


@pytest.mark.parametrize(
    "literal, bits",
    [
        ("0.1", 0x3DCCCCCD),
        ("-0.0", 0x80000000),
        ("inf", 0x7F800000),
        ("-inf", 0xFF800000),
        ("nan", 0x7FC00000),
        ("-nan", 0xFFC00000),
        ("nan(0x7f800001)", 0x7F800001),
        ("1e-45", 0x00000001),
        ("3.4028235e+38", 0x7F7FFFFF),
        ("0x1.fffffep+127", 0x7F7FFFFF),
        (".5", 0x3F000000),
        ("2.", 0x40000000),
    ],
)
def test_imm_literals(literal, bits):
    s = parse_asm(f"vec.max sram[p0 +0x0]:f32, imm {literal} -> sram[p0 +0x0]:f32 1x1")
    assert int(s["imm"].view(np.uint32)[0]) == bits
    printed = print_asm(s)
    assert same(parse_asm(printed), s)


def test_imm_printing():
    def text(bits: int) -> str:
        r = parse_asm("vec.max sram[p0 +0x0]:f32, imm 0 -> sram[p0 +0x0]:f32 1x1")
        r["imm"].view(np.uint32)[:] = bits
        return print_asm(r).split("imm ")[1].split(" ")[0]

    assert text(0x3DCCCCCD) == "0.1"
    assert text(0x80000000) == "-0.0"
    assert text(0x7FC00000) == "nan"
    assert text(0xFFC00000) == "nan(0xffc00000)"
    assert text(0x7F800000) == "inf"
    assert text(0x00000001) == "1e-45"


# --------------------------------------------------------------------------- binary errors


def header(
    *,
    magic=MAGIC,
    version=FORMAT_VERSION,
    size=RECORD.itemsize,
    flags=0,
    count=0,
    crc=None,
    reserved=0,
    payload=b"",
) -> bytes:
    crc = zlib.crc32(payload) if crc is None else crc
    return struct.pack("<8sHHIQII", magic, version, size, flags, count, crc, reserved) + payload


def raw_stream(stream: np.ndarray) -> bytes:
    """Encode without validation (to build files with invalid records)."""
    payload = stream.tobytes()
    return header(count=len(stream), payload=payload)


def test_header_layout_is_32_bytes():
    assert HEADER_SIZE == 32
    assert len(encode_stream(empty_stream(0))) == 32


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "truncated: 0 bytes, shorter than the 32-byte header"),
        (b"TLCCNPU\0\x01\x00", "truncated: 10 bytes, shorter than the 32-byte header"),
        (
            header(magic=b"\x7fELF\x02\x01\x01\x00"),
            r"not a tilecc instruction stream (magic b'\x7fELF\x02\x01\x01\x00', "
            r"expected b'TLCCNPU\x00')",
        ),
        (header(version=3), "format version 3, this tilecc reads versions 1, 2"),
        (header(version=0), "format version 0, this tilecc reads versions 1, 2"),
        (
            header(size=64),
            f"record size 64 bytes, this tilecc's records are {RECORD.itemsize} bytes",
        ),
        (header(flags=1), "unknown header flags 0x1 (version 1 defines none)"),
        (header(reserved=0xAB), "reserved header field is 0xab, expected 0"),
    ],
    ids=["empty", "short", "magic", "version3", "version0", "recsize", "flags", "reserved"],
)
def test_decode_rejects_header(data, message):
    with pytest.raises(ProgramFormatError) as e:
        decode_stream(data)
    assert str(e.value) == message


def test_decode_rejects_truncated_payload():
    data = encode_stream(golden_stream())
    n = 9 * RECORD.itemsize
    with pytest.raises(ProgramFormatError) as e:
        decode_stream(data[:-1])
    assert str(e.value) == (
        f"truncated: the header declares 9 records ({n} bytes) "
        f"but the payload has {n - 1} bytes (1 missing)"
    )
    with pytest.raises(ProgramFormatError, match=r"^truncated: the header declares 9 records"):
        decode_stream(data[:HEADER_SIZE])


def test_decode_rejects_trailing_bytes():
    data = encode_stream(golden_stream())
    n = 9 * RECORD.itemsize
    with pytest.raises(ProgramFormatError) as e:
        decode_stream(data + b"\0\0\0")
    assert str(e.value) == (
        f"trailing bytes: the header declares 9 records ({n} bytes) "
        f"but the payload has {n + 3} bytes (3 trailing)"
    )


@pytest.mark.parametrize("offset", [0, 1, 57, -1])
def test_decode_rejects_corrupt_payload(offset):
    data = bytearray(encode_stream(golden_stream()))
    pos = HEADER_SIZE + offset if offset >= 0 else len(data) + offset
    good_crc = zlib.crc32(data[HEADER_SIZE:])
    data[pos] ^= 0x10
    bad_crc = zlib.crc32(data[HEADER_SIZE:])
    with pytest.raises(ProgramFormatError) as e:
        decode_stream(bytes(data))
    assert str(e.value) == (
        f"checksum mismatch: header CRC-32 0x{good_crc:08x}, payload CRC-32 0x{bad_crc:08x}; "
        "the stream is corrupt"
    )


def _bad(field: str, value, index: int = 1) -> np.ndarray:
    s = golden_stream()
    s[field][index] = value
    return s


@pytest.mark.parametrize(
    "stream, message",
    [
        (_bad("opcode", 11), "record 1: unknown opcode 11 (known: 0 (BARRIER), 1 (DMA_LOAD), "
         "2 (DMA_STORE), 3 (MATMUL), 4 (VEC_UNARY), 5 (VEC_BINARY), 6 (VEC_REDUCE), 7 (DMA_GATHER), "
         "8 (DMA_SCATTER), 9 (LINK_SEND), 10 (LINK_RECV))"),
        (_bad("engine", 7), "record 1: unknown engine 7 (known: 0 (DMA), 1 (MATRIX), "
         "2 (VECTOR), 3 (LINK), 255 (ALL))"),
        (_bad("engine", 2), "record 1: opcode MATMUL runs on engine MATRIX, "
         "but the record names engine VECTOR"),
        (_bad("b_mem", 3), "record 1: unknown b mem 3 (known: 0 (HBM), 1 (SRAM), 2 (ACC))"),
        (_bad("o_dtype", 9, 4), "record 4: unknown o dtype 9 (known: 1 (F32), 2 (BF16), "
         "3 (F16), 4 (I32), 5 (I8), 6 (F8E4M3))"),
        (_bad("func", 16, 2), "record 2: unknown func 16 for VEC_UNARY (known UnaryFn: 0..15)"),
        (_bad("func", 14, 3), "record 3: unknown func 14 for VEC_BINARY (known BinaryFn: 0..13)"),
        (_bad("func", 3, 6), "record 6: unknown func 3 for VEC_REDUCE (known ReduceFn: 0..2)"),
        (_bad("flags", 0x21, 3), "record 3: unknown flag bits 0x20"),
    ],
    ids=["opcode", "engine", "engine-mismatch", "mem", "dtype", "unary", "binary", "reduce",
         "flags"],
)  # fmt: skip
def test_decode_rejects_invalid_records(stream, message):
    with pytest.raises(ProgramFormatError) as e:
        decode_stream(raw_stream(stream))
    assert str(e.value) == message
    with pytest.raises(ProgramFormatError) as e:
        encode_stream(stream)
    assert str(e.value) == message


def test_encode_rejects_non_streams():
    with pytest.raises(ProgramFormatError, match="must be an array of isa.RECORD, got float64"):
        encode_stream(np.zeros(3))
    with pytest.raises(ProgramFormatError, match="must be an array of isa.RECORD, got list"):
        encode_stream([])  # type: ignore[arg-type]
    with pytest.raises(ProgramFormatError, match=r"1-D array of records, got shape \(1, 1\)"):
        encode_stream(empty_stream(1).reshape(1, 1))


def test_validate_returns_stream():
    s = golden_stream()
    assert validate_stream(s) is s
    assert validate_stream(s, strict=True) is s


def test_used_fields_cover_every_opcode():
    assert set(USED_FIELDS) == set(Opcode)
    names = set(RECORD.names)
    for used in USED_FIELDS.values():
        assert used <= names


# --------------------------------------------------------------------------- canonical form


@pytest.mark.parametrize(
    "field, value, index, message",
    [
        ("b_mem", 1, 2, "record 2: b_mem = 1, but vec_unary does not use b_mem (it must be 0)"),
        ("queue", 1, 1, "record 1: queue = 1, but matmul does not use queue (it must be 0)"),
        ("k", 5, 0, "record 0: k = 5, but dma_load does not use k (it must be 0)"),
        ("a_part", 5, 0, "record 0: a_part = 5, but dma_load does not use a_part (it must be 0)"),
        ("signal_sem", 3, 8, "record 8: signal_sem = 3, but barrier does not use signal_sem "
         "(it must be -1)"),
        ("pad", 1, 6, "record 6: pad = 1, but vec_reduce does not use pad (it must be 0)"),
        ("imm", 2.0, 3, "record 3: imm = 2.0, but a vec_binary without B_IMM does not use imm "
         "(it must be 0.0)"),
        ("b_addr", 8, 4, "record 4: b_addr = 8, but a vec_binary with B_IMM does not use b_addr "
         "(it must be 0)"),
        ("flags", int(Flag.B_IMM | Flag.B_COLUMN), 4,
         "record 4: vec_binary has both B_COLUMN and B_IMM (choose one form of operand b)"),
        ("flags", int(Flag.SWAP), 1,
         "record 1: flags 0x8 not allowed on matmul (allowed: 0x1)"),
        ("a_dtype", 0, 6, "record 6: a_dtype is 0, but vec_reduce needs an element type there"),
        ("a_mem", int(Mem.SRAM), 0,
         "record 0: a_mem = SRAM, but dma_load needs this operand in HBM"),
        ("o_mem", int(Mem.HBM), 1,
         "record 1: o_mem = HBM, but matmul needs this operand on chip (SRAM or ACC)"),
        ("signal_sem", -2, 1, "record 1: signal_sem = -2 (no signal is -1)"),
    ],
)  # fmt: skip
def test_print_rejects_non_canonical(field, value, index, message):
    s = _bad(field, value, index)
    validate_stream(s)  # valid enums: the binary format takes it
    with pytest.raises(ProgramFormatError) as e:
        print_asm(s)
    assert str(e.value) == message


def test_print_rejects_bad_wait_slots():
    s = golden_stream()
    s["wait_val"][3, 2] = 5  # inactive slot with a value
    with pytest.raises(ProgramFormatError, match=r"^record 3: wait slots \(\[-1, -1, -1, -1\], "
                       r"\[0, 0, 5, 0\]\) are not canonical"):
        print_asm(s)


# --------------------------------------------------------------------------- asm errors


def err(text: str) -> str:
    with pytest.raises(AsmSyntaxError) as e:
        parse_asm(text)
    return str(e.value)


OK = "vec.exp sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 16x16"


@pytest.mark.parametrize(
    "line, message",
    [
        ("foo", "1: expected an instruction (barrier, dma.load, dma.store, dma.gather, dma.scatter, matmul, "
         "vec.<function>, link.send or link.recv), got 'foo'"),
        ("dma.load sram[p0 +0x0]:f32", "10: expected a DMA queue (q0, q1, ...), got 'sram'"),
        ("dma.load q0 hbm[0x0 rs=1 cs=1]:f32 sram[p0 +0x0]:f32 1x1",
         "36: expected '->', got 'sram'"),
        ("vec.exp sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32",
         "47: expected a shape ROWSxCOLS (e.g. 16x64), got end of line"),
        ("vec.exp sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 16 x 16",
         "48: expected a shape ROWSxCOLS (e.g. 16x64), got '16'"),
        ("vec.exp sram[p0 0x0]:f32 -> sram[p0 +0x0]:f32 1x1", "17: expected '+', got '0x0'"),
        ("vec.exp sram[]:f32 -> sram[p0 +0x0]:f32 1x1",
         "14: expected a place: 'pPART +ADDR' (on chip) or 'ADDR rs=ROW_STRIDE "
         "cs=COL_STRIDE' (hbm), got ']'"),
        ("vec.exp sram[p0 +0x0] -> sram[p0 +0x0]:f32 1x1", "23: expected ':', got '->'"),
        ("vec.add sram[p0 +0x0]:f32, 2.0 -> sram[p0 +0x0]:f32 1x1",
         "28: expected 'col', 'imm' or an operand (sram[...], acc[...] or hbm[...]), got '2.0'"),
        ("vec.add sram[p0 +0x0]:f32, imm x -> sram[p0 +0x0]:f32 1x1",
         "32: expected a float value, got 'x'"),
        ("matmul sram[p0 +0x0]:bf16, sram[p0 +0x0]:bf16 -> acc[p0 +0x0]:f32 m=16 n=16",
         "72: expected 'k', got 'n'"),
        (OK + " wait(s1>=1", "64: expected ')' or ',', got end of line"),
        (OK + " wait(s1)", "61: expected '>=', got ')'"),
        (OK + " signal(s1) wait(s1>=1)", "65: expected end of line, got 'wait'"),
        (OK + " @", "54: expected 'signal(...)', 'wait(...)' or end of line, got '@'"),
        ("barrier x", "9: expected end of line, got 'x'"),
    ],
)  # fmt: skip
def test_syntax_errors(line, message):
    text = f"barrier\n# comment\n\n{line}\nbarrier\n"
    col = int(message.split(":")[0])
    full = err(text)
    first, src, caret = full.split("\n")
    assert first == f"line 4:{message}"
    assert src == "    " + line
    assert caret == "    " + " " * (col - 1) + "^"


@pytest.mark.parametrize(
    "line, message",
    [
        ("vec.foo sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "1: unknown vector function 'foo' (unary: copy, relu, gelu, gelu_tanh, exp, tanh, "
         "sigmoid, neg, abs, sqrt, rsqrt, reciprocal, log, silu, square, erf; binary: add, sub, "
         "mul, div, max, min, pow, eq, ne, lt, le, gt, ge, mask; reduce: reduce_sum, reduce_max, reduce_min)"),
        ("vec.exp.swap sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "1: unknown modifier '.swap' on vec.exp"),
        ("vec.add.swop sram[p0 +0x0]:f32, imm 1 -> sram[p0 +0x0]:f32 1x1",
         "1: unknown modifier '.swop' on vec.add (binary functions take '.swap')"),
        ("vec.exp sram[p0 +0x0]:f64 -> sram[p0 +0x0]:f32 1x1",
         "23: unknown element type 'f64' (expected f32, bf16, f16, i32, i8, f8e4m3)"),
        ("vec.exp dram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "9: unknown memory 'dram' (expected hbm, sram or acc)"),
        ("dma.load q256 hbm[0x0 rs=1 cs=1]:f32 -> sram[p0 +0x0]:f32 1x1",
         "10: queue 256 out of range (0..255)"),
        ("dma.load q0 sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "13: the source of dma.load is in hbm, not sram"),
        ("dma.store q0 sram[p0 +0x0]:f32 -> acc[p0 +0x0]:f32 1x1",
         "35: the destination of dma.store is in hbm, not acc"),
        ("dma.load q0 hbm[0x0 rs=1 cs=1]:f32 -> hbm[0x0 rs=1 cs=1]:f32 1x1",
         "39: the destination of dma.load is on chip (sram or acc), not hbm"),
        ("vec.exp hbm[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "13: an hbm operand is written hbm[ADDR rs=ROW_STRIDE cs=COL_STRIDE]"),
        ("vec.exp sram[0x0 rs=1 cs=1]:f32 -> sram[p0 +0x0]:f32 1x1",
         "14: an on-chip operand is written sram[pPART +ADDR]"),
        ("vec.exp sram[p65536 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "14: start partition 65536 out of range (0..65535)"),
        ("vec.exp sram[p0 +0x10000000000000000]:f32 -> sram[p0 +0x0]:f32 1x1",
         "18: address 0x10000000000000000 out of range (0..18446744073709551615)"),
        ("vec.exp sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 4294967296x1",
         "48: rows 4294967296 out of range (0..4294967295)"),
        ("vec.exp sram[p0 +0x0]:f32, sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "1: vec.exp takes one input, got two"),
        ("vec.add sram[p0 +0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
         "1: vec.add takes two inputs: a tile, then a tile, 'col' tile or 'imm' value"),
        ("vec.add sram[p0 +0x0]:f32, imm 1e39 -> sram[p0 +0x0]:f32 1x1",
         "32: bad imm value: 1e39 is out of the float32 range"),
        ("vec.add sram[p0 +0x0]:f32, imm 0x1.000001p+0 -> sram[p0 +0x0]:f32 1x1",
         "32: bad imm value: 0x1.000001p+0 is not exactly a float32 value"),
        ("vec.add sram[p0 +0x0]:f32, imm nan(0x3f800000) -> sram[p0 +0x0]:f32 1x1",
         "32: bad imm value: 0x3f800000 is not the bit pattern of a float32 NaN"),
        ("matmul hbm[0x0 rs=1 cs=1]:bf16, sram[p0 +0x0]:bf16 -> acc[p0 +0x0]:f32 m=1 k=1 n=1",
         "8: the lhsT operand is on chip (sram or acc), not hbm"),
        ("matmul sram[p0 +0x0]:bf16, sram[p0 +0x0]:bf16 -> acc[p0 +0x0]:f32 m=1 k=1 "
         "n=4294967296", "77: n 4294967296 out of range (0..4294967295)"),
        (OK + " signal(s32768)", "61: semaphore 32768 out of range (0..32767)"),
        (OK + " wait(s1>=4294967296)", "63: wait value 4294967296 out of range (0..4294967295)"),
        (OK + " wait(s1>=1, s2>=1, s3>=1, s4>=1, s5>=1)",
         f"54: at most {MAX_WAITS} waits per instruction, got 5"),
    ],
)  # fmt: skip
def test_semantic_errors(line, message):
    if "at most" in message and MAX_WAITS >= 5:
        pytest.skip("the ISA allows this many waits")
    text = f"barrier\n{line}\n"
    col = int(message.split(":")[0])
    full = err(text)
    first, src, caret = full.split("\n")
    assert first == f"line 2:{message}"
    assert src == "    " + line
    assert caret == "    " + " " * (col - 1) + "^"


def test_error_caret_follows_tabs():
    full = err("\tvec.exp\tsram[p0 0x0]:f32 -> sram[p0 +0x0]:f32 1x1")
    assert full.split("\n") == [
        "line 1:18: expected '+', got '0x0'",
        "    \tvec.exp\tsram[p0 0x0]:f32 -> sram[p0 +0x0]:f32 1x1",
        "    \t       \t        ^",
    ]


def test_error_on_last_line_without_newline():
    assert err("barrier\nmatmul").split("\n")[0] == (
        "line 2:7: expected an operand (sram[...], acc[...] or hbm[...]), got end of line"
    )


# --------------------------------------------------------------------------- docs


def test_docs_record_table_matches_isa():
    """docs/isa.md lists every RECORD field with its offset and size."""
    text = DOCS.read_text()
    rows = re.findall(r"^\| *(\d+) *\| *(\d+) *\| *`(\w+)`", text, re.M)
    documented = {name: (int(off), int(size)) for off, size, name in rows}
    for name in RECORD.names:
        dt, off = RECORD.fields[name][:2]
        assert documented.get(name) == (off, dt.itemsize), f"docs/isa.md: field {name}"
    assert f"{RECORD.itemsize} bytes" in text


def test_docs_examples_parse():
    """Every line of the docs' asm code blocks parses."""
    text = DOCS.read_text()
    blocks = re.findall(r"```asm\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        parse_asm(block)
