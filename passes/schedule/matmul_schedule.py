"""The -O2 matmul kernel's problem description and schedule space.

`MatmulProblem` is what a `graph.matmul` asks for (sizes, batch broadcasting, element
types) together with the tile sizes the target imposes; `MatmulSchedule` is one point
of the kernel's parameter space (see `passes/graph_to_tile/matmul.py` for the loop nest each
parameter shapes). `footprint` gives the SRAM / accumulator bytes per partition a
schedule needs (the same 64-byte aligned sum `plan-sram` computes) and `candidates`
lists every schedule that fits, in a fixed order (no dict or set iteration), so both
the cost model's choice and an autotuning search are deterministic.

This module knows the kernel's buffers but not its timing: `passes/schedule/cost_model.py`
estimates cycles, `passes/schedule/autotune.py` measures them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import MAX_WAITS

ALIGN = 64  # plan-sram aligns every buffer to 64 bytes
ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "i8": 1, "f8e4m3": 1}  # one-byte: B only (weights)
MAX_BLOCK = 16  # m-tiles per block considered by `candidates`
MAX_WIDTH = 16  # TN-column sub-tiles per n-chunk considered by `candidates`


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class MatmulProblem:
    """out[batch..., M, N] = A[batch..., M, K] @ B[batch..., K, N] on one target.

    `a_batch` / `b_batch` say, per output batch dimension, whether the operand walks it
    (False: broadcast). Element types are "f32", "bf16" or "f16".
    """

    M: int
    K: int
    N: int
    batch: tuple[int, ...]
    a_batch: tuple[bool, ...]
    b_batch: tuple[bool, ...]
    a_dtype: str
    b_dtype: str
    o_dtype: str
    # tile sizes of the target: TM output rows (accumulator partitions), TK contraction
    # rows (array rows), TN output columns of one matmul (array columns)
    TM: int
    TK: int
    TN: int
    # a fused epilogue / A-row producer (passes/graph_to_tile/fused_matmul.py): the vector work
    # of one evacuation per output element (sum of op cost x inputs; 0: a plain copy)
    # and its instruction count; the vector work producing one m-tile's A rows per A
    # element and its instructions (0: A rows are loaded); SRAM bytes per partition of
    # their buffers, fixed and per column of the chunk width TNL
    evac_cost: float = 0.0
    evac_ops: int = 1
    prep_cost: float = 0.0
    prep_ops: int = 0
    fused_sram: int = 0
    fused_sram_per_col: int = 0
    fused_ops: str = ""  # the fused group's ops and shapes (part of the cache signature)
    # a bias row added on the matrix engine (`fused_matmul.py`: one K=1 matmul of a
    # ones row by the bias per TN-column block of every output tile, instead of a
    # vector add in the evacuation)
    bias_mm: bool = False
    # A is written by an earlier kernel of the program and B is a weight: the first A
    # rows load whole on the A queue (`first_rows_in_pieces`), so the B queues prefetch
    # the weights while the earlier kernel still runs
    a_produced: bool = False
    # B is a constant weight (no batch): the compiler may store it in HBM pre-tiled
    # (`MatmulSchedule.pretiled`, `pretile_ok`)
    b_weight: bool = False

    @staticmethod
    def make(
        cfg: HardwareConfig, M: int, K: int, N: int, *, batch: Sequence[int] = (),
        a_batch: Sequence[bool] | None = None, b_batch: Sequence[bool] | None = None,
        a_dtype: str = "bf16", b_dtype: str = "bf16", o_dtype: str | None = None,
    ) -> MatmulProblem:
        batch = tuple(int(x) for x in batch)
        return MatmulProblem(
            M, K, N, batch,
            tuple(a_batch) if a_batch is not None else (True,) * len(batch),
            tuple(b_batch) if b_batch is not None else (True,) * len(batch),
            a_dtype, b_dtype, o_dtype or a_dtype,
            TM=min(cfg.accumulator.partitions, cfg.sram.partitions, cfg.matrix.rows, cfg.matrix.cols),
            TK=min(cfg.matrix.rows, cfg.sram.partitions),
            TN=min(cfg.matrix.cols, cfg.accumulator.bytes_per_partition // 4),
        )

    @property
    def nk(self) -> int:
        return _cdiv(self.K, self.TK)

    @property
    def n_mtiles(self) -> int:
        return _cdiv(self.M, self.TM)

    @property
    def batches(self) -> int:
        n = 1
        for x in self.batch:
            n *= x
        return n

    @property
    def ia(self) -> int:
        return ITEMSIZE[self.a_dtype]

    @property
    def ib(self) -> int:
        return ITEMSIZE[self.b_dtype]

    @property
    def io(self) -> int:
        return ITEMSIZE[self.o_dtype]

    def signature(self) -> dict:
        """What identifies the kernel for a schedule cache (the tile sizes follow from
        the config, which the cache keys separately)."""
        return {
            "M": self.M, "K": self.K, "N": self.N, "batch": list(self.batch),
            "a_batch": list(self.a_batch), "b_batch": list(self.b_batch),
            "dtypes": [self.a_dtype, self.b_dtype, self.o_dtype], "layout": "A[M,K] row-major, B[K,N] row-major",
            "fused": [self.evac_cost, self.evac_ops, self.prep_cost, self.prep_ops, self.fused_sram,
                      self.fused_sram_per_col, self.fused_ops, *(["bias_mm"] if self.bias_mm else []),
                      *(["a_produced"] if self.a_produced else [])],
            **({"b_weight": True} if self.b_weight else {}),
        }


@dataclass(frozen=True)
class MatmulSchedule:
    """One point of the -O2 kernel's parameter space.

    - `nb`: m-tiles (TM rows each) per block; the block's A^T stays in SRAM (`lhsT`)
      while every n-chunk of B streams past it, so B is read once per block.
    - `w`: TN-column sub-tiles per n-chunk (the chunk is TNL = w*TN columns wide: one
      B load is TK x TNL, one accumulator tile TM x TNL, one store TM x TNL).
    - `g`: k-tiles per B group. A chunk's B tiles live in ceil(nk / g) group buffers;
      each group's loads run on one DMA queue (so a matmul waits on one queue) and the
      matmuls of a group wait for the whole group.
    - `b_sets`: 2 double-buffers the B chunk (the next chunk loads while this one is
      used), 1 loads a chunk only once the previous one is consumed.
    - `pipelined`: two lhsT sets; the next block's A rows are loaded, transposed and
      copied during this block's first n-chunk. Without it a block's first m-tile is
      prepared before the block (its matmuls wait) and the others during its first chunk.
    - `qb` / `qa`: DMA queues of the B groups and of the A loads (round robin).
    - `pretiled`: B is a weight stored in HBM in the kernel's tile order
      (`ir/weight_layout.py`): each B group of a chunk, ``TK x g*TNL``, is one
      contiguous block, loaded by one transfer whose rows are ``g*TNL`` elements
      contiguous per partition (g transfers of TNL-element rows otherwise). Only where
      `pretile_ok`.
    """

    nb: int
    w: int
    g: int
    b_sets: int = 2
    pipelined: bool = True
    qb: tuple[int, ...] = (0,)
    qa: tuple[int, ...] = (0,)
    stagger: bool = False
    pretiled: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["qb"], d["qa"] = list(self.qb), list(self.qa)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> MatmulSchedule:
        return MatmulSchedule(
            nb=int(d["nb"]), w=int(d["w"]), g=int(d["g"]), b_sets=int(d["b_sets"]),
            pipelined=bool(d["pipelined"]), qb=tuple(int(q) for q in d["qb"]),
            qa=tuple(int(q) for q in d["qa"]), stagger=bool(d["stagger"]),
            pretiled=bool(d.get("pretiled", False)),
        )

    def short(self) -> str:
        return (f"nb={self.nb} w={self.w} g={self.g} sets={self.b_sets} "
                f"{'pipe' if self.pipelined else 'serial'} qb={list(self.qb)} qa={list(self.qa)}"
                f"{' stagger' if self.stagger else ''}{' pretiled' if self.pretiled else ''}")


def pretile_ok(p: MatmulProblem, w: int, g: int) -> bool:
    """Whether B may be stored pre-tiled for chunks of w*TN columns and groups of g
    k-tiles: a weight without batch, whole k-tiles and groups (K a multiple of g*TK) and
    equal chunks (N a multiple of w*TN). Every m-block reads the same chunks, so a
    weight streamed once (decode) or once per block (a large GEMM, whose first chunks
    must land before its matmuls can start) gets the same longer, fewer transfers."""
    return p.b_weight and not p.batch and p.K % (g * p.TK) == 0 and p.N % (w * p.TN) == 0


def groups(p: MatmulProblem, g: int) -> list[tuple[int, int]]:
    """(first k-tile, k-tiles) of each B group."""
    return [(k, min(g, p.nk - k)) for k in range(0, p.nk, g)]


def group_sizes(p: MatmulProblem, g: int) -> tuple[int, int, int]:
    """`groups` counted, not listed: (groups, k-tiles of each but the last, k-tiles of the
    last): the schedule search sums over the groups of every candidate."""
    nk = p.nk
    n = _cdiv(nk, g)
    return n, g, nk - (n - 1) * g


def chunk_widths(p: MatmulProblem, w: int) -> list[int]:
    """Column counts of the n-chunks: at most w*TN each, balanced (the TN-column tiles
    split as evenly as possible, the larger chunks first), the last one short by
    whatever N lacks of a whole tile."""
    ncols = _cdiv(p.N, p.TN)
    nch = _cdiv(ncols, w)
    base, extra = divmod(ncols, nch)
    widths = [(base + (c < extra)) * p.TN for c in range(nch)]
    widths[-1] -= ncols * p.TN - p.N
    return widths


def blocks(p: MatmulProblem, nb: int) -> list[list[int]]:
    """Row counts of the m-tiles of each block: full blocks of nb TM-row tiles, then
    the rest (its last tile possibly short)."""
    out, row = [], 0
    while row < p.M:
        tiles = []
        while len(tiles) < nb and row < p.M:
            tiles.append(min(p.TM, p.M - row))
            row += tiles[-1]
        out.append(tiles)
    return out


@dataclass(frozen=True)
class Item:
    """Preparing one m-tile, relative to the block (db) and m-tile (dj) of the step
    holding it; `next_ms` is the size of the following m-tile (whose A rows this step
    loads), None for the last m-tile."""

    db: int
    dj: int
    ms: int
    next_ms: int | None


@dataclass(frozen=True)
class BlockPlan:
    msz: tuple[int, ...]
    prologue: tuple[Item, ...]  # preparations before the block's first chunk
    chunk_items: tuple[tuple[Item | None, ...], ...]  # chunk c < len: item of each step


def plan_blocks(p: MatmulProblem, s: MatmulSchedule, nch: int) -> list[BlockPlan]:
    """What each block prepares where: the first m-tile of a block before its first
    chunk (`prologue`) and, per step of its first chunk(s), the m-tile it transposes
    (see `lower_matmul`). Middle blocks get equal plans (one loop in the kernel)."""
    return list(_plans(p, s.nb, uses_two_sets(p, s), nch))


@lru_cache(maxsize=4096)
def _plans(p: MatmulProblem, nb: int, two: bool, nch: int) -> tuple[BlockPlan, ...]:
    s = MatmulSchedule(nb, 1, 1)
    blks = blocks(p, nb)
    nblk = len(blks)
    nmt = p.n_mtiles

    def ms_of(u: int) -> int:
        return min(p.TM, p.M - u * p.TM)

    def item(b_here: int, j_here: int, b: int, j: int) -> Item:
        u = b * s.nb + j
        return Item(b - b_here, j - j_here, ms_of(u), ms_of(u + 1) if u + 1 < nmt else None)

    plans = []
    for b, msz in enumerate(blks):
        prologue: list[Item] = []
        chunks: list[tuple[Item | None, ...]] = []
        own = tuple(item(b, j, b, j + 1) if j + 1 < len(msz) else None for j in range(len(msz)))
        if not two:
            prologue.append(item(b, 0, b, 0))
            chunks.append(own)
        elif b == 0:
            prologue.append(item(0, 0, 0, 0))
            chunks.append(own)
            if nblk > 1:
                nxt = tuple(item(0, j, 1, j) if j < len(blks[1]) else None for j in range(len(msz)))
                if nch > 1:
                    chunks.append(nxt)
        else:
            if b == 1 and nch == 1:  # block 0 had no second chunk to prepare block 1 in
                prologue.extend(item(1, 0, 1, j) for j in range(len(msz)))
            if b + 1 < nblk:
                chunks.append(tuple(item(b, j, b + 1, j) if j < len(blks[b + 1]) else None
                                    for j in range(len(msz))))
        while chunks and all(x is None for x in chunks[-1]):
            chunks.pop()
        plan = BlockPlan(tuple(msz), tuple(prologue), tuple(chunks))
        plans.append(plans[-1] if plans and plans[-1] == plan else plan)  # equal plans: one object
    return tuple(plans)


def runs(keys: Sequence) -> list[tuple[int, int]]:
    """[start, end) of the maximal runs of equal consecutive keys."""
    out, i = [], 0
    while i < len(keys):
        j = i + 1
        while j < len(keys) and keys[j] == keys[i]:
            j += 1
        out.append((i, j))
        i = j
    return out


def uses_two_sets(p: MatmulProblem, s: MatmulSchedule) -> bool:
    """Whether the kernel allocates two lhsT sets (pipelining needs a second block)."""
    return s.pipelined and _cdiv(p.M, s.nb * p.TM) > 1


def _calls(n: int) -> int:
    """Static emissions of a body run n times by `run_positions` (a loop over pairs)."""
    pairs, odd = divmod(n, 2)
    return (2 if pairs else 0) + odd


def batch_unrolled(p: MatmulProblem, s: MatmulSchedule) -> bool:
    """Whether the kernel unrolls its innermost batch loop by two: when one batch index
    holds an odd number of chunks (two B sets), steps (accumulators) or m-tiles (A
    buffers), so the next index alternates them (its loads then run ahead)."""
    if not p.batch or p.batch[-1] == 1:
        return False
    nch = len(chunk_widths(p, s.w))
    blks = blocks(p, s.nb)
    chunks = len(blks) * nch
    steps = nch * sum(len(b) for b in blks)
    return (s.b_sets == 2 and chunks % 2 == 1) or steps % 2 == 1 or p.n_mtiles % 2 == 1


def body_copies(p: MatmulProblem, s: MatmulSchedule) -> int:
    """Static copies of the per-batch body (`BlockedMatmulKernel.emit`)."""
    return _calls(p.batch[-1]) if batch_unrolled(p, s) else 1


def prep_sites(p: MatmulProblem, s: MatmulSchedule) -> int:
    """Static places in the kernel that transpose A (each has its own pair of
    accumulator tiles, so a transpose waits on one vector copy only); mirrors
    `BlockedMatmulKernel.body`."""
    return body_copies(p, s) * _prep_sites(p, s.nb, uses_two_sets(p, s), len(chunk_widths(p, s.w)))


@lru_cache(maxsize=4096)
def _prep_sites(p: MatmulProblem, nb: int, two: bool, nch: int) -> int:
    return _sites(p, nb, two, nch)[0]


@lru_cache(maxsize=4096)
def _sites(p: MatmulProblem, nb: int, two: bool, nch: int, widths: tuple[int, ...] = ()) -> tuple[int, int, int, int]:
    """(transposing places, steps with an item, steps without, chunks) emitted
    statically, mirroring `BlockedMatmulKernel.body` / `block` / `chunk`."""
    plans = _plans(p, nb, two, nch)
    widths = widths or (0,) * nch

    def block_sites(plan: BlockPlan, first: bool) -> tuple[int, int, int, int]:
        prep, with_item, without, chunks = len(plan.prologue), 0, 0, 0
        keys_c = [(widths[c], plan.chunk_items[c] if c < len(plan.chunk_items) else (), first and c == 0)
                  for c in range(nch)]
        for c0, c1 in runs(keys_c):
            calls_c = _calls(c1 - c0)
            chunks += calls_c
            items = keys_c[c0][1]
            keys = [(plan.msz[j], items[j] if j < len(items) else None) for j in range(len(plan.msz))]
            for j0, j1 in runs(keys):
                n = _calls(j1 - j0) * calls_c
                if keys[j0][1] is not None:
                    prep += n
                    with_item += n
                else:
                    without += n
        return prep, with_item, without, chunks

    end = 1
    while end < len(plans) and plans[end] == plans[1]:
        end += 1
    parts = [block_sites(plans[0], True)]
    if end > 1:
        parts += [block_sites(plans[1], False)] * _calls(end - 1)
    parts += [block_sites(pl, False) for pl in plans[end:]]
    prep, with_item, without, chunks = (sum(x[i] for x in parts) for i in range(4))
    return prep, with_item, without, chunks


FIRST_ROWS_QUEUES = MAX_WAITS - 2  # the first A rows' pieces: a transpose also waits for its identity and a copy


def first_rows_queues(s: MatmulSchedule, ms: int) -> list[int]:
    """The queues the first m-tile's A rows load on (`passes/graph_to_tile/matmul.py`,
    `BlockedMatmulKernel.load_first_rows`):
    the first `FIRST_ROWS_QUEUES` B queues, at most one per row. The identity loads on
    the A queue meanwhile; a transpose then waits on these queues, the A queue and the
    vector engine, within the ISA's wait slots."""
    return list(s.qb[:FIRST_ROWS_QUEUES])[:max(ms, 1)]


def first_rows_in_pieces(p: MatmulProblem) -> bool:
    """Whether the first m-tile's A rows may load in pieces ahead of the B loads on the
    B queues (`first_rows_queues`): not when a fused prologue produces them (it loads
    whole rows), nor when an earlier kernel writes A (`a_produced`): the pieces would
    wait for that kernel's stores and hold the B queues' weight loads behind them,
    which could otherwise run during that kernel (gpt2 block c_proj: the block 601k ->
    598k cycles on cloud)."""
    return not (p.prep_ops or p.a_produced)


def first_rows_whole(p: MatmulProblem) -> bool:
    """Whether a short first m-tile (1 < M < TM: decode at batch 8 / 32, one block)
    loads its A rows whole rather than in pieces (`first_rows_queues`). With a 2-byte
    weight the pieces delay each queue's first B group, which the start waits for
    (cloud, M=8, K=2048, bf16: 69,969 cycles whole vs 75,898 in pieces for N=2048);
    with a 1-byte weight the B groups are half as long and the A rows' transfer the
    larger part of the start, which the pieces spread over the queues (int8 weight,
    N=3072: 81,926 in pieces vs 84,335 whole; K=8192: 166,798 vs 174,275)."""
    return 1 < p.M < p.TM and p.ib > 1


def prologue_group(p: MatmulProblem, s: MatmulSchedule) -> int:
    """k-tiles a block's prologue (the preparation of a full m-tile with no matmuls to
    hide behind) transposes side by side into one output accumulator and copies out
    with one vector instruction: the output accumulators (TM x w*TN) are idle before
    the block's first step, and one wide copy costs the vector engine's fixed overhead
    once instead of per k-tile. 1 (a copy per k-tile) when a transposed k-tile (TK
    partitions) does not fit the accumulator's TM partitions."""
    if p.TK > p.TM:
        return 1
    return max(1, min(s.w * p.TN // p.TM, p.K // p.TK))


def kernel_size(p: MatmulProblem, s: MatmulSchedule) -> tuple[int, int, int]:
    """(static matmul instructions, static instructions, semaphores) of the kernel: its
    IR size and an estimate of the instructions the sync pass gives a semaphore.
    Compile time grows with it (the synchronisation pass faster than linearly), and a
    kernel with more awaited instructions than the target has semaphores falls back to
    one semaphore per queue (coarse waits that serialise the prefetching)."""
    widths = tuple(chunk_widths(p, s.w))
    copies = body_copies(p, s)
    prep, with_item, without, chunks = (copies * x for x in _sites(p, s.nb, uses_two_sets(p, s), len(widths),
                                                                   widths if s.stagger else ()))
    short = 1 if p.K % p.TK else 0
    # full k-tiles of each group: the last one's short tile has a body of its own
    ng, size, last = group_sizes(p, s.g)
    last_full = last - short
    wc = min(s.w, _cdiv(p.N, p.TN))
    # kt bodies of a step (one loop per group)
    plain_bodies = (ng - 1) * (1 if size else 0) + (1 if last_full else 0) + short
    # ... unrolled by two with transposes
    item_bodies = (ng - 1) * _calls(size) + _calls(last_full) + short
    pro_bodies = _calls(p.nk - short) + short
    matmuls = with_item * item_bodies * (wc + 1) + without * plain_bodies * wc + (prep - with_item) * pro_bodies
    if p.bias_mm:  # the bias matmuls: one per TN-column block of a step
        matmuls += (with_item + without) * wc
    loads = ng + short + (len(s.qb) if s.stagger else 0)
    instructions = (matmuls + with_item * (item_bodies + 1) + (prep - with_item) * (pro_bodies + 1)
                    + 2 * (with_item + without) + chunks * loads)
    # awaited instructions (one semaphore each, as the sync pass assigns them): every
    # load; per kt body the last matmul reading its B group (awaited by the next loads)
    # and the transpose; every vector copy; every store
    steps = with_item + without
    pro_sites = prep - with_item
    semaphores = (chunks * loads + prep
                  + with_item * item_bodies * 3 + without * plain_bodies + pro_sites * pro_bodies * 2
                  + 2 * steps)
    return matmuls, instructions, semaphores


def kernel_matmuls(p: MatmulProblem, s: MatmulSchedule) -> int:
    return kernel_size(p, s)[0]


def footprint(p: MatmulProblem, s: MatmulSchedule) -> tuple[int, int]:
    """(SRAM, accumulator) bytes per partition of the kernel's buffers."""
    TNL = s.w * p.TN
    nb = min(s.nb, p.n_mtiles)
    pars = 2 if nb > 1 else 1
    sets = 2 if uses_two_sets(p, s) else 1
    per_par = _cdiv(nb, pars)
    sram = len(s.qa) * _align(p.TM * p.ia)  # identity, one per A queue
    sram += 2 * _align(p.K * p.ia)  # natural-layout A rows (two in flight)
    sram += sets * pars * _align(per_par * p.nk * p.TM * p.ia)  # lhsT
    ng, size, last = group_sizes(p, s.g)
    sram += s.b_sets * ((ng - 1) * _align(size * TNL * p.ib) + _align(last * TNL * p.ib))  # B chunk
    sram += 2 * _align(TNL * p.io)  # output tiles
    sram += p.fused_sram + TNL * p.fused_sram_per_col  # a fused epilogue / A producer
    acc = 2 * _align(TNL * 4) + prep_sites(p, s) * 2 * _align(p.TM * 4)  # outputs, transposes
    return sram, acc


MAX_KERNEL_MATMULS = 2000  # static matmul instructions of one kernel (compile time)
SEMAPHORE_MARGIN = 1.0  # the estimate is an upper bound (20-30 % above the sync pass's count)


def fits(p: MatmulProblem, s: MatmulSchedule, cfg: HardwareConfig) -> bool:
    """The schedule's buffers fit the target and its kernel is small enough: to compile
    fast, and to give every awaited instruction its own semaphore."""
    sram, acc = footprint(p, s)
    if sram > cfg.sram.bytes_per_partition or acc > cfg.accumulator.bytes_per_partition:
        return False
    matmuls, _, semaphores = kernel_size(p, s)
    return matmuls <= MAX_KERNEL_MATMULS and semaphores <= SEMAPHORE_MARGIN * cfg.semaphores


def queue_plans(cfg: HardwareConfig) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(B queues, A queues) assignments tried. Stores use the last queue (tile-to-npu)
    and B never shares it: a store waits for its evacuation, so B loads queued behind it
    in program order would wait for the chunk's compute and stop prefetching."""
    Q = cfg.dma.queues
    if Q == 1:
        return [((0,), (0,))]
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for nbq in range(1, Q):
        qb = tuple(range(nbq))
        # A rows on a queue of their own if one is left, else with the stores, or (two
        # queues in all) with B
        for qa in ((Q - 2,) if nbq < Q - 1 else ()) + (Q - 1,) + ((nbq - 1,) if Q == 2 else ()):
            if (qb, (qa,)) not in out:
                out.append((qb, (qa,)))
    return out


def candidates(p: MatmulProblem, cfg: HardwareConfig) -> list[MatmulSchedule]:
    """Every schedule of the search space that fits the target, in a fixed order.

    One B set is only offered when two do not fit; staggering only with several B
    queues. A fused A-row producer (`prep_ops`: vector work on the rows, a layer norm)
    does not load its rows on the store queue where another queue is left: there they
    wait behind the stores, which wait for their evacuations, and the vector engine
    then idles until the rows land (gpt2 block qkv on cloud: 144k -> 131k cycles)."""
    ntiles = p.n_mtiles
    ncols = _cdiv(p.N, p.TN)
    nbs = sorted({min(x, ntiles) for x in (1, 2, 3, 4, 6, 8, 10, 12, MAX_BLOCK)})
    ws = sorted({min(x, ncols) for x in (1, 2, 3, 4, 6, 8, 12, MAX_WIDTH)})
    gs = sorted({min(x, p.nk) for x in (1, 2, 4, 8)})
    out: list[MatmulSchedule] = []
    for nb in nbs:
        multi = _cdiv(p.M, nb * p.TM) > 1
        for w in ws:
            for g in gs:
                for pipelined in ((True, False) if multi else (False,)):
                    for qb, qa in queue_plans(cfg):
                        if p.prep_ops and qa[0] == cfg.dma.queues - 1 and cfg.dma.queues > 2:
                            continue
                        for stagger in ((False, True) if len(qb) > 1 else (False,)):
                            for pre in ((False, True) if pretile_ok(p, w, g) else (False,)):
                                s = MatmulSchedule(nb, w, g, 2, pipelined, qb, qa, stagger, pre)
                                if fits(p, s, cfg):
                                    out.append(s)
                                    continue
                                s = MatmulSchedule(nb, w, g, 1, pipelined, qb, qa, stagger, pre)
                                if fits(p, s, cfg):
                                    out.append(s)
    return out
