"""`tilecc kernel FILE.tdsl --shapes 64x32,32x48,48`: compile a tile-DSL kernel for the
given input shapes, run it on random inputs on the simulator (sanitisers on) and print
the report, or one stage: ``--emit tile|npu|asm``."""

from __future__ import annotations

import argparse
import json

from tilecc.cli_args import add_quiet
from tilecc.errors import InputMismatchError, TileccError


def add_parser(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("kernel", help="compile and run a tile-DSL kernel on random inputs")
    k.add_argument("file", help="a .tdsl file")
    k.add_argument("--shapes", required=True,
                   help="one shape per parameter, comma-separated, dims joined by x (e.g. 64x32,32x48,48)")
    k.add_argument("--name", help="the kernel to run when the file holds several")
    k.add_argument("--target", default="tiny", help="preset name (tiny, edge, cloud) or a TOML file")
    k.add_argument("--emit", choices=["report", "tile", "npu", "asm"], default="report")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_quiet(k)
    k.set_defaults(fn=cmd_kernel)


def _shapes(text: str) -> list[tuple[int, ...]]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            out.append(tuple(int(d) for d in part.split("x")) if part not in ("", "scalar") else ())
        except ValueError:
            raise InputMismatchError(f"--shapes: '{part}' is not a shape like 64x32") from None
    return out


def cmd_kernel(args: argparse.Namespace) -> int:
    import torch

    import tilecc
    from tilecc.frontend.dsl.torch_op import TORCH_DTYPE

    k = tilecc.kernel(args.file, name=args.name)
    shapes = _shapes(args.shapes)
    if len(shapes) != len(k.ast.params):
        raise InputMismatchError(f"kernel {k.name} takes {len(k.ast.params)} tensor(s) "
                                 f"({', '.join(p.name for p in k.ast.params)}), --shapes gives {len(shapes)}")
    gen = torch.Generator().manual_seed(args.seed)
    inputs = [torch.randn(s, generator=gen).to(TORCH_DTYPE[p.type.dtype]) for s, p in zip(shapes, k.ast.params)]
    k(*inputs, target=args.target, sanitize=True)
    report = k.report
    if report is None:  # a call sets it
        raise TileccError(f"kernel {k.name}: the run left no report")
    if args.emit == "asm":
        print(k.asm(), end="")
    elif args.emit in ("tile", "npu"):
        print(k.ir(args.emit))
    elif args.json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        print(f"kernel            {k.name} ({args.file})")
        print(report)
    return 0
