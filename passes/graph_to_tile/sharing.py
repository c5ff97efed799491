"""Kernels shared between identical launches (`lower-graph-to-tile`'s kernel memo).

A transformer's layers lower to the same kernels, differing only in the HBM tensors
they are launched on. Before lowering a shareable op (a fused group, a matmul, an
attention, a rotary embedding), the conversion computes its *structural key*: the op's kinds, attributes,
result types and inner structure (everything but its SSA names and source location),
and per operand either the chain of HBM types from the operand's tensor to its root
allocation (shape, dtype, strides, offset: the kernel's argument types) with the
aliasing among operands, or the immediate it folded to; the layout its consumer asked
for; the opt level. The kernel body and its schedule are functions of that key (the
lowerings read nothing else), so when a key was lowered before, the op's @main ops
(its output allocations, views, constants and the `func.call`) are cloned from the
first lowering's with the operands' tensors substituted, and the call names the kernel
already built: the body is built, planned, lowered to npu and synchronised once.

Before (two identical layers, graph)::

    %h1 = graph.fused "matmul" (%x, %w1) ...    // layer 0
    %h2 = graph.fused "matmul" (%h1, %w2) ...   // layer 1: same shapes, other weight

After (tile)::

    func.func @k0_fused_matmul(...) {tile.kernel} { ... }      // built once
    func.func @main() {
      ...
      func.call @k0_fused_matmul(%x, %w1, %i0, %h1) ...
      func.call @k0_fused_matmul(%h1, %w2, %i1, %h2) ...      // a re-launch
    }

`lower-tile-to-npu` lowers each distinct kernel once and represents the re-launches as
`npu.launch` ops carrying the address deltas of their arguments; `codegen/expand.py`
relocates the shared body per launch, so the stream is byte-identical to the one built
without sharing (`disabled={"share-kernels"}`). The lowering of a key is replayed only
when its first lowering touched nothing but its own @main ops, kernels and results
(checked); otherwise the op is lowered on its own every time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Operation, SSAValue

from tilecc.ir import graph as g
from tilecc.ir import tile
from tilecc.ir.graph_base import LOC_ATTR
from tilecc.ir.graph_fusion import FusedOp
from tilecc.ir.graph_index import SdpaOp
from tilecc.ir.graph_rope import RopeOp
from tilecc.ir.weight_layout import rebase

# the op kinds repeated per layer whose lowerings are known to keep their state to
# their own results (the CNN family's padded layouts and ahead-of-time lowerings are not)
SHAREABLE: tuple[type[Operation], ...] = (FusedOp, SdpaOp, g.MatmulOp, RopeOp)


@dataclass
class _Replay:
    """What the first lowering of a key emitted: its @main ops and the tensors it read."""

    inputs: list[SSAValue | None]  # per operand chain position: the HBM tensor it used
    main_ops: list[Operation]
    results: list[SSAValue | None]  # per op result: its HBM tensor (None: an immediate)
    scalars: list[float | None]  # per op result: its immediate
    absorbed: list[SSAValue | None]  # per op result: the permute buffer it was written into
    materialised: list[SSAValue | None]  # per operand: the constant tensor made for an immediate
    kernels: list[str]
    launches: int = 1


@dataclass
class KernelMemo:
    """The keys lowered so far in one conversion, and how often each was re-launched."""

    enabled: bool = True
    replays: dict[tuple, _Replay | None] = field(default_factory=dict)

    def shared(self) -> list[tuple[str, int]]:
        """(kernel name, launches) of every kernel launched more than once."""
        out = []
        for r in self.replays.values():
            if r is not None and r.launches > 1:
                out += [(k, r.launches) for k in r.kernels]
        return out


def _chain(v: SSAValue) -> list[SSAValue]:
    """`v` and the views it is taken from, down to its root allocation."""
    out = [v]
    while isinstance(out[-1].owner, tile.ViewOp):
        out.append(out[-1].owner.source)
    return out


def _structure(op: Operation) -> tuple:
    """The op and its regions, SSA values numbered locally, locations left out."""
    names: dict[SSAValue, int] = {}
    items: list[tuple] = []

    def ref(v: SSAValue) -> object:
        return names.get(v, ("outer", str(v.type)))  # an outer value: placed by the operand key

    for o in op.walk():
        for r in o.regions:
            for b in r.blocks:
                for a in b.args:
                    names[a] = len(names)
        attrs = tuple(sorted((k, str(a)) for k, a in o.attributes.items() if k != LOC_ATTR))
        props = tuple(sorted((k, str(a)) for k, a in o.properties.items()))
        items.append((o.name, props, attrs, tuple(ref(v) for v in o.operands),
                      tuple(str(r.type) for r in o.results)))
        for r in o.results:
            names[r] = len(names)
    return tuple(items)


def structural_key(lw, op: Operation) -> tuple | None:
    """The key of `op`'s lowering, or None when it is not shared."""
    if not isinstance(op, SHAREABLE) or lw.nn.padded or lw.nn.absorb:
        return None
    operands: list[tuple] = []
    roots: list[SSAValue] = []
    for v in op.operands:
        if v in lw.values:
            chain = _chain(lw.values[v])
            root = chain[-1]
            alloc = root.owner
            const = id(alloc.value) if isinstance(alloc, tile.HbmAllocOp) and alloc.value is not None else None
            alias = roots.index(root) if root in roots else -1
            roots.append(root)
            operands.append(("hbm", tuple(str(c.type) for c in chain), alias, const))
        elif v in lw.scalars:
            operands.append(("scalar", lw.scalars[v]))
        else:
            return None
    requests = tuple(lw.layout_requests.get(r) for r in op.results)
    return (lw.opt_level, _structure(op), tuple(operands), requests)


def _inner(op: Operation) -> list[SSAValue]:
    """The values `op` defines: its results, then its regions' arguments and results in
    walk order (the same order for two ops of one structure)."""
    out: list[SSAValue] = list(op.results)
    for o in op.walk():
        for r in o.regions:
            for b in r.blocks:
                out += b.args
        if o is not op:
            out += o.results
    return out


def _nn_state(lw) -> tuple[int, ...]:
    nn = lw.nn
    return (len(nn.consts), len(nn.fill_rows), len(nn.padded), len(nn.padded_hbm), len(nn.absorb),
            len(nn.natural_hbm))


def _new_keys(d: dict, before: int) -> list:
    return list(islice(reversed(d), max(len(d) - before, 0)))


class Recording:
    """Watches one first lowering and records it as a `_Replay` when it is replayable."""

    def __init__(self, lw, op: Operation):
        self.lw, self.op = lw, op
        self.inputs = [c for v in op.operands if v in lw.values for c in _chain(lw.values[v])]
        self.main_start, self.kernel_start = len(lw.main_ops), len(lw.kernels)
        self.sizes = (len(lw.values), len(lw.scalars), len(lw.absorbed))
        self.nn = _nn_state(lw)

    def finish(self) -> _Replay | None:
        """The replay of this lowering, or None where it touched more than its own values."""
        lw, op = self.lw, self.op
        defined = _inner(op)
        mine = set(defined) | set(op.operands)
        new = [k for d, n in zip((lw.values, lw.scalars, lw.absorbed), self.sizes) for k in _new_keys(d, n)]
        if _nn_state(lw) != self.nn or any(v not in mine for v in new) or len(lw.kernels) == self.kernel_start:
            return None
        return _Replay(
            inputs=self.inputs,  # pyright: ignore[reportArgumentType]
            main_ops=lw.main_ops[self.main_start:],
            results=[lw.values.get(r) for r in defined],
            scalars=[lw.scalars.get(r) for r in defined],
            absorbed=[lw.absorbed.get(r) for r in defined],
            materialised=[lw.values.get(v) if v in lw.scalars else None for v in op.operands],
            kernels=[k.sym_name.data for k in lw.kernels[self.kernel_start:]],
        )


def replay(lw, op: Operation, r: _Replay) -> None:
    """Lower `op` as the first lowering of its key did, on `op`'s own tensors."""
    now = [c for v in op.operands if v in lw.values for c in _chain(lw.values[v])]
    mapping: dict[SSAValue, SSAValue] = dict(zip(r.inputs, now, strict=True))  # pyright: ignore[reportAssignmentType]
    # weights derived from an operand's weight (pre-tiled B, ir/weight_layout.py) derive
    # from this op's own weight
    renamed: dict[str, str] = {}
    for a, b in zip(r.inputs, now):
        old_name, new_name = _weight_name(a), _weight_name(b)
        if old_name is not None and new_name is not None:
            renamed[old_name] = new_name
    loc = g.source_loc(op)
    for o in r.main_ops:
        new = o.clone(value_mapper=mapping)
        if isinstance(new, tile.HbmAllocOp) and new.weight is not None:
            new_name = rebase(new.weight.data, renamed)
            if new_name is not None:
                new.properties["weight"] = StringAttr(new_name)
        if LOC_ATTR in new.attributes:
            g.set_loc(new, loc)
        lw.main_ops.append(new)
    for v, m in zip(op.operands, r.materialised, strict=True):
        if m is not None:
            lw.values[v] = mapping.get(m, m)
    for res, val, s, ab in zip(_inner(op), r.results, r.scalars, r.absorbed, strict=True):
        lw.layout_requests.pop(res, None)
        if val is not None:
            lw.values[res] = mapping.get(val, val)
        if s is not None:
            lw.scalars[res] = s
        if ab is not None:
            lw.absorbed[res] = mapping.get(ab, ab)
    r.launches += 1


def _weight_name(v: SSAValue | None) -> str | None:
    alloc = v.owner if v is not None else None
    if isinstance(alloc, tile.HbmAllocOp) and alloc.weight is not None:
        return alloc.weight.data
    return None


__all__ = ["KernelMemo", "Recording", "SHAREABLE", "replay", "structural_key"]
