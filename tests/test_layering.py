"""The one-way layering of the package, checked on the import statements (issue 17):

- the tile-DSL front end (`frontend/dsl`) produces IR: it imports no pass, no runtime
  and no CLI (the kernel's compile driver is `runtime/kernel.py`);
- `codegen/` imports no pass (the instruction walk it shares with insert-sync is
  `ir/npu_walk.py`);
- `runtime/` never imports the CLI (`runtime/compare.py` has the tolerances);
- `ir/` imports nothing above it.

Every import counts, the lazy ones inside functions too. And the moved pieces work
together: insert-sync's memo lives in a `CompileSession`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from xdsl.parser import Parser

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


RULES = [
    ("frontend/dsl", ("tilecc.passes", "tilecc.runtime", "tilecc.cli", "tilecc.api")),
    ("codegen", ("tilecc.passes", "tilecc.runtime", "tilecc.frontend")),
    ("runtime", ("tilecc.cli",)),
    ("ir", ("tilecc.passes", "tilecc.runtime", "tilecc.frontend", "tilecc.codegen", "tilecc.cli")),
]


@pytest.mark.parametrize("folder,forbidden", RULES, ids=[r[0] for r in RULES])
def test_layer_imports_nothing_above_it(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for mod in _imports(path):
            if any(mod == f or mod.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["frontend/dsl", "ir"])
def test_files_stay_under_800_lines(folder: str) -> None:
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) >= 800]
    assert not long, "\n".join(long)


def test_insert_sync_memo_lives_in_the_session() -> None:
    """Two structurally identical kernels in one session: the second is synchronised from
    the session's memo, and gets exactly the waits and signals a fresh session gives."""
    from tilecc.ir import npu
    from tilecc.opt import make_context
    from tilecc.passes.npu.insert_sync import MEMO, insert_sync
    from tilecc.passes.session import CompileSession
    from tilecc.simulator.config import load_config

    cfg = load_config("cloud")
    text = (ROOT / "tests" / "filecheck" / "passes" / "npu-insert-sync.mlir").read_text()

    def synced(session: CompileSession | None) -> list[str]:
        module = Parser(make_context(), text).parse_module()
        insert_sync(module, cfg, session)
        return [str(k) for k in module.ops if isinstance(k, npu.KernelOp)]

    session = CompileSession()
    first = synced(session)
    entries = len(session.cache(MEMO, 1))
    assert entries >= 1
    assert synced(session) == first == synced(None)
    assert len(session.cache(MEMO, 1)) == entries  # every kernel came from the memo


def test_collect_walks_loops_in_program_order() -> None:
    from tilecc.ir import npu
    from tilecc.ir.npu_walk import collect
    from tilecc.opt import make_context

    text = (ROOT / "tests" / "filecheck" / "passes" / "npu-insert-sync.mlir").read_text()
    module = Parser(make_context(), text).parse_module()
    for k in module.ops:
        if not isinstance(k, npu.KernelOp):
            continue
        insts = collect(k)
        assert [x.path for x in insts] == sorted(x.path for x in insts)
        assert all(len(x.trips) == len(x.path) - 1 for x in insts)
        assert {x.queue for x in insts} <= {"dma0", "dma1", "dma2", "dma3", "matrix", "vector"}


def test_tolerance_is_one_function_for_cli_and_bisect() -> None:
    import torch

    from tilecc.runtime.compare import compare, tolerance

    assert tolerance(torch.float32) == (1e-4, 1e-5)
    assert tolerance(torch.bfloat16, 10.0) == (2e-2, 2e-2 * 10.0)
    ok, worst = compare([torch.ones(3)], [torch.ones(3) + 1e-6])
    assert ok and worst < 1e-5


def test_every_package_folder_is_in_the_distribution() -> None:
    """pyproject's explicit package list names every folder with an __init__.py: a
    missing one imports from a checkout (an editable install) but not from a built
    wheel (`tilecc.passes.graph_to_tile.nn` was missing from it)."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(meta["packages"])
    dirs = {name: ROOT / path for name, path in meta["package-dir"].items()}
    found = set()
    for name, top in dirs.items():
        for init in top.rglob("__init__.py"):
            rel = init.parent.relative_to(top)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found - listed == set(), f"package folders missing from pyproject's packages: {sorted(found - listed)}"
