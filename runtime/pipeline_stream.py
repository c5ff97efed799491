"""Pipeline parallelism with the activations sent in the chips' instruction streams.

    psp = build_pipeline_streams(pp, chunks=4)    # pp: runtime/pipeline_run.py's PipelineProgram
    outputs, run = run_pipeline_streams(psp, (ids,))   # every chip co-simulated; run.result, run.exposed_ns
    rep = pipeline_stream_report(psp, run)             # a runtime/system_report.py SystemReport

From `tilecc.compile(model, (ids,), system="ring:2", parallel={"pp": 2, "micro_batches": 2,
"collectives": "stream"})` (tilecc/system_api.py) and `tilecc run ... --pp 2 --collectives
stream`.

runtime/pipeline_run.py runs each stage's program alone and times the pipeline on an
analytic timeline (a transfer: the route's latency + bytes / B after its producer ends).
Here chip k gets ONE stream: for each micro-batch m, the receives of the values stage k
uses from other stages (passes/npu/collective_send_recv.py: LINK_RECV pieces), stage k's
program, then the sends of the values later stages use from it (LINK_SEND pieces), and
codegen/link.py links it: stage k starts micro-batch m once the pieces it reads have
arrived, the next micro-batch's receives wait only until this one's reads of those bytes
are done, and the sends overlap the next micro-batch's compute. The co-simulation
(simulator/multichip.py) shares the links.

HBM: chip k holds one image of stage k's program per micro-batch, image m at m x the
program's HBM size (its weights, folded constants, inputs, outputs and scratch where the
compiler put them, every address moved by the same amount: a program that uses an
output's bytes as scratch stays correct, which moving only the input and output regions
would not guarantee). The weights are so held once per micro-batch: a simulator
convenience that costs HBM capacity, not time (the loads are the same). A value sent from
stage p to stage k goes from p's output region of image m to k's input region of image m.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tilecc.codegen.link import link_kernels
from tilecc.errors import TileccError
from tilecc.passes.npu.collective_send_recv import send_recv
from tilecc.runtime.executor import _to_device_dtype, _to_user_dtype
from tilecc.runtime.pipeline_run import PipelineProgram, _micro_batches
from tilecc.runtime.program import TensorSpec
from tilecc.runtime.stream_report import streams_report
from tilecc.runtime.stream_trace import write_streams_trace
from tilecc.runtime.system_report import SystemReport
from tilecc.runtime.system_stream import StreamRun, _barrier
from tilecc.simulator import numerics
from tilecc.simulator.isa import STORAGE, Opcode
from tilecc.simulator.multichip import MultiChipResult, cosimulate, exposed_comm_ns

__all__ = ["PipelineStreams", "build_pipeline_streams", "pipeline_stream_report", "run_pipeline_streams",
           "write_pipeline_stream_trace"]


@dataclass
class PipelineStreams:
    pipeline: PipelineProgram
    chunks: int
    streams: list[np.ndarray]  # per chip, linked
    transfers: list[tuple[str, int, TensorSpec, int, TensorSpec]]  # value, from stage, its output, to, its input
    remarks: list[str]
    kernels: list[list[tuple[str, int, int]]] = field(default_factory=list)  # per chip: (name, start, count)


def build_pipeline_streams(pp: PipelineProgram, *, chunks: int = 4) -> PipelineStreams:
    if chunks < 1:
        raise TileccError(f"pipeline streams: chunks must be >= 1, got {chunks}")
    segs = pp.graph.segments
    n = pp.pp
    same = {c.output: c.input for c in pp.graph.collectives}  # a marker's name: the value it carries

    def root(name: str) -> str:
        while name in same:
            name = same[name]
        return name

    made = {root(o): (k, spec) for k, (seg, prog) in enumerate(zip(segs, pp.programs))
            for o, spec in zip(seg.outputs, prog.outputs)}
    transfers = []
    for k, (seg, prog) in enumerate(zip(segs, pp.programs)):
        for name, spec in zip(seg.inputs, prog.inputs):
            src = made.get(root(name))
            if src is not None and src[0] != k:
                if (src[1].shape, src[1].dtype) != (spec.shape, spec.dtype):
                    raise TileccError(f"value '{name}' is {src[1].shape} {src[1].dtype.name} on stage {src[0]} "
                                      f"and {spec.shape} {spec.dtype.name} on stage {k}")
                transfers.append((root(name), src[0], src[1], k, spec))
    streams, remarks, kernels = [], [], []
    for r in range(n):
        parts, spans, pos = [], [], 0
        prog = pp.programs[r]
        cuts = np.flatnonzero(prog.stream["opcode"] == Opcode.BARRIER).tolist()
        for m in range(pp.micro_batches):
            pieces = [(f"recv({t[0]}, {m})", _p2p(pp, r, t, m, chunks)) for t in transfers if t[3] == r]
            image = _shifted(prog.stream, m * prog.hbm_size)
            lo = 0
            for j, hi in enumerate(cuts + [len(image)]):
                if hi > lo:
                    pieces.append((f"stage{r}.mb{m}.{j}", image[lo:hi]))
                lo = hi + 1
            pieces += [(f"send({t[0]}, {m})", _p2p(pp, r, t, m, chunks)) for t in transfers if t[1] == r]
            for name, rec in pieces:
                parts += [rec, _barrier()]
                spans.append((name, pos, len(rec)))
                pos += len(rec) + 1
        linked, new_spans, why = link_kernels(np.concatenate(parts), spans, pp.system.chip_config(r))
        streams.append(linked)
        kernels.append(new_spans)
        remarks += [f"chip {r}: {w}" for w in why]
    return PipelineStreams(pp, chunks, streams, transfers, remarks, kernels)


def _p2p(pp: PipelineProgram, rank: int, t: tuple[str, int, TensorSpec, int, TensorSpec], m: int,
         chunks: int) -> np.ndarray:
    """Micro-batch m's transfer `t` from its stage's output to the other stage's input."""
    _, src, out, dst, inp = t
    elements = int(np.prod(out.shape, dtype=np.int64))
    x = m * pp.programs[src].hbm_size + out.offset
    y = m * pp.programs[dst].hbm_size + inp.offset
    return send_recv(rank, pp.pp, src, dst, x, y, elements, out.dtype, chunks)


def _shifted(stream: np.ndarray, by: int) -> np.ndarray:
    """The records with every HBM address moved by `by` bytes."""
    s = stream.copy()
    op = s["opcode"]
    s["a_addr"][(op == Opcode.DMA_LOAD) | (op == Opcode.DMA_GATHER)] += np.uint64(by)
    s["o_addr"][(op == Opcode.DMA_STORE) | (op == Opcode.DMA_SCATTER)] += np.uint64(by)
    return s


def run_pipeline_streams(psp: PipelineStreams, inputs: tuple, *, functional: bool = True, sanitize: bool = False
                         ) -> tuple[list[torch.Tensor], StreamRun]:
    """Every chip co-simulated, with `functional` on real data (else the outputs are zeros):
    (outputs, the run: the co-simulation, each value's transfers, the exposed communication
    ns: the run's time less the same streams' time with free links). `sanitize`: each chip's
    stream through the sanitisers with the co-simulated times first (runtime/system_stream.py)."""
    pp = psp.pipeline
    if len(inputs) != len(pp.user_inputs):
        raise TileccError(f"the pipeline program takes {len(pp.user_inputs)} inputs, got {len(inputs)}")
    micro = _micro_batches(inputs, pp.micro_batches)
    hbms = [_image(pp, r, micro) for r in range(pp.pp)] if functional else None
    cfg = pp.system.chip_config(0)
    topo, link = pp.system.topology, pp.system.link
    if sanitize:
        from tilecc.simulator.sanitizers import sanitize as run_sanitizers

        timing = cosimulate(psp.streams, cfg, topo, link)
        for r, stream in enumerate(psp.streams):
            run_sanitizers(stream, cfg, timing.chips[r].start, timing.chips[r].end,
                           hbm_size=pp.programs[r].hbm_size * pp.micro_batches)
    res = cosimulate(psp.streams, cfg, topo, link, hbms)
    where = {o: (k, spec) for k, (seg, prog) in enumerate(zip(pp.graph.segments, pp.programs))
             for o, spec in zip(seg.outputs, prog.outputs)}
    outs = []
    for name in pp.graph.outputs:
        k, spec = where[name]
        if hbms is None:
            shape = (spec.shape[0] * pp.micro_batches, *spec.shape[1:])
            outs.append(torch.zeros(shape, dtype=numerics.DTYPE_TO_TORCH[spec.dtype]))
            continue
        parts = []
        for m in range(pp.micro_batches):
            at = m * pp.programs[k].hbm_size + spec.offset
            raw = hbms[k][at: at + spec.nbytes].view(STORAGE[spec.dtype]).reshape(spec.shape)
            parts.append(_to_user_dtype(spec, numerics.storage_to_torch(raw.copy(), spec.dtype)))
        outs.append(torch.cat(parts, 0))
    exposed, free = exposed_comm_ns(psp.streams, cfg, topo, link, res)
    return outs, StreamRun(res, _transfers_run(psp, res), exposed, free)


def _image(pp: PipelineProgram, r: int, micro: list) -> np.ndarray:
    """Chip r's HBM: stage r's weights and user inputs in each micro-batch's image."""
    seg, prog = pp.graph.segments[r], pp.programs[r]
    size = prog.hbm_size
    hbm = np.zeros(size * pp.micro_batches, np.uint8)
    for m, mb in enumerate(micro):
        for spec in prog.weights:
            data = prog.weight_data.get(spec.name)
            if data is not None:
                hbm[m * size + spec.offset: m * size + spec.offset + data.size] = data
        env = dict(zip(pp.user_inputs, mb))
        env.update(pp.values)
        for name, spec in zip(seg.inputs, prog.inputs):
            if name not in env:
                continue  # a value another stage sends
            raw = numerics.torch_to_storage(_to_device_dtype(spec, env[name].contiguous()))[0]
            raw = raw.reshape(-1).view(np.uint8)
            if raw.size != spec.nbytes:
                raise TileccError(f"stage {r} input '{name}': {raw.size} bytes for a region of {spec.nbytes}")
            hbm[m * size + spec.offset: m * size + spec.offset + raw.size] = raw
    return hbm


def _transfers_run(psp: PipelineStreams, res: MultiChipResult) -> list[dict]:
    """Each value's transfers (every micro-batch): its first send's start to its last
    receive's end, as runtime/system_stream.py reports a collective."""
    out = []
    for value, src, spec, dst, _ in psp.transfers:
        lo, hi = np.inf, 0.0
        for r, prefix in ((src, "send"), (dst, "recv")):
            for kname, start, count in psp.kernels[r]:
                if kname.startswith(f"{prefix}({value}, ") and count:
                    if prefix == "send":
                        lo = min(lo, float(res.chips[r].start[start: start + count].min()))
                    hi = max(hi, float(res.chips[r].end[start: start + count].max()))
        out.append({"op": "send_recv", "value": value, "from": src, "to": dst,
                    "bytes": spec.nbytes * psp.pipeline.micro_batches, "chunks": psp.chunks,
                    "algorithm": "direct (in-stream)",
                    "time_us": (hi - lo) / res.clock_ghz / 1e3 if lo < np.inf else 0.0})
    return out


def pipeline_stream_report(psp: PipelineStreams, run: StreamRun) -> SystemReport:
    pp = psp.pipeline
    extra = {"pp": pp.pp, "micro_batches": pp.micro_batches, "collectives": "stream", "chunks": psp.chunks}
    return streams_report(pp.system, psp.streams, run, tp=1, segments=len(pp.programs), extra=extra)


def write_pipeline_stream_trace(path: str | Path, psp: PipelineStreams, run: StreamRun) -> Path:
    return write_streams_trace(path, psp.pipeline.system, psp.streams, psp.kernels, run)
