"""The float64 policy: float64 is computed in fp32, with a remark per op and a flag.

The NPU has no float64 datapath, and real models pass float64 in places where fp32 is
what they need (``softmax(x, dim, dtype=torch.float64)``, float64 buffers, scalars).
The importer maps ``torch.float64`` to fp32 for inputs, weights and every op, and lists
each op that produced or read a float64 tensor (and each float64 input) on the graph's
``@forward`` as `ATTR`: ``[[what, loc], ...]``. The driver turns the list into one
``float64 computed in fp32`` remark per entry and sets ``Program.meta["float64_demoted"]``;
the report prints a line. Results come back as float64 tensors holding fp32 values,
so a comparison with eager must use fp32 tolerances.
"""

from __future__ import annotations

from typing import cast

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr
from xdsl.ir import Attribute

ATTR = "tilecc.float64_demoted"
REMARK = "float64 computed in fp32"


def demotion_attr(entries: list[tuple[str, str]]) -> ArrayAttr:
    return ArrayAttr([ArrayAttr([StringAttr(what), StringAttr(loc)]) for what, loc in entries])


def demoted(module: ModuleOp) -> list[tuple[str, str]]:
    """(what, loc) of every float64 op / input of the graph program's ``@forward``."""
    out: list[tuple[str, str]] = []
    for op in module.ops:
        if not isinstance(op, func.FuncOp):
            continue
        attr = op.attributes.get(ATTR)
        if not isinstance(attr, ArrayAttr):
            continue
        for entry in cast(ArrayAttr[Attribute], attr).data:
            parts = cast(ArrayAttr[Attribute], entry).data if isinstance(entry, ArrayAttr) else ()
            strs = [p.data for p in parts if isinstance(p, StringAttr)]
            if len(strs) == 2:
                out.append((strs[0], strs[1]))
    return out
