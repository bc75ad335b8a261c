"""``python -m detector val``: the command line of :mod:`detector.workflows.val` (what it prints and writes)."""

from __future__ import annotations

import argparse
import sys

from detector.cli.errors import one_process, run_command
from detector.cli.flags import add_flags, options_from_args, parse_command
from detector.cli.parser import CommandParser
from detector.workflows.options import ValOptions


PROG = "python -m detector val"  # detector.cli.main passes how the command was started


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    # The workflow module's first docstring line, written out: importing the module to read it imports torch.
    parser = CommandParser(prog=prog, command="val",
                           description="``python -m detector val``: score a checkpoint on a dataset split.")
    add_flags(parser, ValOptions)
    return parser


def validate(options: ValOptions) -> dict[str, float]:
    """:func:`detector.workflows.val.run_val`, imported only now so that ``--help`` is instant."""
    from detector.workflows.val import run_val

    return run_val(options)


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """``--flags`` and ``key=value`` arguments (ours or Ultralytics' names: detector/aliases.py) alike."""
    return parse_command(build_parser(prog), ValOptions, "val", argv)


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    if (refused := one_process("val")) is not None:
        return refused
    args = parse_args(argv, prog)
    return run_command(lambda: validate(options_from_args(ValOptions, args)))


if __name__ == "__main__":
    sys.exit(main())
