"""torch.export of a user's model, and the source location of an exported node.

    ep = export_model(model, (x,))       # ExportedProgram; torch's errors as ExportError
    node_location(node)                  # "model.py:42": the user's line that made the node
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from tilecc.errors import ExportError, TileccError

_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------


def export_model(
    model: torch.nn.Module, example_inputs: Any, dynamic_shapes: Any = None
) -> ExportedProgram:
    """``torch.export.export(model.eval(), inputs)`` under ``torch.no_grad()``.

    `example_inputs` is a tuple (a list or a single tensor is accepted). Torch errors
    are re-raised as `ExportError`.
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    elif isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    elif not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    # the user's model keeps its train/eval flags; torch's symbolic-shapes logger, which
    # prints graph dumps to stderr on a failed guard, is quiet (the error says it in one line)
    modes = [(m, m.training) for m in model.modules()]
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    noise = io.StringIO()  # what torch prints while it fails: dropped, the error says it in one line
    try:
        with torch.no_grad(), contextlib.redirect_stderr(noise):
            ep = torch.export.export(model.eval(), example_inputs, dynamic_shapes=dynamic_shapes)
        sys.stderr.write(noise.getvalue())
        return ep
    except TileccError:
        raise
    except Exception as e:  # torch raises many unrelated types here
        msg = str(e).strip().splitlines()
        first = msg[0] if msg else ""
        raise ExportError(
            f"torch.export failed on {type(model).__name__}: {type(e).__name__}: {first}{_moe_hint(model, e)}"
        ) from e
    finally:
        shapes_log.setLevel(level)
        for m, training in modes:
            m.training = training


def _moe_hint(model: torch.nn.Module, e: Exception) -> str:
    """A hint for a data-dependent shape torch.export cannot trace: a transformers
    mixture-of-experts model whose experts loop over the tokens of each expert, or the
    usual ops with data-dependent sizes."""
    if "data-dependent" not in str(e) and "DataDependent" not in type(e).__name__:
        return ""
    for m in model.modules():
        impl = getattr(getattr(m, "config", None), "_experts_implementation", None)
        if impl not in (None, "batched_mm"):
            return (f" (its mixture-of-experts layer, experts_implementation={impl!r}, selects each expert's "
                    "tokens with a data-dependent shape: set config._experts_implementation = 'batched_mm', "
                    "or pass experts_implementation='batched_mm' to from_pretrained / the config)")
    if "specialized integer" not in str(e):  # e.g. a branch on data: torch's message says it
        return ""
    return (" (a size that depends on tensor values, e.g. F.one_hot without num_classes, torch.bincount, "
            "nonzero or a boolean mask index: give the size statically)")


# ---------------------------------------------------------------------------
# Locations
# ---------------------------------------------------------------------------


def node_location(node: Node) -> str:
    """``"file.py:LINE"`` of the user code that produced `node`.

    The last frame of ``meta["stack_trace"]`` outside the torch package (so a
    ``nn.Linear`` call points at the user's line, not at torch/nn/modules/linear.py);
    the last frame if all are inside torch; the node's name without a stack trace.
    """
    trace = node.meta.get("stack_trace")
    if trace:
        frames = _FRAME_RE.findall(trace)
        if frames:
            user = [f for f in frames if not os.path.realpath(f[0]).startswith(_TORCH_DIR)]
            path, line = (user or frames)[-1]
            return f"{os.path.basename(path)}:{line}"
    return node.name
