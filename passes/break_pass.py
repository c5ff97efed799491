"""A deliberate miscompilation, for testing the tools that find miscompilations.

Test-only: with ``TILECC_TEST_BREAK_PASS=<pass name>`` in the environment, the compiler
driver (runtime/compiler.py) calls `plant` right after that pass has run. `plant`
rewrites the first ``graph.add`` in the module (inside fused kernels too) into a
``graph.sub`` with the same operands, type and location: the kind of silent wrong
result a buggy rewrite produces. Programs compiled this way are never cached
(runtime/cache.py). Used by tests/test_bisect.py to show that `tilecc bisect` names
the op and the pass.

    before (after fuse-graph):  %y = graph.add %a, %b : ...
    after:                      %y = graph.sub %a, %b : ...
"""

from __future__ import annotations

import os

from xdsl.dialects.builtin import ModuleOp
from xdsl.rewriter import Rewriter

from tilecc.ir.graph import AddOp, SubOp

ENV = "TILECC_TEST_BREAK_PASS"


def broken_pass() -> str | None:
    return os.environ.get(ENV) or None


def plant(module: ModuleOp) -> bool:
    """Turn the first graph.add into graph.sub; True if one was found."""
    for op in module.walk():
        if isinstance(op, AddOp):
            new = SubOp.create(operands=list(op.operands), result_types=[op.result.type],
                               attributes=dict(op.attributes))
            Rewriter.replace_op(op, new)
            return True
    return False
