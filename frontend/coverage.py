"""Op coverage of a model: every ATen op with its count and whether tilecc runs it.

Used by `tilecc coverage FILE.py:FACTORY`. Nothing is compiled or run: the model is
exported, decomposed with tilecc's table and passed through the importer, which
records per node whether it was folded at compile time, imported for the NPU, or is
unsupported (with the user's source line of every occurrence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.export import ExportedProgram

from tilecc.frontend.torch_export import _Importer, _op_name, decompose, node_location


@dataclass
class OpCoverage:
    op: str
    count: int = 0
    npu: int = 0
    folded: int = 0
    unsupported: int = 0
    blocked: int = 0
    places: list[str] = field(default_factory=list)  # where unsupported occurrences come from

    @property
    def status(self) -> str:
        if self.unsupported:
            return "unsupported"
        if self.blocked and not self.npu:
            return "blocked"
        if self.folded and not self.npu:
            return "folded"
        return "supported"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "count": self.count, "status": self.status, "npu": self.npu,
            "folded": self.folded, "unsupported": self.unsupported, "blocked": self.blocked,
            "places": self.places,
        }


@dataclass
class CoverageReport:
    ops: list[OpCoverage]
    other: list[tuple[str, str]]  # unsupported inputs / outputs / weights (what, where)

    @property
    def supported(self) -> bool:
        return not self.other and all(o.status != "unsupported" for o in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "supported": self.supported,
            "ops": [o.to_dict() for o in self.ops],
            "other_unsupported": [{"what": w, "where": p} for w, p in self.other],
        }

    def __str__(self) -> str:
        width = max((len(o.op) for o in self.ops), default=10)
        lines = [f"{'op':<{width}}  count  status"]
        for o in self.ops:
            status = "not checked: an input is unsupported" if o.status == "blocked" else o.status
            lines.append(f"{o.op:<{width}}  {o.count:>5}  {status}")
            for p in o.places:
                lines.append(f"{'':<{width}}         at {p}")
        for what, where in self.other:
            lines.append(f"unsupported: {what} at {where}")
        n_bad = sum(o.status == "unsupported" for o in self.ops) + len(self.other)
        lines.append(
            f"{len(self.ops)} distinct ops, {sum(o.count for o in self.ops)} nodes; "
            + ("all supported" if not n_bad else f"{n_bad} unsupported")
        )
        return "\n".join(lines)


def coverage(ep: ExportedProgram) -> CoverageReport:
    core = decompose(ep)
    imp = _Importer(core)
    try:
        imp.run()
    except Exception:  # the importer raises on unsupported ops; the statuses are what we want
        pass
    table: dict[str, OpCoverage] = {}
    for node in core.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        entry = table.setdefault(name, OpCoverage(name))
        entry.count += 1
        status = imp.status.get(node, "unsupported")
        setattr(entry, status, getattr(entry, status) + 1)
        if status == "unsupported":
            entry.places.append(node_location(node))
    # inputs, weights and outputs the importer could not take (op entries are in `table`)
    other = [(w, p) for w, p in imp.unsupported if w.split(" ")[0] not in table]
    ops = sorted(table.values(), key=lambda o: (o.status != "unsupported", -o.count, o.op))
    return CoverageReport(ops, other)
