"""Functional mode: a schedule run on real numpy data, one buffer per chip.

    outs = run(schedule, inputs)   # inputs[r]: chip r's input (io_slices), any dtype
    # all_reduce: outs[r] == sum(inputs); all_gather: the concatenation of the shards;
    # reduce_scatter: shard r of the sum; all_to_all: block i of outs[r] == block r of inputs[i]

Each step reads its sources as they were when it began (schedule.py's semantics) and
applies its transfers in order, adding (`reduce`) or overwriting.
"""

from __future__ import annotations

import numpy as np

from tilecc.simulator.interconnect.schedule import CollectiveError, Schedule


def run(schedule: Schedule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    n = schedule.n
    if len(inputs) != n:
        raise CollectiveError(f"{schedule.collective}: {len(inputs)} inputs for {n} chips (one per chip)")
    dtype = np.result_type(*inputs)
    buf = np.zeros((n, schedule.buffer_elements), dtype)
    for r, x in enumerate(inputs):
        where, _ = schedule.io_slices(r)
        want = where.stop - where.start
        if x.ndim != 1 or len(x) != want:
            raise CollectiveError(f"{schedule.collective}: chip {r}'s input has shape {x.shape}, expected ({want},)")
        buf[r, where] = x
    for step in schedule.steps:
        before = buf.copy()
        for s, d, so, do, c, red in zip(step.src, step.dst, step.src_off, step.dst_off, step.count, step.reduce):
            data = before[s, so:so + c]
            if red:
                buf[d, do:do + c] += data
            else:
                buf[d, do:do + c] = data
    return [buf[r, schedule.io_slices(r)[1]].copy() for r in range(n)]
