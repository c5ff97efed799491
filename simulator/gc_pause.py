"""Pausing the cyclic garbage collector around loops that allocate many small objects."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: its scans of a large heap (torch's objects, or
    millions of small lists) would otherwise dominate loops that allocate many small
    containers, making them quadratic."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
