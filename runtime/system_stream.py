"""Tensor parallelism with the collectives in the chips' instruction streams.

    ssp = build_streams(sp, chunks=4, algorithm="auto")   # sp: runtime/system_compile.py's SystemProgram
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

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from tilecc.codegen.link import link_kernels
from tilecc.errors import TileccError
from tilecc.frontend.segments import Collective, Segment
from tilecc.runtime.executor import _to_device_dtype, _to_user_dtype
from tilecc.runtime.program import Program, TensorSpec
from tilecc.runtime.stream_algorithm import ALGORITHMS, choose, lower
from tilecc.runtime.system_compile import SystemProgram
from tilecc.simulator import numerics
from tilecc.simulator.isa import ITEMSIZE, STORAGE, Engine, Opcode, empty_stream
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
    alias: list[dict[str, int]] = field(default_factory=list)  # per chip: values placed in another's region
    algorithms: dict[str, str] = field(default_factory=dict)  # collective kernel name -> algorithm lowering it

    def offset(self, r: int, name: str) -> int:
        """Where value `name` lies in chip r's HBM."""
        if self.alias and name in self.alias[r]:
            return self.alias[r][name]
        return int(self.values[name].offset)


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


def build_streams(sp: SystemProgram, *, chunks: int = 4, algorithm: str = "ring") -> StreamProgram:
    """Every chip's whole-model stream with its collectives in it (see the module docstring);
    `algorithm`: one of stream_algorithm.ALGORITHMS, for every collective."""
    if chunks < 1:
        raise TileccError(f"collectives='stream': chunks must be >= 1, got {chunks}")
    if algorithm not in ALGORITHMS:
        raise TileccError(f"collectives='stream': algorithm {algorithm!r} (allowed: {', '.join(ALGORITHMS)})")
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
    # per chip: values placed inside another value's region (shard, reduce-scatter outputs,
    # all-gather inputs), the rest at their common region
    alias: list[dict[str, int]] = [{} for _ in range(n)]

    def off(r: int, name: str) -> int:
        return alias[r][name] if name in alias[r] else int(values[name].offset)

    colls: list[tuple[Collective, int, int]] = []  # (collective, scratch buffer or -1, elements)
    seg_i = 0
    for stage in stages:
        if isinstance(stage, Segment):  # an output that is an input's bytes (a view): placed there
            prog = sp.programs[seg_i]
            seg_i += 1
            for o_name, o in zip(stage.outputs, prog.outputs):
                host = _inside(o, list(zip(stage.inputs, prog.inputs)))
                if host is not None:
                    h_name, h = host
                    for r in range(n):
                        alias[r][o_name] = off(r, h_name) + o.offset - h.offset
            continue
        for c in stage:
            x = values[c.input]
            shape = list(x.shape)
            if c.op == "all_gather":
                shape[c.dim] *= n
            elif c.op in ("reduce_scatter", "shard"):
                shape[c.dim] //= n
            y = region(c.output, TensorSpec(c.output, 0, tuple(shape), x.dtype, x.torch_dtype))
            _supported(c, n, x, y, sp.graph.placeholders, alias[0])
            scratch = -1
            if c.op == "shard":
                for r in range(n):
                    alias[r][c.output] = off(r, c.input) + r * y.nbytes
            elif c.op == "reduce_scatter":
                scratch = -(-top[0] // _ALIGN) * _ALIGN
                top[0] = scratch + x.nbytes
                for r in range(n):
                    alias[r][c.output] = scratch + r * y.nbytes
            elif c.op == "all_gather":
                for r in range(n):
                    alias[r][c.input] = y.offset + r * x.nbytes
            colls.append((c, scratch, int(np.prod(x.shape if c.op != "all_gather" else y.shape, dtype=np.int64))))
    weights: list[tuple[int, Program]] = []
    algos: dict[str, str] = {}
    pieces: list[tuple[str, list[np.ndarray]]] = []  # kernels, per chip
    seg_i = 0
    coll_i = 0
    for stage in stages:
        if isinstance(stage, Segment):
            prog = sp.programs[seg_i]
            base = -(-top[0] // _ALIGN) * _ALIGN
            top[0] = base + prog.hbm_size
            weights.append((base, prog))
            per_chip = [_relocate(prog, stage, lambda name, r=r: off(r, name), base) for r in range(n)]
            cuts = np.flatnonzero(per_chip[0]["opcode"] == Opcode.BARRIER).tolist()
            lo = 0
            for j, hi in enumerate(cuts + [len(per_chip[0])]):
                if hi > lo:
                    pieces.append((f"segment{seg_i}.{j}", [s[lo:hi] for s in per_chip]))
                lo = hi + 1
            seg_i += 1
            continue
        for _ in stage:
            c, scratch, count = colls[coll_i]
            coll_i += 1
            if c.op == "shard":
                continue  # a local cut: the consumers read the chip's block in place
            dt = values[c.input].dtype
            topo, link = sp.system.topology, sp.system.link
            name = choose(c.op, algorithm, topo, link, count, ITEMSIZE[dt])
            y_of = (lambda r: scratch) if c.op == "reduce_scatter" else (lambda r, c=c: off(r, c.output))
            recs = lower(c.op, name, topo, link, lambda r, c=c: off(r, c.input), y_of, count, dt, chunks)
            algos[f"{c.op}({c.input})"] = name
            pieces.append((f"{c.op}({c.input})", recs))
    streams, remarks, all_spans = [], [], []
    for r in range(n):
        parts, spans, pos = [], [], 0
        for name, piece in pieces:
            rec = piece[r]
            parts += [rec, _barrier()]
            spans.append((name, pos, len(rec)))
            pos += len(rec) + 1
        linked, new_spans, why = link_kernels(np.concatenate(parts), spans, sp.system.chip_config(r))
        streams.append(linked)
        all_spans.append(new_spans)
        if r == 0:
            remarks = why
    return StreamProgram(sp, chunks, streams, top[0], values, weights, all_spans, remarks, alias, algos)


def _supported(c: Collective, n: int, x: TensorSpec, y: TensorSpec, placeholders: list[str],
               aliased: dict[str, int]) -> None:
    if c.op not in ("all_reduce", "reduce_scatter", "all_gather", "shard"):
        raise TileccError(f"collectives='stream' lowers all_reduce, reduce_scatter, all_gather and shard; the "
                          f"model needs {c.op} of '{c.input}' (a pipeline): use collectives='between'")
    if n < 2:
        raise TileccError(f"collectives='stream' needs tp >= 2, got {n}")
    if c.op == "all_reduce":
        return
    full = y.shape if c.op == "all_gather" else x.shape
    if full[c.dim] % n or int(np.prod(full[: c.dim], dtype=np.int64)) != 1:
        raise TileccError(f"collectives='stream': {c.op} of '{c.input}' {tuple(x.shape)} along dim {c.dim} over "
                          f"{n} chips needs {n} contiguous equal blocks (size along the dim a multiple of {n}, "
                          f"every dim before it 1): use collectives='between'")
    if c.op == "all_gather" and (c.input in placeholders or c.input in aliased):
        raise TileccError(f"collectives='stream': all_gather of '{c.input}', which is a graph input or itself "
                          "placed in another value's region: use collectives='between'")


def _inside(o: TensorSpec, specs: list[tuple[str, TensorSpec]]) -> tuple[str, TensorSpec] | None:
    """The (name, spec) whose HBM range holds `o`'s, if any."""
    for name, spec in specs:
        if spec.offset <= o.offset and o.offset + o.nbytes <= spec.offset + spec.nbytes:
            return name, spec
    return None


def _relocate(prog: Program, seg: Segment, offset: Callable[[str], int], base: int) -> np.ndarray:
    """The segment's records with HBM addresses moved: its inputs' and outputs' regions to
    the values' regions (`offset`), everything else by `base` (an output inside an input's
    range is that input's bytes: its own span is dropped)."""
    ins = list(zip(seg.inputs, prog.inputs))
    spans = [(spec.offset, spec.nbytes, offset(name)) for name, spec in ins]
    spans += [(spec.offset, spec.nbytes, offset(name)) for name, spec in zip(seg.outputs, prog.outputs)
              if _inside(spec, ins) is None]
    spans.sort()
    for (a, na, _), (b, _, _) in zip(spans, spans[1:]):
        if b < a + na:
            raise TileccError(f"segment inputs / outputs overlap in HBM at {b:#x}: cannot relocate")
    starts = np.array([s[0] for s in spans], np.int64)
    ends = np.array([s[0] + s[1] for s in spans], np.int64)
    new = np.array([s[2] for s in spans], np.int64)
    _check_spans(prog, starts, ends)
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


def _check_spans(prog: Program, starts: np.ndarray, ends: np.ndarray) -> None:
    """Every DMA's HBM bytes lie inside one input / output region or outside all of them:
    `_relocate` moves a record by its start address, so one whose bytes crossed a
    region's edge (a kernel using an output's bytes beyond the output as scratch, say)
    would be split between two places. A TileccError instead of a wrong relocation."""
    from tilecc.simulator.decode import DecodedProgram
    from tilecc.simulator.footprints import hbm_bounding

    if not len(starts):
        return
    fp = hbm_bounding(DecodedProgram(prog.stream, prog.config))
    lo, hi = fp.b0, fp.b1
    k = np.searchsorted(starts, lo, side="right") - 1
    kk = np.maximum(k, 0)
    inside = (k >= 0) & (lo < ends[kk])
    nxt = np.minimum(k + 1, len(starts) - 1)
    crosses = np.where(inside, hi > ends[kk], (k + 1 < len(starts)) & (starts[nxt] < hi))
    if crosses.any():
        i = int(np.flatnonzero(crosses)[0])
        raise TileccError(
            f"segment record {int(fp.instr[i])}: its HBM bytes [{int(lo[i]):#x}, {int(hi[i]):#x}) cross the edge "
            "of a segment input / output region: the stream cannot be relocated"
        )


def _barrier() -> np.ndarray:
    rec = empty_stream(1)
    rec["opcode"] = int(Opcode.BARRIER)
    rec["engine"] = int(Engine.ALL)
    return rec


def run_streams(ssp: StreamProgram, inputs: tuple, *, functional: bool = True, sanitize: bool = False
                ) -> tuple[list[torch.Tensor], StreamRun]:
    """Co-simulate every chip; with `functional`, on the real weights and `inputs`
    (outputs: chip 0's, every chip holds the same). `sanitize`: each chip's stream goes
    through the sanitisers (races, uninitialised reads, deadlocks; a receive is its chip's
    writer of the bytes it receives) with the co-simulated times, before its data moves."""
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
                            at = ssp.offset(r, v.name)
                            hbm[at: at + o.nbytes] = data[lo: lo + o.nbytes]
            env = dict(sp.chip_values[r])
            env.update(zip(sp.user_inputs, inputs))
            for name, t in env.items():
                spec = ssp.values.get(name)
                if spec is None:
                    continue
                raw = numerics.torch_to_storage(_to_device_dtype(spec, t.contiguous()))[0].reshape(-1).view(np.uint8)
                if raw.size != spec.nbytes:
                    raise TileccError(f"value '{name}': {raw.size} bytes for a region of {spec.nbytes}")
                at = ssp.offset(r, name)
                hbm[at: at + raw.size] = raw
            hbms.append(hbm)
    cfg = sp.system.chip_config(0)
    if sanitize:
        from tilecc.simulator.sanitizers import sanitize as run_sanitizers

        timing = cosimulate(ssp.streams, cfg, sp.system.topology, sp.system.link)
        for r, stream in enumerate(ssp.streams):
            run_sanitizers(stream, cfg, timing.chips[r].start, timing.chips[r].end, hbm_size=ssp.hbm_size)
    res = cosimulate(ssp.streams, cfg, sp.system.topology, sp.system.link, hbms)
    outs = []
    for name in sp.graph.outputs:
        spec = ssp.values[name]
        if hbms is None:
            outs.append(torch.zeros(spec.shape, dtype=numerics.DTYPE_TO_TORCH[spec.dtype]))
            continue
        at = ssp.offset(0, name)
        raw = hbms[0][at: at + spec.nbytes].view(STORAGE[spec.dtype]).reshape(spec.shape)
        outs.append(_to_user_dtype(spec, numerics.storage_to_torch(raw.copy(), spec.dtype)))
    colls = []
    for c in sp.graph.collectives:  # each collective's span: its first send to its last receive, any chip
        name = f"{c.op}({c.input})"
        lo, hi = np.inf, 0.0
        for r, spans in enumerate(ssp.kernels):
            for kname, start, count in spans:
                if kname == name:  # a receive enters its queue early: the span starts at a send
                    sends = ssp.streams[r]["opcode"][start: start + count] == Opcode.LINK_SEND
                    if sends.any():
                        lo = min(lo, float(res.chips[r].start[start: start + count][sends].min()))
                    hi = max(hi, float(res.chips[r].end[start: start + count].max()))
        local = lo == np.inf  # a shard: no instructions
        colls.append({"op": c.op, "value": c.input, "bytes": ssp.values[c.input].nbytes, "chunks": ssp.chunks,
                      "algorithm": "local" if local else f"{ssp.algorithms.get(name, 'ring')} (in-stream)",
                      "time_us": 0.0 if local else (hi - lo) / res.clock_ghz / 1e3})
    exposed, free = exposed_comm_ns(ssp.streams, cfg, sp.system.topology, sp.system.link, res)
    return outs, StreamRun(res, colls, exposed, free)
