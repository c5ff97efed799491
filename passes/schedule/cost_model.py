"""Analytical cost model of the -O2 matmul kernel: cycles of a schedule, from the config.

`estimate(problem, schedule, cfg)` follows the kernel's structure (`passes/graph_to_tile/matmul.py`)
with the simulator's closed forms (`simulator.timing`):

Every figure is in core cycles (the rules convert each engine's own cycles).

- matrix: a pipelined engine accepts the next matmul when the previous one starts
  streaming and preloads in the background, so back-to-back matmuls issue every
  ``max(preload, max(T * passes, min_interval))`` matrix cycles (T the streamed
  dimension of the dataflow); a result is ready ``preload + T * passes + R + C - 2``
  after issue. Compatible mode holds the engine for ``preload + stream + drain`` per
  matmul.
- DMA: ``F + bytes / rate`` per transfer (a pre-tiled B group is one transfer), ``F = latency + hbm latency +
  descriptors * per_descriptor`` (``rate``: `TimingRules.dma_rate`, the engines the
  tile's rows span at the short-chunk-derated engine peak, at most HBM's), one
  transfer at a time per queue, transfers in flight sharing the engines and HBM (a
  chunk's transfers take at least the sum of their `TimingRules.dma_occupancy`). HBM idles only while
  every B queue is in its fixed part: with independent phases each queue is there a
  fraction ``phi = F / (F + stretched transfer)`` of the time, which solves ``phi =
  (1 - phi**Q) * F / (Q * tile time)`` (bisection), so a chunk's transfers take
  ``bytes / bandwidth / (1 - phi**Q)`` when that exceeds the busiest queue's own sum of
  ``F + transfer`` (else that sum, transfers stretched by the others' overlap).
  Unstaggered queues moving equal tiles start and end together (processor sharing)
  and leave HBM idle for F every round: at least ``tiles per queue * (F + Q * tile
  time)``.
- vector: ``latency + access + ceil(partitions / lanes) * columns * op_cost`` vector
  cycles per copy.

The kernel is a pipeline over its n-chunks (in block order, every batch), simulated
chunk by chunk (runs of equal chunks and blocks extrapolated): the loads of chunk i
start when the previous loads are done and its B set is free (chunk i-2 computed with
two sets; the previous chunk's last step reached with one); its compute (M_i: the
larger of its matmuls and vector copies, plus A loads that do not keep up with the
preparations they feed) ends after the previous chunk's and, if it waits for its own
loads, after they land plus the matmuls left after its last B group. When compute and
transfers are both busy each one's hiccups stall the other: M_i is the p-norm (p = 4,
calibrated on the simulator) of the compute and min(transfers, compute). The start
adds the first m-tile's A rows and transposes, the end the last matmul's latency, its
evacuation copy and its store.

`choose(problem, cfg)` ranks `matmul_schedule.candidates` by the estimate and returns
the best (ties, within 0.2 %, go to the smaller kernel, which compiles faster, then to
A loads off the B queues); `rank` gives the ordered list the autotuner samples from.
Measured against the simulator (kernel alone, timing-only) over random candidates of
the three roofline GEMMs the estimate is mostly within a few percent; it is least
accurate for configurations near HBM saturation with short transfers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial

from tilecc.passes.schedule.matmul_schedule import (
    BlockPlan,
    MatmulProblem,
    MatmulSchedule,
    blocks,
    candidates,
    chunk_widths,
    first_rows_in_pieces,
    first_rows_queues,
    first_rows_whole,
    groups,
    kernel_matmuls,
    plan_blocks,
    prologue_group,
)
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import DmaPattern, TimingRules

CONTENTION_P = 4.0  # chunk time = (compute^p + transfers^p)^(1/p): see breakdown()


@dataclass
class Breakdown:
    """The parts of an estimate, in cycles (`total` is the estimate)."""

    total: float
    matrix: float  # matmul + transpose issue time (all batches)
    dma: float  # sum over chunks of the DMA time
    hbm: float  # all bytes at peak bandwidth
    vector: float
    start: float  # the first m-tile's preparation before the first matmul
    end: float  # last matmul result, evacuation and store
    stalls: float  # A loads slower than the steps hiding them, single-B-set waits


class Timing(TimingRules):
    """The simulator's closed forms (`simulator.timing`) plus the kernel's composite
    figures: several vector instructions, an evacuation, a prologue.

    The DMA and matmul figures, asked for the same few tile shapes by every candidate
    schedule of a problem, are memoised per instance (scalar arguments only: the
    estimator's)."""

    def __init__(self, cfg: HardwareConfig):
        super().__init__(cfg)
        self._memo: dict[tuple, float] = {}
        self._by_problem: dict[int, tuple[MatmulProblem, dict]] = {}

    def problem_memo(self, p: MatmulProblem) -> dict:
        """A memo of figures of problem `p` shared by its candidate schedules (keyed by
        the schedule fields they depend on): per problem object, which it keeps alive."""
        got = self._by_problem.get(id(p))
        if got is None or got[0] is not p:
            got = self._by_problem[id(p)] = (p, {})
        return got[1]

    def _memoised(self, key: tuple, compute: Callable[[], float]) -> float:
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = compute()
        return hit

    def dma_transfer(self, rows: int, cols: int, itemsize: int, pattern: int = DmaPattern.CONTIGUOUS) -> float:
        return self._memoised(("transfer", rows, cols, itemsize, pattern),
                              partial(super().dma_transfer, rows, cols, itemsize, pattern))

    def dma_occupancy(self, rows: int, cols: int, itemsize: int, pattern: int = DmaPattern.CONTIGUOUS) -> float:
        return self._memoised(("occupancy", rows, cols, itemsize, pattern),
                              partial(super().dma_occupancy, rows, cols, itemsize, pattern))

    def mm_interval(self, m: int, k: int, n: int, fp32: bool, speedup: float = 1.0) -> float:
        """Issue interval of back-to-back [m x k] @ [k x n] matmuls."""
        return self._memoised(("interval", m, k, n, fp32, speedup),
                              lambda: self.matmul_interval(self.matmul_stream(m, k, n, fp32, speedup)))

    def mm_latency(self, m: int, k: int, n: int, fp32: bool, speedup: float = 1.0) -> float:
        """Start to result of one [m x k] @ [k x n] matmul."""
        return self.matmul_latency(self.matmul_stream(m, k, n, fp32, speedup))

    def copy(self, rows: int, cols: int) -> float:
        return self.vector_time(rows, cols, self.cfg.vector.op_cost.unary["copy"])

    def vector(self, rows: int, cols: int, cost: float, ops: int) -> float:
        """`ops` vector instructions over rows x cols costing `cost` per element in all."""
        return ops * self.vector_overhead + self.vector_work(rows, cols, cost)

    def evac(self, p: MatmulProblem, rows: int, cols: int) -> float:
        """One evacuation (the copy, or a fused epilogue)."""
        cost = p.evac_cost if p.evac_cost > 0 else self.cfg.vector.op_cost.unary["copy"]
        return self.vector(rows, cols, cost, p.evac_ops)

    def prep(self, p: MatmulProblem) -> float:
        """Producing one m-tile's A rows on the vector engine (a fused prologue)."""
        return self.vector(p.TM, p.K, p.prep_cost, p.prep_ops) if p.prep_ops else 0.0


@lru_cache(maxsize=4096)
def _hbm_busy(r: float, queues: int) -> float:
    """1 - phi**queues for the phi solving phi = (1 - phi**queues) * r (bisection: the
    left side minus the right rises from -r at 0 to 1 at 1)."""
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if mid - r * (1.0 - mid ** queues) < 0.0:
            lo = mid
        else:
            hi = mid
    return max(1.0 - hi ** queues, 1e-6)


@lru_cache(maxsize=4096)
def _widths(p: MatmulProblem, w: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`chunk_widths`, and for each chunk the end of its run of equal widths."""
    widths = tuple(chunk_widths(p, w))
    same_to = [len(widths)] * len(widths)
    for c in range(len(widths) - 2, -1, -1):
        same_to[c] = same_to[c + 1] if widths[c + 1] == widths[c] else c + 1
    return widths, tuple(same_to)


def estimate(p: MatmulProblem, s: MatmulSchedule, cfg: HardwareConfig, timing: Timing | None = None) -> float:
    return _breakdown(p, s, cfg, timing, parts=False).total


def breakdown(p: MatmulProblem, s: MatmulSchedule, cfg: HardwareConfig, timing: Timing | None = None) -> Breakdown:
    return _breakdown(p, s, cfg, timing, parts=True)


def _breakdown(p: MatmulProblem, s: MatmulSchedule, cfg: HardwareConfig, timing: Timing | None,
               parts: bool) -> Breakdown:
    """The estimate; its parts (matrix, DMA, ...: sums over the chunks) only with
    `parts` (the ranking reads the total alone)."""
    tm = timing or Timing(cfg)
    Q = cfg.dma.queues
    store_q = Q - 1
    fp32 = "f32" in (p.a_dtype, p.b_dtype)
    # both operands 8-bit: the array's 8-bit rate (the A transposes stay at the 16-bit one)
    lowp = {"i8": cfg.matrix.int8_speedup, "f8e4m3": cfg.matrix.fp8_speedup}.get(p.a_dtype, 1.0) \
        if p.a_dtype == p.b_dtype else 1.0
    widths, same_to = _widths(p, s.w)
    nch = len(widths)
    TK, TM, TN = p.TK, p.TM, p.TN
    kfull, klast = divmod(p.K, TK)
    ksizes = [(TK, kfull)] + ([(klast, 1)] if klast else [])
    grp = groups(p, s.g)
    KG = len(grp)
    blks = blocks(p, s.nb)
    plans = plan_blocks(p, s, nch)
    qb = s.qb
    nbq = len(qb)
    fB = tm.dma_fixed(TK)
    a_x = tm.dma_transfer(TM, p.K, p.ia)
    a_w = tm.dma_occupancy(TM, p.K, p.ia)
    a_fixed = tm.dma_fixed(TM)

    def mm_k(m: int, n: int) -> float:  # one TN-column block of an m-tile over all of K
        bias = tm.mm_interval(m, 1, n, fp32) if p.bias_mm else 0.0  # the bias row's matmul
        return sum(c * tm.mm_interval(m, k, n, fp32, lowp) for k, c in ksizes) + bias

    tr_item = sum(c * tm.mm_interval(k, TM, TM, fp32) for k, c in ksizes)  # transposes of one m-tile
    cp_item = sum(c * tm.copy(k, TM) for k, c in ksizes) + tm.prep(p)

    def step_mat(ms: int, width: int) -> float:
        full, rest = divmod(width, TN)
        return full * mm_k(ms, TN) + (mm_k(ms, rest) if rest else 0.0)

    # the B tiles of one chunk per queue, (transfers, transfer time alone, occupancy of
    # the shared engines and HBM: `dma_occupancy`), both B sets averaged
    b_cache: dict[int, tuple[list[float], list[float], list[float]]] = {}

    def b_queues(width: int) -> tuple[list[float], list[float], list[float]]:
        if width not in b_cache:
            n, x, w = [0.0] * Q, [0.0] * Q, [0.0] * Q
            full_x, last_x = tm.dma_transfer(TK, width, p.ib), tm.dma_transfer(klast, width, p.ib) if klast else 0.0
            full_w = tm.dma_occupancy(TK, width, p.ib)
            last_w = tm.dma_occupancy(klast, width, p.ib) if klast else 0.0
            for bp in range(s.b_sets):
                for g, (kt0, cnt) in enumerate(grp):
                    q = qb[(bp * KG + g) % nbq]
                    if s.pretiled:  # the group is one transfer, cnt*width contiguous per partition
                        n[q] += 1 / s.b_sets
                        x[q] += tm.dma_transfer(TK, cnt * width, p.ib) / s.b_sets
                        w[q] += tm.dma_occupancy(TK, cnt * width, p.ib) / s.b_sets
                        continue
                    short = klast and kt0 + cnt == p.nk
                    n[q] += cnt / s.b_sets
                    x[q] += ((cnt - 1) * full_x + last_x if short else cnt * full_x) / s.b_sets
                    w[q] += ((cnt - 1) * full_w + last_w if short else cnt * full_w) / s.b_sets
            b_cache[width] = (n, x, w)
        return b_cache[width]

    shared = tm.problem_memo(p)

    def dma_time(width: int, msz: tuple[int, ...], n_a: int, first: bool) -> tuple[float, float]:
        """(time of the chunk's transfers, their occupancy of the shared engines and HBM:
        the time they take together at best); the same for every candidate with the same
        B groups, sets, queues and layout (shared through the problem's memo)."""
        key = ("dma", s.g, s.b_sets, s.qb, s.qa[0], s.stagger, s.pretiled, width, msz, n_a, first)
        got = shared.get(key)
        if got is None:
            got = shared[key] = dma_time_of(width, msz, n_a, first)
        return got

    def dma_time_of(width: int, msz: tuple[int, ...], n_a: int, first: bool) -> tuple[float, float]:
        n, xb, wb = b_queues(width)
        fixed = [n[q] * fB for q in range(Q)]
        x, w = list(xb), list(wb)
        for ms in msz:
            fixed[store_q] += tm.dma_fixed(ms)
            x[store_q] += tm.dma_transfer(ms, width, p.io)
            w[store_q] += tm.dma_occupancy(ms, width, p.io)
        qa = s.qa[0]
        fixed[qa] += n_a * a_fixed
        x[qa] += n_a * a_x
        w[qa] += n_a * a_w
        total_w = sum(w)
        alone = max(fixed[q] + x[q] for q in range(Q))
        # HBM idles while every B queue is in its fixed part: with independent phases a
        # queue is there a fraction phi = F / (F + its stretched transfer) of the time,
        # HBM idle phi**queues, so phi = (1 - phi**queues) * F / (queues * tile time);
        # stores and A rows move on top
        tile = max(xb[q] / n[q] for q in qb if n[q])
        busy = _hbm_busy(round(fB / (nbq * tile), 6), nbq)
        w_b = sum(wb[q] for q in qb)
        t_sat = w_b / busy + (total_w - w_b)  # B at its phase-limited rate, the rest on top
        if t_sat >= alone:
            t = t_sat  # HBM (nearly) saturated by B
        else:
            # not saturated: a queue's transfers still overlap others' part of the time
            u = total_w / alone
            t = max(total_w, max(fixed[q] + x[q] * (1.0 + 0.5 * u * (total_w - w[q]) / max(total_w, 1e-9))
                                 for q in range(Q)))
        if nbq > 1 and not s.stagger:
            # equal B tiles on several queues start and end together: every round pays
            # one fixed latency with HBM idle
            per = max(n[q] for q in qb)
            t = max(t, per * (fB + nbq * max(wb[q] / n[q] for q in qb if n[q])))
        if first and s.stagger and nbq > 1:
            t += (nbq - 1) * fB  # the staggering pieces of the first tiles
        return t, total_w

    def step_figures(width: int, msz: tuple[int, ...]) -> tuple[list[float], float, float]:
        """A chunk's steps' matmul times, their sum and its evacuations' time (the same
        for every candidate: shared through the problem's memo)."""
        key = ("steps", width, msz)
        got = shared.get(key)
        if got is None:
            steps = [step_mat(ms, width) for ms in msz]
            got = shared[key] = (steps, sum(steps), sum(tm.evac(p, ms, width) for ms in msz))
        return got

    # per distinct (block plan, chunk): (D, M, exposed part of M, last step, stalls,
    # matrix, vector, bytes)
    c_cache: dict = {}

    def chunk_figures(bi: int, plan: BlockPlan, c: int) -> tuple:
        first = bi == 0 and c == 0
        items = plan.chunk_items[c] if c < len(plan.chunk_items) else ()
        key = (id(plan), c if c < len(plan.chunk_items) or (c == 0 and plan.prologue) else -1, widths[c], first,
               bi > 0)
        if key in c_cache:
            return c_cache[key]
        width, msz = widths[c], plan.msz
        n_items = sum(1 for x in items if x is not None)
        pro = len(plan.prologue) if (c == 0 and bi > 0) else 0
        steps, mat_steps, vec_evac = step_figures(width, msz)
        mat = mat_steps + (n_items + pro) * tr_item
        vec = vec_evac + (n_items + pro) * cp_item
        d, x = dma_time(width, msz, n_items + (len(plan.prologue) if c == 0 else 0), first)
        stall = 0.0
        if pro:
            # a block prologue: the last transpose's latency and copy before the matmuls;
            # A rows after the first were not loaded ahead
            stall += tm.mm_latency(TK, TM, TM, fp32) + tm.copy(TK, TM) + (pro - 1) * (a_fixed + a_x)
        if n_items:
            # the next m-tile's A rows load (sharing HBM) while this step runs
            rho = min(1.0, x / max(mat, 1.0))
            stall += max(0.0, a_fixed + a_x * (1.0 + rho) - (min(steps) + tr_item)) * n_items
        # the busier of matrix and DMA sets the pace; when both are busy, each one's
        # hiccups stall the other (an empirical p-norm, calibrated on the simulator)
        busy = max(mat, vec)
        m = (busy ** CONTENTION_P + min(d, busy) ** CONTENTION_P) ** (1.0 / CONTENTION_P) + stall
        # when the chunk's loads land while it computes, its matmuls wait group by group:
        # about half a group's compute per chunk
        rho = min(d, busy) / max(busy, 1.0)
        m += rho ** CONTENTION_P * busy / (2.0 * KG)
        # the part of it after the chunk's last B group arrived, if the chunk waits for
        # its own loads: the first step's last group and the other steps
        exposed = busy - steps[0] * (1.0 - 1.0 / KG) + stall
        bytes_ = p.K * width * p.ib + sum(msz) * width * p.io + (n_items + pro) * TM * p.K * p.ia
        out = (d, m, exposed, steps[-1], stall, mat, vec, bytes_)
        c_cache[key] = out
        return out

    # the chunk sequence as runs: consecutive blocks with one plan (middle blocks), and
    # within a block consecutive chunks with one figure
    block_runs: list[list] = []  # [chunk runs [[figure, count]...], count]
    runs_of: dict = {}
    for bi, plan in enumerate(plans):
        key = (id(plan), bi == 0)
        if key not in runs_of:
            ch_runs: list[list] = []
            # past the chunks with items (and chunk 0), a chunk's figures depend on its
            # width alone: a run of equal widths is one figure
            plain = max(1, len(plan.chunk_items))
            c = 0
            while c < nch:
                x = chunk_figures(bi, plan, c)
                n = same_to[c] - c if c >= plain else 1
                if ch_runs and ch_runs[-1][0] is x:
                    ch_runs[-1][1] += n
                else:
                    ch_runs.append([x, n])
                c += n
            runs_of[key] = ch_runs
        ch_runs = runs_of[key]
        if block_runs and block_runs[-1][0] is ch_runs:
            block_runs[-1][1] += 1
        else:
            block_runs.append([ch_runs, 1])
    # prologue: the first m-tile's A rows, in pieces ahead of the B loads on their
    # queues (`first_rows_queues`; sharing HBM with the next m-tile's rows, loading on
    # the A queue meanwhile), then its transposes (or their vector copies, wide ones in a
    # prologue: `prologue_group`), the latency and copy of the last one
    first_ms = blks[0][0]
    if (s.pretiled and p.M == 1 and not p.batch) or first_rows_whole(p):
        # a one-row matmul on a pre-tiled weight loads its row straight into lhsT
        # (matmul.py `direct_a`), and a few rows (decode at batch 8 / 32: one short
        # m-tile) load whole (`load_first_rows`): none of the pieces and wide transposes
        # below run. Their start keeps the estimate their schedules were chosen and
        # measured with (the first rows and B group, one B queue's tiles in turn); the
        # multi-block term picked narrower, slower GEMVs and batch-8 GEMMs
        start = tm.dma_fixed(first_ms) + tm.dma_transfer(first_ms, p.K, p.ia) * min(2.0, 1.0 + nbq) + tr_item \
            + tm.mm_latency(TK, TM, TM, fp32) + tm.copy(TK, TM) + tm.prep(p)
        start = max(start, grp[0][1] * (fB + tm.dma_transfer(TK, widths[0], p.ib)))
    else:
        pieces = len(first_rows_queues(s, first_ms)) if first_rows_in_pieces(p) else 1
        prefetch = p.n_mtiles > 1
        a_alone = tm.dma_fixed(-(-first_ms // pieces)) + tm.dma_transfer(first_ms, p.K, p.ia)
        a_first = a_alone + tm.dma_transfer(first_ms, p.K, p.ia) * (0.5 if prefetch else 0.0) if pieces > 1 else \
            tm.dma_fixed(first_ms) + tm.dma_transfer(first_ms, p.K, p.ia) * min(2.0, 1.0 + nbq)
        gw = prologue_group(p, s) if first_ms == TM else 1
        cp_pro = sum(c * tm.copy(k, TM) for k, c in ksizes) if gw == 1 else \
            (kfull // gw) * tm.copy(TK, gw * TM) + (kfull % gw) * tm.copy(TK, TM) \
            + (tm.copy(klast, TM) if klast else 0.0)
        start = a_first + max(tr_item, cp_pro + tm.prep(p)) + tm.mm_latency(TK, TM, TM, fp32) + tm.copy(TK, TM)
        # ... and the first matmul needs the whole first B group (one transfer pre-tiled,
        # else its tiles one after the other on one queue), loading after the A rows'
        # piece on its queue and sharing HBM with the other B queues and the A prefetch
        share = nbq + (1 if prefetch else 0)
        cnt0 = grp[0][1]
        if s.pretiled:
            b_first = fB + tm.dma_transfer(TK, cnt0 * widths[0], p.ib) * share
        else:
            b_first = cnt0 * (fB + tm.dma_transfer(TK, widths[0], p.ib) * share)
        start = max(start, (a_alone if pieces > 1 else 0.0) + b_first)
    last_ms = blks[-1][-1]
    end = tm.mm_latency(last_ms, TK, TN, fp32, lowp) + tm.evac(p, last_ms, widths[-1]) + tm.dma_fixed(last_ms) \
        + tm.dma_transfer(last_ms, widths[-1], p.io)
    # the pipeline, chunk after chunk: loads of chunk i start when the previous loads
    # are done and the B set is free (two sets: chunk i-2 computed; one set: the
    # previous chunk's last step reached); compute ends after the previous chunk's and
    # after the chunk's own loads plus what is left of it
    # (runs of equal chunks or blocks reach a steady increment within a few of them:
    # the rest of a long run is extrapolated)
    def advance(x: tuple, st: list[float]) -> list[float]:
        d, m, exposed, last = x[0], x[1], x[2], x[3]
        d_end, m2, m1, m_end = st
        free = m2 if s.b_sets == 2 else m1 - last
        d_end = max(d_end, free) + d
        m_new = max(m_end + m, d_end + exposed)
        return [d_end, m1, m_new, m_new]

    def repeat(n: int, limit: int, body: Callable[[list[float]], list[float]], st: list[float]) -> list[float]:
        k = min(n, limit)
        prev = st
        for _ in range(k):
            prev, st = st, body(st)
        if n > k:
            st = [a + (n - k) * (a - b) for a, b in zip(st, prev)]
        return st

    def one_block(ch_runs: list, st: list[float]) -> list[float]:
        for x, n in ch_runs:
            st = repeat(n, 6, lambda t, x=x: advance(x, t), st)
        return st

    def one_batch(st: list[float], exposed_start: float) -> list[float]:
        st = list(st)
        st[3] += exposed_start
        st[2] = st[3]
        for ch_runs, n in block_runs:
            st = repeat(n, 3, lambda t, cr=ch_runs: one_block(cr, t), st)
        return st

    # later batch indices: the first m-tile's A rows were loaded during the previous
    # index, unless they queue behind its stores (A on the store queue); its transposes
    # have no matmuls to hide behind
    prep_lat = tr_item + tm.mm_latency(TK, TM, TM, fp32) + tm.copy(TK, TM)
    start_next = prep_lat
    if s.qa[0] == store_q:
        start_next += tm.dma_fixed(first_ms) + tm.dma_transfer(first_ms, p.K, p.ia) + tm.dma_fixed(last_ms) \
            + tm.dma_transfer(last_ms, widths[-1], p.io)
    st = one_batch([0.0, 0.0, 0.0, 0.0], start)
    st = repeat(p.batches - 1, 3, lambda t: one_batch(t, start_next), st)
    total = st[3] + end
    if not parts:
        return Breakdown(total, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def total_of(i: int) -> float:
        return p.batches * sum(x[i] * n * nbk for ch_runs, nbk in block_runs for x, n in ch_runs)
    nb_ = p.batches
    return Breakdown(
        total=total,
        matrix=total_of(5) + tr_item * nb_,
        dma=total_of(0),
        hbm=total_of(7) / tm.bw,
        vector=total_of(6),
        start=start + start_next * (nb_ - 1),
        end=end,
        stalls=total_of(4),
    )


def _size_key(p: MatmulProblem, s: MatmulSchedule) -> tuple:
    """Smaller kernels (IR ops, hence compile time) first; for a one-row matmul a
    pre-tiled weight (its row then loads straight into the partitions, with its
    epilogue in the kernel: `norm_gemv.py`); A loads off the B queues (a 1-row-block A
    load delays the B loads queued behind it), then a fixed order."""
    direct = s.pretiled and p.M == 1 and not p.batch
    return (kernel_matmuls(p, s), not direct, s.qa[0] in s.qb, s.nb, s.w, s.g, s.b_sets, not s.pipelined,
            s.stagger, s.qb, s.qa)


def rank(p: MatmulProblem, cfg: HardwareConfig) -> list[tuple[float, MatmulSchedule]]:
    """Every fitting schedule with its estimate, best first (deterministic order)."""
    return list(_rank(p, cfg))


@lru_cache(maxsize=256)
def _rank(p: MatmulProblem, cfg: HardwareConfig) -> tuple[tuple[float, MatmulSchedule], ...]:
    tm = Timing(cfg)
    scored = [(estimate(p, s, cfg, tm), i, s) for i, s in enumerate(candidates(p, cfg))]
    scored.sort(key=lambda x: (x[0], x[1]))
    return tuple((e, s) for e, _, s in scored)


# The estimate times a kernel alone. In a program the kernels around it stream their
# weights beside it (`codegen/link.py`), so a schedule that moves bytes it need not move
# (B reloaded per block of m-tiles) costs more than estimated: within this fraction of the
# best estimate the one moving the fewest HBM bytes wins (GPT-2's q/k/v projection: B once
# instead of twice, 0.4 % slower alone, the block 1.3 % faster and 14 % less traffic).
HBM_SLACK = 0.005


@lru_cache(maxsize=256)
def choose(p: MatmulProblem, cfg: HardwareConfig) -> MatmulSchedule | None:
    """The cost model's schedule (None: nothing fits, the caller uses -O0): the best
    estimate, or within `HBM_SLACK` of it the one moving the fewest HBM bytes; ties go
    to the smallest kernel."""
    ranked = rank(p, cfg)
    if not ranked:
        return None
    best = ranked[0][0]
    close = [(e, s) for e, s in ranked if e <= best * (1 + HBM_SLACK)]
    if len(close) > 1:
        tm = Timing(cfg)
        hbm = [breakdown(p, s, cfg, tm).hbm for _, s in close]
        least = min(hbm)
        if hbm[0] > least * 1.02:  # the best estimate moves noticeably more bytes
            fewest = [(e, s) for (e, s), h in zip(close, hbm) if h <= least * 1.0005]
            best = fewest[0][0]
            return min((s for e, s in fewest if e <= best * 1.0005), key=lambda s: _size_key(p, s))
    near = [s for e, s in ranked if e <= best * 1.0005]
    return min(near, key=lambda s: _size_key(p, s))
