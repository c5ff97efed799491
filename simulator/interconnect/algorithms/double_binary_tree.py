"""Double binary tree all-reduce (NCCL 2.4; Sanders, Speck and Traeff 2009).

Two binary trees over the n chips, each reducing then broadcasting half of the buffer:
tree A is the balanced in-order tree over 0..n-1 (root n // 2); tree B is A mirrored
(r -> n-1-r) when n is even and shifted (r -> r+1 mod n) when odd, so that most of A's
leaves are B's inner nodes. Each half is cut into C chunks that pipeline down the tree:
with D the trees' depth, a chip at depth l sends chunk c to its parent (adding) in step
c + D - l and its parent's broadcast reaches it in step c + D + l - 1, so

    steps = C + 2D - 1,   time = (C + 2D - 1) (alpha + S / (2 C B))   (ideal, one hop each)

and `best_chunks` picks the C minimising it (C* = sqrt((2D-1) S / (2 B alpha))).
"""

from __future__ import annotations

import math

import numpy as np

from tilecc.simulator.interconnect.schedule import Schedule, Step, bounds

MAX_CHUNKS = 256


def in_order_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(parent, depth) of the balanced in-order binary tree over 0..n-1 (parent -1 at the root)."""
    parent, depth = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    todo = [(0, n, -1, 0)]
    while todo:
        lo, hi, par, dep = todo.pop()
        if lo >= hi:
            continue
        mid = (lo + hi) // 2
        parent[mid], depth[mid] = par, dep
        todo += [(lo, mid, mid, dep + 1), (mid + 1, hi, mid, dep + 1)]
    return parent, depth


def trees(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Trees A and B as (parent, depth) indexed by chip."""
    parent, depth = in_order_tree(n)
    perm = (n - 1 - np.arange(n)) if n % 2 == 0 else (np.arange(n) + 1) % n  # A's node i is chip perm[i]
    parent_b, depth_b = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    parent_b[perm] = np.where(parent >= 0, perm[np.maximum(parent, 0)], -1)
    depth_b[perm] = depth
    return [(parent, depth), (parent_b, depth_b)]


def tree_depth(n: int) -> int:
    return int(in_order_tree(n)[1].max())


def best_chunks(n: int, nbytes: float, alpha_ns: float, bytes_per_ns: float) -> int:
    """The chunk count minimising (C + 2D - 1)(alpha + S / (2 C B)), clamped to 1..256."""
    k = 2 * tree_depth(n) - 1
    if alpha_ns <= 0:
        return MAX_CHUNKS
    c = math.sqrt(k * nbytes / (2 * bytes_per_ns * alpha_ns))
    best = min((max(1, math.floor(c)), max(1, math.ceil(c))),
               key=lambda x: (x + k) * (alpha_ns + nbytes / (2 * x * bytes_per_ns)))
    return int(min(best, MAX_CHUNKS))


def schedule(collective: str, n: int, elements: int, chunks: int = 1) -> Schedule:
    sched = Schedule(collective, "double_binary_tree", n, elements, chunks=chunks)
    chips = np.arange(n, dtype=np.int64)
    halves = [(0, elements // 2), (elements // 2, elements - elements // 2)]
    D = tree_depth(n)
    by_step: dict[int, list[tuple[np.ndarray, np.ndarray, int, int, bool]]] = {}
    for (parent, depth), (h_lo, h_len) in zip(trees(n), halves):
        kids = parent >= 0
        child, par, dep = chips[kids], parent[kids], depth[kids]
        for c in range(chunks):
            lo, hi = bounds(h_lo, h_len, chunks, c)
            for level in range(1, D + 1):
                sel = dep == level
                if not sel.any():
                    continue
                up = (child[sel], par[sel], lo, hi - lo, True)  # reduce towards the root
                down = (par[sel], child[sel], lo, hi - lo, False)  # broadcast back
                by_step.setdefault(c + D - level, []).append(up)
                by_step.setdefault(c + D + level - 1, []).append(down)
    for s in range(chunks + 2 * D - 1):
        parts = by_step.get(s, [])
        src = np.concatenate([p[0] for p in parts])
        dst = np.concatenate([p[1] for p in parts])
        off = np.concatenate([np.full(len(p[0]), p[2]) for p in parts])
        count = np.concatenate([np.full(len(p[0]), p[3]) for p in parts])
        red = np.concatenate([np.full(len(p[0]), p[4]) for p in parts])
        sched.steps.append(Step.make(src, dst, off, off, count, red))
    return sched
