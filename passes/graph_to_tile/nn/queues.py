"""DMA queue hints for the convolution kernels' loads: an earliest-finish model of the
queues, split between the loads of data no earlier kernel writes (weights, constants) and
the activation loads and stores, and how the resident weights are cut into pieces.

    qm = QueueModel(cfg, split=True)           # cloud: 4 queues, weights on 0-1, activations on 2-3
    tile.load %w[...] -> %weights {queue = qm.next(nbytes, chunk, const=True)}    -> 0, 1, 0, ...
    tile.load %x[...] -> %slab    {queue = qm.next(nbytes, chunk)}                -> 2, 3, 2, ...
    tile.store ...                                                                -> 3 (the last)
    weight_pieces(cfg, nk=1, T=9) -> [(0, 0, 4), (0, 4, 5)]     (tile, first tap, taps)

Why split: queues run in order and linked kernels share them (`codegen/link.py`). A
kernel's activation loads wait for the kernel before it (its output), so a weight DMA
queued behind them starts only when that kernel ends. On queues of their own, the
weights of the next kernel stream while the current one computes (they wait only for
the SRAM they overwrite, which `plan-sram` keeps apart from the neighbouring kernel's).
"""

from __future__ import annotations

import math

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules


def queue_split(cfg: HardwareConfig, light_weights: bool = False) -> tuple[list[int], list[int]]:
    """(weight queues, activation queues): the first half of the DMA queues for the loads
    of data no earlier kernel writes, the second half (its last queue carries the stores)
    for activations; `light_weights` (a kernel that moves more activations than weights):
    one weight queue fewer, one activation queue more (a 56 x 56 layer moves ~2 MB of
    activations per kernel in ~100 KB DMAs, mostly fixed latency, so three queues side
    by side). One queue serves both."""
    Q = cfg.dma.queues
    if Q < 2:
        return list(range(Q)), list(range(Q))
    h = max(1, Q // 2 - 1) if light_weights else Q // 2
    return list(range(h)), list(range(h, Q))


def store_queues(cfg: HardwareConfig) -> list[int]:
    """Queues for stores that should run side by side: the second half of the queues,
    the last first (the default store queue), never a weight queue (`queue_split`), so
    the next kernel's weights do not wait behind them."""
    Q = cfg.dma.queues
    return list(range(Q - 1, Q // 2 - 1, -1)) if Q >= 2 else list(range(Q))


class QueueModel:
    """Queue hints by earliest estimated finish: each DMA goes to the queue expected to be
    free first, charged its fixed latency and its bytes at a share of its rate alone
    (`TimingRules.dma_rate`, `share` transfers in flight). Used for loads issued up
    front, so queues that carry a slow (short-chunk) load get fewer of the large ones.
    `split`: weights and constants on their own queues (`queue_split`; `light_weights`:
    the kernel moves more activation bytes than weight bytes)."""

    def __init__(self, cfg: HardwareConfig, share: float = 2.0, split: bool = False,
                 light_weights: bool = False) -> None:
        self.free = [0.0] * cfg.dma.queues
        every = list(range(cfg.dma.queues))
        self.const_queues, self.io_queues = queue_split(cfg, light_weights) if split else (every, every)
        self.lat = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
        self.rules = TimingRules(cfg)
        self.share = share
        self.rows = cfg.sram.partitions
        # a long row: the payload at which a transfer over all the engines reaches the HBM peak
        self.long_row = max(1, math.ceil(self.rules.dma_saturating_chunk()))

    def next(self, nbytes: int = 0, chunk: int | None = None, const: bool = False, among_stores: bool = False) -> int:
        """The queue for a DMA of `nbytes` in rows of `chunk` contiguous bytes (None: long
        rows); `const`: it reads data no earlier kernel writes (weights, constants);
        `among_stores`: it is issued between stores, so not on the store queue (the
        last), where it would wait for the compute the store before it waits for."""
        qs = self.const_queues if const else self.io_queues
        if among_stores:
            qs = [q for q in qs if q != len(self.free) - 1] or qs
        q = min(qs, key=lambda i: (self.free[i], i))
        if nbytes:
            rows = self.rows if chunk is None else max(1, min(self.rows, nbytes // max(chunk, 1)))
            per_row = self.long_row if chunk is None else chunk
            rate = self.rules.dma_rate(rows, per_row, 1)
            self.free[q] += nbytes / (rate / self.share)
        self.free[q] += self.lat
        return q


def weight_pieces(cfg: HardwareConfig, nk: int, T: int) -> list[tuple[int, int, int]]:
    """The weight DMAs of `nk` contraction tiles of `T` taps, in issue
    order: (tile, first tap, taps), contiguous in the ``gihwo`` layout.

    One DMA per contraction tile, the largest split in two until every weight queue
    (`queue_split`) has one: each DMA pays the fixed latency (about 3,100 cycles on
    `cloud`, in which HBM would move ~470 KB), and the weights load while the kernel
    before computes, so few large DMAs beat the early start of small first pieces."""
    Q = len(queue_split(cfg)[0])
    pieces = [(t, 0, T) for t in range(nk)]
    while len(pieces) < Q and any(n > 1 for _, _, n in pieces):
        i = max(range(len(pieces)), key=lambda i: (pieces[i][2], -i))
        t, t0, n = pieces[i]
        pieces[i: i + 1] = [(t, t0, n // 2), (t, t0 + n // 2, n - n // 2)]
    return pieces
