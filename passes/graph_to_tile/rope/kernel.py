"""The rotary-embedding kernel: one `graph.rope` over x's natural rows of positions.

Per tile of TS positions (rows on partitions) and chunk of hc heads (columns), cos and
sin shared by the heads (``[B, 1, S, D]``, the Llama form)::

    load cos into crep[:, :D], sin [TS x D]         (once per tile: shared by every head)
    crep[:, D:R*D] = crep[:, :D] ...                (log2 R doubling copies: cos for R heads)
    nsin = -sin[:, :D/2]
    load x [TS x hc*D]                              (one DMA when heads are adjacent)
    per group of R heads:  y_g = x_g * crep         (one instruction for R heads; rounded
                                                     to x's type, as eager)
    per head h:  t_h[:, :D/2] = x_h[:, D/2:] * nsin  (= rotate_half(x)_h * sin, lower half)
                 t_h[:, D/2:] = x_h[:, :D/2] * sin[:, D/2:]
    y = y + t                                       (one instruction for the chunk)
    store y [TS x hc*D] into out [B, S, H*D]         (one DMA)

The rotation swaps the halves of each head's D columns, which no single vector
instruction over the row can do, so it stays two instructions per head; x * cos and the
add do not depend on the head and run over many heads at once: 2 + 2/R instead of 4
instructions per head, each paying the vector engine's fixed overhead (1b Llama q at
S = 2048, cloud: 22.1k -> 18.3k vector cycles per tile of 128 positions). R (`schedule.py`)
trades the doubling copies against the instructions they save. cos / sin varying over
heads keep four instructions per head (`head`): no replicated table serves two heads.

With few positions (decode) a tile is one position with its heads on the rows
(``[hc x D]``, the position's cos / sin row broadcast to every head): five vector
instructions per tile instead of four per head.

The loop over position tiles is unrolled nb times with nb buffer sets (the schedule), so
the next tile's loads and the last one's store overlap this one's vector work; DMAs
rotate over the queues.
"""

from __future__ import annotations

from xdsl.ir import SSAValue

from tilecc.ir import tile
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.rope.problem import RopeProblem
from tilecc.passes.graph_to_tile.rope.schedule import RopeSchedule


class RopeKernel:
    """Emit with `build(kb)`; kernel arguments: x (``[B, S, H*D]`` rows when heads are
    adjacent, else ``[B, H, S, D]``), cos and sin (``[B, H, S, D]``, broadcast strides),
    out ``[B, S, H*D]``."""

    def __init__(self, p: RopeProblem, sch: RopeSchedule, queues: int):
        self.p, self.sch, self.queues = p, sch, queues
        self._q = 0

    def queue(self) -> int:
        self._q += 1
        return (self._q - 1) % self.queues

    def build(self, kb: KernelBuilder) -> None:
        if self.sch.mode == "heads":
            self.build_heads(kb)
            return
        p, sch = self.p, self.sch
        TS, hc, nb, D, half = sch.TS, sch.hc, sch.nb, p.D, p.half
        self.kb = kb
        self.x, self.cos, self.sin, self.out = kb.args
        self.xb = [kb.alloc([TS, hc * D], p.elem, "sram", "x") for _ in range(nb)]
        self.yb = [kb.alloc([TS, hc * D], p.elem, "sram", "y") for _ in range(nb)]
        R = sch.rep
        self.crep = [kb.alloc([TS, R * D], p.elem, "sram", "cos") for _ in range(nb)] if R else []
        self.cb = [self.sub(c, 0, TS, D) for c in self.crep] if R else \
            [kb.alloc([TS, D], p.elem, "sram", "cos") for _ in range(nb)]
        self.sb = [kb.alloc([TS, D], p.elem, "sram", "sin") for _ in range(nb)]
        self.nsin = kb.alloc([TS, half], p.elem, "sram", "nsin")
        self.t = kb.alloc([TS, (hc if R else 1) * D], p.elem, "sram", "t")
        F, tail = divmod(p.S, TS)
        main, rest = divmod(F, nb)
        with kb.loop(p.B) as b:
            if main:
                with kb.loop(main) as u:
                    base = kb.muli(u, kb.const(nb * TS)) if main > 1 else kb.const(0)
                    for s in range(nb):
                        self.tile(b, kb.addi(base, kb.const(s * TS)) if s else base, TS, s)
            for s in range(rest):
                self.tile(b, kb.const((main * nb + s) * TS), TS, s)
            if tail:
                self.tile(b, kb.const(F * TS), tail, F % nb)

    def sub(self, buf: SSAValue, col: int, rows: int, cols: int) -> SSAValue:
        return self.kb.add(tile.SubviewOp(buf, self.kb.const(0), self.kb.const(col), [rows, cols])).results[0]

    def load_table(self, b: SSAValue, h: SSAValue, s0: SSAValue, r: SSAValue, t: int) -> None:
        """cos and sin rows of positions s0.. (head h) into set t; nsin = -sin's lower half."""
        kb, p = self.kb, self.p
        row_dim = 2 if p.table_rows else -1
        for src, dst in ((self.cos, self.cb[t]), (self.sin, self.sb[t])):
            kb.add(tile.LoadOp(src, [b, h, s0, kb.const(0)], dst, r, kb.const(p.D), row_dim, 3, queue=self.queue()))
        kb.add(tile.UnaryOp("neg", self.sub(self.sb[t], 0, self.sch.TS, p.half), self.nsin, r, kb.const(p.half)))
        w, R = p.D, self.sch.rep
        while w < R * p.D:  # cos for R heads side by side: copies doubling the width
            n = min(w, R * p.D - w)
            kb.add(tile.UnaryOp("copy", self.sub(self.crep[t], 0, self.sch.TS, n),
                                self.sub(self.crep[t], w, self.sch.TS, n), r, kb.const(n)))
            w += n

    def tile(self, b: SSAValue, s0: SSAValue, rows: int, t: int) -> None:
        kb, p, sch = self.kb, self.p, self.sch
        r = kb.const(rows)
        if p.shared_table:
            self.load_table(b, kb.const(0), s0, r, t)
        chunks = -(-p.H // sch.hc)
        for c in range(chunks):
            u = (t * chunks + c) % sch.nb
            h0, hn = c * sch.hc, min(sch.hc, p.H - c * sch.hc)
            if p.heads_adjacent:
                kb.add(tile.LoadOp(self.x, [b, s0, kb.const(h0 * p.D)], self.xb[u], r, kb.const(hn * p.D), 1, 2,
                                   queue=self.queue()))
            else:
                for j in range(hn):
                    kb.add(tile.LoadOp(self.x, [b, kb.const(h0 + j), s0, kb.const(0)],
                                       self.sub(self.xb[u], j * p.D, sch.TS, p.D), r, kb.const(p.D), 2, 3,
                                       queue=self.queue()))
            if sch.rep:
                self.heads_wide(r, u, t, hn)
            for j in range(hn if not sch.rep else 0):
                if not p.shared_table:
                    self.load_table(b, kb.const(h0 + j), s0, r, u)
                self.head(r, u, t if p.shared_table else u, j)
            kb.add(tile.StoreOp(self.yb[u], self.out, [b, s0, kb.const(h0 * p.D)], r, kb.const(hn * p.D), 1, 2,
                                queue=self.queue()))

    def head(self, r: SSAValue, u: int, t: int, j: int) -> None:
        """y_h = x_h * cos + rotate_half(x_h) * sin for head j of the chunk in set u."""
        kb, p, TS = self.kb, self.p, self.sch.TS
        D, half = p.D, p.half
        full, hcols = kb.const(D), kb.const(half)
        x = self.sub(self.xb[u], j * D, TS, D)
        x_lo, x_hi = self.sub(self.xb[u], j * D, TS, half), self.sub(self.xb[u], j * D + half, TS, half)
        y = self.sub(self.yb[u], j * D, TS, D)
        t_lo, t_hi = self.sub(self.t, 0, TS, half), self.sub(self.t, half, TS, half)
        sin_hi = self.sub(self.sb[t], half, TS, half)
        kb.add(tile.BinaryOp("mul", x, self.cb[t], y, r, full))
        kb.add(tile.BinaryOp("mul", x_hi, self.nsin, t_lo, r, hcols))
        kb.add(tile.BinaryOp("mul", x_lo, sin_hi, t_hi, r, hcols))
        kb.add(tile.BinaryOp("add", y, self.t, y, r, full))

    def heads_wide(self, r: SSAValue, u: int, t: int, hn: int) -> None:
        """y = x * cos + rotate_half(x) * sin for the hn heads of the chunk in set u, cos
        replicated for R heads in crep[t]: x * cos per group of R heads, the rotation per
        head into t, one add for the chunk."""
        kb, p, TS, R = self.kb, self.p, self.sch.TS, self.sch.rep
        D, half = p.D, p.half
        hcols = kb.const(half)
        for g0 in range(0, hn, R):
            n = min(R, hn - g0) * D
            kb.add(tile.BinaryOp("mul", self.sub(self.xb[u], g0 * D, TS, n), self.sub(self.crep[t], 0, TS, n),
                                 self.sub(self.yb[u], g0 * D, TS, n), r, kb.const(n)))
        sin_hi = self.sub(self.sb[t], half, TS, half)
        for j in range(hn):
            x_lo, x_hi = self.sub(self.xb[u], j * D, TS, half), self.sub(self.xb[u], j * D + half, TS, half)
            t_lo, t_hi = self.sub(self.t, j * D, TS, half), self.sub(self.t, j * D + half, TS, half)
            kb.add(tile.BinaryOp("mul", x_hi, self.nsin, t_lo, r, hcols))
            kb.add(tile.BinaryOp("mul", x_lo, sin_hi, t_hi, r, hcols))
        y = self.sub(self.yb[u], 0, TS, hn * D)
        kb.add(tile.BinaryOp("add", y, self.sub(self.t, 0, TS, hn * D), y, r, kb.const(hn * D)))

    def build_heads(self, kb: KernelBuilder) -> None:
        """One position per tile, hc heads on the rows; args x ``[B, H, S, D]``, cos and
        sin ``[B, H, S, D]`` (broadcast strides), out ``[B, S, H, D]``."""
        p, hc = self.p, self.sch.hc
        D, half = p.D, p.half
        self.kb = kb
        x, cos, sin, out = kb.args
        xb = kb.alloc([hc, D], p.elem, "sram", "x")
        cb = kb.alloc([hc, D], p.elem, "sram", "cos")
        sb = kb.alloc([hc, D], p.elem, "sram", "sin")
        nsin = kb.alloc([hc, half], p.elem, "sram", "nsin")
        t = kb.alloc([hc, D], p.elem, "sram", "t")
        yb = kb.alloc([hc, D], p.elem, "sram", "y")
        c0, full, hcols = kb.const(0), kb.const(D), kb.const(half)
        table_row_dim = -1 if p.shared_table else 1
        with kb.loop(p.B) as b, kb.loop(p.S) as s:
            for h0 in range(0, p.H, hc):
                r = kb.const(min(hc, p.H - h0))
                h = kb.const(h0)
                for src, dst in ((cos, cb), (sin, sb)):
                    kb.add(tile.LoadOp(src, [b, kb.const(0 if p.shared_table else h0), s, c0], dst, r, full,
                                       table_row_dim, 3, queue=self.queue()))
                kb.add(tile.LoadOp(x, [b, h, s, c0], xb, r, full, 1, 3, queue=self.queue()))
                kb.add(tile.UnaryOp("neg", self.sub(sb, 0, hc, half), nsin, r, hcols))
                kb.add(tile.BinaryOp("mul", xb, cb, yb, r, full))
                kb.add(tile.BinaryOp("mul", self.sub(xb, half, hc, half), nsin, self.sub(t, 0, hc, half), r, hcols))
                kb.add(tile.BinaryOp("mul", self.sub(xb, 0, hc, half), self.sub(sb, half, hc, half),
                                     self.sub(t, half, hc, half), r, hcols))
                kb.add(tile.BinaryOp("add", yb, t, yb, r, full))
                kb.add(tile.StoreOp(yb, out, [b, s, h, c0], r, full, 2, 3, queue=self.queue()))
