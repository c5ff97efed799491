"""A training step on one chip: the forward and backward graphs of a loss, compiled to NPU
programs through the torch.compile path (frontend/dynamo.py: AOTAutograd's forward and
backward graphs, split by runtime/partition.py) and simulated, with their timeline.

    step = TrainStep(model, target="tiny", loss="mean")
    r = step.run(ids)                 # r.loss, r.grads[fqn] (equal eager autograd's), r.input_grads
    r.forward_ns, r.backward_ns       # the simulated graphs (graph_clock.py's rule)
    r.grad_ready_ns[fqn]              # when the backward made that gradient, from its start

`loss`: "sum" or "mean" of the model's (first) output, "cross_entropy" (the output is logits
[..., V], `target=` the class ids), or None: the step is a pipeline stage's, the output is
returned and the backward takes `grad_output=` (the next stage's input gradient).
`input_grad=True` also returns the gradients of the floating-point inputs (a stage's
activations; a list of flags: of the inputs flagged), with their ready times. Every region
runs on the NPU where it can (`cost_aware=False`: a small model's islands would otherwise
go to the fallback for their transfer cost).

A gradient is matched to its parameter by identity (autograd stores the backward's output
tensor as `.grad` when it was None) or, failing that, by value; its ready time is then the
backward graph output's (graph_clock.py). `timing_only=True` runs a meta-device model:
shapes only, no values (the gradients are meta tensors).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tilecc.errors import TileccError
from tilecc.runtime.graph_clock import GraphClock, GraphRun

LOSSES = ("sum", "mean", "cross_entropy")


class _WithLoss(nn.Module):
    def __init__(self, model: nn.Module, loss: str | None):
        super().__init__()
        self.model = model
        self.loss = loss
        # dynamo keeps its compiled graphs, and counts recompiles against its limit (8), per code
        # object: every step gets its own copy of forward's, so the steps of different modules
        # (a model's segments: runtime/tp_train.py) do not share one budget
        f = _WithLoss._forward
        fresh = types.FunctionType(f.__code__.replace(), f.__globals__, "forward", f.__defaults__, f.__closure__)
        fresh.__kwdefaults__ = f.__kwdefaults__
        self.forward = types.MethodType(fresh, self)

    def _forward(self, *inputs: Any, target: torch.Tensor | None = None) -> torch.Tensor:
        out = self.model(*inputs)
        if self.loss is None:  # a stage: every output
            return out
        if isinstance(out, tuple | list):
            out = out[0]
        if hasattr(out, "last_hidden_state"):
            out = out.last_hidden_state
        if self.loss == "sum":
            return out.float().sum()
        if self.loss == "mean":
            return out.float().mean()
        assert target is not None
        return nn.functional.cross_entropy(out.float().flatten(0, -2), target.flatten())


@dataclass
class StepResult:
    loss: torch.Tensor | None  # None for a stage without the loss
    output: Any  # the loss, or the stage's output(s)
    grads: dict[str, torch.Tensor]  # parameter FQN (of the model given) -> gradient
    input_grads: list[torch.Tensor | None]
    forward_ns: float
    backward_ns: float
    grad_ready_ns: dict[str, float]  # from the backward's start
    input_grad_ready_ns: list[float | None] = field(default_factory=list)  # as input_grads
    forward_runs: list[GraphRun] = field(default_factory=list)
    backward_runs: list[GraphRun] = field(default_factory=list)


class TrainStep:
    def __init__(self, model: nn.Module, *, target: str = "tiny", loss: str | None = "sum",
                 cost_aware: bool = False, timing_only: bool = False):
        from tilecc.frontend.dynamo import backend

        if loss is not None and loss not in LOSSES:
            raise TileccError(f"train step: loss={loss!r} is not known (allowed: {', '.join(LOSSES)} or None)")
        self.model = model
        self.loss = loss
        self.target = target
        self.timing_only = timing_only
        self.clock = GraphClock(timing_only=timing_only)
        self.plans: list = []
        self.module = _WithLoss(model.train(), loss)
        opts = {"target": target, "cost_aware": cost_aware, "clock": self.clock, "plans": self.plans}
        # static shapes: a shape seen before in this process would otherwise make dynamo mark dims
        # dynamic, and tilecc compiles per concrete shape
        self.compiled = torch.compile(self.module, backend=lambda gm, ex: backend(gm, ex, opts), dynamic=False)

    def run(self, *inputs: torch.Tensor, target: torch.Tensor | None = None, grad_output: Any = None,
            input_grad: bool | Sequence[bool] = False) -> StepResult:
        return self.backward(self.forward(*inputs, target=target, input_grad=input_grad), grad_output)

    def forward(self, *inputs: torch.Tensor, target: torch.Tensor | None = None,
                input_grad: bool | Sequence[bool] = False) -> Pending:
        """The forward alone (a pipeline runs several before their backwards)."""
        if self.loss == "cross_entropy" and target is None:
            raise TileccError("train step: loss='cross_entropy' needs target= (the class ids)")
        flags = [input_grad] * len(inputs) if isinstance(input_grad, bool) else list(input_grad)
        xs = tuple(x.detach().requires_grad_(f and x.is_floating_point()) for x, f in zip(inputs, flags, strict=True))
        self.clock.take()
        out = self.compiled(*xs, target=target) if target is not None else self.compiled(*xs)
        fwd = self.clock.take()
        if not fwd:
            raise TileccError("train step: torch.compile ran the model without tilecc's graphs (a recompile "
                              "limit or a graph break into eager); nothing was simulated")
        return Pending(out, xs, fwd)

    def backward(self, pending: Pending, grad_output: Any = None) -> StepResult:
        """The backward of `pending`; `grad_output`: a stage's output gradient (a list for
        several outputs, None where an output takes none). The gradients are this
        backward's alone (`.grad` is reset first)."""
        if self.loss is None and grad_output is None:
            raise TileccError("train step: a stage without a loss needs grad_output= for its backward")
        params = dict(self.model.named_parameters())
        for p in params.values():
            p.grad = None
        out: Any = pending.output
        if self.loss is not None:
            out.backward()
        else:
            outs = list(out) if isinstance(out, tuple | list) else [out]
            gos = list(grad_output) if isinstance(grad_output, tuple | list) else [grad_output]
            pairs = [(o, g) for o, g in zip(outs, gos) if g is not None and o.requires_grad]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        bwd = self.clock.take()
        grads = {k: p.grad for k, p in params.items() if p.grad is not None}
        ready = _ready_times(grads, bwd, self.timing_only)
        igrads = [x.grad for x in pending.inputs]
        iready = _ready_times({str(i): g for i, g in enumerate(igrads) if g is not None}, bwd, self.timing_only)
        detached = _detach(out)
        loss = detached if self.loss is not None and isinstance(detached, torch.Tensor) else None
        return StepResult(loss, detached, grads, igrads, sum(r.time_ns for r in pending.forward_runs),
                          sum(r.time_ns for r in bwd), ready, [iready.get(str(i)) for i in range(len(igrads))],
                          pending.forward_runs, bwd)


@dataclass
class Pending:
    output: Any
    inputs: tuple
    forward_runs: list[GraphRun]


def _detach(out: Any) -> Any:
    return out.detach() if isinstance(out, torch.Tensor) else tuple(o.detach() for o in out)


def _ready_times(grads: dict[str, torch.Tensor], runs: list[GraphRun], timing_only: bool) -> dict[str, float]:
    """Each gradient's time in the backward: its graph output's ready time, the earlier
    backward graphs' times before it (graphs run one after the other)."""
    total = sum(r.time_ns for r in runs)
    if timing_only:  # no values to match by: every gradient at the backward's end
        return dict.fromkeys(grads, total)
    cands: list[tuple[torch.Tensor, float]] = []
    base = 0.0
    for r in reversed(runs):  # AOTAutograd runs the backward graphs last graph first
        cands += [(o, base + t) for o, t in zip(r.outputs, r.output_ready_ns) if isinstance(o, torch.Tensor)]
        base += r.time_ns
    out: dict[str, float] = {}
    for name, g in grads.items():
        hit = [t for o, t in cands if o.data_ptr() == g.data_ptr() and o.shape == g.shape]
        if not hit:
            hit = [t for o, t in cands if o.shape == g.shape and o.dtype == g.dtype and torch.equal(o, g)]
        out[name] = max(hit) if hit else total
    return out
