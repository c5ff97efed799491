"""tilecc-opt: an mlir-opt-style driver over IR text files (xDSL's `xDSLOptMain`).

    tilecc-opt model.mlir -p 'lower-graph-to-tile{target=tiny opt_level=0},plan-sram{target=tiny}'
    cat in.mlir | tilecc-opt -p plan-hbm{target=tiny} --print-op-generic
    tilecc-opt cases.mlir --split-input-file --verify-diagnostics
    tilecc-opt --list-passes

tilecc's dialects (graph, tile, npu) and passes come with xDSL's own (func, arith,
scf, memref, ...; canonicalize, cse, ...) through the `xdsl.universe` entry point
(`tilecc/universe.py`), so the stock `xdsl-opt` reads the same files. Input is a file
or stdin (``-``), output stdout or ``-o FILE``. ``--split-input-file`` runs each
``// -----`` chunk on its own; ``--verify-diagnostics`` prints a verifier's (or a
pass's `TileccError`) message and exits 0, for FileCheck tests of invalid IR. Other
errors print one line (``error: ...``) and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.universe import Universe
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.xdsl_opt_main import xDSLOptMain

from tilecc.errors import TileccError
from tilecc.universe import UNIVERSE


class TileccOptMain(xDSLOptMain):
    def register_all_dialects(self) -> None:
        super().register_all_dialects()
        for name, factory in UNIVERSE.all_dialects.items():  # also when not installed as a plugin
            if name not in self.ctx.registered_dialect_names:
                self.ctx.register_dialect(name, factory)

    def register_all_passes(self) -> None:
        super().register_all_passes()
        for name, factory in UNIVERSE.all_passes.items():
            self.register_pass(name, factory)

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.add_argument("--list-passes", action="store_true", help="list the passes and exit")

    def apply_passes(self, prog: ModuleOp) -> None:
        try:
            super().apply_passes(prog)
        except TileccError as e:  # a pass refused the IR: a diagnostic like a verifier's
            if self.args.verify_diagnostics:
                raise DiagnosticException(f"error: {e}") from None
            raise


def make_context() -> Context:
    """A context with xDSL's dialects and tilecc's (graph, tile, npu)."""
    from xdsl.dialects import get_all_dialects

    ctx = Context()
    for name, factory in {**get_all_dialects(), **UNIVERSE.all_dialects}.items():
        ctx.register_dialect(name, factory)
    return ctx


def parse_module(text: str, source: str = "<stdin>") -> ModuleOp:
    """Parse and verify IR text; errors become one-line `TileccError`s naming `source`."""
    module = None
    try:
        module = Parser(make_context(), text, source).parse_module()
        module.verify()
    except ParseError as e:
        raise TileccError(_parse_message(e, source)) from None
    except VerifyException as e:
        raise TileccError(_verify_message(e, text, module, source)) from None
    return module


def _parse_message(e: ParseError, source: str) -> str:
    """``FILE:LINE:COL: cause`` from an xDSL parse error (its first line is the place,
    the cause comes after the source excerpt)."""
    place = str(e).strip().splitlines()[0]
    cause = " ".join(e.msg.split())
    if cause.startswith("in "):  # xDSL's context-only message ("in block definition")
        cause = f"unexpected '{e.span.text.strip()}' {cause}"
    if not place.startswith(source):
        place = f"{source}: {place}"
    return f"{place}: {cause}"


def _verify_message(e: VerifyException, text: str, module: ModuleOp | None, source: str) -> str:
    """``FILE:LINE: cause``: the first op (in walk order) that fails its own checks,
    located in the source by the name of its result or its position among same-named ops."""
    cause = " ".join(str(e).split())
    if module is None:
        return f"{source}: {cause}"
    seen: dict[str, int] = {}
    for op in module.walk():
        seen[op.name] = seen.get(op.name, 0) + 1
        try:
            op.verify(verify_nested_ops=False)
        except VerifyException as inner:
            cause = " ".join(str(inner).split())
            if not cause.startswith(op.name):
                cause = f"{op.name}: {cause}"
            line = _line_of(text, op, seen[op.name])
            return f"{source}:{line}: {cause}" if line else f"{source}: {cause}"
    return f"{source}: {cause}"


def _line_of(text: str, op: Operation, ordinal: int) -> int | None:
    import re

    lines = text.splitlines()
    hint = op.results[0].name_hint if op.results else None
    if hint:
        for i, ln in enumerate(lines):
            if re.match(rf"\s*%{re.escape(hint)}(:\d+)?\s*(,|=)", ln):
                return i + 1
    pat = re.compile(rf"(^|[\s=\"]){re.escape(op.name)}([\s\"(]|$)")
    hits = [i + 1 for i, ln in enumerate(lines) if not ln.lstrip().startswith("//") and pat.search(ln)]
    return hits[ordinal - 1] if ordinal <= len(hits) else None


def pass_names() -> list[str]:
    """tilecc's passes, then xDSL's (what ``-p`` accepts)."""
    mine = sorted(UNIVERSE.all_passes)
    theirs = sorted(set(Universe.get_multiverse().all_passes) - set(mine))
    return mine + theirs


def _first_line(e: BaseException) -> str:
    return _diagnostic(str(e))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--list-passes" in args:
        try:
            print("\n".join(pass_names()))
        except BrokenPipeError:  # `tilecc-opt --list-passes | head`
            pass
        return 0
    args = _stdio_dashes(args)
    try:
        TileccOptMain((__doc__ or "tilecc-opt").splitlines()[0], args).run()  # "tilecc-opt: an mlir-opt-style ..."
    except (TileccError, ParseError, DiagnosticException, OSError, ValueError) as e:
        print(f"error: {_input_message(args) or _message(e)}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    return 0


def _input_message(args: list[str]) -> str:
    """Where the input file itself does not parse or verify: `parse_module`'s message
    (``FILE:LINE(:COL): cause``, the failing op located in the text), else ''."""
    takes_value = {"-o", "--output-file", "-p", "--passes", "--target", "-t", "-f", "--frontend"}
    files = [a for i, a in enumerate(args)
             if not a.startswith("-") and not (i and args[i - 1] in takes_value) and Path(a).is_file()]
    if len(files) != 1 or "--verify-diagnostics" in args or "--split-input-file" in args:
        return ""
    try:
        parse_module(Path(files[0]).read_text(), files[0])
    except TileccError as e:
        return str(e).splitlines()[0]
    except Exception:
        return ""
    return ""


def _stdio_dashes(args: list[str]) -> list[str]:
    """``-`` as the input file (stdin) or ``-o -`` (stdout): xDSL's defaults, so dropped."""
    out: list[str] = []
    for a in args:
        if a == "-":
            if out and out[-1] in ("-o", "--output-file"):
                out.pop()
            continue
        out.append(a)
    return out


def _message(e: BaseException) -> str:
    if isinstance(e, (ParseError, DiagnosticException)):
        return _diagnostic(str(e))
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _diagnostic(text: str) -> str:
    """One line from an xDSL diagnostic: ``file:line:col: what is wrong`` for a parse
    error (location, source line, caret, message), the message for a verifier's."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    if not lines:
        return "invalid IR"
    if ":" in lines[0] and lines[0].rsplit(":", 2)[-1].isdigit() and len(lines) >= 3:
        return f"{lines[0]}: {lines[-1].lstrip('^ ')}"
    for x in lines:
        if "does not verify:" in x:
            return x.split("does not verify:", 1)[1].strip()
    for x in lines:
        if x.startswith("| "):
            return x[2:].strip()
    return lines[0]


if __name__ == "__main__":
    sys.exit(main())
