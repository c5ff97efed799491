"""fold-norm-affine: a layer norm's scale and shift folded into the linear layer it feeds (and
fold-norm-weight: an RMS norm's weight into the linear layers it feeds).

``layer_norm(x, g, b) @ W + c`` equals ``layer_norm(x, 1, 0) @ (g[:, None] * W) + (b @ W + c)``
when g, b, W (and c) are weights: the new weight and bias are computed once, at compile
time (fp32, rounded to the weights' type when laid out), and the normalisation loses
two vector passes over its rows (the per-element multiply and add, and their
broadcast operand loads). Applies when the layer norm (over the last dim) is used only
by the matmul's A operand (through reshapes that keep the last dim) and B
is a 2-D weight; a bias add on the matmul's result (its only user, a weight of N
elements) absorbs the shift, otherwise one is added.

Before::

    %n = graph.layer_norm %x, %g, %b normalized_ndim 1 eps 1e-05 : ...
    %m = graph.matmul %n, %W : tensor<512x768xbf16>, tensor<768x2304xbf16> -> ...
    %y = graph.add %m, %c : ...

After::

    %one = graph.constant dense<1.0> : tensor<768xbf16>
    %zero = graph.constant dense<0.0> : tensor<768xbf16>
    %n = graph.layer_norm %x, %one, %zero normalized_ndim 1 eps 1e-05 : ...
    %W2 = graph.weight "W.norm_folded" : tensor<768x2304xbf16>
    %m = graph.matmul %n, %W2 : ...
    %c2 = graph.weight "c.norm_folded" : tensor<2304xbf16>
    %y = graph.add %m, %c2 : ...

It needs the weights' data, so it runs on a `GraphProgram` (in `compile_graph` at -O2),
not as a module pass; splat constants are immediates in the lowering, so the layer
norm kernel skips the multiply by one and the add of zero.

fold-norm-weight (`fold_norm_weights`) does the same for an RMS norm's weight once
canonicalize-graph has made the `graph.rms_norm` of it, inside the pipeline on the
compile's own weights (before merge-linears, which then concatenates the folded ones):
``(n * w) @ W_i = n @ (w[:, None] * W_i)`` for every reader, so it applies when every
reader of the norm (through reshapes that keep its rows) is a matmul's A operand whose
B is a 2-D float weight (a quantised weight keeps its scale elsewhere; Gemma's ``1 + w``
is not a weight) that nothing else reads. Llama's norm feeds q/k/v and gate/up: at
the 1B shape a prefill of 2,048 tokens loses one 2-input vector pass over every row
block of both norms (the fused matmul's prologue, `rowwise.rms_norm_nodes` drops the
multiply by a weight of ones). Before::

    %n = graph.rms_norm %x, %g eps 1e-05 cast_before_weight : tensor<40x64xbf16>, tensor<64xbf16> -> ...
    %wg = graph.weight "gate.weight.permute" : tensor<64x96xbf16>
    %a = graph.matmul %n, %wg : ...
    %wu = graph.weight "up.weight.permute" : tensor<64x96xbf16>
    %b = graph.matmul %n, %wu : ...

After::

    %one = graph.constant dense<1.0> : tensor<64xbf16>
    %n = graph.rms_norm %x, %one eps 1e-05 cast_before_weight : ...
    %wg2 = graph.weight "gate.weight.permute.norm_folded" : tensor<64x96xbf16>
    %a = graph.matmul %n, %wg2 : ...
    %wu2 = graph.weight "up.weight.permute.norm_folded" : tensor<64x96xbf16>
    %b = graph.matmul %n, %wu2 : ...
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir.bf16_weights import Bf16Weight
from tilecc.ir.dtypes import DType
from tilecc.ir.meta_weights import MetaWeight
from tilecc.passes import remarks
from tilecc.passes.graph.canonicalize import dead_code
from tilecc.simulator.numerics import f32_to_bf16_bits

PASS_RMS = "fold-norm-weight"


def _weight(v: SSAValue) -> g.WeightOp | None:
    op = v.owner
    return op if isinstance(op, g.WeightOp) else None


def _squeezed(v: SSAValue) -> tuple[int, ...]:
    return tuple(int(d) for d in g.shape_of(v) if d != 1)


def _keeps_rows(op: Operation) -> bool:
    from tilecc.passes.graph.fuse import keeps_rows

    return keeps_rows(op)


def _only_user(v: SSAValue) -> Operation | None:
    return v.get_user_of_unique_use() if v.has_one_use() else None


def fold_norm_affine(module: ModuleOp, weights: dict[str, np.ndarray]) -> int:
    """Rewrite every foldable layer norm of `module` in place; new weights go into
    `weights`. Returns the number folded."""
    count = 0
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        for ln in [op for op in fn.body.block.ops if isinstance(op, g.LayerNormOp)]:
            if _fold(fn, ln, weights):
                count += 1
        if count:
            dead_code(fn)
    return count


def _fold(fn: func.FuncOp, ln: g.LayerNormOp, weights: dict[str, np.ndarray]) -> bool:
    if ln.normalized_ndim.value.data != 1:
        return False
    x, gw, bw = ln.operands
    gop, bop = _weight(gw), _weight(bw)
    if gop is None or bop is None:
        return False
    v = ln.results[0]
    user = _only_user(v)
    while isinstance(user, g.ReshapeOp) and _keeps_rows(user):
        v = user.results[0]
        user = _only_user(v)
    if not isinstance(user, g.MatmulOp) or user.operands[0] is not v:
        return False
    wop = _weight(user.operands[1])
    if wop is None or len(g.shape_of(wop.result)) != 2:
        return False
    # weights without values (a meta-device model) fold alike: the new ones have none either
    meta = any(isinstance(weights[o.weight], MetaWeight) for o in (gop, bop, wop))
    gamma = _values(weights[gop.weight]).reshape(-1)
    beta = _values(weights[bop.weight]).reshape(-1)
    wsrc = weights[wop.weight]
    K, N = (int(d) for d in wsrc.shape)
    if K != gamma.size:
        return False
    mm = user
    res = mm.results[0]
    add = _only_user(res)
    cop = None
    if isinstance(add, g.AddOp):
        other = add.operands[1] if add.operands[0] is res else add.operands[0]
        cop = _weight(other)
        if cop is None or _squeezed(other) != (N,) or add.results[0].type != res.type:
            cop = None
    meta = meta or (cop is not None and isinstance(weights[cop.weight], MetaWeight))
    folded, shift = (None, np.zeros(N)) if meta else _fold_rows(wsrc, gamma, beta)
    loc = g.source_loc(ln)
    block = fn.body.block
    et = gop.result.type.element_type  # gw is gop's result
    one = g.ConstantOp.make(np.ones(gamma.size, dtype=np.float32), et, loc=loc)
    zero = g.ConstantOp.make(np.zeros(gamma.size, dtype=np.float32), et, loc=loc)
    block.insert_op_before(one, ln)
    block.insert_op_before(zero, ln)
    ln.operands[1] = one.results[0]
    ln.operands[2] = zero.results[0]
    wname = _fresh(weights, f"{wop.weight}.norm_folded")
    weights[wname] = MetaWeight((K, N), np.dtype(np.float32)) if folded is None else folded  # pyright: ignore[reportArgumentType]
    new_w = g.WeightOp.make(wname, wop.result.type, loc=g.source_loc(mm))  # mm's operand 1 is wop's result
    block.insert_op_before(new_w, mm)
    mm.operands[1] = new_w.results[0]
    if cop is not None and isinstance(add, g.AddOp):  # cop is only set where add is an AddOp
        c = _values(weights[cop.weight]).reshape(-1)
        cname = _fresh(weights, f"{cop.weight}.norm_folded")
        cshape = tuple(weights[cop.weight].shape)
        weights[cname] = (MetaWeight(cshape, np.dtype(np.float32)) if meta  # pyright: ignore[reportArgumentType]
                          else (c + shift).astype(np.float32).reshape(cshape))
        new_c = g.WeightOp.make(cname, cop.result.type, loc=g.source_loc(add))
        block.insert_op_before(new_c, add)
        idx = 1 if add.operands[1] is cop.results[0] else 0
        add.operands[idx] = new_c.results[0]
    else:
        cname = _fresh(weights, f"{wop.weight}.norm_shift")
        weights[cname] = MetaWeight(shift.shape, np.dtype(np.float32)) if meta else shift.astype(np.float32)  # pyright: ignore[reportArgumentType]
        new_c = g.WeightOp.make(cname, g.tensor_type([N], g.element_dtype(res.type)), loc=g.source_loc(mm))
        after = g.AddOp.make(res, new_c.results[0], loc=g.source_loc(mm))
        block.insert_op_after(new_c, mm)
        block.insert_op_after(after, new_c)
        res.replace_all_uses_with(after.results[0])
        after.operands[0] = res  # the add itself keeps the matmul's result
    return True


def fold_norm_weights(module: ModuleOp, weights: MutableMapping[str, Any]) -> int:
    """fold-norm-weight: every RMS norm whose weight every reader multiplies into a linear
    layer's weight has it folded there (see the module docstring); new weights go into
    `weights`. Returns the number of norms folded."""
    count = 0
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        folded = 0
        for rn in [op for op in fn.body.block.ops if isinstance(op, g.RmsNormOp)]:
            folded += _fold_rms(fn, rn, weights)
        if folded:
            dead_code(fn)
        count += folded
    return count


def _matmul_readers(v: SSAValue) -> list[g.MatmulOp] | None:
    """The matmuls reading `v` as their A operand (through reshapes that keep its rows),
    or None where anything else reads it."""
    out: list[g.MatmulOp] = []
    stack = [v]
    while stack:
        x = stack.pop()
        for use in x.uses:
            u = use.operation
            if isinstance(u, g.ReshapeOp) and _keeps_rows(u):
                stack.append(u.results[0])
            elif isinstance(u, g.MatmulOp) and use.index == 0 and u.operands[1] is not x:
                out.append(u)
            else:
                return None
    return out


def _float_weight(op: g.WeightOp) -> bool:
    """A weight whose values a fold may scale: of a float type in the graph (fp32 / bf16 /
    fp16), not a one-byte quantised one (its scale lives elsewhere). The graph type
    decides, not the storage, so a meta-device model folds exactly where the same model
    with its weights does."""
    return g.element_dtype(op.result.type) in (DType.F32, DType.BF16, DType.F16)


def _fold_rms(fn: func.FuncOp, rn: g.RmsNormOp, weights: MutableMapping[str, Any]) -> bool:
    gop = _weight(rn.weight)
    if gop is None or not _float_weight(gop):
        return False
    C = g.shape_of(rn.result)[-1]
    readers = _matmul_readers(rn.result)
    if not readers:
        return False
    wops = [_weight(mm.operands[1]) for mm in readers]
    if any(w is None or len(g.shape_of(w.result)) != 2 or g.shape_of(w.result)[0] != C
           or not _float_weight(w) for w in wops):
        return False
    # a weight something else also reads (a tied embedding's gather) would be stored twice
    mine = set(readers)
    names = {w.weight for w in wops if w is not None}
    for op in fn.body.block.ops:
        if isinstance(op, g.WeightOp) and op.weight in names and any(
                use.operation not in mine for use in op.results[0].uses):
            remarks.emit(PASS_RMS, "missed", f"rms norm weight not folded: weight {op.weight} is also read by "
                         "another op (folding would store it twice)", g.source_loc(rn))
            return False
    meta = isinstance(weights[gop.weight], MetaWeight)
    gamma = _values(weights[gop.weight]).reshape(-1)
    block = fn.body.block
    for mm, wop in zip(readers, wops):
        assert wop is not None
        wsrc = weights[wop.weight]
        wname = _fresh(weights, f"{wop.weight}.norm_folded")
        if meta or isinstance(wsrc, MetaWeight):
            weights[wname] = MetaWeight(tuple(wsrc.shape), np.dtype(np.float32))
        else:
            weights[wname] = _fold_rows(wsrc, gamma, np.zeros(C))[0]
        new_w = g.WeightOp.make(wname, wop.result.type, loc=g.source_loc(mm))
        block.insert_op_before(new_w, mm)
        mm.operands[1] = new_w.results[0]
    et = gop.result.type.element_type  # rn.weight is gop's result
    one = g.ConstantOp.make(np.ones(C, dtype=np.float32), et, loc=g.source_loc(rn))
    block.insert_op_before(one, rn)
    rn.operands[1] = one.results[0]
    remarks.emit(PASS_RMS, "passed", f"rms norm weight folded into {len(readers)} matmul weight"
                 f"{'s' if len(readers) > 1 else ''}: the norm's weight multiply is gone", g.source_loc(rn))
    return True


def _fold_rows(w: np.ndarray | Bf16Weight, gamma: np.ndarray, beta: np.ndarray,
               rows: int = 64) -> tuple[np.ndarray | Bf16Weight, np.ndarray]:
    """(``gamma[:, None] * w``, ``beta @ w`` in float64), `rows` rows of w at a time, so
    no whole-size float32 or float64 copy of a vocabulary-sized w is made. A bf16 weight
    (`Bf16Weight`) folds to a bf16 one: the packager would round the folded values to
    its bf16 HBM tensor anyway."""
    K, N = w.shape
    b = beta.astype(np.float64)
    shift = np.zeros(N, dtype=np.float64)
    bf16 = isinstance(w, Bf16Weight)
    out = np.empty((K, N), dtype=np.uint16 if bf16 else np.float32)
    for r0 in range(0, K, rows):
        blk = np.asarray(w[r0:r0 + rows], dtype=np.float32)
        shift += b[r0:r0 + rows] @ blk.astype(np.float64)
        scaled = gamma[r0:r0 + rows, None] * blk
        out[r0:r0 + rows] = f32_to_bf16_bits(scaled) if bf16 else scaled
    return (Bf16Weight(out) if bf16 else out), shift


def _values(w: np.ndarray | MetaWeight) -> np.ndarray:
    """A weight's values in fp32; zeros of its shape (not allocated) for a `MetaWeight`,
    whose results are replaced by `MetaWeight`s."""
    if isinstance(w, MetaWeight):
        return np.broadcast_to(np.float32(0), w.shape)
    return np.asarray(w, dtype=np.float32)


def _fresh(weights: Mapping[str, Any], name: str) -> str:
    base, i = name, 1
    while name in weights:
        name, i = f"{base}.{i}", i + 1
    return name


__all__ = ["fold_norm_affine", "fold_norm_weights"]
