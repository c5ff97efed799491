"""The NPU instruction set: the contract between codegen and the simulator.

A program is a flat stream of fixed-size instruction records (a numpy structured
array, `RECORD`), in program order. Each record runs on one engine queue:

- DMA (queue q): ``DMA_LOAD`` copies a 2-D strided HBM region into an on-chip tile;
  ``DMA_STORE`` copies an on-chip tile to a 2-D strided HBM region; ``DMA_GATHER``
  (indirect DMA) copies ``rows`` rows of an HBM table into an on-chip tile, row r being
  table row ``index[r]``: the table starts at ``a_addr`` (any column offset folded in),
  its rows are ``hbm_rs`` elements apart and there are ``k`` of them; the indices are an
  on-chip i32 column (``b_*``: element r at partition ``b_part + r``, byte ``b_addr``);
  ``cols`` contiguous elements are copied per row. An index outside ``[0, k)`` is a
  `MemoryAccessError`. Source and destination dtypes are equal (a DMA does not convert).
  ``DMA_SCATTER`` (indirect store) is its mirror: row r of an on-chip tile (``a_*``,
  ``rows x cols``) goes to row ``index[r]`` of an HBM table at ``o_addr`` (rows
  ``hbm_rs`` elements apart, ``k`` of them, ``cols`` contiguous elements written per
  row); the indices are an on-chip i32 column (``b_*``). Rows are written in order r, so
  of duplicate indices the last row wins; an index outside ``[0, k)`` is a
  `MemoryAccessError`.
- MATRIX: ``MATMUL`` ``out[M x N] (+)= lhsT[K x M]^T @ rhs[K x N]``: both operands in
  SRAM with the contraction dimension K on partitions (K <= array rows, the stationary
  operand ``rhs`` has N <= array columns), output in the accumulator (fp32), M rows on
  M partitions. Flag ``ACCUMULATE`` adds to the accumulator instead of overwriting.
  Each operand is f32, bf16, f16, i8 or f8e4m3 on its own (mixed inputs: a bf16
  moving operand against an i8 / f8e4m3 stationary weight is the weight-only
  quantised matmul); the array multiplies the operands' exact values (every i8 and
  f8e4m3 value is exact in bf16) and accumulates in fp32.
- VECTOR: ``VEC_UNARY`` (func from `UnaryFn`), ``VEC_BINARY`` (`BinaryFn`, second
  operand a tile, a per-partition column [rows x 1] broadcast along the free
  dimension (flag ``B_COLUMN``), or the immediate ``imm`` (flag ``B_IMM``); flag
  ``SWAP`` computes ``b op a``), ``VEC_REDUCE`` (`ReduceFn` along the free dimension,
  output [rows x 1]). Vector arithmetic is fp32 and rounds to the output dtype (i32
  operands convert to fp32, exact up to 2**24 in magnitude; an i32 output truncates
  toward zero, saturating, NaN -> 0). The comparisons ``EQ NE LT LE GT GE`` give 1.0 or
  0.0; ``MASK`` gives ``a`` where ``b != 0``, else +0.0.

On-chip addresses: an operand tile of ``rows x cols`` elements in memory ``mem``
(SRAM or ACC) at (``part``, ``addr``) puts element (r, c) at partition ``part + r``,
byte ``addr + c * itemsize`` of that partition. HBM operands are flat byte addresses
``addr`` with element strides ``hbm_rs`` (between rows; 0 broadcasts) and ``hbm_cs``
(between columns).

- LINK (queue l, a chip-to-chip link DMA queue ``link0``, ``link1``, ...; only the
  multi-chip simulator, `simulator/multichip.py`, runs them): ``LINK_SEND`` sends the
  ``rows x cols`` HBM region at ``a_addr`` (strides ``hbm_rs``, ``hbm_cs``) to chip ``k``
  over the interconnect; ``LINK_RECV`` takes the next transfer chip ``k`` sent it (first
  in, first out per pair of chips, any queues; equal element counts) and writes it to the HBM
  region at ``o_addr``, or, with flag ``REDUCE``, writes ``a + data`` there (``a`` the
  local HBM region at ``a_addr``: the reduction is done on write). A send completes (and
  signals its semaphore, on the sender) when its last byte has left the sender; a receive
  completes (and signals its semaphore, on the receiver) once its data has arrived and
  it has been written.

Synchronisation: semaphores are counters starting at 0 at the start of each kernel.
An instruction starts once each ``wait_sem[i] >= 0`` has value ``>= wait_val[i]``; on
completion it adds 1 to ``signal_sem`` (if ``>= 0``). Instructions with opcode
``BARRIER`` (engine ALL) separate kernels: every engine drains and semaphores reset.
"""

from __future__ import annotations

import enum

import numpy as np


class Engine(enum.IntEnum):
    DMA = 0
    MATRIX = 1
    VECTOR = 2
    LINK = 3
    ALL = 255


class Opcode(enum.IntEnum):
    BARRIER = 0
    DMA_LOAD = 1
    DMA_STORE = 2
    MATMUL = 3
    VEC_UNARY = 4
    VEC_BINARY = 5
    VEC_REDUCE = 6
    DMA_GATHER = 7
    DMA_SCATTER = 8
    LINK_SEND = 9
    LINK_RECV = 10


OPCODE_ENGINE = {
    Opcode.BARRIER: Engine.ALL,
    Opcode.DMA_LOAD: Engine.DMA,
    Opcode.DMA_STORE: Engine.DMA,
    Opcode.MATMUL: Engine.MATRIX,
    Opcode.VEC_UNARY: Engine.VECTOR,
    Opcode.VEC_BINARY: Engine.VECTOR,
    Opcode.VEC_REDUCE: Engine.VECTOR,
    Opcode.DMA_GATHER: Engine.DMA,
    Opcode.DMA_SCATTER: Engine.DMA,
    Opcode.LINK_SEND: Engine.LINK,
    Opcode.LINK_RECV: Engine.LINK,
}
LINK_OPS = (Opcode.LINK_SEND, Opcode.LINK_RECV)
MAX_LINK_QUEUES = 8  # link DMA queues per chip (link0 .. link7)


class Mem(enum.IntEnum):
    HBM = 0
    SRAM = 1
    ACC = 2


class DType(enum.IntEnum):
    F32 = 1
    BF16 = 2
    F16 = 3
    I32 = 4
    I8 = 5  # one-byte weights (weight-only quantisation): the matrix engine's int8 input
    F8E4M3 = 6  # fp8 e4m3 ("fn": no infinities, max 448), stored as its raw 8 bits


DTYPE_NAMES = {DType.F32: "f32", DType.BF16: "bf16", DType.F16: "f16", DType.I32: "i32",
               DType.I8: "i8", DType.F8E4M3: "f8e4m3"}
DTYPE_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}
ITEMSIZE = {DType.F32: 4, DType.BF16: 2, DType.F16: 2, DType.I32: 4, DType.I8: 1, DType.F8E4M3: 1}
# the one-byte inputs of the matrix engine (MAC energy and rates per dtype: simulator/config.py)
LOW_PRECISION = frozenset({DType.I8, DType.F8E4M3})
# numpy dtype holding the stored bits of each element type (bf16 is kept as raw uint16)
STORAGE = {
    DType.F32: np.dtype("<f4"),
    DType.BF16: np.dtype("<u2"),
    DType.F16: np.dtype("<f2"),
    DType.I32: np.dtype("<i4"),
    DType.I8: np.dtype("i1"),
    DType.F8E4M3: np.dtype("u1"),
}


class UnaryFn(enum.IntEnum):
    COPY = 0
    RELU = 1
    GELU = 2
    GELU_TANH = 3
    EXP = 4
    TANH = 5
    SIGMOID = 6
    NEG = 7
    ABS = 8
    SQRT = 9
    RSQRT = 10
    RECIPROCAL = 11
    LOG = 12
    SILU = 13
    SQUARE = 14
    ERF = 15


class BinaryFn(enum.IntEnum):
    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    MAX = 4
    MIN = 5
    POW = 6
    EQ = 7
    NE = 8
    LT = 9
    LE = 10
    GT = 11
    GE = 12
    MASK = 13


class ReduceFn(enum.IntEnum):
    SUM = 0
    MAX = 1
    MIN = 2


class Flag(enum.IntFlag):
    NONE = 0
    ACCUMULATE = 1
    B_COLUMN = 2
    B_IMM = 4
    SWAP = 8
    REDUCE = 16  # LINK_RECV: add the local a_* region to the data received


FUNC_ENUM = {
    Opcode.VEC_UNARY: UnaryFn,
    Opcode.VEC_BINARY: BinaryFn,
    Opcode.VEC_REDUCE: ReduceFn,
}

MAX_WAITS = 4  # waits per instruction: at most one per other engine queue in practice

RECORD = np.dtype(
    [
        ("opcode", "u1"),
        ("engine", "u1"),
        ("queue", "u1"),
        ("func", "u1"),
        ("flags", "u1"),
        ("a_dtype", "u1"),
        ("b_dtype", "u1"),
        ("o_dtype", "u1"),
        ("a_mem", "u1"),
        ("b_mem", "u1"),
        ("o_mem", "u1"),
        ("pad", "u1"),
        ("a_part", "<u2"),
        ("b_part", "<u2"),
        ("o_part", "<u2"),
        ("signal_sem", "<i2"),
        ("wait_sem", "<i2", (MAX_WAITS,)),
        ("wait_val", "<u4", (MAX_WAITS,)),
        ("rows", "<u4"),
        ("cols", "<u4"),
        ("k", "<u4"),
        ("imm", "<f4"),
        ("a_addr", "<u8"),
        ("b_addr", "<u8"),
        ("o_addr", "<u8"),
        ("hbm_rs", "<i8"),
        ("hbm_cs", "<i8"),
    ]
)
RECORD_NAMES: tuple[str, ...] = RECORD.names or ()  # a structured dtype: its field names


def empty_stream(n: int) -> np.ndarray:
    """A stream of `n` records with every optional field cleared (no waits, no signal)."""
    s = np.zeros(n, dtype=RECORD)
    s["signal_sem"] = -1
    s["wait_sem"] = -1
    return s


def stream_of(*instrs: dict) -> np.ndarray:
    """A stream from one dict of fields per instruction (the engine follows the opcode;
    fields not named stay as `empty_stream` clears them): hand-written microbenchmarks."""
    s = empty_stream(len(instrs))
    for i, fields in enumerate(instrs):
        s[i]["engine"] = OPCODE_ENGINE[fields["opcode"]]
        for key, value in fields.items():
            s[i][key] = value
    return s
