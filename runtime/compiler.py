"""The compiler driver: graph program -> pass pipeline -> expanded stream -> Program.

The Program's `work` holds two sets of figures: the workload's intrinsic work
(`simulator.roofline.WORK_KEYS`), counted by `ir/graph_work.py` on the graph as it was
imported, before any pass, which the roofline bound divides by the peak rates; and the
compiled program's own work (`runtime.report.program_work`: the MACs and vector element-cycles of
its stream and the HBM bytes its DMAs move), which the report shows beside the bound
as the compiler's added work."""

from __future__ import annotations

import dataclasses
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp
from xdsl.ir import Attribute

from tilecc.codegen.expand import expand_module
from tilecc.codegen.link import link_kernels
from tilecc.errors import CompileError, InternalError, SramOverflowError, TileccError
from tilecc.frontend.dsl.graph_call import DslKernels
from tilecc.frontend.dsl.work import dsl_call_work
from tilecc.ir import float64, tile
from tilecc.ir.bf16_weights import Bf16Weight
from tilecc.ir.dense_elements import dense_elements
from tilecc.ir.graph import GraphProgram
from tilecc.ir.graph_work import graph_work
from tilecc.ir.meta_weights import MetaWeight
from tilecc.ir.weight_layout import derived_layout, tile_b, weight_values
from tilecc.passes import break_pass, remarks
from tilecc.passes.fallback import FallbackPlan, OptimisationFailed, describe_exception
from tilecc.passes.graph.fold_norm_affine import fold_norm_affine
from tilecc.passes.registry import default_pipeline
from tilecc.passes.schedule.autotune import Autotuner
from tilecc.passes.schedule.matmul_schedule import MatmulSchedule
from tilecc.passes.session import CompileSession
from tilecc.passes.tile.plan_sram import plan_sram
from tilecc.passes.tile_to_npu import HbmTensor, dtype_of, hbm_bindings
from tilecc.runtime.program import Program, TensorSpec
from tilecc.runtime.report import program_work
from tilecc.simulator import numerics, progress
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.isa import ITEMSIZE, DType
from tilecc.simulator.roofline import IntrinsicWork

StageCallback = Callable[[str, ModuleOp], None]


@dataclass
class CompileStats:
    pass_seconds: dict[str, float] = field(default_factory=dict)
    total_seconds: float = 0.0
    cache: str = ""  # the compile cache (runtime/cache.py): "hit", "miss", "" when not used


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _cyclic_gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`fn` with Python's full (oldest-generation) collections off while it runs.

    A compile builds millions of small IR objects that live until it ends; every full
    collection while they are alive walks all of them and frees almost nothing (the
    cluster benchmark's compiles spent 17 of their 75 CPU seconds in 19 full
    collections). The young generations are still collected, so the cycles a compile
    drops early (discarded IR: ops and blocks point at each other) are freed as it goes
    (turning the collector off altogether raised GPT-2 small's compile peak by ~100 MiB)."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        t0, t1, t2 = gc.get_threshold()
        gc.set_threshold(t0, t1, 1 << 30)
        try:
            return fn(*args, **kwargs)
        finally:
            gc.set_threshold(t0, t1, t2)

    return run


@_cyclic_gc_paused
def compile_graph(
    gp: GraphProgram,
    cfg: HardwareConfig,
    *,
    after_pass: StageCallback | None = None,
    before_pass: StageCallback | None = None,
    stats: CompileStats | None = None,
    opt_level: int = 2,
    autotune: bool | Autotuner = False,
    matmul_policy: Callable | None = None,
    disabled: frozenset[str] | set[str] = frozenset(),
    mlp_policy: Callable | None = None,
) -> Program:
    """Compile `gp` for `cfg`. With `autotune` (True, or an `Autotuner` to use its cache
    directory and counters) the -O2 matmul kernels' schedules are picked by simulating
    candidates (`passes/schedule/autotune.py`, cached on disk); `matmul_policy` (problem ->
    schedule) forces them (the autotuner measures candidates this way); so do the fused MLP
    kernels' with `mlp_policy` (passes/graph_to_tile/mlp/tuning.py). `disabled` names
    optional -O2 passes to skip (fold-norm-affine, canonicalize-graph, merge-linears, fuse-graph,
    fuse-mlp: its step joining MLP groups, passes/graph/fuse_mlp.py;
    `tilecc bisect` switches them off in turn) and "share-kernels" to build every launch's
    kernel on its own (`passes/graph_to_tile/sharing.py`; the stream is the same), and
    "resident-constants" to load every constant buffer in each kernel that reads it
    (`passes/tile/resident_constants.py`) and "forward-activations" to send every
    activation through HBM between kernels (`passes/tile/forward_activations.py`).

    `before_pass` / `after_pass` (pass name, module) run around every pass, outside
    its timing (the explorer's instrumentation, `tilecc/explore.py`); the passes'
    remarks (`passes/remarks.py`) are kept in ``program.meta["remarks"]``.

    The roofline bound's work is counted on `gp` as given, before any pass
    (`ir/graph_work.py`), so it is the same at every opt level and schedule."""
    intrinsic = graph_work(gp, cfg, dsl_call_work)
    demoted = float64.demoted(gp.module)  # the float64 policy (ir/float64.py)
    plan, level = FallbackPlan(), opt_level
    fallbacks: list[dict[str, str]] = []
    for _attempt in range(MAX_FALLBACKS + 2):
        try:
            with remarks.collecting() as collected:
                program = _compile(gp, cfg, after_pass, before_pass, stats, level, autotune, matmul_policy,
                                   disabled, intrinsic, plan, mlp_policy)
            break
        except OptimisationFailed as e:  # an -O2 lowering failed on one op or group
            plan = plan.without(e)
            what = "left unfused" if e.kind == "unfuse" else "lowered by its -O0 kernel"
            fallbacks.append({"op": e.op_name, "loc": e.loc, "fallback": what, "reason": e.reason})
            if len(fallbacks) > MAX_FALLBACKS - 1:
                level = 0
        except Exception as e:  # noqa: BLE001 (a pass failed on the program, not on one op)
            where, cause = (e.pass_name, e.error) if isinstance(e, _PassFailed) else ("the compile", e)
            owner = _kernel_owner(e, cause)
            if owner is not None and level >= 2:  # an -O2 kernel a later pass cannot take
                plan = plan.without(owner)
                what = "left unfused" if owner.kind == "unfuse" else "lowered by its -O0 kernel"
                fallbacks.append({"op": owner.op_name, "loc": owner.loc, "fallback": what,
                                  "reason": f"{where}: {describe_exception(cause)}"})
                if len(fallbacks) > MAX_FALLBACKS - 1:
                    level = 0
                continue
            if level < 2 or not _falls_back(cause):
                if isinstance(cause, TileccError):
                    raise cause from None
                raise InternalError(f"internal error in {where}: {type(cause).__name__}: "
                                    f"{str(cause).splitlines()[0] if str(cause) else ''} (please report)") from cause
            fallbacks.append({"op": "program", "loc": "", "fallback": "compiled at -O0",
                              "reason": f"{where}: {describe_exception(cause)}"})
            level = 0
    else:  # unreachable: the last attempt runs at -O0, which raises instead of falling back
        raise InternalError("the compile did not converge after its fallbacks (please report)")
    for what, loc in demoted:
        collected.add("import", "analysis", f"{float64.REMARK}: {what}", loc)
    for f in fallbacks:
        collected.add("fallback", "missed", f"{f['op']}: {f['fallback']} after the optimised kernel "
                      f"failed: {f['reason']}", f["loc"])
    program.meta["remarks"] = collected.to_json()
    if fallbacks:
        program.meta["fallbacks"] = fallbacks
    if demoted:
        program.meta["float64_demoted"] = True
    return program


def measure_program(gp: GraphProgram, sched: MatmulSchedule, cfg: HardwareConfig) -> float:
    """Cycles of `gp` compiled with every -O2 matmul under `sched`, simulated timing-only:
    the measurement the autotuner's policy times candidates with (handed to it as a
    callback, so that passes never run the driver or the simulator)."""
    from tilecc.simulator.machine import simulate

    prog = compile_graph(gp, cfg, matmul_policy=lambda _problem, _program=None: sched)
    return simulate(prog.stream, cfg, None, functional=False, record=False).cycles


def measure_mlp(gp: GraphProgram, sched: Any, cfg: HardwareConfig) -> float:
    """Cycles of `gp` compiled with every fused MLP kernel under `sched` (an `MlpSchedule`),
    simulated timing-only: how the MLP autotuning policy times a candidate."""
    from tilecc.simulator.machine import simulate

    prog = compile_graph(gp, cfg, mlp_policy=lambda _problem, _program=None, _sig=None: sched)
    return simulate(prog.stream, cfg, None, functional=False, record=False).cycles


# optimised lowerings given up one by one before the whole program goes to -O0
MAX_FALLBACKS = 8


def _falls_back(e: BaseException) -> bool:
    """Whether a failure after lowering sends the program to -O0: a compiler bug (any
    non-tilecc exception, an invariant a pass checks) or an -O2 kernel's buffers that do
    not fit SRAM; not a limit of the workload on this hardware (HBM capacity, a tensor
    too large to tile) or bad input, which -O0 would only report again."""
    if not isinstance(e, TileccError):
        return True
    return type(e) in (CompileError, InternalError, SramOverflowError)


class _PassFailed(Exception):
    """A pass of the pipeline raised `error` (the driver falls back or names the pass)."""

    def __init__(self, pass_name: str, error: Exception, session: CompileSession):
        super().__init__(f"{pass_name}: {error}")
        self.pass_name = pass_name
        self.error = error
        self.session = session


def _kernel_owner(e: BaseException, cause: BaseException) -> OptimisationFailed | None:
    """The op or group whose -O2 kernel a later pass failed on (an SRAM overflow names
    its kernel), for a per-op fallback; None when the failure names no such kernel."""
    kernel = getattr(cause, "kernel", None)
    if not isinstance(e, _PassFailed) or not isinstance(cause, SramOverflowError) or kernel is None:
        return None
    return e.session.numbering.kernel_owner.get(kernel)


def _compile(gp, cfg, after_pass, before_pass, stats, opt_level, autotune, matmul_policy, disabled,
             intrinsic: IntrinsicWork, plan: FallbackPlan | None = None, mlp_policy: Callable | None = None) -> Program:
    broken = break_pass.broken_pass()  # test-only planted miscompilation (passes/break_pass.py)
    t0 = time.perf_counter()
    module = gp.module.clone()
    layout: _Layout | None = None
    if autotune and (matmul_policy is None or mlp_policy is None):
        from tilecc.passes.graph_to_tile.mlp.tuning import mlp_tuning_policy
        from tilecc.passes.schedule.matmul_tuning import tuning_policy

        tuner = autotune if isinstance(autotune, Autotuner) else Autotuner(cfg)
        if matmul_policy is None:
            matmul_policy = tuning_policy(cfg, lambda gp_, sched: measure_program(gp_, sched, cfg), tuner)
        if mlp_policy is None:
            mlp_policy = mlp_tuning_policy(cfg, lambda gp_, sched: measure_mlp(gp_, sched, cfg), tuner)
    own_dict = opt_level >= 2
    if own_dict:  # fold-norm-affine and merge-linears add weights: to a dict of this compile's own
        gp = dataclasses.replace(gp, weights=dict(gp.weights))
    if opt_level >= 2 and "fold-norm-affine" not in disabled:  # needs the weights' data (not a module pass)
        if before_pass is not None:
            before_pass("fold-norm-affine", module)
        progress.report("fold-norm-affine")
        ts = time.perf_counter()
        fold_norm_affine(module, gp.weights)
        if stats is not None:
            stats.pass_seconds["fold-norm-affine"] = time.perf_counter() - ts
        if broken == "fold-norm-affine":
            break_pass.plant(module)
        if after_pass is not None:
            after_pass("fold-norm-affine", module)
    session = CompileSession(disabled=frozenset(disabled))
    if plan is not None:
        session.fallback = plan
    for name, run in default_pipeline(cfg, opt_level, matmul_policy, session, DslKernels(), gp.weights,
                                      "share-kernels" not in disabled, mlp_policy,
                                      resident="resident-constants" not in disabled,
                                      forward="forward-activations" not in disabled):
        if name in disabled:
            continue
        if name == "lower-tile-to-npu":
            layout = read_layout(module, gp)
        if name == "plan-sram" and "link-kernels" in disabled:  # no overlap: every kernel from offset 0
            run = functools.partial(plan_sram, cfg=cfg, linked=False)
        if before_pass is not None:
            before_pass(name, module)
        progress.report(name)
        ts = time.perf_counter()
        try:
            run(module)
        except OptimisationFailed:
            raise
        except Exception as e:  # noqa: BLE001 (the driver falls back, or names the pass)
            raise _PassFailed(name, e, session) from e
        if name == broken:
            break_pass.plant(module)
        if stats is not None:
            stats.pass_seconds[name] = time.perf_counter() - ts
        if after_pass is not None:
            after_pass(name, module)
    assert layout is not None
    if own_dict:
        # the layout holds what the Program needs: the weights this compile made (folded,
        # merged) go with their last reference, as `own_weights` re-tiles them, instead
        # of sitting beside the Program's copies
        gp.weights.clear()
    program = package_program(module, layout, cfg, intrinsic, link="link-kernels" not in disabled)
    if stats is not None:
        stats.total_seconds = time.perf_counter() - t0
    return program


TILE_STAGES = ("plan-sram", "plan-hbm", "lower-tile-to-npu", "npu-insert-sync")


def compile_tile_module(module: ModuleOp, gp: GraphProgram, cfg: HardwareConfig,
                        after_pass: StageCallback | None = None, *, intrinsic: IntrinsicWork) -> Program:
    """The pipeline's tail on a tile-dialect module (what lower-graph-to-tile or the tile
    DSL produces), in place: the `TILE_STAGES` of the default pipeline, then the Program.
    `gp` names the inputs and outputs (and holds the weights); `intrinsic` is the
    workload's own work (the roofline bound's), which the caller counts."""
    layout: _Layout | None = None
    for name, run in default_pipeline(cfg, 0):
        if name not in TILE_STAGES:
            continue
        if name == "lower-tile-to-npu":
            layout = read_layout(module, gp)
        progress.report(name)
        run(module)
        if after_pass is not None:
            after_pass(name, module)
    assert layout is not None
    return package_program(module, layout, cfg, intrinsic)


def package_program(module: ModuleOp, layout: _Layout, cfg: HardwareConfig, intrinsic: IntrinsicWork,
                    *, link: bool = True) -> Program:
    """The synchronised npu module expanded to its stream, with the HBM layout: the Program.
    Its `work` is `intrinsic`'s figures (the roofline bound's) and the stream's own
    (`program_*`); `meta["work_by_op"]` is `intrinsic.by_op`; `meta["timing_only"]` is
    set when weights have no values (a meta-device model: ir/meta_weights.py). With `link`
    (the default; ``disabled={"link-kernels"}`` turns it off) consecutive kernels order
    through semaphores on the memory they share instead of a barrier (`codegen/link.py`)."""
    stream, kernels = expand_module(module)
    if link:
        progress.report("link-kernels")
        n_kernels = len(kernels)
        stream, kernels, notes = link_kernels(stream, kernels, cfg)
        for note in notes:
            remarks.emit("link-kernels", "missed", note)
        if n_kernels > 1:
            remarks.emit("link-kernels", "passed",
                         f"{n_kernels} kernels linked into {len(notes) + 1} barrier-separated groups")
    work = {**intrinsic.figures(), **program_work(stream, cfg)}
    weight_data = layout.own_weights()
    return Program(
        stream=stream,
        kernels=kernels,
        inputs=layout.inputs,
        outputs=layout.outputs,
        weights=layout.weights,
        weight_data=weight_data,
        hbm_size=layout.hbm_size,
        config=cfg,
        work=work,
        meta={"hbm": layout.hbm_plan, "work_by_op": intrinsic.by_op,
              **({"timing_only": True} if layout.timing_only else {})},
    )


@dataclass
class _Layout:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: list[TensorSpec]
    weight_data: dict[str, np.ndarray]  # bytes; a `borrowed` weight's entry its bf16 bits, not yet copied
    hbm_size: int
    hbm_plan: dict[str, int]  # bytes: size, persistent (inputs, weights, constants), intermediates
    timing_only: bool = False  # weights without values (ir/meta_weights.py): no bytes for them
    borrowed: set[str] = field(default_factory=set[str])
    # pre-tiled weights of bf16 sources, built in `own_weights`: (source bits, dims, interleaved)
    deferred: dict[str, tuple[np.ndarray, tuple[int, ...], bool]] = field(default_factory=dict)

    def own_weights(self) -> dict[str, np.ndarray]:
        """`weight_data` with every borrowed weight (a view of the model's tensor:
        ir/bf16_weights.py) copied, so the Program keeps its values whatever the model's
        parameters become. The packager calls it last, after the stream is encoded and
        linked, so these copies do not sit beside the compile's IR and temporaries.
        The pre-tiled ones come first, each dropping its source as it is made (a weight
        of the compile's own, a folded one, is then freed before the next copy), then
        the borrowed ones (the same entries, in the same order, as the other way round)."""
        for name in sorted(self.deferred):
            bits, dims, interleaved = self.deferred.pop(name)
            self.weight_data[name] = tile_b(bits, *dims, interleaved=interleaved).reshape(-1).view(np.uint8)
            del bits
        for name in sorted(self.borrowed):
            self.weight_data[name] = np.array(self.weight_data[name], order="C").reshape(-1).view(np.uint8)
        self.borrowed.clear()
        return self.weight_data


def _spec(name: str, t: HbmTensor, torch_dtype: str = "") -> TensorSpec:
    native = numerics.DTYPE_TO_TORCH.get(t.dtype)
    if native is not None and torch_dtype == str(native).removeprefix("torch."):
        torch_dtype = ""  # the element type's own dtype: nothing to convert
    if not t.contiguous:
        raise CompileError(f"tensor '{name}' is a strided view; program inputs and outputs are dense")
    return TensorSpec(name, t.addr, tuple(t.shape), t.dtype, torch_dtype)


def _at(names: list[str], i: int) -> str:
    return names[i] if i < len(names) else ""


def _int_attr(attrs: dict[str, Attribute], key: str) -> int:
    """The integer module attribute `key` (set by plan-hbm)."""
    a = attrs[key]
    if not isinstance(a, IntegerAttr):
        raise CompileError(f"module attribute {key} must be an integer, got {a}")
    return a.value.data


def read_layout(module: ModuleOp, gp: GraphProgram) -> _Layout:
    """Where the program's inputs, outputs and weights lie in HBM (read before lower-tile-to-npu)."""
    main = next(f for f in module.ops if isinstance(f, func.FuncOp) and f.sym_name.data == "main")
    bound = hbm_bindings(main)
    inputs: dict[int, TensorSpec] = {}
    weights: list[TensorSpec] = []
    data: dict[str, np.ndarray] = {}
    borrowed: set[str] = set()
    deferred: dict[str, tuple[np.ndarray, tuple[int, ...], bool]] = {}
    meta = False
    for op in main.body.block.ops:
        if not isinstance(op, tile.HbmAllocOp):
            continue
        t = bound[op.result]
        if op.input is not None:
            idx = op.input.value.data
            inputs[idx] = _spec(gp.input_names[idx], t, _at(gp.input_dtypes, idx))
        elif op.weight is not None or op.value is not None:
            name = op.weight.data if op.weight is not None else f"__const{len(weights)}"
            # a weight of the graph program, or one derived from it (pre-tiled: ir/weight_layout.py)
            derived = derived_layout(name) if op.weight is not None else None
            src = gp.weights.get(derived[0]) if derived is not None else None
            if isinstance(src, Bf16Weight) and t.dtype == DType.BF16 and derived is not None:
                # its bf16 bits re-tiled when the Program takes its weights (`own_weights`),
                # after the compile's IR is gone, not beside it
                weights.append(_spec(name, t))
                deferred[name] = (src.bits, derived[1], derived[2])
                continue
            wv = weight_values(gp.weights, name) if op.weight is not None else None
            if isinstance(wv, MetaWeight):  # no values: timing-only
                weights.append(_spec(name, t))
                meta = True
                continue
            if isinstance(wv, Bf16Weight) and t.dtype == DType.BF16:  # stored as it is held
                weights.append(_spec(name, t))
                if wv.borrowed:  # the model's own memory: copied last (`_Layout.own_weights`)
                    borrowed.add(name)
                    data[name] = wv.bits.reshape(t.shape)
                    continue
                data[name] = wv.bits.reshape(t.shape).reshape(-1).view(np.uint8)  # shared: both only read it
                continue
            if op.weight is not None:
                values = np.asarray(wv)
            elif op.value is not None:
                values = dense_elements(op.value)
            else:  # the branch's condition: a weight or a value
                raise CompileError(f"{op.name} has neither a weight nor a value")
            if values.dtype.kind not in "iu" or t.dtype != DType.I32:  # ints stay exact
                values = values.astype(np.float32)
            values = values.reshape(t.shape)
            weights.append(_spec(name, t))
            data[name] = numerics.to_storage(values, t.dtype).reshape(-1).view(np.uint8)  # a new array
    ret = main.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    outputs = [
        _spec(gp.output_names[i] if i < len(gp.output_names) else f"out{i}", bound[v], _at(gp.output_dtypes, i))
        for i, v in enumerate(ret.arguments)
    ]
    attrs = module.attributes
    hbm_size = _int_attr(attrs, "tile.hbm_size")
    peak = _int_attr(attrs, "tile.hbm_intermediate_peak")
    plan = {
        "size": hbm_size,
        "persistent": hbm_size - peak,
        "intermediate_peak": peak,
        "intermediate_total": _int_attr(attrs, "tile.hbm_intermediate_total"),
    }
    return _Layout([inputs[i] for i in sorted(inputs)], outputs, weights, data, hbm_size, plan, meta, borrowed,
                   deferred)


__all__ = ["compile_graph", "CompileStats", "MemRefType", "dtype_of", "ITEMSIZE"]
