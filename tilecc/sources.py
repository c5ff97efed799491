"""Where the running compiler's code comes from.

tilecc is one distribution whose subpackages live in sibling folders of a checkout
(``tilecc.passes`` is ``passes/``). An editable install maps each subpackage to the
checkout it was installed from, so a second checkout (a git worktree) run with the
first one's environment imports its own ``tilecc/`` but every subpackage from the
first: tests and caches would then describe code that is not the code that ran.
`package_dirs` names the folder each subpackage is imported from, without importing
it; `compiler_source_hash` hashes exactly those folders; `foreign_packages` lists the
subpackages that come from outside a given checkout.
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

SUBPACKAGES = ("tilecc", "tilecc.frontend", "tilecc.ir", "tilecc.passes", "tilecc.codegen",
               "tilecc.runtime", "tilecc.simulator")


def package_dirs() -> dict[str, Path]:
    """The folder each tilecc (sub)package is (or would be) imported from."""
    out: dict[str, Path] = {}
    for name in SUBPACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"tilecc is installed without its {name} package")
        out[name] = Path(list(spec.submodule_search_locations)[0]).resolve()
    return out


def foreign_packages(checkout: str | Path) -> dict[str, Path]:
    """The subpackages imported from outside `checkout` (empty when all come from it)."""
    root = Path(checkout).resolve()
    return {name: d for name, d in package_dirs().items() if root not in d.parents}


@lru_cache(maxsize=1)
def compiler_source_hash() -> str:
    """SHA-256 (20 hex digits) over the sources of the packages actually imported."""
    h = hashlib.sha256()
    dirs = package_dirs()
    for name, d in dirs.items():
        # a wheel nests the subpackages inside tilecc/: hash each file once, under its own package
        nested = [o for o in dirs.values() if o != d and d in o.parents]
        for p in sorted(d.rglob("*")):
            if p.suffix not in (".py", ".toml", ".lark") or "__pycache__" in p.parts:
                continue
            if any(o in p.parents for o in nested):
                continue
            h.update(f"{name}/{p.relative_to(d)}".encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:20]
