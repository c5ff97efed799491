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
    try:
        module = Parser(ctx, text, source).parse_module()
        module.verify()
        if pipeline:
            PassPipeline.parse_spec(available_passes(), pipeline).apply(ctx, module)
            module.verify()
    except (ParseError, VerifyException) as e:
        msg = str(e).strip().splitlines()
        raise TileccError(f"{source}: {' '.join(m.strip() for m in msg[:1])}" + (
            "\n" + "\n".join(msg[1:]) if len(msg) > 1 else "")) from None
    out = io.StringIO()
    Printer(stream=out, print_generic_format=generic).print_op(module)
    return out.getvalue() + "\n"


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
