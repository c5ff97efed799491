"""The torch.compile backend: ``torch.compile(model, backend="tilecc", options={...})``.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml), so the
name works without importing tilecc. Dynamo hands over each captured graph (graph
breaks give several, a guard failure a recompile); AOTAutograd decomposes it with the
table the torch.export path uses (`frontend/decompositions.py`) and gives an inference
graph under ``torch.no_grad()``, else a forward and a backward graph. Each one is
split by `runtime/partition.py` into NPU programs and fallback torch ops.

Options (all optional):

    target              hardware preset or TOML path ("tiny"), or "gpu": the whole graph
                        through the Triton backend (`codegen/triton.py`)
    fallback            torch device the unsupported ops run on ("cpu")
    cost_aware          False keeps every supported region on the NPU (True)
    fallback_flops, fallback_bandwidth, link_bandwidth, link_latency_us
                        the modelled fallback device and link (see `CostOptions`)
    plans               a list: each graph's `Plan` is appended to it (tilecc.explain)
    clock               a `runtime.graph_clock.GraphClock`: each graph's simulated time per
                        call (a training step's forward and backward, runtime/train_step.py)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tilecc.errors import TileccError
from tilecc.simulator.config import HardwareConfig

KNOWN = {"target", "fallback", "cost_aware", "fallback_flops", "fallback_bandwidth", "link_bandwidth",
         "link_latency_us", "plans", "clock"}


@dataclasses.dataclass
class BackendOptions:
    target: Any = "tiny"  # a preset name, a TOML path, "gpu", or a loaded HardwareConfig
    fallback: str = "cpu"
    cost: Any = None
    plans: list | None = None
    clock: Any = None

    @staticmethod
    def parse(options: dict | None) -> BackendOptions:
        from tilecc.runtime.partition import CostOptions

        options = dict(options or {})
        bad = sorted(set(options) - KNOWN)
        if bad:
            raise TileccError(f"unknown tilecc backend option(s) {', '.join(bad)} (known: {', '.join(sorted(KNOWN))})")
        cost = CostOptions(
            fallback_flops=float(options.get("fallback_flops", CostOptions.fallback_flops)),
            fallback_bandwidth=float(options.get("fallback_bandwidth", CostOptions.fallback_bandwidth)),
            link_bandwidth=float(options.get("link_bandwidth", CostOptions.link_bandwidth)),
            link_latency_s=float(options.get("link_latency_us", CostOptions.link_latency_s * 1e6)) * 1e-6,
            cost_aware=bool(options.get("cost_aware", True)),
        )
        plans = options.get("plans")
        if plans is not None and not isinstance(plans, list):
            raise TileccError("tilecc backend option 'plans' must be a list (each graph's plan is appended)")
        fallback = str(options.get("fallback", "cpu"))
        try:
            torch.device(fallback)
        except RuntimeError as e:
            raise TileccError(f"tilecc backend option fallback={fallback!r} is no torch device: {e}") from None
        target = options.get("target", "tiny")
        if not isinstance(target, HardwareConfig):
            target = str(target)
        return BackendOptions(target, fallback, cost, plans, options.get("clock"))


def backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None) -> Any:
    """The ``"tilecc"`` dynamo backend."""
    from torch._dynamo.backends.common import aot_autograd

    from tilecc.frontend.decompositions import aot_decompositions

    opts = BackendOptions.parse(options)
    return aot_autograd(
        fw_compiler=_graph_compiler(opts, "forward"),
        bw_compiler=_graph_compiler(opts, "backward"),
        inference_compiler=_graph_compiler(opts, "inference"),
        decompositions=aot_decompositions(),
    )(gm, example_inputs)


def _graph_compiler(opts: BackendOptions, kind: str) -> Any:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        # torch's stub: aot_autograd re-exports make_boxed_func without listing it in __all__
        from torch._functorch.aot_autograd import make_boxed_func  # pyright: ignore[reportPrivateImportUsage]

        from tilecc.runtime.partition import partition_graph
        from tilecc.simulator.config import load_config

        if opts.target == "gpu":  # Triton kernels with the tiny preset's tile sizes
            plan, run = partition_graph(gm, load_config("tiny"), opts.cost, kind, device="gpu")
        else:
            plan, run = partition_graph(gm, load_config(opts.target), opts.cost, kind)
            if opts.fallback != "cpu":
                run = _on_device(run, torch.device(opts.fallback))
        if opts.plans is not None:
            opts.plans.append(plan)
        if opts.clock is not None:
            run = opts.clock.wrap(kind, plan, run)
        return make_boxed_func(run)

    return compile_graph


def _on_device(run: Any, device: torch.device) -> Any:
    """Fallback ops on `device`: tensor inputs move there, outputs return to the caller's."""

    def call(*args: Any) -> Any:
        back = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        moved = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        out = run(*moved)
        if isinstance(out, list | tuple):
            return type(out)(o.to(back) if isinstance(o, torch.Tensor) else o for o in out)
        return out.to(back) if isinstance(out, torch.Tensor) else out

    return call
