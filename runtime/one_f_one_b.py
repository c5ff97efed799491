"""The 1F1B pipeline schedule for training (PipeDream-flush, Narayanan et al. 2021):
warm-up forwards, then one forward and one backward in turn, then the cool-down backwards.

    ops, total = one_f_one_b(fwd_ns=[1, 1], bwd_ns=[1, 1], micro_batches=4)
    # stage 0: F0 F1 B0 F2 B1 F3 B2 B3 ; stage 1: F0 B0 F1 B1 F2 B2 F3 B3 ; total 10

Stage k of P runs min(P - 1 - k, M) warm-up forwards, then M - warm-up pairs (forward of the
next micro-batch, backward of the oldest), then the remaining backwards. A forward of
micro-batch m on stage k waits for stage k-1's forward of m plus the activation's transfer
(`send_ns[k-1]`); a backward on stage k < P-1 waits for stage k+1's backward of m plus the
gradient's transfer (`grad_send_ns[k]`); each stage runs its operations in that order, one
at a time. With equal stages and free transfers the step is (M + P - 1)(F + B) and the
bubble (P - 1)(F + B). At most P - k micro-batches' activations are alive on stage k (the
point of 1F1B against GPipe's M).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecc.errors import TileccError


@dataclass
class PipeOp:
    stage: int
    kind: str  # "F" or "B"
    micro: int
    start_ns: float = 0.0
    end_ns: float = 0.0


def stage_order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    warm = min(stages - 1 - stage, micro_batches)
    order = [("F", m) for m in range(warm)]
    for i in range(micro_batches - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", m) for m in range(micro_batches - warm, micro_batches)]


def one_f_one_b(fwd_ns: list[float], bwd_ns: list[float], micro_batches: int, send_ns: list[float] | None = None,
                grad_send_ns: list[float] | None = None) -> tuple[list[PipeOp], float]:
    """Every stage's operations with their times, and the step's end (ns)."""
    p = len(fwd_ns)
    if p < 1 or len(bwd_ns) != p:
        raise TileccError(f"1F1B: {len(fwd_ns)} forward and {len(bwd_ns)} backward stage times (one each per stage)")
    if micro_batches < 1:
        raise TileccError(f"1F1B: micro_batches must be >= 1, got {micro_batches}")
    send = list(send_ns or [0.0] * (p - 1))
    gsend = list(grad_send_ns or send)
    orders = [stage_order(k, p, micro_batches) for k in range(p)]
    done: dict[tuple[int, str, int], float] = {}
    pos, free = [0] * p, [0.0] * p
    ops: list[PipeOp] = []
    left = sum(len(o) for o in orders)
    while left:
        progress = False
        for k in range(p):
            while pos[k] < len(orders[k]):
                kind, m = orders[k][pos[k]]
                need = (k - 1, "F", m) if kind == "F" and k > 0 else (k + 1, "B", m) if kind == "B" and k < p - 1 \
                    else (k, "F", m) if kind == "B" else None
                if need is not None and need not in done:
                    break
                dep = 0.0 if need is None else done[need] + (send[k - 1] if kind == "F" else
                                                             gsend[k] if k < p - 1 else 0.0)
                start = max(free[k], dep)
                end = start + (fwd_ns[k] if kind == "F" else bwd_ns[k])
                ops.append(PipeOp(k, kind, m, start, end))
                done[(k, kind, m)] = free[k] = end
                pos[k] += 1
                left -= 1
                progress = True
        if not progress:  # cannot happen for 1F1B; guards a broken order
            raise TileccError("1F1B: the schedule deadlocked")
    return ops, max(free)
