"""A collective as a schedule: steps of point-to-point transfers between chip buffers.

    Schedule(collective="all_reduce", algorithm="ring", n=4, elements=8, steps=[
        Step(src=[0 1 2 3], dst=[1 2 3 0], src_off=[6 0 2 4], dst_off=[6 0 2 4],
             count=[2 2 2 2], reduce=[T T T T]),     # step 0 of the reduce-scatter
        ...])

Every chip holds one buffer of `buffer_elements` elements. A transfer copies `count`
elements from `src`'s buffer at `src_off` into `dst`'s buffer at `dst_off`, adding them
(`reduce`) or overwriting. The semantics is step-synchronous: a step's transfers read
their sources as they were when the step began.

The dependences (the timing modes' rule): a transfer of step t from chip c starts once
every transfer of an earlier step that involves c (as source or destination) is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tilecc.errors import TileccError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


@dataclass(frozen=True)
class Step:
    src: np.ndarray
    dst: np.ndarray
    src_off: np.ndarray
    dst_off: np.ndarray
    count: np.ndarray
    reduce: np.ndarray

    @staticmethod
    def make(src, dst, src_off, dst_off, count, reduce) -> Step:
        n = len(np.atleast_1d(src))

        def arr(x, dtype: type = np.int64) -> np.ndarray:
            if isinstance(x, np.ndarray) and x.dtype == dtype and x.shape == (n,):
                return x  # shared, not copied: steps are never modified (ideal.py caches by array)
            return np.broadcast_to(np.asarray(x, dtype), (n,)).copy()

        return Step(arr(src), arr(dst), arr(src_off), arr(dst_off), arr(count), arr(reduce, np.bool_))

    def __len__(self) -> int:
        return len(self.src)


@dataclass
class Schedule:
    collective: str
    algorithm: str
    n: int  # chips
    elements: int  # S: the collective's size per chip, in elements (see `io_slices`)
    steps: list[Step] = field(default_factory=list)
    chunks: int = 1  # pieces each block is cut into so that they pipeline (double binary tree)
    peer: int = 0  # send_recv: the receiving chip (chip 0 sends)
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # analyses of the timing modes

    @property
    def buffer_elements(self) -> int:
        return 2 * self.elements if self.collective == "all_to_all" else self.elements

    @property
    def transfers(self) -> int:
        return sum(len(s) for s in self.steps)

    def shard(self, r: int) -> tuple[int, int]:
        """[lo, hi) of shard r: the buffer cut into n near-equal blocks."""
        return bounds(0, self.elements, self.n, r)

    def io_slices(self, r: int) -> tuple[slice, slice]:
        """Where chip r's input lies in its buffer, and where its result is."""
        whole = slice(0, self.elements)
        lo, hi = self.shard(r)
        if self.collective == "all_reduce":
            return whole, whole
        if self.collective == "all_gather":
            return slice(lo, hi), whole
        if self.collective == "reduce_scatter":
            return whole, slice(lo, hi)
        if self.collective == "all_to_all":
            return whole, slice(self.elements, 2 * self.elements)
        return whole, whole  # send_recv: chip 0's input, chip `peer`'s result


def bounds(lo, length, parts, i):
    """[start, end) of block i when [lo, lo + length) is cut into `parts` near-equal blocks
    (numpy arrays broadcast)."""
    return lo + (i * length) // parts, lo + ((i + 1) * length) // parts


class CollectiveError(TileccError):
    """A collective that cannot run as asked (an algorithm that does not apply to the
    collective or the chip count, a size it cannot split): names both and the rule."""
