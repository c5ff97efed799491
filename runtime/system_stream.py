"""Tensor parallelism with the collectives in the chips' instruction streams.

    ssp = build_streams(sp, chunks=4)         # sp: runtime/system_compile.py's SystemProgram
    outputs, run = run_streams(ssp, (x,))     # every chip co-simulated (simulator/multichip.py)
    run.hidden_share                          # the share of communication hidden under compute

`tilecc.compile(..., parallel={"tp": N, "collectives": "stream"})` takes this path; the
default ("between": runtime/system_run.py) runs the collectives between the segments'
programs, bulk-synchronously.

Each chip gets ONE stream for the whole model: the segments' compiled programs (every
chip's same records) with the all-reduces between them lowered into that chip's link
transfers (`passes/npu/collectives.py`, the chunked ring: the peers and block offsets
depend on the rank, so the streams differ only there). One HBM layout serves every chip:

- every value that crosses a segment boundary (a graph input, a segment's output, a
  collective's result) gets one region; each segment's records are relocated so that
  their input and output regions are those values' regions, and everything else of the
  segment (its weights held as constants, its scratch) lies in a private region;
- the all-reduce of value x into value y reads x's region and writes y's region;
- a segment output the compiler folded to a constant (a mask, a rotary table) lies in the
  segment's weights: its bytes are also put in the value's region when the HBM is loaded.

Then `codegen/link.py` links the whole stream (the segments' kernel groups and the
collective as kernels): each instruction waits, through semaphores, only on earlier
instructions touching the same HBM bytes. So the next segment's weight loads and any
work not reading the all-reduced value run while the ring runs, and a kernel that reads
the result waits only for the receives of the chunks it reads (by HBM byte range).
Where link.py cannot link (too many semaphores), a barrier stays and its remark is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tilecc.codegen.link import link_kernels
from tilecc.errors import TileccError
from tilecc.frontend.segments import Collective, Segment
from tilecc.passes.npu.collectives import ring_all_reduce
from tilecc.runtime.executor import _to_device_dtype, _to_user_dtype
from tilecc.runtime.program import Program, TensorSpec
from tilecc.runtime.system_compile import SystemProgram
from tilecc.simulator import numerics
from tilecc.simulator.isa import STORAGE, Engine, Opcode, empty_stream
from tilecc.simulator.multichip import MultiChipResult, cosimulate, exposed_comm_ns

__all__ = ["StreamProgram", "StreamRun", "build_streams", "run_streams"]

_ALIGN = 64


@dataclass
class StreamProgram:
    system: SystemProgram
    chunks: int
    streams: list[np.ndarray]  # per chip, linked
    hbm_size: int
    values: dict[str, TensorSpec]  # every value crossing a segment boundary, at its region
    weights: list[tuple[int, Program]]  # (base of the segment's private region, its program)
    kernels: list[list[tuple[str, int, int]]] = field(default_factory=list)  # per chip: (name, start, count)
    remarks: list[str] = field(default_factory=list)


@dataclass
class StreamRun:
    result: MultiChipResult
    collectives: list[dict]  # op, value, bytes, chunks, algorithm, time_us
    exposed_ns: float  # the run's time less its time with free links (simulator/multichip.py)
    free_ns: float  # the time with free links

    @property
    def hidden_share(self) -> float:
        """The share of the communication time (`result.comm_ns`) not exposed."""
        c = self.result.comm_ns
        return max(0.0, 1.0 - self.exposed_ns / c) if c > 0 else 0.0


def build_streams(sp: SystemProgram, *, chunks: int = 4) -> StreamProgram:
    """Every chip's whole-model stream with its collectives in it (see the module docstring)."""
    if chunks < 1:
        raise TileccError(f"collectives='stream': chunks must be >= 1, got {chunks}")
    n = sp.tp
    stages = sp.graph.stages
    values: dict[str, TensorSpec] = {}
    top = [0]

    def region(name: str, spec: TensorSpec) -> TensorSpec:
        if name not in values:
            values[name] = TensorSpec(name, top[0], spec.shape, spec.dtype, spec.torch_dtype)
            top[0] += -(-spec.nbytes // _ALIGN) * _ALIGN
        elif (values[name].shape, values[name].dtype) != (spec.shape, spec.dtype):
            raise TileccError(f"value '{name}' is {values[name].shape} {values[name].dtype.name} in one "
                              f"segment and {spec.shape} {spec.dtype.name} in another")
        return values[name]

    segs = [s for s in stages if isinstance(s, Segment)]
    for seg, prog in zip(segs, sp.programs):  # the boundary values first
        for name, spec in zip(seg.inputs, prog.inputs):
            region(name, spec)
        for name, spec in zip(seg.outputs, prog.outputs):
            region(name, spec)
    for stage in stages:
        if isinstance(stage, list):
            for c in stage:
                _supported(c, n)
                region(c.output, values[c.input])
    weights: list[tuple[int, Program]] = []
    pieces: list[tuple[str, list[np.ndarray] | np.ndarray]] = []  # kernels: common or per chip
    seg_i = 0
    for stage in stages:
        if isinstance(stage, Segment):
            prog = sp.programs[seg_i]
            base = -(-top[0] // _ALIGN) * _ALIGN
            top[0] = base + prog.hbm_size
            weights.append((base, prog))
            stream = _relocate(prog, stage, values, base)
            cuts = np.flatnonzero(stream["opcode"] == Opcode.BARRIER).tolist()
            lo = 0
            for j, hi in enumerate(cuts + [len(stream)]):
                if hi > lo:
                    pieces.append((f"segment{seg_i}.{j}", stream[lo:hi]))
                lo = hi + 1
            seg_i += 1
            continue
        for c in stage:
            x, y = values[c.input], values[c.output]
            count = int(np.prod(x.shape, dtype=np.int64))
            pieces.append((f"{c.op}({c.input})",
                           [ring_all_reduce(r, n, x.offset, y.offset, count, x.dtype, chunks) for r in range(n)]))
    streams, remarks, all_spans = [], [], []
    for r in range(n):
        parts, spans, pos = [], [], 0
        for name, piece in pieces:
            rec = piece[r] if isinstance(piece, list) else piece
            parts += [rec, _barrier()]
            spans.append((name, pos, len(rec)))
            pos += len(rec) + 1
        linked, new_spans, why = link_kernels(np.concatenate(parts), spans, sp.system.chip_config(r))
        streams.append(linked)
        all_spans.append(new_spans)
        if r == 0:
            remarks = why
    return StreamProgram(sp, chunks, streams, top[0], values, weights, all_spans, remarks)


def _supported(c: Collective, n: int) -> None:
    if c.op != "all_reduce":
        raise TileccError(f"collectives='stream' lowers all_reduce only (the ring); the model needs {c.op} "
                          f"of '{c.input}' (sequence parallelism or a pipeline): use the default "
                          "collectives='between'")
    if n < 2:
        raise TileccError(f"collectives='stream' needs tp >= 2, got {n}")


def _relocate(prog: Program, seg: Segment, values: dict[str, TensorSpec], base: int) -> np.ndarray:
    """The segment's records with HBM addresses moved: its inputs' and outputs' regions to
    the values' regions, everything else by `base`."""
    spans = [(spec.offset, spec.nbytes, values[name].offset) for name, spec in zip(seg.inputs, prog.inputs)]
    spans += [(spec.offset, spec.nbytes, values[name].offset) for name, spec in zip(seg.outputs, prog.outputs)]
    spans.sort()
    for (a, na, _), (b, _, _) in zip(spans, spans[1:]):
        if b < a + na:
            raise TileccError(f"segment inputs / outputs overlap in HBM at {b:#x}: cannot relocate")
    starts = np.array([s[0] for s in spans], np.int64)
    ends = np.array([s[0] + s[1] for s in spans], np.int64)
    new = np.array([s[2] for s in spans], np.int64)
    s = prog.stream.copy()
    op = s["opcode"]
    for slot, mask in (("a_addr", (op == Opcode.DMA_LOAD) | (op == Opcode.DMA_GATHER)),
                       ("o_addr", (op == Opcode.DMA_STORE) | (op == Opcode.DMA_SCATTER))):
        addr = s[slot][mask].astype(np.int64)
        k = np.searchsorted(starts, addr, side="right") - 1
        inside = (k >= 0) & (addr < ends[np.maximum(k, 0)]) if len(starts) else np.zeros(len(addr), bool)
        moved = np.where(inside, new[np.maximum(k, 0)] + addr - starts[np.maximum(k, 0)], addr + base) \
            if len(starts) else addr + base
        s[slot][mask] = moved.astype(np.uint64)
    return s


def _barrier() -> np.ndarray:
    rec = empty_stream(1)
    rec["opcode"] = int(Opcode.BARRIER)
    rec["engine"] = int(Engine.ALL)
    return rec


def run_streams(ssp: StreamProgram, inputs: tuple, *, functional: bool = True
                ) -> tuple[list[torch.Tensor], StreamRun]:
    """Co-simulate every chip; with `functional`, on the real weights and `inputs`
    (outputs: chip 0's, every chip holds the same)."""
    sp = ssp.system
    if len(inputs) != len(sp.user_inputs):
        raise TileccError(f"the system program takes {len(sp.user_inputs)} inputs, got {len(inputs)}")
    hbms = None
    if functional:
        hbms = []
        for r in range(sp.tp):
            hbm = np.zeros(ssp.hbm_size, np.uint8)
            for (base, prog), seg in zip(ssp.weights, sp.graph.segments):
                outs = [(o, ssp.values[name]) for o, name in zip(prog.outputs, seg.outputs)]
                for spec in prog.weights:
                    data = prog.weight_data.get(spec.name)
                    if data is None:
                        continue
                    hbm[base + spec.offset: base + spec.offset + data.size] = data
                    for o, v in outs:  # an output the compiler folded to a constant: its bytes there
                        lo = o.offset - spec.offset
                        if 0 <= lo and o.offset + o.nbytes <= spec.offset + data.size:
                            hbm[v.offset: v.offset + o.nbytes] = data[lo: lo + o.nbytes]
            env = dict(sp.chip_values[r])
            env.update(zip(sp.user_inputs, inputs))
            for name, t in env.items():
                spec = ssp.values.get(name)
                if spec is None:
                    continue
                raw = numerics.torch_to_storage(_to_device_dtype(spec, t.contiguous()))[0].reshape(-1).view(np.uint8)
                if raw.size != spec.nbytes:
                    raise TileccError(f"value '{name}': {raw.size} bytes for a region of {spec.nbytes}")
                hbm[spec.offset: spec.offset + raw.size] = raw
            hbms.append(hbm)
    cfg = sp.system.chip_config(0)
    res = cosimulate(ssp.streams, cfg, sp.system.topology, sp.system.link, hbms)
    outs = []
    for name in sp.graph.outputs:
        spec = ssp.values[name]
        if hbms is None:
            outs.append(torch.zeros(spec.shape, dtype=numerics.DTYPE_TO_TORCH[spec.dtype]))
            continue
        raw = hbms[0][spec.offset: spec.offset + spec.nbytes].view(STORAGE[spec.dtype]).reshape(spec.shape)
        outs.append(_to_user_dtype(spec, numerics.storage_to_torch(raw.copy(), spec.dtype)))
    colls = []
    for c in sp.graph.collectives:  # each collective's span: its first send to its last receive, any chip
        name = f"{c.op}({c.input})"
        lo, hi = np.inf, 0.0
        for r, spans in enumerate(ssp.kernels):
            for kname, start, count in spans:
                if kname == name:
                    lo = min(lo, float(res.chips[r].start[start: start + count].min()))
                    hi = max(hi, float(res.chips[r].end[start: start + count].max()))
        colls.append({"op": c.op, "value": c.input, "bytes": ssp.values[c.input].nbytes, "chunks": ssp.chunks,
                      "algorithm": "ring (in-stream)", "time_us": (hi - lo) / res.clock_ghz / 1e3})
    exposed, free = exposed_comm_ns(ssp.streams, cfg, sp.system.topology, sp.system.link, res)
    return outs, StreamRun(res, colls, exposed, free)
