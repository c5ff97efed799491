"""Models on many chips: `tilecc.compile(..., system=..., parallel=...)` returns a SystemModel.

    sm = tilecc.compile(model, (ids,), target="tiny", system="ring:4", parallel={"tp": 4, "sp": True})
    y = sm(ids)          # every chip on the simulator, the collectives on the interconnect model
    print(sm.report)     # per chip, per link, communication share (runtime/system_report.py)
    sm.run(ids, trace="run.json")   # Perfetto: a process per chip (its engines), one for the links

`parallel`: {"tp": N, "sp": bool} (tensor parallelism, Megatron-style, with sequence
parallelism around the norms; `sm.train(*inputs, loss="mean")` runs a training step,
runtime/tp_train.py, also with pp and dp: each pipeline stage tensor-parallel, 1F1B),
{"pp": N, "micro_batches": M} (pipeline parallelism by layers, runtime/pipeline_run.py) or
{"dp": N} (data parallelism: `sm.train(*inputs, loss="mean")` runs a training step,
runtime/data_parallel.py). They combine on runtime/tp_pipeline_run.py's chip grid: tp x pp,
tp x pp x dp, dp x tp and dp x pp (inference: the batch split over the replicas; training:
each replica's gradients all-reduced across them). tp x pp x dp must equal the system's
chips. `tp_plan`: a plan in PyTorch's vocabulary (module FQN ->
ColwiseParallel / RowwiseParallel / SequenceParallel / PrepareModuleInput/Output); by default
the automatic plan of a `transformers` decoder (frontend/tensor_parallel.py). The system's
chip config is the target of every chip (`system` may name its own: `ring:4;chip=edge`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from tilecc.errors import TileccError
from tilecc.frontend.tensor_parallel import ShardingError
from tilecc.runtime.system_compile import SystemProgram, compile_system
from tilecc.runtime.system_report import SystemReport, system_report
from tilecc.runtime.system_run import SystemTimeline, run_system
from tilecc.simulator.interconnect.system import SystemConfig, load_system

PARALLEL_KEYS = ("tp", "sp", "pp", "micro_batches", "dp", "collectives", "chunks", "algorithm")
STREAM_ALGORITHMS = ("ring", "halving_doubling", "tree", "ring2d", "auto")  # runtime/stream_algorithm.py
COLLECTIVE_MODES = ("between", "stream")  # runtime/system_run.py (default), runtime/system_stream.py


class SystemModel:
    """A model compiled for a system of chips; calling it runs every chip and link."""

    def __init__(self, program: Any, mode: str = "contention"):
        self.program = program
        self.mode = mode
        self.sanitize = os.environ.get("TILECC_SANITIZE", "0") == "1"  # as CompiledModel
        self.report: SystemReport | None = None
        self.timeline: SystemTimeline | None = None
        self.stream_run: Any = None  # collectives='stream': runtime/system_stream.py's StreamRun
        self.train_result: Any = None
        self._trainers: dict[tuple, Any] = {}  # tensor parallelism: (loss, input shapes) -> TensorParallelTrainer

    def __call__(self, *inputs: torch.Tensor) -> Any:
        return self.run(*inputs)

    def train(self, *inputs: torch.Tensor, loss: str = "mean", target: torch.Tensor | None = None) -> Any:
        """One training step: data parallelism (runtime/data_parallel.py), tensor parallelism
        (runtime/tp_train.py, with pp: its stages through 1F1B) or a 1F1B pipeline
        (runtime/pipeline_train.py, the loss: the output's mean): the loss's gradients, equal
        to eager's, and the step's timeline; also kept as `train_result`."""
        from tilecc.runtime.data_parallel import DataParallelProgram
        from tilecc.runtime.pipeline_run import PipelineProgram
        from tilecc.runtime.tp_pipeline_run import TpPipelineProgram

        prog = self.program
        if isinstance(prog, SystemProgram) or (isinstance(prog, TpPipelineProgram) and prog.tp > 1):
            self.train_result = self._tp_trainer(inputs, loss).step(inputs, target=target, mode=self.mode)
            return self.train_result
        if isinstance(prog, PipelineProgram | TpPipelineProgram):
            from tilecc.runtime.pipeline_train import pipeline_train_step

            if loss != "mean" or target is not None:
                raise TileccError(f"train(): a pipeline trains on the mean of the output (loss='mean'), got "
                                  f"loss={loss!r}")
            self.train_result = pipeline_train_step(prog.model, inputs, prog.system, pp=prog.pp,
                                                    micro_batches=prog.micro_batches, dp=getattr(prog, "dp", 1),
                                                    mode=self.mode)
            return self.train_result
        if not isinstance(self.program, DataParallelProgram):
            raise TileccError("train(): training steps are compiled with parallel={'dp': N}, {'tp': N} or {'pp': N} "
                              "(collectives='stream' runs inference only)")
        self.train_result = self.program.step(inputs, loss=loss, target=target, mode=self.mode)
        return self.train_result

    def _tp_trainer(self, inputs: tuple, loss: str) -> Any:
        from tilecc.runtime.tp_train import TensorParallelTrainer

        prog = self.program
        if getattr(prog, "sp", False):
            raise ShardingError("parallel: training with tensor parallelism runs Megatron's all-reduce plan; "
                                "'sp' = True (sequence parallelism) is not supported in sm.train()")
        key = (loss, tuple(tuple(x.shape) for x in inputs))
        if key not in self._trainers:
            self._trainers[key] = TensorParallelTrainer(prog.model, inputs, prog.system, tp=prog.tp,
                                                        dp=getattr(prog, "dp", 1), pp=getattr(prog, "pp", 1),
                                                        micro_batches=getattr(prog, "micro_batches", 1),
                                                        plan=getattr(prog, "plan", None), loss=loss)
        return self._trainers[key]

    def run(self, *inputs: torch.Tensor, trace: str | Path | None = None, timing_only: bool = False) -> Any:
        """Run every chip and link; `trace`: write a Perfetto trace there (runtime/system_trace.py).
        `timing_only` (tensor parallelism): no data moves and chip 0 is simulated for all the
        identical chips (runtime/system_run.py states the rule); the outputs are not meaningful."""
        import tempfile

        from tilecc.runtime.system_trace import write_system_trace

        with tempfile.TemporaryDirectory() as tmp:
            tdir = tmp if trace is not None else None
            from tilecc.runtime.data_parallel import DataParallelProgram

            if isinstance(self.program, DataParallelProgram):
                raise TileccError("data parallelism compiles a training step: call sm.train(*inputs)")
            from tilecc.runtime import pipeline_stream as ps

            if isinstance(self.program, ps.PipelineStreams):  # pp, collectives='stream'
                outs, self.stream_run = ps.run_pipeline_streams(self.program, inputs, functional=not timing_only,
                                                                sanitize=self.sanitize and not timing_only)
                self.report = ps.pipeline_stream_report(self.program, self.stream_run)
                if trace is not None:
                    ps.write_pipeline_stream_trace(trace, self.program, self.stream_run)
                return outs[0] if len(outs) == 1 else tuple(outs)
            if not isinstance(self.program, SystemProgram) and hasattr(self.program, "streams"):
                from tilecc.runtime.stream_report import stream_report
                from tilecc.runtime.system_stream import run_streams

                outs, self.stream_run = run_streams(self.program, inputs, functional=not timing_only,
                                                    sanitize=self.sanitize and not timing_only)
                self.report = stream_report(self.program, self.stream_run)
                if trace is not None:
                    from tilecc.runtime.stream_trace import write_stream_trace

                    write_stream_trace(trace, self.program, self.stream_run)
                return outs[0] if len(outs) == 1 else tuple(outs)
            if isinstance(self.program, SystemProgram):
                outs, self.timeline = run_system(self.program, inputs, mode=self.mode, sanitize=self.sanitize,
                                                 trace_dir=tdir, functional=not timing_only)
                self.report = system_report(self.program, self.timeline)
            else:
                if timing_only:
                    raise TileccError("timing_only: pipelines run functionally (their stages differ)")
                from tilecc.runtime.pipeline_run import run_pipeline
                from tilecc.runtime.tp_pipeline_run import TpPipelineProgram, run_tp_pipeline

                if isinstance(self.program, TpPipelineProgram):
                    outs, self.timeline, self.report = run_tp_pipeline(self.program, inputs, mode=self.mode,
                                                                       sanitize=self.sanitize)
                else:
                    outs, self.timeline, self.report = run_pipeline(self.program, inputs, mode=self.mode,
                                                                    sanitize=self.sanitize, trace_dir=tdir)
            if trace is not None:
                write_system_trace(trace, self.timeline, self.program.system)
        return outs[0] if len(outs) == 1 else tuple(outs)


def parse_parallel(parallel: dict[str, Any] | None, system: SystemConfig) -> dict[str, Any]:
    p = dict(parallel or {})
    for k in p:
        if k not in PARALLEL_KEYS:
            raise ShardingError(f"parallel: unknown key '{k}' (allowed: {', '.join(PARALLEL_KEYS)})")
    for k in ("tp", "pp", "dp", "micro_batches", "chunks"):
        v = p.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ShardingError(f"parallel: '{k}' must be a whole number >= 1, got {v!r}")
    tp, pp, dp = p.get("tp", 1), p.get("pp", 1), p.get("dp", 1)
    if tp * pp * dp != system.chips:
        raise ShardingError(f"parallel: tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp} must equal the system's "
                            f"{system.chips} chips ({system.topology.spec})")
    if dp > 1 and tp > 1 and p.get("sp"):
        raise ShardingError(f"parallel: 'sp' = True with 'dp' = {dp}: replicas of a tensor-parallel group run the "
                            f"all-reduce plan (no sequence parallelism)")
    if p.get("sp") and tp == 1:
        raise ShardingError("parallel: sequence parallelism (sp) needs tp > 1")
    _check_stream(p, tp)
    return p


def _check_stream(p: dict[str, Any], tp: int) -> None:
    """`collectives`: "between" (default) or "stream" (tp > 1: the ring collectives in the
    chips' streams, runtime/system_stream.py; pp > 1: the pipeline's sends and receives,
    runtime/pipeline_stream.py); `chunks`: pieces per ring block or per send (stream only);
    `algorithm` (stream only): ring (default), halving_doubling, tree, ring2d or auto
    (runtime/stream_algorithm.py)."""
    mode = p.get("collectives", "between")
    if mode not in COLLECTIVE_MODES:
        raise ShardingError(f"parallel: 'collectives' = {mode!r} (allowed: {', '.join(COLLECTIVE_MODES)})")
    pp = p.get("pp", 1)
    if mode == "stream" and p.get("dp", 1) > 1:
        raise ShardingError("parallel: collectives='stream' runs tp alone or pp alone, not with dp; "
                            "use collectives='between' for data parallelism")
    if mode == "stream" and tp < 2 and pp < 2:
        raise ShardingError("parallel: collectives='stream' needs tensor parallelism (tp > 1) or a pipeline (pp > 1)")
    if mode == "stream" and tp > 1 and pp > 1:
        raise ShardingError(f"parallel: collectives='stream' runs tp alone or pp alone, not tp x pp ({tp} x {pp}); "
                            "use collectives='between' for tp x pp")
    if mode == "stream" and pp > 1 and "algorithm" in p:
        raise ShardingError("parallel: 'algorithm' lowers tensor parallelism's collectives; a pipeline's sends are "
                            "point to point (runtime/pipeline_stream.py)")
    if "chunks" in p and mode != "stream":
        raise ShardingError("parallel: 'chunks' applies to collectives='stream'")
    if "algorithm" in p and mode != "stream":
        raise ShardingError("parallel: 'algorithm' applies to collectives='stream'")
    if p.get("algorithm", "ring") not in STREAM_ALGORITHMS:
        raise ShardingError(f"parallel: 'algorithm' = {p['algorithm']!r} (allowed: {', '.join(STREAM_ALGORITHMS)})")
    c = p.get("chunks", 4)
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise ShardingError(f"parallel: 'chunks' must be a whole number >= 1, got {c!r}")


def compile_for_system(model: Any, example_inputs: tuple | None, *, target: Any, system: Any,
                       parallel: dict[str, Any] | None, tp_plan: dict[str, Any] | None = None,
                       opt_level: int = 2, cache: Any = None, mode: str = "contention") -> SystemModel:
    if isinstance(model, torch.export.ExportedProgram):
        raise ShardingError("a system compile shards an nn.Module (its layers are named in the plan), "
                            "not an ExportedProgram")
    if example_inputs is None:
        raise TileccError("tilecc.compile: example_inputs are required to export an nn.Module")
    if isinstance(system, str) and isinstance(target, str) and "chip=" not in system and not system.endswith(".toml"):
        system = f"{system};chip={target}"
    cfg = load_system(system)
    p = parse_parallel(parallel, cfg)
    tp, pp, dp = p.get("tp", 1), p.get("pp", 1), p.get("dp", 1)
    if dp > 1 and tp == 1 and pp == 1:
        from tilecc.runtime.data_parallel import DataParallelProgram, split_batch

        if tp_plan is not None:
            raise ShardingError("tp_plan= applies to tensor parallelism (parallel={'tp': N}), not to dp")
        split_batch(tuple(example_inputs), p["dp"])
        return SystemModel(DataParallelProgram(model, cfg, p["dp"]), mode)
    if (pp > 1 and tp > 1) or dp > 1:  # tp x pp, dp x tp, dp x pp: runtime/tp_pipeline_run.py's grid
        from tilecc.runtime.tp_pipeline_run import compile_tp_pipeline

        if tp_plan is not None or p.get("sp"):
            raise ShardingError(f"parallel: tp={tp}, pp={pp}, dp={dp} uses the automatic plan without sequence "
                                f"parallelism (no tp_plan=, no sp)")
        return SystemModel(compile_tp_pipeline(model, tuple(example_inputs), cfg, tp=tp, pp=pp,
                                               micro_batches=p.get("micro_batches", 1), dp=dp, opt_level=opt_level,
                                               cache=cache), mode)
    if p.get("pp", 1) > 1:
        from tilecc.runtime.pipeline_run import compile_pipeline

        if tp_plan is not None:
            raise ShardingError("tp_plan= applies to tensor parallelism (parallel={'tp': N}), not to a pipeline")
        pipe = compile_pipeline(model, tuple(example_inputs), cfg, pp=p["pp"], micro_batches=p.get("micro_batches", 1),
                                opt_level=opt_level, cache=cache)
        if p.get("collectives") == "stream":
            from tilecc.runtime.pipeline_stream import build_pipeline_streams

            return SystemModel(build_pipeline_streams(pipe, chunks=p.get("chunks", 4)), mode)
        return SystemModel(pipe, mode)
    sp = compile_system(model, tuple(example_inputs), cfg, tp=p.get("tp", 1), sp=bool(p.get("sp")),
                        plan=tp_plan, opt_level=opt_level, cache=cache)
    if p.get("collectives") == "stream":
        from tilecc.runtime.system_stream import build_streams

        return SystemModel(build_streams(sp, chunks=p.get("chunks", 4), algorithm=p.get("algorithm", "ring")), mode)
    return SystemModel(sp, mode)
