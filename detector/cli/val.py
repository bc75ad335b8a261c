"""``python -m detector val``: the command line of :mod:`detector.workflows.val` (what it prints and writes)."""

from __future__ import annotations

import argparse
import sys

from detector.cli.errors import run_command
from detector.cli.flags import add_flags, options_from_args, parse_command
from detector.workflows import val as workflow
from detector.workflows.val import ValOptions, run_val


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m detector val", description=workflow.__doc__.splitlines()[0])
    add_flags(parser, ValOptions)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``--flags`` and ``key=value`` arguments (ours or Ultralytics' names: detector/aliases.py) alike."""
    return parse_command(build_parser(), ValOptions, "val", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(lambda: run_val(options_from_args(ValOptions, args)))


if __name__ == "__main__":
    sys.exit(main())
