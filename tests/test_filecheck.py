"""Runs the FileCheck pass tests (tests/filecheck, lit) as part of the pytest suite."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_filecheck_suite():
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    p = subprocess.run(
        [str(Path(sys.executable).parent / "lit"), "-v", str(HERE / "filecheck")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "Failed" not in p.stdout
