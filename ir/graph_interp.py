"""A numpy interpreter for `graph`-level programs (the numeric reference).

Values are float32 arrays holding values exactly representable in each SSA value's
element type: every op computes on float32 (or wider) values through its `reference`
and the result is rounded to the result element type with `numerics.round_to`,
the way eager PyTorch rounds bf16 / f16 after every op.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
from xdsl.dialects import func
from xdsl.ir import Block, SSAValue

from tilecc.errors import InputMismatchError
from tilecc.ir.graph import GraphOp, GraphProgram, WeightOp, element_dtype, shape_of, source_loc
from tilecc.ir.graph_fusion import FusedOp, YieldOp
from tilecc.simulator.isa import DType
from tilecc.simulator.numerics import round_to as _round_to


def round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    """`numerics.round_to` that keeps the shape of rank-0 arrays."""
    x = np.asarray(x, dtype=np.float32)
    return np.asarray(_round_to(x, dtype), dtype=np.float32).reshape(x.shape)


def _as_array(x: object) -> np.ndarray:
    """`x` as a numpy array; a torch tensor (anything with ``detach``) is read as float32."""
    if hasattr(x, "detach"):
        tensor: Any = x  # a torch tensor; torch is not imported here
        return np.asarray(tensor.detach().float().numpy())
    return np.asarray(x)


@overload
def run_graph(
    program: GraphProgram, inputs: list[np.ndarray], keep: Literal[False] = False
) -> list[np.ndarray]: ...


@overload
def run_graph(
    program: GraphProgram, inputs: list[np.ndarray], keep: Literal[True]
) -> tuple[list[np.ndarray], dict[SSAValue, np.ndarray]]: ...


def run_graph(
    program: GraphProgram, inputs: list[np.ndarray], keep: bool = False
) -> list[np.ndarray] | tuple[list[np.ndarray], dict[SSAValue, np.ndarray]]:
    """Evaluate ``@forward`` on float32 `inputs`; return the float32 outputs.

    With ``keep=True`` returns ``(outputs, values)`` where `values` maps every SSA
    value of the function (arguments included) to its array.
    """
    fn = program.func
    args = fn.body.block.args
    if len(inputs) != len(args):
        raise InputMismatchError(
            f"the program takes {len(args)} input(s) "
            f"({', '.join(program.input_names) or '-'}), got {len(inputs)}"
        )
    env: dict[SSAValue, np.ndarray] = {}
    for i, (arg, x) in enumerate(zip(args, inputs)):
        x = _as_array(x)
        expected = shape_of(arg)
        if tuple(x.shape) != expected:
            name = program.input_names[i] if i < len(program.input_names) else f"#{i}"
            raise InputMismatchError(
                f"input {name}: expected shape {list(expected)}, got {list(x.shape)}"
            )
        env[arg] = round_to(np.asarray(x, dtype=np.float32), element_dtype(arg.type))

    outputs = _run_block(program, fn.body.block, env)
    if outputs is None:
        raise ValueError("@forward has no func.return")
    if keep:
        return outputs, env
    return outputs


def _run_block(program: GraphProgram, block: Block, env: dict[SSAValue, np.ndarray]) -> list[np.ndarray] | None:
    """Evaluate the ops of `block` into `env`; the values its terminator returns
    (`func.return` or `graph.yield`), None without one."""
    for op in block.ops:
        if isinstance(op, (func.ReturnOp, YieldOp)):
            return [env[v] for v in op.operands]
        if isinstance(op, FusedOp):
            for arg, v in zip(op.block.args, op.inputs, strict=True):
                env[arg] = env[v]
            vals = _run_block(program, op.block, env)
            assert vals is not None
            for res, val in zip(op.results, vals, strict=True):
                env[res] = val
            continue
        if isinstance(op, WeightOp):
            try:
                data = program.weights[op.weight]
            except KeyError:
                raise KeyError(f"graph.weight {op.weight!r} has no data in program.weights") from None
            val = np.asarray(data, dtype=np.float32)
            if tuple(val.shape) != shape_of(op.result):
                raise ValueError(
                    f"graph.weight {op.weight!r}: data shape {list(val.shape)} does not match "
                    f"{op.result.type}"
                )
        elif isinstance(op, GraphOp):
            val = op.reference(*(env[o] for o in op.operands))
        else:
            raise NotImplementedError(f"run_graph: cannot evaluate {op.name} ({source_loc(op)})")
        res = op.results[0]
        val = np.asarray(val, dtype=np.float32)
        if tuple(val.shape) != shape_of(res):
            raise AssertionError(
                f"{op.name} at {source_loc(op)}: reference produced shape {list(val.shape)}, "
                f"type says {res.type}"
            )
        env[res] = round_to(val, element_dtype(res.type))
    return None
