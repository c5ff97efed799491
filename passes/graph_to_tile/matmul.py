"""The -O2 matmul kernel: A^T resident per m-block, B streamed per n-chunk, the next
block's A prepared while this one computes.

The matrix engine computes ``acc[M x N] (+)= lhsT[K x M]^T @ rhs[K x N]`` with K on
partitions for both operands. B (``[K, N]``, row-major) loads as it is. A (``[M, K]``)
would need an element-strided DMA (one descriptor per element), which is what the -O0
kernel does; here A rows load in their natural layout (one descriptor per row) and are
transposed on the matrix engine by a matmul with an identity, the result copied from
the accumulator into a resident ``lhsT`` buffer ("preparing" the m-tile).

Loop nest, per batch index (TM x TK x TN: the target's tile; TNL = w * TN)::

    prepare m-tile 0                                   # the only exposed preparation
    for each block of nb m-tiles:                      # lhsT of the block stays in SRAM
        for each n-chunk of TNL columns:
            load B[:, chunk] (nk tiles TK x TNL) into B set (chunk % 2)   # prefetched
            for each m-tile j of the block:
                for kt (dynamic loops, one per B group of g k-tiles):
                    w matmuls lhsT[j][kt] x B[kt][t] -> acc[step % 2][t]
                    (first chunk only) transpose one k-tile of a later m-tile
                evacuate acc[step % 2] (TM x TNL) to HBM

- B is read once per block (``M / (nb TM)`` times in all), A and the output once.
- Each m-tile's accumulation ends on its own, so two accumulators (alternating between
  consecutive m-tiles) let the evacuation of one overlap the next; only two exist
  whatever nb and w are.
- Preparation is interleaved into the matmul stream, one k-tile transpose (and one
  vector copy) after the matmuls of each k-tile of a step of the block's first n-chunk:
  block 0 prepares its own m-tiles 1.. (one step ahead), block b its successor's into
  the second lhsT set (`pipelined`; block 0 does that during its second chunk). Without
  `pipelined` a block prepares its own m-tiles, the first before the block starts.
  With a fused prologue (vector work on the rows: `defer`) the step's first nk / R
  k-tiles transpose R k-tiles each and the prologue of the next m-tile's rows runs
  under the remaining matmuls (`front_part`), not after the last transpose, where it
  would hold the next step's transpose copies and the matrix engine behind it.
  A rows load one preparation ahead into two natural-layout buffers; the kernel's first
  m-tile loads in row pieces on the B queues, ahead of their B loads (`load_first_rows`).
  A preparation before a block (nothing to hide behind) transposes `prologue_group`
  k-tiles side by side into an idle output accumulator, one vector copy for them all.
- B tiles of a chunk live in group buffers of g k-tiles; one group's loads run on one
  DMA queue. Matmuls wait for their whole group (synchronisation is per buffer).
- A one-row matmul reading a pre-tiled weight (`direct_a`: decode at batch 1) needs no
  transposes: its A row loads straight into lhsT with one DMA, partition r holding the
  K / TK contiguous elements ``r*nk ..`` (k-tile kt is column kt), and its weight is
  stored with rows interleaved to match (`ir/weight_layout.py`, ``:ki``). No identity,
  no natural-layout A buffer, no transposes before the first matmul.
- Everything is static except loop indices: edge tiles (M, K, N not multiples of the
  tile, a last block of fewer m-tiles, a narrower last chunk) are peeled in Python, and
  loops over uniform runs of blocks, chunks, m-tiles and k-tiles are unrolled by two so
  every alternating buffer is a static one.

The schedule parameters (`MatmulSchedule`: nb, w, g, B sets, pipelining, DMA queues)
come from the analytical cost model (`passes/schedule/cost_model.py`) or, with autotuning, from
`passes/schedule/autotune.py` (simulating candidates, cached on disk).

Extension points (for fusing producers / epilogues into the kernel; override them in a
subclass of `BlockedMatmulKernel`):

- `BlockedMatmulKernel.load_a_rows(dst, m0, k0, ms, cols, queue)`: produce the
  natural-layout A rows ``m0 .. m0+ms`` x columns ``k0 .. k0+cols`` into the SRAM
  buffer `dst` (``[TM, K]``). Default: one `tile.load` from the A argument.
- `BlockedMatmulKernel.load_a_direct(dst)`: a direct kernel's row into lhsT (default:
  one load; passes/graph_to_tile/norm_gemv.py computes an RMS norm there instead).
- `BlockedMatmulKernel.evacuate(acc, parity, m0, n0, ms, ns)`: move one finished
  accumulator tile (``ms x ns`` fp32 in `acc`, output rows ``m0..`` and columns
  ``n0..``) to HBM. Default: vector copy into the SRAM out buffer ``parity``, then one
  `tile.store`. Two evacuations can be in flight (parity 0 / 1).

`lower_matmul_blocked` returns False when no schedule fits the target (the caller then
uses the -O0 kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects import arith
from xdsl.dialects.builtin import IntegerAttr, f32, i1
from xdsl.ir import Operation, SSAValue

from tilecc.errors import CompileError
from tilecc.ir import tile
from tilecc.passes import remarks
from tilecc.passes.graph_to_tile.kernel_builder import KernelBuilder
from tilecc.passes.graph_to_tile.matmul_problem import b_operand, choose_schedule, direct_a, problem_of
from tilecc.passes.graph_to_tile.shapes import Operand, shape_of
from tilecc.passes.schedule.matmul_schedule import (
    BlockPlan,
    Item,
    MatmulProblem,
    MatmulSchedule,
    batch_unrolled,
    blocks,
    chunk_widths,
    first_rows_in_pieces,
    first_rows_queues,
    first_rows_whole,
    groups,
    plan_blocks,
    prep_sites,
    prologue_group,
    runs,
    uses_two_sets,
)
from tilecc.simulator.config import HardwareConfig

if TYPE_CHECKING:
    from tilecc.passes.graph_to_tile.context import LoweringContext


# ----------------------------------------------------------------------------- indices


class _Aff:
    """An affine index expression ``const + sum(coeff * iv)`` built in Python and turned
    into `arith` ops only where a tile op needs it (once per block of the IR)."""

    __slots__ = ("const", "terms")

    def __init__(self, const: int = 0, terms: tuple[tuple[SSAValue, int], ...] = ()):
        self.const = const
        self.terms = terms

    @staticmethod
    def iv(v: SSAValue) -> _Aff:
        return _Aff(0, ((v, 1),))

    def __add__(self, other: int | _Aff) -> _Aff:
        if isinstance(other, int):
            return _Aff(self.const + other, self.terms)
        terms = list(self.terms)
        for v, k in other.terms:
            for i, (u, q) in enumerate(terms):
                if u is v:
                    terms[i] = (u, q + k)
                    break
            else:
                terms.append((v, k))
        return _Aff(self.const + other.const, tuple((v, k) for v, k in terms if k))

    __radd__ = __add__

    def __mul__(self, k: int) -> _Aff:
        return _Aff(self.const * k, tuple((v, q * k) for v, q in self.terms if q * k))

    __rmul__ = __mul__

    @property
    def is_const(self) -> bool:
        return not self.terms


def _exact_div(a: _Aff, d: int) -> _Aff:
    """`a` / `d` where `d` divides its constant and every coefficient."""
    if a.const % d or any(k % d for _, k in a.terms):
        raise CompileError(f"lower-graph-to-tile: a streamed-weight chunk does not start at a multiple of {d}")
    return _Aff(a.const // d, tuple((v, k // d) for v, k in a.terms))


def stream_b_view(lw: LoweringContext, v: SSAValue, n: int, tn: int, lead: int = 0) -> SSAValue:
    """HBM row `v` (n elements, contiguous) viewed ``[1]*lead + [tn, n / tn]`` with
    element (r, j) at column ``j*tn + r``: the layout of a streamed-weight GEMV's output."""
    strides, offset = lw.layout(v)
    if strides[-1] != 1 or n % tn:
        raise CompileError("lower-graph-to-tile: a streamed-weight GEMV's row must be contiguous, whole tiles")
    return lw.strided(v, [1] * lead + [tn, n // tn], [n] * lead + [1, tn], offset)


def _idx(x: int | _Aff) -> _Aff:
    return x if isinstance(x, _Aff) else _Aff(x)


@dataclass(frozen=True)
class _Pos:
    """A loop position ``off + 2*i`` (i an affine of loop ivs, `off` static): loops over
    uniform runs are unrolled by two, so the parity of every position is static."""

    i: _Aff
    off: int

    @property
    def aff(self) -> _Aff:
        return self.i * 2 + self.off

    @property
    def par(self) -> int:
        return self.off % 2

    def half(self, delta: int) -> _Aff:
        """(position + delta) // 2."""
        return self.i + (self.off + delta) // 2


def _pos_static(i: int) -> _Pos:
    return _Pos(_Aff(0), i)


# ----------------------------------------------------------------------------- kernel


class BlockedMatmulKernel:
    """Builds the tile-dialect kernel of one matmul for one schedule (see the module
    docstring for the loop nest and the two extension points)."""

    def __init__(self, kb: KernelBuilder, p: MatmulProblem, s: MatmulSchedule, cfg: HardwareConfig, *, rank: int,
                 a_imap: Sequence, b_imap: Sequence, elems: tuple, direct: bool = False, stream_b: bool = False):
        self.kb, self.p, self.s, self.cfg = kb, p, s, cfg
        self.rank = rank
        self.a_imap, self.b_imap = list(a_imap), list(b_imap)
        # `direct` (`direct_a`): A is the row viewed [TK, nk] and there is no identity
        self.direct = direct
        # `stream_b` (a direct kernel only): the row's k-tile is the stationary operand
        # ([TK, 1]) and each [TK, TN] weight tile streams past it, its product a column
        # [TN, 1] of the accumulator: a chunk's output is [TN, w] (element (r, t) is
        # column n0 + t*TN + r), evacuated on TN lanes; the output argument (and the
        # epilogue's) is viewed so (`stream_b_view`)
        self.stream_b = stream_b
        if direct:
            self.argA, self.argB, self.argO = kb.args[:3]
        else:
            self.argA, self.argB, self.argI, self.argO = kb.args[:4]  # a fused kernel has more
        ea, eb, eo = elems
        self.ea, self.eb, self.eo = ea, eb, eo
        self.TNL = s.w * p.TN
        self.widths = chunk_widths(p, s.w)
        self.nch = len(self.widths)
        self.groups = groups(p, s.g)
        self.KG = len(self.groups)
        self.ksz = [min(p.TK, p.K - kt * p.TK) for kt in range(p.nk)]
        self.ivs: list[SSAValue] = []
        self._cache: dict = {}
        self.n_sites = 0
        self.beta_par = 0
        self.fronted = 0  # R of `front_part` where a step used it
        # work `load_a_rows` leaves for after the current preparation's transposes (`defer`)
        self.deferred: list[Callable[[], None]] = []
        self.chunks_per_batch = self.steps_per_batch = 0
        self._alloc()

    # -- helpers ------------------------------------------------------------------------

    def c(self, v: int) -> SSAValue:
        return self.kb.const(v)

    def ix(self, a: int | _Aff) -> SSAValue:
        a = _idx(a)
        if a.is_const:
            return self.c(a.const)
        key = (id(self.kb.block), a.const, tuple((id(v), k) for v, k in a.terms))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        acc: SSAValue | None = None
        for v, k in a.terms:
            term = v if k == 1 else self.kb.muli(v, self.c(k))
            acc = term if acc is None else self.kb.addi(acc, term)
        if acc is None:  # a non-constant index has terms
            raise CompileError("lower-graph-to-tile: a matmul index without terms")
        if a.const:
            acc = self.kb.addi(acc, self.c(a.const))
        self._cache[key] = acc
        return acc

    def window(self, buf: SSAValue, col: int | _Aff, shape: Sequence[int]) -> SSAValue:
        col = _idx(col)
        full = list(tile_shape(buf))
        if col.is_const and col.const == 0 and list(shape) == full:
            return buf
        return self.kb.add(tile.SubviewOp(buf, self.c(0), self.ix(col), list(shape))).results[0]

    def loop2(self, n: int, body: Callable[[_Aff, int], None]) -> None:
        """body(index, parity of index) for index in 0..n-1, as a loop over pairs."""
        pairs, odd = divmod(n, 2)
        if pairs == 1:
            body(_Aff(0), 0)
            body(_Aff(1), 1)
        elif pairs > 1:
            with self.kb.loop(pairs) as iv:
                base = _Aff.iv(iv) * 2
                body(base, 0)
                body(base + 1, 1)
        if odd:
            body(_Aff(2 * pairs), 0)

    def loop1(self, n: int, body: Callable[[_Aff], None]) -> None:
        if n == 1:
            body(_Aff(0))
        elif n > 1:
            with self.kb.loop(n) as iv:
                body(_Aff.iv(iv))

    def run_positions(self, start: int, n: int, body: Callable[[_Pos], None]) -> None:
        """body(position) for positions start .. start+n-1 (a loop over pairs)."""
        pairs, odd = divmod(n, 2)
        if pairs == 1:
            body(_pos_static(start))
            body(_pos_static(start + 1))
        elif pairs > 1:
            with self.kb.loop(pairs) as iv:
                body(_Pos(_Aff.iv(iv), start))
                body(_Pos(_Aff.iv(iv), start + 1))
        if odd:
            body(_pos_static(start + 2 * pairs))

    def batch_idx(self, imap: Sequence) -> list[SSAValue]:
        return [self.ivs[d] if imap[d] is not None else self.c(0) for d in range(self.rank - 2)]

    # -- buffers ------------------------------------------------------------------------

    def _alloc(self) -> None:
        kb, p, s = self.kb, self.p, self.s
        nb = min(s.nb, p.n_mtiles)
        self.pars = 2 if nb > 1 else 1
        sets = 2 if uses_two_sets(p, s) else 1
        per_par = -(-nb // self.pars)
        TM, TK, TN, TNL = p.TM, p.TK, p.TN, self.TNL
        if self.direct:
            self.ibuf, self.a_nat = [], []
            self.lhsT = [[kb.alloc([TK, p.nk], self.ea, tile.SRAM, "lhsT")]]
        # one identity per A queue, loaded on it once, before every A load (outside the
        # batch loops): a transpose's wait for its A rows then implies the identity
        else:
            self.ibuf = [kb.alloc([TM, TM], self.ea, tile.SRAM, "ident") for _ in s.qa]
            for qi, q in enumerate(s.qa):
                kb.add(tile.LoadOp(self.argI, [self.c(0), self.c(0)], self.ibuf[qi], self.c(TM), self.c(TM), 0, 1,
                                   queue=q))
            self.a_nat = [kb.alloc([TM, p.K], self.ea, tile.SRAM, "a") for _ in range(2)]
            self.lhsT = [[kb.alloc([TK, per_par * p.nk * TM], self.ea, tile.SRAM, "lhsT") for _ in range(self.pars)]
                         for _ in range(sets)]
        self.bset = [[kb.alloc([TK, n * TNL], self.eb, tile.SRAM, "rhs") for _, n in self.groups]
                     for _ in range(s.b_sets)]
        self.obuf = [kb.alloc([TM, TNL], self.eo, tile.SRAM, "out") for _ in range(2)]
        self.acc = [kb.alloc([TM, TNL], f32, tile.ACC, "acc") for _ in range(2)]
        if self.stream_b:
            self.acc_win = [[self.window(self.acc[q], t, [TN, 1]) for t in range(s.w)] for q in range(2)]
        else:
            self.acc_win = [[self.window(self.acc[q], t * TN, [TM, TN]) for t in range(s.w)] for q in range(2)]
        self.true = _bool(kb, True)
        self.false = _bool(kb, False)

    # -- extension points ---------------------------------------------------------------

    def load_a_rows(self, dst: SSAValue, m0: SSAValue, k0: SSAValue, ms: int, cols: int, queue: int) -> None:
        """Natural-layout A rows m0..m0+ms, columns k0..k0+cols, into SRAM `dst`."""
        self.kb.add(tile.LoadOp(self.argA, [*self.batch_idx(self.a_imap), m0, k0], dst, self.c(ms), self.c(cols),
                                self.rank - 2, self.rank - 1, queue=queue))

    def load_a_direct(self, dst: SSAValue) -> None:
        """A direct kernel's row into `dst` (``[TK, nk]``, partition r holding elements
        ``r*nk ..``). Default: one `tile.load` of the A argument (the row viewed so)."""
        p = self.p
        self.kb.add(tile.LoadOp(self.argA, [self.c(0), self.c(0)], dst, self.c(p.TK), self.c(p.nk), 0, 1,
                                queue=self.s.qa[0]))

    def evacuate(self, acc: SSAValue, parity: int, m0: SSAValue, n0: SSAValue, ms: int, ns: int) -> None:
        """One finished ms x ns accumulator tile -> output rows m0.., columns n0..."""
        out = self.obuf[parity]
        self.kb.add(tile.UnaryOp("copy", acc, out, self.c(ms), self.c(ns)))
        self.kb.add(tile.StoreOp(out, self.argO, [*self.ivs, m0, n0], self.c(ms), self.c(ns),
                                 self.rank - 2, self.rank - 1))

    def tile_done(self, q: int, ms: int, n0: _Aff, cols: list[int]) -> None:
        """Matmuls added to accumulator `q` (ms rows; TN-column blocks of `cols` columns
        from output column n0) after its k-tiles, before its evacuation. Default: none."""

    def loads_a_rows(self) -> bool:
        """Whether `load_a_rows` loads the rows from A (any row range: the first m-tile's
        may load in pieces), not a producer that writes whole m-tiles."""
        return True

    # -- pieces -------------------------------------------------------------------------

    def load_item_rows(self, u: _Aff, u_par: int, ms: int) -> None:
        qi = u_par % len(self.s.qa)
        self.load_a_rows(self.a_nat[u_par], self.ix(u * self.p.TM), self.c(0), ms, self.p.K, self.s.qa[qi])

    def load_first_rows(self, u_par: int, ms: int) -> None:
        """The first m-tile's A rows, which the first matmuls wait for: in row pieces, one
        on each queue that loads A or B (`first_rows_queues`), each ahead of that queue's
        first B loads, so they land at HBM's full rate rather than sharing it with the
        first chunks' B loads (an A-row producer, `load_a_rows` overridden, loads whole).
        A short first m-tile with a 2-byte weight (`first_rows_whole`: decode at batch
        8 / 32) loads whole: its pieces delay each queue's first B group."""
        queues = first_rows_queues(self.s, ms)
        if len(queues) == 1 or first_rows_whole(self.p) or not first_rows_in_pieces(self.p) \
                or not self.loads_a_rows():
            self.load_item_rows(_Aff(0), u_par, ms)
            self.run_deferred()  # the first transposes read these rows
            return
        dst = self.a_nat[u_par]
        for r, q in enumerate(queues):
            r0, r1 = r * ms // len(queues), (r + 1) * ms // len(queues)
            win = self.kb.add(tile.SubviewOp(dst, self.c(r0), self.c(0), [self.p.TM - r0, self.p.K])).results[0]
            self.load_a_rows(win, self.c(r0), self.c(0), r1 - r0, self.p.K, q)

    def defer(self, work: Callable[[], None]) -> None:
        """Emit `work` (vector work of `load_a_rows` on rows just loaded: a fused
        prologue) after the transposes of the preparation in progress rather than now:
        the engines run their queues in order, so work emitted with the next m-tile's
        loads would hold the current m-tile's transpose copies (and the matmuls waiting
        for them) behind it. Rows loaded for a preparation are transposed in a later one
        (the first m-tile's excepted: `load_first_rows` emits its work at once)."""
        self.deferred.append(work)

    def run_deferred(self) -> None:
        for work in self.deferred:
            work()
        self.deferred.clear()

    def site_acc(self) -> list[SSAValue]:
        """A pair of accumulator tiles private to one transposing place of the kernel."""
        p = self.p
        return [self.kb.add_entry(tile.AllocOp(tile.onchip_type([p.TK, p.TM], f32, tile.ACC),
                                                f"acc_t{self.n_sites}_{i}"))
                for i in range(2)]

    def transpose(self, kt: _Aff, kt_par: int, ksz: int, a_buf: SSAValue, u_par: int, ms: int, dst: SSAValue,
                  dst_col: _Aff, acc_t: list[SSAValue]) -> None:
        """One k-tile of a natural-layout A m-tile -> its lhsT columns."""
        p = self.p
        a_win = self.window(a_buf, kt * p.TK, [p.TM, ksz])
        t = acc_t[kt_par]
        ident = self.ibuf[u_par % len(self.s.qa)]
        self.kb.add(tile.MatmulOp(a_win, ident, t, self.c(ksz), self.c(ms), self.c(ms), self.false))
        self.kb.add(tile.UnaryOp("copy", t, self.window(dst, dst_col + kt * p.TM, [p.TK, p.TM]),
                                 self.c(ksz), self.c(ms)))

    def transpose_wide(self, kt0: _Aff, n: int, a_buf: SSAValue, u_par: int, dst: SSAValue, dst_col: _Aff,
                       par: int) -> None:
        """k-tiles kt0 .. kt0+n-1 of a full natural-layout A m-tile -> its lhsT columns
        through output accumulator `par` (idle in a block's prologue): n transposes side
        by side, one vector copy (`prologue_group`)."""
        p = self.p
        acc = self.acc[par]
        ident = self.ibuf[u_par % len(self.s.qa)]
        for i in range(n):
            a_win = self.window(a_buf, (kt0 + i) * p.TK, [p.TM, p.TK])
            self.kb.add(tile.MatmulOp(a_win, ident, self.window(acc, i * p.TM, [p.TK, p.TM]), self.c(p.TK),
                                      self.c(p.TM), self.c(p.TM), self.false))
        self.kb.add(tile.UnaryOp("copy", self.window(acc, 0, [p.TK, n * p.TM]),
                                 self.window(dst, dst_col + kt0 * p.TM, [p.TK, n * p.TM]), self.c(p.TK),
                                 self.c(n * p.TM)))

    def load_b_chunk(self, bp: int, n0: _Aff, width: int, first: bool = False, chunk: _Aff | None = None) -> None:
        """The chunk's B tiles into B set `bp`, group by group. In the kernel's first
        chunk (`first`, with `stagger`) the first tile of the i-th queue loads in i+1
        row pieces, so the queues' fixed DMA latencies fall at different times from
        then on (equal transfers sharing HBM otherwise start and end together).
        Pre-tiled B (`chunk`: the chunk's index) loads each group with one transfer."""
        p, s = self.p, self.s
        if s.pretiled:
            if chunk is None:
                raise CompileError("lower-graph-to-tile: a pre-tiled B chunk needs its index")
            self._load_b_pretiled(bp, chunk, first)
            return
        n0s = self.ix(n0)
        for g, (kt0, n) in enumerate(self.groups):
            q = s.qb[(bp * self.KG + g) % len(s.qb)]
            buf = self.bset[bp][g]
            short = kt0 + n == p.nk and self.ksz[-1] != p.TK
            full = n - 1 if short else n

            def one(i: _Aff, ksz: int, buf: SSAValue = buf, q: int = q, kt0: int = kt0, pieces: int = 1) -> None:
                k0 = (i + kt0) * p.TK
                win = self.window(buf, i * self.TNL, [p.TK, self.TNL])
                for r0, r1, dst in self._row_pieces(win, ksz, pieces):
                    self.kb.add(tile.LoadOp(self.argB, [*self.batch_idx(self.b_imap), self.ix(k0 + r0), n0s],
                                            dst, self.c(r1 - r0), self.c(width), self.rank - 2, self.rank - 1,
                                            queue=q))

            split = self._stagger_pieces(g, first)
            if split > 1 and full >= 1:
                one(_Aff(0), p.TK, pieces=split)
                self.loop1(full - 1, lambda i: one(i + 1, p.TK))
            else:
                self.loop1(full, lambda i: one(i, p.TK))
            if short:
                one(_Aff(n - 1), self.ksz[-1], pieces=split if full == 0 else 1)

    def _stagger_pieces(self, g: int, first: bool) -> int:
        """Row pieces of group g's first tile: i+1 on the i-th B queue in the kernel's
        first chunk with `stagger` (the queues' fixed latencies then fall apart), else 1."""
        s = self.s
        return 1 + g if first and s.stagger and g < len(s.qb) else 1

    def _row_pieces(self, buf: SSAValue, rows: int, pieces: int) -> Iterator[tuple[int, int, SSAValue]]:
        """(first row, end row, destination) of `rows` rows of `buf` loaded in `pieces`
        near-equal pieces (a subview from each piece's first row on, made as it is used)."""
        cols = tile_shape(buf)[1]
        for r in range(pieces):
            r0, r1 = r * rows // pieces, (r + 1) * rows // pieces
            if r1 == r0:
                continue
            yield r0, r1, buf if pieces == 1 else self.kb.add(
                tile.SubviewOp(buf, self.c(r0), self.c(0), [self.p.TK - r0, cols])).results[0]

    def _load_b_pretiled(self, bp: int, chunk: _Aff, first: bool) -> None:
        """Group G of chunk c is rows ``(c*nG + G)*TK ..`` of the pre-tiled B
        (`ir/weight_layout.py`), all ``g*TNL`` columns: its group buffer's image."""
        p, s = self.p, self.s
        cols = s.g * self.TNL
        for g in range(self.KG):
            q = s.qb[(bp * self.KG + g) % len(s.qb)]
            buf = self.bset[bp][g]
            row0 = chunk * (self.KG * p.TK) + g * p.TK
            for r0, r1, dst in self._row_pieces(buf, p.TK, self._stagger_pieces(g, first)):
                self.kb.add(tile.LoadOp(self.argB, [self.ix(row0 + r0), self.c(0)], dst, self.c(r1 - r0),
                                        self.c(cols), 0, 1, queue=q))

    # -- a step: one m-tile on one chunk --------------------------------------------------

    def step(self, b: _Pos, j: _Pos, ms: int, m_row: _Aff, n0: _Aff, width: int, bp: int, q: int,
             item: Item | None) -> None:
        p, s = self.p, self.s
        nb = s.nb
        set_here = b.par if len(self.lhsT) == 2 else 0
        lhs = self.lhsT[set_here][j.par if self.pars == 2 else 0]
        lhs_col = j.half(0) * (p.nk * p.TM) if self.pars == 2 else _Aff(0)
        prep = None
        if item is not None:
            # the prepared m-tile: block b + db, m-tile j + dj, global index u
            ib_par = (b.par + item.db) % 2
            ij_par = (j.par + item.dj) % 2
            u = (b.aff + item.db) * nb + j.aff + item.dj
            u_par = (self.beta_par * p.n_mtiles + ib_par * nb + ij_par) % 2
            if item.next_ms is not None:
                self.load_item_rows(u + 1, 1 - u_par, item.next_ms)
            dst = self.lhsT[ib_par if len(self.lhsT) == 2 else 0][ij_par if self.pars == 2 else 0]
            dst_col = j.half(item.dj) * (p.nk * p.TM) if self.pars == 2 else _Aff(0)
            prep = (self.a_nat[u_par], u_par, item.ms, dst, dst_col, self.site_acc())
            self.n_sites += 1
        wc = -(-width // p.TN)
        cs = [min(p.TN, width - t * p.TN) for t in range(wc)]
        front = self.front_part() if prep is not None and self.deferred else None
        if front is not None:
            self.fronted = front[1]

        def kt_body(g: int, i: _Aff, kt: _Aff, kt_par: int, ksz: int) -> None:
            if self.direct:
                lwin = self.window(lhs, kt, [p.TK, 1])
            else:
                lwin = self.window(lhs, lhs_col + kt * p.TM, [p.TK, p.TM])
            if kt.is_const:
                acc_flag = self.true if kt.const else self.false
            elif kt.const > 0 and all(k > 0 for _, k in kt.terms):
                acc_flag = self.true
            else:
                acc_flag = self.kb.ne_zero(self.ix(kt))
            for t in range(wc):
                rwin = self.window(self.bset[bp][g], i * self.TNL + t * p.TN, [p.TK, p.TN])
                if self.stream_b:  # the weight tile moves, the row's k-tile is stationary
                    self.kb.add(tile.MatmulOp(rwin, lwin, self.acc_win[q][t], self.c(cs[t]), self.c(ksz), self.c(1),
                                              acc_flag))
                    continue
                self.kb.add(tile.MatmulOp(lwin, rwin, self.acc_win[q][t], self.c(ms), self.c(ksz), self.c(cs[t]),
                                          acc_flag))
            if prep is None:
                return
            a_buf, u_par, ims, dst, dst_col, acc_t = prep
            if front is None:
                self.transpose(kt, kt_par, ksz, a_buf, u_par, ims, dst, dst_col, acc_t)
            elif g < front[0]:  # k-tiles R*kt .. R*kt + R-1 (`front_part`)
                for d in range(front[1]):
                    self.transpose(kt * front[1] + d, d % 2, p.TK, a_buf, u_par, ims, dst, dst_col, acc_t)

        for g, (kt0, n) in enumerate(self.groups):
            if front is not None and g == front[0]:
                self.run_deferred()  # the next m-tile's prologue, under this step's last matmuls
            short = kt0 + n == p.nk and self.ksz[-1] != p.TK
            full = n - 1 if short else n
            if prep is not None:
                self.loop2(full, lambda i, v, g=g, kt0=kt0: kt_body(g, i, i + kt0, (kt0 + v) % 2, p.TK))
            else:
                self.loop1(full, lambda i, g=g, kt0=kt0: kt_body(g, i, i + kt0, 0, p.TK))
            if short:
                kt_body(g, _Aff(n - 1), _Aff(p.nk - 1), (p.nk - 1) % 2, self.ksz[-1])
        self.run_deferred()
        if not self.stream_b:
            self.tile_done(q, ms, n0, cs)
        if self.stream_b:  # [TN, wc]: column t holds output columns n0 + t*TN ..
            self.evacuate(self.window(self.acc[q], 0, [p.TN, wc]), q, self.c(0), self.ix(_exact_div(n0, p.TN)),
                          p.TN, wc)
            return
        self.evacuate(self.acc[q] if width == self.TNL else self.window(self.acc[q], 0, [p.TM, width]), q,
                      self.ix(m_row), self.ix(n0), ms, width)

    def front_part(self) -> tuple[int, int] | None:
        """With a prologue's vector work to run in a step (a fused norm: `defer`), (the B
        groups of the step's first part, R): each k-tile of the first nk / R transposes R
        k-tiles of the m-tile being prepared, so the work runs under the remaining
        k-tiles' matmuls; None (one transpose a k-tile, the work after them) where no
        part ends on a group boundary or a k-tile is short.

        The engines run their queues in order and a transposing place has two
        accumulator tiles, so a transpose waits for the vector copy of the one two
        before it: a prologue queued on the vector engine among the copies (or after
        the last one, ahead of the next step's) stalls the matrix engine for as long as
        it runs. Queued after the step's last copy, early in the step, it runs while the
        matrix engine does matmuls that wait for no vector work (Llama 1B q/k/v with its
        RMS norm, 512 tokens, cloud: 403,993 -> 378,605 cycles; 2,048 tokens: 1,501,146 -> 1,409,914)."""
        p = self.p
        if self.ksz[-1] != p.TK or self.direct:
            return None
        firsts = [kt0 for kt0, _ in self.groups]
        for r in (4, 2):
            if p.nk % r == 0 and p.nk // r in firsts[1:]:
                return firsts.index(p.nk // r), r
        return None

    def prep_only(self, b: _Pos, item: Item) -> None:
        """Prepare one m-tile with no matmuls to hide it behind (a block's prologue)."""
        p, nb = self.p, self.s.nb
        ib_par = (b.par + item.db) % 2
        j = item.dj  # relative to m-tile 0 of the block
        u = (b.aff + item.db) * nb + j
        u_par = (self.beta_par * p.n_mtiles + ib_par * nb + j) % 2
        if item.next_ms is not None:
            self.load_item_rows(u + 1, 1 - u_par, item.next_ms)
        dst = self.lhsT[ib_par if len(self.lhsT) == 2 else 0][j % 2 if self.pars == 2 else 0]
        dst_col = _Aff((j // 2) * p.nk * p.TM) if self.pars == 2 else _Aff(0)
        full = p.nk - (1 if self.ksz[-1] != p.TK else 0)
        a_buf = self.a_nat[u_par]
        acc_t = self.site_acc()
        self.n_sites += 1
        gw = prologue_group(p, self.s) if item.ms == p.TM else 1
        wide = full // gw * gw if gw > 1 else 0
        if wide:
            self.loop2(wide // gw, lambda gi, v: self.transpose_wide(gi * gw, gw, a_buf, u_par, dst, dst_col, v))
        self.loop2(full - wide, lambda kt, v: self.transpose(kt + wide, (wide + v) % 2, p.TK, a_buf, u_par, item.ms,
                                                             dst, dst_col, acc_t))
        if full < p.nk:
            self.transpose(_Aff(p.nk - 1), (p.nk - 1) % 2, self.ksz[-1], a_buf, u_par, item.ms, dst, dst_col, acc_t)
        self.run_deferred()

    # -- chunks and blocks --------------------------------------------------------------

    def chunk(self, b: _Pos, plan: BlockPlan, c: _Pos, n0: _Aff, width: int, items: tuple, first: bool) -> None:
        p, s = self.p, self.s
        nch, nb = self.nch, s.nb
        # global chunk / step counters continue across batch indices (consecutive batch
        # indices have opposite parities), so the next batch's loads prefetch too
        bp = (self.beta_par * self.chunks_per_batch + b.par * nch + c.par) % 2 if s.b_sets == 2 else 0
        self.load_b_chunk(bp, n0, width, first, c.aff)
        msz = plan.msz
        nbb = len(msz)
        keys = [(msz[j], items[j] if j < len(items) else None) for j in range(nbb)]
        m_base = b.aff * (nb * p.TM)
        for j0, j1 in runs(keys):
            ms, item = keys[j0]

            def one(j: _Pos, ms: int = ms, item: Item | None = item) -> None:
                q = (self.beta_par * self.steps_per_batch + b.par * (nch * nb % 2) + c.par * (nbb % 2) + j.par) % 2
                self.step(b, j, ms, m_base + j.aff * p.TM, n0, width, bp, q, item)

            self.run_positions(j0, j1 - j0, one)

    def block(self, b: _Pos, plan: BlockPlan) -> None:
        for item in plan.prologue if not self.direct else ():
            self.prep_only(b, item)
        widths = self.widths
        first_block = b.i.is_const and b.off == 0 and self.s.stagger
        keys = [(widths[c], plan.chunk_items[c] if c < len(plan.chunk_items) else (), first_block and c == 0)
                for c in range(self.nch)]
        for c0, c1 in runs(keys):
            width, items, first = keys[c0]
            n_start = sum(widths[:c0])
            # chunks of one run have one width: n0 = n_start + (c - c0) * width
            self.run_positions(c0, c1 - c0, lambda c, width=width, items=items, first=first, c0=c0, n_start=n_start:
                               self.chunk(b, plan, c, (c.aff + (-c0)) * width + n_start, width, items, first))

    def body(self, beta_par: int = 0) -> None:
        """One batch index (of parity `beta_par`)."""
        p, s = self.p, self.s
        self.beta_par = beta_par
        plans = plan_blocks(p, s, self.nch)
        if self.direct:
            # the row, partition r holding elements r*nk .. r*nk + nk - 1 (the view [TK, nk])
            if len(plans) != 1 or any(plans[0].chunk_items):
                raise CompileError("lower-graph-to-tile: a direct-A matmul has one m-tile")
            self.load_a_direct(self.lhsT[0][0])
            self.block(_pos_static(0), plans[0])
            return
        first = plans[0].prologue[0]
        self.load_first_rows(beta_par * p.n_mtiles % 2, first.ms)
        self.block(_pos_static(0), plans[0])
        end = 1
        while end < len(plans) and plans[end] == plans[1]:
            end += 1
        if end > 1:
            self.run_positions(1, end - 1, lambda b: self.block(b, plans[1]))
        for b in range(end, len(plans)):
            self.block(_pos_static(b), plans[b])

    def emit(self, batch: Sequence[int]) -> None:
        """The kernel body inside loops over the batch dimensions; the innermost one is
        unrolled by two, so consecutive batch indices alternate B sets, accumulators
        and A buffers (one batch's loads run ahead during the previous one)."""
        dims = list(batch)
        blks = blocks(self.p, self.s.nb)
        self.chunks_per_batch = len(blks) * self.nch
        self.steps_per_batch = self.nch * sum(len(b) for b in blks)
        if not dims:
            self.body(0)
        else:
            def rec(d: int) -> None:
                if d == len(dims) - 1:
                    def inner(pos: _Pos) -> None:
                        self.ivs.append(self.ix(pos.aff))
                        self.body(pos.par)
                        self.ivs.pop()

                    if batch_unrolled(self.p, self.s):
                        self.run_positions(0, dims[d], inner)
                    else:
                        with self.kb.loop(dims[d]) as iv:
                            self.ivs.append(iv)
                            self.body(0)
                            self.ivs.pop()
                    return
                with self.kb.loop(dims[d]) as iv:
                    self.ivs.append(iv)
                    rec(d + 1)
                    self.ivs.pop()

            rec(0)
        # the footprint (matmul_schedule.footprint) counted the same transposing places
        want = 0 if self.direct else prep_sites(self.p, self.s)
        assert self.n_sites == want, (self.n_sites, want)
        if self.fronted:
            remarks.emit("lower-graph-to-tile", "passed", lambda: (
                f"kernel {self.kb.func.sym_name.data}: the A prologue's vector work runs under each step's last "
                f"{self.p.nk - self.p.nk // self.fronted} k-tiles of matmuls (its first {self.p.nk // self.fronted} "
                f"transpose {self.fronted} k-tiles each of the m-tile being prepared)"), self.kb.loc)


# ----------------------------------------------------------------------------- entry


def tile_shape(v: SSAValue) -> tuple[int, ...]:
    return shape_of(v.type)


def lower_matmul_blocked(lw: LoweringContext, op: Operation, loc: str) -> bool:
    from tilecc.passes.graph_to_tile.shapes import dense_attr, elem_of

    got = problem_of(lw, op)
    if got is None:
        return False
    problem, (res, out_shape, a, b, M, K, N) = got
    sched = choose_schedule(lw, problem)
    if sched is None:
        return False
    ea, eb, eo = elem_of(a.type), elem_of(b.type), elem_of(res.type)
    TM = problem.TM
    direct = direct_a(lw, problem, sched, a)
    B = b_operand(lw, b, problem, sched, out_shape[:-2], interleaved=direct)
    out = lw.hbm(out_shape, eo)
    if direct:
        A = Operand(lw.view(lw.materialise(a), (problem.TK, problem.nk)), [0, 1])
        args = [A.value, B.value, out]
        remarks.emit("lower-graph-to-tile", "passed",
                     lambda: f"matmul 1x{K}x{N}: the A row loads straight into the partitions ({problem.nk} "
                             f"contiguous elements each, the weight's rows interleaved to match): no transposes")
    else:
        A = lw.aligned_batch(a, out_shape[:-2], (M, K))
        ident = lw.hbm([TM, TM], ea, value=dense_attr(np.eye(TM, dtype=np.float32), ea, [TM, TM]))
        args = [A.value, B.value, ident, out]
    kb = KernelBuilder(lw.kernel_name("matmul"), [v.type for v in args], loc)
    kernel = BlockedMatmulKernel(kb, problem, sched, lw.cfg, rank=len(out_shape), a_imap=A.imap, b_imap=B.imap,
                                 elems=(ea, eb, eo), direct=direct)
    kernel.emit(out_shape[:-2])
    lw.launch(kb, args)
    lw.values[res] = out
    return True


def _bool(kb: KernelBuilder, value: bool) -> SSAValue:
    return kb.add_entry(arith.ConstantOp(IntegerAttr(int(value), i1)))

