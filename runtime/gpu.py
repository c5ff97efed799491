"""Run a graph program through the Triton backend (`codegen/triton.py`).

    outputs, sources = run_on_triton(gp, cfg, inputs)

The graph is lowered with the NPU pipeline up to the tile dialect (the same tiling and
fusion decisions), every kernel is emitted as ``@triton.jit`` source (`sources`, one per
kernel, kept for inspection) and `@main` is executed on the host: each `tile.hbm_alloc`
is a torch tensor (inputs copied in, weights and constants filled), `tile.view` a
reshape of the same storage, each `func.call` one launch on grid ``(1,)``. Without a GPU
set ``TRITON_INTERPRET=1`` before Triton is imported: the kernels run on CPU tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, MemRefType

from tilecc.codegen.triton import triton_kernel, triton_source
from tilecc.ir import tile
from tilecc.ir.graph import GraphProgram
from tilecc.passes.registry import default_pipeline
from tilecc.simulator.config import HardwareConfig


def _torch_dtype(t: MemRefType) -> torch.dtype:
    e = t.element_type
    if isinstance(e, Float32Type):
        return torch.float32
    if isinstance(e, BFloat16Type):
        return torch.bfloat16
    if isinstance(e, Float16Type):
        return torch.float16
    return torch.int32


def lower_to_tile(gp: GraphProgram, cfg: HardwareConfig) -> Any:
    module = gp.module.clone()
    for name, run in default_pipeline(cfg, 2, None):
        if name == "lower-tile-to-npu":
            break
        run(module)
    return module


def prepare_triton(gp: GraphProgram, cfg: HardwareConfig) -> tuple[dict, dict, dict]:
    """(functions by name, jitted kernels, Triton sources) of `gp` lowered for `cfg`."""
    module = lower_to_tile(gp, cfg)
    funcs = {f.sym_name.data: f for f in module.ops if isinstance(f, func.FuncOp)}
    sources = {n: triton_source(f) for n, f in funcs.items() if tile.KERNEL_ATTR in f.attributes}
    kernels = {n: triton_kernel(funcs[n]) for n in sources}
    return funcs, kernels, sources


def run_on_triton(gp: GraphProgram, cfg: HardwareConfig, inputs: tuple, device: str = "cpu",
                  prepared: tuple | None = None) -> tuple[list, dict]:
    funcs, kernels, sources = prepared or prepare_triton(gp, cfg)
    env: dict = {}
    main = funcs["main"]
    for op in main.body.block.ops:
        if isinstance(op, tile.HbmAllocOp):
            t = op.result.type
            shape = [int(d) for d in t.get_shape()]
            dt = _torch_dtype(t)
            buf = torch.zeros(shape, dtype=dt, device=device)
            if op.input is not None:
                buf.copy_(inputs[op.input.value.data].reshape(shape))
            elif op.weight is not None:
                buf.copy_(torch.from_numpy(np.asarray(gp.weights[op.weight.data])).reshape(shape))
            elif op.value is not None:
                buf.copy_(torch.tensor(np.asarray(op.value.get_values()), dtype=torch.float32).reshape(shape))
            env[op.result] = buf
        elif isinstance(op, tile.ViewOp):
            env[op.result] = env[op.source].reshape([int(d) for d in op.result.type.get_shape()])
        elif isinstance(op, func.CallOp):
            kernels[op.callee.root_reference.data][(1,)](*[env[a] for a in op.arguments])
        elif isinstance(op, func.ReturnOp):
            return [env[a] for a in op.arguments], sources
    raise AssertionError("@main has no return")


def compile_gpu_graph(gm: torch.fx.GraphModule, kind: str) -> tuple[Any, Any]:
    """A torch.compile graph on the Triton backend (``options={"target": "gpu"}``).

    The whole graph is imported and its kernels emitted at the first call per input
    shape; a graph with an op or kernel the Triton path does not take runs as torch ops
    instead, and the plan says why (whole-graph granularity: no partitioning yet).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from tilecc.errors import TileccError
    from tilecc.frontend.fx_import import bindings_for, import_graph_module, tensor_inputs
    from tilecc.runtime.partition import Fallback, Partition, Plan
    from tilecc.simulator.config import load_config

    cfg = load_config("tiny")  # tile sizes of the tiny preset (small blocks for the interpreter)
    plan = Plan(kind, "gpu")
    ops: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            ops[str(n.target)] = ops.get(str(n.target), 0) + 1
    part = Partition("gpu0", "gpu", [n.name for n in gm.graph.nodes if n.op == "call_function"], ops)
    plan.partitions.append(part)
    is_tensor = tensor_inputs(gm.graph)
    programs: dict[tuple, Any] = {}

    def run(*args: Any) -> Any:
        if part.device == "fallback":
            return gm(*args)
        key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)
        with unset_fake_temporarily():
            if key not in programs:
                try:
                    programs[key] = import_graph_module(gm, bindings_for(gm.graph, args))
                except TileccError as e:
                    part.device, part.reason = "fallback", str(e).splitlines()[0]
                    plan.fallbacks.append(Fallback("graph", "<graph>", part.reason))
                    return gm(*args)
            tensors = tuple(a for a, t in zip(args, is_tensor) if t)
            try:
                outs, sources = run_on_triton(programs[key], cfg, tensors, device=str(tensors[0].device))
            except TileccError as e:
                part.device, part.reason = "fallback", str(e).splitlines()[0]
                plan.fallbacks.append(Fallback("graph", "<graph>", part.reason))
                return gm(*args)
        part.runs += 1
        part.compiled = True
        plan.sources = sources  # type: ignore[attr-defined]
        return tuple(outs)

    return plan, run
