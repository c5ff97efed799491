"""The compiler driver: graph program -> pass pipeline -> expanded stream -> Program."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import MemRefType, ModuleOp

from tilecc.codegen.expand import expand_module
from tilecc.ir import tile
from tilecc.ir.graph import GraphProgram
from tilecc.passes.registry import default_pipeline
from tilecc.passes.tile_to_npu import HbmTensor, dtype_of, hbm_bindings
from tilecc.runtime.program import Program, TensorSpec
from tilecc.simulator import numerics
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import ITEMSIZE, BinaryFn, Flag, Opcode, UnaryFn

StageCallback = Callable[[str, ModuleOp], None]


@dataclass
class CompileStats:
    pass_seconds: dict[str, float] = field(default_factory=dict)
    total_seconds: float = 0.0


def compile_graph(
    gp: GraphProgram,
    cfg: HardwareConfig,
    *,
    after_pass: StageCallback | None = None,
    stats: CompileStats | None = None,
) -> Program:
    t0 = time.perf_counter()
    module = gp.module.clone()
    layout: _Layout | None = None
    for name, run in default_pipeline(cfg):
        if name == "lower-tile-to-npu":
            layout = _read_layout(module, gp)
        ts = time.perf_counter()
        run(module)
        if stats is not None:
            stats.pass_seconds[name] = time.perf_counter() - ts
        if after_pass is not None:
            after_pass(name, module)
    assert layout is not None
    stream, kernels = expand_module(module)
    program = Program(
        stream=stream,
        kernels=kernels,
        inputs=layout.inputs,
        outputs=layout.outputs,
        weights=layout.weights,
        weight_data=layout.weight_data,
        hbm_size=layout.hbm_size,
        config=cfg,
        work=work_figures(stream, layout, cfg),
    )
    if stats is not None:
        stats.total_seconds = time.perf_counter() - t0
    return program


@dataclass
class _Layout:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: list[TensorSpec]
    weight_data: dict[str, np.ndarray]
    hbm_size: int


def _spec(name: str, t: HbmTensor) -> TensorSpec:
    return TensorSpec(name, t.base, tuple(t.shape), t.dtype)


def _read_layout(module: ModuleOp, gp: GraphProgram) -> _Layout:
    main = next(f for f in module.ops if isinstance(f, func.FuncOp) and f.sym_name.data == "main")
    bound = hbm_bindings(main)
    inputs: dict[int, TensorSpec] = {}
    weights: list[TensorSpec] = []
    data: dict[str, np.ndarray] = {}
    for op in main.body.block.ops:
        if not isinstance(op, tile.HbmAllocOp):
            continue
        t = bound[op.result]
        if op.input is not None:
            idx = op.input.value.data
            inputs[idx] = _spec(gp.input_names[idx], t)
        elif op.weight is not None or op.value is not None:
            name = op.weight.data if op.weight is not None else f"__const{len(weights)}"
            if op.weight is not None:
                values = np.asarray(gp.weights[name], dtype=np.float32)
            else:
                values = np.asarray(op.value.get_values(), dtype=np.float32)
            values = values.reshape(t.shape)
            weights.append(_spec(name, t))
            data[name] = numerics.to_storage(values, t.dtype).reshape(-1).view(np.uint8).copy()
    ret = main.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    outputs = [
        _spec(gp.output_names[i] if i < len(gp.output_names) else f"out{i}", bound[v])
        for i, v in enumerate(ret.arguments)
    ]
    hbm_size = module.attributes["tile.hbm_size"].value.data
    return _Layout([inputs[i] for i in sorted(inputs)], outputs, weights, data, hbm_size)


_TRANSCENDENTAL_UNARY = {
    UnaryFn.GELU, UnaryFn.GELU_TANH, UnaryFn.EXP, UnaryFn.TANH, UnaryFn.SIGMOID, UnaryFn.SQRT,
    UnaryFn.RSQRT, UnaryFn.RECIPROCAL, UnaryFn.LOG, UnaryFn.SILU, UnaryFn.ERF,
}


def work_figures(stream: np.ndarray, layout: _Layout, cfg: HardwareConfig) -> dict[str, float]:
    """The work the roofline bound divides by peak rates (see runtime.report)."""
    op = stream["opcode"]
    mm = stream[op == Opcode.MATMUL]
    macs = mm["rows"].astype(np.int64) * mm["cols"] * mm["k"]
    fp32 = mm["a_dtype"] == 1
    vec = stream[(op == Opcode.VEC_UNARY) | (op == Opcode.VEC_BINARY) | (op == Opcode.VEC_REDUCE)]
    elems = vec["rows"].astype(np.int64) * vec["cols"]
    cost = np.ones(len(vec), dtype=np.int64)
    unary = vec["opcode"] == Opcode.VEC_UNARY
    trans = unary & np.isin(vec["func"], [int(f) for f in _TRANSCENDENTAL_UNARY])
    binary = vec["opcode"] == Opcode.VEC_BINARY
    trans |= binary & np.isin(vec["func"], [int(BinaryFn.DIV), int(BinaryFn.POW)])
    cost[trans] = cfg.vector.transcendental_cost
    two_in = binary & ((vec["flags"] & (Flag.B_IMM | Flag.B_COLUMN)) == 0)
    cost[two_in] *= 2
    compulsory = sum(s.nbytes for s in layout.inputs + layout.outputs + layout.weights)
    return {
        "macs_bf16": float(macs[~fp32].sum()),
        "macs_fp32": float(macs[fp32].sum()),
        "vector_element_cycles": float((elems * cost).sum()),
        "compulsory_hbm_bytes": float(compulsory),
    }


__all__ = ["compile_graph", "CompileStats", "MemRefType", "dtype_of", "ITEMSIZE"]
