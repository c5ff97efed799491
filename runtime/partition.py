"""Heterogeneous partitioning of an FX graph: NPU programs for what the NPU runs, torch
ops on the fallback device for the rest, with the transfers between them.

    plan, gm = partition_graph(gm, cfg, options, kind="inference")
    print(plan)          # partitions, ops per partition, fallbacks with source line and reason

1. Support check per node (`frontend/fx_import.node_support`): the torch.export
   importer's handler for the op must accept it with its dtype and shapes.
2. `CapabilityBasedPartitioner` groups supported nodes into cycle-free regions.
3. Cost: each region's modelled NPU time against the fallback's time for the same ops
   (a roofline of each op's FLOPs and bytes on either side), and the tensors crossing
   between it and fallback nodes (bytes / link bandwidth + a latency per transfer). A
   region whose transfers cost more than it gains, or that only moves data (views),
   joins the fallback; this repeats until no region changes. The graph's own inputs and
   outputs are host I/O, paid whatever the split: reported, not part of the decision.
4. The remaining regions become `fused_N` submodules replaced by `NpuPartition`s that
   compile through the graph importer and the pass pipeline (per concrete shape when
   the graph is symbolic) and run on the simulator. A region the pipeline cannot compile
   runs its ops eagerly instead, and the plan says why.

Outputs that are views of the graph's inputs (a training forward's transposed weights,
saved for the backward) are made on the host as views, outside every region
(`runtime/host_views.py`): not a fallback, no copy.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from tilecc.errors import TileccError
from tilecc.frontend.fx_import import bindings_for, hint_bindings, import_graph_module, node_support, tensor_inputs
from tilecc.frontend.torch_export import _op_name, node_location
from tilecc.runtime.cache import compile_cached
from tilecc.runtime.executor import run_program
from tilecc.runtime.host_views import HOST_VIEW_REASON, host_view_outputs
from tilecc.simulator.config import HardwareConfig
from tilecc.simulator.timing import core_cycles_per

aten = torch.ops.aten

# ops that only move or reinterpret data: a region made of these alone does no NPU work
VIEW_OPS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.permute.default,
    aten.t.default, aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.expand.default, aten.clone.default, aten.alias.default,
    aten.detach.default, aten._to_copy.default, operator.getitem, aten.slice.Tensor,
    aten.select.int, aten.cat.default, aten.split.Tensor, aten.split_with_sizes.default,
}
MATMULS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.matmul.default}

# the nodes of one region, as torch's partitioner gives them (node -> its order, or None)
Region = dict[Node, int | None]


@dataclass(frozen=True)
class CostOptions:
    """The fallback device and the link to it, for the cost-aware cut (modelled, not measured)."""

    fallback_flops: float = 1e11  # FLOP/s of the fallback device (a few CPU cores)
    fallback_bandwidth: float = 2e10  # bytes/s of the fallback device's memory
    link_bandwidth: float = 1.6e10  # bytes/s between NPU and fallback (PCIe 4 x16-class)
    link_latency_s: float = 5e-6  # fixed cost of one transfer
    cost_aware: bool = True


@dataclass
class Transfer:
    tensor: str
    src: str  # partition name, or "host" for the graph's inputs and outputs
    dst: str
    bytes: int
    seconds: float


@dataclass
class Fallback:
    op: str
    location: str  # the user's file.py:LINE from the node's stack trace
    reason: str


@dataclass
class Partition:
    name: str
    device: str  # "npu" or "fallback"
    nodes: list[str]
    ops: dict[str, int]
    npu_seconds: float = 0.0  # modelled
    fallback_seconds: float = 0.0  # modelled
    reason: str = ""  # for an NPU region turned fallback: why
    compiled: bool = False
    runs: int = 0
    cycles: float = 0.0  # simulated, the last run
    sources: dict[str, str] = field(default_factory=dict)  # target="gpu": Triton source per kernel

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Plan:
    """How one graph is split; filled in as its NPU partitions compile and run."""

    kind: str  # "inference", "forward" or "backward"
    target: str
    partitions: list[Partition] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)

    @property
    def npu_partitions(self) -> list[Partition]:
        """The partitions compiled by tilecc (NPU, or GPU with target="gpu")."""
        return [p for p in self.partitions if p.device in ("npu", "gpu")]

    @property
    def fallback_ops(self) -> int:
        return sum(sum(p.ops.values()) for p in self.partitions if p.device == "fallback")

    @property
    def transfer_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers)

    @property
    def transfer_seconds(self) -> float:
        return sum(t.seconds for t in self.transfers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "target": self.target,
            "partitions": [p.to_dict() for p in self.partitions],
            "fallbacks": [f.__dict__ for f in self.fallbacks],
            "transfers": [t.__dict__ for t in self.transfers],
            "transfer_bytes": self.transfer_bytes, "transfer_seconds": self.transfer_seconds,
        }

    def __str__(self) -> str:
        npu = self.npu_partitions
        what = "GPU (Triton)" if self.target == "gpu" else "NPU"
        lines = [
            f"{self.kind} graph on {self.target}: {len(npu)} {what} partition(s), "
            f"{len(self.partitions) - len(npu)} fallback partition(s), "
            f"{sum(sum(p.ops.values()) for p in npu)} {what} op(s), {self.fallback_ops} fallback op(s)"
        ]
        for p in self.partitions:
            ops = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(p.ops.items()))
            extra = ""
            if p.device == "gpu" and p.runs:
                extra = f"  {len(p.sources)} Triton kernel(s)"
            if p.device == "npu":
                extra = f"  modelled {p.npu_seconds * 1e6:.2f} us (fallback {p.fallback_seconds * 1e6:.2f} us)"
                if p.runs:
                    extra += f", simulated {p.cycles:,.0f} cycles"
            lines.append(f"  {p.name:<12} {p.device:<8} {sum(p.ops.values()):>4} op(s){extra}: {ops}")
            if p.reason:
                lines.append(f"  {'':<12} why: {p.reason}")
        if self.fallbacks:
            lines.append("  fallback ops:")
            for f in self.fallbacks:
                lines.append(f"    {f.op} at {f.location}: {f.reason}")
        if self.transfers:
            lines.append(
                f"  transfers: {len(self.transfers)}, {self.transfer_bytes:,} bytes, "
                f"{self.transfer_seconds * 1e6:.2f} us modelled"
            )
            host = [t for t in self.transfers if "host" in (t.src, t.dst)]
            if host:
                lines.append(
                    f"    host I/O (graph inputs, weights, outputs): {len(host)}, "
                    f"{sum(t.bytes for t in host):,} bytes, {sum(t.seconds for t in host) * 1e6:.2f} us"
                )
            for t in self.transfers:
                if t not in host:
                    lines.append(f"    {t.tensor}: {t.src} -> {t.dst}, {t.bytes:,} bytes, {t.seconds * 1e6:.2f} us")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Cost model
# ---------------------------------------------------------------------------


def _numel(v: Any, hints: dict) -> int:
    if not isinstance(v, torch.Tensor):
        return 0
    n = 1
    for d in v.shape:
        n *= int(sympy.sympify(d.node.expr).subs(hints)) if isinstance(d, torch.SymInt) else int(d)
    return n


def _nbytes(v: Any, hints: dict) -> int:
    if isinstance(v, list | tuple):
        return sum(_nbytes(x, hints) for x in v)
    return _numel(v, hints) * v.element_size() if isinstance(v, torch.Tensor) else 0


def _arg_val(node: Node, i: int) -> Any:
    """The traced value (meta["val"]) of the `i`-th argument of `node`, which is a node by construction."""
    a = node.args[i]
    if not isinstance(a, Node):
        raise TileccError(f"{_op_name(node.target)} at {node_location(node)}: argument {i} is not a tensor")
    return a.meta["val"]


def _work(node: Node, hints: dict) -> tuple[float, float, float]:
    """(MACs, bytes read and written, output elements) of one node."""
    val = node.meta.get("val")
    out = _numel(val[0] if isinstance(val, list | tuple) and val else val, hints)
    nbytes = _nbytes(val, hints) + sum(_nbytes(a.meta.get("val"), hints) for a in node.all_input_nodes)
    macs = 0.0
    if node.target in MATMULS:
        a = node.args[1] if node.target is aten.addmm.default else node.args[0]
        shape = a.meta["val"].shape if isinstance(a, Node) else ()
        k = shape[-1] if shape else 1
        macs = out * (int(sympy.sympify(k.node.expr).subs(hints)) if isinstance(k, torch.SymInt) else int(k))
    elif node.target is aten.convolution.default:
        w = _arg_val(node, 1)
        macs = out * _numel(w, hints) / max(1, int(w.shape[0]))
    elif node.target is aten.scaled_dot_product_attention.default:
        q = _arg_val(node, 0)
        macs = 2 * _numel(q, hints) * int(q.shape[-2])
    return macs, nbytes, out


def npu_seconds(node: Node, cfg: HardwareConfig, hints: dict) -> float:
    macs, nbytes, out = _work(node, hints)
    val = node.meta.get("val")
    fp32 = isinstance(val, torch.Tensor) and val.dtype == torch.float32
    array = cfg.matrix.rows * cfg.matrix.cols
    cycles = max(  # core cycles: each engine's own cycles converted
        macs * (cfg.matrix.fp32_slowdown if fp32 else 1) / array * core_cycles_per(cfg, "matrix"),
        nbytes / cfg.hbm.bytes_per_cycle,
        out / cfg.vector.lanes * core_cycles_per(cfg, "vector"),
    )
    return cycles / (cfg.clock_ghz * 1e9)


def fallback_seconds(node: Node, cost: CostOptions, hints: dict) -> float:
    macs, nbytes, out = _work(node, hints)
    return max(2 * macs / cost.fallback_flops, nbytes / cost.fallback_bandwidth, out / cost.fallback_flops)


def transfer_seconds(nbytes: int, cost: CostOptions) -> float:
    return cost.link_latency_s + nbytes / cost.link_bandwidth


# ---------------------------------------------------------------------------
# Partitioning
# ---------------------------------------------------------------------------


class _Support(OperatorSupport):
    def __init__(self, supported: set[Node]):
        super().__init__()
        self.supported = supported

    def is_node_supported(self, submodules: Any, node: Node) -> bool:
        return node in self.supported


def _compute_op(n: Node) -> bool:
    return n.op == "call_function" and n.target not in VIEW_OPS


def partition_graph(
    gm: GraphModule, cfg: HardwareConfig, cost: CostOptions, kind: str = "inference", device: str = "npu"
) -> tuple[Plan, GraphModule]:
    """Split `gm` in place into NPU submodules and fallback ops; returns the plan and `gm`.

    ``device="gpu"``: the regions run through the Triton backend (`runtime/gpu.py`) with
    `cfg`'s tile sizes, on the same device as the fallback ops, so nothing is
    transferred and no region is demoted for cost."""
    with unset_fake_temporarily():  # AOTAutograd calls compilers inside its fake mode
        return _partition_graph(gm, cfg, cost, kind, device)


def _partition_graph(gm: GraphModule, cfg: HardwareConfig, cost: CostOptions, kind: str,
                     device: str) -> tuple[Plan, GraphModule]:
    plan = Plan(kind, "gpu" if device == "gpu" else cfg.name)
    hints = hint_bindings(gm.graph)
    reasons: dict[Node, str] = {}
    supported: set[Node] = set()
    host_views = host_view_outputs(gm)  # outputs that are views of inputs: no NPU copy
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        why = HOST_VIEW_REASON if n in host_views else node_support(n, hints)
        if why is None:
            supported.add(n)
        else:
            reasons[n] = why
    partitioner = CapabilityBasedPartitioner(gm, _Support(supported), allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    regions: list[Region] = [dict(p.nodes) for p in proposed]
    region_reason: dict[int, str] = {}
    owner: dict[Node, int] = {n: i for i, r in enumerate(regions) for n in r}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}

    for i, r in enumerate(regions):
        if not any(_compute_op(n) for n in r):
            region_reason[i] = "data movement only (views and copies): no NPU work"
    changed = cost.cost_aware and device == "npu"
    while changed:
        changed = False
        for i, r in enumerate(regions):
            if i in region_reason:
                continue
            gain = sum(fallback_seconds(n, cost, hints) - npu_seconds(n, cfg, hints) for n in r)
            moved = sum(
                transfer_seconds(_nbytes(t.meta.get("val"), hints), cost)
                for t in _crossing(r, owner, region_reason, i)
            )
            if moved > gain:
                region_reason[i] = (
                    f"NPU island: its transfers to and from the fallback ({moved * 1e6:.2f} us) "
                    f"outweigh its gain ({gain * 1e6:.2f} us)"
                )
                changed = True
    keep = sorted((i for i in range(len(regions)) if i not in region_reason),
                  key=lambda i: min(order[n] for n in regions[i]))

    # the plan, read off the graph before fusing rewrites it
    for i in keep:
        r = regions[i]
        plan.partitions.append(_partition(f"{device}{len(plan.partitions)}", device, r, cfg, cost, hints))
    on_npu = {n for i in keep for n in regions[i]}
    fallback_nodes = [n for n in gm.graph.nodes
                      if n.op == "call_function" and n not in on_npu and n not in host_views]
    if fallback_nodes:
        fb = _partition("fallback", "fallback", dict.fromkeys(fallback_nodes), cfg, cost, hints)
        plan.partitions.append(fb)
    for n in fallback_nodes:
        why = reasons.get(n)  # unsupported alone; demoted regions are reported once below
        if n.target is operator.getitem or not why or why.startswith("not a tensor"):
            continue
        plan.fallbacks.append(Fallback(_op_name(n.target), node_location(n), why))
    for i, why in sorted(region_reason.items()):
        if why.startswith("NPU island"):
            ops = Counter(_op_name(n.target) for n in regions[i] if n.target is not operator.getitem)
            first = min(regions[i], key=lambda n: order[n])
            names = sorted(ops)
            label = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            plan.fallbacks.append(Fallback(f"{sum(ops.values())} ops ({label})", node_location(first), why))
    name_of = {n: p.name for p, i in zip(plan.npu_partitions, keep) for n in regions[i]}
    plan.transfers = _transfers(gm, name_of, cost, hints) if device == "npu" else []

    fused = fuse_by_partitions(gm, [regions[i] for i in keep], prefix="tilecc_npu_", always_return_tuple=True)
    for k, part in enumerate(plan.npu_partitions):
        sub = getattr(fused, f"tilecc_npu_{k}")
        setattr(fused, f"tilecc_npu_{k}", NpuPartition(sub, cfg, part, plan, gpu=device == "gpu"))
    fused.recompile()
    return plan, fused


def _crossing(region: Region, owner: dict[Node, int], demoted: dict[int, str], me: int) -> list[Node]:
    """Tensors moving between `region` and fallback nodes (not the graph's inputs/outputs)."""

    def on_fallback(n: Node) -> bool:
        if n.op != "call_function":
            return False  # placeholders (host inputs) and the output (host)
        i = owner.get(n)
        return i is None or i in demoted

    out: list[Node] = []
    for n in region:
        for a in n.all_input_nodes:
            if a not in region and on_fallback(a) and isinstance(a.meta.get("val"), torch.Tensor) and a not in out:
                out.append(a)
        if any(u not in region and on_fallback(u) for u in n.users) and isinstance(n.meta.get("val"), torch.Tensor):
            out.append(n)
    return out


def _partition(name: str, device: str, nodes: Region, cfg: HardwareConfig, cost: CostOptions,
               hints: dict) -> Partition:
    ops = Counter(_op_name(n.target) for n in nodes if n.target is not operator.getitem)
    return Partition(
        name, device, [n.name for n in nodes], dict(ops),
        npu_seconds=sum(npu_seconds(n, cfg, hints) for n in nodes),
        fallback_seconds=sum(fallback_seconds(n, cost, hints) for n in nodes),
    )


def _transfers(gm: GraphModule, name_of: dict[Node, str], cost: CostOptions, hints: dict) -> list[Transfer]:
    """Every tensor edge whose ends sit on different devices, once per (tensor, destination)."""

    def where(n: Node) -> str:
        if n.op in ("placeholder", "output"):
            return "host"
        return name_of.get(n, "fallback")

    out: list[Transfer] = []
    seen: set[tuple[str, str]] = set()
    for n in gm.graph.nodes:
        if not isinstance(n.meta.get("val"), torch.Tensor):
            continue
        src = where(n)
        for u in n.users:
            dst = where(u)
            if u.target is operator.getitem:
                continue
            npu_side = src.startswith("npu") or dst.startswith("npu")
            if src == dst or not npu_side or (src.startswith("npu") and dst.startswith("npu")):
                continue
            if (n.name, dst) in seen:
                continue
            seen.add((n.name, dst))
            b = _nbytes(n.meta["val"], hints)
            out.append(Transfer(n.name, src, dst, b, transfer_seconds(b, cost)))
    return out


# ---------------------------------------------------------------------------
# Running an NPU partition
# ---------------------------------------------------------------------------


class NpuPartition(torch.nn.Module):
    """A fused region: compiled once per concrete input shape, run on the simulator.

    Tensors arrive on the fallback device and return there (`.cpu()` in, `.to(device)`
    out). If the pass pipeline cannot compile the region, its ops run eagerly and the
    plan records why (`Partition.reason`).
    """

    def __init__(self, sub: GraphModule, cfg: HardwareConfig, part: Partition, plan: Plan, gpu: bool = False):
        super().__init__()
        self.gpu = gpu
        self.sub = sub
        self.cfg = cfg
        self.part = part
        self.plan = plan
        self.is_tensor = tensor_inputs(sub.graph)
        self.programs: dict[tuple, Any] = {}
        self.failed: str | None = None
        self.last_report: Any = None
        if not any(isinstance(d, torch.SymInt) for n in sub.graph.nodes for d in _dims(n)):
            self._compile(tuple(n.meta.get("val") for n in sub.graph.nodes if n.op == "placeholder"), {})

    def _compile(self, key: tuple, bindings: dict) -> Any:
        try:
            gp = import_graph_module(self.sub, bindings)
            if self.gpu:
                from tilecc.runtime.gpu import prepare_triton

                program = (gp, prepare_triton(gp, self.cfg))
                self.part.sources = program[1][2]
            else:
                program = compile_cached(gp, self.cfg, None)  # the default compile cache (runtime/cache.py)
        except TileccError as e:
            what = "the Triton backend" if self.gpu else "the NPU pipeline"
            self._give_up(f"{what} cannot compile it: {str(e).splitlines()[0]}")
            return None
        self.programs[_key_of(key)] = program
        self.part.compiled = True
        return program

    def _give_up(self, why: str) -> None:
        self.failed = why
        self.part.device = "fallback"
        self.part.reason = why
        for n in self.sub.graph.nodes:
            if n.op == "call_function" and n.target is not operator.getitem:
                self.plan.fallbacks.append(Fallback(_op_name(n.target), node_location(n), why))

    def program_for(self, args: tuple) -> Any:
        """The Program for these arguments (compiled on first sight), or None when the
        region cannot compile (it then runs eagerly, see `_give_up`)."""
        if self.failed is not None or self.gpu:
            return None
        key = _key_of(args)
        if key in self.programs:
            return self.programs[key]
        return self._compile(args, bindings_for(self.sub.graph, args))

    def forward(self, *args: Any) -> Any:
        if self.failed is not None:
            return self.sub(*args)
        key = _key_of(args)
        program = self.programs.get(key)
        if program is None:
            program = self._compile(args, bindings_for(self.sub.graph, args))
            if program is None:
                return self.sub(*args)
        tensors = [a for a, t in zip(args, self.is_tensor) if t]
        device = tensors[0].device if tensors else torch.device("cpu")
        if self.gpu:
            from tilecc.runtime.gpu import run_on_triton

            gp, prepared = program
            outs, _ = run_on_triton(gp, self.cfg, tuple(t.contiguous() for t in tensors), device=str(device),
                                    prepared=prepared)
            self.part.runs += 1
            return tuple(outs)
        inputs = tuple(t.detach().to("cpu").contiguous() for t in tensors)
        outputs, report = run_program(program, inputs)
        self.last_report = report
        self.part.runs += 1
        self.part.cycles = float(report.cycles)
        return tuple(o.to(device) for o in outputs)


def _dims(n: Node) -> list:
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return list(v.shape)
    return [v] if isinstance(v, torch.SymInt) else []


def _key_of(args: tuple) -> tuple:
    return tuple(_arg_key(a) for a in args)


def _arg_key(a: Any) -> Any:
    """The cache key of one argument: a tensor's shape and dtype, an integer's value, else its repr."""
    if isinstance(a, torch.Tensor):
        return (tuple(int(d) for d in a.shape), a.dtype)
    return int(a) if isinstance(a, int | torch.SymInt) else repr(a)
