"""The intrinsic work of a graph program: what any program for it must do on this ISA.

`graph_work(gp, cfg)` counts, on the graph as the importer made it (before any pass,
fold-norm-affine included), from its shapes, element types and the config's vector op
costs only, the work the roofline bound (`simulator/roofline.py`) divides by the peak
rates. It never looks at a compiled program, so a worse program cannot raise its own
bound: the bound is identical at -O0 and -O2 and under any matmul schedule.

The ISA facts it rests on (`simulator/isa.py`): the matrix engine multiplies 16-bit or
fp32 operands from SRAM into the fp32 accumulator; a vector instruction computes one
function, reading two inputs when its second operand is a tile and one when it is a
per-partition column or an immediate; DMA moves any strided view and can read the
accumulator, but never converts an element type; views (permute, reshape, expand,
slice, ...) move only through DMA access patterns.

Work per graph op (`WORK_TABLE`; cost(f) is `[vector.op_cost]`'s cycles per element
group of function f; `n` the result's elements, `n_in` the input's)::

    matmul            MACs = batch*M*K*N, 16-bit when both operands are bf16/f16 (or a
                      one-byte i8 / f8e4m3 weight: mixed inputs run at the 16-bit rate),
                      8-bit when both are i8 (or i8 tensors converted to float: W8A8,
                      `ir/graph_lowp.int8_source`) or both f8e4m3, else fp32.
                      Evacuation of the accumulator: 0 when a consumer (through views)
                      is a vector op (it reads the accumulator) or the result is fp32
                      (DMA stores it); else n * cost(copy): the fp32 -> 16-bit
                      conversion only the vector engine does.
    conv2d            MACs = N*Cout*Hout*Wout*(Cin/groups)*kh*kw; bias: n * cost(add)
                      (a per-channel column, one input; it evacuates the accumulator);
                      without a bias, the matmul's evacuation rule.
    unary f           n * cost(f)                       (gelu: gelu / gelu_tanh)
    decomposed GELU / SiLU (the primitive ops torch.export writes them as, matched by
                      `ir/graph_patterns.py` as canonicalize-graph matches them):
                      n * cost(gelu / gelu_tanh / silu), the function they are
    binary f          n * cost(f) * (2 if both operands are full tensors of the result's
                      shape, else 1: a broadcast operand can be laid out as a column);
                      a one-byte weight's dequantisation ``cast(q) * s`` read only by
                      matmuls: 0 (the scale applies to the matmul's result, in the
                      evacuation counted there: ir/graph_lowp.py)
    compare f         as binary f
    where             n * cost(mask) * (2 if both branches are full tensors, else 1)
    sum / amax / amin n_in * cost(reduce sum / max / min); mean adds n * cost(mul)
    softmax           n * (max-reduce + sub + exp + sum-reduce + mul)  (sub and mul
                      take the row's statistic as a column)
    log_softmax       n * (max-reduce + sub + exp + sum-reduce + sub)
    layer_norm        n * (sum-reduce + sub + square + sum-reduce + mul); the affine
                      (weight mul, bias add, tile operands: 2 inputs each) only when
                      not the identity (ones / zeros) and not absorbable: it is
                      absorbable when every consumer (through views) is a matmul whose
                      other operand is a weight (fold-norm-affine's rewrite,
                      LN(x)*g+b @ W = LN(x) @ (g W) + b W).
    rms_norm          n * (square + sum-reduce + mul) + the weight mul (tile operand: 2
                      inputs) when the weight is not all ones and not absorbable (every
                      consumer a matmul by a weight: fold-norm-weight's rewrite,
                      (n * w) @ W = n @ (w W)); a decomposed RMSNorm
                      (`ir/graph_rms_norm_pattern.py`, as canonicalize-graph matches it)
                      counts as that one op
    max_pool2d        min(direct: the taps of every output inside the input, separable:
                      a row pass over Hin rows then a column pass) per image and channel,
                      * cost(reduce max)
    avg_pool2d        the same window count * cost(reduce sum), + n * cost(mul)
    adaptive_avg_pool max(n_in, n) * cost(reduce sum) + n * cost(mul)
    topk_indices      rows * C * ceil(log2(k + 1)) * cost(reduce max): a comparison
                      selection of the k extremes of a row of C in order (a heap of k;
                      k = 1: one max pass; k = C: the n log2 n of a sort)
    bincount          n_in * cost(eq): each value compared once (histc's bin arithmetic
                      is the elementwise ops the importer writes)
    cumsum            n * cost(add): one add per element (a sequential scan)
    sdpa / attention  see below
    dsl_call          the kernel's own MACs and vector work (`dsl_call_work`); its HBM
                      bytes are the graph's values, counted by the graph
    permute, reshape, expand, slice, concat, pad, upsample_nearest2d, gather_rows,
    cast, weight, constant: 0 (DMA patterns; a cast folds into the vector op that
                      produces or consumes the value)
    index_scatter     none: 0 (indirect DMA); sum / prod / amax / amin: n_src * cost(f) * 2
    as_strided        0 (a view)

Per-row statistics (one value per row: the reciprocal of a sum, rsqrt of a variance,
eps) are not counted: they are O(rows), and a lower bound stays one without them.

What "must" means: each resource's figure is what that resource does whatever the
others do, among the strategies named here (the row max and sum of attention on the
array, masks added by the array, an affine folded into a matmul's weights, an
evacuation fused into a vector op); otherwise an op counts as the graph writes it,
computed where it stands (a standalone softmax's subtraction and sum stay on the vector
engine: moving them to the array would first transpose its input there). The only
rewrites assumed are the importer's (batch norm folded into a convolution) and the
absorptions above. `tests/test_roofline_bound.py` checks the figures by hand and
against the compiled programs' own work.

Attention: `graph.sdpa` and the form models write, ``matmul(q, k^T)`` -> optional
mul / div by a constant scalar -> optional mask (an additive `add`, or
``where(mask, x, big negative)`` in either branch order) -> softmax over the last dim ->
``matmul(p, v)``, through single-consumer views and casts, count the same (under
`by_op["attention"]`). Per batch*head, with `pairs` the (query, key) pairs a program
must score::

    MACs    (d_k + d_v) * pairs          (16-bit when the matmuls' operands are)
    vector  pairs * (max-reduce + exp)
            + L * d_v * cost(mul)        (the final normalisation by the row sums)
            + min(L, S) * d_k * cost(mul) (the scale, folded into q or k; not when 1)

Only the max-reduce and the exp of each score are the vector engine's by necessity:
the subtraction of the row max folds into the QK matmul (one more contraction row,
``[q | 1] @ [k | -m]``) and the row sum into the PV matmul (a ones column of V), both
on the matrix engine, as tilecc's flash kernel does (`passes/graph_to_tile/attention`);
a program may also do them on the vector engine, so they add no MACs to the bound
either (each resource counts what it must do whatever the others do).

The decision on masks: a masked pair needs no work, so `pairs` counts only unmasked
ones when the mask is known at compile time: ``causal=True`` (torch's top-left
``tril``: query i sees keys j <= i) and a compile-time constant mask (a graph weight or
constant, or views of them): an additive value <= -1e30 or the element type's most
negative finite value (transformers uses ``finfo.min``, not -inf), or a `where`
condition selecting the big negative branch, is masked. A mask computed at run time
(from an input) can mask nothing at compile time: every L*S pair counts. Applying a
mask adds nothing to the bound: the matrix engine can add it to the scores (``acc +=
I^T @ mask``, as tilecc's kernel does) and the vector engine could instead; a run-time
mask's bytes are an input's, counted below. A pure compile-time mask (only 0 and
masked values) is built into the pairs a program scores: the ops computing it count no
work and its data is not compulsory traffic; a constant mask with other values (a bias
such as ALiBi) is data the program reads.

Compulsory HBM bytes: the graph's inputs that it reads, its outputs and every weight /
buffer it reads, at the graph's element type, each once. Compiler constants are not
the user's data and are excluded: `graph.constant` ops and the weights the importer
folded from constants alone (named `FOLDED_PREFIX`...; a weight derived from a
parameter keeps the parameter's name and counts, once with the parameter it came from:
"e.weight.permute" and "e.weight" are one tensor), and a pure compile-time attention
mask (a causal buffer: the program skips its masked pairs instead). A table that only
`gather_rows` reads (an embedding) counts min(table bytes, gathered rows * row bytes):
the indices are run-time values, so the rows gathered are counted as distinct. A
scatter updates its destination in place: an input that only `index_scatter` reads as
its destination counts no bytes, and an output that a scatter into an input produces
counts the rows written (the source's bytes), not the whole tensor.

`by_op` breaks the work down by op name (`"attention"` for both attention forms;
`"hbm inputs"`, `"hbm outputs"`, `"hbm weights"` for the bytes) for explanations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import graph as g
from tilecc.ir import graph_index as gi
from tilecc.ir import graph_nn as nn
from tilecc.ir import graph_rope as grope
from tilecc.ir import graph_routing as gr
from tilecc.ir import graph_scatter as gs
from tilecc.ir.graph_attention import CHAIN_VIEWS, MASKED_AT_OR_BELOW, masked, match_attention, numel
from tilecc.ir.graph_consts import ConstValues
from tilecc.ir.graph_dsl import DslCallOp
from tilecc.ir.graph_lowp import int8_source, match_lowp_weight, only_matmul_rhs
from tilecc.ir.graph_patterns import match_gelu, match_silu
from tilecc.ir.graph_rms_norm_pattern import RmsNormMatch, match_rms_norm
from tilecc.ir.vector_fns import BINARY, elementwise_fn
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import ITEMSIZE, DType
from tilecc.simulator.roofline import IntrinsicWork

__all__ = ["graph_work", "WORK_TABLE", "FOLDED_PREFIX", "DslCallWork", "MASKED_AT_OR_BELOW"]

FOLDED_PREFIX = "folded."  # the importer's name of a weight folded from constants alone

DslCallWork = Callable[[DslCallOp, HardwareConfig], IntrinsicWork]
Handler = Callable[["_Counter", Operation], None]

_CHAIN_VIEWS = CHAIN_VIEWS


def _dtype(v: SSAValue) -> DType:
    return g.element_dtype(v.type)


def _is16(v: SSAValue) -> bool:
    """16 bits or narrower: runs at the 16-bit MAC rate (a one-byte weight against bf16
    activations is a mixed-input matmul at the bf16 rate)."""
    return _dtype(v) in (DType.BF16, DType.F16, DType.I8, DType.F8E4M3)


def _nbytes(v: SSAValue) -> int:
    return numel(v) * ITEMSIZE[_dtype(v)]


@dataclass
class _Counter:
    gp: g.GraphProgram
    cfg: HardwareConfig
    dsl_call_work: DslCallWork | None
    macs_16: float = 0.0
    macs_fp32: float = 0.0
    macs_int8: float = 0.0  # both operands int8 (matrix.int8_speedup)
    macs_fp8: float = 0.0  # both operands fp8 e4m3 (matrix.fp8_speedup)
    vector: float = 0.0
    by_op: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])
    consts: ConstValues | None = None
    # ops counted as part of an attention, and the ops computing its compile-time masks
    claimed: set[Operation] = field(default_factory=set[Operation])
    mask_ops: set[Operation] = field(default_factory=set[Operation])
    mask_values: set[SSAValue] = field(default_factory=set[SSAValue])  # the masks themselves

    # -- costs --------------------------------------------------------------------------

    def unary(self, fn: str) -> float:
        return self.cfg.vector.op_cost.unary[fn]

    def binary(self, fn: str) -> float:
        return self.cfg.vector.op_cost.binary[fn]

    def reduce(self, fn: str) -> float:
        return self.cfg.vector.op_cost.reduce[fn]

    def add(self, kind: str, *, macs: float = 0.0, fp32: bool = False, vector: float = 0.0,
            macs_fp32: float = 0.0, macs_int8: float = 0.0, macs_fp8: float = 0.0) -> None:
        """Count one op of `kind`: `macs` (fp32 ones when `fp32`), `macs_fp32` more fp32
        MACs, `macs_int8` / `macs_fp8` MACs with both operands 8-bit, `vector` element-cycles."""
        m16, m32 = (0.0, macs + macs_fp32) if fp32 else (macs, macs_fp32)
        self.macs_16 += m16
        self.macs_fp32 += m32
        self.macs_int8 += macs_int8
        self.macs_fp8 += macs_fp8
        self.vector += vector
        row = self.by_op.setdefault(kind, {"macs": 0.0, "vector": 0.0, "count": 0.0})
        row["macs"] += m16 + m32 + macs_int8 + macs_fp8
        row["vector"] += vector
        row["count"] += 1

    # -- compile-time values ------------------------------------------------------------

    def const(self, v: SSAValue) -> np.ndarray | None:
        """The value of `v` when it is known at compile time (ir/graph_consts.py), else None."""
        if self.consts is None:
            self.consts = ConstValues(self.gp.weights)
        return self.consts(v)

    # -- the walk -----------------------------------------------------------------------

    def run(self) -> IntrinsicWork:
        ops = list(self.gp.func.body.block.ops)
        for op in ops:  # first the decomposed activations, attentions and compile-time masks
            act = _activation(op)
            if act is not None:
                self.claim_activation(op, *act)
            elif isinstance(op, g.SoftmaxOp):
                chain = _attention_chain(self, op)
                if chain is not None:
                    self.claimed |= chain
            elif isinstance(op, gi.SdpaOp) and op.mask is not None:
                _additive_mask(self, op.mask)
            elif isinstance(op, nn.MeanOp):
                self.claim_rms_norm(op)
        for op in ops:
            if op in self.claimed or op in self.mask_ops or isinstance(op, func.ReturnOp):
                continue
            rule = WORK_TABLE.get(type(op))
            if rule is None:
                raise CompileError(
                    f"{op.name} at {g.source_loc(op)}: no rule for its intrinsic work "
                    "(ir/graph_work.py WORK_TABLE)"
                )
            rule[1](self, op)
        return IntrinsicWork(
            macs_16=self.macs_16, macs_fp32=self.macs_fp32, macs_int8=self.macs_int8, macs_fp8=self.macs_fp8,
            vector_element_cycles=self.vector,
            compulsory_hbm_bytes=self.compulsory_bytes(), by_op=self.by_op,
        )

    def claim_rms_norm(self, mean: nn.MeanOp) -> None:
        """Count a decomposed RMSNorm as the `graph.rms_norm` canonicalize-graph makes of it."""
        m = match_rms_norm(mean)
        if not isinstance(m, RmsNormMatch):
            return
        _rms_norm_work(self, numel(m.final.results[0]), m.weight, m.final.results[0])
        self.claimed |= set(m.ops)

    def claim_activation(self, final: Operation, x: SSAValue, fn: str) -> None:
        """Count a decomposed activation ending at `final` as its one function: the ops
        between `x` and `final` that nothing else uses are claimed by it."""
        cone: set[Operation] = set()
        todo = [final]
        while todo:
            op = todo.pop()
            if op in cone:
                continue
            cone.add(op)
            todo += [o.owner for o in op.operands if o is not x and isinstance(o.owner, Operation)]
        changed = True
        while changed:  # keep only ops whose every use is inside (the final op's are outside)
            inner = {op for op in cone if op is final or all(u.operation in cone for r in op.results for u in r.uses)}
            changed, cone = inner != cone, inner
        self.claimed |= cone
        self.add(f"graph.{fn.split('_')[0]} (decomposed)", vector=numel(final.results[0]) * self.unary(fn))

    def compulsory_bytes(self) -> float:
        fn = self.gp.func
        ins = sum(self.read_bytes([a]) for a in fn.body.block.args)
        ret = fn.body.block.last_op
        outs = sum(_written_bytes(v) for v in ret.operands) if isinstance(ret, func.ReturnOp) else 0
        by_name: dict[str, list[SSAValue]] = {}
        for op in fn.body.block.ops:
            if isinstance(op, g.WeightOp) and not op.weight.startswith(FOLDED_PREFIX):
                by_name.setdefault(op.weight, []).append(op.result)
        # a weight the importer derived from another ("e.weight.permute") is the same data
        groups: dict[str, list[int]] = {}
        for name, vs in by_name.items():
            parts = name.split(".")
            root = next((r for r in (".".join(parts[:i]) for i in range(1, len(parts))) if r in by_name), name)
            groups.setdefault(root, []).append(self.read_bytes(vs))
        weights = sum(max(b) for b in groups.values())
        for kind, b in (("hbm inputs", ins), ("hbm outputs", outs), ("hbm weights", weights)):
            self.by_op[kind] = {"bytes": float(b)}
        return float(ins + outs + weights)

    def read_bytes(self, values: list[SSAValue]) -> int:
        """Bytes a program must read of one tensor (several ops may name one weight):
        none when unused, the gathered rows when only gather_rows reads it as its table."""
        uses = [u for v in values for u in v.uses]
        if all(u.operation in self.mask_ops or u.operation.operands[u.index] in self.mask_values for u in uses):
            return 0  # unused, or a compile-time attention mask (its pairs are skipped)
        full = _nbytes(values[0])
        if all(isinstance(u.operation, gs.IndexScatterOp) and u.index == 0 for u in uses):
            return 0  # a scatter's destination: updated in place, never read whole
        if not all(isinstance(u.operation, gi.GatherRowsOp) and u.index == 0 for u in uses):
            return full
        shape = g.shape_of(values[0])
        row = math.prod(shape[1:]) * ITEMSIZE[_dtype(values[0])]
        rows = sum(numel(cast(gi.GatherRowsOp, u.operation).indices) for u in uses)
        return min(full, rows * row)

    def evacuation(self, result: SSAValue) -> float:
        """Vector work to take a matmul's result out of the fp32 accumulator: 0 when it is
        fp32 (DMA stores it) or a vector op consumes it (through views), else a copy."""
        if not _is16(result) or _has_vector_consumer(result):
            return 0.0
        return numel(result) * self.unary("copy")


def _activation(op: Operation) -> tuple[SSAValue, str] | None:
    """(x, vector function) when `op` ends a decomposed GELU or SiLU (`ir/graph_patterns`)."""
    gelu = match_gelu(op)
    if gelu is not None:
        return gelu[0], "gelu" if gelu[1] == "none" else "gelu_tanh"
    x = match_silu(op)
    return (x, "silu") if x is not None else None


def _has_vector_consumer(v: SSAValue) -> bool:
    for use in v.uses:
        op = use.operation
        if isinstance(op, _CHAIN_VIEWS + (gi.SliceOp,)):
            if _has_vector_consumer(op.results[0]):
                return True
        elif isinstance(op, _VECTOR_READERS):
            return True
    return False


def _through_views(v: SSAValue) -> list[Operation]:
    """The consumers of `v`, looking through views and casts."""
    out: list[Operation] = []
    for use in v.uses:
        op = use.operation
        if isinstance(op, _CHAIN_VIEWS + (gi.SliceOp,)):
            out += _through_views(op.results[0])
        else:
            out.append(op)
    return out


def _weight_root(v: SSAValue) -> bool:
    """Whether `v` is a weight seen through views (a matmul operand fixed at compile time)."""
    owner = v.owner
    while isinstance(owner, _CHAIN_VIEWS):
        owner = owner.operands[0].owner
    return isinstance(owner, g.WeightOp | g.ConstantOp)


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------


def _written_bytes(v: SSAValue) -> int:
    """An output's compulsory bytes: a scatter into an input writes only its rows."""
    op = v.owner
    if isinstance(op, gs.IndexScatterOp) and not isinstance(op.dest.owner, Operation):
        return _nbytes(op.src)
    return _nbytes(v)


def _index_scatter(c: _Counter, op: Operation) -> None:
    s = cast(gs.IndexScatterOp, op)
    reduce = s.params()[1]
    fn = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}.get(reduce)
    c.add(op.name, vector=0.0 if fn is None else numel(s.src) * c.binary(fn) * 2)


def _zero(c: _Counter, op: Operation) -> None:
    c.add(op.name)


def _unary(c: _Counter, op: Operation) -> None:
    fn = elementwise_fn(op)
    assert fn is not None
    c.add(op.name, vector=numel(op.results[0]) * c.unary(fn[1]))


def _inputs(n: int, *operands: SSAValue) -> int:
    return 2 if all(numel(o) == n for o in operands) else 1


def _binary(c: _Counter, op: Operation) -> None:
    w = op.results[0]
    if match_lowp_weight(w) is not None and only_matmul_rhs(w):
        return  # a one-byte weight's scale: applied to the matmul's result (ir/graph_lowp.py)
    n = numel(op.results[0])
    c.add(op.name, vector=n * c.binary(BINARY[type(op)]) * _inputs(n, *op.operands))


def _where(c: _Counter, op: Operation) -> None:
    w = cast(gi.WhereOp, op)
    n = numel(w.result)
    c.add(op.name, vector=n * c.binary("mask") * _inputs(n, w.x, w.y))


def _matmul(c: _Counter, op: Operation) -> None:
    m = cast(g.MatmulOp, op)
    macs = numel(m.result) * g.shape_of(m.lhs)[-1]
    fp32 = not (_is16(m.lhs) and _is16(m.rhs))
    a, b = _dtype(m.lhs), _dtype(m.rhs)
    if int8_source(m.lhs) is not None and int8_source(m.rhs) is not None:
        a = b = DType.I8  # a W8A8 matmul: int8 values converted to float (ir/graph_lowp.py)
    if a == b == DType.I8:  # both operands 8-bit: the array's 8-bit rate
        c.add(op.name, macs_int8=float(macs), vector=c.evacuation(m.result))
    elif a == b == DType.F8E4M3:
        c.add(op.name, macs_fp8=float(macs), vector=c.evacuation(m.result))
    else:
        c.add(op.name, macs=macs, fp32=fp32, vector=c.evacuation(m.result))


def _conv(c: _Counter, op: Operation) -> None:
    conv = cast(nn.Conv2dOp, op)
    w = g.shape_of(conv.weight)
    cig, kh, kw = (w[1], w[2], w[3])  # oihw [Co, Ci/g, kh, kw] and gihwo [g, Ci/g, kh, kw, Co/g]
    n = numel(conv.result)
    fp32 = not (_is16(conv.input) and _is16(conv.weight))
    vector = n * c.binary("add") if conv.bias is not None else c.evacuation(conv.result)
    c.add(op.name, macs=n * cig * kh * kw, fp32=fp32, vector=vector)


def _softmax(c: _Counter, op: Operation) -> None:
    per = c.reduce("max") + c.binary("sub") + c.unary("exp") + c.reduce("sum") + c.binary("mul")
    c.add(op.name, vector=numel(op.results[0]) * per)


def _log_softmax(c: _Counter, op: Operation) -> None:
    per = c.reduce("max") + c.binary("sub") + c.unary("exp") + c.reduce("sum") + c.binary("sub")
    c.add(op.name, vector=numel(op.results[0]) * per)


def _rms_norm(c: _Counter, op: Operation) -> None:
    rn = cast(g.RmsNormOp, op)
    _rms_norm_work(c, numel(rn.result), rn.weight, rn.result)


def _rms_norm_work(c: _Counter, n: int, weight: SSAValue, result: SSAValue) -> None:
    """The weight multiply is not counted where the weight is all ones, or where every
    consumer is a matmul by a weight (the weight folds into theirs, as for a layer norm's
    affine: passes/graph/fold_norm_affine.py)."""
    per = c.unary("square") + c.reduce("sum") + c.binary("mul")
    w = c.const(weight)
    consumers = _through_views(result)
    absorbable = (
        _weight_root(weight) and bool(consumers)
        and all(isinstance(u, g.MatmulOp) and _weight_root(u.rhs) and not _weight_root(u.lhs) for u in consumers)
    )
    if not absorbable:
        per += 0.0 if w is not None and bool(np.all(w == 1)) else 2 * c.binary("mul")
    c.add(g.RmsNormOp.name, vector=n * per)


def _layer_norm(c: _Counter, op: Operation) -> None:
    ln = cast(g.LayerNormOp, op)
    n = numel(ln.result)
    per = c.reduce("sum") + c.binary("sub") + c.unary("square") + c.reduce("sum") + c.binary("mul")
    w, b = c.const(ln.weight), c.const(ln.bias)
    consumers = _through_views(ln.result)
    absorbable = (
        w is not None and b is not None and bool(consumers)
        and all(isinstance(u, g.MatmulOp) and _weight_root(u.rhs) and not _weight_root(u.lhs) for u in consumers)
    )
    if not absorbable:
        per += 0.0 if w is not None and bool(np.all(w == 1)) else 2 * c.binary("mul")
        per += 0.0 if b is not None and bool(np.all(b == 0)) else 2 * c.binary("add")
    c.add(op.name, vector=n * per)


_REDUCE_FN: dict[type[nn.ReduceOp], str] = {nn.SumOp: "sum", nn.MeanOp: "sum", nn.AmaxOp: "max", nn.AminOp: "min"}


def _reduce(c: _Counter, op: Operation) -> None:
    r = cast(nn.ReduceOp, op)
    vector = numel(r.input) * c.reduce(_REDUCE_FN[type(r)])
    if isinstance(r, nn.MeanOp):
        vector += numel(r.result) * c.binary("mul")
    c.add(op.name, vector=vector)


def _topk(c: _Counter, op: Operation) -> None:
    t = cast(gr.TopkIndicesOp, op)
    _, k, _ = t.params
    c.add(op.name, vector=numel(t.input) * math.ceil(math.log2(k + 1)) * c.reduce("max"))


def _cumsum(c: _Counter, op: Operation) -> None:
    c.add(op.name, vector=numel(op.results[0]) * c.binary("add"))


def _bincount(c: _Counter, op: Operation) -> None:
    c.add(op.name, vector=numel(cast(gr.BincountOp, op).input) * c.binary("eq"))


def _taps(size: int, out: int, k: int, s: int, p: int, d: int) -> int:
    """Window taps inside the input along one dim, summed over the outputs (padding is
    never read)."""
    return sum(1 for o in range(out) for t in range(k) if 0 <= o * s - p + t * d < size)


def _window_reads(x: SSAValue, out: SSAValue, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int],
                  d: tuple[int, int] = (1, 1)) -> int:
    """Elements a window reduction reads: directly (every tap of every output), or
    separably (rows, then columns of the row results), whichever reads fewer."""
    n, ch, hin, win = g.shape_of(x)
    _, _, hout, wout = g.shape_of(out)
    th, tw = _taps(hin, hout, k[0], s[0], p[0], d[0]), _taps(win, wout, k[1], s[1], p[1], d[1])
    return n * ch * min(th * tw, hin * tw + wout * th)


def _max_pool(c: _Counter, op: Operation) -> None:
    p = cast(nn.MaxPool2dOp, op)
    k, s, pad, d, _ = p.params
    c.add(op.name, vector=_window_reads(p.input, p.result, k, s, pad, d) * c.reduce("max"))


def _avg_pool(c: _Counter, op: Operation) -> None:
    p = cast(nn.AvgPool2dOp, op)
    k, s, pad, *_ = p.params
    reads = _window_reads(p.input, p.result, k, s, pad)
    c.add(op.name, vector=reads * c.reduce("sum") + numel(p.result) * c.binary("mul"))


def _adaptive_avg_pool(c: _Counter, op: Operation) -> None:
    p = cast(nn.AdaptiveAvgPool2dOp, op)
    n_in, n = numel(p.input), numel(p.result)
    c.add(op.name, vector=max(n_in, n) * c.reduce("sum") + n * c.binary("mul"))


def _dsl_call(c: _Counter, op: Operation) -> None:
    call = cast(DslCallOp, op)
    if c.dsl_call_work is None:
        raise CompileError(
            f"graph.dsl_call of kernel '{call.kernel.data}' at {g.source_loc(op)}: no dsl_call_work "
            "callback to count its intrinsic work (the roofline bound would miss it)"
        )
    w = c.dsl_call_work(call, c.cfg)
    c.add(op.name, macs=w.macs_16, macs_fp32=w.macs_fp32, vector=w.vector_element_cycles)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


@dataclass
class _Attention:
    scores: tuple[int, ...]  # the scores' shape [..., L, S]
    d_k: int
    d_v: int
    fp32_qk: bool
    fp32_pv: bool
    scale: float
    valid: np.ndarray | None  # bool, broadcasting to the scores' trailing dims; None: all


def _tril(L: int, S: int) -> np.ndarray:
    return np.tril(np.ones((L, S), dtype=bool))


def _additive_mask(c: _Counter, mask: SSAValue) -> np.ndarray | None:
    """The pairs an additive mask leaves (None: all, a run-time mask)."""
    m = c.const(mask)
    if m is None:
        return None
    dropped = masked(m, _dtype(mask))
    if not bool(np.any(m[~dropped] != 0)):  # a pure mask: no values a program must read
        _mask_sources(c, mask)
    return ~dropped


def _mask_sources(c: _Counter, v: SSAValue) -> None:
    """Record the ops computing a compile-time mask: a program builds the mask into the
    pairs it scores, so it need not read the mask's data."""
    c.mask_values.add(v)
    owner = v.owner
    if not isinstance(owner, Operation) or owner in c.mask_ops:
        return
    c.mask_ops.add(owner)
    for o in owner.operands:
        _mask_sources(c, o)


def _count_attention(c: _Counter, a: _Attention) -> None:
    shape = a.scores
    L, S = shape[-2], shape[-1]
    total = math.prod(shape)
    batch = total // (L * S)
    if a.valid is None:
        pairs = float(total)
    else:
        pairs = float(np.count_nonzero(a.valid)) * (total / a.valid.size)
    vector = pairs * (c.reduce("max") + c.unary("exp"))
    vector += batch * L * a.d_v * c.binary("mul")
    if a.scale != 1.0:
        vector += batch * min(L, S) * a.d_k * c.binary("mul")
    qk, pv = pairs * a.d_k, pairs * a.d_v
    c.add("attention", macs=(0.0 if a.fp32_qk else qk) + (0.0 if a.fp32_pv else pv),
          macs_fp32=(qk if a.fp32_qk else 0.0) + (pv if a.fp32_pv else 0.0), vector=vector)


def _sdpa(c: _Counter, op: Operation) -> None:
    s = cast(gi.SdpaOp, op)
    qs, ks, vs = g.shape_of(s.q), g.shape_of(s.k), g.shape_of(s.v)
    L, S = qs[-2], ks[-2]
    scores = (*g.shape_of(s.result)[:-2], L, S)
    valid = None if s.mask is None else _additive_mask(c, s.mask)
    if s.is_causal:
        valid = _tril(L, S) if valid is None else valid & _tril(L, S)
    fp32 = not all(_is16(v) for v in (s.q, s.k, s.v))
    _count_attention(c, _Attention(
        scores, qs[-1], vs[-1], fp32, fp32, s.scale.value.data, valid,
    ))


def _rope(c: _Counter, op: Operation) -> None:
    """What the decomposition costs: x * cos and rot * sin (one full input each, cos and
    sin broadcast; full when they are), the add of two full tensors, the half negated."""
    r = cast(grope.RopeOp, op)
    n = numel(r.result)
    mul = c.binary("mul")
    c.add(op.name, vector=n * (mul * _inputs(n, r.x, r.cos) + mul * _inputs(n, r.x, r.sin)
                               + 2 * c.binary("add")) + n / 2 * c.unary("neg"))


def _attention_chain(c: _Counter, sm: g.SoftmaxOp) -> set[Operation] | None:
    """The ops of an explicit attention around softmax `sm` (ir/graph_attention.py),
    counted as one attention; None when `sm` is not in one."""
    chain = match_attention(sm, c.const)
    if chain is None:
        return None
    valid: np.ndarray | None = None
    m = chain.mask
    if m is not None and m.kind == "add":
        valid = _additive_mask(c, m.value)
    elif m is not None:
        cond = c.const(m.value)
        if cond is not None:
            assert m.fill is not None
            _mask_sources(c, m.value)
            _mask_sources(c, m.fill)
            valid = (cond != 0) if m.keep_when else (cond == 0)
    qk, pv = chain.qk, chain.pv
    _count_attention(c, _Attention(
        g.shape_of(qk.result), g.shape_of(qk.lhs)[-1], g.shape_of(pv.result)[-1],
        not (_is16(qk.lhs) and _is16(qk.rhs)), not (_is16(pv.lhs) and _is16(pv.rhs)),
        chain.scale, valid,
    ))
    return chain.ops


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

_ZERO = "0: data movement (DMA patterns) or a compile-time value"
WORK_TABLE: dict[type[Operation], tuple[str, Handler]] = {
    **{t: ("n * cost(f)", _unary) for t in (*g.UNARY_OPS, gi.AbsOp, gi.LogOp, gi.ErfOp, g.GeluOp)},
    **{t: ("n * cost(f) * (2 if both operands are full tensors else 1)", _binary)
       for t in (*g.BINARY_OPS, gi.PowOp, gi.MinimumOp, *gi.COMPARE_OPS)},
    gi.WhereOp: ("n * cost(mask) * (2 if both branches are full tensors else 1)", _where),
    g.MatmulOp: ("MACs batch*M*K*N; a 16-bit result no vector op consumes: + n * cost(copy)", _matmul),
    nn.Conv2dOp: ("MACs N*Cout*Hout*Wout*(Cin/groups)*kh*kw; bias: + n * cost(add)", _conv),
    g.SoftmaxOp: ("n * (max-reduce + sub + exp + sum-reduce + mul)", _softmax),
    gi.LogSoftmaxOp: ("n * (max-reduce + sub + exp + sum-reduce + sub)", _log_softmax),
    g.LayerNormOp: ("n * (sum-reduce + sub + square + sum-reduce + mul) + an affine no matmul absorbs",
                    _layer_norm),
    g.RmsNormOp: ("n * (square + sum-reduce + mul) + the weight mul unless all ones or folded into the matmuls "
                  "it feeds", _rms_norm),
    **{t: ("n_in * cost(reduce); mean + n * cost(mul)", _reduce) for t in nn.REDUCE_OPS},
    nn.MaxPool2dOp: ("min(direct, separable) window reads * cost(reduce max)", _max_pool),
    nn.AvgPool2dOp: ("min(direct, separable) window reads * cost(reduce sum) + n * cost(mul)", _avg_pool),
    nn.AdaptiveAvgPool2dOp: ("max(n_in, n) * cost(reduce sum) + n * cost(mul)", _adaptive_avg_pool),
    gr.TopkIndicesOp: ("rows * C * ceil(log2(k + 1)) * cost(reduce max)", _topk),
    gr.BincountOp: ("n_in * cost(eq)", _bincount),
    gr.CumsumOp: ("n * cost(add)", _cumsum),
    gi.SdpaOp: ("attention: (d_k + d_v) MACs, max-reduce and exp per unmasked pair", _sdpa),
    grope.RopeOp: ("n * (2 * cost(mul) + 2 * cost(add)) + n/2 * cost(neg), as decomposed", _rope),
    DslCallOp: ("the kernel's own work (dsl_call_work)", _dsl_call),
    **{t: (_ZERO, _zero) for t in (
        g.WeightOp, g.ConstantOp, g.PermuteOp, g.ReshapeOp, g.ExpandOp, g.CastOp, gi.SliceOp,
        gi.ConcatOp, gi.GatherRowsOp, nn.PadOp, nn.UpsampleNearest2dOp, gs.AsStridedOp,
    )},
    gs.IndexScatterOp: ("none: 0; a reduction: n_src * cost(f) * 2", _index_scatter),
}

# ops whose rule has a vector pass reading its operands (they can read the accumulator)
_VECTOR_READERS = tuple(
    t for t, (_, h) in WORK_TABLE.items()
    if h in (_unary, _binary, _where, _softmax, _log_softmax, _layer_norm, _rms_norm, _reduce, _max_pool, _avg_pool,
             _adaptive_avg_pool)
)


def graph_work(gp: g.GraphProgram, cfg: HardwareConfig, dsl_call_work: DslCallWork | None = None) -> IntrinsicWork:
    """The intrinsic work of `gp` on `cfg` (see the module docstring): a pure function of
    the imported graph, its shapes and element types and the config's op costs."""
    return _Counter(gp, cfg, dsl_call_work).run()
