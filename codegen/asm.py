"""Assembly text for instruction streams: `print_asm` and its inverse `parse_asm`.

One instruction per line; only the fields an opcode uses are written (the others are
cleared, as ``isa.empty_stream`` leaves them, and the parser restores them so)::

    barrier
    dma.load q0 hbm[0x1000 rs=53 cs=1]:f32 -> sram[p0 +0x200]:f32 16x53 wait(s3>=2, s4>=1) signal(s1)
    dma.store q1 sram[p0 +0x200]:bf16 -> hbm[0x8000 rs=64 cs=1]:bf16 16x64
    matmul sram[p0 +0x0]:bf16, sram[p0 +0x400]:bf16 -> acc[p0 +0x0]:f32 m=16 k=16 n=16 accumulate
    vec.exp sram[p0 +0x0]:f32 -> sram[p0 +0x100]:bf16 16x64
    vec.add sram[p0 +0x0]:f32, col sram[p0 +0x800]:f32 -> sram[p0 +0x0]:f32 16x64
    vec.sub.swap acc[p0 +0x0]:f32, imm 0.5 -> sram[p0 +0x0]:f32 16x64 signal(s2)
    vec.reduce_max sram[p0 +0x0]:f32 -> sram[p0 +0x900]:f32 16x64
    link.send l0 hbm[0x0 rs=64 cs=1]:f32 -> chip1:f32 1x64 signal(s0)
    link.recv l1 chip3:f32 + hbm[0x0 rs=64 cs=1]:f32 -> hbm[0x400 rs=64 cs=1]:f32 1x64 signal(s1)
    dma.gather q0 hbm[0x1000 rs=768 bound=1000]:f32, index sram[p0 +0x0]:i32 -> sram[p0 +0x40]:f32 16x768
    dma.scatter q3 sram[p0 +0x40]:f32, index sram[p0 +0x0]:i32 -> hbm[0x1000 rs=768 bound=1000]:f32 16x768

The lines are those of `simulator.listing` (which the simulator's messages and traces
use too); `print_asm` validates the stream first. The grammar is ``asm.lark`` (LALR).
`print_asm` followed by `parse_asm` restores every record bit for bit (imm values are written in
the shortest decimal form that reads back to the same float32, else as a hex float, and NaNs
with a payload as ``nan(0xBITS)``).
Errors raise `AsmSyntaxError`: a first line ``line L:C: <what is wrong>``, then the
source line and a caret under the column.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any, cast

import lark
import numpy as np
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tilecc.codegen.binary import validate_stream
from tilecc.errors import AsmSyntaxError
from tilecc.simulator.isa import (
    DTYPE_BY_NAME,
    MAX_WAITS,
    OPCODE_ENGINE,
    RECORD,
    RECORD_NAMES,
    Flag,
    Mem,
    Opcode,
)
from tilecc.simulator.listing import (
    BINARY_NAMES,
    MEM_NAMES,
    REDUCE_NAMES,
    UNARY_NAMES,
    imm_bits,
    instruction_lines,
)

__all__ = ["format_instruction", "parse_asm", "print_asm"]

# ----------------------------------------------------------------------------- names

_MEM_BY_NAME = {v: k for k, v in MEM_NAMES.items()}
_DT_BY_NAME = {n: int(d) for n, d in DTYPE_BY_NAME.items()}
# vector function name (after "vec.") -> (opcode, func)
_VEC_FUNCS: dict[str, tuple[int, int]] = {}
for _op, _names in (
    (Opcode.VEC_UNARY, UNARY_NAMES),
    (Opcode.VEC_BINARY, BINARY_NAMES),
    (Opcode.VEC_REDUCE, REDUCE_NAMES),
):
    for _f, _n in _names.items():
        assert _n not in _VEC_FUNCS, f"vector function name {_n} is ambiguous"
        _VEC_FUNCS[_n] = (int(_op), _f)

_U8, _U16, _U32, _U64 = 0xFF, 0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
_I16_MAX = 0x7FFF
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


# ----------------------------------------------------------------------------- printing


def print_asm(stream: np.ndarray) -> str:
    """The assembly text of a stream: one line per record, each ending in a newline.

    The stream must be valid and canonical (``validate_stream(stream, strict=True)``);
    otherwise `ProgramFormatError` names the first offending record and field."""
    validate_stream(stream, strict=True)
    if stream.size == 0:
        return ""
    return "\n".join(instruction_lines(stream)) + "\n"


def format_instruction(record: np.void | np.ndarray) -> str:
    """The assembly line (no newline) of one record (or a length-1 stream)."""
    arr = np.asarray(record, dtype=RECORD).reshape(1)
    return print_asm(arr)[:-1]


# ----------------------------------------------------------------------------- parsing

_NAMES = list(RECORD_NAMES)
_I = {n: i for i, n in enumerate(_NAMES)}  # field name -> index in a record tuple
_TEMPLATE: list = []  # a cleared record (as isa.empty_stream leaves it), as a list
for _n in _NAMES:
    if _n == "wait_sem":
        _TEMPLATE.append((-1,) * MAX_WAITS)
    elif _n == "wait_val":
        _TEMPLATE.append((0,) * MAX_WAITS)
    elif _n == "signal_sem":
        _TEMPLATE.append(-1)
    elif _n == "imm":
        _TEMPLATE.append(0.0)
    else:
        _TEMPLATE.append(0)


class _SemanticError(Exception):
    """A value error at `token` (a lark Token; a plain str on the fast path)."""

    def __init__(self, message: str, token: lark.Token | str):
        super().__init__(message)
        self.message = message
        self.column = getattr(token, "column", None) or 1


def _num(tok: lark.Token, hi: int, what: str, lo: int = 0, skip: int = 0) -> int:
    """The integer in `tok` (after `skip` prefix characters, e.g. the p of p3), range-checked."""
    s = tok[skip:] if skip else tok
    # the grammar's NUM/SNUM: [+-]? then 0x-hex or decimal digits (leading zeros allowed)
    value = int(s, 16) if "x" in s else int(s, 10)
    if not lo <= value <= hi:
        raise _SemanticError(f"{what} {s} out of range ({lo}..{hi})", tok)
    return value


class _Operand:
    __slots__ = ("mem", "part", "addr", "rs", "cs", "dtype", "tok", "bound")

    def __init__(
        self, mem: int, part: int, addr: int, rs: int, cs: int, dtype: int, tok: lark.Token | str,
        bound: int | None = None,
    ):
        self.mem, self.part, self.addr, self.rs, self.cs = mem, part, addr, rs, cs
        self.dtype, self.tok, self.bound = dtype, tok, bound


def _need_chip(opnd: _Operand, what: str) -> None:
    if opnd.mem == Mem.HBM:
        raise _SemanticError(f"{what} is on chip (sram or acc), not hbm", opnd.tok)


class _Builder(lark.Transformer):
    """Builds record tuples while the LALR parser reduces (no parse tree)."""

    def __init__(self):
        super().__init__(visit_tokens=False)

    # -- operands
    def chip_place(self, c: list[Any]):
        part_tok, addr_tok = c
        part = _num(part_tok, _U16, "start partition", skip=1)
        return ("chip", part, _num(addr_tok, _U64, "address"), part_tok)

    def hbm_place(self, c: list[Any]):
        addr_tok, rs_tok, cs_tok = c
        return (
            "hbm",
            _num(addr_tok, _U64, "address"),
            _num(rs_tok, _I64_MAX, "row stride", _I64_MIN),
            _num(cs_tok, _I64_MAX, "column stride", _I64_MIN),
            addr_tok,
        )

    def table_place(self, c: list[Any]):
        addr_tok, rs_tok, bound_tok = c
        return (
            "table",
            _num(addr_tok, _U64, "address"),
            _num(rs_tok, _I64_MAX, "row stride", _I64_MIN),
            0,
            _num(bound_tok, _U32, "bound"),
            addr_tok,
        )

    def operand(self, c: list[Any]):
        mem_tok, place, dt_tok = c
        mem = _MEM_BY_NAME.get(str(mem_tok))
        if mem is None:
            raise _SemanticError(
                f"unknown memory '{mem_tok}' (expected hbm, sram or acc)", mem_tok
            )
        dtype = _DT_BY_NAME.get(str(dt_tok))
        if dtype is None:
            raise _SemanticError(
                f"unknown element type '{dt_tok}' (expected {', '.join(_DT_BY_NAME)})", dt_tok
            )
        if place[0] == "chip":
            if mem == Mem.HBM:
                raise _SemanticError(
                    "an hbm operand is written hbm[ADDR rs=ROW_STRIDE cs=COL_STRIDE]", place[3]
                )
            return _Operand(mem, place[1], place[2], 0, 0, dtype, mem_tok)
        if mem != Mem.HBM:
            raise _SemanticError(
                f"an on-chip operand is written {mem_tok}[pPART +ADDR]", place[4]
            )
        bound = place[4] if place[0] == "table" else None
        return _Operand(mem, 0, place[1], place[2], place[3], dtype, mem_tok, bound)

    def tile_b(self, c: list[Any]):
        return ("tile", c[0])

    def col_b(self, c: list[Any]):
        return ("col", c[1])

    def imm_b(self, c: list[Any]):
        tok = c[1]
        try:
            return ("imm", imm_bits(str(tok)))
        except ValueError as e:
            raise _SemanticError(f"bad imm value: {e}", tok) from None

    # -- synchronisation
    def wait_on(self, c: list[Any]):
        sem_tok, val_tok = c
        sem = _num(sem_tok, _I16_MAX, "semaphore", skip=1)
        return (sem, _num(val_tok, _U32, "wait value"))

    def wait_none(self, c: list[Any]):
        return (-1, 0)

    def wait(self, c: list[Any]):
        slots = c[1:]
        if len(slots) > MAX_WAITS:
            raise _SemanticError(
                f"at most {MAX_WAITS} waits per instruction, got {len(slots)}", c[0]
            )
        slots = slots + [(-1, 0)] * (MAX_WAITS - len(slots))
        return ("wait", tuple(s for s, _ in slots), tuple(v for _, v in slots))

    def signal(self, c: list[Any]):
        tok = c[0]
        return ("signal", _num(tok, _I16_MAX, "semaphore", skip=1))

    def sync(self, c: list[Any]):
        return c

    def accumulate(self, c: list[Any]):
        return bool(c)

    # -- instructions
    @staticmethod
    def _record(opcode: int, sync: Any, imm: int = 0) -> list:
        """A record as a list of RECORD's fields, plus the imm bits as a last element."""
        r = [*_TEMPLATE, imm]
        r[_I["opcode"]] = opcode
        r[_I["engine"]] = int(OPCODE_ENGINE[Opcode(opcode)])
        for item in sync:
            if item[0] == "wait":
                r[_I["wait_sem"]], r[_I["wait_val"]] = item[1], item[2]
            else:
                r[_I["signal_sem"]] = item[1]
        return r

    @staticmethod
    def _put(r: list, prefix: str, o: _Operand) -> None:
        r[_I[prefix + "_mem"]] = int(o.mem)
        r[_I[prefix + "_part"]] = o.part
        r[_I[prefix + "_addr"]] = o.addr
        r[_I[prefix + "_dtype"]] = o.dtype

    @staticmethod
    def _shape(r: list, tok: lark.Token) -> None:
        rows, cols = tok.split("x")
        for name, text in (("rows", rows), ("cols", cols)):
            value = int(text, 10)
            if value > _U32:
                raise _SemanticError(f"{name} {value} out of range (0..{_U32})", tok)
            r[_I[name]] = value

    def barrier(self, c: list[Any]):
        return self._record(int(Opcode.BARRIER), ())

    def dma(self, c: list[Any]):
        op_tok, q_tok, src, dst, shape, sync = c
        load = op_tok == "dma.load"
        hbm, chip = (src, dst) if load else (dst, src)
        if hbm.mem != Mem.HBM:
            side = "source" if load else "destination"
            raise _SemanticError(
                f"the {side} of {op_tok} is in hbm, not {MEM_NAMES[hbm.mem]}", hbm.tok
            )
        if chip.mem == Mem.HBM:
            side = "destination" if load else "source"
            raise _SemanticError(
                f"the {side} of {op_tok} is on chip (sram or acc), not hbm", chip.tok
            )
        if hbm.bound is not None:
            raise _SemanticError(
                f"the hbm operand of {op_tok} is written hbm[ADDR rs=ROW_STRIDE cs=COL_STRIDE] "
                "(bound=ROWS is for dma.gather and dma.scatter)",
                hbm.tok,
            )
        r = self._record(int(Opcode.DMA_LOAD if load else Opcode.DMA_STORE), sync)
        r[_I["queue"]] = _num(q_tok, _U8, "queue", skip=1)
        self._put(r, "a" if load else "o", hbm)
        self._put(r, "o" if load else "a", chip)
        r[_I["a_part" if load else "o_part"]] = 0
        r[_I["hbm_rs"]], r[_I["hbm_cs"]] = hbm.rs, hbm.cs
        self._shape(r, shape)
        return r

    def gather(self, c: list[Any]):
        _, q_tok, table, index, o, shape, sync = c
        if table.mem != Mem.HBM or table.bound is None:
            raise _SemanticError(
                "the source of dma.gather is an hbm table hbm[ADDR rs=ROW_STRIDE bound=ROWS]",
                table.tok,
            )
        _need_chip(index, "the index operand of dma.gather")
        _need_chip(o, "the destination of dma.gather")
        r = self._record(int(Opcode.DMA_GATHER), sync)
        r[_I["queue"]] = _num(q_tok, _U8, "queue", skip=1)
        self._put(r, "a", table)
        r[_I["a_part"]] = 0
        r[_I["hbm_rs"]] = table.rs
        r[_I["k"]] = table.bound
        self._put(r, "b", index)
        self._put(r, "o", o)
        self._shape(r, shape)
        return r

    def scatter(self, c: list[Any]):
        _, q_tok, a, index, table, shape, sync = c
        if table.mem != Mem.HBM or table.bound is None:
            raise _SemanticError(
                "the destination of dma.scatter is an hbm table hbm[ADDR rs=ROW_STRIDE bound=ROWS]",
                table.tok,
            )
        _need_chip(a, "the source of dma.scatter")
        _need_chip(index, "the index operand of dma.scatter")
        r = self._record(int(Opcode.DMA_SCATTER), sync)
        r[_I["queue"]] = _num(q_tok, _U8, "queue", skip=1)
        self._put(r, "a", a)
        self._put(r, "b", index)
        self._put(r, "o", table)
        r[_I["o_part"]] = 0
        r[_I["hbm_rs"]] = table.rs
        r[_I["k"]] = table.bound
        self._shape(r, shape)
        return r

    def matmul(self, c: list[Any]):
        _, a, b, o, m, k, n, acc, sync = c
        for opnd, what in ((a, "the lhsT operand"), (b, "the rhs operand"), (o, "the output")):
            _need_chip(opnd, what)
        r = self._record(int(Opcode.MATMUL), sync)
        self._put(r, "a", a)
        self._put(r, "b", b)
        self._put(r, "o", o)
        r[_I["rows"]] = _num(m, _U32, "m")
        r[_I["k"]] = _num(k, _U32, "k")
        r[_I["cols"]] = _num(n, _U32, "n")
        r[_I["flags"]] = int(Flag.ACCUMULATE) if acc else 0
        return r

    def vector(self, c: list[Any]):
        op_tok = c[0]
        if len(c) == 6:
            _, a, b, o, shape, sync = c
        else:
            _, a, o, shape, sync = c
            b = None
        parts = op_tok.split(".")[1:]
        name, mods = parts[0], parts[1:]
        if name not in _VEC_FUNCS:
            raise _SemanticError(
                f"unknown vector function '{name}' (unary: {', '.join(UNARY_NAMES.values())}; "
                f"binary: {', '.join(BINARY_NAMES.values())}; "
                f"reduce: {', '.join(REDUCE_NAMES.values())})",
                op_tok,
            )
        opcode, func = _VEC_FUNCS[name]
        swap = False
        for mod in mods:
            if mod != "swap" or opcode != Opcode.VEC_BINARY or swap:
                raise _SemanticError(
                    f"unknown modifier '.{mod}' on vec.{name}"
                    + (" (binary functions take '.swap')" if opcode == Opcode.VEC_BINARY else ""),
                    op_tok,
                )
            swap = True
        _need_chip(a, "the input operand")
        _need_chip(o, "the output")
        flags = int(Flag.SWAP) if swap else 0
        imm = 0
        if opcode == Opcode.VEC_BINARY:
            if b is None:
                raise _SemanticError(
                    f"vec.{name} takes two inputs: a tile, then a tile, 'col' tile or 'imm' value",
                    op_tok,
                )
        elif b is not None:
            raise _SemanticError(f"vec.{name} takes one input, got two", op_tok)
        if b is not None and b[0] == "imm":
            flags |= int(Flag.B_IMM)
            imm = b[1]
        elif b is not None:
            _need_chip(b[1], "operand b")
            if b[0] == "col":
                flags |= int(Flag.B_COLUMN)
        r = self._record(opcode, sync, imm)
        r[_I["func"]] = func
        r[_I["flags"]] = flags
        self._put(r, "a", a)
        if b is not None and b[0] != "imm":
            self._put(r, "b", b[1])
        self._put(r, "o", o)
        self._shape(r, shape)
        return r

    def peer(self, c: list[Any]):
        chip_tok, dt_tok = c
        dtype = _DT_BY_NAME.get(str(dt_tok))
        if dtype is None:
            raise _SemanticError(
                f"unknown element type '{dt_tok}' (expected {', '.join(_DT_BY_NAME)})", dt_tok
            )
        return (_num(chip_tok, _U32, "peer chip", skip=4), dtype)

    def _link_hbm(self, o: _Operand, what: str) -> None:
        if o.mem != Mem.HBM or o.bound is not None:
            raise _SemanticError(f"{what} is an hbm operand hbm[ADDR rs=ROW_STRIDE cs=COL_STRIDE]", o.tok)

    def link_send(self, c: list[Any]):
        _, q_tok, src, peer, shape, sync = c
        self._link_hbm(src, "the source of link.send")
        r = self._record(int(Opcode.LINK_SEND), sync)
        r[_I["queue"]] = _num(q_tok, _U8, "link queue", skip=1)
        self._put(r, "a", src)
        r[_I["a_part"]] = 0
        r[_I["hbm_rs"]], r[_I["hbm_cs"]] = src.rs, src.cs
        r[_I["k"]], r[_I["o_dtype"]] = peer
        self._shape(r, shape)
        return r

    def link_recv(self, c: list[Any]):
        if len(c) == 7:
            _, q_tok, peer, addend, dst, shape, sync = c
        else:
            _, q_tok, peer, dst, shape, sync = c
            addend = None
        self._link_hbm(dst, "the destination of link.recv")
        r = self._record(int(Opcode.LINK_RECV), sync)
        r[_I["queue"]] = _num(q_tok, _U8, "link queue", skip=1)
        self._put(r, "o", dst)
        r[_I["o_part"]] = 0
        r[_I["hbm_rs"]], r[_I["hbm_cs"]] = dst.rs, dst.cs
        r[_I["k"]], r[_I["a_dtype"]] = peer
        if addend is not None:
            self._link_hbm(addend, "the addend of link.recv")
            if (addend.rs, addend.cs, addend.dtype) != (dst.rs, dst.cs, peer[1]):
                raise _SemanticError("the addend of link.recv has the destination's strides and the "
                                     "received data's element type", addend.tok)
            r[_I["a_addr"]] = addend.addr
            r[_I["flags"]] = int(Flag.REDUCE)
        self._shape(r, shape)
        return r

    def start(self, c: list[Any]):
        return c


@functools.cache
def _grammar() -> str:
    return resources.files("tilecc.codegen").joinpath("asm.lark").read_text(encoding="utf-8")


@functools.cache
def _parser() -> lark.Lark:
    # the Builder is stateless, so one parser serves every call (and thread)
    return lark.Lark(_grammar(), parser="lalr", lexer="contextual", transformer=_Builder())


# ----------------------------------------------------------------------------- errors

_GROUPS = [
    (
        frozenset({"BARRIER", "MATMUL", "DMA_OP", "GATHER", "SCATTER", "VEC_OP", "LINK_SEND", "LINK_RECV"}),
        "an instruction (barrier, dma.load, dma.store, dma.gather, dma.scatter, matmul, "
        "vec.<function>, link.send or link.recv)",
        frozenset({"_NL", "$END"}),
    ),
    (
        frozenset({"PART", "NUM"}),
        "a place: 'pPART +ADDR' (on chip) or 'ADDR rs=ROW_STRIDE cs=COL_STRIDE' (hbm)",
        frozenset(),
    ),
]
_WORDS = {
    "BARRIER": "'barrier'",
    "MATMUL": "'matmul'",
    "DMA_OP": "'dma.load' or 'dma.store'",
    "GATHER": "'dma.gather'",
    "SCATTER": "'dma.scatter'",
    "VEC_OP": "a vector instruction vec.<function>",
    "QUEUE": "a DMA queue (q0, q1, ...)",
    "LINKQ": "a link queue (l0, l1, ...)",
    "CHIP": "a peer chip and element type (chip1:f32)",
    "PART": "a start partition (p0, p1, ...)",
    "SEM": "a semaphore (s0, s1, ...)",
    "MEM": "an operand (sram[...], acc[...] or hbm[...])",
    "DTYPE": "an element type (" + ", ".join(_DT_BY_NAME) + ")",
    "NUM": "a number",
    "SNUM": "a signed number",
    "SHAPE": "a shape ROWSxCOLS (e.g. 16x64)",
    "FLOAT": "a float value",
    "WAIT": "'wait(...)'",
    "_SIGNAL": "'signal(...)'",
    "ACCUMULATE": "'accumulate'",
    "COL": "'col'",
    "IMM": "'imm'",
    "_NL": "end of line",
    "$END": "end of line",
}


def _describe(expected: set[str], terminals: dict) -> str:
    expected = set(expected)
    words: list[str] = []
    for group, text, drop in _GROUPS:
        if group <= expected:
            expected -= group | drop
            words.append(text)
    for name in expected:
        if name in _WORDS:
            words.append(_WORDS[name])
        elif name in terminals and terminals[name].pattern.type == "str":
            words.append(f"'{terminals[name].pattern.value}'")
        else:
            words.append(name)
    words.sort()
    if not words:
        return "nothing"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


_WORD_AT = re.compile(r"[A-Za-z0-9_.]+|\S")


def _got(text: str, pos: int) -> str:
    m = _WORD_AT.match(text, pos)
    if m is None or text[pos] in "\r\n":
        return "end of line"
    return f"'{m.group(0)}'"


def _error(message: str, source: str, line: int, column: int) -> AsmSyntaxError:
    """`AsmSyntaxError`: 'line L:C: message', then the source line and a caret."""
    source = source.rstrip("\r\n")
    pad = "".join(ch if ch == "\t" else " " for ch in source[: column - 1])
    return AsmSyntaxError(f"line {line}:{column}: {message}\n    {source}\n    {pad}^")


def _translate(e: UnexpectedInput, source: str, line: int, terminals: dict) -> AsmSyntaxError:
    """A lark error on the one-line text `source` (line number `line`) -> AsmSyntaxError."""
    end = len(source.rstrip("\r\n")) + 1
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type in ("$END", "_NL"):
            column, got = (end, "end of line")
        else:
            # the root lexer may have split a word ('0x0' as NUM '0'): show the whole word
            word = _WORD_AT.match(source, tok.start_pos)
            text = word.group(0) if word and word.group(0).startswith(tok) else str(tok)
            column, got = tok.column, f"'{text}'"
        # the terminals this very parser stack accepts (e.expected is the LALR state's
        # set, which may include lookaheads of other rules sharing the state)
        try:
            expected = e.accepts or e.expected
        except Exception:  # pragma: no cover - defensive: fall back to the state's set
            expected = e.expected
        return _error(f"expected {_describe(expected, terminals)}, got {got}", source, line, column)
    if isinstance(e, UnexpectedCharacters):
        return _error(
            f"expected {_describe(e.allowed or set(), terminals)}, "
            f"got {_got(source, e.pos_in_stream)}",
            source,
            line,
            e.column,
        )
    if isinstance(e, UnexpectedEOF):  # pragma: no cover - the text always ends in a newline
        return _error(
            f"expected {_describe(set(e.expected), terminals)}, got end of line", source, line, end
        )
    return _error(str(e).splitlines()[0], source, line, getattr(e, "column", 1))  # pragma: no cover


# ----------------------------------------------------------------------------- parse


def _slow_line(source: str, line: int) -> list:
    """Parse one line with the LALR parser: [] or [record]; AsmSyntaxError on errors."""
    parser = _parser()
    try:
        return cast(list, parser.parse(source + "\n"))  # the _Builder transformer makes records
    except _SemanticError as e:
        raise _error(e.message, source, line, e.column) from None
    except lark.exceptions.VisitError as e:  # pragma: no cover - lark wraps some callbacks
        if isinstance(e.orig_exc, _SemanticError):
            raise _error(e.orig_exc.message, source, line, e.orig_exc.column) from None
        raise
    except UnexpectedInput as e:
        terminals = {t.name: t for t in parser.terminals}
        raise _translate(e, source, line, terminals) from None


@functools.cache
def _fast_patterns() -> dict[str, re.Pattern]:
    """Regexes for lines exactly as `print_asm` writes them, built from the grammar's own
    terminal patterns, so that they accept a subset of the grammar's language."""
    T = {t.name: f"(?:{t.pattern.to_regexp()})" for t in _parser().terminals}

    def chip(p: str) -> str:
        return (
            rf"(?P<{p}_m>{T['MEM']})\[(?P<{p}_p>{T['PART']}) \+(?P<{p}_a>{T['NUM']})\]"
            rf":(?P<{p}_d>{T['DTYPE']})"
        )

    def hbm(p: str) -> str:
        return (
            rf"(?P<{p}_m>hbm)\[(?P<{p}_a>{T['NUM']}) rs=(?P<{p}_rs>{T['SNUM']}) "
            rf"cs=(?P<{p}_cs>{T['SNUM']})\]:(?P<{p}_d>{T['DTYPE']})"
        )

    slot = rf"(?:{T['SEM']}>={T['NUM']}|-)"
    sync = (
        rf"(?: wait\((?P<wait>{slot}(?:, {slot})*)\))?"
        rf"(?: signal\((?P<signal>{T['SEM']})\))?"
    )
    shape = rf" (?P<shape>{T['SHAPE']})"
    pats = {
        "dma.load": (
            rf"(?P<op>dma\.load) (?P<q>{T['QUEUE']}) {hbm('a')} -> {chip('o')}{shape}{sync}"
        ),
        "dma.store": (
            rf"(?P<op>dma\.store) (?P<q>{T['QUEUE']}) {chip('a')} -> {hbm('o')}{shape}{sync}"
        ),
        "dma.gather": (
            rf"(?P<op>dma\.gather) (?P<q>{T['QUEUE']}) (?P<a_m>hbm)\[(?P<a_a>{T['NUM']}) "
            rf"rs=(?P<a_rs>{T['SNUM']}) bound=(?P<a_bound>{T['NUM']})\]:(?P<a_d>{T['DTYPE']}), "
            rf"index {chip('b')} -> {chip('o')}{shape}{sync}"
        ),
        "dma.scatter": (
            rf"(?P<op>dma\.scatter) (?P<q>{T['QUEUE']}) {chip('a')}, index {chip('b')} -> "
            rf"(?P<o_m>hbm)\[(?P<o_a>{T['NUM']}) rs=(?P<o_rs>{T['SNUM']}) "
            rf"bound=(?P<o_bound>{T['NUM']})\]:(?P<o_d>{T['DTYPE']}){shape}{sync}"
        ),
        "matmul": (
            rf"matmul {chip('a')}, {chip('b')} -> {chip('o')} m=(?P<m>{T['NUM']}) "
            rf"k=(?P<k>{T['NUM']}) n=(?P<n>{T['NUM']})(?P<acc> accumulate)?{sync}"
        ),
        "vec": (
            rf"(?P<op>{T['VEC_OP']}) {chip('a')}"
            rf"(?:, (?:(?P<col>col )?{chip('b')}|imm (?P<imm>{T['FLOAT']})))?"
            rf" -> {chip('o')}{shape}{sync}"
        ),
    }
    return {k: re.compile(v, re.ASCII) for k, v in pats.items()}


def _fast_line(line: str, pats: dict[str, re.Pattern], b: _Builder) -> list | None:
    """The record of a line in print_asm's exact form, or None (then the LALR parser
    takes the line, and reports any error)."""
    if line == "barrier":
        return b.barrier([line])
    key = "vec" if line.startswith("vec.") else line.split(" ", 1)[0]
    pat = pats.get(key)
    if pat is None:
        return None
    m = pat.fullmatch(line)
    if m is None:
        return None
    g = m.group
    try:
        items = []
        if g("wait") is not None:
            slots = [
                b.wait_none([t]) if t == "-" else b.wait_on(t.split(">="))
                for t in g("wait").split(", ")
            ]
            items.append(b.wait(["wait", *slots]))
        if g("signal") is not None:
            items.append(b.signal([g("signal")]))
        sync = b.sync(items)

        def chip(p: str) -> _Operand:
            place = b.chip_place([g(p + "_p"), g(p + "_a")])
            return b.operand([g(p + "_m"), place, g(p + "_d")])

        def hbm(p: str) -> _Operand:
            place = b.hbm_place([g(p + "_a"), g(p + "_rs"), g(p + "_cs")])
            return b.operand([g(p + "_m"), place, g(p + "_d")])

        if key == "dma.load":
            return b.dma([g("op"), g("q"), hbm("a"), chip("o"), g("shape"), sync])
        if key == "dma.store":
            return b.dma([g("op"), g("q"), chip("a"), hbm("o"), g("shape"), sync])
        if key == "dma.gather":
            place = b.table_place([g("a_a"), g("a_rs"), g("a_bound")])
            table = b.operand([g("a_m"), place, g("a_d")])
            return b.gather([g("op"), g("q"), table, chip("b"), chip("o"), g("shape"), sync])
        if key == "dma.scatter":
            place = b.table_place([g("o_a"), g("o_rs"), g("o_bound")])
            table = b.operand([g("o_m"), place, g("o_d")])
            return b.scatter([g("op"), g("q"), chip("a"), chip("b"), table, g("shape"), sync])
        if key == "matmul":
            acc = b.accumulate([g("acc")] if g("acc") else [])
            a, bb, o = chip("a"), chip("b"), chip("o")
            return b.matmul(["matmul", a, bb, o, g("m"), g("k"), g("n"), acc, sync])
        if g("imm") is not None:
            second = [b.imm_b(["imm", g("imm")])]
        elif g("b_m") is not None:
            opnd = chip("b")
            second = [b.col_b(["col", opnd]) if g("col") else b.tile_b([opnd])]
        else:
            second = []
        return b.vector([g("op"), chip("a"), *second, chip("o"), g("shape"), sync])
    except _SemanticError:
        return None


def _parse(text: str, fast: bool = True) -> np.ndarray:
    rows = []
    pats = _fast_patterns()
    builder = cast(_Builder, _parser().options.transformer)  # _parser() is built with _Builder()
    for i, line in enumerate(text.split("\n"), 1):
        r = _fast_line(line[:-1] if line.endswith("\r") else line, pats, builder) if fast else None
        if r is not None:
            rows.append(r)
        elif line and not line.isspace():
            rows.extend(_slow_line(line, i))
    stream = np.array([tuple(r[:-1]) for r in rows], dtype=RECORD)
    if stream.size:
        stream["imm"].view(np.uint32)[:] = [r[-1] for r in rows]
    return validate_stream(stream)


def parse_asm(text: str) -> np.ndarray:
    """Assembly text -> a validated instruction stream (`AsmSyntaxError` on bad input).

    Lines in exactly the form `print_asm` writes take a regex fast path (same token
    patterns and value checks as the grammar); every other line, and every error, goes
    through the LALR parser of ``asm.lark``."""
    return _parse(text)
