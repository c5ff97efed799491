"""`tilecc explore`: the command line of the compiler explorer (`tilecc/explore.py`)."""

from __future__ import annotations

import argparse
import sys

from tilecc.cli_args import add_quiet, output_file


def add_explore_parser(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "explore", help="show every stage of a compile, the passes' remarks, timings (compiler explorer)",
        description="Compile SOURCE and show the IR around each pass (with source locations), "
                    "diffs, remarks, pass timing, or one self-contained HTML page.",
    )
    ex.add_argument("source", help="FILE.py:FACTORY, a graph-level IR file (.mlir), or a tile-DSL file")
    ex.add_argument("--target", default="tiny", help="preset name (tiny, edge, cloud) or a TOML file")
    ex.add_argument("-O", dest="opt_level", type=int, choices=[0, 2], default=2, help="-O0 or -O2 (default)")
    ex.add_argument("--print-ir-after-all", action="store_true", help="the IR after every pass, then the asm")
    ex.add_argument("--print-ir-after", action="append", default=[], metavar="PASS",
                    help="the IR after PASS (repeatable)")
    ex.add_argument("--print-ir-before", action="append", default=[], metavar="PASS",
                    help="the IR before PASS (repeatable)")
    ex.add_argument("--stage", choices=["graph", "tile", "npu", "asm"], help="only this stage's output")
    ex.add_argument("--diff", action="store_true", help="a unified diff of what each pass changed")
    ex.add_argument("--timing", action="store_true", help="pass timing (MLIR's execution time report)")
    ex.add_argument("--remarks", action="store_true", help="what each optimisation pass decided and why")
    ex.add_argument("--html", metavar="PAGE", type=output_file, help="write one self-contained HTML page here")
    ex.add_argument("--no-run", action="store_true", help="compile only (no simulation, no timeline)")
    add_quiet(ex)
    ex.set_defaults(fn=cmd_explore)


def cmd_explore(args: argparse.Namespace) -> int:
    from tilecc.explore import explore, load_source, render_text

    source = load_source(args.source)
    ex = explore(source, args.target, args.opt_level, run=not args.no_run and (args.html is not None or not args.stage))
    text = render_text(
        ex,
        print_after_all=args.print_ir_after_all,
        print_after=tuple(args.print_ir_after),
        print_before=tuple(args.print_ir_before),
        stage=args.stage,
        diff=args.diff,
        timing=args.timing,
        remarks=args.remarks,
    )
    try:
        sys.stdout.write(text)
        if args.html:
            from tilecc.explore_html import write_html

            write_html(ex, args.html)
            print(f"// wrote {args.html}")
    except BrokenPipeError:
        pass
    return 0 if ex.matches is not False else 1
