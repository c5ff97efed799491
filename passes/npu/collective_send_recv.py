"""npu-collective-send-recv: a point-to-point transfer between two chips (a pipeline's
activations from stage k to stage k+1) lowered into the two chips' link records.

The sender sends the `elements` elements at X in `chunks` pieces on link queue 0; the
receiver receives them in the same pieces on link queue 1 and writes them to Y (a chip
that is neither gets no records). The pieces pipeline over the route (cut-through: alpha
+ S/B alone, simulator/multichip.py), and a consumer kernel on the receiver that reads
Y waits, through codegen/link.py, only for the pieces it reads.

Before:

    send_recv(x: f32[8] at X, 0 -> 1) -> y: f32[8] at Y        chunks = 2

After (chip 0, then chip 1):

    link.send l0 hbm[X+0 ...]:f32 -> chip1 1x4      signal(s0)
    link.send l0 hbm[X+16 ...]:f32 -> chip1 1x4     signal(s0)

    link.recv l1 chip0 -> hbm[Y+0 ...]:f32 1x4      signal(s1)
    link.recv l1 chip0 -> hbm[Y+16 ...]:f32 1x4     signal(s1)
"""

from __future__ import annotations

import numpy as np

from tilecc.passes.npu.collective_lowering import CollectiveLoweringError, lower_schedule
from tilecc.simulator.interconnect.schedule import Schedule, Step
from tilecc.simulator.isa import DType

__all__ = ["send_recv"]


def send_recv(rank: int, n: int, src: int, dst: int, x_addr: int, y_addr: int, elements: int, dtype: DType,
              chunks: int = 1) -> np.ndarray:
    """Chip `rank`'s records of chip `src` sending X to chip `dst`'s Y (n chips)."""
    if not (0 <= src < n and 0 <= dst < n) or src == dst:
        raise CollectiveLoweringError(f"send_recv from chip {src} to chip {dst}: two different chips of the {n}")
    if elements < 1:
        raise CollectiveLoweringError(f"send_recv of {elements} elements: the size must be >= 1")
    sched = Schedule("send_recv", "direct", n, elements, peer=dst)
    sched.steps.append(Step.make([src], [dst], 0, 0, elements, False))
    return lower_schedule(sched, rank, x_addr, y_addr, dtype, chunks)
