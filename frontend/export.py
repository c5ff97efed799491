"""torch.export of a user's model, and the source location of an exported node.

    ep = export_model(model, (x,))       # ExportedProgram; torch's errors as ExportError
    node_location(node)                  # "net.0 (Linear) @ model.py:42": the layer and the user's line
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
    """Where `node` comes from: the layer that made it and the user's line.

    ``"encoder.layer.3.attention.self.query (Linear) @ model.py:42"``: the innermost
    entry of ``meta["nn_module_stack"]`` (module path and class; torch.export and
    dynamo both record it) and the last frame of ``meta["stack_trace"]`` outside the
    torch package. Only the layer (``"0 (Linear)"``) when every frame is inside torch
    (an ``nn.Sequential`` exported directly: torch's own line would say nothing),
    only the line (``"model.py:42"``) for an op of the root module's own ``forward``;
    a torch frame when there is neither; the node's name without either.
    """
    layer = node_layer(node)
    user, frame = _user_frame(node)
    if layer and user:
        return f"{layer} @ {user}"
    return layer or user or frame or node.name


def node_layer(node: Node) -> str:
    """``"net.0 (Linear)"``: the innermost submodule of ``meta["nn_module_stack"]``
    (path relative to the root module, class name); "" for the root module's own ops."""
    stack = node.meta.get("nn_module_stack")
    if not isinstance(stack, dict) or not stack:
        return ""
    entry = list(stack.values())[-1]
    if not (isinstance(entry, tuple | list) and len(entry) == 2):
        return ""
    path, cls = _module_path(str(entry[0])), entry[1]
    if not path:
        return ""
    name = cls.__name__ if isinstance(cls, type) else str(cls).rpartition(".")[2]
    return f"{path} ({name})" if name else path


_ROOT_RE = re.compile(r"""^L\[['"][^'"]*['"]\]\.?""")  # dynamo's ``L['self']`` / ``L['fn']``
_INDEX_RE = re.compile(r"""\[['"]?([^'"\]]*)['"]?\]""")  # ``[0]`` / ``['q']`` -> ``.0`` / ``.q``


def _module_path(raw: str) -> str:
    path = _INDEX_RE.sub(r".\1", _ROOT_RE.sub("", raw)).replace("._modules.", ".")
    return path.strip(".")


def _user_frame(node: Node) -> tuple[str, str]:
    """(the last ``file.py:LINE`` outside torch or "", the last frame or "")."""
    trace = node.meta.get("stack_trace")
    frames = _FRAME_RE.findall(trace) if isinstance(trace, str) else []
    if not frames:
        return "", ""
    user = [f for f in frames if not os.path.realpath(f[0]).startswith(_TORCH_DIR)]
    fmt = [f"{os.path.basename(path)}:{line}" for path, line in (user[-1:] or frames[-1:])]
    return (fmt[0] if user else ""), fmt[0]
