"""Transposes on the matrix engine: ``x^T = x^T @ I`` into the accumulator, then a copy
back to SRAM (which scales on the way for ``transpose(x) * c``).

- A slice taller than the array is transposed in blocks, side by side; a tall slice of
  whole rows is loaded interleaved (g rows per partition, one DMA per g array heights)
  and its transposing matmuls multiply by resident selection matrices that undo the
  interleave.
- Transposes in unrolled bodies are shared (a shorter slice from the same start reuses
  the leading columns of a longer one).
- The accumulator scratch is a dead acc tile of the kernel where there is one.

    t = transpose(load(x[r, :])) * 2.0
    -->
    tile.load %x[%r0, %c0] into %x_s sizes(%c16, %c8) ...
    tile.matmul %x_s, %identity into %tr sizes(%c8, %c16, %c16) accumulate(%false)
    tile.scalar "mul" %tr, 2.0 into %xT sizes(%c8, %c16)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeGuard

import numpy as np
from xdsl.ir import SSAValue

from tilecc.errors import DslMatmulError, DslTypeError
from tilecc.frontend.dsl import ast as A
from tilecc.frontend.dsl.lower import constants, expressions, tiles
from tilecc.frontend.dsl.lower.analysis import dead_after, reads_of
from tilecc.frontend.dsl.lower.values import BIN, FLOATS, INTERLEAVE_MAX, ITEM, Lazy, Value
from tilecc.ir import tile
from tilecc.simulator.timing import TimingRules

if TYPE_CHECKING:
    from tilecc.frontend.dsl.lower.kernel import KernelLowering


def scaled_transpose(lw: KernelLowering, e: A.BinOp, dest: Value | None) -> Value | None:
    """``transpose(x) * c`` (or ``/ c``, c a number): the copy that brings the
    transpose back from the accumulator scales it on the way (one vector op, not two).
    A shared transpose (a static slice in an unrolled loop) is shared with its scale."""
    fn = BIN.get(e.op)
    if fn not in ("mul", "div"):
        return None
    def is_t(x: A.Expr) -> TypeGuard[A.Call]:
        return isinstance(x, A.Call) and x.fn == "transpose" and len(x.args) == 1 and not x.kwargs
    if is_t(e.lhs):
        t, other = e.lhs, e.rhs
    elif fn == "mul" and is_t(e.rhs):
        t, other = e.rhs, e.lhs
    else:
        return None
    if not expressions.is_numeric(lw, other):
        return None
    c = expressions.ev(lw, other)
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        return None
    v = expressions.ev(lw, t.args[0])
    if dest is not None:
        out = expressions.binop(lw, fn, transpose(lw, v, t, None), c, e.pos, e, dest=dest)
        if not isinstance(out, Value):
            raise lw.err(DslTypeError, e.pos, "a scaled transpose must give a tile")
        return out
    lw.evac_scale = (fn, float(c))
    try:
        out = transpose(lw, v, t, None)
    finally:
        lw.evac_scale = None
    lw.tally.binary(fn, out.rows * out.cols, 1)  # the scale, by a number
    return out


def cse_prefix(lw: KernelLowering, key: tuple, v: Lazy) -> Value | None:
    """The transpose of a slice that starts where an already transposed, longer slice
    of the same tensor starts: the leading columns of that one (a causal key block
    cut at the diagonal reuses the whole block's K^T)."""
    rows, cols = key[4]
    for k, val in lw.cse_values.items():
        if (len(k) == len(key) and k[:4] == key[:4] and k[6:] == key[6:] and k[4][1] == cols
                and k[4][0] > rows and val.cols == k[4][0]):
            return Value(val.buf, val.dtype, val.space, val.shape, val.rows, rows, v.pos)
    return None


def transpose(lw: KernelLowering, v: object, node: A.Node, dest: Value | None) -> Value:
    """x^T on the matrix engine (``x^T @ I`` into the accumulator, then a copy back to
    SRAM in x's dtype); a lazily loaded slice taller than the array is loaded and
    transposed in blocks of the array's size, side by side."""
    n0 = min(lw.cfg.matrix.rows, lw.cfg.matrix.cols, lw.cfg.sram.partitions)
    shared = v if isinstance(v, Lazy) and dest is None else None
    key = tiles.cse_key(lw, shared, "T", None) if shared is not None else None
    if key is not None and lw.evac_scale is not None:
        key += (lw.evac_scale,)
    if shared is not None and key is not None and key not in lw.cse_values:
        prefix = cse_prefix(lw, key, shared)
        if prefix is not None:
            return prefix
    if shared is not None and key is not None:
        if key not in lw.cse_values:
            saved, lw.slot = lw.slot, ()
            lw.cse, was = False, lw.cse
            try:
                lw.scratch_turn = (lw.scratch_turn + 1) % lw.scratch_buffers
                lw.cse_values[key] = transpose(lw, shared, tiles.cse_node(lw, key, shared.pos), None)
            finally:
                lw.cse, lw.slot = was, saved
        return lw.cse_values[key]
    if isinstance(v, Lazy) and not v.is_row and v.shape[0] > n0:
        fast = interleaved_transpose(lw, v, node, n0)
        if fast is not None:
            return fast
        blocks = [tiles.materialise(lw, tiles.sub_lazy(lw, v, r0, min(n0, v.shape[0] - r0),
                                                       min(n0, v.actual[0] - r0), i), node)
                  for i, r0 in enumerate(range(0, v.shape[0], n0)) if r0 < v.actual[0]]
        return transpose_blocks(lw, blocks, node, total=v.shape[0])[0]
    x = tiles.materialise(lw, v, node)
    if x.space == tile.ACC:
        x = expressions.cast(lw, x, "bf16", node)
    return transpose_blocks(lw, [x], node, dest=dest)[0]


def interleaved_transpose(lw: KernelLowering, v: Lazy, node: A.Node, n0: int) -> Value | None:
    """The transpose of a tall slice of whole rows ([c*g*n0 x D]) with one DMA per g*n0
    rows: partition p receives rows g*p .. g*p + g-1 (g*D contiguous elements: long
    DMA chunks, one transfer instead of g), and the transposing matmuls undo the
    interleave: fold f of x^T is sum_i L[f*n0/g .., i*D ..]^T @ E_i, with E_i the
    [n0/g x n0] selection E_i[q, c] = (c == g*q + i), so g matmuls of n0/g contraction
    rows per fold instead of one of n0 (the matrix engine's extra work buys the DMAs).
    g is the smallest that makes a chunk at least the DMA's saturating payload
    (`TimingRules.dma_saturating_chunk`)."""
    if len(v.kept) != 2 or v.cast_to is not None or not isinstance(v.indices[v.kept[0]], int):
        return None
    if v.param not in lw.tensors or v.dtype not in FLOATS:
        return None
    dims = lw.dims(lw.tensors[v.param][1])
    rd, cd = v.kept
    row0 = v.indices[rd]
    if not isinstance(row0, int):  # checked above; narrows the type
        return None
    R, D = v.shape
    if (rd, cd) != (len(dims) - 2, len(dims) - 1) or v.sizes != [R, D] or D != dims[cd] or D > n0 or R % n0:
        return None
    row_bytes = D * ITEM[v.dtype]
    g = min(R // n0, INTERLEAVE_MAX, math.ceil(TimingRules(lw.cfg).dma_saturating_chunk() / row_bytes))
    if g < 2 or n0 % g or (R // n0) % g:
        return None
    dtype, kq, chunks = v.dtype, n0 // g, R // (g * n0)
    raws = []  # a buffer per DMA: the transfers do not wait for each other
    for ch in range(chunks):
        idx = list(v.indices)
        idx[rd] = row0 + ch * g * n0
        raws.append(lw.buffer(tiles.cse_node(lw, ("interleaved", id(node), ch), node.pos), (n0, g * D), dtype,
                              tile.SRAM, v.param))
        lw.add(tile.LoadOp(v.tensor, [lw.idx(i) for i in idx], raws[-1], lw.idx(n0), lw.idx(g * D),
                           rd, cd, row_step=g))
    sel = np.zeros((kq, g * n0), dtype=np.float32)
    for i in range(g):
        sel[np.arange(kq), i * n0 + g * np.arange(kq) + i] = 1.0
    sbuf = constants.resident(lw, ("select", g, n0, dtype), lw.const_tensor(sel, dtype), [0, 0], sel.shape, dtype,
                              "select", (0, 1))
    tbuf = transpose_scratch(lw, node, (D, R))
    for f in range(R // n0):
        ch, fl = divmod(f, g)
        out = lw.add(tile.SubviewOp(tbuf, lw.idx(0), lw.idx(f * n0), [D, n0])).results[0]
        for i in range(g):
            lhsT = lw.add(tile.SubviewOp(raws[ch], lw.idx(fl * kq), lw.idx(i * D), [kq, D])).results[0]
            rhs = lw.add(tile.SubviewOp(sbuf, lw.idx(0), lw.idx(i * n0), [kq, n0])).results[0]
            lw.add(tile.MatmulOp(lhsT, rhs, out, lw.idx(D), lw.idx(kq), lw.idx(n0), lw.flag(i > 0)))
    res = Value(lw.buffer(node, (D, R), dtype, tile.SRAM, "xT"), dtype, tile.SRAM, (D, R), D, R, node.pos)
    copy_back(lw, tbuf, res.buf, D, R)
    return res


def transpose_scratch(lw: KernelLowering, node: A.Node, shape: tuple[int, int]) -> SSAValue:
    """The accumulator scratch of a transpose: a dead acc tile (`dead_acc_tile`), else a
    buffer of the transpose's own (shared transposes share alternating scratch)."""
    dead = dead_acc_tile(lw, shape) if lw.stmt_stack else None
    if dead is not None:
        return dead.buf
    scratch = node
    if not lw.cse and node in lw.cse_node_of.values():  # a shared tile: shared scratch
        scratch = tiles.cse_node(lw, ("scratch", lw.scratch_turn), node.pos)
    return lw.buffer(scratch, shape, "f32", tile.ACC, "tr")


def copy_back(lw: KernelLowering, src: SSAValue, dst: SSAValue, rows: int, cols: int) -> None:
    """A transpose's copy from the accumulator to SRAM; `transpose(x) * c` scales it on
    the way (`evac_scale`)."""
    if lw.evac_scale is not None:
        lw.add(tile.ScalarOp(lw.evac_scale[0], src, lw.evac_scale[1], dst, lw.idx(rows), lw.idx(cols)))
    else:
        lw.add(tile.UnaryOp("copy", src, dst, lw.idx(rows), lw.idx(cols)))


def transpose_blocks(lw: KernelLowering, blocks: list[Value], node: A.Node, split: bool = False,
                     dest: Value | None = None, total: int | None = None) -> list[Value]:
    """Blocks [r_b x c] -> one SRAM tile [c x sum r_b] holding each block's transpose
    side by side: ``[that tile]`` or, with `split`, the block transposes (windows)."""
    R, C = lw.cfg.matrix.rows, lw.cfg.matrix.cols
    accp = lw.cfg.accumulator.partitions
    dtype = blocks[0].dtype
    c_static = max(b.shape[1] for b in blocks)
    for b in blocks:
        if b.shape[0] > min(R, C) or b.shape[1] > accp or b.dtype not in FLOATS:
            raise lw.err(DslMatmulError, node.pos, f"transpose of a [{b.shape[0]} x {b.shape[1]}] tile needs at "
                         f"most {min(R, C)} rows and {accp} columns on target '{lw.target}'")
    total = max(total or 0, sum(b.shape[0] for b in blocks))  # static: the same buffer at every edge
    tbuf = transpose_scratch(lw, node, (c_static, total))
    offs, off = [], 0
    for b in blocks:
        ibuf = constants.identity(lw, b.shape[0], dtype)
        out = tbuf
        if len(blocks) > 1:
            out = lw.add(tile.SubviewOp(tbuf, lw.idx(0), lw.idx(off), [c_static, b.shape[0]])).results[0]
        lw.add(tile.MatmulOp(b.buf, ibuf, out, lw.idx(b.cols), lw.idx(b.rows), lw.idx(b.rows),
                             lw.flag(False)))
        offs.append(off)
        off += b.shape[0]
    width = offs[-1] + blocks[-1].rows
    shape = (c_static, total)
    if dest is not None:
        res = expressions.out_buf(lw, node, dtype, (blocks[0].cols, width), shape, dest, node.pos)
    else:
        res = Value(lw.buffer(node, shape, dtype, tile.SRAM, "xT"), dtype, tile.SRAM, shape,
                    blocks[0].cols, width, node.pos)
    # one copy per contiguous run of blocks with the same row count
    groups: list[list[int]] = []
    for i, b in enumerate(blocks):
        prev = blocks[groups[-1][-1]] if groups else None
        # a run is contiguous: every block before the last fills its static width
        if prev is not None and blocks[groups[-1][0]].cols == b.cols and prev.rows == prev.shape[0]:
            groups[-1].append(i)
        else:
            groups.append([i])
    for grp in groups:
        c0, rows = offs[grp[0]], blocks[grp[0]].cols
        w = offs[grp[-1]] + blocks[grp[-1]].rows - c0
        src, dst = tbuf, res.buf
        if len(groups) > 1:
            src = lw.add(tile.SubviewOp(tbuf, lw.idx(0), lw.idx(c0), [c_static, w])).results[0]
            dst = lw.add(tile.SubviewOp(res.buf, lw.idx(0), lw.idx(c0), [c_static, w])).results[0]
        copy_back(lw, src, dst, rows, w)
    if not split:
        return [res]
    return [Value(lw.add(tile.SubviewOp(res.buf, lw.idx(0), lw.idx(o), [c_static, b.shape[0]])).results[0],
                  dtype, tile.SRAM, (c_static, b.shape[0]), b.cols, b.rows, node.pos)
            for o, b in zip(offs, blocks)]


def dead_acc_tile(lw: KernelLowering, shape: tuple[int, int]) -> Value | None:
    """An f32 accumulator tile of at least static `shape` (its leading window when
    larger), bound to a name in scope, whose value is dead here: the current statement
    does not read it and no later statement does before overwriting it
    (`dead_after`). Transposes use it as their scratch, so a kernel's score tile
    doubles as the scratch of P's transposes (and of K's). Preferred: a tile the
    statement does not itself assign (using that one would make the transposes wait
    for its last reader), then one of exactly `shape`."""
    body, i = lw.stmt_stack[-1]
    cur = body[i]
    reads = reads_of(cur)
    visible: dict[str, object] = {}
    for scope in lw.scopes:  # inner bindings shadow outer ones
        visible.update(scope)
    best: tuple[tuple[bool, bool], Value] | None = None
    for name, v in visible.items():
        if not (isinstance(v, Value) and v.space == tile.ACC and v.dtype == "f32"
                and v.shape[0] >= shape[0] and v.shape[1] >= shape[1]):
            continue
        if v.zero or name in reads:
            continue
        target = isinstance(cur, A.Assign) and cur.target == name
        # this statement overwrites it (after its operands, scratch included), or
        # nothing reads it again before it is overwritten
        if not (target or dead_after(name, lw.stmt_stack)):
            continue
        rank = (target, v.shape != shape)
        if best is None or rank < best[0]:
            best = (rank, v)
    if best is None:
        return None
    v = best[1]
    if v.shape == shape:
        return v
    sub = lw.add(tile.SubviewOp(v.buf, lw.idx(0), lw.idx(0), list(shape))).results[0]
    return Value(sub, v.dtype, v.space, shape, shape[0], shape[1], v.pos)
