"""The compiled Program: save/load round trip and corrupt files."""

import numpy as np
import pytest
import torch

import tilecc
from tilecc.errors import InputMismatchError, ProgramFormatError
from tilecc.runtime.program import Program


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(20, 12)

    def forward(self, x):
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(1)
    model = _Lin().eval()
    x = torch.randn(9, 20)
    return model, x, tilecc.compile(model, (x,), target="tiny")


def test_save_load_runs_identically(compiled, tmp_path):
    model, x, cm = compiled
    path = tmp_path / "lin.tlc"
    cm.save(path)
    loaded = tilecc.load(path)
    assert np.array_equal(loaded.program.stream, cm.program.stream)
    y1, y2 = cm(x), loaded(x)
    assert torch.equal(y1, y2)
    torch.testing.assert_close(y2, model(x).detach(), rtol=1e-4, atol=1e-5)
    assert loaded.report.cycles == cm.report.cycles


def test_bytes_are_deterministic(compiled):
    model, x, cm = compiled
    again = tilecc.compile(model, (x,), target="tiny")
    assert again.program.to_bytes() == cm.program.to_bytes()


def _corrupt(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "header":
        return data[:10]
    if how == "magic":
        return b"NOTTILEC" + data[8:]
    if how == "version":
        return data[:8] + (99).to_bytes(4, "little") + data[12:]
    if how == "old":  # version 1: its work figures were the program's own
        return data[:8] + (1).to_bytes(4, "little") + data[12:]
    if how == "flipped":
        b = bytearray(data)
        b[-5] ^= 0xFF
        return bytes(b)
    if how == "trailing":
        return data + b"\0\0"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how, message",
    [
        ("truncated", "truncated or padded program file"),
        ("header", "truncated program file (10 bytes"),
        ("magic", "not a tilecc program file"),
        ("version", "program format version 99, this tilecc reads version 2"),
        ("old", "program format version 1, this tilecc reads version 2 (an older tilecc's: its roofline "
                "figures were the program's own work; recompile the model"),
        ("flipped", "checksum mismatch"),
        ("trailing", "truncated or padded program file"),
    ],
)
def test_corrupt_program_files(compiled, tmp_path, how, message):
    path = tmp_path / "bad.tlc"
    path.write_bytes(_corrupt(compiled[2].program.to_bytes(), how))
    with pytest.raises(ProgramFormatError, match=message.replace("(", r"\(")):
        Program.load(path)


def test_a_program_without_the_intrinsic_work_is_a_format_error(compiled, tmp_path):
    import dataclasses

    prog = compiled[2].program
    assert {"macs_16", "compulsory_hbm_bytes", "program_hbm_bytes"} <= set(prog.work)
    bad = dataclasses.replace(prog, work={k: v for k, v in prog.work.items() if k != "macs_16"})
    path = tmp_path / "bad.tlc"
    path.write_bytes(bad.to_bytes())
    with pytest.raises(ProgramFormatError, match="work figures lack macs_16"):
        Program.load(path)


@pytest.mark.parametrize(
    "bad, message",
    [
        ((torch.randn(9, 21),), r"input 'x' has shape \(9, 21\), the program was compiled for \(9, 20\)"),
        ((torch.randn(9, 20, dtype=torch.bfloat16),), "input 'x' has dtype torch.bfloat16"),
        ((), "the program takes 1 input"),
    ],
)
def test_wrong_inputs_are_clear_errors(compiled, bad, message):
    with pytest.raises(InputMismatchError, match=message):
        compiled[2](*bad)


def test_inputs_are_not_modified(compiled):
    _, x, cm = compiled
    before = x.clone()
    cm(x)
    assert torch.equal(x, before)
