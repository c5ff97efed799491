"""Localise a miscompilation: the first op whose output differs, and the pass to blame.

    result = bisect(model, example_inputs, cfg)        # tilecc bisect FILE.py:FACTORY
    result.matches, result.first_op, result.culprit, result.trials

1. The model is compiled as `tilecc.compile` would (-O2 by default), run on the
   simulator (sanitisers on) and compared with torch eager. If it matches there is
   nothing to find.
2. **First op.** The graph interpreter (ir/graph_interp.py, the numeric reference that
   rounds like eager) gives every intermediate value. For op k of ``@forward`` the
   program is cut after op k (op k's value becomes the only output, dead ops are
   dropped), compiled with the same pipeline and run; the first k whose output differs
   from the interpreter's value is the first op that differs (a linear scan for small
   graphs, a binary search over the cut point for large ones). Cuts that cannot be
   program outputs (strided views) are skipped.
3. **First pass.** The -O2 pipeline is rebuilt pass by pass: -O2 lowering with every
   optional graph pass switched off, then fold-norm-affine, canonicalize-graph,
   fold-norm-weight, merge-linears and fuse-graph switched back on in pipeline order. The
   first configuration whose result differs from eager names the pass after which the
   result changes; if even the first one differs, -O0 decides between the -O2 kernels (lower-graph-to-tile at -O2) and a
   pass both levels run. Each configuration is also reported with that one pass
   switched off alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType
from xdsl.rewriter import Rewriter

from tilecc.errors import TileccError
from tilecc.ir.graph import ConstantOp, GraphOp, GraphProgram, WeightOp, element_dtype, source_loc
from tilecc.ir.graph_interp import run_graph
from tilecc.simulator import numerics
from tilecc.simulator.config import HardwareConfig

OPTIONAL_PASSES = ("fold-norm-affine", "canonicalize-graph", "fold-norm-weight", "merge-linears", "fuse-graph")
LINEAR_SCAN_OPS = 48


@dataclass
class Trial:
    name: str  # e.g. "-O2 without fuse-graph"
    ok: bool | None  # None: did not compile or run
    error: float | str  # max abs error, or the error message


@dataclass
class BisectResult:
    matches: bool
    max_error: float
    first_op: str | None = None  # "graph.sub at model.py:14 (op 4 of 7)"
    first_op_index: int | None = None
    first_op_name: str | None = None
    first_op_error: float | None = None
    culprit: str | None = None
    trials: list[Trial] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"compiled vs eager  {'match' if self.matches else 'DIFFER'} (max abs error {self.max_error:.3g})"]
        if self.matches:
            return "\n".join(lines)
        lines.append(f"first op           {self.first_op or 'not found (every cut matches)'}"
                     + (f", max abs error {self.first_op_error:.3g}" if self.first_op_error is not None else ""))
        lines.append(f"first pass         {self.culprit or 'not found'}")
        lines.append("configurations:")
        for t in self.trials:
            status = "matches" if t.ok else ("DIFFERS" if t.ok is False else "failed")
            err = f"max abs error {t.error:.3g}" if isinstance(t.error, float) else t.error
            lines.append(f"  {t.name:44} {status:8} {err}")
        return "\n".join(lines)


def _tol(dtype: torch.dtype, expected: torch.Tensor) -> tuple[float, float]:
    from tilecc.runtime.compare import tolerance

    return tolerance(dtype, float(expected.float().abs().max()) if expected.numel() else 1.0)


def _compare(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[bool, float]:
    ok, worst = True, 0.0
    for g, w in zip(got, want, strict=True):
        rtol, atol = _tol(w.dtype, w)
        diff = (g.float() - w.float()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= g.shape == w.shape and bool(torch.allclose(g.float(), w.float(), rtol=rtol, atol=atol))
    return ok, worst


def _run(gp: GraphProgram, cfg: HardwareConfig, inputs: tuple, opt_level: int,
         disabled: frozenset[str] = frozenset()) -> list[torch.Tensor]:
    from tilecc.runtime.compiler import compile_graph
    from tilecc.runtime.executor import run_program

    program = compile_graph(gp, cfg, opt_level=opt_level, disabled=disabled)
    outputs, _ = run_program(program, inputs, sanitize=True)
    return outputs


def candidate_ops(gp: GraphProgram) -> list[GraphOp]:
    """The ops of ``@forward`` that compute (weights and constants left out), in order."""
    return [op for op in gp.func.body.block.ops
            if isinstance(op, GraphOp) and not isinstance(op, (WeightOp, ConstantOp)) and op.results]


def cut_after(gp: GraphProgram, k: int) -> GraphProgram:
    """`gp` returning only the value of candidate op `k` (dead ops removed)."""
    module = gp.module.clone()
    clone = GraphProgram(module, gp.weights, list(gp.input_names), [f"op{k}"], list(gp.input_dtypes), [""])
    fn = clone.func
    target = candidate_ops(clone)[k]
    block = fn.body.block
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    Rewriter.replace_op(ret, func.ReturnOp(target.results[0]))
    fn.function_type = FunctionType.from_lists(list(fn.function_type.inputs.data), [target.results[0].type])
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.ops)):
            if isinstance(op, func.ReturnOp) or any(r.uses for r in op.results):
                continue
            op.detach()
            op.erase()
            changed = True
    return clone


def _op_differs(gp, cfg, inputs, opt_level, values, ops, k) -> tuple[bool | None, float]:
    try:
        got = _run(cut_after(gp, k), cfg, inputs, opt_level)[0]
    except TileccError:
        return None, 0.0
    ref = values[ops[k].results[0]]
    dtype = numerics.DTYPE_TO_TORCH[element_dtype(ops[k].results[0].type)]
    want = torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32)).to(dtype)
    ok, err = _compare([got], [want])
    return (not ok), err


def _first_op(gp, cfg, inputs, opt_level) -> tuple[int | None, float | None]:
    ops = candidate_ops(gp)
    _, values = run_graph(gp, list(inputs), keep=True)
    n = len(ops)
    if n <= LINEAR_SCAN_OPS:
        for k in range(n):
            bad, err = _op_differs(gp, cfg, inputs, opt_level, values, ops, k)
            if bad:
                return k, err
        return None, None
    lo, hi, found = 0, n - 1, None  # smallest k that differs, assuming differences persist
    while lo <= hi:
        mid = (lo + hi) // 2
        k, bad, err = mid, None, 0.0
        while k <= hi and bad is None:  # a cut that cannot compile: try the next op
            bad, err = _op_differs(gp, cfg, inputs, opt_level, values, ops, k)
            k += 0 if bad is not None else 1
        if bad is None:
            hi = mid - 1
        elif bad:
            found, hi = (k, err), k - 1
        else:
            lo = k + 1
    return found if found else (None, None)


def _trial(name, gp, cfg, inputs, expected, opt_level, disabled) -> Trial:
    try:
        ok, err = _compare(_run(gp, cfg, inputs, opt_level, frozenset(disabled)), expected)
    except TileccError as e:
        return Trial(name, None, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return Trial(name, ok, err)


def bisect(model: torch.nn.Module, inputs: tuple, cfg: HardwareConfig, opt_level: int = 2) -> BisectResult:
    from tilecc.frontend.torch_export import export_model, import_exported_program

    model = model.eval()
    with torch.no_grad():
        ref = model(*inputs)
    expected = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    gp = import_exported_program(export_model(model, inputs))
    try:
        outputs = _run(gp, cfg, inputs, opt_level)
        ok, worst = _compare(outputs, expected)
    except TileccError as e:  # a sanitiser or simulator stop is a finding too
        ok, worst = False, float("inf")
        first = Trial(f"-O{opt_level}", None, f"{type(e).__name__}: {str(e).splitlines()[0]}")
    else:
        first = Trial(f"-O{opt_level}", ok, worst)
    result = BisectResult(ok, worst, trials=[first])
    if ok:
        return result
    k, err = _first_op(gp, cfg, inputs, opt_level)
    if k is not None:
        ops = candidate_ops(gp)
        op = ops[k]
        result.first_op_index, result.first_op_name, result.first_op_error = k, op.name, err
        result.first_op = f"{op.name} at {source_loc(op)} (op {k + 1} of {len(ops)}, {op.results[0].type})"
    if opt_level < 2:
        result.culprit = "the -O0 pipeline (no optional pass to switch off)"
        return result
    # the -O2 pipeline rebuilt pass by pass, in pipeline order
    steps = [("-O2 lowering, every optional graph pass off", set(OPTIONAL_PASSES))]
    for i, name in enumerate(OPTIONAL_PASSES):
        steps.append((f"  + {name}", set(OPTIONAL_PASSES[i + 1:])))
    for name, disabled in steps:
        t = _trial(name, gp, cfg, inputs, expected, 2, disabled)
        result.trials.append(t)
        if t.ok is False and result.culprit is None:
            result.culprit = name.strip().removeprefix("+ ") if name.startswith("  +") else None
            if result.culprit is None:
                o0 = _trial("-O0", gp, cfg, inputs, expected, 0, set())
                result.trials.append(o0)
                result.culprit = ("lower-graph-to-tile (its -O2 kernels; -O0 matches)" if o0.ok else
                                  "a pass -O0 runs too (-O0 differs as well): lower-graph-to-tile, plan-sram, "
                                  "plan-hbm, lower-tile-to-npu or npu-insert-sync")
    for name in OPTIONAL_PASSES:  # each switched off alone
        result.trials.append(_trial(f"-O2 without {name}", gp, cfg, inputs, expected, 2, {name}))
    return result
