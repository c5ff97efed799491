"""Run a graph program through the Triton backend (`codegen/triton.py`).

    outputs, sources = run_on_triton(gp, cfg, inputs)

The graph is lowered with the NPU pipeline up to the tile dialect (the same tiling and
fusion decisions), every kernel is emitted as ``@triton.jit`` source (`sources`, one per
kernel, kept for inspection) and `@main` is executed on the host: each `tile.hbm_alloc`
is a torch tensor (inputs copied in, weights and constants filled), `tile.view` a
reshape of the same storage, each `func.call` one launch on grid ``(1,)``. Without a GPU
the kernels run on CPU tensors under ``TRITON_INTERPRET=1`` (set here if CUDA is absent).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, MemRefType, NoneAttr

from tilecc.codegen.triton import emit_kernel
from tilecc.errors import TileccError
from tilecc.ir import tile
from tilecc.ir.graph import GraphProgram
from tilecc.ir.weight_layout import weight_values
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
    for name, run in default_pipeline(cfg, 2, None, resident=False):  # each Triton kernel has its own memory
        if name == "lower-tile-to-npu":
            break
        run(module)
    return module


def prepare_triton(gp: GraphProgram, cfg: HardwareConfig) -> tuple[dict, dict, dict]:
    """(functions by name, jitted kernels, Triton sources) of `gp` lowered for `cfg`.

    Without CUDA the kernels can only run under Triton's interpreter on CPU tensors:
    ``TRITON_INTERPRET=1`` is set then (Triton reads it when a kernel is defined)."""
    return prepare_tile_module(lower_to_tile(gp, cfg))


def prepare_tile_module(module: Any) -> tuple[dict, dict, dict]:
    """(functions by name, jitted kernels, Triton sources) of a tile-level module (the
    graph compiler's after plan-hbm, or a tile-DSL kernel's)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(tl.sigmoid, InterpretedFunction):
            raise TileccError(
                "no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set: "
                "set TRITON_INTERPRET=1 in the environment to run the Triton backend on the CPU"
            )
    funcs = {f.sym_name.data: f for f in module.ops if isinstance(f, func.FuncOp)}
    emitted = {n: emit_kernel(f) for n, f in funcs.items() if tile.KERNEL_ATTR in f.attributes}
    kernels = {n: (k.compile(), k.scratch_elems) for n, k in emitted.items()}
    return funcs, kernels, {n: k.source for n, k in emitted.items()}


def run_on_triton(gp: GraphProgram, cfg: HardwareConfig, inputs: tuple, device: str = "cpu",
                  prepared: tuple | None = None) -> tuple[list, dict]:
    return run_prepared(prepared or prepare_triton(gp, cfg), gp.weights, inputs, device)


def run_prepared(prepared: tuple, weights: dict, inputs: tuple, device: str = "cpu") -> tuple[list, dict]:
    """Execute `@main` of a prepared module: HBM tensors as torch tensors, each launch
    one Triton kernel; (outputs, Triton sources)."""
    funcs, kernels, sources = prepared
    env: dict = {}
    roots: dict = {}  # value -> the flat tensor of its tile.hbm_alloc (views alias it)
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
                buf.copy_(torch.from_numpy(np.asarray(weight_values(weights, op.weight.data))).reshape(shape))
            elif op.value is not None:
                buf.copy_(torch.tensor(np.asarray(op.value.get_values()), dtype=torch.float32).reshape(shape))
            env[op.result] = buf
            roots[op.result] = buf.reshape(-1)
        elif isinstance(op, tile.ViewOp):
            env[op.result] = _view(env[op.source], op.result.type, roots, op)
            roots[op.result] = roots[op.source]
        elif isinstance(op, func.CallOp):
            fn, scratch = kernels[op.callee.root_reference.data]
            fn[(1,)](*[env[a] for a in op.arguments], torch.zeros(scratch, dtype=torch.float32, device=device))
        elif isinstance(op, func.ReturnOp):
            return [env[a] for a in op.arguments], sources
    raise AssertionError("@main has no return")



def _view(src: torch.Tensor, t: MemRefType, roots: dict, op: tile.ViewOp) -> torch.Tensor:
    """`tile.view`: a row-major reshape of the source's elements, or a strided window of
    its allocation (the layout's strides and offset, in elements of the allocation)."""
    shape = [int(d) for d in t.get_shape()]
    if isinstance(t.layout, NoneAttr):
        return src.reshape(shape) if src.is_contiguous() else src.contiguous().reshape(shape)
    strides, offset = tile.layout_of(t)
    return roots[op.source].as_strided(shape, [int(x) for x in strides], int(offset))
