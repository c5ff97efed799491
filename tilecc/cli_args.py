"""What the command line's subcommands share in their argument parsers.

    ap = ArgumentParser(prog="tilecc")                # a usage error is one line, exit 2
    p.add_argument("--trace", type=output_file)       # its directory checked before compiling
    add_quiet(p)                                      # -q / --quiet: no progress display
    one_line(message)                                 # what an error line prints
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (``error: tilecc run: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {one_line(f'{self.prog}: {message}')} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def one_line(text: str) -> str:
    """The first line of `text`, other control characters escaped (an argument the user
    typed may hold any): what an ``error:`` line prints."""
    first = text.strip().split("\n")[0]
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in first)


def output_file(text: str) -> str:
    """An argparse type for a file the command will write: its directory must exist and
    be writable, and it must not be a directory (checked before any compile)."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"'{text}' is a directory, not a file to write")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"'{text}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"'{text}': not writable")
    return text


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress line (shown on a terminal for work over ~2 s)."""
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display on stderr")
