"""Footprints: the memory each instruction of a stream reads and writes, for the sanitisers.

On-chip operands (`DecodedProgram.on_chip_operands`) are rectangles ``[part, part +
rows) x [addr, addr + cols * itemsize)`` (matmul lhsT K x M, rhs K x N, output M x N; a
REDUCE output, a B_COLUMN operand and a gather's index column are rows x 1; a matmul
with ACCUMULATE also reads its output). HBM operands have a bounding byte range
(`hbm_bounding`), a run pattern (`hbm_runs`: `count` runs of `width` bytes, `pitch`
bytes apart, from the bounding range's start; exact where a dimension is contiguous, a
superset otherwise) that `runs_meet` tests exactly against another in O(1), and, exactly,
a set of contiguous byte intervals (`hbm_intervals`). A DMA_GATHER's rows depend on its
index data, so it counts as reading its whole table (k rows); a DMA_SCATTER likewise
counts as writing its whole table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tilecc.simulator.decode import DecodedProgram
from tilecc.simulator.isa import ITEMSIZE, DType, Flag, Mem, Opcode

__all__ = [
    "SLOTS",
    "Footprints",
    "hbm_bounding",
    "hbm_intervals",
    "hbm_runs",
    "on_chip_footprints",
    "range_text",
    "runs_meet",
    "where_text",
]

SLOTS = ("a", "b", "o")
_ITEMSIZE = np.zeros(256, dtype=np.int64)
for _d in DType:
    _ITEMSIZE[int(_d)] = ITEMSIZE[_d]
_MAX_RUNS_PER_PAIR = 4096  # `runs_meet` with two pitches: more runs count as meeting
_MEM_NAME = {int(Mem.HBM): "HBM", int(Mem.SRAM): "SRAM", int(Mem.ACC): "ACC"}


def range_text(lo: int, hi: int) -> str:
    """'[0x40, 0x80)'."""
    return f"[{lo:#x}, {hi:#x})"


def where_text(mem: int, p0: int, p1: int, b0: int, b1: int) -> str:
    """'SRAM partitions [0, 16) bytes [0x40, 0x80)' (HBM: its byte range)."""
    if mem == Mem.HBM:
        return f"HBM bytes {range_text(b0, b1)}"
    return f"{_MEM_NAME[mem]} partitions [{p0}, {p1}) bytes {range_text(b0, b1)}"


@dataclass
class Footprints:
    """One row per operand access: instruction, slot (0 a, 1 b, 2 o), memory, the
    rectangle [p0, p1) x [b0, b1) (HBM: partition 0, an exact byte interval, several
    rows per operand), and whether it writes."""

    instr: np.ndarray
    slot: np.ndarray
    mem: np.ndarray
    p0: np.ndarray
    p1: np.ndarray
    b0: np.ndarray
    b1: np.ndarray
    write: np.ndarray

    FIELDS: ClassVar[tuple[str, ...]] = ("instr", "slot", "mem", "p0", "p1", "b0", "b1", "write")

    @staticmethod
    def concat(parts: list[Footprints]) -> Footprints:
        return Footprints(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in Footprints.FIELDS)
        )

    def take(self, idx: np.ndarray) -> Footprints:
        return Footprints(*(getattr(self, f)[idx] for f in Footprints.FIELDS))

    def __len__(self) -> int:
        return len(self.instr)


def on_chip_footprints(prog: DecodedProgram) -> Footprints:
    """Every on-chip operand access (an accumulating matmul also reads its output)."""
    s = prog.col
    parts: list[Footprints] = []
    acc_read = prog.is_mm & ((prog.flags & Flag.ACCUMULATE) != 0)
    for slot_i, (slot, mask, nrows, ncols) in enumerate(prog.on_chip_operands()):
        uses = [(mask, slot == "o")]
        if slot == "o":
            uses.append((acc_read, False))
        for m, write in uses:
            idx = np.flatnonzero(m)
            p0 = s[f"{slot}_part"][idx].astype(np.int64)
            b0 = s[f"{slot}_addr"][idx].astype(np.int64)
            nbytes = ncols[idx] * _ITEMSIZE[s[f"{slot}_dtype"][idx]]
            parts.append(
                Footprints(
                    instr=idx,
                    slot=np.full(idx.size, slot_i, dtype=np.int64),
                    mem=s[f"{slot}_mem"][idx].astype(np.int64),
                    p0=p0,
                    p1=p0 + nrows[idx],
                    b0=b0,
                    b1=b0 + nbytes,
                    write=np.full(idx.size, write),
                )
            )
    return Footprints.concat(parts)


def _hbm_shape(prog: DecodedProgram, idx: np.ndarray) -> tuple[np.ndarray, ...]:
    """(rows, cols, row stride, column stride) in elements of the HBM operands of
    instructions `idx`. A DMA_GATHER may read any row of its table, so its footprint is
    the whole table (k rows of `cols` contiguous elements)."""
    s = prog.col
    gather = prog.is_indirect[idx]
    rows = np.where(gather, prog.k[idx], prog.rows[idx])
    cs = np.where(gather, 1, s["hbm_cs"][idx])
    return rows, prog.cols[idx], s["hbm_rs"][idx], cs


def _hbm_operands(prog: DecodedProgram) -> list[tuple[str, np.ndarray]]:
    return [*prog.hbm_operands(), ("a", prog.is_gather), ("o", prog.is_scatter)]


def hbm_bounding(prog: DecodedProgram) -> Footprints:
    """HBM operands with their bounding byte ranges (exact when contiguous)."""
    s = prog.col
    parts = []
    for slot, mask in _hbm_operands(prog):
        idx = np.flatnonzero(mask)
        isz = _ITEMSIZE[s[f"{slot}_dtype"][idx]]
        addr = s[f"{slot}_addr"][idx].astype(np.int64)
        rows, cols, rs, cs = _hbm_shape(prog, idx)
        tr = (rows - 1) * rs * isz
        tc = (cols - 1) * cs * isz
        lo = addr + np.minimum(tr, 0) + np.minimum(tc, 0)
        hi = addr + np.maximum(tr, 0) + np.maximum(tc, 0) + isz
        parts.append(
            Footprints(
                instr=idx,
                slot=np.full(idx.size, SLOTS.index(slot), dtype=np.int64),
                mem=np.full(idx.size, int(Mem.HBM), dtype=np.int64),
                p0=np.zeros(idx.size, dtype=np.int64),
                p1=np.ones(idx.size, dtype=np.int64),
                b0=lo,
                b1=hi,
                write=np.full(idx.size, slot == "o"),
            )
        )
    return Footprints.concat(parts)


def hbm_runs(prog: DecodedProgram, fp: Footprints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pitch, width, count) of the HBM footprints `fp` (rows of `hbm_bounding`): each
    covers `count` runs of `width` bytes, `pitch` bytes apart, the first at its b0.

    The runs follow the operand's inner dimension (a single element, else the one with
    the smaller stride): exact where that dimension is contiguous or a single element (a
    band of rows of a [C, H, W] activation, a column block of a row-major matrix, a
    transposed load), a superset where both strides exceed one element (each run then
    covers the inner dimension's bounding range). Runs that touch or overlap (pitch <=
    width), and an indirect DMA's table (its rows depend on its indices), count as one
    run: the bounding range. `pitch` is at least 1."""
    s = prog.col
    i = fp.instr
    slot_a = fp.slot == SLOTS.index("a")
    isz = _ITEMSIZE[np.where(slot_a, s["a_dtype"][i], s["o_dtype"][i])]
    rows, cols, rs, cs = _hbm_shape(prog, i)
    rows = np.where(rs == 0, 1, rows)
    cols = np.where(cs == 0, 1, cols)
    rs, cs = np.abs(rs), np.abs(cs)
    # inner dimension: one of a single element, else the one with the smaller stride
    cols_inner = (cols == 1) | (rows > 1) & (cs <= rs)
    n = np.where(cols_inner, rows, cols)
    inner_n = np.where(cols_inner, cols, rows)
    inner_s = np.where(cols_inner, cs, rs)
    pitch = np.where(cols_inner, rs, cs) * isz
    width = ((inner_n - 1) * inner_s + 1) * isz
    one = (n <= 1) | (pitch <= width) | prog.is_indirect[i]
    bound = np.maximum(fp.b1 - fp.b0, 1)
    width = np.where(one, bound, width)
    return np.where(one, bound, pitch), width, np.where(one, 1, n)


def runs_meet(
    a: np.ndarray, p: np.ndarray, w: np.ndarray, n: np.ndarray,
    b: np.ndarray, q: np.ndarray, v: np.ndarray, m: np.ndarray,
) -> np.ndarray:
    """Whether run pattern x (`n` runs of `w` bytes, `p` apart, from `a`) and pattern y
    (`m` runs of `v` bytes, `q` apart, from `b`) share a byte, element-wise, exactly.

    With one pitch P (p == q, or a single run on either side): bytes a + iP + s and
    b + jP + t are equal iff s - t = (b - a) + kP with k = j - i, and s - t takes every
    value in (-v, w): so iff some integer k in [-(n - 1), m - 1] has
    -v < b - a + kP < w. With two pitches, each run of the pattern with fewer runs
    inside the other's bounding range is tested alone (a single run has any pitch)."""
    args = [np.atleast_1d(np.asarray(x, dtype=np.int64)) for x in (a, p, w, n, b, q, v, m)]
    a, p, w, n, b, q, v, m = np.broadcast_arrays(*args)
    one_pitch = (p == q) | (n == 1) | (m == 1)
    out = np.zeros(a.shape, dtype=bool)
    j = np.flatnonzero(one_pitch)
    pitch = np.where(n[j] == 1, q[j], p[j])
    out[j] = _meet_one_pitch(b[j] - a[j], pitch, w[j], v[j], n[j], m[j])
    j = np.flatnonzero(~one_pitch)
    if not j.size:
        return out
    # x: the side with fewer runs, its runs enumerated, clipped to y's bounding range
    swap = n[j] > m[j]
    xa, xp, xw, xn, ya, yq, yv, ym = (
        np.where(swap, y[j], x[j]) for x, y in ((a, b), (p, q), (w, v), (n, m), (b, a), (q, p), (v, w), (m, n))
    )
    y_end = ya + (ym - 1) * yq + yv
    i_lo = np.maximum(0, (ya - xw - xa) // xp + 1)  # first run ending after ya
    i_hi = np.minimum(xn - 1, -((xa - y_end) // xp) - 1)  # last run starting before y_end
    many = i_hi - i_lo + 1 > _MAX_RUNS_PER_PAIR  # conservative: counts as meeting
    out[j[many]] = True
    # runs i_lo, i_lo + 1, ... in rounds of doubling length, until a run meets y
    todo = np.flatnonzero(~many & (i_lo <= i_hi))
    at = i_lo.copy()
    batch = 4
    while todo.size:
        cnt = np.minimum(batch, i_hi[todo] - at[todo] + 1)
        rep = np.repeat(todo, cnt)
        i = at[rep] + np.arange(rep.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        hit = _meet_one_pitch(ya[rep] - xa[rep] - i * xp[rep], yq[rep], xw[rep], yv[rep], 1, ym[rep])
        met = np.zeros(j.size, dtype=bool)
        met[rep[hit]] = True
        out[j[todo[met[todo]]]] = True
        at[todo] += cnt
        todo = todo[~met[todo] & (at[todo] <= i_hi[todo])]
        batch *= 2
    return out


def _meet_one_pitch(d, pitch, w, v, n, m) -> np.ndarray:
    """Some integer k in [-(n - 1), m - 1] with -v < d + k * pitch < w (pitch > 0)."""
    k_lo = np.maximum(-(n - 1), -((d + v - 1) // pitch))  # ceil((1 - v - d) / pitch)
    k_hi = np.minimum(m - 1, (w - 1 - d) // pitch)
    return k_lo <= k_hi


def hbm_intervals(prog: DecodedProgram, i: int, slot: str | None = None) -> list[tuple[int, int]]:
    """The exact bytes of instruction i's HBM operand `slot` as merged [lo, hi) intervals
    (default: a store's or a receive's destination, else the source; a reducing receive
    has both)."""
    s = prog.col
    if slot is None:
        slot = "o" if prog.op[i] in (Opcode.DMA_STORE, Opcode.DMA_SCATTER, Opcode.LINK_RECV) else "a"
    isz = ITEMSIZE[DType(int(s[f"{slot}_dtype"][i]))]
    addr = int(s[f"{slot}_addr"][i])
    rows, cols, rs, cs = (int(x[0]) for x in _hbm_shape(prog, np.array([i])))
    if rows == 1 or rs == 0:
        rows, rs = 1, 0
    if cols == 1 or cs == 0:
        cols, cs = 1, 0
    if rows > 1 and cs == 1 and rs == cols or rows == 1 and abs(cs) == 1:
        lo = addr + min(0, (cols - 1) * cs) * isz
        return [(lo, lo + rows * cols * isz)]  # one contiguous block
    if cols > 1 and abs(cs) == 1 or cols == 1:
        # rows of contiguous runs
        width = cols * isz
        first = addr + min(0, (cols - 1) * cs) * isz
        starts = first + np.arange(rows, dtype=np.int64) * (rs * isz)
        ends = starts + width
    elif abs(rs) == 1:
        width = rows * isz
        first = addr + min(0, (rows - 1) * rs) * isz
        starts = first + np.arange(cols, dtype=np.int64) * (cs * isz)
        ends = starts + width
    else:
        r = np.arange(rows, dtype=np.int64)[:, None] * rs
        c = np.arange(cols, dtype=np.int64)[None, :] * cs
        starts = (addr + (r + c) * isz).ravel()
        ends = starts + isz
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    out: list[tuple[int, int]] = []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out

