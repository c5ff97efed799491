import os
import warnings
from pathlib import Path

import pytest
import torch

# without a GPU the Triton backend's kernels run under Triton's interpreter, which must
# be chosen before anything (torch.compile included) imports triton
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

warnings.filterwarnings("ignore", category=FutureWarning)
# the compile cache (runtime/cache.py) is off in the test suite: tests monkeypatch the
# compiler and count compiles; tests/test_compile_cache.py turns it on explicitly
os.environ.setdefault("TILECC_COMPILE_CACHE", "0")
# every compiled model a test calls runs with the simulator's sanitisers on (races,
# uninitialised reads, deadlocks): CompiledModel.sanitize defaults to TILECC_SANITIZE
os.environ.setdefault("TILECC_SANITIZE", "1")


def pytest_configure(config):
    """Refuse to test a compiler other than this checkout's (tilecc/sources.py): a git
    worktree run with another checkout's editable install would import its own tilecc/
    but that checkout's passes/, frontend/, ... and the tests would judge that code."""
    from tilecc.sources import foreign_packages

    root = Path(__file__).resolve().parent.parent
    foreign = foreign_packages(root)
    if foreign and os.environ.get("TILECC_TEST_INSTALLED") != "1":
        where = ", ".join(f"{name} from {d}" for name, d in foreign.items())
        raise pytest.UsageError(
            f"these tests are in {root} but the compiler is imported from elsewhere ({where}); "
            f"install this checkout (pip install -e {root}) or set TILECC_TEST_INSTALLED=1 "
            f"to test an installed tilecc on purpose")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
