"""The fused MLP kernel: ``y = act(norm(x) @ W1 + b1) @ W2 + b2 (+ r)`` with the hidden
computed transposed and kept in SRAM.

The matrix engine computes ``acc[m x n] (+)= lhsT[k x m]^T @ rhs[k x n]``, the lhsT's
free dim landing on the accumulator's partitions. The up projection takes W1's tile
as lhsT (``[TK of K, TK hidden units]``, W1 row-major as it is) and x^T as rhs
(``[TK of K, TM tokens]``), so its product is h^T: hidden units on partitions, tokens
along the free dim. Then the fc1 bias is one K=1 matmul ``b1[1 x TK]^T @ ones[1 x TM]``
into the same accumulator (the vector ISA has no unary op with a per-partition
operand: adding the bias as a column would cost a second vector op per hidden tile,
measured slower on the GPT-2 block), the activation is elementwise (one vector op for gelu),
and the result, written into a resident ``hT`` buffer, is already the down
projection's lhsT (the contraction, over hidden units, on partitions): the hidden is
never transposed and never stored. x^T comes from the natural-layout rows (the layer
norm's output when the group has one) by transposes on the matrix engine, as in the
-O2 matmul kernel.

Per m-tile u of TM tokens (set ``p = u % 2``), in program order (the up projection
runs one m-tile ahead of the down projection, so the first down projection, which
waits for W2, follows two up projections)::

    norm of m-tile u+2 -> xn[p]                        (vector; prologue only)
    for each hidden tile t:                            (matrix: up projection of u+1)
        nk matmuls W1[:, t] x xT[1-p] -> accH[t % 2]; bias matmul
        act(accH) -> hT[1-p][t]                        (vector)
    epilogue of m-tile u-1's chunks -> store y rows    (vector, DMA; residual tiles load
                                                        on the last weight queue)
    transpose xn[p] -> xT[p]                           (m-tile u+2: matrix + vector copy)
    for each chunk of w*TN outputs:                    (matrix: down projection of u)
        nh * w matmuls hT[p][t] x W2[t][:, chunk] -> accO[c % 2]; bias matmul
    load x rows of m-tile u+3 into set 1-p             (DMA, queue 0)

The vector queue thus runs a norm and the activations before the previous m-tile's
epilogue (which waits for its whole down projection): the activations follow the up
projection closely, and the down projection that needs them comes after it.

W1 and W2 are resident, loaded once at the start, one DMA per buffer (synchronisation
is per buffer): W1 in buffers of `g` hidden tiles by K tile (the first up projection
waits only for its first `g` hidden tiles), W2 one buffer per hidden tile.
Everything inside an m-tile is static; m-tiles of one shape run in a loop over
pairs (static buffer parities); the last ones are peeled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import f32
from xdsl.ir import Attribute, SSAValue

from tilecc.ir import tile
from tilecc.passes.graph_to_tile.elementwise import Leaf, TileProgram, leaf_elem
from tilecc.passes.graph_to_tile.fused_matmul import FusedPart
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.mlp.problem import MlpProblem
from tilecc.passes.graph_to_tile.mlp.schedule import GROUP_T, MlpSchedule
from tilecc.passes.graph_to_tile.shapes import shape_of

X_Q = 0  # x rows and stores: one queue, in m-tile order (the weights' queues load residual tiles)


@dataclass
class MlpArgs:
    """The kernel's arguments, by role (entry.py builds them in this order)."""

    x: SSAValue | None  # the rows of x [M, K] (None: the prologue's leaves produce them)
    w1: SSAValue
    w2: SSAValue
    out: SSAValue | None  # the output [M, N] when there is no epilogue
    ident: SSAValue
    ones: SSAValue
    b1: SSAValue | None
    b2: SSAValue | None
    epi: list[SSAValue]  # the epilogue's hoisted and per-tile leaves, then its outputs
    pro: list[SSAValue]  # the prologue's hoisted and per-tile leaves, then its outputs
    # weights stored pre-tiled (ir/weight_layout.py): W1 as [nh/g groups x TK, nk*g*TK]
    # (group i's K tiles side by side), W2 as [nh/g2 x TK, g2*N] (`w2_tiled` = g2; 0: as is)
    w1_tiled: bool = False
    w2_tiled: int = 0
    # gated (SwiGLU): Wu, laid out as W1, and the activation's leaf its product is given as
    wu: SSAValue | None = None
    gate_leaf: int | None = None


class MlpKernel:
    """Builds the tile-dialect kernel of one MLP for one schedule (module docstring)."""

    def __init__(self, kb: KernelBuilder, p: MlpProblem, s: MlpSchedule, args: MlpArgs, *, ea: Attribute,
                 eh: Attribute, eo: Attribute, act: FusedPart, epi: FusedPart | None, pro: FusedPart | None,
                 queues: int) -> None:
        self.kb, self.p, self.s, self.a = kb, p, s, args
        self.ea, self.eh, self.eo = ea, eh, eo
        self.act, self.epi, self.pro = act, epi, pro
        self.wq = [q for q in range(queues) if q != X_Q] or [X_Q]  # weight queues
        self._wq = 0
        self.TNL = s.w * p.TN
        self.widths = [min(self.TNL, p.N - n0) for n0 in range(0, p.N, self.TNL)]
        self.ksz = [min(p.TK, p.K - k * p.TK) for k in range(p.nk)]
        self.hsz = [min(p.TK, p.H - h * p.TK) for h in range(p.nh)]

    # -- helpers --------------------------------------------------------------------------

    def c(self, v: int) -> SSAValue:
        return self.kb.const(v)

    def win(self, buf: SSAValue, col: int | SSAValue, shape: Sequence[int], row: int = 0) -> SSAValue:
        if isinstance(col, int) and col == 0 and row == 0 and list(shape) == list(shape_of(buf.type)):
            return buf
        c = self.c(col) if isinstance(col, int) else col
        return self.kb.add(tile.SubviewOp(buf, self.c(row), c, list(shape))).results[0]

    def next_wq(self) -> int:
        self._wq += 1
        return self.wq[(self._wq - 1) % len(self.wq)]

    def mm(self, lhsT: SSAValue, rhs: SSAValue, acc: SSAValue, m: int, k: int, n: int, accumulate: bool) -> None:
        self.kb.add(tile.MatmulOp(lhsT, rhs, acc, self.c(m), self.c(k), self.c(n), self.kb.bool_const(accumulate)))

    def load(self, arg: SSAValue, idx: Sequence[SSAValue | int], dst: SSAValue, rows: int, cols: int, queue: int,
             row_dim: int = 0, col_dim: int = 1) -> None:
        ind = [self.c(i) if isinstance(i, int) else i for i in idx]
        self.kb.add(tile.LoadOp(arg, ind, dst, self.c(rows), self.c(cols), row_dim, col_dim, queue=queue))

    # -- buffers and what loads once -----------------------------------------------------------

    def _alloc(self) -> None:
        kb, p, s = self.kb, self.p, self.s
        TM, TK = p.TM, p.TK
        self.gcols = s.g * TK
        self.n_w1 = -(-p.nh // s.g)
        # one buffer per DMA (synchronisation is per buffer: loads into one buffer would
        # run one after another, whatever their queues). Pre-tiled (`MlpArgs.w1_tiled`):
        # one buffer per hidden group, every K tile side by side, one DMA; else one per
        # group and K tile
        self.w1, self.wu = self._w1_bufs("w1"), self._w1_bufs("wu") if self.a.wu is not None else []
        # W2: pre-tiled, one buffer (one DMA) per group of `w2_tiled` hidden tiles, else
        # one per hidden tile
        g2 = self.a.w2_tiled or 1
        self.w2 = [kb.alloc([TK, g2 * p.N], self.ea, tile.SRAM, f"w2_{h}") for h in range(0, p.nh, g2)]
        # a buffer per hidden tile: the down projection's first matmuls wait for the
        # first activations only, not for the m-tile's last
        self.hT = [[kb.alloc([TK, TM], self.eh, tile.SRAM, f"hT{h}") for h in range(p.nh)] for _ in range(2)]
        self.xT = [kb.alloc([TK, p.nk * TM], self.ea, tile.SRAM, "xT") for _ in range(2)]
        self.xn = [kb.alloc([TM, p.K], self.ea, tile.SRAM, "xn") for _ in range(2)]
        self.ident = kb.alloc([TM, TM], self.ea, tile.SRAM, "ident")
        self.ones = kb.alloc([1, TM], self.ea, tile.SRAM, "ones")
        self.b1 = kb.alloc([1, p.H], self.ea, tile.SRAM, "b1") if self.a.b1 is not None else None
        self.b2 = kb.alloc([1, p.N], self.ea, tile.SRAM, "b2") if self.a.b2 is not None else None
        self.accH = [kb.alloc([TK, TM], f32, tile.ACC, "accH") for _ in range(2)]
        self.accU = [kb.alloc([TK, TM], f32, tile.ACC, "accU") for _ in range(2)] if self.a.wu is not None else []
        # two: a group's transposes need not wait for the previous group's copy
        self.accT = [kb.alloc([TK, min(GROUP_T, p.nk) * TM], f32, tile.ACC, "accT") for _ in range(2)]
        self.accO = [kb.alloc([TM, self.TNL], f32, tile.ACC, "accO") for _ in range(2)]
        self.obuf = [kb.alloc([TM, self.TNL], self.eo, tile.SRAM, "out") for _ in range(2)] if self.epi is None \
            else []
        # the activation: the accumulator tile in, the hT window out (both given)
        act = self.act
        out_ref = act.ek.outputs[0][0]
        self.act_out = out_ref
        given = {act.root, out_ref} | ({self.a.gate_leaf} if self.a.gate_leaf is not None else set())
        self.act_tp = TileProgram(act.ek, kb, TK, TM, 1, {}, TM, [act.root], frozenset(given))
        self.epi_tp = self._program(self.epi, self.TNL, p.N, self.a.epi) if self.epi is not None else None
        self.pro_tp = self._program(self.pro, p.K, p.K, self.a.pro, root_given=True) if self.pro is not None \
            else None

    def _program(self, part: FusedPart, TC: int, width: int, args: list[SSAValue],
                 root_given: bool = False) -> TileProgram:
        """A part's TileProgram on this kernel's tiles (two sets), its operands that do
        not vary along the rows loaded once, full width, broadcast to every row."""
        kb, TM = self.kb, self.p.TM
        n_leaves = len(part.hoisted) + len(part.per_tile)
        leaf_args, out_args = args[:n_leaves], args[n_leaves:]
        tp = TileProgram(part.ek, kb, TM, TC, 2, {i: 2 for i in part.per_tile}, TC, [part.root],
                         frozenset({part.root}))
        tp.bind(dict(zip(part.hoisted + part.per_tile, leaf_args)), out_args,
                [list(range(len(part.ek.shape)))] * len(out_args))
        for i, arg in zip(part.hoisted, leaf_args):
            leaf = part.ek.values[i]
            assert isinstance(leaf, Leaf)
            cols = 1 if leaf.cls == "column" else width
            buf = kb.alloc([TM, cols], leaf_elem(leaf), tile.SRAM, f"hoist{i}")
            col_dim = leaf.imap[-1] if leaf.imap[-1] is not None else -1
            row_dim = leaf.imap[-2] if leaf.imap[-2] is not None else -1
            self.load(arg, [0] * len(shape_of(arg.type)), buf, TM, cols, self.next_wq(), row_dim, col_dim)
            tp.hoist_bufs[i] = buf
        return tp

    def _given(self, tp: TileProgram, part: FusedPart, col0: int, width: int) -> dict[int, SSAValue]:
        given: dict[int, SSAValue] = {}
        for i, buf in tp.hoist_bufs.items():
            leaf = part.ek.values[i]
            assert isinstance(leaf, Leaf)
            given[i] = buf if leaf.cls == "column" else self.win(buf, col0, [self.p.TM, width])
        return given

    def _w1_bufs(self, name: str) -> list[list[SSAValue]]:
        p, TK = self.p, self.p.TK
        if self.a.w1_tiled:
            return [[self.kb.alloc([TK, p.nk * self.gcols], self.ea, tile.SRAM, f"{name}_{i}")]
                    for i in range(self.n_w1)]
        return [[self.kb.alloc([TK, self.gcols], self.ea, tile.SRAM, f"{name}_{i}_{k}") for k in range(p.nk)]
                for i in range(self.n_w1)]

    def w1_tile(self, h: int, k: int, gate: bool = False) -> SSAValue:
        """W1's (`gate`: Wu's) [TK of K, TK hidden units] tile (k, h) in SRAM."""
        TK = self.p.TK
        bufs = (self.wu if gate else self.w1)[h // self.s.g]
        col = (h % self.s.g) * TK
        if self.a.w1_tiled:
            return self.win(bufs[0], k * self.gcols + col, [TK, TK])
        return self.win(bufs[k], col, [TK, TK])

    def w2_tile(self, h: int, n0: int) -> SSAValue:
        """W2's [TK hidden units, TN outputs] tile at hidden tile h, output column n0."""
        p = self.p
        g2 = self.a.w2_tiled or 1
        return self.win(self.w2[h // g2], (h % g2) * p.N + n0, [p.TK, p.TN])

    def _load_weights(self) -> None:
        """W1 by buffer (every K row of its hidden tiles), then W2 by hidden tile."""
        p = self.p
        weights = [(self.a.w1, self.w1)] + ([(self.a.wu, self.wu)] if self.a.wu is not None else [])
        for i in range(self.n_w1):  # group by group (W1's and Wu's)
            for arg, w in weights:
                if self.a.w1_tiled:  # group i: rows i*TK .. of the pre-tiled W1, nk*g*TK columns
                    self.load(arg, [i * p.TK, 0], w[i][0], p.TK, p.nk * self.gcols, self.next_wq())
                    continue
                h0 = i * self.gcols
                cols = min(self.gcols, p.H - h0)
                for k, ks in enumerate(self.ksz):
                    self.load(arg, [k * p.TK, h0], w[i][k], ks, cols, self.next_wq())

    def _load_w2(self) -> None:
        p = self.p
        g2 = self.a.w2_tiled
        if g2:  # group G: rows G*TK .. of the pre-tiled W2, g2*N columns
            for G, buf in enumerate(self.w2):
                self.load(self.a.w2, [G * p.TK, 0], buf, p.TK, g2 * p.N, self.next_wq())
            return
        for h, hs in enumerate(self.hsz):
            self.load(self.a.w2, [h * p.TK, 0], self.w2[h], hs, p.N, self.next_wq())

    # -- the stages of one m-tile ------------------------------------------------------------

    def load_x(self, m0: SSAValue, ms: int, st: int) -> None:
        """The rows of m-tile at `m0` into set `st` (x itself, or the prologue's leaves)."""
        if self.pro_tp is None:
            assert self.a.x is not None
            self.load(self.a.x, [m0, 0], self.xn[st], ms, self.p.K, X_Q)
            return
        assert self.pro is not None
        for i in self.pro.per_tile:
            self.pro_tp.load(i, [m0, self.c(0)], self.c(ms), self.c(self.p.K), st, queue=X_Q)

    def norm(self, m0: SSAValue, ms: int, st: int) -> None:
        """The prologue (a layer norm) on set `st`'s rows -> xn[st]."""
        if self.pro_tp is None or self.pro is None:
            return
        given = self._given(self.pro_tp, self.pro, 0, self.p.K)
        given[self.pro.root] = self.xn[st]
        r, c = self.c(ms), self.c(self.p.K)
        self.pro_tp.compute(r, c, st, given)
        self.pro_tp.store([m0, self.c(0)], r, c, st, queue=X_Q, given=given)

    def transpose(self, ms: int, st: int) -> None:
        """xn[st] (ms rows) -> xT[st]: nk transposes, whole groups side by side with one copy."""
        p = self.p
        TM, TK = p.TM, p.TK
        for k0 in range(0, p.nk, GROUP_T):
            ks = list(range(k0, min(p.nk, k0 + GROUP_T)))
            accT = self.accT[(k0 // GROUP_T) % 2]
            for i, k in enumerate(ks):
                self.mm(self.win(self.xn[st], k * TK, [TM, TK]), self.ident, self.win(accT, i * TM, [TK, TM]),
                        self.ksz[k], ms, ms, False)
            if ms == TM and all(self.ksz[k] == TK for k in ks):
                n = len(ks) * TM
                self.kb.add(tile.UnaryOp("copy", self.win(accT, 0, [TK, n]), self.win(self.xT[st], k0 * TM,
                                                                                            [TK, n]),
                                         self.c(TK), self.c(n)))
                continue
            for i, k in enumerate(ks):  # only the written corner: ksz rows, ms columns
                self.kb.add(tile.UnaryOp("copy", self.win(accT, i * TM, [TK, TM]),
                                         self.win(self.xT[st], k * TM, [TK, TM]), self.c(self.ksz[k]), self.c(ms)))

    def up(self, ms: int, st: int) -> None:
        """h^T of the m-tile in set `st`: per hidden tile, nk matmuls, the bias, the activation."""
        p = self.p
        TM, TK = p.TM, p.TK
        for h, hs in enumerate(self.hsz):
            acc = self.accH[(st * p.nh + h) % 2]
            for k, ks in enumerate(self.ksz):
                self.mm(self.w1_tile(h, k), self.win(self.xT[st], k * TM, [TK, TM]),
                        acc, hs, ks, ms, k > 0)
            if self.b1 is not None:
                self.mm(self.win(self.b1, h * TK, [1, TK]), self.ones, acc, hs, 1, ms, True)
            given = {self.act.root: acc, self.act_out: self.hT[st][h]}
            if self.a.gate_leaf is not None:  # the gate's product x @ Wu, its own accumulator
                acc_u = self.accU[(st * p.nh + h) % 2]
                for k, ks in enumerate(self.ksz):
                    self.mm(self.w1_tile(h, k, gate=True), self.win(self.xT[st], k * TM, [TK, TM]), acc_u, hs, ks,
                            ms, k > 0)
                given[self.a.gate_leaf] = acc_u
            self.act_tp.compute(self.c(hs), self.c(ms), 0, given)

    def chunks(self) -> list[tuple[int, int]]:
        """(first column, width) of each down-projection chunk."""
        return [(sum(self.widths[:c]), w) for c, w in enumerate(self.widths)]

    def down(self, ms: int, st: int) -> None:
        """The m-tile's down projection: per chunk, nh * w matmuls and the bias (its
        evacuation is `evacuate_down`, emitted after the next m-tile's activations)."""
        p = self.p
        TM, TN = p.TM, p.TN
        for c, (n0, width) in enumerate(self.chunks()):
            acc = self.accO[(st * len(self.widths) + c) % 2]
            tiles = [(t, min(TN, width - t * TN)) for t in range(-(-width // TN))]
            for h, hs in enumerate(self.hsz):
                lhs = self.hT[st][h]
                for t, ns in tiles:
                    self.mm(lhs, self.w2_tile(h, n0 + t * TN), self.win(acc, t * TN, [TM, TN]),
                            ms, hs, ns, h > 0)
            if self.b2 is not None:
                for t, ns in tiles:
                    self.mm(self.ones, self.win(self.b2, n0 + t * TN, [1, TN]), self.win(acc, t * TN, [TM, TN]),
                            ms, 1, ns, True)

    def evacuate_down(self, m0: SSAValue, ms: int, st: int) -> None:
        """The m-tile's output chunks: epilogue (its per-tile operands loaded on the last
        weight queue) and store."""
        p = self.p
        for c, (n0, width) in enumerate(self.chunks()):
            par = (st * len(self.widths) + c) % 2
            if self.epi_tp is not None and self.epi is not None:
                for i in self.epi.per_tile:
                    self.epi_tp.load(i, [m0, self.c(n0)], self.c(ms), self.c(width), par, queue=self.wq[-1])
            self.evacuate(self.win(self.accO[par], 0, [p.TM, width]), par, m0, n0, ms, width)

    def evacuate(self, acc: SSAValue, par: int, m0: SSAValue, n0: int, ms: int, width: int) -> None:
        r, c = self.c(ms), self.c(width)
        if self.epi_tp is None or self.epi is None:
            assert self.a.out is not None
            out = self.win(self.obuf[par], 0, [self.p.TM, width])
            self.kb.add(tile.UnaryOp("copy", acc, out, r, c))
            self.kb.add(tile.StoreOp(out, self.a.out, [m0, self.c(n0)], r, c, 0, 1, queue=X_Q))
            return
        given = self._given(self.epi_tp, self.epi, n0, width)
        given[self.epi.root] = acc
        self.epi_tp.compute(r, c, par, given)
        self.epi_tp.store([m0, self.c(n0)], r, c, par, queue=X_Q, given=given)

    # -- the kernel ------------------------------------------------------------------------

    def emit(self) -> None:
        p = self.p
        self._alloc()
        self.load(self.a.ident, [0, 0], self.ident, p.TM, p.TM, X_Q)
        self.load(self.a.ones, [0, 0], self.ones, 1, p.TM, self.next_wq())
        for arg, buf, n in ((self.a.b1, self.b1, p.H), (self.a.b2, self.b2, p.N)):
            if arg is not None and buf is not None:
                self.load(arg, [0, 0], buf, 1, n, self.next_wq())
        T = p.n_mtiles
        ms_of = [min(p.TM, p.M - u * p.TM) for u in range(T)]
        self.load_x(self.c(0), ms_of[0], 0)
        self._load_weights()
        if T > 1:
            self.load_x(self.c(p.TM), ms_of[1], 1)
        self._load_w2()
        # the pipeline's head: m-tile 0 up to its activations, m-tile 1 up to its x^T
        self.norm(self.c(0), ms_of[0], 0)
        self.transpose(ms_of[0], 0)
        if T > 2:
            self.load_x(self.c(2 * p.TM), ms_of[2], 0)
        if T > 1:
            self.norm(self.c(p.TM), ms_of[1], 1)
        self.up(ms_of[0], 0)
        if T > 1:
            self.transpose(ms_of[1], 1)
        if T > 3:
            self.load_x(self.c(3 * p.TM), ms_of[3], 1)

        def key(u: int) -> tuple:
            return tuple(ms_of[v] if 0 <= v < T else None for v in range(u - 1, u + 4))

        keys = [key(u) for u in range(T)]
        u = 0
        while u < T:
            end = u
            while end < T and keys[end] == keys[u]:
                end += 1
            self._run(u, end - u, keys[u])
            u = end
        self.evacuate_down(self.c((T - 1) * p.TM), ms_of[-1], (T - 1) % 2)

    def _run(self, start: int, n: int, key: tuple) -> None:
        """m-tiles start .. start+n-1 (one shape `key`): a loop over pairs, an odd one peeled."""
        p = self.p
        pairs, odd = divmod(n, 2)
        if pairs == 1:
            for d in range(2):
                self._body(self.c((start + d) * p.TM), (start + d) % 2, key)
        elif pairs > 1:
            with self.kb.loop(pairs) as iv:
                base = self.kb.addi(self.kb.muli(iv, self.c(2 * p.TM)), self.c(start * p.TM))
                for d in range(2):
                    m0 = base if d == 0 else self.kb.addi(base, self.c(p.TM))
                    self._body(m0, (start + d) % 2, key)
        if odd:
            last = start + 2 * pairs
            self._body(self.c(last * p.TM), last % 2, key)

    def _body(self, m0: SSAValue, st: int, key: tuple) -> None:
        """m-tile u (rows from `m0`, set `st`): the next one's up projection ahead of this
        one's down projection (module docstring)."""
        ms0, ms, ms1, ms2, ms3 = key
        kb, TM = self.kb, self.p.TM

        def row(d: int) -> SSAValue:
            return kb.addi(m0, self.c(d * TM)) if d > 0 else kb.subi(m0, self.c(-d * TM))

        if ms2 is not None:
            self.norm(row(2), ms2, st)
        if ms1 is not None:
            self.up(ms1, 1 - st)
        if ms0 is not None:  # the previous m-tile's outputs, behind the next one's activations
            self.evacuate_down(row(-1), ms0, 1 - st)
        if ms2 is not None:
            self.transpose(ms2, st)
        self.down(ms, st)
        if ms3 is not None:
            self.load_x(row(3), ms3, 1 - st)


__all__ = ["MlpArgs", "MlpKernel"]
