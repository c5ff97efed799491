"""Atomic file writes for the on-disk caches (autotune winners, compiled programs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, prefix: str) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one:
    a temporary file in the same directory, fsynced, then renamed over `path`.
    Raises OSError (the temporary file is removed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
