"""`tilecc.explain(model, *inputs)`: how torch.compile(backend="tilecc") splits a model.

    e = tilecc.explain(model, x)                 # runs the model once, compiled
    print(e)                                     # every graph's partitions, fallbacks, transfers
    e.plans[0].fallbacks                         # [Fallback(op, location, reason), ...]

With ``training=True`` the model also runs a backward pass (of the outputs' sum), so the
backward graph's plan is reported too; the parameters' ``.grad`` are restored after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tilecc.runtime.partition import Plan


@dataclass
class Explanation:
    plans: list[Plan] = field(default_factory=list)
    outputs: Any = None

    @property
    def graphs(self) -> int:
        """Graphs dynamo captured (a graph break makes two)."""
        return sum(p.kind != "backward" for p in self.plans)

    @property
    def graph_breaks(self) -> int:
        return max(0, self.graphs - 1)

    @property
    def fallbacks(self) -> list:
        return [f for p in self.plans for f in p.fallbacks]

    @property
    def npu_ops(self) -> int:
        """Graph ops compiled by tilecc, over every graph."""
        return sum(sum(q.ops.values()) for p in self.plans for q in p.npu_partitions)

    @property
    def fallback_ops(self) -> int:
        return sum(p.fallback_ops for p in self.plans)

    @property
    def npu_share(self) -> float:
        """The share of the graphs' ops that ran on the NPU (0..1)."""
        total = self.npu_ops + self.fallback_ops
        return self.npu_ops / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": self.graphs, "graph_breaks": self.graph_breaks, "npu_ops": self.npu_ops,
                "fallback_ops": self.fallback_ops, "npu_share": self.npu_share,
                "plans": [p.to_dict() for p in self.plans]}

    def __str__(self) -> str:
        head = (f"{self.graphs} graph(s), {self.graph_breaks} graph break(s); {self.npu_ops} of "
                f"{self.npu_ops + self.fallback_ops} op(s) on the NPU ({self.npu_share:.1%})")
        return "\n".join([head] + [str(p) for p in self.plans])


def explain(model: Any, *inputs: Any, target: str = "tiny", training: bool = False, **options: Any) -> Explanation:
    """Compile `model` with the tilecc backend, run it once on `inputs`, return the plans."""
    plans: list[Plan] = []
    backend_options: dict[str, Any] = {"target": target, "plans": plans, **options}  # any values, read by the backend
    compiled = torch.compile(model, backend="tilecc", options=backend_options)
    if not training:
        with torch.no_grad():
            out = compiled(*inputs)
        return Explanation(plans, out)
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    saved = [p.grad for p in params]
    out = compiled(*inputs)
    flat = out if isinstance(out, list | tuple) else [out]
    total = sum(o.float().sum() for o in flat if isinstance(o, torch.Tensor) and o.requires_grad)
    if isinstance(total, torch.Tensor):
        total.backward()
    for p, g in zip(params, saved):
        p.grad = g
    return Explanation(plans, out)
