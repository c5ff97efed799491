"""The compile session: state that lives for one compile and no longer.

Passes memoise work that repeats within a model (the structurally identical kernels of
its repeated layers are synchronised once; an attention shape is searched once). That
state belongs to the compile, not to the module: a `CompileSession` owns every such
cache, each bounded (least recently used entries go first), and the driver creates one
per compile and hands it to the passes. Nothing in `passes/` keeps module-level mutable
state.

    session = CompileSession()
    memo = session.cache("insert-sync", maxsize=512)
    hit = memo.get(key)
    if hit is None:
        memo.put(key, value)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tilecc.passes.fallback import FallbackPlan, OpNumbering

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """A mapping of at most `maxsize` entries; the least recently used one is evicted."""

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"BoundedCache maxsize {maxsize}: must be at least 1")
        self.maxsize = maxsize
        self._items: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        """The value stored under `key` (None when absent: test `in` to store None)."""
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def put(self, key: Hashable, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.maxsize:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class CompileSession:
    """The caches of one compile, by name (one per concept that memoises)."""

    caches: dict[str, BoundedCache[Any]] = field(default_factory=dict[str, BoundedCache[Any]])
    # what this compile gives up after an earlier attempt failed (passes/fallback.py)
    fallback: FallbackPlan = field(default_factory=FallbackPlan)
    numbering: OpNumbering = field(default_factory=OpNumbering)
    # optional rewrites the driver was asked to skip (`compile_graph(disabled=...)`) that
    # are steps of a pass, not passes of the pipeline (fuse-mlp, a step of fuse-graph)
    disabled: frozenset[str] = frozenset()

    def cache(self, name: str, maxsize: int) -> BoundedCache[Any]:
        """The session's cache called `name`, created on first use with `maxsize` entries."""
        found = self.caches.get(name)
        if found is None:
            found = self.caches[name] = BoundedCache(maxsize)
        return found
