"""The command line never shows a traceback: hypothesis draws argument lists for EVERY
subcommand of `tilecc.cli.build_parser()` (a new subcommand is covered automatically)
from its own positionals and options, mixed with garbage flags, bad numbers, missing,
empty and corrupt files, malformed DSL / TOML / program / .npz files and bad targets,
and runs `tilecc.cli.main` in-process. Every run exits 0, 1 (a finding: does not match
eager, unsupported ops) or 2 with exactly one ``error:`` line on stderr, never an
internal error or a traceback. Valid tiny inputs are drawn rarely (they compile)."""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilecc.cli import build_parser, main

ROOT = Path(__file__).parent.parent

GOOD_MODEL = """import torch
def factory():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(4, 8),)
def ints():
    return torch.nn.Linear(4, 4), (torch.arange(8).reshape(2, 4),)
def raises():
    raise ValueError("no model today")
def single():
    return 3
def exits():
    raise SystemExit(5)
"""

FILES = {
    "model.py": GOOD_MODEL,
    "syntax.py": "def factory(:\n",
    "empty.py": "",
    "sin.py": "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return torch.sin(x)\n"
              "def factory():\n    return M(), (torch.randn(4, 4),)\n",
    "bad.tdsl": "kernel k(x: f32[R, C]) -> f32[R, C]:\n    for r in tiles(R, :\n",
    "typo.tdsl": "kernel k(x: f32[R, C]) -> f32[R, C]:\n    out[:, :] = nosuch(load(x[:, :]))\n",
    "empty.tdsl": "",
    "bad.toml": "name = \"x\"\n[matrix\nrows = 4\n",
    "values.toml": "name = \"x\"\nclock_ghz = -1\n[matrix]\nrows = 0\n",
    "unknown.toml": "name = \"x\"\n[nosuch]\nkey = 1\n",
    "bad.mlir": "func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = graph.nosuch %x\n",
    "empty.mlir": "",
    "prog.tcp": "\x00garbage\xff" * 10,
    "prog.json": "{\"format\": 2, \"kernels\": [",
    "bad.npz": "not a zip",
    "text.txt": "hello",
    "latin.toml": "name = \"\xe9\xff\"\n",  # not UTF-8
    "latin.tdsl": "kernel k(x: f32[R]) -> f32[R]:  # \xff\n",
    "latin.mlir": "\xfe\xff",
}

TOY_IR = """builtin.module {
  func.func @forward(%x: tensor<4x8xf32>) -> tensor<4x5xf32> {
    %w = graph.weight "fc.weight" : tensor<8x5xf32>
    %m = graph.matmul %x, %w : tensor<4x8xf32>, tensor<8x5xf32> -> tensor<4x5xf32>
    %r = graph.relu %m : tensor<4x5xf32>
    func.return %r : tensor<4x5xf32>
  }
}
"""

GARBAGE_FLAGS = ["--", "-", "--nosuch", "-x", "--json=1", "--target", "-O", "-O3", "-O0", "--help=no", "-qq"]
NUMBERS = ["0", "-1", "1", "3", "17", "99999999", "1e3", "nan", "0x10", "", " ", "-0", "2" * 40]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return make_files(tmp_path_factory.mktemp("fuzz"))


def make_files(d: Path) -> dict[str, str]:
    """The files the arguments name, in `d`: corrupt ones, and valid tiny ones."""
    out = {}
    for name, text in FILES.items():
        (d / name).write_bytes(text.encode("latin-1"))
        out[name] = str(d / name)
    shutil.copy(ROOT / "examples/kernels/softmax.tdsl", d / "softmax.tdsl")
    out["softmax.tdsl"] = str(d / "softmax.tdsl")
    np.savez(d / "wrong.npz", nothing=np.zeros(3, np.float32))
    out["wrong.npz"] = str(d / "wrong.npz")
    # a valid saved program (sim's input): compiled once for the module
    prog = d / "good.tcp"
    assert main(["run", f"{out['model.py']}:factory", "--save", str(prog), "--quiet"]) == 0
    out["good.tcp"] = str(prog)
    (d / "toy.mlir").write_text(TOY_IR)
    out["toy.mlir"] = str(d / "toy.mlir")
    (d / "drawn").mkdir()
    out["missing"] = str(d / "nosuch" / "file.py")
    out["dir"] = str(d)
    for name in ("dir.toml", "dir.tdsl", "dir.mlir", "dir.tcp"):  # directories named like files
        (d / name).mkdir()
        out[name] = str(d / name)
    return out


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


SUBCOMMANDS = sorted(_subcommands())


def _text() -> st.SearchStrategy[str]:
    # argv holds no NUL and no lone surrogates (the OS hands C strings over)
    return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)


def _value(files: dict[str, str]) -> st.SearchStrategy[str]:
    """A value for any argument: a file (valid ones rarely), a spec, a number, a target."""
    plain = sorted(k for k in files if k not in ("model.py", "softmax.tdsl", "good.tcp"))
    return st.one_of(
        st.sampled_from([files[k] for k in plain]),
        _mutated(files),
        _specs(files),
        st.sampled_from(NUMBERS),
        st.sampled_from(["tiny", "cloud", "nosuch", files["bad.toml"], files["values.toml"],
                         files["unknown.toml"], files["latin.toml"], files["dir.toml"], "ws", "os", "compatible",
                         "f32", "asm", "graph"]),
        st.sampled_from(["4x8", "8x16", "x", "4x", "-4x8", "0x0", "4x8,8", "scalar", ",,", "99999999x99999999"]),
        _text(),
    )


# valid files that `_mutated` corrupts: (suffix, the file's bytes)
def _bases(files: dict[str, str]) -> list[tuple[str, bytes]]:
    return [(".toml", (ROOT / "simulator/presets/tiny.toml").read_bytes()),
            (".tdsl", Path(files["softmax.tdsl"]).read_bytes()),
            (".tcp", Path(files["good.tcp"]).read_bytes()),
            (".mlir", TOY_IR.encode()),
            (".npz", Path(files["wrong.npz"]).read_bytes())]


@st.composite
def _mutated(draw, files: dict[str, str], suffixes: tuple[str, ...] = ()) -> str:
    """A file whose contents hypothesis draws: a valid target TOML, tile-DSL kernel,
    program, graph IR or .npz, truncated, with a slice replaced by drawn bytes, or with
    one number replaced by a drawn one (0, negative, huge, not a number)."""
    suffix, data = draw(st.sampled_from([b for b in _bases(files) if not suffixes or b[0] in suffixes]))
    how = draw(st.sampled_from(["truncate", "splice", "number"]))
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif how == "splice":
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(max_size=16)) + data[i + draw(st.integers(0, 16)):]
    else:
        import re

        spans = [m.span() for m in re.finditer(rb"\d+(\.\d+)?", data)][:400]
        if spans:
            a, b = draw(st.sampled_from(spans))
            data = data[:a] + draw(st.sampled_from([b"0", b"-1", b"1e30", b"99999999999", b"x", b"0.5", b""])) + data[b:]
    path = Path(files["dir"]) / "drawn" / f"f{draw(st.integers(0, 10**9))}{suffix}"
    path.write_bytes(data)
    return str(path)


def _specs(files: dict[str, str]) -> st.SearchStrategy[str]:
    """FILE.py:FACTORY specs that fail in every way (and one with an unsupported op)."""
    specs = [f"{files['model.py']}:{f}" for f in ("ints", "raises", "single", "exits", "nosuch")]
    specs += [f"{files['syntax.py']}:factory", f"{files['empty.py']}:factory", f"{files['missing']}:factory",
              f"{files['text.txt']}:factory", f"{files['dir']}:factory", f"{files['sin.py']}:factory",
              f"{files['bad.mlir']}", f"{files['bad.tdsl']}", f"{files['typo.tdsl']}:k", f"{files['empty.mlir']}"]
    return st.sampled_from(specs)


def _good(files: dict[str, str], cmd: str) -> list[str]:
    """A valid argument for `cmd`'s first positional (drawn rarely: it compiles)."""
    if cmd == "sim":
        return [files["good.tcp"]]
    if cmd == "kernel":
        return [files["softmax.tdsl"], "--shapes", "8x16"]
    if cmd == "gemm":
        return ["64", "48", "32"]
    return [f"{files['model.py']}:factory"]


def _for(action: argparse.Action, value: st.SearchStrategy[str], files: dict[str, str]) -> st.SearchStrategy[str]:
    """Mostly numbers (some of them bad) for an int argument, mostly failing specs for a
    source or file, any value otherwise."""
    if action.type is int:
        return st.one_of(st.integers(-3, 200).map(str), st.integers(1, 2**70).map(str), st.sampled_from(NUMBERS))
    kinds = {"source": (".mlir", ".tdsl"), "file": (".tdsl",), "program": (".tcp",), "inputs": (".npz",),
             "target": (".toml",)}
    if action.dest in kinds:  # mostly a drawn file of the kind the argument takes
        return st.one_of(_mutated(files, kinds[action.dest]), _specs(files), value)
    return value


@st.composite
def argv_for(draw, cmd: str, files: dict[str, str]) -> list[str]:
    parser = _subcommands()[cmd]
    value = _value(files)
    args: list[str] = [cmd]
    if draw(st.integers(0, 14)) == 0:
        args += _good(files, cmd)
    else:
        for a in parser._actions:
            if not a.option_strings and draw(st.integers(0, 9)) > 0:  # positionals, sometimes missing
                args.append(draw(st.sampled_from(list(a.choices))) if a.choices and draw(st.booleans())
                            else draw(_for(a, value, files)))
    options = [a for a in parser._actions if a.option_strings and "-h" not in a.option_strings]
    chosen = draw(st.lists(st.sampled_from(options), max_size=3)) if options else []
    chosen += [a for a in options if a.required and draw(st.integers(0, 9)) > 0]  # --shapes, mostly given
    for a in chosen:
        args.append(draw(st.sampled_from(a.option_strings)))
        if a.nargs != 0:  # store_true takes no value
            if a.choices and draw(st.booleans()):
                args.append(str(draw(st.sampled_from(list(a.choices)))))
            elif a.dest in ("trace", "save", "html"):
                args.append(draw(st.sampled_from([files["missing"], files["dir"], str(Path(files["dir"]) / "o.json"),
                                                  ""])))
            else:
                args.append(draw(_for(a, value, files)))
    if draw(st.integers(0, 4)) == 0:
        args.insert(draw(st.integers(1, len(args))), draw(st.sampled_from(GARBAGE_FLAGS) | value))
    if cmd in ("run", "explore", "sim", "kernel", "bisect", "explain") and "--quiet" not in args:
        args.append("--quiet")
    return args


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # main returns; a SystemExit escaping it is itself a finding
            code = e.code if isinstance(e.code, int) else -1
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> None:
    code, out, err = run_cli(argv)
    assert "Traceback" not in err + out, (argv, err)
    assert "internal error" not in err, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_fuzz_subcommand(cmd, files):
    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.data())
    def fuzz(data):
        check(data.draw(argv_for(cmd, files)))

    fuzz()


def test_every_subcommand_is_fuzzed():
    assert set(SUBCOMMANDS) >= {"run", "sim", "gemm", "coverage", "kernel", "explain", "explore", "bisect"}


@pytest.mark.parametrize("argv", [
    [], ["--nosuch"], ["run"], ["gemm", "1", "x", "3"], ["gemm", "99999999", "99999999", "99999999"],
    ["gemm", "0", "1", "1"], ["run", "a.py"], ["explore", "nosuch.mlir"], ["sim", "nosuch.tcp"],
    ["kernel", "nosuch.tdsl", "--shapes", "4x4"], ["coverage", "nosuch.py:f"],
])
def test_fixed_bad_command_lines(argv):
    check(argv)
