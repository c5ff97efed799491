"""tilecc-opt: an mlir-opt-style driver over IR text files.

    tilecc-opt model.mlir -p 'lower-graph-to-tile{target=tiny},plan-sram{target=tiny}'
    tilecc-opt --list-passes
    cat in.mlir | tilecc-opt -p plan-hbm --print-op-generic
"""

from __future__ import annotations

import argparse
import io
import sys

from xdsl.context import Context
from xdsl.dialects import get_all_dialects
from xdsl.passes import PassPipeline
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.transforms import get_all_passes
from xdsl.utils.exceptions import ParseError, VerifyException

from tilecc.errors import TileccError
from tilecc.universe import UNIVERSE


def make_context() -> Context:
    ctx = Context(allow_unregistered=False)
    for name, factory in {**get_all_dialects(), **UNIVERSE.all_dialects}.items():
        ctx.register_dialect(name, factory)
    return ctx


def available_passes():
    return {**get_all_passes(), **UNIVERSE.all_passes}


def run(text: str, pipeline: str, *, generic: bool = False, source: str = "<stdin>") -> str:
    ctx = make_context()
    module = None
    try:
        module = Parser(ctx, text, source).parse_module()
        module.verify()
        if pipeline:
            PassPipeline.parse_spec(available_passes(), pipeline).apply(ctx, module)
            module.verify()
    except ParseError as e:
        raise TileccError(_parse_message(e, source) + "\n" + str(e)) from None
    except VerifyException as e:
        raise TileccError(_verify_message(e, text, module, source) + "\n" + "\n".join(
            getattr(e, "__notes__", []))) from None
    out = io.StringIO()
    Printer(stream=out, print_generic_format=generic).print_op(module)
    return out.getvalue() + "\n"


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


def _verify_message(e: VerifyException, text: str, module, source: str) -> str:
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


def _line_of(text: str, op, ordinal: int) -> int | None:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tilecc-opt", description=__doc__.splitlines()[0])
    ap.add_argument("input", nargs="?", default="-", help="IR text file (default: stdin)")
    ap.add_argument("-p", "--passes", default="", help="pass pipeline, e.g. 'plan-sram{target=tiny}'")
    ap.add_argument("-o", "--output", default="-")
    ap.add_argument("--print-op-generic", action="store_true")
    ap.add_argument("--list-passes", action="store_true")
    args = ap.parse_args(argv)
    if args.list_passes:
        print("\n".join(sorted(UNIVERSE.all_passes)))
        return 0
    try:
        if args.input == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            with open(args.input) as f:
                text, source = f.read(), args.input
        result = run(text, args.passes, generic=args.print_op_generic, source=source)
    except (TileccError, OSError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(result)
    else:
        with open(args.output, "w") as f:
            f.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
