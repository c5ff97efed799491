"""The same model and config give byte-identical programs, across processes with
different hash seeds (no dependence on set/dict iteration order or object ids)."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

SCRIPT = r"""
import sys, hashlib, torch
sys.path.insert(0, {examples!r})
import tilecc, transformer_block as tb
for dtype, target in ((torch.bfloat16, "cloud"),):
    torch.manual_seed(0)
    model = tb.Block().to(dtype).eval()
    x = torch.randn(2, 19, 48, dtype=dtype)
    cm = tilecc.compile(model, (x,), target=target)
    print(hashlib.sha256(cm.program.to_bytes()).hexdigest(), len(cm.program.stream))
"""


def _digests(seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(examples=str(ROOT / "examples"))],
        capture_output=True, text=True, env=env, timeout=600, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


@pytest.mark.parametrize("seeds", [("1", "2")])
def test_programs_are_byte_identical_across_processes(seeds):
    a, b = (_digests(s) for s in seeds)
    assert len(a) == 2 and a == b, (a, b)
    assert hashlib.sha256(b"").hexdigest() not in a
