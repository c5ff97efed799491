"""Weights stored in HBM in a kernel's tile order: derived weights, named after their source.

A matmul whose B operand is a weight (`[K, N]`, no batch) may store it pre-tiled
(`MatmulSchedule.pretiled`, passes/graph_to_tile/matmul.py): the B group of g k-tiles
of chunk c, ``TK x g*TNL``, becomes one contiguous block, so one DMA moves it with
``g*TNL`` contiguous elements per partition instead of g transfers of ``TNL``
(the per-packet overhead and the fixed cost per transfer amortised; the decode
GEMVs' time is their weight's transfer). The derived tensor is

    Bt[(c*nG + G)*TK + r, i*TNL + j] = B[(G*g + i)*TK + r, c*TNL + j]

(nG = K / (g*TK) groups, nch = N / TNL chunks), i.e. B reshaped to
``[nG, g, TK, nch, TNL]``, transposed to ``[nch, nG, TK, g, TNL]`` and viewed
``[nch*nG*TK, g*TNL]``. The lowering names it ``"<source>@btiles[nG x g x TK x nch x TNL]"``
(`tiled_name`) in a `tile.hbm_alloc {weight = ...}`. A one-row matmul (decode at batch 1)
loads its A row straight into the partitions, partition r holding the nk = K / TK
contiguous elements ``r*nk ..`` (passes/graph_to_tile/matmul.py, `direct_a`), so its
k-tile kt holds rows ``r*nk + kt`` of the contraction; its B then has its rows
interleaved the same way before tiling, ``B'[kt*TK + r] = B[r*nk + kt]``, named
``"<source>@btiles[...]:ki"``; whoever fills HBM with weights
(runtime/compiler.read_layout, runtime/gpu.py) gets its values from `weight_values`,
which derives them from the source weight (a `MetaWeight` for a model on the meta
device: shapes only). The graph program's weights are never changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from tilecc.errors import CompileError
from tilecc.ir.meta_weights import MetaWeight

_TILED = re.compile(r"^(?P<base>.+)@btiles\[(?P<dims>\d+x\d+x\d+x\d+x\d+)\](?P<ki>:ki)?$")


def tiled_name(base: str, n_groups: int, g: int, tk: int, n_chunks: int, tnl: int, *, interleaved: bool = False) -> str:
    return f"{base}@btiles[{n_groups}x{g}x{tk}x{n_chunks}x{tnl}]" + (":ki" if interleaved else "")


def tiled_shape(n_groups: int, g: int, tk: int, n_chunks: int, tnl: int) -> tuple[int, int]:
    return n_chunks * n_groups * tk, g * tnl


def is_derived(name: str) -> bool:
    return _TILED.match(name) is not None


def tile_b(b: np.ndarray, n_groups: int, g: int, tk: int, n_chunks: int, tnl: int, *,
           interleaved: bool = False) -> np.ndarray:
    """B (any shape holding K*N elements, row-major [K, N]) in the pre-tiled order
    (`interleaved`: its rows first reordered so that k-tile kt, row r is row r*nk + kt)."""
    b = np.asarray(b)
    if interleaved:
        nk = n_groups * g
        b = b.reshape(tk, nk, n_chunks * tnl).transpose(1, 0, 2)
    five = b.reshape(n_groups, g, tk, n_chunks, tnl)
    return np.ascontiguousarray(five.transpose(3, 0, 2, 1, 4)).reshape(tiled_shape(n_groups, g, tk, n_chunks, tnl))


def rebase(name: str, renamed: Mapping[str, str]) -> str | None:
    """A derived weight's name with its source renamed (`renamed`: old -> new source);
    None when `name` is not derived from one of them."""
    m = _TILED.match(name)
    if m is None or m["base"] not in renamed:
        return None
    return f"{renamed[m['base']]}@btiles[{m['dims']}]{m['ki'] or ''}"


def source_of(name: str) -> str | None:
    """The weight a derived weight is made from (None: `name` is not derived)."""
    m = _TILED.match(name)
    return m["base"] if m is not None else None


def derived_layout(name: str) -> tuple[str, tuple[int, ...], bool] | None:
    """(source, the five dims, interleaved) of a derived weight's name, or None."""
    m = _TILED.match(name)
    if m is None:
        return None
    return m["base"], tuple(int(x) for x in m["dims"].split("x")), m["ki"] is not None


def weight_values(weights: Mapping[str, object], name: str) -> object:
    """The values of weight `name`: the program's own, or derived from its source."""
    if name in weights:
        return weights[name]
    derived = derived_layout(name)
    if derived is None or derived[0] not in weights:
        raise CompileError(f"the program refers to weight '{name}', which the graph program does not hold")
    base, dims, interleaved = derived
    src = weights[base]
    if isinstance(src, MetaWeight):
        return MetaWeight(tiled_shape(*dims), src.dtype)
    return tile_b(np.asarray(src), *dims, interleaved=interleaved)
