"""tilecc: an MLIR-style tensor compiler for tile-based NPUs, with a cycle-approximate simulator.

    import tilecc
    cm = tilecc.compile(model, (x,), target="tiny")
    y = cm(x)            # runs on the simulator
    print(cm.report)     # cycles, roofline bound, utilisation, ...
"""

from tilecc.api import CompiledModel, compile, load
from tilecc.errors import TileccError

__all__ = ["compile", "load", "CompiledModel", "TileccError"]
__version__ = "0.1.0"
