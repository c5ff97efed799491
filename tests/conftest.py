import os
import warnings

import pytest
import torch

# without a GPU the Triton backend's kernels run under Triton's interpreter, which must
# be chosen before anything (torch.compile included) imports triton
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
