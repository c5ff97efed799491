"""The `npu` dialect: instructions on engine queues, loops kept structured.

One `npu.kernel` per distinct kernel, in launch order; a kernel launched again on
other HBM tensors (a repeated layer) is an `npu.launch` naming it, with the byte
address delta of each argument from the kernel's first launch; the DMA instructions
whose HBM address comes from argument j carry `hbm_arg = j`, and codegen relocates
them per launch (`codegen/expand.py`). Its body holds instructions and
`npu.loop`s (a trip count; the induction variable of the loop at nesting depth d is
named ``i<d>`` in expressions). Every instruction op holds:

- `fields`: the instruction record fields of `simulator.isa.RECORD` it sets: integers
  where constant, and `ir.affine` expressions (strings) where they vary per iteration;
  on-chip addresses are physical (partition, byte offset) after memory planning;
- `waits`: semaphore waits ``"s3 >= 2*i0 + 1"``; `signal`: the semaphore it bumps;
- `reads` / `writes`: the on-chip buffers it touches (names), from which
  `npu-insert-sync` derives the waits.

Example::

    npu.kernel @k0_matmul {
      npu.loop {trip = 3 : i64} {
        npu.dma_load {fields = {queue = 0 : i64, a_addr = "4096 + 212*i0", ...},
                      writes = ["lhsT"], waits = ["s1 >= i0"], signal = 0 : i64}
        npu.matmul {fields = {...}, reads = ["lhsT", "rhs"], writes = ["acc"], ...}
      }
    }

Codegen (`codegen/expand.py`) expands the loops into the flat record stream with
vectorised numpy, never one IR op per dynamic instruction.
"""

from __future__ import annotations

import functools
import re
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Dialect, Region
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.traits import NoTerminator
from xdsl.utils.exceptions import VerifyException

from tilecc.ir.affine import Expr, ExprSyntaxError, parse_expr
from tilecc.simulator.isa import RECORD, Opcode

_WAIT = re.compile(r"^s(\d+) >= (.+)$")

FieldValue = int | float | str


@irdl_op_definition
class KernelOp(IRDLOperation):
    name = "npu.kernel"
    sym_name = prop_def(StringAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$sym_name attr-dict-with-keyword $body"

    def __init__(self, name: str, ops: list[IRDLOperation] | None = None):
        super().__init__(
            properties={"sym_name": StringAttr(name)}, regions=[Region(Block(ops or []))]
        )


@irdl_op_definition
class LaunchOp(IRDLOperation):
    """A re-launch of `npu.kernel` `kernel` on other HBM tensors: `deltas[j]` bytes added
    to the HBM address of every instruction whose `hbm_arg` is j."""

    name = "npu.launch"
    kernel = prop_def(StringAttr)
    deltas = prop_def(ArrayAttr[IntegerAttr])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$kernel attr-dict"

    def __init__(self, kernel: str, deltas: list[int]):
        super().__init__(properties={
            "kernel": StringAttr(kernel), "deltas": ArrayAttr([IntegerAttr(d, i64) for d in deltas])})

    @property
    def delta_list(self) -> list[int]:
        return [d.value.data for d in self.deltas]


@irdl_op_definition
class LoopOp(IRDLOperation):
    name = "npu.loop"
    trip = prop_def(IntegerAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict-with-keyword $body"

    def __init__(self, trip: int, ops: list[IRDLOperation] | None = None):
        super().__init__(
            properties={"trip": IntegerAttr(trip, i64)}, regions=[Region(Block(ops or []))]
        )

    def verify_(self) -> None:
        if self.trip.value.data < 1:
            raise VerifyException(f"npu.loop: trip count must be >= 1, got {self.trip.value.data}")


class InstructionOp(IRDLOperation):
    """Base of npu instructions; see the module docstring for the properties."""

    OPCODE: ClassVar[Opcode]
    REQUIRED: ClassVar[tuple[str, ...]]

    fields = prop_def(DictionaryAttr)
    waits = prop_def(ArrayAttr[StringAttr])
    signal = opt_prop_def(IntegerAttr)
    hbm_arg = opt_prop_def(IntegerAttr)  # the kernel argument the HBM address field is relative to
    reads = prop_def(ArrayAttr[StringAttr])
    writes = prop_def(ArrayAttr[StringAttr])
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "attr-dict"

    def __init__(
        self,
        fields: dict[str, FieldValue],
        reads: list[str],
        writes: list[str],
        waits: list[str] | None = None,
        signal: int | None = None,
        hbm_arg: int | None = None,
    ):
        props: dict[str, Attribute] = {
            "fields": DictionaryAttr({k: _field_attr(v) for k, v in fields.items()}),
            "waits": ArrayAttr([_attr(str, w) for w in waits or []]),
            "reads": ArrayAttr([_attr(str, r) for r in reads]),
            "writes": ArrayAttr([_attr(str, w) for w in writes]),
        }
        if signal is not None:
            props["signal"] = IntegerAttr(signal, i64)
        if hbm_arg is not None:
            props["hbm_arg"] = IntegerAttr(hbm_arg, i64)
        super().__init__(properties=props)

    def field_values(self) -> dict[str, FieldValue]:
        out: dict[str, FieldValue] = {}
        for k, v in self.fields.data.items():
            if isinstance(v, IntegerAttr):
                out[k] = v.value.data
            elif isinstance(v, FloatAttr):
                out[k] = v.value.data
            elif isinstance(v, StringAttr):
                out[k] = v.data
        return out

    def field_exprs(self) -> dict[str, int | float | Expr]:
        return {
            k: parse_expr(v) if isinstance(v, str) else v for k, v in self.field_values().items()
        }

    def wait_list(self) -> list[tuple[int, Expr]]:
        out: list[tuple[int, Expr]] = []
        for w in self.waits.data:
            m = _WAIT.match(w.data)
            assert m, w.data
            out.append((int(m.group(1)), parse_expr(m.group(2))))
        return out

    def verify_(self) -> None:
        names = set(RECORD.names or ())  # RECORD is a structured dtype: its names are never None
        values = self.field_values()
        for k, v in values.items():
            if k not in names or k in ("opcode", "engine", "wait_sem", "wait_val", "signal_sem"):
                raise VerifyException(f"{self.name}: '{k}' is not a settable instruction field")
            if isinstance(v, str):
                try:
                    parse_expr(v)
                except ExprSyntaxError as e:
                    raise VerifyException(f"{self.name}: field {k}: {e}") from None
        missing = [k for k in self.REQUIRED if k not in values]
        if missing:
            raise VerifyException(f"{self.name}: missing fields {', '.join(missing)}")
        for w in self.waits.data:
            m = _WAIT.match(w.data)
            if not m:
                raise VerifyException(f"{self.name}: bad wait '{w.data}' (expected 's<N> >= <expr>')")
            try:
                parse_expr(m.group(2))
            except ExprSyntaxError as e:
                raise VerifyException(f"{self.name}: wait '{w.data}': {e}") from None


def _field_attr(v: FieldValue) -> Attribute:
    if isinstance(v, bool):
        return _attr(int, int(v))
    if isinstance(v, int):
        return _attr(int, v)
    if isinstance(v, float):
        return _attr(float, v)
    return _attr(str, str(v))


@functools.lru_cache(maxsize=1 << 16)
def _attr(kind: type, v: int | float | str) -> Attribute:
    """Attributes are immutable: equal field values share one (building an xDSL
    attribute costs tens of microseconds; a kernel repeats few distinct values)."""
    if kind is int and isinstance(v, int):
        return IntegerAttr(v, i64)
    if kind is float and isinstance(v, float):
        return FloatAttr(v, 32)
    return StringAttr(str(v))


_SIZES = ("rows", "cols")
_A = ("a_mem", "a_part", "a_addr", "a_dtype")
_B = ("b_mem", "b_part", "b_addr", "b_dtype")
_O = ("o_mem", "o_part", "o_addr", "o_dtype")


@irdl_op_definition
class DmaLoadOp(InstructionOp):
    name = "npu.dma_load"
    OPCODE: ClassVar[Opcode] = Opcode.DMA_LOAD
    REQUIRED: ClassVar[tuple[str, ...]] = ("queue", "a_addr", "a_dtype", "hbm_rs", "hbm_cs", *_O, *_SIZES)


@irdl_op_definition
class DmaStoreOp(InstructionOp):
    name = "npu.dma_store"
    OPCODE: ClassVar[Opcode] = Opcode.DMA_STORE
    REQUIRED: ClassVar[tuple[str, ...]] = ("queue", *_A, "o_addr", "o_dtype", "hbm_rs", "hbm_cs", *_SIZES)


@irdl_op_definition
class DmaGatherOp(InstructionOp):
    """Indirect DMA (`Opcode.DMA_GATHER`): rows ``index[r]`` of an HBM table (base
    `a_addr`, row stride `hbm_rs`, `k` rows) into an on-chip tile; `b_*` the index column."""

    name = "npu.dma_gather"
    OPCODE: ClassVar[Opcode] = Opcode.DMA_GATHER
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "queue", "a_addr", "a_dtype", "hbm_rs", "k", *_B, *_O, *_SIZES,
    )


@irdl_op_definition
class DmaScatterOp(InstructionOp):
    """Indirect store (`Opcode.DMA_SCATTER`): rows of an on-chip tile (`a_*`) to rows
    ``index[r]`` of an HBM table (base `o_addr`, row stride `hbm_rs`, `k` rows); `b_*`
    the index column."""

    name = "npu.dma_scatter"
    OPCODE: ClassVar[Opcode] = Opcode.DMA_SCATTER
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "queue", *_A, *_B, "o_addr", "o_dtype", "hbm_rs", "k", *_SIZES,
    )


@irdl_op_definition
class MatmulOp(InstructionOp):
    name = "npu.matmul"
    OPCODE: ClassVar[Opcode] = Opcode.MATMUL
    REQUIRED: ClassVar[tuple[str, ...]] = (*_A, *_B, *_O, "rows", "cols", "k", "flags")


@irdl_op_definition
class VecUnaryOp(InstructionOp):
    name = "npu.vec_unary"
    OPCODE: ClassVar[Opcode] = Opcode.VEC_UNARY
    REQUIRED: ClassVar[tuple[str, ...]] = ("func", *_A, *_O, *_SIZES)


@irdl_op_definition
class VecBinaryOp(InstructionOp):
    name = "npu.vec_binary"
    OPCODE: ClassVar[Opcode] = Opcode.VEC_BINARY
    REQUIRED: ClassVar[tuple[str, ...]] = ("func", "flags", *_A, *_O, *_SIZES)


@irdl_op_definition
class VecReduceOp(InstructionOp):
    name = "npu.vec_reduce"
    OPCODE: ClassVar[Opcode] = Opcode.VEC_REDUCE
    REQUIRED: ClassVar[tuple[str, ...]] = ("func", *_A, *_O, *_SIZES)


INSTRUCTION_OPS: tuple[type[InstructionOp], ...] = (
    DmaLoadOp,
    DmaStoreOp,
    DmaGatherOp,
    DmaScatterOp,
    MatmulOp,
    VecUnaryOp,
    VecBinaryOp,
    VecReduceOp,
)
OP_FOR_OPCODE = {cls.OPCODE: cls for cls in INSTRUCTION_OPS}
# the field holding the HBM address of the DMAs (relocated per `npu.launch` by `hbm_arg`)
HBM_ADDR_FIELD: dict[type[InstructionOp], str] = {
    DmaLoadOp: "a_addr", DmaGatherOp: "a_addr", DmaStoreOp: "o_addr", DmaScatterOp: "o_addr",
}

Npu = Dialect("npu", [KernelOp, LaunchOp, LoopOp, *INSTRUCTION_OPS], [])
