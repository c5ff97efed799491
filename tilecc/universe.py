"""xDSL plugin entry point: makes the stock `xdsl-opt` know tilecc's dialects and passes."""

from __future__ import annotations

from xdsl.universe import Universe


def _graph():
    from tilecc.ir.graph import Graph

    return Graph


def _tile():
    from tilecc.ir.tile import Tile

    return Tile


def _npu():
    from tilecc.ir.npu import Npu

    return Npu


def _pass(name: str):
    def get():
        from tilecc.passes.registry import PASSES

        return PASSES[name]

    return get


# the names of passes.registry.PASSES, kept here so the plugin loads passes lazily
PASS_NAMES = (
    "canonicalize-graph", "fuse-graph", "lower-graph-to-tile", "plan-sram", "plan-hbm",
    "lower-tile-to-npu", "npu-insert-sync",
)

UNIVERSE = Universe(
    all_dialects={"graph": _graph, "tile": _tile, "npu": _npu},
    all_passes={name: _pass(name) for name in PASS_NAMES},
)
