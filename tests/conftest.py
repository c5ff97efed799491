import os
import warnings

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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
