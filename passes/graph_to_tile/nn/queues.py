"""DMA queue hints for the convolution kernels' up-front loads: an earliest-finish model
of the queues, and how the resident weights are cut into pieces over them.

    qm = QueueModel(cfg)                       # cloud: 4 queues
    tile.load %w[...] -> %weights {queue = qm.next(nbytes, chunk)}    -> 0, 1, 2, 3, 0, ...
    weight_pieces(cfg, nk=2, T=9, tap_bytes=32768) -> [(0, 0, 4), (0, 4, 5), (1, 0, 4), (1, 4, 5)]
                                                      (tile, first tap, taps)
"""

from __future__ import annotations

import math

from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules


class QueueModel:
    """Queue hints by earliest estimated finish: each DMA goes to the queue expected to be
    free first, charged its fixed latency and its bytes at a share of its rate alone
    (`TimingRules.dma_rate`, `share` transfers in flight). Used for loads issued up
    front, so queues that carry a slow (short-chunk) load get fewer of the large ones."""

    def __init__(self, cfg: HardwareConfig, share: float = 2.0) -> None:
        self.free = [0.0] * cfg.dma.queues
        self.lat = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
        self.rules = TimingRules(cfg)
        self.share = share
        self.rows = cfg.sram.partitions
        # a long row: the payload at which a transfer over all the engines reaches the HBM peak
        self.long_row = max(1, math.ceil(self.rules.dma_saturating_chunk()))

    def next(self, nbytes: int = 0, chunk: int | None = None) -> int:
        """The queue for a DMA of `nbytes` in rows of `chunk` contiguous bytes (None: long rows)."""
        q = min(range(len(self.free)), key=lambda i: (self.free[i], i))
        if nbytes:
            rows = self.rows if chunk is None else max(1, min(self.rows, nbytes // max(chunk, 1)))
            per_row = self.long_row if chunk is None else chunk
            rate = self.rules.dma_rate(rows, per_row, 1)
            self.free[q] += nbytes / (rate / self.share)
        self.free[q] += self.lat
        return q


def weight_pieces(cfg: HardwareConfig, nk: int, T: int, tap_bytes: int) -> list[tuple[int, int, int]]:
    """The weight DMAs of `nk` contraction tiles of `T` taps (`tap_bytes` each), in issue
    order: (tile, first tap, taps), contiguous in the ``gihwo`` layout.

    Queues that start together stay in step (processor sharing lets a queue that fell
    behind catch up), so they pay their fixed latency at the same moments, while HBM
    idles: fewer, larger DMAs waste less. But the matmuls on the last bytes wait for
    them, so the rounds shrink: each round gives every queue a piece, about 45%, 33% and
    22% of every tile's taps (pieces at least ``latency * bandwidth`` bytes), so the
    matmuls on rounds 1 and 2 overlap the transfers of the rounds after them."""
    Q = cfg.dma.queues
    lat = cfg.dma.latency_cycles + cfg.hbm.latency_cycles
    min_bytes = lat * cfg.hbm.bytes_per_cycle
    total = nk * T * tap_bytes
    nrounds = max(1, min(3, round(total / (Q * min_bytes))))
    fracs = {1: [1.0], 2: [0.6, 1.0], 3: [0.45, 0.78, 1.0]}[nrounds]
    out: list[tuple[int, int, int]] = []
    if T == 1:  # whole tiles per round
        cuts = sorted({0, nk} | {max(1, min(nk, round(f * nk))) for f in fracs})
        for lo, hi in zip(cuts, cuts[1:]):
            out += [(t, 0, 1) for t in range(lo, hi)]
        return out
    cuts = sorted({0, T} | {max(1, min(T, round(f * T))) for f in fracs})
    for lo, hi in zip(cuts, cuts[1:]):
        pieces = [(t, lo, hi - lo) for t in range(nk)]
        while len(pieces) < Q and any(n > 1 for _, _, n in pieces):
            i = max(range(len(pieces)), key=lambda i: (pieces[i][2], -i))
            t, t0, n = pieces[i]
            pieces[i: i + 1] = [(t, t0, n // 2), (t, t0 + n // 2, n - n // 2)]
        out += pieces
    return out

