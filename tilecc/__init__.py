"""tilecc: an MLIR-style tensor compiler for tile-based NPUs, with a cycle-approximate simulator.

    import tilecc
    cm = tilecc.compile(model, (x,), target="tiny")
    y = cm(x)            # runs on the simulator
    print(cm.report)     # cycles, roofline bound, utilisation, ...

The API is imported lazily so that IR tools (`tilecc-opt`, `xdsl-opt`) start without torch.
"""

from typing import TYPE_CHECKING, Any

from tilecc.errors import TileccError
from tilecc.version import __version__ as __version__

if TYPE_CHECKING:  # imported on first use by __getattr__
    from tilecc.api import CompiledModel, compile, load
    from tilecc.explanation import explain
    from tilecc.llm.generate import generate
    from tilecc.runtime.kernel import kernel

__all__ = ["compile", "load", "CompiledModel", "TileccError", "kernel", "explain", "generate"]


def __getattr__(name: str) -> Any:
    if name in ("compile", "load", "CompiledModel"):
        from tilecc import api

        return getattr(api, name)
    if name == "kernel":  # the tile DSL (frontend/dsl; compiled by runtime/kernel.py)
        from tilecc.runtime.kernel import kernel

        return kernel
    if name == "explain":
        from tilecc.explanation import explain

        return explain
    if name == "generate":  # greedy LLM decoding on the simulator (tilecc/llm/)
        from tilecc.llm.generate import generate

        return generate
    raise AttributeError(f"module 'tilecc' has no attribute {name!r}")
