"""Direct collectives: all-to-all by pairwise exchange, and send/recv.

All-to-all (pairwise): chip r's buffer holds its input, n blocks of S/n (S a multiple of n) (block j for chip
j), then the output (block i from chip i). Step 0 copies r's own block locally; in step
t = 1..n-1 chip r sends block (r + t) mod n to chip (r + t) mod n. Time (n-1)(alpha +
S/(nB)) when every pair is one hop apart (a switch).

Send/recv: chip 0 sends its S elements to chip `peer` in one transfer (a route's links
forward it cut-through: alpha(route) + S/B).
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.interconnect.schedule import Schedule, Step


def all_to_all(n: int, elements: int) -> Schedule:
    """`elements` a multiple of n (collective.py checks): blocks of b = elements / n."""
    sched = Schedule("all_to_all", "pairwise", n, elements)
    chips, b = np.arange(n, dtype=np.int64), elements // n
    for t in range(n):
        dst = (chips + t) % n
        sched.steps.append(Step.make(chips, dst, dst * b, elements + chips * b, b, False))
    return sched


def send_recv(n: int, elements: int, peer: int) -> Schedule:
    sched = Schedule("send_recv", "direct", n, elements, peer=peer)
    sched.steps.append(Step.make([0], [peer], 0, 0, elements, False))
    return sched
