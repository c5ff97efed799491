"""Window geometry of the CNN family: phase images, taps and bands of output rows.

A *phase image* of the (padded) input makes every window tap a contiguous run of
columns: ``xq[n, c, phase, i * Wq + j] = x[n, c, i*s + a - pad, j*s + b - pad]`` for each
phase ``(a, b)`` of the stride that some tap uses; output ``(oh, ow)`` is flat position
``p = oh * Wq + ow`` and tap ``(kh, kw)`` reads ``xq[.., phase(kh, kw), p + off(kh, kw)]``.

    Geometry(N=1, C=64, H=56, W=56, OH=28, OW=28, k=(3, 3), s=(2, 2), p=(1, 1), d=(1, 1))
        -> phases [(0, 0), (0, 1), (1, 0), (1, 1)], Hq = Wq = 29,
           taps [(0, 0, 0, 0), (0, 1, 1, 0), (0, 2, 0, 1), (1, 0, 2, 0), ...]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Geometry:
    """The window of a convolution / pooling: input [N, C, H, W], output [OH, OW],
    kernel `k`, stride `s`, padding `p`, dilation `d` (`wq_pad`: phase rows that many
    columns wider, filled like the padding); derived: the stride phases some tap uses
    (`row_res` x `col_res`), the phase images' size (Hq x Wq) and every tap's (kh, kw,
    phase, flat offset)."""

    N: int
    C: int
    H: int
    W: int
    OH: int
    OW: int
    k: tuple[int, int]
    s: tuple[int, int]
    p: tuple[int, int]
    d: tuple[int, int]
    wq_pad: int = 0  # extra columns per phase row (rows as wide as a padded output's)
    row_res: list[int] = field(default_factory=list)
    col_res: list[int] = field(default_factory=list)
    Hq: int = 0
    Wq: int = 0
    taps: list[tuple[int, int, int, int]] = field(default_factory=list)  # kh, kw, phase, offset
    maxoff: list[int] = field(default_factory=list)  # per phase

    def __post_init__(self) -> None:
        (KH, KW), (sh, sw), (dh, dw) = self.k, self.s, self.d
        self.row_res = sorted({(kh * dh) % sh for kh in range(KH)})
        self.col_res = sorted({(kw * dw) % sw for kw in range(KW)})
        self.Hq = self.OH + ((KH - 1) * dh) // sh
        self.Wq = self.OW + ((KW - 1) * dw) // sw + self.wq_pad
        nb = len(self.col_res)
        self.maxoff = [0] * (len(self.row_res) * nb)
        for kh in range(KH):
            for kw in range(KW):
                ph = self.row_res.index((kh * dh) % sh) * nb + self.col_res.index((kw * dw) % sw)
                off = ((kh * dh) // sh) * self.Wq + (kw * dw) // sw
                self.taps.append((kh, kw, ph, off))
                self.maxoff[ph] = max(self.maxoff[ph], off)

    @property
    def nph(self) -> int:
        return len(self.row_res) * len(self.col_res)

    @property
    def phases(self) -> list[tuple[int, int]]:
        return [(a, b) for a in self.row_res for b in self.col_res]

    @property
    def direct(self) -> bool:
        """The input itself is the (only) phase image: no padding kernel."""
        return self.s == (1, 1) and self.p == (0, 0) and self.Hq == self.H and self.Wq == self.W

    def lp(self, rb: int) -> int:
        """Flat positions of a band of `rb` output rows."""
        return (rb - 1) * self.Wq + self.OW

    def slab(self, rb: int, ph: int) -> int:
        """Columns of phase `ph` that a band of `rb` output rows reads."""
        return self.lp(rb) + self.maxoff[ph]



def pick_band(geo: Geometry, fits: Callable[[int], bool]) -> int:
    """The tallest band of output rows that fits and divides OH (so one loop of equal
    bands covers the output: every instruction has a single static copy)."""
    best = 0
    for rb in range(1, geo.OH + 1):
        if geo.OH % rb == 0 and fits(rb):
            best = rb
        elif not fits(rb):
            break
    return best


@dataclass(frozen=True)
class PhaseSpec:
    """The phase images a padding kernel writes: ``out[n, c, ph, i*Wq + j] = x[n, c, i*sh
    + a - pt, j*sw + b - pl]`` (`fill_value` outside ``x``) for each phase ``ph = (a, b)``
    of stride `s` and padding `pad` (one phase (0, 0) and stride 1: a plain pad)."""

    phases: list[tuple[int, int]]
    s: tuple[int, int]
    pad: tuple[int, int]
    Hq: int
    Wq: int
    fill_value: float

    @staticmethod
    def of(geo: Geometry, fill_value: float, crop: tuple[int, int] = (0, 0)) -> PhaseSpec:
        """The phase images of window `geo` (its padding less `crop`, the ring of an input
        stored padded)."""
        return PhaseSpec(geo.phases, geo.s, (geo.p[0] - crop[0], geo.p[1] - crop[1]), geo.Hq, geo.Wq, fill_value)

