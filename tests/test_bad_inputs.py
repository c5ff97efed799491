"""The bad-input corpus (tests/bad_inputs/, one file per case, each with its expected
message): every case raises a `TileccError` subclass with exactly that one-line
message, the CLI prints it as ``error: <message>`` and exits with status 2 (no
traceback), and nothing the user passed in (files, models, tensors) is modified.

Kinds (see tests/bad_inputs/README.md): config/*.toml (hardware configs), program/*.toml
(damaged program files), call/*.toml (inputs at call time), model/*.py (models the
compiler rejects), ir/*.mlir (IR text that fails to parse or verify). The tile-DSL
cases join when the DSL exists.
"""

from __future__ import annotations

import copy
import json
import re
import struct
import subprocess
import sys
import tomllib
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import tilecc
from tilecc import errors
from tilecc.cli import load_factory, main
from tilecc.simulator.config import PRESET_DIR, load_config

ROOT = Path(__file__).parent.parent
CORPUS = Path(__file__).parent / "bad_inputs"
MODEL = CORPUS / "_model.py"


def _cases(kind: str, ext: str) -> list[Path]:
    return sorted((CORPUS / kind).glob(f"*.{ext}"))


def _ids(paths):
    return [p.stem for p in paths]


_PLACEHOLDER = re.compile(r"\{(\w+)(?::(\w+))?\}")


def _pattern(expect: str, source: Path | None = None, **subs: str) -> re.Pattern:
    """`expect` as a regex: {int} any integer, {any} any text, {line:TAG} the line of
    `source` that carries the comment ``# TAG``, other {name}s from `subs`."""
    out, pos = [], 0
    for m in _PLACEHOLDER.finditer(expect):
        out.append(re.escape(expect[pos : m.start()]))
        name, arg = m.groups()
        if name == "int":
            out.append(r"\d+")
        elif name == "any":
            out.append(r".+")
        elif name == "line":
            assert source is not None
            lines = [i + 1 for i, ln in enumerate(source.read_text().splitlines()) if ln.rstrip().endswith(f"# {arg}")]
            assert len(lines) == 1, f"{source}: no unique '# {arg}' line"
            out.append(str(lines[0]))
        else:
            out.append(re.escape(subs[name]))
        pos = m.end()
    out.append(re.escape(expect[pos:]))
    return re.compile("".join(out))


def _check_message(exc: BaseException, pattern: re.Pattern, error: str) -> None:
    assert isinstance(exc, errors.TileccError), f"{type(exc).__name__} is not a TileccError: {exc}"
    assert type(exc).__name__ == error, f"expected {error}, got {type(exc).__name__}: {exc}"
    msg = str(exc)
    assert "\n" not in msg, f"message is not one line: {msg!r}"
    assert pattern.fullmatch(msg), f"message {msg!r} does not match {pattern.pattern!r}"


def _check_cli(argv: list[str], pattern: re.Pattern, capsys) -> None:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and pattern.fullmatch(lines[0][len("error: "):]), (lines[0], pattern.pattern)


# ---- hardware configs ---------------------------------------------------------------


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def _dump_toml(data: dict, prefix: str = "") -> str:
    """A minimal TOML writer for config dicts (scalars and nested tables)."""
    scalars = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [
        f"\n[{prefix}{k}]\n" + _dump_toml(v, f"{prefix}{k}.") for k, v in data.items() if isinstance(v, dict)
    ]
    return "\n".join(scalars) + "\n" + "".join(tables)


def _config_text(case: dict) -> str:
    if "text" in case:
        return case["text"]
    data = tomllib.loads((PRESET_DIR / "tiny.toml").read_text())
    for dotted, value in case.get("set", {}).items():
        *parents, last = dotted.split(".")
        d = data
        for p in parents:
            d = d[p]
        d[last] = value
    for dotted in case.get("delete", []):
        *parents, last = dotted.split(".")
        d = data
        for p in parents:
            d = d[p]
        del d[last]
    return _dump_toml(data)


CONFIG_CASES = _cases("config", "toml")


def test_corpus_sizes():
    assert len(CONFIG_CASES) >= 15
    assert len(_cases("program", "toml")) >= 10
    assert len(_cases("call", "toml")) >= 8
    assert len(_cases("model", "py")) >= 6
    assert len(_cases("ir", "mlir")) >= 6


@pytest.mark.parametrize("case_file", CONFIG_CASES, ids=_ids(CONFIG_CASES))
def test_bad_config(case_file, tmp_path, capsys):
    case = tomllib.loads(case_file.read_text())
    path = tmp_path / f"{case_file.stem}.toml"
    path.write_text(_config_text(case))
    before = path.read_bytes()
    pattern = _pattern(case["expect"], path=str(path))
    error = case.get("error", "ConfigError")
    with pytest.raises(errors.TileccError) as info:
        cfg = load_config(path)
        model, inputs = load_factory(f"{MODEL}:factory")
        tilecc.compile(model, inputs, target=cfg, cache=False)
    _check_message(info.value, pattern, error)
    _check_cli(["run", f"{MODEL}:factory", "--target", str(path), "--no-cache"], pattern, capsys)
    assert path.read_bytes() == before


# ---- program files ------------------------------------------------------------------

_HEADER = struct.Struct("<8sII QQQ")


@pytest.fixture(scope="module")
def compiled():
    model, inputs = load_factory(f"{MODEL}:factory")
    return tilecc.compile(model, inputs, cache=False), model, inputs


def _set_dotted(meta, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    d = meta
    for p in parents:
        d = d[int(p)] if isinstance(d, list) else d[p]
    if isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value


def _damage(good: bytes, case: dict) -> bytes:
    if "text" in case:
        return case["text"].encode()
    data = bytearray(good)
    magic, version, crc, m, s, w = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    meta_b, stream_b, blob = bytes(body[:m]), bytes(body[m : m + s]), bytes(body[m + s :])
    repack = False
    if "meta_text" in case:
        meta_b, repack = case["meta_text"].encode(), True
    if "meta_delete" in case or "meta_set" in case:
        meta = json.loads(meta_b)
        for k in case.get("meta_delete", []):
            del meta[k]
        for k, v in case.get("meta_set", {}).items():
            _set_dotted(meta, k, v)
        meta_b, repack = json.dumps(meta, sort_keys=True).encode(), True
    if "stream_patch" in case:
        off, new = case["stream_patch"]["offset"], case["stream_patch"]["bytes"].encode()
        stream_b, repack = stream_b[:off] + new + stream_b[off + len(new):], True
    if "stream_keep" in case:
        stream_b, repack = stream_b[: case["stream_keep"]], True
    if repack:
        body = meta_b + stream_b + blob
        data = bytearray(_HEADER.pack(magic, version, zlib.crc32(body), len(meta_b), len(stream_b), len(blob)) + body)
    if "magic" in case or "version" in case:
        new_magic = case.get("magic", magic.decode()).encode()
        struct.pack_into("<8sI", data, 0, new_magic, case.get("version", version))
    if "flip" in case:
        data[case["flip"]] ^= 0x10
    if "keep" in case:
        k = case["keep"]
        data = data[:k] if k >= 0 else data[:k]
    if "append" in case:
        data += case["append"].encode()
    return bytes(data)


PROGRAM_CASES = _cases("program", "toml")


@pytest.mark.parametrize("case_file", PROGRAM_CASES, ids=_ids(PROGRAM_CASES))
def test_bad_program_file(case_file, compiled, tmp_path, capsys):
    case = tomllib.loads(case_file.read_text())
    path = tmp_path / f"{case_file.stem}.tlc"
    if not case.get("missing"):
        path.write_bytes(_damage(compiled[0].program.to_bytes(), case))
    before = path.read_bytes() if path.exists() else None
    pattern = _pattern(case["expect"], path=str(path))
    with pytest.raises(errors.TileccError) as info:
        tilecc.load(path)
    _check_message(info.value, pattern, case.get("error", "ProgramFormatError"))
    _check_cli(["sim", str(path)], pattern, capsys)
    assert (path.read_bytes() if path.exists() else None) == before


# ---- inputs at call time ------------------------------------------------------------


def _make_input(spec: dict):
    if "list" in spec:
        return list(spec["list"])
    dtype = getattr(torch, spec.get("dtype", "float32"))
    device = spec.get("device", "cpu")
    if dtype.is_floating_point:
        return torch.randn(spec["shape"], dtype=dtype, device=device)
    return torch.randint(0, 7, spec["shape"], dtype=dtype, device=device)


CALL_CASES = _cases("call", "toml")


@pytest.mark.parametrize("case_file", CALL_CASES, ids=_ids(CALL_CASES))
def test_bad_call(case_file, compiled, tmp_path, capsys):
    case = tomllib.loads(case_file.read_text())
    cm = compiled[0]
    if "cli_npz" in case or "cli_npz_text" in case:
        prog, npz = tmp_path / "p.tlc", tmp_path / "inputs.npz"
        cm.save(prog)
        if "cli_npz_text" in case:
            npz.write_text(case["cli_npz_text"])
        else:
            np.savez(npz, **{k: np.ones(v, np.float32) for k, v in case["cli_npz"].items()})
        before = npz.read_bytes()
        _check_cli(["sim", str(prog), "--inputs", str(npz)], _pattern(case["expect"], npz=str(npz)), capsys)
        assert npz.read_bytes() == before
        return
    inputs = [_make_input(s) for s in case["inputs"]]
    saved = [t.clone() if isinstance(t, torch.Tensor) and t.device.type == "cpu" else copy.copy(t) for t in inputs]
    with pytest.raises(errors.TileccError) as info:
        cm(*inputs)
    _check_message(info.value, _pattern(case["expect"]), case.get("error", "InputMismatchError"))
    for t, s in zip(inputs, saved):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            assert torch.equal(t, s)
        elif not isinstance(t, torch.Tensor):
            assert t == s


# ---- models -------------------------------------------------------------------------

MODEL_CASES = _cases("model", "py")


def _meta(path: Path) -> tuple[str, str]:
    ns: dict = {}
    text = path.read_text()
    for name in ("ERROR", "EXPECT"):
        m = re.search(rf"^{name} = (\(.*?\)|\".*?\")$", text, re.S | re.M)
        assert m, f"{path}: no {name}"
        ns[name] = eval(m.group(1))  # a string literal (possibly parenthesised concatenation)
    return ns["ERROR"], ns["EXPECT"]


@pytest.mark.parametrize("case_file", MODEL_CASES, ids=_ids(MODEL_CASES))
def test_bad_model(case_file, capsys):
    error, expect = _meta(case_file)
    spec = f"{case_file}:factory"
    pattern = _pattern(expect, case_file, spec=spec)
    with pytest.raises(errors.TileccError) as info:
        model, inputs = load_factory(spec)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        saved = [t.clone() for t in inputs]
        try:
            tilecc.compile(model, inputs, cache=False)
        finally:
            assert all(torch.equal(a, b) for a, b in zip(inputs, saved))
            assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    _check_message(info.value, pattern, error)
    _check_cli(["run", spec, "--no-cache"], pattern, capsys)


# ---- IR text ------------------------------------------------------------------------

IR_CASES = _cases("ir", "mlir")


@pytest.mark.parametrize("case_file", IR_CASES, ids=_ids(IR_CASES))
def test_bad_ir(case_file, capsys):
    from tilecc import opt

    first = case_file.read_text().splitlines()[0]
    assert first.startswith("// expect: ")
    pattern = _pattern(first[len("// expect: "):], path=str(case_file))
    with pytest.raises(errors.TileccError) as info:
        opt.parse_module(case_file.read_text(), str(case_file))
    msg = str(info.value)
    assert pattern.fullmatch(msg.splitlines()[0]), (msg, pattern.pattern)
    capsys.readouterr()
    assert opt.main([str(case_file)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert pattern.fullmatch(err.strip()[len("error: "):]), err


# ---- a user's objects are never written -----------------------------------------------


def test_compile_and_run_leave_the_model_and_inputs_untouched():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(24), torch.nn.Linear(24, 19), torch.nn.GELU()).eval()
    x = torch.randn(13, 24)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x0 = x.clone()
    cm = tilecc.compile(model, (x,), cache=False)
    cm.sanitize = True
    y = cm(x)
    assert torch.equal(x, x0) and all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # three fresh `tilecc` processes (the other checks call tilecc.cli.main in-process)
def test_cli_subprocess_one_line_exit_2(tmp_path):
    """One case of each file kind through a real `tilecc` process."""
    cfg = tmp_path / "zero.toml"
    cfg.write_text(_config_text(tomllib.loads((CORPUS / "config" / "zero_hbm_bandwidth.toml").read_text())))
    prog = tmp_path / "empty.tlc"
    prog.write_bytes(b"")
    for argv in (["run", f"{MODEL}:factory", "--target", str(cfg)], ["sim", str(prog)],
                 ["run", f"{CORPUS / 'model' / 'unsupported_op.py'}:factory"]):
        p = subprocess.run([sys.executable, "-m", "tilecc.cli", *argv], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: ")


# ---- tile-DSL kernels: malformed and ill-typed ----------------------------------------

DSL_CASES = sorted((Path(__file__).resolve().parent / "bad_inputs" / "dsl").glob("*.tdsl"))


def _dsl_header(case: Path) -> dict[str, str]:
    head = {}
    for line in case.read_text().splitlines()[:3]:
        key, _, value = line.removeprefix("# ").partition(": ")
        head[key] = value
    return head


def test_dsl_corpus_size():
    assert len(DSL_CASES) >= 30


@pytest.mark.parametrize("case", DSL_CASES, ids=lambda p: p.stem)
def test_bad_dsl(case, capsys):
    """The kernel author's error: the exact headline `FILE:LINE:COL: cause`, then the
    source line and a caret; `tilecc kernel` prints the headline alone and exits 2; the
    arrays passed in are not written."""
    import torch

    from tilecc.cli import main

    head = _dsl_header(case)
    pattern = _pattern(head["expect"], path=str(case))
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    specs = [s.split(":") for s in head["shapes"].split(",")]
    arrays = [torch.randn([int(d) for d in dims.split("x")]).to(dtypes[dt]) for dims, dt in specs]
    before = [a.clone() for a in arrays]
    with pytest.raises(errors.TileccError) as info:
        tilecc.kernel(case)(*arrays, target="tiny")
    e = info.value
    assert type(e).__name__ == head["error"] and isinstance(e, errors.DslError)
    lines = str(e).splitlines()
    assert pattern.fullmatch(lines[0]), (lines[0], pattern.pattern)
    assert len(lines) == 3 and lines[2].strip() == "^"  # the source line and a caret under the column
    line, col = (int(x) for x in lines[0][len(str(case)) + 1:].split(":")[:2])
    raw = case.read_text().splitlines()[line - 1]
    assert lines[1].endswith(raw)
    assert lines[2].index("^") == len(lines[1]) - len(raw) + col - 1  # the caret under the column
    assert all(torch.equal(a, b) for a, b in zip(arrays, before))
    capsys.readouterr()
    assert main(["kernel", str(case), "--shapes", ",".join(dims for dims, _ in specs)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert pattern.fullmatch(err.removeprefix("error: ")), err
