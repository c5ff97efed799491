"""The intrinsic work of a tile-DSL kernel, counted from its source at given shapes.

The roofline bound of a DSL kernel (`simulator/roofline.py`) divides this work by the
target's peak rates. It is what the kernel *as written* computes, statement by
statement, never what the compiled program does: the transposes the lowering adds
(identity matmuls, selection matrices of interleaved loads), its constants, fills and
extra copies, and its shared (CSE'd) loads count nothing. The counting mirrors the
graph-level counter (`ir/graph_work.py`):

- ``matmul(a, b)`` / ``matmul_t(aT, b)``: M*K*N MACs at the operands' actual sizes,
  16-bit when the operands are bf16 / f16, else fp32.
- Data movement is free: loads and stores, ``transpose(...)``, windows ``x[:, a:b]``,
  row broadcasts, casts (``f32(x)``, ``bf16(...)``, the cast a store adds), ``y = x``,
  ``zeros`` / ``full`` / ``empty``, ``row_ids`` / ``col_ids``.
- A unary function f of a tile: elements * ``[vector.op_cost.unary] f``.
- A binary operator or ``max(a, b)`` / ``min(a, b)``: result elements * its
  ``[vector.op_cost.binary]`` cost * 2 when both operands are tiles of the result's
  shape, * 1 when one is a number, a column ``[R x 1]`` or a broadcast row
  (``load(bias[n])``, also against a one-row edge tile); ``-x`` is ``x * -1`` and
  ``transpose(x) * c`` is one multiply, as the lowering computes them. ``x += v`` is
  ``x = x + v`` (also on a freshly zeroed tile).
- ``sum`` / ``max`` / ``min`` / ``mean`` of a tile: input elements * the
  ``[vector.op_cost.reduce]`` cost (``mean`` is a sum; its 1/n scale is part of it).
- Work whose result is known when the kernel is compiled costs nothing: arithmetic on
  numbers and on index tiles of static loop tiles (unrolled loops:
  ``(col_ids(j) > row_ids(m)) * -1e30``, a causal mask, is a constant tile; index tiles
  of a loop that runs as ``scf.for`` are loaded data, and arithmetic on them counts),
  and the elements where a constant tile operand is the op's
  identity (``+ 0``, ``- 0``, ``* 1``, ``/ 1``). A causal mask therefore counts only
  where it is not zero: the elements above the diagonal of the query tile's diagonal
  tile, as a full-tile add (2 inputs), in each pass that adds it.

Loops count every iteration: a statement inside ``for m in tiles(E, S)`` counts once per
tile at that tile's size (the partial edge tile at its own size), so the kernel's loop
bounds decide what is computed. A causal kernel whose key loop stops at the query
tile's end (``tiles(m.end, B)``) counts the keys up to that end: the masked half of
each diagonal tile is computed (scores, max, exp, sums, P @ V) and counts, the tiles
above the diagonal are never visited and count nothing. That half depends on the tile
size the source picks (``T = target.partitions``: S^2 / 2 + S * T / 2 scores per head),
which is what the kernel computes on that target; kernels without such loops count
the same work on every target. Multi-buffered, peeled and unrolled copies of a body
count once each, a body that runs as ``scf.for`` once per trip.

The shapes and dtypes of every expression come from the front end's own checking
lowering (`frontend/dsl/lower`, which checks and emits together): `kernel_work` lowers
the kernel once, unscheduled, and the lowering reports each operation to a `WorkTally`
at the DSL construct it comes from, with the trip counts of the `scf.for` loops around
it.

    kernel_work(parse(src)[0], [(64, 32), (32, 48), (48,)], cfg)
        -> IntrinsicWork(macs_16=98304, vector_element_cycles=..., compulsory_hbm_bytes=...)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation

from tilecc.errors import CompileError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.parser import parse
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.roofline import IntrinsicWork

__all__ = ["WorkTally", "kernel_work", "dsl_call_work", "compulsory_bytes"]

ITEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4}
SIXTEEN_BIT = ("bf16", "f16")


class WorkTally:
    """The work of one kernel's statements as the lowering meets them, each multiplied
    by the trip counts of the loops it is in (`repeated`)."""

    def __init__(self, cfg: HardwareConfig) -> None:
        self.costs = cfg.vector.op_cost
        self.times = 1  # product of the trip counts of the enclosing scf.for loops
        self.macs_16 = 0.0
        self.macs_fp32 = 0.0
        self.macs_int8 = 0.0
        self.macs_fp8 = 0.0
        self.vector = 0.0
        self.by_op: dict[str, dict[str, float]] = {}

    @contextmanager
    def repeated(self, trip: int) -> Iterator[None]:
        """Inside a loop body lowered once and run `trip` times."""
        saved = self.times
        self.times = saved * trip
        try:
            yield
        finally:
            self.times = saved

    def _add(self, kind: str, macs: float, vector: float) -> None:
        entry = self.by_op.setdefault(kind, {"macs": 0.0, "vector": 0.0, "count": 0.0})
        entry["macs"] += macs * self.times
        entry["vector"] += vector * self.times
        entry["count"] += self.times
        self.vector += vector * self.times

    def matmul(self, m: int, k: int, n: int, dtype: str) -> None:
        macs = float(m * k * n)
        if dtype in SIXTEEN_BIT:  # (the DSL has no one-byte dtypes: macs_int8 / macs_fp8 stay 0)
            self.macs_16 += macs * self.times
        else:
            self.macs_fp32 += macs * self.times
        self._add("matmul", macs, 0.0)

    def unary(self, fn: str, rows: int, cols: int) -> None:
        self._add(f"unary.{fn}", 0.0, rows * cols * self.costs.unary[fn])

    def binary(self, fn: str, elements: int, inputs: int) -> None:
        """`inputs`: 2 when both operands are tiles of the result's shape, else 1."""
        self._add(f"binary.{fn}", 0.0, elements * self.costs.binary[fn] * inputs)

    def reduce(self, fn: str, rows: int, cols: int) -> None:
        """`rows x cols`: the input's elements."""
        self._add(f"reduce.{fn}", 0.0, rows * cols * self.costs.reduce[fn])

    def work(self, compulsory_hbm_bytes: float) -> IntrinsicWork:
        return IntrinsicWork(macs_16=self.macs_16, macs_fp32=self.macs_fp32, vector_element_cycles=self.vector,
                             compulsory_hbm_bytes=float(compulsory_hbm_bytes),
                             by_op={k: dict(v) for k, v in sorted(self.by_op.items())},
                             macs_int8=self.macs_int8, macs_fp8=self.macs_fp8)


def compulsory_bytes(kernel: A.Kernel, dims: Sequence[tuple[int, ...]]) -> int:
    """The kernel's parameters and results, each once (`dims`: their shapes, in order)."""
    params = kernel.params + kernel.results
    return sum(math.prod(d) * ITEM_BYTES[p.type.dtype] for p, d in zip(params, dims, strict=True))


def kernel_work(kernel: A.Kernel, shapes: Sequence[tuple[int, ...]], cfg: HardwareConfig) -> IntrinsicWork:
    """The intrinsic work of `kernel` at the input `shapes` on `cfg` (see the module
    docstring); DslErrors as compiling it would raise them."""
    from tilecc.frontend.dsl.lower import KernelLowering

    kl = KernelLowering(kernel, [tuple(s) for s in shapes], cfg, schedule=False)
    kl.run()
    return kl.work()


def dsl_call_work(op: Operation, cfg: HardwareConfig) -> IntrinsicWork:
    """The intrinsic work of a `graph.dsl_call` (its kernel at its operands' shapes)."""
    if not isinstance(op, DslCallOp):
        raise CompileError(f"dsl_call_work counts graph.dsl_call ops, not {op.name}")
    name = op.kernel.data
    kernel = next((k for k in parse(op.source.data, op.file.data) if k.name == name), None)
    if kernel is None:
        raise CompileError(f"graph.dsl_call: no kernel '{name}' in {op.file.data}")
    shapes = []
    for v in op.operands:
        t = v.type
        if not isinstance(t, TensorType):
            raise CompileError(f"graph.dsl_call @{name}: operand of type {t} is not a tensor")
        shapes.append(tuple(int(n) for n in t.get_shape()))
    return kernel_work(kernel, shapes, cfg)
