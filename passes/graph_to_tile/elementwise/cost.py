"""The elementwise kernel's cost model: the tile shape and buffering depth from the config.

`choose_tiles` estimates the pipelined kernel for every tile width of `col_candidates`
and 2-4 buffer sets D that fit SRAM, with the simulator's timing rules
(`tilecc.simulator.timing`): tiles x max(vector time, DMA time: fixed latency spread
over the queues, bytes over the bandwidth) plus the exposed first load and last store
(`estimate_cycles`); `vector_steps` lists a tile body's vector instructions (cost per
lane group times inputs, column-sized or not). For example (``cloud``)::

    y = x + z : [4096 x 4096] bf16      vector_steps = [(2.0, False)]   (a binary op, two tiles)
      -> choose_tiles(cfg, (4096, 4096), 128, col_candidates(4096), budget, [2, 2], [2], 0, steps)
         = (689102.2, 2048, 2)           tiles 128 x 2048, loads and stores buffered x2
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tilecc.passes.graph_to_tile.elementwise.dag import Imm, Node, Value, value_class
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import TimingRules


def vector_steps(values: list[Value], cfg: HardwareConfig) -> list[tuple[float, bool]]:
    """(cost x inputs, column-sized) of every vector instruction of a tile body."""
    costs = cfg.vector.op_cost
    steps: list[tuple[float, bool]] = []
    for v in values:
        if not isinstance(v, Node):
            continue
        col = v.cls == "column"
        if v.kind == "unary":
            steps.append((costs.unary[v.fn], col))
        elif v.kind == "binary":
            two = all(value_class(values[a]) == "tile" for a in v.args)
            steps.append((costs.binary[v.fn] * (2 if two else 1), col))
        elif v.kind == "where":
            steps += [(2 * costs.binary["mask"], col), (costs.binary["eq"], col),
                      (2 * costs.binary["mask"], col), (2 * costs.binary["add"], col)]
        elif v.kind == "layer_norm":
            steps += [(costs.reduce["sum"], False), (costs.binary["sub"], False), (costs.unary["square"], False),
                      (costs.reduce["sum"], False), (costs.binary["mul"], False)] + [(1.0, True)] * 4
            w, b = values[v.args[1]], values[v.args[2]]
            if not (isinstance(w, Imm) and w.value == 1.0):
                steps.append((2 * costs.binary["mul"], False))
            if not (isinstance(b, Imm) and b.value == 0.0):
                steps.append((2 * costs.binary["add"], False))
        elif v.kind == "rms_norm":
            steps += [(costs.unary["square"], False), (costs.reduce["sum"], False), (costs.binary["mul"], False)]
            steps += [(1.0, True)] * 3
            w = values[v.args[1]]
            if not (isinstance(w, Imm) and w.value == 1.0):
                steps.append((2 * costs.binary["mul"], False))
        elif v.kind == "softmax":
            steps += [(costs.reduce["max"], False), (costs.binary["sub"], False), (costs.unary["exp"], False),
                      (costs.reduce["sum"], False), (costs.binary["mul"], False)] + [(1.0, True)]
        else:  # log_softmax
            steps += [(costs.reduce["max"], False), (costs.binary["sub"], False), (costs.unary["exp"], False),
                      (costs.reduce["sum"], False), (costs.binary["sub"], False)] + [(1.0, True)]
    return steps


def choose_tiles(cfg: HardwareConfig, kshape: Sequence[int], TR: int, widths: Sequence[int], budget: int,
                 leaf_isz: list[int], stored_isz: list[int], temp_isz: int,
                 steps: list[tuple[float, bool]]) -> tuple[float, int, int] | None:
    """(estimated cycles, TC, D) of the fastest tiles TR x TC (TC among `widths`) and
    buffer sets D whose buffers fit `budget` bytes per partition; None if none fits.
    `leaf_isz` / `stored_isz`: element sizes of the loaded and stored tiles, `temp_isz`
    the bytes per column of the temporaries."""
    tm = TimingRules(cfg)
    best: tuple[float, int, int] | None = None
    for TC in widths:
        for D in (2, 3, 4):
            sram = D * TC * (sum(leaf_isz) + sum(stored_isz)) + TC * temp_isz
            if sram > budget:
                continue
            est = estimate_cycles(tm, kshape, TR, TC, D, leaf_isz, stored_isz, steps)
            if best is None or est < best[0] - 1e-9:
                best = (est, TC, D)
    return best


def estimate_cycles(tm: TimingRules, kshape: Sequence[int], TR: int, TC: int, D: int, leaf_isz: list[int],
                    stored_isz: list[int], steps: list[tuple[float, bool]]) -> float:
    """Pipelined time of the kernel for tiles TR x TC and D buffer sets (cycles)."""
    cfg = tm.cfg
    R, C = kshape[-2], kshape[-1]
    outer = math.prod(kshape[:-2]) if len(kshape) > 2 else 1
    n_tiles = outer * -(-R // TR) * -(-C // TC)
    vec = sum(tm.vector_time(TR, 1 if col else TC, f) for f, col in steps)
    isz = leaf_isz + stored_isz
    n = len(isz)
    fixed = tm.dma_fixed(TR)  # one descriptor per row
    data = [tm.dma_transfer(TR, TC, s) for s in isz]
    # transfers in flight: the next D-1 tiles' loads and this tile's stores, one per queue
    n_load = len(leaf_isz)
    in_flight = max(1, min(cfg.dma.queues, n_load * (D - 1) + len(stored_isz)))
    # at best the shared engines and HBM are always busy (`dma_occupancy`: the transfer
    # time alone for a full-rate transfer), at worst each queue runs its own
    busy = sum(tm.dma_occupancy(TR, TC, s) for s in isz)
    dma = max(busy, (n * fixed + sum(data)) / in_flight) if n else 0.0
    per_tile = max(vec, dma)
    load0 = fixed + max(data[: len(leaf_isz)], default=0.0)
    store_last = fixed + max(data[len(leaf_isz):], default=0.0)
    return n_tiles * per_tile + load0 + store_last + vec


def col_candidates(C: int) -> list[int]:
    """Tile widths to try for C columns: C, the powers of two below it, C / k rounded up."""
    out = {C}
    t = 1
    while t < C:
        out.add(t)
        t *= 2
    for k in (2, 3, 4, 6, 8):
        out.add(-(-C // k))
    return sorted(out)
